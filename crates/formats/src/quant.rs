//! `quantization_config` of config.json: what the checkpoint's quantized tensors mean. The tensors
//! themselves say which layers are quantized (a layer in an `ignore` list simply has a plain
//! `.weight`); this config supplies what the tensors cannot: FP8 block sizes and INT4 group sizes.

use crate::{JsonConfig, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct QuantizationConfig {
    /// `fp8`, `compressed-tensors`, ...
    pub method: String,
    /// FP8 `weight_block_size` (rows, cols); DeepSeek's default is 128 x 128.
    pub fp8_block: (usize, usize),
    /// compressed-tensors `format` (`pack-quantized`, `mxfp4-pack-quantized`, ...).
    pub format: Option<String>,
    /// compressed-tensors weight group size (inputs per scale).
    pub group_size: usize,
    pub num_bits: Option<usize>,
    pub ignore: Vec<String>,
}

impl QuantizationConfig {
    /// Reads `quantization_config`; `None` when the checkpoint is not quantized.
    pub fn from_config(cfg: &JsonConfig) -> Result<Option<QuantizationConfig>> {
        let Some(q) = cfg.opt_object("quantization_config")? else {
            return Ok(None);
        };
        let method = q.opt_str("quant_method")?.unwrap_or("unknown").to_string();
        let fp8_block = match q.opt_usize_list("weight_block_size")? {
            Some(b) if b.len() == 2 && b[0] > 0 && b[1] > 0 => (b[0], b[1]),
            Some(b) => {
                return Err(crate::FormatError::BadKey {
                    path: q.path.clone(),
                    key: "weight_block_size".into(),
                    reason: format!("expected two positive sizes, found {b:?}"),
                })
            }
            None => (128, 128),
        };
        // compressed-tensors: the first config group's `weights` describe the quantized layers.
        let weights = q
            .get("config_groups")
            .and_then(|g| g.as_object())
            .and_then(|g| g.values().next())
            .and_then(|g| g.get("weights"))
            .cloned();
        let group_size = weights
            .as_ref()
            .and_then(|w| w.get("group_size"))
            .and_then(|v| v.as_u64())
            .map_or(32, |v| v as usize);
        let num_bits = weights
            .as_ref()
            .and_then(|w| w.get("num_bits"))
            .and_then(|v| v.as_u64())
            .map(|v| v as usize);
        let group_format = q
            .get("config_groups")
            .and_then(|g| g.as_object())
            .and_then(|g| g.values().next())
            .and_then(|g| g.get("format"))
            .and_then(|f| f.as_str())
            .map(str::to_string);
        let format = q.opt_str("format")?.map(str::to_string).or(group_format);
        let ignore = q
            .get("ignore")
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        Ok(Some(QuantizationConfig {
            method,
            fp8_block,
            format,
            group_size: group_size.max(1),
            num_bits,
            ignore,
        }))
    }
}
