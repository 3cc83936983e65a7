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

// Index of the scale of input j in row r.
fn sidx(r: u32, j: u32) -> u32 {
    return (r / prm.s_rows) * prm.s_per_row + j / prm.s_cols;
}

// An f32 scale (INT8, FP8).
fn scale_f32(r: u32, j: u32) -> f32 {
    return bitcast<f32>(wword(prm.s_off + 4u * sidx(r, j)));
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
