//! Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) in its absorbed form.
//!
//! q = q_b(rmsnorm(q_a(x))) (or q_proj(x)), each head [q_nope | q_rope].
//! kv_a(x) = [c_kv | k_rope]; c_kv is RMS-normed, k_rope is one rotary head shared by all heads.
//! kv_b(c_kv) gives per head [k_nope | v]. Instead of expanding every cached position, the key
//! projection is absorbed into the query (q_abs = W_uk^T q_nope) and the value projection is
//! applied once after attention (v = W_uv (sum_p a_p c_p)): the same scores and outputs as the
//! reference, while the cache holds only [c_kv | k_rope] per position. kv_b stays in its stored
//! format; both products read row blocks of it.
//!
//! Kimi Linear / Kimi K3 use it without rotary embeddings (`rope: None`: the "rope" dims are a
//! plain shared key part) and K3 adds an elementwise output gate `sigmoid(g(x))` before `o`.

use strata_kernels::Linear;

use super::attention::SeqView;
use super::math::{dot, mul_sigmoid, rms_norm, softmax};
use super::rope::Rope;
use crate::LayerState;

pub enum QueryProj {
    /// (H*(nope+rope), D)
    Direct(Linear),
    /// q_a (q_lora, D), its norm (q_lora,), q_b (H*(nope+rope), q_lora)
    LowRank { a: Linear, norm: Vec<f32>, b: Linear },
}

pub struct MlaAttention {
    pub q: QueryProj,
    /// (kv_lora + rope, D)
    pub kv_a: Linear,
    /// (kv_lora,)
    pub kv_a_norm: Vec<f32>,
    /// (H*(nope+v), kv_lora): per head, rows [W_uk (nope) | W_uv (v)], kept in its stored format.
    pub kv_b: Linear,
    /// (D, H*v)
    pub o: Linear,
    /// (H*v, D) output gate: attention output *= sigmoid(g(x)) before `o` (Kimi K3).
    pub gate: Option<Linear>,
    pub n_heads: usize,
    pub nope_dim: usize,
    pub rope_dim: usize,
    pub v_dim: usize,
    pub kv_lora: usize,
    pub softmax_scale: f32,
    /// None: the rope dims are not rotated (NoPE).
    pub rope: Option<Rope>,
    /// Epsilon of the q_a and kv_a latent norms.
    pub eps: f32,
}

impl MlaAttention {
    pub fn state(&self) -> LayerState {
        LayerState::Kv {
            k_dim: self.kv_lora + self.rope_dim,
            v_dim: 0,
        }
    }

    /// x (T, D) normed -> (T, D)
    pub fn forward(&self, x: &[f32], n_tokens: usize, seqs: &mut [SeqView<'_>]) -> Vec<f32> {
        let (h, nope, rope_dim, vd, lora) = (
            self.n_heads,
            self.nope_dim,
            self.rope_dim,
            self.v_dim,
            self.kv_lora,
        );
        let qk = nope + rope_dim;
        let mut q = vec![0f32; n_tokens * h * qk]; // (T, H*(nope+rope))
        match &self.q {
            QueryProj::Direct(w) => w.matmul(x, n_tokens, &mut q),
            QueryProj::LowRank { a, norm, b } => {
                let mut qa = vec![0f32; n_tokens * a.out_dim]; // (T, q_lora)
                a.matmul(x, n_tokens, &mut qa);
                rms_norm(&mut qa, norm, self.eps);
                b.matmul(&qa, n_tokens, &mut q);
            }
        }
        let kv_width = lora + rope_dim;
        let mut kv = vec![0f32; n_tokens * kv_width]; // (T, kv_lora + rope)
        self.kv_a.matmul(x, n_tokens, &mut kv);
        for row in kv.chunks_exact_mut(kv_width) {
            rms_norm(&mut row[..lora], &self.kv_a_norm, self.eps);
        }

        let mut out = vec![0f32; n_tokens * h * vd]; // (T, H*v)
        strata_kernels::profile::span("MLA attention core", n_tokens, || {
            for seq in seqs.iter_mut() {
                for (i, t) in seq.rows.clone().enumerate() {
                    if let Some(rope) = &self.rope {
                        let (cos, sin) = rope.cos_sin(seq.start_pos + i);
                        rope.apply(&mut q[t * h * qk..(t + 1) * h * qk], qk, nope, &cos, &sin);
                        rope.apply(
                            &mut kv[t * kv_width..(t + 1) * kv_width],
                            kv_width,
                            lora,
                            &cos,
                            &sin,
                        );
                    }
                    seq.cache
                        .k
                        .extend_from_slice(&kv[t * kv_width..(t + 1) * kv_width]);
                }
                // Every (token, head) of the sequence on the kernels' threads: each is computed
                // alone, exactly as one by one.
                let (rows, start_pos, cache_k) = (seq.rows.clone(), seq.start_pos, &seq.cache.k);
                let q = &q;
                strata_kernels::for_each_chunk(
                    &mut out[rows.start * h * vd..rows.end * h * vd],
                    vd,
                    |idx, o_head| {
                        let (i, head) = (idx / h, idx % h);
                        let t = rows.start + i;
                        let n_pos = start_pos + i + 1;
                        let mut scores = vec![0f32; n_pos];
                        let mut q_abs = vec![0f32; lora];
                        let mut o_lat = vec![0f32; lora];
                        let qh = &q[t * h * qk + head * qk..t * h * qk + (head + 1) * qk];
                        let base = head * (nope + vd);
                        self.kv_b
                            .matvec_rows_transposed(base..base + nope, &qh[..nope], &mut q_abs); // (kv_lora,)
                        for (p, s) in scores.iter_mut().enumerate() {
                            let key = &cache_k[p * kv_width..(p + 1) * kv_width];
                            *s = (dot(&q_abs, &key[..lora]) + dot(&qh[nope..], &key[lora..]))
                                * self.softmax_scale;
                        }
                        softmax(&mut scores);
                        // The latent rows weighted by the scores, positions in order.
                        strata_kernels::attend::weighted_sum(&scores, cache_k, kv_width, &mut o_lat);
                        let v_rows = base + nope..base + nope + vd;
                        self.kv_b.matvec_rows(v_rows, &o_lat, o_head); // (v,)
                    },
                );
            }
        });
        if let Some(g) = &self.gate {
            let mut gates = vec![0f32; n_tokens * h * vd]; // (T, H*v)
            g.matmul(x, n_tokens, &mut gates);
            mul_sigmoid(&mut out, &gates);
        }
        let mut y = vec![0f32; n_tokens * self.o.out_dim];
        self.o.matmul(&out, n_tokens, &mut y);
        y
    }
}
