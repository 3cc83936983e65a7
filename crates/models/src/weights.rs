//! Reading weights out of a checkpoint by tensor name. The stored format of a linear layer is
//! decided here, from the tensors the checkpoint actually has, so model code never branches on it.

use strata_formats::{Checkpoint, DType, FormatError};
use strata_kernels::{Linear, WeightData};

use crate::Result;

/// Loads the linear layer whose tensors start with `base` (e.g. `model.layers.0.self_attn.q_proj`)
/// as a (out, in) weight in its stored format.
pub fn load_linear(ckpt: &Checkpoint, base: &str, out_dim: usize, in_dim: usize) -> Result<Linear> {
    let name = format!("{base}.weight");
    let entry = ckpt.expect(
        &name,
        &[out_dim, in_dim],
        &[DType::BF16, DType::F16, DType::F32],
    )?;
    let dtype = entry.info.dtype;
    let bytes = ckpt.read_bytes(&name)?;
    let data = match dtype {
        DType::BF16 => WeightData::bf16_from_le_bytes(&bytes),
        DType::F16 => WeightData::f16_from_le_bytes(&bytes),
        DType::F32 => WeightData::f32_from_le_bytes(&bytes),
        other => {
            return Err(FormatError::BadTensor {
                path: ckpt.shard_path(entry.shard).to_path_buf(),
                tensor: name,
                reason: format!("dtype {other} is not supported for linear weights"),
            }
            .into())
        }
    };
    Ok(Linear::new(out_dim, in_dim, data))
}

/// A one-dimensional f32 parameter (norm weights, biases).
pub fn load_vector(ckpt: &Checkpoint, name: &str, len: usize) -> Result<Vec<f32>> {
    Ok(ckpt.read_f32(name, &[len])?)
}

/// Short description of the format of a linear layer's tensors, for `inspect`.
pub fn linear_summary(ckpt: &Checkpoint, base: &str) -> Option<String> {
    ckpt.entry(&format!("{base}.weight"))
        .ok()
        .map(|e| e.info.dtype.name().to_string())
}
