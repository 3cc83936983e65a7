// The memory's read rate: every invocation sums a strided run of vec4<u32> words, so the whole
// buffer is read once per dispatch; the sums land in `sink` so the reads cannot be dropped.

struct Params {
    words: u32,     // vec4 words in `src`
    per_inv: u32,   // words per invocation
    _a: u32,
    _b: u32,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> sink: array<u32>;
@group(0) @binding(2) var<uniform> prm: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let inv = gid.x + gid.y * n.x * 256u;
    let total = n.x * n.y * 256u;
    var acc = vec4<u32>(0u);
    for (var i = 0u; i < prm.per_inv; i = i + 1u) {
        let idx = inv + i * total;
        if (idx < prm.words) {
            acc = acc ^ src[idx];
        }
    }
    if (acc.x == 0xdeadbeefu) {
        sink[0] = acc.y + acc.z + acc.w;
    }
}
