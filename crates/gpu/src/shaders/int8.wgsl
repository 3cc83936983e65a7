// INT8: a signed byte per weight, one f32 scale per row.
fn elem(r: u32, j: u32) -> f32 {
    let rc = row_at(r);
    let i = rc.x + j;
    return sbyte(wword(i & ~3u), i & 3u) * scale_f32(rc, 0u);
}

fn load8(rc: vec2<u32>, r: u32, k: u32) -> array<f32, 8> {
    let i = rc.x + k;
    if ((i & 3u) != 0u) {
        return load8_each(r, k);
    }
    let s = scale_f32(rc, 0u);
    let a = wword(i);
    let b = wword(i + 4u);
    return array<f32, 8>(sbyte(a, 0u) * s, sbyte(a, 1u) * s, sbyte(a, 2u) * s, sbyte(a, 3u) * s,
                         sbyte(b, 0u) * s, sbyte(b, 1u) * s, sbyte(b, 2u) * s, sbyte(b, 3u) * s);
}
