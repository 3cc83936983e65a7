// F16: two weights per u32 (little-endian), widened exactly.
fn eleme(e: u32) -> f32 {
    let pair = unpack2x16float(w[e >> 3u][(e >> 1u) & 3u]);
    return select(pair.x, pair.y, (e & 1u) == 1u);
}

fn load8e(e: u32) -> array<f32, 8> {
    if ((e & 7u) == 0u) {
        let q = w[e >> 3u];
        let a = unpack2x16float(q.x);
        let b = unpack2x16float(q.y);
        let c = unpack2x16float(q.z);
        let d = unpack2x16float(q.w);
        return array<f32, 8>(a.x, a.y, b.x, b.y, c.x, c.y, d.x, d.y);
    }
    return array<f32, 8>(eleme(e), eleme(e + 1u), eleme(e + 2u), eleme(e + 3u),
                         eleme(e + 4u), eleme(e + 5u), eleme(e + 6u), eleme(e + 7u));
}
