//! Grouped-query attention with rotary embeddings (Qwen3-MoE: with per-head q/k RMSNorm; Mixtral:
//! without). Keys and values are appended to the sequence's cache, then each new token attends to
//! every cached position up to its own.

use std::ops::Range;

use strata_kernels::Linear;

use super::math::{dot, rms_norm, softmax};
use super::rope::Rope;
use crate::{LayerCache, LayerState};

/// The rows of one sequence inside a step's (T, D) activations, and its cache for this layer.
pub struct SeqView<'a> {
    pub rows: Range<usize>,
    /// Position of the first new row (= positions cached before this step).
    pub start_pos: usize,
    pub cache: &'a mut LayerCache,
}

pub struct GqaAttention {
    /// (H*Dh, D)
    pub q: Linear,
    /// (Hkv*Dh, D)
    pub k: Linear,
    /// (Hkv*Dh, D)
    pub v: Linear,
    /// (D, H*Dh)
    pub o: Linear,
    /// (Dh,) RMSNorm applied to each head of q and k before the rotation (Qwen3).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope: Rope,
    pub eps: f32,
    /// Attend only to this many most recent positions (Mixtral's `sliding_window`).
    pub sliding_window: Option<usize>,
    /// Biases of the projections (Qwen2; `attention_bias` models).
    pub biases: Option<Box<GqaBiases>>,
}

/// Added to each token's projections: q (H*Dh,), k and v (Hkv*Dh,), o (D,) where it has one.
pub struct GqaBiases {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub o: Option<Vec<f32>>,
}

impl GqaBiases {
    /// `{base}.{q,k,v}_proj.bias` (and `o_proj.bias` when `o`) for attention `a`'s shapes.
    pub fn load(
        ckpt: &strata_formats::Checkpoint,
        base: &str,
        a: &GqaAttention,
        o: bool,
    ) -> crate::Result<GqaBiases> {
        let bias =
            |proj: &str, n: usize| crate::weights::load_vector(ckpt, &format!("{base}.{proj}.bias"), n);
        let (q, kv) = (a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim);
        Ok(GqaBiases {
            q: bias("q_proj", q)?,
            k: bias("k_proj", kv)?,
            v: bias("v_proj", kv)?,
            o: if o {
                Some(bias("o_proj", a.o.out_dim)?)
            } else {
                None
            },
        })
    }
}

/// Adds `bias` to every row of `x`.
fn add_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (a, b) in row.iter_mut().zip(bias) {
            *a += b;
        }
    }
}

impl GqaAttention {
    pub fn state(&self) -> LayerState {
        LayerState::Kv {
            k_dim: self.n_kv_heads * self.head_dim,
            v_dim: self.n_kv_heads * self.head_dim,
        }
    }

    /// x (T, D) normed -> (T, D)
    pub fn forward(&self, x: &[f32], n_tokens: usize, seqs: &mut [SeqView<'_>]) -> Vec<f32> {
        let (h, hkv, dh) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let mut q = vec![0f32; n_tokens * h * dh]; // (T, H*Dh)
        let mut k = vec![0f32; n_tokens * hkv * dh]; // (T, Hkv*Dh)
        let mut v = vec![0f32; n_tokens * hkv * dh]; // (T, Hkv*Dh)
        self.q.matmul(x, n_tokens, &mut q);
        self.k.matmul(x, n_tokens, &mut k);
        self.v.matmul(x, n_tokens, &mut v);
        if let Some(b) = &self.biases {
            add_rows(&mut q, &b.q);
            add_rows(&mut k, &b.k);
            add_rows(&mut v, &b.v);
        }
        // Each token's heads normed (Qwen3) and rotated to its position, tokens on the kernels'
        // threads.
        let mut position = vec![None; n_tokens];
        for seq in seqs.iter() {
            for (i, t) in seq.rows.clone().enumerate() {
                position[t] = Some(seq.start_pos + i);
            }
        }
        let norm_rotate = |rows: &mut [f32], norm: &Option<Vec<f32>>| {
            strata_kernels::for_each_chunk(rows, rows.len() / n_tokens.max(1), |t, row| {
                if let Some(w) = norm {
                    rms_norm(row, w, self.eps);
                }
                if let Some(pos) = position[t] {
                    let (cos, sin) = self.rope.cos_sin(pos);
                    self.rope.apply(row, dh, 0, &cos, &sin);
                }
            });
        };
        norm_rotate(&mut q, &self.q_norm);
        norm_rotate(&mut k, &self.k_norm);

        let scale = 1.0 / (dh as f32).sqrt();
        let group = h / hkv;
        let mut out = vec![0f32; n_tokens * h * dh]; // (T, H*Dh)
        strata_kernels::profile::span("GQA attention core", n_tokens, || {
            for seq in seqs.iter_mut() {
                for t in seq.rows.clone() {
                    seq.cache
                        .k
                        .extend_from_slice(&k[t * hkv * dh..(t + 1) * hkv * dh]);
                    seq.cache
                        .v
                        .extend_from_slice(&v[t * hkv * dh..(t + 1) * hkv * dh]);
                }
                let kv_width = hkv * dh;
                // Tasks of `per` query heads of one token, all of one KV group (their key and value
                // rows read once for all), on the kernels' threads. Each head is computed alone,
                // exactly as one by one, whatever the split.
                let (rows, start_pos) = (seq.rows.clone(), seq.start_pos);
                let per = heads_per_task(rows.len(), h, group);
                let (cache_k, cache_v) = (&seq.cache.k, &seq.cache.v);
                let q = &q;
                strata_kernels::for_each_chunk(
                    &mut out[rows.start * h * dh..rows.end * h * dh],
                    per * dh,
                    |idx, out| {
                        let (i, head0) = (idx / (h / per), idx % (h / per) * per);
                        let t = rows.start + i;
                        let n_pos = start_pos + i + 1; // causal: positions 0..=own
                                                       // Sliding window: only the last `window` positions (own included) are seen.
                        let first = self.sliding_window.map_or(0, |w| n_pos.saturating_sub(w));
                        let at = (head0 / group) * dh; // the KV head's columns in a cached row
                        let qs = &q[t * h * dh + head0 * dh..t * h * dh + (head0 + per) * dh];
                        let keys = &cache_k[first * kv_width + at..];
                        let values = &cache_v[first * kv_width + at..];
                        let q_of: Vec<&[f32]> = qs.chunks_exact(dh).collect();
                        attend_heads(&q_of, keys, values, kv_width, n_pos - first, scale, out);
                    },
                );
            }
        });
        let mut y = vec![0f32; n_tokens * self.o.out_dim];
        self.o.matmul(&out, n_tokens, &mut y);
        if let Some(o) = self.biases.as_ref().and_then(|b| b.o.as_ref()) {
            add_rows(&mut y, o);
        }
        y
    }
}

/// Query heads per attention task: a whole KV group, unless that leaves the kernels' threads
/// short of work (decode: one token), then halves of it.
fn heads_per_task(tokens: usize, heads: usize, group: usize) -> usize {
    let want = 2 * strata_kernels::threads();
    let mut per = group;
    while per.is_multiple_of(2) && tokens * (heads / per) < want {
        per /= 2;
    }
    per
}

/// Heads that share one KV head (`q_of`: their queries, `out`: their outputs side by side) against
/// `n` cached positions (`keys`/`values`: the first position's columns, rows `stride` apart):
/// each head's scores are its own dot products with every key (one pass over the keys for all
/// heads, each dot the one-token kernel's bits), its softmax, then its weighted sum of values.
fn attend_heads(
    q_of: &[&[f32]],
    keys: &[f32],
    values: &[f32],
    stride: usize,
    n: usize,
    scale: f32,
    out: &mut [f32],
) {
    let heads = q_of.len();
    let dh = out.len() / heads;
    let mut by_pos = vec![0f32; n * heads]; // (position, head)
    for (p, s) in by_pos.chunks_exact_mut(heads).enumerate() {
        let key = &keys[p * stride..p * stride + dh];
        if heads == 1 {
            s[0] = dot(q_of[0], key); // the same bits, without the several-token set-up
        } else {
            strata_kernels::dot::rows_f32_tokens(key, dh, q_of, s);
        }
    }
    let mut scores = vec![0f32; n];
    for (g, oh) in out.chunks_exact_mut(dh).enumerate() {
        for (p, s) in scores.iter_mut().enumerate() {
            *s = by_pos[p * heads + g] * scale;
        }
        softmax(&mut scores);
        strata_kernels::attend::weighted_sum(&scores, values, stride, oh);
    }
}

impl GqaAttention {
    /// Loads `{base}.{q,k,v,o}_proj` (and `{q,k}_norm` when `qk_norm`).
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        ckpt: &strata_formats::Checkpoint,
        base: &str,
        hidden: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        qk_norm: bool,
        rope: Rope,
        eps: f32,
    ) -> crate::Result<GqaAttention> {
        use crate::weights::{load_linear, load_vector};
        let norm = |n: &str| load_vector(ckpt, &format!("{base}.{n}.weight"), head_dim);
        Ok(GqaAttention {
            q: load_linear(ckpt, &format!("{base}.q_proj"), n_heads * head_dim, hidden)?,
            k: load_linear(ckpt, &format!("{base}.k_proj"), n_kv_heads * head_dim, hidden)?,
            v: load_linear(ckpt, &format!("{base}.v_proj"), n_kv_heads * head_dim, hidden)?,
            o: load_linear(ckpt, &format!("{base}.o_proj"), hidden, n_heads * head_dim)?,
            q_norm: if qk_norm { Some(norm("q_norm")?) } else { None },
            k_norm: if qk_norm { Some(norm("k_norm")?) } else { None },
            n_heads,
            n_kv_heads,
            head_dim,
            rope,
            eps,
            sliding_window: None,
            biases: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::rope::RopeStyle;

    /// One head, identity projections: the output is the attention-weighted mean of values.
    fn attention(window: Option<usize>) -> GqaAttention {
        let eye = || Linear::from_f32(2, 2, vec![1.0, 0.0, 0.0, 1.0]);
        GqaAttention {
            q: eye(),
            k: eye(),
            v: eye(),
            o: eye(),
            q_norm: None,
            k_norm: None,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 2,
            rope: Rope::plain(2, 10000.0, RopeStyle::NeoX),
            eps: 1e-6,
            sliding_window: window,
            biases: None,
        }
    }

    #[test]
    fn a_sliding_window_hides_old_positions() {
        // Three tokens whose values (= inputs, identity projections) are (3,0), (6,0), (9,0), then
        // a zero token: its query is zero, every score is equal, and its output is the plain mean
        // of the values it can see, its own (0,0) included.
        let run = |attn: &GqaAttention| {
            let mut cache = LayerCache {
                k_dim: 2,
                v_dim: 2,
                ..Default::default()
            };
            let prompt = [3.0, 0.0, 6.0, 0.0, 9.0, 0.0];
            attn.forward(
                &prompt,
                3,
                &mut [SeqView {
                    rows: 0..3,
                    start_pos: 0,
                    cache: &mut cache,
                }],
            );
            attn.forward(
                &[0.0, 0.0],
                1,
                &mut [SeqView {
                    rows: 0..1,
                    start_pos: 3,
                    cache: &mut cache,
                }],
            )
        };
        let full = run(&attention(None));
        let windowed = run(&attention(Some(2)));
        assert!((full[0] - (3.0 + 6.0 + 9.0 + 0.0) / 4.0).abs() < 1e-5, "{full:?}");
        assert!((windowed[0] - (9.0 + 0.0) / 2.0).abs() < 1e-5, "{windowed:?}");
    }
}
