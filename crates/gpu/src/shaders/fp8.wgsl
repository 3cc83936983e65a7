
// FP8 E4M3 (no infinities; 0x7f and 0xff are NaN), one f32 scale per block.
fn e4m3(b: u32) -> f32 {
    let sign = (b & 0x80u) << 24u;
    let e = (b >> 3u) & 0xfu;
    let m = b & 7u;
    if (e == 0u) {
        return bitcast<f32>(sign | bitcast<u32>(f32(m) * 0.001953125)); // m 2^-9
    }
    if (e == 15u && m == 7u) {
        return bitcast<f32>(0x7fc00000u);
    }
    return bitcast<f32>(sign | ((e + 120u) << 23u) | (m << 20u));
}

fn code(rc: vec2<u32>, j: u32) -> f32 {
    return e4m3(wbyte(rc.x + j));
}

fn gscale(rc: vec2<u32>, j: u32) -> f32 {
    return scale_f32(rc, j);
}

fn one_scale() -> bool {
    return (prm.s_cols & 7u) == 0u;
}

fn load8(rc: vec2<u32>, r: u32, k: u32) -> Group8 {
    let i = rc.x + k;
    // Fast: the eight in two aligned words and under one scale.
    if ((i & 3u) != 0u || !one_scale()) {
        return load8_each(r, k);
    }
    let a = wword(i);
    let b = wword(i + 4u);
    return Group8(array<f32, 8>(
        e4m3(a & 0xffu), e4m3((a >> 8u) & 0xffu), e4m3((a >> 16u) & 0xffu), e4m3(a >> 24u),
        e4m3(b & 0xffu), e4m3((b >> 8u) & 0xffu), e4m3((b >> 16u) & 0xffu), e4m3(b >> 24u)),
        scale_f32(rc, k));
}
