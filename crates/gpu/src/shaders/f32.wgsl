// F32: the weights as they are.
fn eleme(e: u32) -> f32 {
    return w[e >> 2u][e & 3u];
}

fn load8e(e: u32) -> array<f32, 8> {
    if ((e & 3u) == 0u) {
        let a = w[e >> 2u];
        let b = w[(e >> 2u) + 1u];
        return array<f32, 8>(a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
    }
    return array<f32, 8>(eleme(e), eleme(e + 1u), eleme(e + 2u), eleme(e + 3u),
                         eleme(e + 4u), eleme(e + 5u), eleme(e + 6u), eleme(e + 7u));
}
