//! What a model folder holds and what running it costs, from headers and config alone (no
//! weights read): parameters and bytes, experts and the rest, each decoder layer's non-expert
//! bytes in the stored format and as the INT8 spine would hold them, the decoding state.

use std::collections::HashSet;
use std::path::Path;

use strata_formats::{DType, JsonConfig};
use strata_models::{family_for, layer_of, ExpertLayout};

use crate::EngineError;

/// One tensor as the plan sees it.
pub(crate) struct TensorSize {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Bytes stored.
    pub bytes: u64,
}

/// What a model folder holds and what running it costs, from headers and config alone.
#[derive(Clone, Debug)]
pub struct ModelPlan {
    pub architecture: String,
    pub model_type: String,
    pub family: &'static str,
    pub n_layers: usize,
    pub vocab_size: usize,
    pub hidden_dim: usize,
    pub layout: ExpertLayout,
    pub max_positions: usize,
    /// Decoding state (KV cache) of one position of one sequence.
    pub state_bytes_per_token: usize,
    /// Decoding state of one sequence whatever its length (recurrent layers).
    pub state_bytes_per_sequence: usize,
    pub total_params: u64,
    pub expert_params: u64,
    pub expert_bytes: u64,
    pub non_expert_params: u64,
    pub non_expert_bytes: u64,
    /// Non-expert bytes as the INT8 spine holds them (`--spine-format int8`).
    pub non_expert_bytes_int8: u64,
    /// Non-expert bytes of each decoder layer (the part that can stream).
    pub layer_bytes: Vec<u64>,
    /// The same, as the INT8 spine holds them.
    pub layer_bytes_int8: Vec<u64>,
    /// Parameters of the input embedding when the head is a separate tensor (a row lookup per
    /// token, not counted as active).
    pub embedding_params: u64,
    /// (dtype, tensors, bytes)
    pub formats: Vec<(String, usize, u64)>,
}

impl ModelPlan {
    pub fn from_dir(dir: &Path) -> Result<ModelPlan, EngineError> {
        let (cfg, ckpt) = strata_formats::open_model(dir)?;
        let entries = ckpt.entries().map(|e| TensorSize {
            name: e.info.name.clone(),
            dtype: e.info.dtype,
            shape: e.info.shape.clone(),
            bytes: e.info.len,
        });
        Self::from_tensors(&cfg, entries)
    }

    /// The plan of a config alone (no weights): the family lists the tensors a checkpoint of
    /// this config holds, in the real checkpoints' storage formats.
    pub fn from_config(config: &Path) -> Result<ModelPlan, EngineError> {
        let cfg = JsonConfig::read(config)?;
        let family = family_for(&cfg)?;
        let inventory = family.inventory.ok_or_else(|| EngineError::NoInventory {
            path: config.to_path_buf(),
            family: family.name,
        })?;
        let entries = inventory(&cfg)?.into_iter().map(|t| {
            let numel: u64 = t.shape.iter().map(|&n| n as u64).product();
            TensorSize {
                bytes: numel * t.dtype.size() as u64,
                name: t.name,
                dtype: t.dtype,
                shape: t.shape,
            }
        });
        Self::from_tensors(&cfg, entries)
    }

    fn from_tensors(
        cfg: &JsonConfig,
        tensors: impl Iterator<Item = TensorSize>,
    ) -> Result<ModelPlan, EngineError> {
        let family = family_for(cfg)?;
        let layout = (family.expert_layout)(cfg)?;
        let summary = (family.summary)(cfg)?;
        let mut prefixes = HashSet::new();
        for &l in &layout.moe_layers {
            for e in 0..layout.n_experts {
                for p in 0..3 {
                    prefixes.insert(layout.tensor_base(l, e, p));
                }
            }
        }
        let mut plan = ModelPlan {
            architecture: cfg.architecture().unwrap_or("?").to_string(),
            model_type: cfg.opt_str("model_type")?.unwrap_or("?").to_string(),
            family: family.name,
            n_layers: summary.n_layers,
            vocab_size: summary.vocab_size,
            hidden_dim: summary.hidden_dim,
            layout,
            max_positions: summary.max_positions,
            state_bytes_per_token: summary.state_bytes_per_token,
            state_bytes_per_sequence: summary.state_bytes_per_sequence,
            total_params: 0,
            expert_params: 0,
            expert_bytes: 0,
            non_expert_params: 0,
            non_expert_bytes: 0,
            non_expert_bytes_int8: 0,
            layer_bytes: vec![0; summary.n_layers],
            layer_bytes_int8: vec![0; summary.n_layers],
            embedding_params: 0,
            formats: Vec::new(),
        };
        let mut formats: std::collections::BTreeMap<String, (usize, u64)> = Default::default();
        let (mut embedding, mut separate_head) = (0, false);
        for t in tensors {
            let (name, dtype, len) = (t.name.as_str(), t.dtype, t.bytes);
            let numel: u64 = t.shape.iter().map(|&n| n as u64).product();
            let params = logical_params(name, dtype, numel);
            if name.ends_with("embed_tokens.weight") {
                embedding = params;
            }
            separate_head |= name.ends_with("lm_head.weight");
            let is_expert = name
                .rsplit_once('.')
                .is_some_and(|(base, _)| prefixes.contains(base));
            if is_expert {
                plan.expert_params += params;
                plan.expert_bytes += len;
            } else {
                let int8 = int8_bytes(&t);
                plan.non_expert_params += params;
                plan.non_expert_bytes += len;
                plan.non_expert_bytes_int8 += int8;
                if let Some(l) = layer_of(name).filter(|&l| l < summary.n_layers) {
                    plan.layer_bytes[l] += len;
                    plan.layer_bytes_int8[l] += int8;
                }
            }
            let f = formats.entry(dtype.name().to_string()).or_default();
            f.0 += 1;
            f.1 += len;
        }
        plan.total_params = plan.expert_params + plan.non_expert_params;
        plan.embedding_params = if separate_head { embedding } else { 0 };
        plan.formats = formats.into_iter().map(|(k, (n, b))| (k, n, b)).collect();
        Ok(plan)
    }

    pub fn n_expert_slots(&self) -> u64 {
        (self.layout.moe_layers.len() * self.layout.n_experts) as u64
    }

    pub fn bytes_per_expert(&self) -> u64 {
        self.expert_bytes / self.n_expert_slots().max(1)
    }

    /// Parameters one token computes with: the non-expert weights (less the input embedding,
    /// a lookup) and `top_k` routed experts per MoE layer.
    pub fn active_params(&self) -> u64 {
        let per_expert = self.expert_params / self.n_expert_slots().max(1);
        self.non_expert_params - self.embedding_params
            + per_expert * (self.layout.top_k * self.layout.moe_layers.len()) as u64
    }

    /// Expert bytes one token reads when no expert is cached.
    pub fn uncached_token_bytes(&self) -> u64 {
        self.bytes_per_expert() * (self.layout.top_k * self.layout.moe_layers.len()) as u64
    }
}

/// Bytes a non-expert tensor takes in the INT8 spine: the weight of a linear layer stored
/// dense or as FP8 becomes one byte per weight and an f32 scale per row (its FP8 block scales
/// go); routers (`*.gate`) and everything else keep their stored size. The weight loader
/// converts exactly these (`strata_models::load_linear`).
fn int8_bytes(t: &TensorSize) -> u64 {
    let linear = matches!(t.dtype, DType::BF16 | DType::F16 | DType::F32 | DType::F8E4M3)
        && t.shape.len() == 2
        && t.shape.iter().all(|&d| d > 1);
    let router = t.name.trim_end_matches(".weight").ends_with(".gate");
    if t.name.ends_with(".weight") && linear && !router {
        return (t.shape[0] * t.shape[1] + 4 * t.shape[0]) as u64;
    }
    if t.name.ends_with(".weight_scale_inv")
        && !t.name.trim_end_matches(".weight_scale_inv").ends_with(".gate")
    {
        return 0;
    }
    t.bytes
}

/// Elements of the unquantized matrix a tensor stands for (scales and shape tensors count 0).
fn logical_params(name: &str, dtype: DType, numel: u64) -> u64 {
    if name.ends_with("weight_scale") || name.ends_with("weight_scale_inv") || name.ends_with("weight_shape")
    {
        0
    } else if name.ends_with("weight_packed") && dtype == DType::I32 {
        numel * 8 // INT4: eight per 32-bit word
    } else if name.ends_with("weight_packed") && dtype == DType::U8 {
        numel * 2 // MXFP4: two per byte
    } else {
        numel
    }
}
