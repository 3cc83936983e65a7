//! A weight matrix's bytes in the format the checkpoint stores, with the checks and the
//! per-element decoding every format has (the products are in `linear.rs` and the format files).

use crate::storage::Storage;
use crate::{dot, fp8, ggml, int4, mxfp4, q8_0};

/// A weight matrix's bytes in the format the checkpoint stores. Shapes in comments are for a
/// (out, in) matrix.
#[derive(Clone, Debug)]
pub enum WeightData {
    /// (out, in)
    F32(Storage<f32>),
    /// (out, in) BF16 bits
    Bf16(Storage<u16>),
    /// (out, in) F16 bits
    F16(Storage<u16>),
    /// FP8 E4M3 (out, in) + f32 scales (ceil(out/bo), ceil(in/bi)) for blocks (bo, bi).
    Fp8 {
        w: Storage<u8>,
        scales: Storage<f32>,
        block: (usize, usize),
    },
    /// INT4 pack-quantized: words (out, ceil(in/8)) + BF16 scales (out, ceil(in/group)).
    Int4 {
        packed: Storage<u32>,
        scales: Storage<u16>,
        group: usize,
    },
    /// MXFP4: bytes (out, ceil(in/2)) + E8M0 scales (out, ceil(in/32)).
    Mxfp4 {
        packed: Storage<u8>,
        scales: Storage<u8>,
    },
    /// INT8: (out, in) + f32 scale per row (out,).
    Int8 { w: Storage<i8>, scales: Storage<f32> },
    /// GGUF Q8_0: (out, in / 32) blocks of 34 bytes, an F16 scale and 32 signed bytes
    /// ([`crate::q8_0`]); `in` a multiple of 32.
    Q8_0 { blocks: Storage<u8> },
    /// GGUF's other block types ([`crate::ggml`]): (out, in / block) blocks of `ty`; `in` a
    /// multiple of the type's block (32 or 256 weights).
    Ggml {
        ty: ggml::BlockType,
        blocks: Storage<u8>,
    },
}

impl WeightData {
    pub fn bf16_from_le_bytes(bytes: &[u8]) -> WeightData {
        WeightData::Bf16(u16s(bytes).into())
    }
    pub fn f16_from_le_bytes(bytes: &[u8]) -> WeightData {
        WeightData::F16(u16s(bytes).into())
    }
    pub fn f32_from_le_bytes(bytes: &[u8]) -> WeightData {
        WeightData::F32(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect::<Vec<_>>()
                .into(),
        )
    }
    /// Checks that the buffers fit a (out, in) matrix; says what does not.
    pub fn check_shape(&self, out_dim: usize, in_dim: usize) -> Result<(), String> {
        let want = |what: &str, got: usize, need: usize| {
            if got == need {
                Ok(())
            } else {
                Err(format!(
                    "{what} holds {got} elements, ({out_dim}, {in_dim}) needs {need}"
                ))
            }
        };
        match self {
            WeightData::F32(v) => want("weight", v.len(), out_dim * in_dim),
            WeightData::Bf16(v) | WeightData::F16(v) => want("weight", v.len(), out_dim * in_dim),
            WeightData::Fp8 { w, scales, block } => {
                if block.0 == 0 || block.1 == 0 {
                    return Err("block size must be positive".into());
                }
                want("weight", w.len(), out_dim * in_dim)?;
                want(
                    "scales",
                    scales.len(),
                    out_dim.div_ceil(block.0) * in_dim.div_ceil(block.1),
                )
            }
            WeightData::Int4 {
                packed,
                scales,
                group,
            } => {
                if *group == 0 {
                    return Err("group size must be positive".into());
                }
                want("packed weight", packed.len(), out_dim * in_dim.div_ceil(8))?;
                want("scales", scales.len(), out_dim * in_dim.div_ceil(*group))
            }
            WeightData::Mxfp4 { packed, scales } => {
                want("packed weight", packed.len(), out_dim * in_dim.div_ceil(2))?;
                want("scales", scales.len(), out_dim * in_dim.div_ceil(mxfp4::GROUP))
            }
            WeightData::Int8 { w, scales } => {
                want("weight", w.len(), out_dim * in_dim)?;
                want("scales", scales.len(), out_dim)
            }
            WeightData::Q8_0 { blocks } => {
                if !in_dim.is_multiple_of(q8_0::BLOCK) {
                    return Err(format!("Q8_0 rows hold blocks of 32 weights; in = {in_dim}"));
                }
                want("block bytes", blocks.len(), out_dim * q8_0::row_bytes(in_dim))
            }
            WeightData::Ggml { ty, blocks } => {
                if !in_dim.is_multiple_of(ty.block()) {
                    let (name, k) = (ty.name(), ty.block());
                    return Err(format!("{name} rows hold blocks of {k} weights; in = {in_dim}"));
                }
                want("block bytes", blocks.len(), out_dim * ty.row_bytes(in_dim))
            }
        }
    }

    /// Whether every buffer of the weight is a view into someone else's bytes (no copy).
    pub fn is_borrowed(&self) -> bool {
        match self {
            WeightData::F32(v) => v.is_borrowed(),
            WeightData::Bf16(v) | WeightData::F16(v) => v.is_borrowed(),
            WeightData::Fp8 { w, scales, .. } => w.is_borrowed() && scales.is_borrowed(),
            WeightData::Int4 { packed, scales, .. } => packed.is_borrowed() && scales.is_borrowed(),
            WeightData::Mxfp4 { packed, scales } => packed.is_borrowed() && scales.is_borrowed(),
            WeightData::Int8 { w, scales } => w.is_borrowed() && scales.is_borrowed(),
            WeightData::Q8_0 { blocks } | WeightData::Ggml { blocks, .. } => blocks.is_borrowed(),
        }
    }

    /// Row r of an (out, `n`) matrix widened to f32 into `out` (n,).
    pub fn decode_row(&self, n: usize, r: usize, out: &mut [f32]) {
        let (a, b) = (r * n, (r + 1) * n);
        match self {
            WeightData::F32(w) => out.copy_from_slice(&w[a..b]),
            WeightData::Bf16(w) => out
                .iter_mut()
                .zip(&w[a..b])
                .for_each(|(o, v)| *o = dot::bf16_to_f32(*v)),
            WeightData::F16(w) => out
                .iter_mut()
                .zip(&w[a..b])
                .for_each(|(o, v)| *o = half::f16::from_bits(*v).to_f32()),
            WeightData::Fp8 { w, scales, block } => {
                let per_row = n.div_ceil(block.1);
                let s = &scales[(r / block.0) * per_row..];
                for (j, o) in out.iter_mut().enumerate() {
                    *o = fp8::e4m3_to_f32(w[a + j]) * s[j / block.1];
                }
            }
            WeightData::Int4 {
                packed,
                scales,
                group,
            } => {
                let (p, s) = packed_row(packed, scales, n.div_ceil(8), n.div_ceil(*group), r);
                for (j, o) in out.iter_mut().enumerate() {
                    *o = int4::int4_at(p, j) as f32 * dot::bf16_to_f32(s[j / group]);
                }
            }
            WeightData::Mxfp4 { packed, scales } => {
                let (p, s) = packed_row(packed, scales, n.div_ceil(2), n.div_ceil(mxfp4::GROUP), r);
                for (j, o) in out.iter_mut().enumerate() {
                    *o = mxfp4::E2M1[mxfp4::code_at(p, j) as usize] * mxfp4::e8m0_to_f32(s[j / mxfp4::GROUP]);
                }
            }
            WeightData::Int8 { w, scales } => {
                for (o, q) in out.iter_mut().zip(&w[a..b]) {
                    *o = *q as f32 * scales[r];
                }
            }
            WeightData::Q8_0 { blocks } => {
                let rb = q8_0::row_bytes(n);
                let row = &blocks[r * rb..(r + 1) * rb];
                for (j, o) in out.iter_mut().enumerate() {
                    *o = q8_0::weight(row, j);
                }
            }
            WeightData::Ggml { ty, blocks } => {
                let rb = ty.row_bytes(n);
                let row = &blocks[r * rb..(r + 1) * rb];
                for (block, o) in row
                    .chunks_exact(ty.block_bytes())
                    .zip(out.chunks_exact_mut(ty.block()))
                {
                    ty.decode(block, o);
                }
            }
        }
    }

    pub fn format_name(&self) -> &'static str {
        match self {
            WeightData::F32(_) => "F32",
            WeightData::Bf16(_) => "BF16",
            WeightData::F16(_) => "F16",
            WeightData::Fp8 { .. } => "FP8-E4M3 block-scaled",
            WeightData::Int4 { .. } => "INT4 pack-quantized",
            WeightData::Mxfp4 { .. } => "MXFP4",
            WeightData::Int8 { .. } => "INT8 per-row",
            WeightData::Q8_0 { .. } => "Q8_0",
            WeightData::Ggml { ty, .. } => ty.name(),
        }
    }
}

/// A vector of `n` u16 filled by `fill` through its little-endian byte view, so large weights are
/// read straight into their final buffer (no second copy while loading).
pub fn u16_vec_from_bytes<E>(n: usize, fill: impl FnOnce(&mut [u8]) -> Result<(), E>) -> Result<Vec<u16>, E> {
    let mut v = vec![0u16; n];
    // SAFETY: the byte view covers exactly the vector's initialised memory, and every bit pattern
    // is a valid u16.
    let bytes = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, n * 2) };
    fill(bytes)?;
    // The bytes are little-endian on disk: a no-op on little-endian targets.
    v.iter_mut().for_each(|w| *w = u16::from_le(*w));
    Ok(v)
}

/// Row r of a packed matrix and of its scales: `per_row` items of data and `scales_per_row` scales.
#[inline]
pub(crate) fn packed_row<'a, P, S>(
    packed: &'a [P],
    scales: &'a [S],
    per_row: usize,
    scales_per_row: usize,
    r: usize,
) -> (&'a [P], &'a [S]) {
    (
        &packed[r * per_row..(r + 1) * per_row],
        &scales[r * scales_per_row..(r + 1) * scales_per_row],
    )
}

fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect()
}
