// INT8: a signed byte per weight, one f32 scale per row.
fn code(rc: vec2<u32>, j: u32) -> f32 {
    let i = rc.x + j;
    return sbyte(wword(i & ~3u), i & 3u);
}

fn gscale(rc: vec2<u32>, j: u32) -> f32 {
    return scale_f32(rc, 0u);
}

// A scale per row.
fn one_scale() -> bool {
    return true;
}

fn load8(rc: vec2<u32>, r: u32, k: u32) -> Group8 {
    let i = rc.x + k;
    if ((i & 3u) != 0u) {
        return load8_each(r, k);
    }
    let a = wword(i);
    let b = wword(i + 4u);
    return Group8(array<f32, 8>(sbyte(a, 0u), sbyte(a, 1u), sbyte(a, 2u), sbyte(a, 3u),
                                sbyte(b, 0u), sbyte(b, 1u), sbyte(b, 2u), sbyte(b, 3u)),
                  scale_f32(rc, 0u));
}
