//! Block Attention Residuals (Kimi K3): instead of one running residual sum, each layer's input
//! is a softmax mixture over depth of the completed block sums and the current block's partial
//! sum. Token-local: nothing is carried across positions, so decoding needs no extra state.
//!
//! mix(partial, blocks) = sum_j p_j v_j, v = [blocks..., partial],
//! p = softmax_j(proj . RMSNorm(v_j; norm)) computed in f32; the mixed vectors are not normalised.

use super::math::softmax;

/// One mixing point's weights (a layer's attention input, its MLP input, or the model output).
pub struct ResMix {
    /// (D,)
    pub norm: Vec<f32>,
    /// (D,) the single row of the `[1, D]` projection.
    pub proj: Vec<f32>,
}

impl ResMix {
    /// partial (T, D), blocks: each (T, D) -> (T, D); a prompt's tokens on the kernels' threads
    /// (each token's row is its own computation).
    pub fn mix(&self, partial: &[f32], blocks: &[Vec<f32>], eps: f32) -> Vec<f32> {
        let d = self.norm.len();
        let mut out = vec![0f32; partial.len()];
        strata_kernels::for_each_chunk(&mut out, d, |t, row| {
            let mut scores = Vec::with_capacity(blocks.len() + 1);
            let source = |j: usize| -> &[f32] {
                let v = if j < blocks.len() { &blocks[j] } else { partial };
                &v[t * d..(t + 1) * d]
            };
            for j in 0..=blocks.len() {
                let v = source(j);
                let inv = 1.0 / (v.iter().map(|x| x * x).sum::<f32>() / d as f32 + eps).sqrt();
                let s: f32 = v
                    .iter()
                    .zip(&self.norm)
                    .zip(&self.proj)
                    .map(|((x, n), p)| n * (x * inv) * p)
                    .sum();
                scores.push(s);
            }
            softmax(&mut scores);
            for (j, p) in scores.iter().enumerate() {
                for (o, v) in row.iter_mut().zip(source(j)) {
                    *o += p * v;
                }
            }
        });
        out
    }
}

/// The AttnRes weights of one decoder layer.
pub struct LayerRes {
    pub attn: ResMix,
    pub mlp: ResMix,
}

/// The model-level AttnRes settings.
pub struct AttnRes {
    /// A new block starts at every layer index that is a multiple of this.
    pub block_size: usize,
    /// Mixes the final output before the last norm.
    pub output: ResMix,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixing_weights_follow_the_normed_scores() {
        // D = 2, one block and the partial. norm = 1, proj = (1, 0): score = x0 / rms(x).
        let m = ResMix {
            norm: vec![1.0, 1.0],
            proj: vec![1.0, 0.0],
        };
        let block = vec![vec![3.0, 4.0]];
        let partial = [-1.0, 0.0];
        let out = m.mix(&partial, &block, 0.0);
        let s0 = 3.0 / (12.5f32).sqrt();
        let s1 = -1.0 / (0.5f32).sqrt();
        let p0 = s0.exp() / (s0.exp() + s1.exp());
        let want = [p0 * 3.0 + -(1.0 - p0), p0 * 4.0];
        assert!((out[0] - want[0]).abs() < 1e-6 && (out[1] - want[1]).abs() < 1e-6);
    }
}
