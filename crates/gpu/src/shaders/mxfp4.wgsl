
// MXFP4: two E2M1 codes per byte (low nibble first), one E8M0 scale per 32 inputs.
fn e2m1(c: u32) -> f32 {
    let sign = (c & 8u) << 28u;
    let mag = c & 7u;
    var bits = 0u;
    if (mag == 1u) {
        bits = 0x3f000000u; // 0.5
    } else if (mag >= 2u) {
        bits = (((mag >> 1u) + 126u) << 23u) | ((mag & 1u) << 22u);
    }
    return bitcast<f32>(sign | bits);
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

fn elem(r: u32, j: u32) -> f32 {
    let b = wbyte(r * prm.row_bytes + (j >> 1u));
    return e2m1((b >> (4u * (j & 1u))) & 0xfu) * e8m0(wbyte(prm.s_off + sidx(r, j)));
}

fn load8(r: u32, k: u32) -> array<f32, 8> {
    let i = r * prm.row_bytes + (k >> 1u);
    if ((i & 3u) != 0u) {
        return load8_each(r, k);
    }
    let q = wword(i);
    let s = e8m0(wbyte(prm.s_off + sidx(r, k)));
    return array<f32, 8>(
        e2m1(q & 0xfu) * s, e2m1((q >> 4u) & 0xfu) * s,
        e2m1((q >> 8u) & 0xfu) * s, e2m1((q >> 12u) & 0xfu) * s,
        e2m1((q >> 16u) & 0xfu) * s, e2m1((q >> 20u) & 0xfu) * s,
        e2m1((q >> 24u) & 0xfu) * s, e2m1(q >> 28u) * s);
}
