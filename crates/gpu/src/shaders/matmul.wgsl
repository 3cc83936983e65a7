// y[t][row0 + r] = sum_k w[r][k] * x[t][k]: one weight format's rows (the functions `elem(r, j)`,
// `row_at(r)` and `load8(row_at(r), r, k)` below, filled in per format by the crate) against f32
// activations.
//
// Order of the sums, fixed whatever the number of tokens (batch invariance): one workgroup of 64
// invocations per block of RB rows and TB tokens; for each output, invocation l takes the groups
// of 8 inputs g = l, l + 64, l + 128, ... in order and adds each group's 8 products in input
// order to one sum (a packed format: the 8 values times the inputs in input order, that sum
// times the group's scale; INT4 rows of whole 32-input groups: groups of 32 inputs, `shader.rs`);
// the 64 sums are then added in a fixed tree. A token's sum never depends on the
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
    x0: u32,         // first activation in x (values)
    y0: u32,         // first output in y (values)
    w0: u32,         // byte offset of the chunk in `w` (packed formats)
    items0: u32,     // first item of a product of several experts (grouped form)
}

@group(0) @binding(0) var<storage, read> w: array<vec4<WORD>>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> prm: Params;

const LANES: u32 = 64u;
// Rows and tokens per workgroup (filled in per pipeline by the crate). Each output's sum takes
// the same steps whatever they are, so a token's bits do not depend on the pipeline its batch
// size picked.
const RB: u32 = ROWS_PER_GROUPu;
const TB: u32 = TOKENS_PER_GROUPu;
const OUTS: u32 = RB * TB;

var<workgroup> part: array<array<f32, OUTS>, 64>;

// Where the workgroup's matrix starts in `w` (the float formats' first element, the packed
// formats' first byte): the chunk's (`chunk_base`), or in the grouped form its item's expert's.
var<private> wb: u32;

FORMAT_FUNCTIONS

// Activations by element, and eight from element i (vector loads when i is on a 16-byte word).
fn xe(i: u32) -> f32 {
    return x[i >> 2u][i & 3u];
}

fn load_x8(i: u32) -> array<f32, 8> {
    if ((i & 3u) == 0u) {
        let a = x[i >> 2u];
        let b = x[(i >> 2u) + 1u];
        return array<f32, 8>(a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
    }
    return array<f32, 8>(xe(i), xe(i + 1u), xe(i + 2u), xe(i + 3u),
                         xe(i + 4u), xe(i + 5u), xe(i + 6u), xe(i + 7u));
}

// `main` follows, written out per tile by the crate (`shader.rs`).
