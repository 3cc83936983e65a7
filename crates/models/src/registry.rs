//! Architecture registry: one row per family, keyed by the HF `model_type` and `architectures`.
//! Adding an architecture = one family file + one row here.

use strata_formats::{Checkpoint, JsonConfig};
use strata_kernels::Linear;

use crate::spine::Loading;
use crate::weights::{load_linear, load_vector};
use crate::{ExpertLayout, Model, ModelError, Result};

/// Lists a config's tensors without reading any weights.
pub type InventoryFn = fn(&JsonConfig) -> Result<Vec<TensorDesc>>;

pub struct Family {
    pub name: &'static str,
    pub model_types: &'static [&'static str],
    pub architectures: &'static [&'static str],
    /// Where the routed experts are, from config alone.
    pub expert_layout: fn(&JsonConfig) -> Result<ExpertLayout>,
    /// Sizes and decoding-state bytes, from config alone.
    pub summary: fn(&JsonConfig) -> Result<ConfigSummary>,
    /// Every tensor a checkpoint of this config holds, from config alone (`strata inspect
    /// --config-only`), where the family can say.
    pub inventory: Option<InventoryFn>,
    pub load: fn(&JsonConfig, &Checkpoint, &Loading) -> Result<Box<dyn Model>>,
}

pub static FAMILIES: &[Family] = &[
    Family {
        name: "deepseek_v3",
        model_types: &["deepseek_v3", "kimi_k2"],
        architectures: &["DeepseekV3ForCausalLM"],
        expert_layout: crate::deepseek_v3::expert_layout,
        summary: crate::deepseek_v3::summary,
        inventory: None,
        load: crate::deepseek_v3::load,
    },
    Family {
        name: "qwen3_moe",
        model_types: &["qwen3_moe", "qwen2_moe"],
        architectures: &["Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"],
        expert_layout: crate::qwen3_moe::expert_layout,
        summary: crate::qwen3_moe::summary,
        inventory: None,
        load: crate::qwen3_moe::load,
    },
    Family {
        name: "mixtral",
        model_types: &["mixtral"],
        architectures: &["MixtralForCausalLM"],
        expert_layout: crate::mixtral::expert_layout,
        summary: crate::mixtral::summary,
        inventory: None,
        load: crate::mixtral::load,
    },
    Family {
        name: "kimi_linear",
        model_types: &["kimi_linear"],
        architectures: &["KimiLinearForCausalLM"],
        expert_layout: crate::kimi_linear::expert_layout,
        summary: crate::kimi_linear::summary,
        inventory: Some(crate::kimi_linear::inventory),
        load: crate::kimi_linear::load,
    },
    Family {
        name: "kimi_k3",
        model_types: &["kimi_k3"],
        architectures: &["KimiK3ForConditionalGeneration"],
        expert_layout: crate::kimi_k3::expert_layout,
        summary: crate::kimi_k3::summary,
        inventory: Some(crate::kimi_k3::inventory),
        load: crate::kimi_k3::load,
    },
    Family {
        name: "dense",
        model_types: &["llama", "mistral", "qwen2", "qwen3"],
        architectures: &[
            "LlamaForCausalLM",
            "MistralForCausalLM",
            "Qwen2ForCausalLM",
            "Qwen3ForCausalLM",
        ],
        expert_layout: crate::dense::expert_layout,
        summary: crate::dense::summary,
        inventory: None,
        load: crate::dense::load,
    },
];

/// What a config alone says about a model (the language model's part).
#[derive(Clone, Debug)]
pub struct ConfigSummary {
    pub n_layers: usize,
    pub vocab_size: usize,
    pub hidden_dim: usize,
    pub max_positions: usize,
    /// Decoding state one position of one sequence adds (KV cache rows).
    pub state_bytes_per_token: usize,
    /// Decoding state one sequence holds whatever its length (recurrent layers).
    pub state_bytes_per_sequence: usize,
}

/// One tensor a checkpoint holds (name, shape, storage dtype).
#[derive(Clone, Debug)]
pub struct TensorDesc {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: strata_formats::DType,
}

pub fn family_for(cfg: &JsonConfig) -> Result<&'static Family> {
    let model_type = cfg.opt_str("model_type")?;
    let arch = cfg.architecture();
    let by_type = model_type.and_then(|t| FAMILIES.iter().find(|f| f.model_types.contains(&t)));
    let by_arch = arch.and_then(|a| FAMILIES.iter().find(|f| f.architectures.contains(&a)));
    by_type
        .or(by_arch)
        .ok_or_else(|| ModelError::UnknownArchitecture {
            path: cfg.path.display().to_string(),
            arch: arch.map(str::to_string),
            model_type: model_type.map(str::to_string),
            supported: FAMILIES
                .iter()
                .flat_map(|f| f.model_types.iter().copied())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

pub fn load_model(cfg: &JsonConfig, ckpt: &Checkpoint, loading: &Loading) -> Result<Box<dyn Model>> {
    let family = family_for(cfg)?;
    (family.load)(cfg, ckpt, loading)
}

/// Tensor names shared by every Llama-style checkpoint.
pub(crate) mod names {
    pub const EMBED: &str = "model.embed_tokens";
    pub const LM_HEAD: &str = "lm_head";
    pub const NORM: &str = "model.norm.weight";
    pub fn layer(l: usize) -> String {
        format!("model.layers.{l}")
    }
}

/// Embedding, final norm and LM head (tied to the embedding when the config says so).
pub(crate) fn load_ends(
    cfg: &JsonConfig,
    ckpt: &Checkpoint,
    vocab: usize,
    hidden: usize,
) -> Result<(Linear, Vec<f32>, Linear)> {
    let embed = load_linear(ckpt, names::EMBED, vocab, hidden)?;
    let norm = load_vector(ckpt, names::NORM, hidden)?;
    let tied = cfg.opt_bool("tie_word_embeddings")?.unwrap_or(false);
    let lm_head = if tied && !ckpt.contains(&format!("{}.weight", names::LM_HEAD)) {
        embed.clone()
    } else {
        load_linear(ckpt, names::LM_HEAD, vocab, hidden)?
    };
    Ok((embed, norm, lm_head))
}

/// The summary of a model whose every layer keeps GQA keys and values (f32) per position.
pub(crate) fn gqa_summary(
    (n_layers, vocab_size, hidden_dim, max_positions): (usize, usize, usize, usize),
    n_kv_heads: usize,
    head_dim: usize,
) -> ConfigSummary {
    ConfigSummary {
        n_layers,
        vocab_size,
        hidden_dim,
        max_positions,
        state_bytes_per_token: n_layers * 2 * n_kv_heads * head_dim * 4,
        state_bytes_per_sequence: 0,
    }
}

pub(crate) fn bad_config(cfg: &JsonConfig, reason: impl Into<String>) -> ModelError {
    ModelError::BadConfig {
        path: cfg.path.display().to_string(),
        reason: reason.into(),
    }
}

/// GQA head counts and routing sizes that the shared attention and MoE code rely on.
pub(crate) fn check_gqa(
    cfg: &JsonConfig,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    top_k: usize,
    n_experts: usize,
) -> Result<()> {
    if n_heads == 0 || n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return Err(bad_config(
            cfg,
            format!("num_attention_heads {n_heads} must be a multiple of num_key_value_heads {n_kv_heads}"),
        ));
    }
    if top_k > n_experts || !head_dim.is_multiple_of(2) {
        return Err(bad_config(
            cfg,
            format!(
                "num_experts_per_tok {top_k} exceeds the {n_experts} experts, or head_dim {head_dim} is odd"
            ),
        ));
    }
    Ok(())
}
