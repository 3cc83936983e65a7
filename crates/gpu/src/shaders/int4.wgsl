
// INT4 pack-quantized: eight 4-bit codes per little-endian u32 (weight = code - 8), one BF16
// scale per group of `s_cols` inputs.
fn scale_bf16(r: u32, j: u32) -> f32 {
    let i = prm.s_off + 2u * sidx(r, j);
    return bitcast<f32>(((wword(i & ~3u) >> ((i & 2u) * 8u)) & 0xffffu) << 16u);
}

fn nib(word: u32, n: u32) -> f32 {
    return f32(i32((word >> (4u * n)) & 0xfu) - 8);
}

fn elem(r: u32, j: u32) -> f32 {
    return nib(wword(r * prm.row_bytes + 4u * (j >> 3u)), j & 7u) * scale_bf16(r, j);
}

fn load8(r: u32, k: u32) -> array<f32, 8> {
    if ((prm.s_cols & 7u) != 0u) {
        return load8_each(r, k);
    }
    let q = wword(r * prm.row_bytes + 4u * (k >> 3u));
    let s = scale_bf16(r, k);
    return array<f32, 8>(nib(q, 0u) * s, nib(q, 1u) * s, nib(q, 2u) * s, nib(q, 3u) * s,
                         nib(q, 4u) * s, nib(q, 5u) * s, nib(q, 6u) * s, nib(q, 7u) * s);
}
