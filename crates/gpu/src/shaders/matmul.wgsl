// y[t][row0 + r] = sum_k w[r][k] * x[t][k]: one weight format's rows (the functions `elem(r, j)`
// and `load8(r, k)` below, filled in per format by the crate) against f32 activations.
//
// Order of the sums, fixed whatever the number of tokens (batch invariance): one workgroup of 64
// invocations per (row, block of up to 8 tokens); invocation l takes the groups of 8 inputs
// g = l, l + 64, l + 128, ... in order and adds each group's 8 products in input order to one
// sum per token; the 64 sums are then added in a fixed tree. A token's sum never depends on the
// other tokens of its batch, and a row's on where it sits in memory (aligned groups are loaded as
// vectors, others element by element: the same values in the same order).

struct Params {
    rows: u32,       // rows of this weight chunk
    in_dim: u32,
    tokens: u32,     // tokens in x and y
    out_stride: u32, // floats per token in y (the whole matrix's rows)
    row0: u32,       // first row of this chunk in y
    grid_x: u32,     // workgroups along x (row = x + y * grid_x)
    elem0: u32,      // element offset of the chunk's first weight in `w` (float formats)
    s_off: u32,      // byte offset of the chunk's scales in `w` (packed formats)
    row_bytes: u32,  // packed formats: bytes of weights per row
    s_per_row: u32,  // scales per row of scales
    s_rows: u32,     // weight rows per row of scales
    s_cols: u32,     // inputs per scale
}

@group(0) @binding(0) var<storage, read> w: array<vec4<WORD>>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> prm: Params;

const LANES: u32 = 64u;
const TB: u32 = 8u;

var<workgroup> part: array<array<f32, 8>, 64>;

FORMAT_FUNCTIONS

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let r = wg.x + wg.y * prm.grid_x;
    let t0 = wg.z * TB;
    let nt = min(TB, prm.tokens - t0);
    if (r >= prm.rows) {
        return;
    }
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    let full = prm.in_dim / 8u;
    // Loops over the tokens and a group's inputs have constant bounds (the compiler unrolls them,
    // keeping the sums in registers); tokens past `nt` are skipped, not computed.
    for (var g = l; g < full; g = g + LANES) {
        let k = 8u * g;
        let v = load8(r, k);
        for (var t = 0u; t < TB; t = t + 1u) {
            if (t < nt) {
                let xi = (t0 + t) * prm.in_dim + k;
                var s = acc[t];
                for (var j = 0u; j < 8u; j = j + 1u) {
                    s = s + v[j] * x[xi + j];
                }
                acc[t] = s;
            }
        }
    }
    // The last, partial group: invocation `full % 64` (the next in turn) takes it.
    if (full * 8u < prm.in_dim && l == full % LANES) {
        let k = 8u * full;
        for (var t = 0u; t < TB; t = t + 1u) {
            if (t < nt) {
                let xi = (t0 + t) * prm.in_dim;
                var s = acc[t];
                for (var j = k; j < prm.in_dim; j = j + 1u) {
                    s = s + elem(r, j) * x[xi + j];
                }
                acc[t] = s;
            }
        }
    }
    for (var t = 0u; t < TB; t = t + 1u) {
        part[l][t] = acc[t];
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s = s / 2u) {
        if (l < s) {
            for (var t = 0u; t < TB; t = t + 1u) {
                part[l][t] = part[l][t] + part[l + s][t];
            }
        }
        workgroupBarrier();
    }
    if (l < nt) {
        y[(t0 + l) * prm.out_stride + prm.row0 + r] = part[0][l];
    }
}
