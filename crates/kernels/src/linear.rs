//! A linear layer's weight `W (out, in)` in its stored format, and the products with it:
//! `matvec`: W (out,in) @ x (in,) -> y (out,), and `matmul`: for T tokens, X (T,in) -> Y (T,out).
//! Model code calls these whatever the format; the format is a property of the storage.

use rayon::prelude::*;

use crate::dot;

#[derive(Clone, Debug)]
pub enum WeightData {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    F16(Vec<u16>),
}

impl WeightData {
    pub fn bf16_from_le_bytes(bytes: &[u8]) -> WeightData {
        WeightData::Bf16(u16s(bytes))
    }
    pub fn f16_from_le_bytes(bytes: &[u8]) -> WeightData {
        WeightData::F16(u16s(bytes))
    }
    pub fn f32_from_le_bytes(bytes: &[u8]) -> WeightData {
        WeightData::F32(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        )
    }
    fn len(&self) -> usize {
        match self {
            WeightData::F32(v) => v.len(),
            WeightData::Bf16(v) | WeightData::F16(v) => v.len(),
        }
    }
    pub fn format_name(&self) -> &'static str {
        match self {
            WeightData::F32(_) => "F32",
            WeightData::Bf16(_) => "BF16",
            WeightData::F16(_) => "F16",
        }
    }
}

fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect()
}

#[derive(Clone, Debug)]
pub struct Linear {
    pub out_dim: usize,
    pub in_dim: usize,
    pub data: WeightData,
}

/// Below this many multiply-adds a product runs on the calling thread (thread hand-off costs more).
const PARALLEL_MIN_WORK: usize = 1 << 17;
const ROWS_PER_TASK: usize = 16;

impl Linear {
    pub fn new(out_dim: usize, in_dim: usize, data: WeightData) -> Linear {
        assert_eq!(
            data.len(),
            out_dim * in_dim,
            "weight holds {} elements, shape ({out_dim}, {in_dim}) needs {}",
            data.len(),
            out_dim * in_dim
        );
        Linear {
            out_dim,
            in_dim,
            data,
        }
    }

    pub fn from_f32(out_dim: usize, in_dim: usize, w: Vec<f32>) -> Linear {
        Linear::new(out_dim, in_dim, WeightData::F32(w))
    }

    /// Bytes the weight occupies in memory (what a cache budgets for).
    pub fn bytes(&self) -> usize {
        match &self.data {
            WeightData::F32(v) => v.len() * 4,
            WeightData::Bf16(v) | WeightData::F16(v) => v.len() * 2,
        }
    }

    /// y[r] = W[r,:] . x
    #[inline]
    pub fn row_dot(&self, r: usize, x: &[f32]) -> f32 {
        let (a, b) = (r * self.in_dim, (r + 1) * self.in_dim);
        match &self.data {
            WeightData::F32(w) => dot::dot_f32(&w[a..b], x),
            WeightData::Bf16(w) => dot::dot_bf16(&w[a..b], x),
            WeightData::F16(w) => dot::dot_f16(&w[a..b], x),
        }
    }

    /// W (out,in) @ x (in,) -> y (out,)
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        self.matmul(x, 1, y);
    }

    /// X (T,in) -> Y (T,out), Y[t] = W @ X[t]; each element is one `row_dot`, whatever T is.
    pub fn matmul(&self, xs: &[f32], n_tokens: usize, ys: &mut [f32]) {
        assert_eq!(
            xs.len(),
            n_tokens * self.in_dim,
            "matmul input is not (T, in)"
        );
        assert_eq!(
            ys.len(),
            n_tokens * self.out_dim,
            "matmul output is not (T, out)"
        );
        let work = self.out_dim * self.in_dim * n_tokens;
        if work < PARALLEL_MIN_WORK || crate::threads() == 1 {
            for r in 0..self.out_dim {
                for t in 0..n_tokens {
                    ys[t * self.out_dim + r] =
                        self.row_dot(r, &xs[t * self.in_dim..(t + 1) * self.in_dim]);
                }
            }
            return;
        }
        // Row blocks in parallel; each block computes its rows for every token (weights are read once).
        let n_blocks = self.out_dim.div_ceil(ROWS_PER_TASK);
        let blocks: Vec<Vec<f32>> = (0..n_blocks)
            .into_par_iter()
            .map(|b| {
                let rows = b * ROWS_PER_TASK..((b + 1) * ROWS_PER_TASK).min(self.out_dim);
                let mut out = Vec::with_capacity(rows.len() * n_tokens);
                for r in rows {
                    for t in 0..n_tokens {
                        out.push(self.row_dot(r, &xs[t * self.in_dim..(t + 1) * self.in_dim]));
                    }
                }
                out
            })
            .collect();
        for (b, block) in blocks.iter().enumerate() {
            let r0 = b * ROWS_PER_TASK;
            for (i, v) in block.iter().enumerate() {
                let (r, t) = (r0 + i / n_tokens, i % n_tokens);
                ys[t * self.out_dim + r] = *v;
            }
        }
    }

    /// One row as f32 (embedding lookups).
    pub fn row_f32(&self, r: usize) -> Vec<f32> {
        let (a, b) = (r * self.in_dim, (r + 1) * self.in_dim);
        match &self.data {
            WeightData::F32(w) => w[a..b].to_vec(),
            WeightData::Bf16(w) => w[a..b].iter().map(|v| dot::bf16_to_f32(*v)).collect(),
            WeightData::F16(w) => w[a..b]
                .iter()
                .map(|v| half::f16::from_bits(*v).to_f32())
                .collect(),
        }
    }

    /// The whole matrix as f32 (for small weights that are reshaped at load time).
    pub fn to_f32(&self) -> Vec<f32> {
        (0..self.out_dim).flat_map(|r| self.row_f32(r)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_equals_per_token_matvec_bit_for_bit() {
        let (out, inp) = (300, 700);
        let w: Vec<u16> = (0..out * inp)
            .map(|i| half::bf16::from_f32(((i * 7919) % 1000) as f32 / 500.0 - 1.0).to_bits())
            .collect();
        let lin = Linear::new(out, inp, WeightData::Bf16(w));
        let xs: Vec<f32> = (0..3 * inp)
            .map(|i| ((i * 31) % 97) as f32 / 97.0 - 0.5)
            .collect();
        let mut ys = vec![0f32; 3 * out];
        lin.matmul(&xs, 3, &mut ys);
        for t in 0..3 {
            let mut y = vec![0f32; out];
            lin.matvec(&xs[t * inp..(t + 1) * inp], &mut y);
            assert_eq!(&ys[t * out..(t + 1) * out], &y[..], "token {t}");
        }
    }
}
