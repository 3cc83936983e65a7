// INT4 pack-quantized: eight 4-bit codes per little-endian u32 (weight = code - 8), one BF16
// scale per group of `s_cols` inputs.
fn scale_bf16(rc: vec2<u32>, j: u32) -> f32 {
    let i = prm.s_off + 2u * (rc.y + scol(j));
    return bitcast<f32>(((wword(i & ~3u) >> ((i & 2u) * 8u)) & 0xffffu) << 16u);
}

// Code n of `word` minus 8, exactly, without an integer conversion: the code as the low bits of
// 2^23's mantissa, then 2^23 + 8 taken away.
fn nib(word: u32, n: u32) -> f32 {
    return bitcast<f32>(((word >> (4u * n)) & 0xfu) | 0x4b000000u) - 8388616.0;
}

fn elem(r: u32, j: u32) -> f32 {
    let rc = row_at(r);
    return nib(wword(rc.x + 4u * (j >> 3u)), j & 7u) * scale_bf16(rc, j);
}

fn load8(rc: vec2<u32>, r: u32, k: u32) -> array<f32, 8> {
    if ((prm.s_cols & 7u) != 0u) {
        return load8_each(r, k);
    }
    let q = wword(rc.x + 4u * (k >> 3u));
    let s = scale_bf16(rc, k);
    return array<f32, 8>(nib(q, 0u) * s, nib(q, 1u) * s, nib(q, 2u) * s, nib(q, 3u) * s,
                         nib(q, 4u) * s, nib(q, 5u) * s, nib(q, 6u) * s, nib(q, 7u) * s);
}
