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

fn code(rc: vec2<u32>, j: u32) -> f32 {
    return nib(wword(rc.x + 4u * (j >> 3u)), j & 7u);
}

fn gscale(rc: vec2<u32>, j: u32) -> f32 {
    return scale_bf16(rc, j);
}

fn one_scale() -> bool {
    return (prm.s_cols & 7u) == 0u;
}

// Code minus 8 of the nibble under `mask` (its four bits at bit m, m <= 16), in two
// instructions: the nibble as the top of 1.0's mantissa (1 + code 2^(m - 23)), times k = 2^(23 - m),
// less k + 8. Every step is exact.
fn nib_at(q: u32, mask: u32, k: f32) -> f32 {
    return fma(bitcast<f32>((q & mask) | 0x3f800000u), k, -(k + 8.0));
}

// The eight codes of `q`, each minus 8.
fn codes8(q: u32) -> array<f32, 8> {
    let h = q >> 12u;
    return array<f32, 8>(
        nib_at(q, 0xfu, 8388608.0), nib_at(q, 0xf0u, 524288.0), nib_at(q, 0xf00u, 32768.0),
        nib_at(q, 0xf000u, 2048.0), nib_at(q, 0xf0000u, 128.0),
        nib_at(h, 0xf00u, 32768.0), nib_at(h, 0xf000u, 2048.0), nib_at(h, 0xf0000u, 128.0));
}

fn load8(rc: vec2<u32>, r: u32, k: u32) -> Group8 {
    if (!one_scale()) {
        return load8_each(r, k);
    }
    return Group8(codes8(wword(rc.x + 4u * (k >> 3u))), scale_bf16(rc, k));
}

// Rows of whole groups of 32 inputs under one scale each (every INT4 checkpoint's): the product
// takes 32 inputs a step, their 16 bytes in one load and their scale once (`shader.rs`).
fn wide32() -> bool {
    return (prm.s_cols & 31u) == 0u && (prm.in_dim & 31u) == 0u;
}

// The 16 bytes of codes of inputs k..k + 32 of the row at `rc` (k a multiple of 32).
fn wvec(rc: vec2<u32>, k: u32) -> vec4<u32> {
    return w[(wb >> 4u) + ((rc.x + (k >> 1u)) >> 4u)];
}
