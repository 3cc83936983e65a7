//! Random matrices in every GPU format, with their decoded weights and the CPU's scalar
//! reference (the product tests share them).

#![allow(dead_code)]

use strata_gpu::{Gpu, GpuError};
use strata_kernels::WeightData;

use super::common::Rng;

/// Formats the tests draw from, in the order `Weights::random` takes them.
pub const KINDS: usize = 7;

/// A matrix in one of the GPU's formats as the CPU holds it, with its decoded weights and the
/// CPU's scalar reference for a row.
pub struct Weights {
    pub data: WeightData,
    pub in_dim: usize,
    /// Every weight as the CPU's decoder gives it (rows x in_dim).
    pub decoded: Vec<f32>,
}

impl Weights {
    /// `kind` < KINDS picks the format; FP8 blocks and INT4 groups vary with the draw, off the
    /// kernels' 8-input fast paths too.
    pub fn random(kind: usize, rows: usize, in_dim: usize, rng: &mut Rng) -> Weights {
        Weights::random_variant(kind, rows, in_dim, None, rng)
    }

    /// [`Weights::random`] with FP8's block or INT4's group the `variant`th of their four (None:
    /// drawn), so that matrices of one shape share their scales' layout.
    pub fn random_variant(
        kind: usize,
        rows: usize,
        in_dim: usize,
        variant: Option<usize>,
        rng: &mut Rng,
    ) -> Weights {
        let n = rows * in_dim;
        let data = match kind {
            0 => WeightData::Bf16(rng.bf16s(n).into()),
            // Any finite F16 bits, subnormals included.
            1 => WeightData::F16(
                (0..n)
                    .map(|_| loop {
                        let b = rng.next() as u16;
                        if b & 0x7c00 != 0x7c00 {
                            break b;
                        }
                    })
                    .collect::<Vec<_>>()
                    .into(),
            ),
            2 => WeightData::F32(rng.f32s(n).into()),
            3 => WeightData::Int8 {
                w: (0..n).map(|_| rng.next() as i8).collect::<Vec<_>>().into(),
                scales: (0..rows)
                    .map(|_| rng.f32().abs() / 64.0)
                    .collect::<Vec<_>>()
                    .into(),
            },
            4 => {
                let block = [(128, 128), (1, 16), (3, 8), (2, 5)][variant.unwrap_or_else(|| rng.below(4))];
                let blocks = rows.div_ceil(block.0) * in_dim.div_ceil(block.1);
                WeightData::Fp8 {
                    // Any E4M3 byte but the two NaNs.
                    w: (0..n)
                        .map(|_| loop {
                            let b = rng.next() as u8;
                            if b & 0x7f != 0x7f {
                                break b;
                            }
                        })
                        .collect::<Vec<_>>()
                        .into(),
                    scales: (0..blocks).map(|_| rng.f32() / 16.0).collect::<Vec<_>>().into(),
                    block,
                }
            }
            5 => {
                let group = [32, 128, 8, 12][variant.unwrap_or_else(|| rng.below(4))];
                WeightData::Int4 {
                    packed: (0..rows * in_dim.div_ceil(8))
                        .map(|_| rng.next() as u32)
                        .collect::<Vec<_>>()
                        .into(),
                    scales: rng.bf16s(rows * in_dim.div_ceil(group)).into(),
                    group,
                }
            }
            _ => WeightData::Mxfp4 {
                packed: (0..rows * in_dim.div_ceil(2))
                    .map(|_| rng.next() as u8)
                    .collect::<Vec<_>>()
                    .into(),
                scales: (0..rows * in_dim.div_ceil(32))
                    .map(|_| 118 + rng.below(16) as u8)
                    .collect::<Vec<_>>()
                    .into(),
            },
        };
        let mut decoded = vec![0f32; n];
        for (r, row) in decoded.chunks_exact_mut(in_dim).enumerate() {
            data.decode_row(in_dim, r, row);
        }
        Weights {
            data,
            in_dim,
            decoded,
        }
    }
    pub fn upload(&self, g: &Gpu) -> Result<strata_gpu::GpuMatrix, GpuError> {
        g.upload_weights(&self.data, self.in_dim)
            .expect("the GPU has kernels for every format the tests draw")
    }
    /// Whether a GPU product's row r equals the CPU's within reordering: two f32 sums of the
    /// same n products in different orders each lie within (n - 1) u sum|p| of the exact sum
    /// (u = 2^-24); a packed format's scale applied per weight (the GPU) or per group (the CPU)
    /// rounds each product once more: they differ by at most 2 (n + 1) u sum|p|.
    pub fn within_reorder_bound(&self, gpu: f32, cpu: f32, r: usize, x: &[f32]) -> bool {
        let n = x.len();
        let abs: f64 = (0..n)
            .map(|i| (self.value(r * n + i) as f64 * x[i] as f64).abs())
            .sum();
        let bound = 2.0 * (n + 1) as f64 * (1.0 / (1u64 << 24) as f64) * abs;
        ((gpu as f64) - (cpu as f64)).abs() <= bound + f64::from(f32::MIN_POSITIVE)
    }
    pub fn value(&self, i: usize) -> f32 {
        self.decoded[i]
    }
    pub fn reference(&self, r: usize, x: &[f32]) -> f32 {
        use strata_kernels::{dot, fp8, int4, int8, mxfp4};
        let n = self.in_dim;
        let span = r * n..(r + 1) * n;
        match &self.data {
            WeightData::Bf16(w) => dot::dot_bf16_reference(&w[span], x),
            WeightData::F16(w) => dot::dot_f16_reference(&w[span], x),
            WeightData::F32(w) => dot::dot_f32_reference(&w[span], x),
            WeightData::Int8 { w, scales } => int8::dot_int8_reference(&w[span], scales[r], x),
            WeightData::Fp8 { w, scales, block } => {
                let per_row = n.div_ceil(block.1);
                let s = &scales[(r / block.0) * per_row..][..per_row];
                fp8::dot_fp8_reference(&w[span], s, block.1, x)
            }
            WeightData::Int4 {
                packed,
                scales,
                group,
            } => {
                let (pw, ps) = (n.div_ceil(8), n.div_ceil(*group));
                int4::dot_int4_reference(&packed[r * pw..][..pw], &scales[r * ps..][..ps], *group, x)
            }
            WeightData::Mxfp4 { packed, scales } => {
                let (pw, ps) = (n.div_ceil(2), n.div_ceil(32));
                mxfp4::dot_mxfp4_reference(&packed[r * pw..][..pw], &scales[r * ps..][..ps], x)
            }
            other => unreachable!("{} is not drawn", other.format_name()),
        }
    }
    pub fn name(&self) -> String {
        match &self.data {
            WeightData::Fp8 { block, .. } => format!("FP8 {}x{}", block.0, block.1),
            WeightData::Int4 { group, .. } => format!("INT4 g{group}"),
            d => d.format_name().to_string(),
        }
    }
}
