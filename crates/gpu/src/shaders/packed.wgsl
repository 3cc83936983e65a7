// Packed formats: each chunk holds its rows' weights (`row_bytes` per row, rows back to back
// from its first byte) and then, from byte `s_off`, their scales: `s_per_row` per row of scales, one row
// of scales per `s_rows` weight rows, one scale per `s_cols` inputs. A weight is its code's value
// times its scale, rounded to f32 once, as the CPU's decoder computes it.

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

// Eight weights by element, for rows and groups off the fast paths.
fn load8_each(r: u32, k: u32) -> array<f32, 8> {
    return array<f32, 8>(elem(r, k), elem(r, k + 1u), elem(r, k + 2u), elem(r, k + 3u),
                         elem(r, k + 4u), elem(r, k + 5u), elem(r, k + 6u), elem(r, k + 7u));
}
