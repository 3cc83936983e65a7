// BF16: two weights per u32 (little-endian), the top 16 bits of an f32.
fn half_bits(word: u32, hi: u32) -> f32 {
    return bitcast<f32>(((word >> (hi * 16u)) & 0xffffu) << 16u);
}

fn eleme(e: u32) -> f32 {
    return half_bits(w[e >> 3u][(e >> 1u) & 3u], e & 1u);
}

fn load8e(e: u32) -> array<f32, 8> {
    if ((e & 7u) == 0u) {
        let q = w[e >> 3u];
        return array<f32, 8>(
            bitcast<f32>(q.x << 16u), bitcast<f32>(q.x & 0xffff0000u),
            bitcast<f32>(q.y << 16u), bitcast<f32>(q.y & 0xffff0000u),
            bitcast<f32>(q.z << 16u), bitcast<f32>(q.z & 0xffff0000u),
            bitcast<f32>(q.w << 16u), bitcast<f32>(q.w & 0xffff0000u));
    }
    return array<f32, 8>(eleme(e), eleme(e + 1u), eleme(e + 2u), eleme(e + 3u),
                         eleme(e + 4u), eleme(e + 5u), eleme(e + 6u), eleme(e + 7u));
}
