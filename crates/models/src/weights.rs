//! Reading weights out of a checkpoint by tensor name. The stored format of a linear layer is
//! decided here, from the tensors the checkpoint actually has (and the block/group sizes of its
//! `quantization_config`), so model code never branches on it:
//!
//! | tensors under `{base}.` | format |
//! |---|---|
//! | `weight` BF16/F16/F32 | dense |
//! | `weight` F8_E4M3 + `weight_scale_inv` F32 | FP8 block-scaled |
//! | `weight` I8 + `weight_scale` | INT8 per row |
//! | `weight_packed` I32 + `weight_scale` BF16 (+ `weight_shape`) | INT4 pack-quantized |
//! | `weight_packed` U8 + `weight_scale` U8 | MXFP4 |

use strata_formats::{bytes_to_f32, Checkpoint, DType, FormatError};
use strata_kernels::{Linear, WeightData};

use crate::Result;

fn bad(ckpt: &Checkpoint, name: &str, reason: String) -> crate::ModelError {
    let path = ckpt
        .entry(name)
        .map(|e| ckpt.shard_path(e.shard).to_path_buf())
        .unwrap_or_else(|_| ckpt.dir().to_path_buf());
    FormatError::BadTensor {
        path,
        tensor: name.to_string(),
        reason,
    }
    .into()
}

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// Any float tensor as f32 (scales).
fn read_any_f32(ckpt: &Checkpoint, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let e = ckpt.expect(name, shape, &[DType::F32, DType::BF16, DType::F16])?;
    let dtype = e.info.dtype;
    Ok(bytes_to_f32(&ckpt.read_bytes(name)?, dtype))
}

/// Loads the linear layer whose tensors start with `base` (e.g. `model.layers.0.self_attn.q_proj`)
/// as a (out, in) weight in its stored format.
pub fn load_linear(ckpt: &Checkpoint, base: &str, out_dim: usize, in_dim: usize) -> Result<Linear> {
    let weight = format!("{base}.weight");
    let packed = format!("{base}.weight_packed");
    let data = if ckpt.contains(&weight) {
        let dtype = ckpt.entry(&weight)?.info.dtype;
        match dtype {
            DType::BF16 | DType::F16 | DType::F32 => {
                ckpt.expect(&weight, &[out_dim, in_dim], &[])?;
                let bytes = ckpt.read_bytes(&weight)?;
                match dtype {
                    DType::BF16 => WeightData::bf16_from_le_bytes(&bytes),
                    DType::F16 => WeightData::f16_from_le_bytes(&bytes),
                    _ => WeightData::f32_from_le_bytes(&bytes),
                }
            }
            DType::F8E4M3 => {
                ckpt.expect(&weight, &[out_dim, in_dim], &[])?;
                let block = ckpt.quantization().map_or((128, 128), |q| q.fp8_block);
                let scale_name = format!("{base}.weight_scale_inv");
                if !ckpt.contains(&scale_name) {
                    return Err(bad(
                        ckpt,
                        &weight,
                        format!("FP8 weight without its `{scale_name}`"),
                    ));
                }
                let grid = [out_dim.div_ceil(block.0), in_dim.div_ceil(block.1)];
                let scales = read_any_f32(ckpt, &scale_name, &grid)?;
                WeightData::Fp8 {
                    w: ckpt.read_bytes(&weight)?,
                    scales,
                    block,
                }
            }
            DType::I8 => {
                ckpt.expect(&weight, &[out_dim, in_dim], &[])?;
                let scale_name = format!("{base}.weight_scale");
                if !ckpt.contains(&scale_name) {
                    return Err(bad(
                        ckpt,
                        &weight,
                        format!("INT8 weight without its `{scale_name}`"),
                    ));
                }
                let scale_shape = ckpt.entry(&scale_name)?.info.shape.clone();
                if scale_shape.iter().product::<usize>() != out_dim {
                    return Err(bad(
                        ckpt,
                        &scale_name,
                        format!("shape {scale_shape:?}: expected one scale per output row ({out_dim})"),
                    ));
                }
                let scales = read_any_f32(ckpt, &scale_name, &scale_shape)?;
                let w = ckpt.read_bytes(&weight)?.into_iter().map(|b| b as i8).collect();
                WeightData::Int8 { w, scales }
            }
            other => {
                return Err(bad(
                    ckpt,
                    &weight,
                    format!("dtype {other} is not a supported weight format"),
                ))
            }
        }
    } else if ckpt.contains(&packed) {
        let scale_name = format!("{base}.weight_scale");
        if !ckpt.contains(&scale_name) {
            return Err(bad(
                ckpt,
                &packed,
                format!("packed weight without its `{scale_name}`"),
            ));
        }
        let shape_name = format!("{base}.weight_shape");
        if ckpt.contains(&shape_name) {
            let bytes = ckpt.read_bytes(&shape_name)?;
            let dtype = ckpt.entry(&shape_name)?.info.dtype;
            let dims: Vec<i64> = match dtype {
                DType::I64 => bytes
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                DType::I32 => bytes
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect(),
                other => return Err(bad(ckpt, &shape_name, format!("dtype {other}: expected I64"))),
            };
            if dims != [out_dim as i64, in_dim as i64] {
                return Err(bad(
                    ckpt,
                    &shape_name,
                    format!("says {dims:?} but config.json implies [{out_dim}, {in_dim}]"),
                ));
            }
        }
        match ckpt.entry(&packed)?.info.dtype {
            DType::I32 => {
                let group = ckpt.quantization().map_or(32, |q| q.group_size);
                if let Some(bits) = ckpt.quantization().and_then(|q| q.num_bits) {
                    if bits != 4 {
                        return Err(bad(
                            ckpt,
                            &packed,
                            format!("{bits}-bit packing is not supported (4-bit is)"),
                        ));
                    }
                }
                ckpt.expect(&packed, &[out_dim, in_dim.div_ceil(8)], &[])?;
                ckpt.expect(&scale_name, &[out_dim, in_dim.div_ceil(group)], &[DType::BF16])?;
                let words = ckpt
                    .read_bytes(&packed)?
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                WeightData::Int4 {
                    packed: words,
                    scales: u16s(&ckpt.read_bytes(&scale_name)?),
                    group,
                }
            }
            DType::U8 => {
                let group = strata_kernels::mxfp4::GROUP;
                ckpt.expect(&packed, &[out_dim, in_dim.div_ceil(2)], &[])?;
                ckpt.expect(&scale_name, &[out_dim, in_dim.div_ceil(group)], &[DType::U8])?;
                WeightData::Mxfp4 {
                    packed: ckpt.read_bytes(&packed)?,
                    scales: ckpt.read_bytes(&scale_name)?,
                }
            }
            other => {
                return Err(bad(
                    ckpt,
                    &packed,
                    format!("dtype {other} is not a supported packing"),
                ))
            }
        }
    } else {
        return Err(FormatError::MissingTensor {
            dir: ckpt.dir().to_path_buf(),
            tensor: weight,
        }
        .into());
    };
    data.check_shape(out_dim, in_dim)
        .map_err(|e| bad(ckpt, base, e))?;
    Ok(Linear::new(out_dim, in_dim, data))
}

/// A one-dimensional f32 parameter (norm weights, biases).
pub fn load_vector(ckpt: &Checkpoint, name: &str, len: usize) -> Result<Vec<f32>> {
    Ok(ckpt.read_f32(name, &[len])?)
}
