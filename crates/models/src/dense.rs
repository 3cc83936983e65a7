//! Dense Llama, Mistral, Qwen2 and Qwen3: GQA with a NeoX rotation (Qwen3: per-head q/k RMSNorm
//! first; Qwen2: biases on q, k and v; Llama/Mistral/Qwen3 with `attention_bias`: on all four
//! projections), then a SwiGLU MLP in every layer. No experts: such a model is small, resident
//! or streamed layer by layer, and can later serve as a draft.

use std::sync::Arc;

use strata_formats::{Checkpoint, JsonConfig};

use crate::decoder::{Attention, Block, Decoder, Ffn};
use crate::layers::attention::{GqaAttention, GqaBiases};
use crate::layers::math::Activation;
use crate::layers::mlp::Mlp;
use crate::layers::rope::{Rope, RopeStyle};
use crate::registry::{bad_config, check_gqa, gqa_summary, load_ends, names, ConfigSummary};
use crate::spine::{build_layers, BlockBuilder, Loading};
use crate::weights::{load_linear, load_vector};
use crate::{ExpertLayout, Model, ModelInfo, Result};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Llama,
    Qwen2,
    Qwen3,
}

struct Config {
    kind: Kind,
    model_type: String,
    vocab: usize,
    hidden: usize,
    inter: usize,
    n_layers: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    eps: f32,
    max_pos: usize,
    /// Biases on q, k, v (and o).
    qkv_bias: bool,
    o_bias: bool,
    sliding_window: Option<usize>,
}

impl Config {
    fn read(cfg: &JsonConfig) -> Result<Config> {
        let model_type = cfg.opt_str("model_type")?.unwrap_or("llama").to_string();
        let kind = match model_type.as_str() {
            "qwen2" => Kind::Qwen2,
            "qwen3" => Kind::Qwen3,
            _ => Kind::Llama,
        };
        let hidden = cfg.usize("hidden_size")?;
        let n_heads = cfg.usize("num_attention_heads")?;
        let attention_bias = cfg.opt_bool("attention_bias")?.unwrap_or(false);
        let c = Config {
            kind,
            model_type,
            vocab: cfg.usize("vocab_size")?,
            hidden,
            inter: cfg.usize("intermediate_size")?,
            n_layers: cfg.usize("num_hidden_layers")?,
            n_heads,
            n_kv_heads: cfg.opt_usize("num_key_value_heads")?.unwrap_or(n_heads),
            head_dim: cfg.opt_usize("head_dim")?.unwrap_or(hidden / n_heads.max(1)),
            eps: cfg.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            max_pos: cfg.usize("max_position_embeddings")?,
            // `qkv_bias`: q, k and v alone (a GGUF file whose o has none).
            qkv_bias: kind == Kind::Qwen2 || attention_bias || cfg.opt_bool("qkv_bias")?.unwrap_or(false),
            o_bias: kind != Kind::Qwen2 && attention_bias,
            sliding_window: None,
        };
        check_gqa(cfg, c.n_heads, c.n_kv_heads, c.head_dim, 0, 0)?;
        if let Some(act) = cfg.opt_str("hidden_act")? {
            if act != "silu" {
                return Err(bad_config(
                    cfg,
                    format!("hidden_act `{act}` is not supported (supported: silu)"),
                ));
            }
        }
        if cfg.opt_bool("mlp_bias")?.unwrap_or(false) {
            return Err(bad_config(cfg, "mlp_bias = true is not supported yet"));
        }
        let windowed = match kind {
            // Qwen2/Qwen3 name a window but use it only with `use_sliding_window`.
            Kind::Qwen2 | Kind::Qwen3 => cfg.opt_bool("use_sliding_window")?.unwrap_or(false),
            Kind::Llama => true,
        };
        let sliding_window = if windowed {
            cfg.opt_usize("sliding_window")?
        } else {
            None
        };
        if sliding_window.is_some() && kind != Kind::Llama {
            return Err(bad_config(cfg, "use_sliding_window = true is not supported yet"));
        }
        Ok(Config { sliding_window, ..c })
    }
}

/// None: every layer is dense.
pub fn expert_layout(cfg: &JsonConfig) -> Result<ExpertLayout> {
    let c = Config::read(cfg)?;
    Ok(ExpertLayout {
        prefix: "model.layers.{layer}.mlp.experts.{expert}.".into(),
        projections: ["gate_proj".into(), "up_proj".into(), "down_proj".into()],
        hidden_dim: c.hidden,
        inter_dim: c.inter,
        n_experts: 0,
        moe_layers: Vec::new(),
        top_k: 0,
    })
}

/// Keys and values of every KV head per position per layer (f32).
pub fn summary(cfg: &JsonConfig) -> Result<ConfigSummary> {
    let c = Config::read(cfg)?;
    let sizes = (c.n_layers, c.vocab, c.hidden, c.max_pos);
    Ok(gqa_summary(sizes, c.n_kv_heads, c.head_dim))
}

pub fn load(cfg: &JsonConfig, ckpt: &Checkpoint, loading: &Loading) -> Result<Box<dyn Model>> {
    let c = Config::read(cfg)?;
    // A GGUF file's Llama q and k rows come permuted for adjacent-pair rotation.
    let style = RopeStyle::of(cfg)?;
    let rope = Rope::from_config(cfg, c.head_dim, 10000.0, style)?;
    let c = Arc::new(c);
    let builder: BlockBuilder = {
        let c = c.clone();
        Arc::new(move |ckpt: &Checkpoint, l: usize| -> Result<Block> {
            let p = names::layer(l);
            let base = format!("{p}.self_attn");
            let mut attn = GqaAttention::load(
                ckpt,
                &base,
                c.hidden,
                c.n_heads,
                c.n_kv_heads,
                c.head_dim,
                c.kind == Kind::Qwen3,
                rope.clone(),
                c.eps,
            )?;
            attn.sliding_window = c.sliding_window;
            if c.qkv_bias {
                attn.biases = Some(Box::new(GqaBiases::load(ckpt, &base, &attn, c.o_bias)?));
            }
            Ok(Block {
                attn_norm: load_vector(ckpt, &format!("{p}.input_layernorm.weight"), c.hidden)?,
                attn: Attention::Gqa(Box::new(attn)),
                ffn_norm: load_vector(ckpt, &format!("{p}.post_attention_layernorm.weight"), c.hidden)?,
                ffn: Ffn::Dense(Mlp {
                    gate: load_linear(ckpt, &format!("{p}.mlp.gate_proj"), c.inter, c.hidden)?,
                    up: load_linear(ckpt, &format!("{p}.mlp.up_proj"), c.inter, c.hidden)?,
                    down: load_linear(ckpt, &format!("{p}.mlp.down_proj"), c.hidden, c.inter)?,
                    act: Activation::Silu,
                }),
                res: None,
            })
        })
    };
    let layers = build_layers(ckpt, c.n_layers, loading, builder)?;
    let (embed, norm, lm_head) = load_ends(cfg, ckpt, c.vocab, c.hidden)?;
    let default_class = match c.kind {
        Kind::Llama => "LlamaForCausalLM",
        Kind::Qwen2 => "Qwen2ForCausalLM",
        Kind::Qwen3 => "Qwen3ForCausalLM",
    };
    Ok(Box::new(Decoder {
        info: ModelInfo {
            architecture: cfg.architecture().unwrap_or(default_class).to_string(),
            model_type: c.model_type.clone(),
            family: "dense",
            vocab_size: c.vocab,
            hidden_dim: c.hidden,
            n_layers: c.n_layers,
            max_positions: c.max_pos,
            experts: None,
        },
        embed,
        layers: layers.layers,
        states: layers.states,
        spine: layers.store,
        norm,
        lm_head,
        eps: c.eps,
        attn_res: None,
        gpu: Default::default(),
    }))
}
