//! Kimi Delta Attention (Kimi Linear, Kimi K3): gated delta-rule linear attention with a fixed-size
//! recurrent state per head instead of a growing KV cache.
//!
//! u = [q|k|v](x) (T, 3C), C = heads * Dk; a causal depthwise convolution of K taps over u (its
//! history: the last K-1 inputs), then SiLU; q, k L2-normalised per head, q *= Dk^-1/2.
//! Forget gate per key channel g = form(a, f_b(f_a(x)) + dt_bias) < 0, beta = sigmoid(b(x)).
//! Per head, state S (Dk x Dv): S <- diag(exp g) S; S <- S + k beta (v - S^T k)^T; o = S^T q.
//! Output: RMSNorm_Dv(o; o_norm) * sigmoid(gate(x)), then o_proj.
//!
//! Decoding one token runs the recurrence; a prompt runs the same recurrence chunk by chunk in
//! its parallel form (see [`KdaAttention::chunk`]), which computes the same numbers.

use strata_kernels::Linear;

use super::attention::SeqView;
use super::math::{mul_sigmoid, rms_norm, sigmoid, silu, ACT_PER_TASK};
use crate::LayerState;

/// How the raw forget-gate projection becomes a log-decay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ForgetGate {
    /// Kimi Linear: g = -a * softplus(raw).
    Softplus,
    /// Kimi K3 "safe gate": g = lower_bound * sigmoid(a * raw).
    Bounded { lower_bound: f32 },
}

pub enum OutputGate {
    /// Kimi Linear: g_b(g_a(x)), (C, Dk) x (Dk, D).
    LowRank { a: Linear, b: Linear },
    /// Kimi K3: g(x), (C, D).
    Full(Linear),
}

pub struct KdaAttention {
    /// (C, D) each.
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    /// (3C, K) convolution taps, channels q|k|v; tap K-1 multiplies the current token.
    pub conv: Vec<f32>,
    /// (C,) exp(A_log) for each key channel (one value per head, repeated over its channels).
    pub a: Vec<f32>,
    /// (C,)
    pub dt_bias: Vec<f32>,
    /// (Dk, D) and (C, Dk): the low-rank forget-gate projection.
    pub f_a: Linear,
    pub f_b: Linear,
    /// (heads, D)
    pub b: Linear,
    pub forget: ForgetGate,
    pub out_gate: OutputGate,
    /// (Dv,)
    pub o_norm: Vec<f32>,
    /// (D, C)
    pub o: Linear,
    pub n_heads: usize,
    pub head_dim: usize,
    pub kernel: usize,
    pub eps: f32,
    /// Normalise q and k as x / max(|x|, 1e-12) (a reference switch) instead of
    /// x / sqrt(sum x^2 + 1e-6).
    pub l2_clamp: bool,
    /// Tokens per chunk of the parallel prompt form.
    pub chunk: usize,
}

/// softplus as torch computes it (linear above 20).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// x / sqrt(sum x^2 + 1e-6) (or x / max(|x|, 1e-12) with `clamp`), in place.
fn l2_normalize(x: &mut [f32], clamp: bool) {
    let sq = x.iter().map(|v| v * v).sum::<f32>();
    let inv = if clamp {
        1.0 / sq.sqrt().max(1e-12)
    } else {
        1.0 / (sq + 1e-6).sqrt()
    };
    x.iter_mut().for_each(|v| *v *= inv);
}

/// The per-token inputs of the recurrence of one head, for a run of tokens: q, k (T, Dk), v (T, Dv),
/// log-decay g (T, Dk), beta (T,). Rows are tokens.
struct HeadInputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
}

impl KdaAttention {
    fn width(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn state(&self) -> LayerState {
        LayerState::Recurrent {
            recurrent: self.n_heads * self.head_dim * self.head_dim,
            conv: (self.kernel - 1) * 3 * self.width(),
        }
    }

    /// x (T, D) normed -> (T, D)
    pub fn forward(&self, x: &[f32], n_tokens: usize, seqs: &mut [SeqView<'_>]) -> Vec<f32> {
        let (nh, dk, c) = (self.n_heads, self.head_dim, self.width());
        let dv = dk;
        let mut u = vec![0f32; n_tokens * 3 * c]; // (T, 3C) q|k|v before the convolution
        {
            let mut part = vec![0f32; n_tokens * c];
            for (j, w) in [&self.q, &self.k, &self.v].into_iter().enumerate() {
                w.matmul(x, n_tokens, &mut part);
                for t in 0..n_tokens {
                    u[t * 3 * c + j * c..t * 3 * c + (j + 1) * c].copy_from_slice(&part[t * c..(t + 1) * c]);
                }
            }
        }
        let mut graw = vec![0f32; n_tokens * c]; // (T, C)
        {
            let mut fa = vec![0f32; n_tokens * self.f_a.out_dim];
            self.f_a.matmul(x, n_tokens, &mut fa);
            self.f_b.matmul(&fa, n_tokens, &mut graw);
        }
        let mut g = graw; // (T, C) log-decay, in parts on the kernels' threads
        strata_kernels::for_each_chunk(&mut g, ACT_PER_TASK, |i, part| {
            for (j, v) in part.iter_mut().enumerate() {
                let ch = (i * ACT_PER_TASK + j) % c;
                let (a, raw) = (self.a[ch], *v + self.dt_bias[ch]);
                *v = match self.forget {
                    ForgetGate::Softplus => -a * softplus(raw),
                    ForgetGate::Bounded { lower_bound } => lower_bound * sigmoid(a * raw),
                };
            }
        });
        let mut beta = vec![0f32; n_tokens * nh]; // (T, heads)
        self.b.matmul(x, n_tokens, &mut beta);
        beta.iter_mut().for_each(|b| *b = sigmoid(*b));

        let mut out = vec![0f32; n_tokens * c]; // (T, C)
        let scale = (dk as f32).powf(-0.5);
        strata_kernels::profile::span("KDA conv and recurrence", n_tokens, || {
            for seq in seqs.iter_mut() {
                let rows = seq.rows.clone();
                let n = rows.len();
                let qkv = self.convolve(&u[rows.start * 3 * c..rows.end * 3 * c], n, &mut seq.cache.conv);
                // Head-major copies: (heads, n, Dk).
                let mut hq = vec![0f32; nh * n * dk];
                let mut hk = vec![0f32; nh * n * dk];
                let mut hv = vec![0f32; nh * n * dv];
                let mut hg = vec![0f32; nh * n * dk];
                let mut hb = vec![0f32; nh * n];
                for t in 0..n {
                    for h in 0..nh {
                        let dst = (h * n + t) * dk;
                        let src = t * 3 * c + h * dk;
                        hq[dst..dst + dk].copy_from_slice(&qkv[src..src + dk]);
                        hk[dst..dst + dk].copy_from_slice(&qkv[src + c..src + c + dk]);
                        hv[dst..dst + dv].copy_from_slice(&qkv[src + 2 * c..src + 2 * c + dv]);
                        l2_normalize(&mut hq[dst..dst + dk], self.l2_clamp);
                        hq[dst..dst + dk].iter_mut().for_each(|v| *v *= scale);
                        l2_normalize(&mut hk[dst..dst + dk], self.l2_clamp);
                        let gsrc = (rows.start + t) * c + h * dk;
                        hg[dst..dst + dk].copy_from_slice(&g[gsrc..gsrc + dk]);
                        hb[h * n + t] = beta[(rows.start + t) * nh + h];
                    }
                }
                // Each head's recurrence (its own state, its own output) on the kernels' threads:
                // computed alone, exactly as one by one.
                let mut head_out = vec![0f32; nh * n * dv]; // (heads, n, Dv)
                let state = &mut seq.cache.recurrent[..nh * dk * dv];
                strata_kernels::for_each_chunk_pair(state, dk * dv, &mut head_out, n * dv, |h, state, o| {
                    let inputs = HeadInputs {
                        q: &hq[h * n * dk..(h + 1) * n * dk],
                        k: &hk[h * n * dk..(h + 1) * n * dk],
                        v: &hv[h * n * dv..(h + 1) * n * dv],
                        g: &hg[h * n * dk..(h + 1) * n * dk],
                        beta: &hb[h * n..(h + 1) * n],
                    };
                    if n == 1 {
                        recurrent_step(&inputs, dk, dv, state, o);
                    } else {
                        for start in (0..n).step_by(self.chunk) {
                            let end = (start + self.chunk).min(n);
                            let part = HeadInputs {
                                q: &inputs.q[start * dk..end * dk],
                                k: &inputs.k[start * dk..end * dk],
                                v: &inputs.v[start * dv..end * dv],
                                g: &inputs.g[start * dk..end * dk],
                                beta: &inputs.beta[start..end],
                            };
                            Self::chunk(&part, dk, dv, state, &mut o[start * dv..end * dv]);
                        }
                    }
                });
                for h in 0..nh {
                    for t in 0..n {
                        let dst = (rows.start + t) * c + h * dv;
                        out[dst..dst + dv].copy_from_slice(&head_out[(h * n + t) * dv..(h * n + t + 1) * dv]);
                    }
                }
            }
        });

        rms_norm(&mut out, &self.o_norm, self.eps);
        let mut gate = vec![0f32; n_tokens * c]; // (T, C)
        match &self.out_gate {
            OutputGate::Full(w) => w.matmul(x, n_tokens, &mut gate),
            OutputGate::LowRank { a, b } => {
                let mut ga = vec![0f32; n_tokens * a.out_dim];
                a.matmul(x, n_tokens, &mut ga);
                b.matmul(&ga, n_tokens, &mut gate);
            }
        }
        mul_sigmoid(&mut out, &gate);
        let mut y = vec![0f32; n_tokens * self.o.out_dim];
        self.o.matmul(&out, n_tokens, &mut y);
        y
    }

    /// Causal depthwise convolution + SiLU of one sequence's new rows `u` (n, 3C), continuing
    /// `history` (K-1, 3C, oldest first), which is updated to the last K-1 inputs.
    fn convolve(&self, u: &[f32], n: usize, history: &mut [f32]) -> Vec<f32> {
        let (w3, k) = (3 * self.width(), self.kernel);
        let mut ext = Vec::with_capacity((k - 1 + n) * w3); // (K-1+n, 3C)
        ext.extend_from_slice(history);
        ext.extend_from_slice(u);
        let mut y = vec![0f32; n * w3];
        for t in 0..n {
            let row = &mut y[t * w3..(t + 1) * w3];
            for (ch, out) in row.iter_mut().enumerate() {
                let taps = &self.conv[ch * k..(ch + 1) * k];
                let mut acc = 0f32;
                for (j, w) in taps.iter().enumerate() {
                    acc += w * ext[(t + j) * w3 + ch];
                }
                *out = silu(acc);
            }
        }
        history.copy_from_slice(&ext[n * w3..]);
        y
    }

    /// The recurrence over a chunk of n tokens of one head in its parallel form, from `state`
    /// S0 (Dk, Dv), which becomes the state after the chunk. With G_t the in-chunk cumulative
    /// log-decay (G_t = g_1 + ... + g_t), every decay used is exp(G_t - G_s) for s <= t, exp(G_t)
    /// or exp(G_n - G_s): all <= 1, never a factor that can overflow.
    ///
    /// The delta rule's update of token t is k_t u_t^T with the "pseudo value"
    /// u_t = beta_t (v_t - S0^T (e^G_t * k_t) - sum_{s<t} A_ts u_s), A_ts = sum_i k_t,i k_s,i e^(G_t,i - G_s,i),
    /// a unit lower-triangular solve; then o_t = S0^T (e^G_t * q_t) + sum_{s<=t} B_ts u_s with
    /// B_ts = sum_i q_t,i k_s,i e^(G_t,i - G_s,i), and S_n = e^G_n * S0 + sum_s (e^(G_n - G_s) * k_s) u_s^T.
    fn chunk(x: &HeadInputs<'_>, dk: usize, dv: usize, state: &mut [f32], out: &mut [f32]) {
        let n = x.beta.len();
        let mut cum = vec![0f32; n * dk]; // (n, Dk) G_t
        for t in 0..n {
            for i in 0..dk {
                let prev = if t == 0 { 0.0 } else { cum[(t - 1) * dk + i] };
                cum[t * dk + i] = prev + x.g[t * dk + i];
            }
        }
        // e^G_t * k_t and e^G_t * q_t, (n, Dk) each.
        let mut kd = vec![0f32; n * dk];
        let mut qd = vec![0f32; n * dk];
        for j in 0..n * dk {
            let e = cum[j].exp();
            kd[j] = x.k[j] * e;
            qd[j] = x.q[j] * e;
        }
        let mut a = vec![0f32; n * n]; // (n, n) strictly lower: A_ts
        let mut b = vec![0f32; n * n]; // (n, n) lower incl. diagonal: B_ts
        let mut decay = vec![0f32; dk];
        for t in 0..n {
            for s in 0..=t {
                for i in 0..dk {
                    decay[i] = (cum[t * dk + i] - cum[s * dk + i]).exp() * x.k[s * dk + i];
                }
                let kt = &x.k[t * dk..(t + 1) * dk];
                let qt = &x.q[t * dk..(t + 1) * dk];
                if s < t {
                    a[t * n + s] = kt.iter().zip(&decay).map(|(p, q)| p * q).sum();
                }
                b[t * n + s] = qt.iter().zip(&decay).map(|(p, q)| p * q).sum();
            }
        }
        // Pseudo values by forward substitution, (n, Dv).
        let mut u = vec![0f32; n * dv];
        for t in 0..n {
            let row = &mut vec![0f32; dv];
            row.copy_from_slice(&x.v[t * dv..(t + 1) * dv]);
            for i in 0..dk {
                let kdi = kd[t * dk + i];
                for (r, s) in row.iter_mut().zip(&state[i * dv..(i + 1) * dv]) {
                    *r -= kdi * s;
                }
            }
            for s in 0..t {
                let ats = a[t * n + s];
                for (r, us) in row.iter_mut().zip(&u[s * dv..(s + 1) * dv]) {
                    *r -= ats * us;
                }
            }
            for (dst, r) in u[t * dv..(t + 1) * dv].iter_mut().zip(row.iter()) {
                *dst = x.beta[t] * r;
            }
        }
        for t in 0..n {
            let o = &mut out[t * dv..(t + 1) * dv];
            o.iter_mut().for_each(|v| *v = 0.0);
            for i in 0..dk {
                let qdi = qd[t * dk + i];
                for (ov, s) in o.iter_mut().zip(&state[i * dv..(i + 1) * dv]) {
                    *ov += qdi * s;
                }
            }
            for s in 0..=t {
                let bts = b[t * n + s];
                for (ov, us) in o.iter_mut().zip(&u[s * dv..(s + 1) * dv]) {
                    *ov += bts * us;
                }
            }
        }
        let last = &cum[(n - 1) * dk..n * dk];
        for i in 0..dk {
            let keep = last[i].exp();
            let row = &mut state[i * dv..(i + 1) * dv];
            row.iter_mut().for_each(|v| *v *= keep);
            for s in 0..n {
                let w = (last[i] - cum[s * dk + i]).exp() * x.k[s * dk + i];
                for (r, us) in row.iter_mut().zip(&u[s * dv..(s + 1) * dv]) {
                    *r += w * us;
                }
            }
        }
    }
}

/// One token of one head by the plain recurrence (decode), updating `state` (Dk, Dv).
fn recurrent_step(x: &HeadInputs<'_>, dk: usize, dv: usize, state: &mut [f32], out: &mut [f32]) {
    for t in 0..x.beta.len() {
        let (q, k, v, g) = (
            &x.q[t * dk..(t + 1) * dk],
            &x.k[t * dk..(t + 1) * dk],
            &x.v[t * dv..(t + 1) * dv],
            &x.g[t * dk..(t + 1) * dk],
        );
        let mut pred = vec![0f32; dv];
        for i in 0..dk {
            let keep = g[i].exp();
            let row = &mut state[i * dv..(i + 1) * dv];
            for (p, s) in pred.iter_mut().zip(row.iter_mut()) {
                *s *= keep;
                *p += k[i] * *s;
            }
        }
        let delta: Vec<f32> = v.iter().zip(&pred).map(|(v, p)| x.beta[t] * (v - p)).collect();
        let o = &mut out[t * dv..(t + 1) * dv];
        o.iter_mut().for_each(|v| *v = 0.0);
        for i in 0..dk {
            let row = &mut state[i * dv..(i + 1) * dv];
            for ((s, d), ov) in row.iter_mut().zip(&delta).zip(o.iter_mut()) {
                *s += k[i] * d;
                *ov += q[i] * *s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    /// The chunked form equals the token-by-token recurrence, for chunk sizes that do and do not
    /// divide the length, from a non-zero starting state, with decays down to e^-20 per token.
    #[test]
    fn chunked_form_equals_recurrence() {
        let (n, dk, dv) = (37, 8, 6);
        let mut q = pseudo_random(n * dk, 1, 1.0);
        let mut k = pseudo_random(n * dk, 2, 1.0);
        for t in 0..n {
            l2_normalize(&mut q[t * dk..(t + 1) * dk], false);
            l2_normalize(&mut k[t * dk..(t + 1) * dk], false);
        }
        let v = pseudo_random(n * dv, 3, 1.0);
        let g: Vec<f32> = pseudo_random(n * dk, 4, 1.0)
            .iter()
            .map(|r| -10.0 * (r + 1.0))
            .collect();
        let beta: Vec<f32> = pseudo_random(n, 5, 3.0).iter().map(|r| sigmoid(*r)).collect();
        let s0 = pseudo_random(dk * dv, 6, 0.5);
        let x = HeadInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let mut want_state = s0.clone();
        let mut want = vec![0f32; n * dv];
        for t in 0..n {
            let one = HeadInputs {
                q: &q[t * dk..(t + 1) * dk],
                k: &k[t * dk..(t + 1) * dk],
                v: &v[t * dv..(t + 1) * dv],
                g: &g[t * dk..(t + 1) * dk],
                beta: &beta[t..t + 1],
            };
            recurrent_step(&one, dk, dv, &mut want_state, &mut want[t * dv..(t + 1) * dv]);
        }
        for chunk in [1, 5, 16, 64] {
            let mut state = s0.clone();
            let mut got = vec![0f32; n * dv];
            for start in (0..n).step_by(chunk) {
                let end = (start + chunk).min(n);
                let part = HeadInputs {
                    q: &x.q[start * dk..end * dk],
                    k: &x.k[start * dk..end * dk],
                    v: &x.v[start * dv..end * dv],
                    g: &x.g[start * dk..end * dk],
                    beta: &x.beta[start..end],
                };
                KdaAttention::chunk(&part, dk, dv, &mut state, &mut got[start * dv..end * dv]);
            }
            let diff =
                |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(
                diff(&got, &want) < 1e-5,
                "chunk {chunk}: outputs differ by {}",
                diff(&got, &want)
            );
            assert!(
                diff(&state, &want_state) < 1e-5,
                "chunk {chunk}: states differ by {}",
                diff(&state, &want_state)
            );
        }
    }
}
