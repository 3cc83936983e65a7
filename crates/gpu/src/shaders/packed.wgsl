// Packed formats: each chunk holds its rows' weights (`row_bytes` per row, rows back to back
// from its first byte) and then, from byte `s_off`, their scales: `s_per_row` per row of scales, one row
// of scales per `s_rows` weight rows, one scale per `s_cols` inputs. A weight is its code's value
// times its scale (`elem`, exactly the CPU decoder's value); the products take a group of eight
// codes' values and their one scale apart (`load8`).

// Byte i of the matrix is byte wb + i of `w` (wb: a multiple of 16).
fn wword(i: u32) -> u32 {
    return w[(wb >> 4u) + (i >> 4u)][(i >> 2u) & 3u];
}

fn chunk_base() -> u32 {
    return prm.w0;
}

fn wbyte(i: u32) -> u32 {
    return (wword(i) >> ((i & 3u) * 8u)) & 0xffu;
}

// Whether a scale covers a power of two of inputs, and which (`setup` sets them once): the scale
// of an input is then a shift away, not a division, in the loop over a row's groups.
var<private> s_pow2: bool;
var<private> s_shift: u32;

fn setup() {
    s_pow2 = (prm.s_cols & (prm.s_cols - 1u)) == 0u;
    s_shift = countTrailingZeros(prm.s_cols);
}

// Row r's first byte and the index of its row of scales' first scale, computed once per row.
fn row_at(r: u32) -> vec2<u32> {
    return vec2<u32>(r * prm.row_bytes, (r / prm.s_rows) * prm.s_per_row);
}

// The scale of input j within its row of scales.
fn scol(j: u32) -> u32 {
    if (s_pow2) {
        return j >> s_shift;
    }
    return j / prm.s_cols;
}

// Index of the scale of input j in row r.
fn sidx(r: u32, j: u32) -> u32 {
    return (r / prm.s_rows) * prm.s_per_row + scol(j);
}

// An f32 scale (INT8, FP8): the one of input j of the row at `rc`.
fn scale_f32(rc: vec2<u32>, j: u32) -> f32 {
    return bitcast<f32>(wword(prm.s_off + 4u * (rc.y + scol(j))));
}

// Byte n (0-3) of `word` as a signed value.
fn sbyte(word: u32, n: u32) -> f32 {
    return f32(bitcast<i32>(word << (24u - 8u * n)) >> 24u);
}

// A group of eight inputs' weights as a packed format loads them: eight values and the scale
// they are all multiplied by. The product adds the eight values times the activations, then
// that sum times the scale, so a group takes one multiplication by its scale, not eight.
struct Group8 {
    v: array<f32, 8>,
    s: f32,
}

// Each format gives `code(rc, j)` (input j's value before its scale), `gscale(rc, j)` (its scale)
// and `one_scale()` (whether every group of eight from a multiple of 8 lies under one scale).

// Weight j of row r: its value times its scale.
fn elem(r: u32, j: u32) -> f32 {
    let rc = row_at(r);
    return code(rc, j) * gscale(rc, j);
}

// Eight weights by element, for groups off the fast paths: the values the fast path gives, so
// a row's bits do not depend on where it lies in memory.
fn load8_each(r: u32, k: u32) -> Group8 {
    let rc = row_at(r);
    if (one_scale()) {
        return Group8(array<f32, 8>(code(rc, k), code(rc, k + 1u), code(rc, k + 2u), code(rc, k + 3u),
                                    code(rc, k + 4u), code(rc, k + 5u), code(rc, k + 6u), code(rc, k + 7u)),
                      gscale(rc, k));
    }
    return Group8(array<f32, 8>(elem(r, k), elem(r, k + 1u), elem(r, k + 2u), elem(r, k + 3u),
                                elem(r, k + 4u), elem(r, k + 5u), elem(r, k + 6u), elem(r, k + 7u)),
                  1.0);
}
