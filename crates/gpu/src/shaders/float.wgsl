
// A float format's weights by (row, input): element `wb + r * in_dim + j` of `w`.
fn elem(r: u32, j: u32) -> f32 {
    return eleme(wb + r * prm.in_dim + j);
}

fn load8(r: u32, k: u32) -> array<f32, 8> {
    return load8e(wb + r * prm.in_dim + k);
}

fn chunk_base() -> u32 {
    return prm.elem0;
}
