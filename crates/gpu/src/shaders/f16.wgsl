// F16: two weights per u32 (little-endian), widened exactly.
fn elem(e: u32) -> f32 {
    let pair = unpack2x16float(w[e >> 3u][(e >> 1u) & 3u]);
    return select(pair.x, pair.y, (e & 1u) == 1u);
}

fn load8(e: u32) -> array<f32, 8> {
    if ((e & 7u) == 0u) {
        let q = w[e >> 3u];
        let a = unpack2x16float(q.x);
        let b = unpack2x16float(q.y);
        let c = unpack2x16float(q.z);
        let d = unpack2x16float(q.w);
        return array<f32, 8>(a.x, a.y, b.x, b.y, c.x, c.y, d.x, d.y);
    }
    return array<f32, 8>(elem(e), elem(e + 1u), elem(e + 2u), elem(e + 3u),
                         elem(e + 4u), elem(e + 5u), elem(e + 6u), elem(e + 7u));
}
