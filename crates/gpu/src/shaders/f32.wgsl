// F32: the weights as they are.
fn elem(e: u32) -> f32 {
    return w[e >> 2u][e & 3u];
}

fn load8(e: u32) -> array<f32, 8> {
    if ((e & 3u) == 0u) {
        let a = w[e >> 2u];
        let b = w[(e >> 2u) + 1u];
        return array<f32, 8>(a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
    }
    return array<f32, 8>(elem(e), elem(e + 1u), elem(e + 2u), elem(e + 3u),
                         elem(e + 4u), elem(e + 5u), elem(e + 6u), elem(e + 7u));
}
