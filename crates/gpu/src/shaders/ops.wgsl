// The work of a decoder layer between its products, on tensors that stay in GPU memory: RMSNorm,
// residual and bias adds, the gated activations, per-head norms with the rotary embedding, and
// causal attention over a cached sequence. Every entry point shares one layout: `a` the tensor
// written, `b`, `c`, `d` read, `prm` sixteen words of parameters.
//
// Batch invariance: each output is computed by one workgroup whose work depends only on its own
// row (or token and head) and its sequence's cache, in a fixed order (each invocation's part in
// order, then a fixed tree), never on the other rows of its batch.

struct Params {
    p0: u32, p1: u32, p2: u32, p3: u32,
    p4: u32, p5: u32, p6: u32, p7: u32,
    p8: u32, p9: u32, p10: u32, p11: u32,
    p12: u32, p13: u32, p14: u32, p15: u32,
}

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read> c: array<f32>;
@group(0) @binding(3) var<storage, read> d: array<f32>;
@group(0) @binding(4) var<uniform> prm: Params;

const WG: u32 = 128u;
var<workgroup> red: array<f32, 128>;

// The sum of every invocation's `v`, through a fixed tree (every invocation gets it).
fn tree_sum(l: u32, v: f32) -> f32 {
    red[l] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (l < s) {
            red[l] = red[l] + red[l + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn tree_max(l: u32, v: f32) -> f32 {
    red[l] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (l < s) {
            red[l] = max(red[l], red[l + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// A workgroup's row index over a grid of p15 workgroups per line.
fn row_of(wg: vec3<u32>) -> u32 {
    return wg.x + wg.y * prm.p15;
}

// a[p4 + r * p1 + i] = c[i] * (b[p3 + r * p1 + i] * inv_rms(row r of b)), rows p0, width p1,
// eps bits p2.
@compute @workgroup_size(128)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let r = row_of(wg);
    if (r >= prm.p0) {
        return;
    }
    let n = prm.p1;
    let x0 = prm.p3 + r * n;
    let y0 = prm.p4 + r * n;
    // Four loads ahead of their adds (a row's loads are otherwise one memory latency each);
    // the adds in the same order.
    var ss = 0.0;
    var i = l;
    for (; i + 3u * WG < n; i += 4u * WG) {
        let v0 = b[x0 + i];
        let v1 = b[x0 + i + WG];
        let v2 = b[x0 + i + 2u * WG];
        let v3 = b[x0 + i + 3u * WG];
        ss = fma(v0, v0, ss);
        ss = fma(v1, v1, ss);
        ss = fma(v2, v2, ss);
        ss = fma(v3, v3, ss);
    }
    for (; i < n; i += WG) {
        let v = b[x0 + i];
        ss = fma(v, v, ss);
    }
    let inv = 1.0 / sqrt(tree_sum(l, ss) / f32(n) + bitcast<f32>(prm.p2));
    for (var i = l; i < n; i += WG) {
        a[y0 + i] = c[i] * (b[x0 + i] * inv);
    }
}

// a[i] += b[i % p1] for i < p0 (a residual when p1 = p0, a bias per row otherwise).
@compute @workgroup_size(128)
fn add(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let i = row_of(wg) * WG + l;
    if (i < prm.p0) {
        a[i] = a[i] + b[i % prm.p1];
    }
}

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// a[i] = act(a[i], b[i]) for i < p0: p1 = 0 SwiGLU, silu(g) u; p1 = 1 SiTU-GLU with beta bits
// p2 and linear beta bits p3.
@compute @workgroup_size(128)
fn glu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let i = row_of(wg) * WG + l;
    if (i >= prm.p0) {
        return;
    }
    let g = a[i];
    let u = b[i];
    if (prm.p1 == 0u) {
        a[i] = g * sigmoid(g) * u;
    } else {
        let beta = bitcast<f32>(prm.p2);
        let lb = bitcast<f32>(prm.p3);
        a[i] = (beta * tanh(g / beta) * sigmoid(g)) * (lb * tanh(u / lb));
    }
}

var<workgroup> head: array<f32, 1024>;
// Eight partial sums of each of 16 rows (per-head products, attention scores).
var<workgroup> eighths: array<f32, 128>;

// One head of one token, in place in `a` (rows of p0 heads x p1 values): RMSNorm of its first
// p3 values with the weights in b (eps bits p4; p3 = 0: none), then the rotation of the p2
// values from p6 by the cos and sin of its token's position (c: per token p2 / 2 cosines then
// p2 / 2 sines; p2 = 0: none); p5 = 0 NeoX halves, 1 interleaved pairs. Workgroup x: head, y:
// token.
@compute @workgroup_size(128)
fn norm_rope(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let dh = prm.p1;
    let base = (wg.y * prm.p0 + wg.x) * dh;
    for (var i = l; i < dh; i += WG) {
        head[i] = a[base + i];
    }
    workgroupBarrier();
    let nl = prm.p3;
    if (nl > 0u) {
        var ss = 0.0;
        for (var i = l; i < nl; i += WG) {
            ss = fma(head[i], head[i], ss);
        }
        let inv = 1.0 / sqrt(tree_sum(l, ss) / f32(nl) + bitcast<f32>(prm.p4));
        for (var i = l; i < nl; i += WG) {
            head[i] = b[i] * (head[i] * inv);
        }
        workgroupBarrier();
    }
    let half = prm.p2 / 2u;
    let cs = wg.y * prm.p2;
    let r0 = prm.p6;
    for (var i = l; i < dh; i += WG) {
        var v = head[i];
        if (i >= r0 && i < r0 + prm.p2) {
            let k = i - r0;
            if (prm.p5 == 0u) {
                let j = k % half;
                let cos = c[cs + j];
                let sin = c[cs + half + j];
                if (k < half) {
                    v = head[i] * cos - head[i + half] * sin;
                } else {
                    v = head[i] * cos + head[i - half] * sin;
                }
            } else {
                let j = k / 2u;
                let cos = c[cs + j];
                let sin = c[cs + half + j];
                if (k % 2u == 0u) {
                    v = head[i] * cos - head[i + 1u] * sin;
                } else {
                    v = head[i] * cos + head[i - 1u] * sin;
                }
            }
        }
        a[base + i] = v;
    }
}

// Per head h of each token t: y[(t * p0 + h) * p4 + r] = sum_j M[(h * p1 + r) * p2 + j] *
// x[(t * p0 + h) * p3 + j] for r < p1 (M in d, x in b, y in a), then the p5 values of x after
// its first p2 copied after the p1 outputs. An absorbed MLA head's query (W_uk^T q_nope, then
// q_rope) and its value projection (W_uv o_latent). Workgroup x: head, y: token, z: a block of
// HM_ROWS rows. Each output is eight interleaved partial sums added in order.
const HM_ROWS: u32 = 16u;

@compute @workgroup_size(128)
fn head_matvec(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let th = wg.y * prm.p0 + wg.x;
    let xs = th * prm.p3;
    let ys = th * prm.p4;
    let n = prm.p2;
    for (var j = l; j < n; j += WG) {
        head[j] = b[xs + j];
    }
    workgroupBarrier();
    // 16 rows a pass: invocation l takes row l / 8 and its columns l % 8, l % 8 + 8, ... in
    // order (neighbours read neighbouring columns), then each row's 8 sums are added in order.
    let first = wg.z * HM_ROWS;
    let end = min(prm.p1, first + HM_ROWS);
    for (var r0 = first; r0 < end; r0 += 16u) {
        let r = r0 + l / 8u;
        var s = 0.0;
        if (r < end) {
            let m0 = (wg.x * prm.p1 + r) * n;
            var j = l % 8u;
            for (; j + 24u < n; j += 32u) {
                let m_0 = d[m0 + j];
                let m_1 = d[m0 + j + 8u];
                let m_2 = d[m0 + j + 16u];
                let m_3 = d[m0 + j + 24u];
                s = fma(m_0, head[j], s);
                s = fma(m_1, head[j + 8u], s);
                s = fma(m_2, head[j + 16u], s);
                s = fma(m_3, head[j + 24u], s);
            }
            for (; j < n; j += 8u) {
                s = fma(d[m0 + j], head[j], s);
            }
        }
        eighths[l] = s;
        workgroupBarrier();
        if (l < 16u && r0 + l < end) {
            var t = 0.0;
            for (var k = 0u; k < 8u; k++) {
                t = t + eighths[l * 8u + k];
            }
            a[ys + r0 + l] = t;
        }
        workgroupBarrier();
    }
    if (wg.z == 0u) {
        for (var i = l; i < prm.p5; i += WG) {
            a[ys + prm.p1 + i] = b[xs + n + i];
        }
    }
}

const SPLIT: u32 = 64u;

// The first position a token with `n_pos` positions sees (p6 > 0: a sliding window of p6).
fn first_seen(n_pos: u32) -> u32 {
    if (prm.p6 > 0u && n_pos > prm.p6) {
        return n_pos - prm.p6;
    }
    return 0u;
}
var<workgroup> scores: array<f32, 64>;

// Causal attention, first half: one query head (workgroup x) of one token (its index in the
// sequence p9 + workgroup y) over one split of its seen positions (workgroup z: positions
// first + 64 z, ... up to 64 of them, `first` its first seen position), from the sequence's cached
// keys (c) and values (d), rows of p3 values, the head's key columns from (head / p1) * p2 and its
// p8 value columns from (head / p1) * p8. Queries in b (rows of p0 heads x p2 values), the
// sequence's first at row p4; its first new token at position p5; p6 > 0: only the last p6
// positions are seen; p7: the score scale's bits. Writes the split's max score m, its sum of
// exp(score - m) and its values weighted by them to a at ((y * p0 + head) * p10 + z) * (p8 + 2).
// Scores are 8 interleaved partial sums added in order; max and sum a fixed tree; the values
// summed in position order.
@compute @workgroup_size(128)
fn attend_part(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let dh = prm.p2;
    let dv = prm.p8;
    let t = prm.p9 + wg.y;
    let n_pos = prm.p5 + t + 1u;
    let first = first_seen(n_pos);
    let p0 = first + wg.z * SPLIT;
    if (p0 >= n_pos) {
        return;
    }
    let qrow = (prm.p4 + t) * prm.p0 * dh + wg.x * dh;
    for (var i = l; i < dh; i += WG) {
        head[i] = b[qrow + i];
    }
    workgroupBarrier();
    let col = (wg.x / prm.p1) * dh;
    let vcol = (wg.x / prm.p1) * dv;
    let width = prm.p3;
    let scale = bitcast<f32>(prm.p7);
    let n = min(SPLIT, n_pos - p0);
    // Scores, 16 positions a pass: invocation l takes position l / 8 and its head columns
    // l % 8, l % 8 + 8, ... in order (neighbours read neighbouring columns of a key row), then
    // each position's 8 sums are added in order.
    for (var j0 = 0u; j0 < n; j0 += 16u) {
        let j = j0 + l / 8u;
        var s = 0.0;
        if (j < n) {
            let k0 = (p0 + j) * width + col;
            var i = l % 8u;
            for (; i + 24u < dh; i += 32u) {
                let k_0 = c[k0 + i];
                let k_1 = c[k0 + i + 8u];
                let k_2 = c[k0 + i + 16u];
                let k_3 = c[k0 + i + 24u];
                s = fma(head[i], k_0, s);
                s = fma(head[i + 8u], k_1, s);
                s = fma(head[i + 16u], k_2, s);
                s = fma(head[i + 24u], k_3, s);
            }
            for (; i < dh; i += 8u) {
                s = fma(head[i], c[k0 + i], s);
            }
        }
        eighths[l] = s;
        workgroupBarrier();
        if (l < 16u && j0 + l < n) {
            var u = 0.0;
            for (var r = 0u; r < 8u; r++) {
                u = u + eighths[l * 8u + r];
            }
            scores[j0 + l] = u * scale;
        }
        workgroupBarrier();
    }
    var lmax = -3.0e38;
    if (l < n) {
        lmax = scores[l];
    }
    let m = tree_max(l, lmax);
    var e = 0.0;
    if (l < n) {
        e = exp(scores[l] - m);
        scores[l] = e;
    }
    let sum = tree_sum(l, e);
    let out = ((wg.y * prm.p0 + wg.x) * prm.p10 + wg.z) * (dv + 2u);
    if (l == 0u) {
        a[out] = m;
        a[out + 1u] = sum;
    }
    for (var i = l; i < dv; i += WG) {
        let v0 = p0 * width + vcol + i;
        var v = 0.0;
        var j = 0u;
        for (; j + 3u < n; j += 4u) {
            let d_0 = d[v0 + j * width];
            let d_1 = d[v0 + (j + 1u) * width];
            let d_2 = d[v0 + (j + 2u) * width];
            let d_3 = d[v0 + (j + 3u) * width];
            v = fma(scores[j], d_0, v);
            v = fma(scores[j + 1u], d_1, v);
            v = fma(scores[j + 2u], d_2, v);
            v = fma(scores[j + 3u], d_3, v);
        }
        for (; j < n; j++) {
            v = fma(scores[j], d[v0 + j * width], v);
        }
        a[out + 2u + i] = v;
    }
}

// Causal attention, second half: the splits of `attend_part` (in b, same layout and
// parameters) of one head (workgroup x) of one token (p9 + workgroup y) combined in split order:
// each split's sums times exp(its max - the largest), their values' sum over their sum. Outputs
// in a (rows of p0 heads x p8 values from row p4). So a token's output depends only on its own
// query, its sequence's cache and its position.
@compute @workgroup_size(128)
fn attend_combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let dv = prm.p8;
    let t = prm.p9 + wg.y;
    let n_pos = prm.p5 + t + 1u;
    let first = first_seen(n_pos);
    let splits = (n_pos - first + SPLIT - 1u) / SPLIT;
    let base = (wg.y * prm.p0 + wg.x) * prm.p10 * (dv + 2u);
    var m = -3.0e38;
    for (var z = 0u; z < splits; z++) {
        m = max(m, b[base + z * (dv + 2u)]);
    }
    var sum = 0.0;
    for (var z = 0u; z < splits; z++) {
        let at = base + z * (dv + 2u);
        sum = fma(b[at + 1u], exp(b[at] - m), sum);
    }
    let orow = (prm.p4 + t) * prm.p0 * dv + wg.x * dv;
    for (var i = l; i < dv; i += WG) {
        var v = 0.0;
        for (var z = 0u; z < splits; z++) {
            let at = base + z * (dv + 2u);
            v = fma(b[at + 2u + i], exp(b[at] - m), v);
        }
        a[orow + i] = v / sum;
    }
}

// a[j * p1 + i] = b[idx_j * p1 + i] for rows j < p0, idx_j the u32 bits of c[p2 + j]: the rows of
// the tokens routed to each expert. A workgroup per block of 128 values of a row (p4 blocks a
// row).
@compute @workgroup_size(128)
fn gather(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let at = row_of(wg);
    let j = at / prm.p4;
    let i = (at % prm.p4) * WG + l;
    let n = prm.p1;
    if (j >= prm.p0 || i >= n) {
        return;
    }
    a[j * n + i] = b[bitcast<u32>(c[prm.p2 + j]) * n + i];
}

// a[t * p1 + i] = sum over e in [s_t, s_t+1) of w_e * b[r_e * p1 + i] for rows t < p0, in that
// order from zero, where s_t = c[p2 + t] and (r_e, w_e) = (c[p3 + 2e] bits, c[p3 + 2e + 1]): each
// token's experts' outputs, weighted and summed in ascending expert order. A workgroup per block
// of 128 values of a row (p4 blocks a row).
@compute @workgroup_size(128)
fn combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let at = row_of(wg);
    let t = at / prm.p4;
    let i = (at % prm.p4) * WG + l;
    let n = prm.p1;
    if (t >= prm.p0 || i >= n) {
        return;
    }
    let first = bitcast<u32>(c[prm.p2 + t]);
    let end = bitcast<u32>(c[prm.p2 + t + 1u]);
    var acc = 0.0;
    for (var e = first; e < end; e++) {
        let r = bitcast<u32>(c[prm.p3 + 2u * e]);
        acc = acc + b[r * n + i] * c[prm.p3 + 2u * e + 1u];
    }
    a[t * n + i] = acc;
}

// a[r * p1 + i] *= sigmoid(b[r]) for rows r < p0: a gate per row (Qwen2-MoE's shared expert).
@compute @workgroup_size(128)
fn scale_sigmoid(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let r = row_of(wg);
    if (r >= prm.p0) {
        return;
    }
    let s = sigmoid(b[r]);
    for (var i = l; i < prm.p1; i += WG) {
        a[r * prm.p1 + i] = a[r * prm.p1 + i] * s;
    }
}

// Routing: the most experts a router may have and the most it picks per token.
const MAX_EXPERTS: u32 = 1024u;
const MAX_PICKS: u32 = 32u;
var<workgroup> sel: array<f32, 1024>;
var<workgroup> gsc: array<f32, 128>;
var<workgroup> picks: array<u32, 32>;
var<workgroup> wts: array<f32, 32>;

fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

// One token's route (workgroup row t) from its router logits (b, rows of p1 experts): its p2
// picks, written to a (rows of 2 * p2: expert id bits, weight), ascending by expert. p3 = 0:
// softmax over every expert, the largest p2 (ties to the lower id), their probabilities (p4 = 1:
// over their sum). p3 = 1: sigmoid scores plus the correction bias c picked within the p7 best
// of p6 groups (a group's score: its two best biased scores), the unbiased scores as weights
// (p4 = 1: over their sum + 1e-20), times the scale (p5 bits). The CPU's `Router::route`.
@compute @workgroup_size(128)
fn route(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let t = row_of(wg);
    if (t >= prm.p0) {
        return;
    }
    let n = prm.p1;
    let k = prm.p2;
    let row = t * n;
    var m = neg_inf();
    for (var e = l; e < n; e += WG) {
        let x = b[row + e];
        if (prm.p3 == 0u) {
            sel[e] = x;
        } else {
            sel[e] = 1.0 / (1.0 + exp(-x)) + c[e];
        }
        m = max(m, x);
    }
    // Softmax's max and sum (the sum over every expert, in a fixed order).
    let mx = tree_max(l, m);
    var s = 0.0;
    if (prm.p3 == 0u) {
        for (var e = l; e < n; e += WG) {
            s += exp(b[row + e] - mx);
        }
    }
    let total = tree_sum(l, s);
    let groups = prm.p6;
    if (prm.p3 == 1u && groups > 1u) {
        let size = n / groups;
        if (l < groups) {
            var b1 = neg_inf();
            var b2 = neg_inf();
            for (var e = l * size; e < (l + 1u) * size; e++) {
                let v = sel[e];
                if (v > b1) {
                    b2 = b1;
                    b1 = v;
                } else if (v > b2) {
                    b2 = v;
                }
            }
            gsc[l] = b1 + b2;
        }
        workgroupBarrier();
        if (l == 0u) {
            // Keep the p7 best groups (ties to the lower group): mark the kept with +inf.
            for (var j = 0u; j < prm.p7; j++) {
                var bi = 0xffffffffu;
                for (var g = 0u; g < groups; g++) {
                    if (gsc[g] != bitcast<f32>(0x7f800000u) && (bi == 0xffffffffu || gsc[g] > gsc[bi])) {
                        bi = g;
                    }
                }
                gsc[bi] = bitcast<f32>(0x7f800000u);
            }
        }
        workgroupBarrier();
        for (var e = l; e < n; e += WG) {
            if (gsc[e / size] != bitcast<f32>(0x7f800000u)) {
                sel[e] = neg_inf();
            }
        }
        workgroupBarrier();
    }
    // Each expert's rank among all (larger first, the lower id first on ties); the k first
    // are the picks, in rank order.
    workgroupBarrier();
    for (var e = l; e < n; e += WG) {
        let v = sel[e];
        var rank = 0u;
        for (var j = 0u; j < n && rank < k; j++) {
            if (sel[j] > v || (sel[j] == v && j < e)) {
                rank++;
            }
        }
        if (rank < k) {
            picks[rank] = e;
        }
    }
    workgroupBarrier();
    if (l < k) {
        let x = b[row + picks[l]];
        if (prm.p3 == 0u) {
            wts[l] = exp(x - mx) / total;
        } else {
            wts[l] = 1.0 / (1.0 + exp(-x));
        }
    }
    workgroupBarrier();
    if (l == 0u) {
        if (prm.p4 == 1u) {
            var sum = 0.0;
            for (var j = 0u; j < k; j++) {
                sum += wts[j];
            }
            if (prm.p3 == 1u) {
                sum += 1e-20;
            }
            for (var j = 0u; j < k; j++) {
                wts[j] = wts[j] / sum;
            }
        }
        if (prm.p3 == 1u) {
            for (var j = 0u; j < k; j++) {
                wts[j] = wts[j] * bitcast<f32>(prm.p5);
            }
        }
        // Ascending by expert id (insertion sort of at most 32).
        for (var j = 1u; j < k; j++) {
            let e = picks[j];
            let w = wts[j];
            var i = j;
            while (i > 0u && picks[i - 1u] > e) {
                picks[i] = picks[i - 1u];
                wts[i] = wts[i - 1u];
                i--;
            }
            picks[i] = e;
            wts[i] = w;
        }
        for (var j = 0u; j < k; j++) {
            a[(t * k + j) * 2u] = bitcast<f32>(picks[j]);
            a[(t * k + j) * 2u + 1u] = wts[j];
        }
    }
}

var<workgroup> counts: array<atomic<u32>, 1024>;
var<workgroup> cursor: array<u32, 1024>;
var<workgroup> runs: array<u32, 128>;

// The routing table of p0 tokens' routes (b: p1 picks a token, (expert id bits, weight) each,
// ascending by expert) over p2 experts, one workgroup: as `Recorder::routing` lays it out (P =
// p0 * p1 packed rows, expert after expert, each expert's tokens ascending: [their token
// indices (P)] [each token's first entry (p0 + 1)] [entries (2P): (packed row, weight), each
// token's in ascending expert order]), then [each expert's first packed row (p2 + 1)].
@compute @workgroup_size(128)
fn route_table(@builtin(local_invocation_index) l: u32) {
    let tokens = prm.p0;
    let k = prm.p1;
    let n = prm.p2;
    let p = tokens * k;
    let entries = p + tokens + 1u;
    let starts = entries + 2u * p;
    for (var e = l; e < n; e += WG) {
        atomicStore(&counts[e], 0u);
    }
    workgroupBarrier();
    for (var i = l; i < p; i += WG) {
        atomicAdd(&counts[bitcast<u32>(b[2u * i])], 1u);
    }
    workgroupBarrier();
    // Each expert's first packed row: each invocation sums a run of experts' counts, the runs'
    // sums are scanned, then each invocation writes its run's starts.
    let per = (n + WG - 1u) / WG;
    let e0 = min(l * per, n);
    let e1 = min(e0 + per, n);
    var own = 0u;
    for (var e = e0; e < e1; e++) {
        own += atomicLoad(&counts[e]);
    }
    runs[l] = own;
    workgroupBarrier();
    for (var off = 1u; off < WG; off = off * 2u) {
        var before = 0u;
        if (l >= off) {
            before = runs[l - off];
        }
        workgroupBarrier();
        runs[l] += before;
        workgroupBarrier();
    }
    var at = runs[l] - own;
    for (var e = e0; e < e1; e++) {
        cursor[e] = at;
        a[starts + e] = bitcast<f32>(at);
        at += atomicLoad(&counts[e]);
    }
    if (l == WG - 1u) {
        a[starts + n] = bitcast<f32>(runs[l]);
    }
    workgroupBarrier();
    // Tokens in order, so each expert's rows go by ascending token.
    for (var t = 0u; t < tokens; t++) {
        if (l < k) {
            let i = t * k + l;
            let e = bitcast<u32>(b[2u * i]);
            let at = cursor[e];
            cursor[e] = at + 1u;
            a[at] = bitcast<f32>(t);
            a[entries + 2u * i] = bitcast<f32>(at);
            a[entries + 2u * i + 1u] = b[2u * i + 1u];
        }
        workgroupBarrier();
    }
    for (var t = l; t <= tokens; t += WG) {
        a[p + t] = bitcast<f32>(t * k);
    }
}

var<workgroup> taken: array<atomic<u32>, 192>;

// The three products' items of a layer whose every expert lies in a slab (one workgroup):
// c holds each of the p0 experts' (slab, start) for the gate, up and down products (six words),
// b the routing table, whose experts' first packed rows start at p2. For product i (p3 + i:
// tokens a workgroup takes; p6 + i: its slabs; p10 + 2i, p11 + 2i: its grid), each expert with
// rows gets one item (start, first row, rows, first token) per block of tokens, in its slab's
// region of p1 items (from vec4 p9 + slab * p1, the products' slabs in turn), and each slab's
// dispatch size goes to words 3 * slab (its grid, then its items). Which item a workgroup takes
// changes no output's sum.
@compute @workgroup_size(128)
fn expert_items(@builtin(local_invocation_index) l: u32) {
    let n = prm.p0;
    let cap = prm.p1;
    let starts = prm.p2;
    var tbs = array<u32, 3>(prm.p3, prm.p4, prm.p5);
    var firsts = array<u32, 3>(0u, prm.p6, prm.p6 + prm.p7);
    let slabs = prm.p6 + prm.p7 + prm.p8;
    for (var i = l; i < slabs; i += WG) {
        atomicStore(&taken[i], 0u);
    }
    workgroupBarrier();
    for (var e = l; e < n; e += WG) {
        let r0 = bitcast<u32>(b[starts + e]);
        let rows = bitcast<u32>(b[starts + e + 1u]) - r0;
        for (var p = 0u; p < 3u && rows > 0u; p++) {
            let tb = tbs[p];
            let g = firsts[p] + bitcast<u32>(c[6u * e + 2u * p]);
            let wb = c[6u * e + 2u * p + 1u];
            let blocks = (rows + tb - 1u) / tb;
            let at = atomicAdd(&taken[g], blocks);
            for (var j = 0u; j < blocks; j++) {
                let o = 4u * (prm.p9 + g * cap + at + j);
                a[o] = wb;
                a[o + 1u] = bitcast<f32>(r0);
                a[o + 2u] = bitcast<f32>(rows);
                a[o + 3u] = bitcast<f32>(j * tb);
            }
        }
    }
    workgroupBarrier();
    for (var i = l; i < slabs; i += WG) {
        var p = 0u;
        if (i >= firsts[2]) {
            p = 2u;
        } else if (i >= firsts[1]) {
            p = 1u;
        }
        var grid = array<u32, 6>(prm.p10, prm.p11, prm.p12, prm.p13, prm.p14, prm.p15);
        a[3u * i] = bitcast<f32>(grid[2u * p]);
        a[3u * i + 1u] = bitcast<f32>(grid[2u * p + 1u]);
        a[3u * i + 2u] = bitcast<f32>(atomicLoad(&taken[i]));
    }
}
