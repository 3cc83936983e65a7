// MXFP4: two E2M1 codes per byte (low nibble first), one E8M0 scale per 32 inputs.

// E2M1 code c without branches: twice its magnitude (0, 1, 2, 3, 4, 6, 8, 12) from a nibble table,
// made a float through 2^23's mantissa, halved (exact), and c's sign bit set.
fn e2m1(c: u32) -> f32 {
    let twice = (0xc8643210u >> ((c & 7u) * 4u)) & 0xfu;
    let v = (bitcast<f32>(twice | 0x4b000000u) - 8388608.0) * 0.5;
    return bitcast<f32>(bitcast<u32>(v) | ((c & 8u) << 28u));
}

fn e8m0(b: u32) -> f32 {
    if (b == 0u) {
        return bitcast<f32>(0x00400000u); // 2^-127
    }
    if (b == 255u) {
        return bitcast<f32>(0x7fc00000u);
    }
    return bitcast<f32>(b << 23u);
}

fn code(rc: vec2<u32>, j: u32) -> f32 {
    return e2m1((wbyte(rc.x + (j >> 1u)) >> (4u * (j & 1u))) & 0xfu);
}

fn gscale(rc: vec2<u32>, j: u32) -> f32 {
    return e8m0(wbyte(prm.s_off + rc.y + scol(j)));
}

// A scale per 32 inputs.
fn one_scale() -> bool {
    return true;
}

fn load8(rc: vec2<u32>, r: u32, k: u32) -> Group8 {
    let i = rc.x + (k >> 1u);
    if ((i & 3u) != 0u) {
        return load8_each(r, k);
    }
    let q = wword(i);
    return Group8(array<f32, 8>(
        e2m1(q & 0xfu), e2m1((q >> 4u) & 0xfu), e2m1((q >> 8u) & 0xfu), e2m1((q >> 12u) & 0xfu),
        e2m1((q >> 16u) & 0xfu), e2m1((q >> 20u) & 0xfu), e2m1((q >> 24u) & 0xfu), e2m1(q >> 28u)),
        e8m0(wbyte(prm.s_off + rc.y + scol(k))));
}
