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
//! | `weight` Q8_0 (GGUF) | Q8_0 |
//! | `weight` Q4_0 ... Q6_K, IQ4_NL, IQ4_XS, MXFP4 (GGUF) | that block type |
//!
//! Resolving (names, shapes, dtypes: all checks) is apart from building (bytes -> [`Linear`]), so
//! the expert store can resolve every expert at load time and read its bytes later, its own way.

use strata_formats::{bytes_to_f32, Checkpoint, DType, FormatError};
use strata_kernels::ggml::BlockType;
use strata_kernels::{u16_vec_from_bytes, Linear, Owner, Pod, Storage, WeightData};

type Result<T, E = FormatError> = std::result::Result<T, E>;

#[derive(Clone, Debug, PartialEq)]
pub enum LinearFormat {
    /// BF16, F16 or F32 `weight`.
    Dense(DType),
    /// `weight` F8_E4M3 + `weight_scale_inv` (any float dtype).
    Fp8 {
        block: (usize, usize),
        scale_dtype: DType,
    },
    /// `weight` I8 + `weight_scale` (any float dtype, one per row).
    Int8 { scale_dtype: DType },
    /// `weight_packed` I32 + `weight_scale` BF16.
    Int4 { group: usize },
    /// `weight_packed` U8 + `weight_scale` U8.
    Mxfp4,
    /// `weight` Q8_0 (a GGUF file's blocks).
    Q8_0,
    /// `weight` of another GGUF block type.
    Ggml(BlockType),
}

/// A linear layer resolved against the checkpoint: its format and the tensors that hold it, in
/// the order [`LinearSpec::build`] takes their bytes.
#[derive(Clone, Debug)]
pub struct LinearSpec {
    pub base: String,
    pub out_dim: usize,
    pub in_dim: usize,
    pub format: LinearFormat,
    pub tensors: Vec<String>,
}

pub(crate) fn bad(ckpt: &Checkpoint, name: &str, reason: String) -> FormatError {
    let path = ckpt
        .entry(name)
        .map(|e| ckpt.shard_path(e.shard).to_path_buf())
        .unwrap_or_else(|_| ckpt.dir().to_path_buf());
    FormatError::BadTensor {
        path,
        tensor: name.to_string(),
        reason,
    }
}

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn float_dtype(ckpt: &Checkpoint, name: &str, shape: &[usize]) -> Result<DType> {
    Ok(ckpt
        .expect(name, shape, &[DType::F32, DType::BF16, DType::F16])?
        .info
        .dtype)
}

/// Finds the tensors of the linear layer `base` (e.g. `model.layers.0.self_attn.q_proj`) and
/// checks their shapes and dtypes against (out, in), without reading weight bytes.
pub fn resolve_linear(ckpt: &Checkpoint, base: &str, out_dim: usize, in_dim: usize) -> Result<LinearSpec> {
    let weight = format!("{base}.weight");
    let packed = format!("{base}.weight_packed");
    let spec = |format, tensors: Vec<String>| LinearSpec {
        base: base.to_string(),
        out_dim,
        in_dim,
        format,
        tensors,
    };
    if ckpt.contains(&weight) {
        let dtype = ckpt.entry(&weight)?.info.dtype;
        ckpt.expect(&weight, &[out_dim, in_dim], &[])?;
        return match dtype {
            DType::BF16 | DType::F16 | DType::F32 => Ok(spec(LinearFormat::Dense(dtype), vec![weight])),
            DType::Q8_0 => Ok(spec(LinearFormat::Q8_0, vec![weight])),
            DType::Ggml(t) => {
                let ty = BlockType::from_ggml_id(t.0)
                    .ok_or_else(|| bad(ckpt, &weight, format!("weight type {t} has no kernel")))?;
                if !in_dim.is_multiple_of(ty.block()) {
                    let k = ty.block();
                    return Err(bad(
                        ckpt,
                        &weight,
                        format!("{t} rows hold blocks of {k}; in = {in_dim}"),
                    ));
                }
                Ok(spec(LinearFormat::Ggml(ty), vec![weight]))
            }
            DType::F8E4M3 => {
                let block = ckpt.quantization().map_or((128, 128), |q| q.fp8_block);
                let scale = format!("{base}.weight_scale_inv");
                if !ckpt.contains(&scale) {
                    return Err(bad(ckpt, &weight, format!("FP8 weight without its `{scale}`")));
                }
                let grid = [out_dim.div_ceil(block.0), in_dim.div_ceil(block.1)];
                let scale_dtype = float_dtype(ckpt, &scale, &grid)?;
                Ok(spec(
                    LinearFormat::Fp8 { block, scale_dtype },
                    vec![weight, scale],
                ))
            }
            DType::I8 => {
                let scale = format!("{base}.weight_scale");
                if !ckpt.contains(&scale) {
                    return Err(bad(ckpt, &weight, format!("INT8 weight without its `{scale}`")));
                }
                let shape = ckpt.entry(&scale)?.info.shape.clone();
                if shape.iter().product::<usize>() != out_dim {
                    return Err(bad(
                        ckpt,
                        &scale,
                        format!("shape {shape:?}: expected one scale per output row ({out_dim})"),
                    ));
                }
                let scale_dtype = float_dtype(ckpt, &scale, &shape)?;
                Ok(spec(LinearFormat::Int8 { scale_dtype }, vec![weight, scale]))
            }
            other => Err(bad(
                ckpt,
                &weight,
                format!("dtype {other} is not a supported weight format"),
            )),
        };
    }
    if !ckpt.contains(&packed) {
        return Err(ckpt.missing(&weight));
    }
    let scale = format!("{base}.weight_scale");
    if !ckpt.contains(&scale) {
        return Err(bad(ckpt, &packed, format!("packed weight without its `{scale}`")));
    }
    check_weight_shape(ckpt, &format!("{base}.weight_shape"), out_dim, in_dim)?;
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
            ckpt.expect(&scale, &[out_dim, in_dim.div_ceil(group)], &[DType::BF16])?;
            Ok(spec(LinearFormat::Int4 { group }, vec![packed, scale]))
        }
        DType::U8 => {
            ckpt.expect(&packed, &[out_dim, in_dim.div_ceil(2)], &[])?;
            ckpt.expect(
                &scale,
                &[out_dim, in_dim.div_ceil(strata_kernels::mxfp4::GROUP)],
                &[DType::U8],
            )?;
            Ok(spec(LinearFormat::Mxfp4, vec![packed, scale]))
        }
        other => Err(bad(
            ckpt,
            &packed,
            format!("dtype {other} is not a supported packing"),
        )),
    }
}

/// compressed-tensors' `weight_shape` (I64 [2]), when present, must be the shape config.json implies.
fn check_weight_shape(ckpt: &Checkpoint, name: &str, out_dim: usize, in_dim: usize) -> Result<()> {
    if !ckpt.contains(name) {
        return Ok(());
    }
    let bytes = ckpt.read_bytes(name)?;
    let dims: Vec<i64> = match ckpt.entry(name)?.info.dtype {
        DType::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        DType::I32 => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        other => return Err(bad(ckpt, name, format!("dtype {other}: expected I64"))),
    };
    if dims != [out_dim as i64, in_dim as i64] {
        return Err(bad(
            ckpt,
            name,
            format!("says {dims:?} but config.json implies [{out_dim}, {in_dim}]"),
        ));
    }
    Ok(())
}

impl LinearSpec {
    /// Builds the weight from the bytes of `self.tensors`, in order (as read from disk).
    pub fn build(&self, bytes: &[&[u8]]) -> std::result::Result<Linear, String> {
        // SAFETY: no owner: every element is copied.
        unsafe { self.build_in(bytes, None) }
    }

    /// Like [`LinearSpec::build`], but where the bytes can serve as the weight as they are
    /// (aligned, little-endian, already the stored element type) the weight is a view into them
    /// kept alive by `owner` instead of a copy; the rest (e.g. BF16 scales widened to f32) is
    /// copied.
    ///
    /// # Safety
    /// With an owner, every slice of `bytes` must lie in memory that `owner` keeps valid and
    /// unchanged for as long as it lives.
    pub unsafe fn build_in(
        &self,
        bytes: &[&[u8]],
        owner: Option<&Owner>,
    ) -> std::result::Result<Linear, String> {
        if bytes.len() != self.tensors.len() {
            return Err(format!(
                "{}: expected {} tensors, got {}",
                self.base,
                self.tensors.len(),
                bytes.len()
            ));
        }
        /// # Safety
        /// As `build_in`.
        unsafe fn borrowed<T: Pod>(owner: Option<&Owner>, b: &[u8]) -> Option<Storage<T>> {
            // SAFETY: the caller's contract on `owner` and `b`.
            owner.and_then(|o| unsafe { Storage::borrow(o, b) })
        }
        // SAFETY (all uses below): `bytes` are the caller's, under its contract.
        macro_rules! view {
            ($b:expr) => {
                unsafe { borrowed(owner, $b) }
            };
        }
        let f32s = |b: &[u8], dtype: DType| -> Storage<f32> {
            match dtype {
                DType::F32 => view!(b).unwrap_or_else(|| bytes_to_f32(b, dtype).into()),
                _ => bytes_to_f32(b, dtype).into(),
            }
        };
        let data = match &self.format {
            LinearFormat::Dense(DType::BF16) => {
                WeightData::Bf16(view!(bytes[0]).unwrap_or_else(|| u16s(bytes[0]).into()))
            }
            LinearFormat::Dense(DType::F16) => {
                WeightData::F16(view!(bytes[0]).unwrap_or_else(|| u16s(bytes[0]).into()))
            }
            LinearFormat::Dense(dtype) => WeightData::F32(f32s(bytes[0], *dtype)),
            LinearFormat::Fp8 { block, scale_dtype } => WeightData::Fp8 {
                w: view!(bytes[0]).unwrap_or_else(|| bytes[0].to_vec().into()),
                scales: f32s(bytes[1], *scale_dtype),
                block: *block,
            },
            LinearFormat::Int8 { scale_dtype } => WeightData::Int8 {
                w: view!(bytes[0]).unwrap_or_else(|| bytes[0].iter().map(|&b| b as i8).collect()),
                scales: f32s(bytes[1], *scale_dtype),
            },
            LinearFormat::Int4 { group } => WeightData::Int4 {
                packed: view!(bytes[0]).unwrap_or_else(|| {
                    bytes[0]
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                        .collect()
                }),
                scales: view!(bytes[1]).unwrap_or_else(|| u16s(bytes[1]).into()),
                group: *group,
            },
            LinearFormat::Mxfp4 => WeightData::Mxfp4 {
                packed: view!(bytes[0]).unwrap_or_else(|| bytes[0].to_vec().into()),
                scales: view!(bytes[1]).unwrap_or_else(|| bytes[1].to_vec().into()),
            },
            LinearFormat::Q8_0 => WeightData::Q8_0 {
                blocks: view!(bytes[0]).unwrap_or_else(|| bytes[0].to_vec().into()),
            },
            LinearFormat::Ggml(ty) => WeightData::Ggml {
                ty: *ty,
                blocks: view!(bytes[0]).unwrap_or_else(|| bytes[0].to_vec().into()),
            },
        };
        data.check_shape(self.out_dim, self.in_dim)
            .map_err(|e| format!("{}: {e}", self.base))?;
        Ok(Linear::new(self.out_dim, self.in_dim, data))
    }
}

/// Loads the linear layer whose tensors start with `base` as a (out, in) weight in its stored
/// format, or as INT8 with one scale per row when the checkpoint converts its spine
/// ([`Checkpoint::with_int8_spine`]): from the sidecar of an earlier start, else converted now
/// (dense and FP8 weights; the 4- and 8-bit formats stay as they are).
pub fn load_linear(ckpt: &Checkpoint, base: &str, out_dim: usize, in_dim: usize) -> Result<Linear> {
    let spec = resolve_linear(ckpt, base, out_dim, in_dim)?;
    let Some(int8) = ckpt.int8_spine().filter(|s| s.converts(base)) else {
        return load_native(ckpt, &spec);
    };
    if !matches!(spec.format, LinearFormat::Dense(_) | LinearFormat::Fp8 { .. }) {
        return load_native(ckpt, &spec);
    }
    if let Some((w, scales)) = int8.get(base, out_dim, in_dim) {
        let data = WeightData::Int8 {
            w: w.into(),
            scales: scales.into(),
        };
        data.check_shape(out_dim, in_dim)
            .map_err(|e| bad(ckpt, base, e))?;
        return Ok(Linear::new(out_dim, in_dim, data));
    }
    let native = load_native(ckpt, &spec)?;
    let converted = match native.to_int8() {
        Some(c) => c.map_err(|e| bad(ckpt, base, format!("converting to INT8: {e}")))?,
        None => return Ok(native),
    };
    if let WeightData::Int8 { w, scales } = &converted.data {
        int8.put(base, w, scales);
    }
    Ok(converted)
}

/// [`load_linear`] in the stored format.
fn load_native(ckpt: &Checkpoint, spec: &LinearSpec) -> Result<Linear> {
    let (base, out_dim, in_dim) = (spec.base.as_str(), spec.out_dim, spec.in_dim);
    // Bytes a streamed layer's reads hold already: the weight views them where it can.
    let views: Option<Vec<_>> = spec.tensors.iter().map(|t| ckpt.preloaded(t)).collect();
    if let Some(views) = views {
        let owner = views[0].1.clone();
        let refs: Vec<&[u8]> = views.iter().map(|v| v.0).collect();
        // SAFETY: `Preloaded` bytes stay valid and unchanged while their owner lives (its
        // contract), and every weight viewing them holds the owner.
        return unsafe { spec.build_in(&refs, Some(&owner)) }.map_err(|e| bad(ckpt, base, e));
    }
    // 16-bit dense weights (most resident weights) go straight into their final buffer.
    if let LinearFormat::Dense(dtype @ (DType::BF16 | DType::F16)) = spec.format {
        let words = u16_vec_from_bytes(out_dim * in_dim, |bytes| ckpt.read_into(&spec.tensors[0], bytes))?;
        let data = if dtype == DType::BF16 {
            WeightData::Bf16(words.into())
        } else {
            WeightData::F16(words.into())
        };
        return Ok(Linear::new(out_dim, in_dim, data));
    }
    let bytes = spec
        .tensors
        .iter()
        .map(|t| ckpt.read_bytes(t))
        .collect::<Result<Vec<_>, _>>()?;
    let refs: Vec<&[u8]> = bytes.iter().map(|b| b.as_slice()).collect();
    spec.build(&refs).map_err(|e| bad(ckpt, base, e))
}

/// A one-dimensional f32 parameter (norm weights, biases).
pub fn load_vector(ckpt: &Checkpoint, name: &str, len: usize) -> Result<Vec<f32>> {
    ckpt.read_f32(name, &[len])
}
