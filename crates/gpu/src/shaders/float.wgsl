// A float format's weights by (row, input): element `wb + r * in_dim + j` of `w`.
fn elem(r: u32, j: u32) -> f32 {
    return eleme(wb + r * prm.in_dim + j);
}

fn setup() {}

// Row r's first element (and no scales).
fn row_at(r: u32) -> vec2<u32> {
    return vec2<u32>(wb + r * prm.in_dim, 0u);
}

fn load8(rc: vec2<u32>, r: u32, k: u32) -> array<f32, 8> {
    return load8e(rc.x + k);
}

fn chunk_base() -> u32 {
    return prm.elem0;
}
