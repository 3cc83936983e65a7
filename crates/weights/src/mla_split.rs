//! DeepSeek's `kv_b_proj` as newer GGUF conversions store it: split per head into `k_b` (the key
//! part, transposed: `[heads, kv_lora, nope]`) and `v_b` (`[heads, v, kv_lora]`). The attention
//! reads one `kv_b` (`[heads * (nope + v), kv_lora]`, each head's key rows then its value rows),
//! so the two are put back together, element for element, in their stored 16- or 32-bit format
//! (Q8_0 and the other GGUF block types, whose blocks run along the other axis, as their f32
//! values).

use strata_formats::gguf::GgmlType;
use strata_formats::{Checkpoint, DType, FormatError};
use strata_kernels::ggml::BlockType;
use strata_kernels::{Linear, WeightData};

use crate::linear::bad;
use crate::load_linear;

type Result<T, E = FormatError> = std::result::Result<T, E>;

/// `{attn}.kv_b_proj`, or rebuilt from `{attn}.k_b_proj` and `{attn}.v_b_proj` when only those
/// are there.
pub fn load_kv_b(
    ckpt: &Checkpoint,
    attn: &str,
    heads: usize,
    nope: usize,
    v: usize,
    kv_lora: usize,
) -> Result<Linear> {
    let (k_name, v_name) = (
        format!("{attn}.k_b_proj.weight"),
        format!("{attn}.v_b_proj.weight"),
    );
    let whole = format!("{attn}.kv_b_proj");
    if ckpt.contains(&format!("{whole}.weight")) || !ckpt.contains(&k_name) {
        return load_linear(ckpt, &whole, heads * (nope + v), kv_lora);
    }
    let mut dtypes = vec![DType::F32, DType::BF16, DType::F16, DType::Q8_0];
    dtypes.extend(GgmlType::KERNEL_BLOCKS.map(DType::Ggml));
    let dtype = ckpt.expect(&k_name, &[heads, kv_lora, nope], &dtypes)?.info.dtype;
    let v_entry = ckpt.expect(&v_name, &[heads, v, kv_lora], &[dtype]);
    v_entry.map_err(|e| FormatError::BadTensor {
        path: ckpt.dir().to_path_buf(),
        tensor: v_name.clone(),
        reason: format!("must be {dtype} [{heads}, {v}, {kv_lora}] beside `{k_name}`: {e}"),
    })?;
    let (mut k_b, mut v_b) = (ckpt.read_bytes(&k_name)?, ckpt.read_bytes(&v_name)?);
    let dtype = if dtype.block() > 1 {
        // Blocks run along k_b's rows, not kv_b's: decoded to f32 (exactly its values).
        k_b = blocks_to_f32_bytes(ckpt, &k_name, dtype, &k_b, nope)?;
        v_b = blocks_to_f32_bytes(ckpt, &v_name, dtype, &v_b, kv_lora)?;
        DType::F32
    } else {
        dtype
    };
    let kv_b = interleave(&k_b, &v_b, dtype.size(), heads, nope, v, kv_lora);
    let u16s = |b: &[u8]| {
        b.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect::<Vec<_>>()
    };
    let data = match dtype {
        DType::F32 => WeightData::F32(
            kv_b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect::<Vec<_>>()
                .into(),
        ),
        DType::BF16 => WeightData::Bf16(u16s(&kv_b).into()),
        _ => WeightData::F16(u16s(&kv_b).into()),
    };
    Ok(Linear::new(heads * (nope + v), kv_lora, data))
}

/// Rows of `n` weights of a block type (Q8_0 or another GGUF one) as little-endian f32 bytes.
fn blocks_to_f32_bytes(
    ckpt: &Checkpoint,
    name: &str,
    dtype: DType,
    blocks: &[u8],
    n: usize,
) -> Result<Vec<u8>> {
    let data = match dtype {
        DType::Q8_0 => WeightData::Q8_0 {
            blocks: blocks.to_vec().into(),
        },
        DType::Ggml(t) => match BlockType::from_ggml_id(t.0) {
            Some(ty) => WeightData::Ggml {
                ty,
                blocks: blocks.to_vec().into(),
            },
            None => return Err(bad(ckpt, name, format!("weight type {t} has no kernel"))),
        },
        _ => unreachable!("only block types are decoded"),
    };
    let rows = blocks.len() / dtype.size() * dtype.block() / n.max(1);
    data.check_shape(rows, n).map_err(|e| bad(ckpt, name, e))?;
    let mut row = vec![0f32; n];
    let mut out = Vec::with_capacity(rows * n * 4);
    for r in 0..rows {
        data.decode_row(n, r, &mut row);
        out.extend(row.iter().flat_map(|w| w.to_le_bytes()));
    }
    Ok(out)
}

/// Each head's rows: the key part (k_b's columns as rows), then v_b's rows; `es` bytes each.
fn interleave(
    k_b: &[u8],
    v_b: &[u8],
    es: usize,
    heads: usize,
    nope: usize,
    v: usize,
    kv_lora: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(heads * (nope + v) * kv_lora * es);
    for h in 0..heads {
        let k = &k_b[h * kv_lora * nope * es..(h + 1) * kv_lora * nope * es];
        for i in 0..nope {
            for j in 0..kv_lora {
                out.extend_from_slice(&k[(j * nope + i) * es..(j * nope + i + 1) * es]);
            }
        }
        out.extend_from_slice(&v_b[h * v * kv_lora * es..(h + 1) * v * kv_lora * es]);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn split_heads_interleave_back_into_kv_b() {
        let (heads, nope, v, kv_lora) = (2, 3, 2, 4);
        // kv_b[h][r][c] = 100 h + 10 r + c, one byte each.
        let kv_b: Vec<u8> = (0..heads)
            .flat_map(|h| {
                (0..nope + v).flat_map(move |r| (0..kv_lora).map(move |c| (100 * h + 10 * r + c) as u8))
            })
            .collect();
        let k_b: Vec<u8> = (0..heads)
            .flat_map(|h| {
                (0..kv_lora).flat_map(move |c| (0..nope).map(move |r| (100 * h + 10 * r + c) as u8))
            })
            .collect();
        let v_b: Vec<u8> = (0..heads)
            .flat_map(|h| {
                (nope..nope + v).flat_map(move |r| (0..kv_lora).map(move |c| (100 * h + 10 * r + c) as u8))
            })
            .collect();
        assert_eq!(super::interleave(&k_b, &v_b, 1, heads, nope, v, kv_lora), kv_b);
    }
}
