
// A float format's weights by (row, input): element `elem0 + r * in_dim + j` of the chunk.
fn elem(r: u32, j: u32) -> f32 {
    return eleme(prm.elem0 + r * prm.in_dim + j);
}

fn load8(r: u32, k: u32) -> array<f32, 8> {
    return load8e(prm.elem0 + r * prm.in_dim + k);
}
