//! Qwen3-MoE: GQA with per-head q/k RMSNorm before a NeoX rotation (head_dim may differ from
//! hidden/heads); sparse layers route with softmax top-k (renormalised when `norm_topk_prob`),
//! no shared expert; `mlp_only_layers` and `decoder_sparse_step` pick the dense layers.
//! Qwen2-MoE (`qwen2_moe`, Qwen1.5-MoE and Qwen2-57B-A14B) is the same but for its attention,
//! biases on q, k and v (`qkv_bias`) and no q/k norm, and a shared expert
//! (`shared_expert_intermediate_size`) whose output is scaled per token by
//! sigmoid(`shared_expert_gate` . x).

use std::sync::Arc;

use strata_formats::{Checkpoint, JsonConfig};

use crate::decoder::{Attention, Block, Decoder, Ffn};
use crate::layers::attention::{GqaAttention, GqaBiases};
use crate::layers::math::Activation;
use crate::layers::mlp::Mlp;
use crate::layers::moe::{MoeLayer, Router, RoutingRule};
use crate::layers::rope::{Rope, RopeStyle};
use crate::registry::{bad_config, check_gqa, gqa_summary, load_ends, names, ConfigSummary};
use crate::spine::{build_layers, BlockBuilder, Loading};
use crate::weights::{load_linear, load_vector};
use crate::{ExpertLayout, Model, ModelInfo, Result};

struct Config {
    /// Qwen2-MoE rather than Qwen3-MoE.
    qwen2: bool,
    /// Qwen2-MoE: biases on q, k, v; its shared expert's width.
    qkv_bias: bool,
    shared_inter: usize,
    vocab: usize,
    hidden: usize,
    inter: usize,
    moe_inter: usize,
    n_layers: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    n_experts: usize,
    top_k: usize,
    norm_topk_prob: bool,
    sparse_step: usize,
    mlp_only: Vec<usize>,
    eps: f32,
    max_pos: usize,
}

impl Config {
    fn read(cfg: &JsonConfig) -> Result<Config> {
        let hidden = cfg.usize("hidden_size")?;
        let n_heads = cfg.usize("num_attention_heads")?;
        let qwen2 = cfg.opt_str("model_type")? == Some("qwen2_moe");
        let c = Config {
            qwen2,
            qkv_bias: qwen2 && cfg.opt_bool("qkv_bias")?.unwrap_or(true),
            shared_inter: if qwen2 {
                cfg.opt_usize("shared_expert_intermediate_size")?.unwrap_or(0)
            } else {
                0
            },
            vocab: cfg.usize("vocab_size")?,
            hidden,
            inter: cfg.usize("intermediate_size")?,
            moe_inter: cfg.usize("moe_intermediate_size")?,
            n_layers: cfg.usize("num_hidden_layers")?,
            n_heads,
            n_kv_heads: cfg.opt_usize("num_key_value_heads")?.unwrap_or(n_heads),
            head_dim: cfg.opt_usize("head_dim")?.unwrap_or(hidden / n_heads.max(1)),
            n_experts: cfg.usize("num_experts")?,
            top_k: cfg.usize("num_experts_per_tok")?,
            norm_topk_prob: cfg.opt_bool("norm_topk_prob")?.unwrap_or(false),
            sparse_step: cfg.opt_usize("decoder_sparse_step")?.unwrap_or(1).max(1),
            mlp_only: cfg.opt_usize_list("mlp_only_layers")?.unwrap_or_default(),
            eps: cfg.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            max_pos: cfg.usize("max_position_embeddings")?,
        };
        check_gqa(cfg, c.n_heads, c.n_kv_heads, c.head_dim, c.top_k, c.n_experts)?;
        if cfg.opt_bool("use_sliding_window")?.unwrap_or(false) {
            return Err(bad_config(cfg, "use_sliding_window = true is not supported yet"));
        }
        Ok(c)
    }

    fn is_moe(&self, l: usize) -> bool {
        !self.mlp_only.contains(&l) && self.n_experts > 0 && (l + 1).is_multiple_of(self.sparse_step)
    }
}

pub fn expert_layout(cfg: &JsonConfig) -> Result<ExpertLayout> {
    let c = Config::read(cfg)?;
    Ok(ExpertLayout {
        prefix: "model.layers.{layer}.mlp.experts.{expert}.".into(),
        projections: ["gate_proj".into(), "up_proj".into(), "down_proj".into()],
        hidden_dim: c.hidden,
        inter_dim: c.moe_inter,
        n_experts: c.n_experts,
        moe_layers: (0..c.n_layers).filter(|&l| c.is_moe(l)).collect(),
        top_k: c.top_k,
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
    let layout = expert_layout(cfg)?;
    let store = loading.experts.clone();
    let rope = Rope::from_config(cfg, c.head_dim, 10000.0, RopeStyle::NeoX)?;
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
                !c.qwen2,
                rope.clone(),
                c.eps,
            )?;
            if c.qkv_bias {
                attn.biases = Some(Box::new(GqaBiases::load(ckpt, &base, &attn, false)?));
            }
            let shared = |name: &str| -> Result<Mlp> {
                Ok(Mlp {
                    gate: load_linear(
                        ckpt,
                        &format!("{p}.mlp.{name}.gate_proj"),
                        c.shared_inter,
                        c.hidden,
                    )?,
                    up: load_linear(ckpt, &format!("{p}.mlp.{name}.up_proj"), c.shared_inter, c.hidden)?,
                    down: load_linear(
                        ckpt,
                        &format!("{p}.mlp.{name}.down_proj"),
                        c.hidden,
                        c.shared_inter,
                    )?,
                    act: Activation::Silu,
                })
            };
            let has_shared = c.shared_inter > 0;
            let ffn = if c.is_moe(l) {
                Ffn::Moe(MoeLayer {
                    layer: l,
                    router: Router {
                        weight: load_linear(ckpt, &format!("{p}.mlp.gate"), c.n_experts, c.hidden)?,
                        top_k: c.top_k,
                        rule: RoutingRule::SoftmaxTopK {
                            norm_topk_prob: c.norm_topk_prob,
                        },
                    },
                    shared: if has_shared {
                        Some(shared("shared_expert")?)
                    } else {
                        None
                    },
                    latent: None,
                    shared_gate: if has_shared {
                        Some(load_linear(
                            ckpt,
                            &format!("{p}.mlp.shared_expert_gate"),
                            1,
                            c.hidden,
                        )?)
                    } else {
                        None
                    },
                    act: Activation::Silu,
                    store: store.clone(),
                })
            } else {
                Ffn::Dense(Mlp {
                    gate: load_linear(ckpt, &format!("{p}.mlp.gate_proj"), c.inter, c.hidden)?,
                    up: load_linear(ckpt, &format!("{p}.mlp.up_proj"), c.inter, c.hidden)?,
                    down: load_linear(ckpt, &format!("{p}.mlp.down_proj"), c.hidden, c.inter)?,
                    act: Activation::Silu,
                })
            };
            Ok(Block {
                attn_norm: load_vector(ckpt, &format!("{p}.input_layernorm.weight"), c.hidden)?,
                attn: Attention::Gqa(Box::new(attn)),
                ffn_norm: load_vector(ckpt, &format!("{p}.post_attention_layernorm.weight"), c.hidden)?,
                ffn,
                res: None,
            })
        })
    };
    let layers = build_layers(ckpt, c.n_layers, loading, builder)?;
    let (embed, norm, lm_head) = load_ends(cfg, ckpt, c.vocab, c.hidden)?;
    Ok(Box::new(Decoder {
        info: ModelInfo {
            architecture: (cfg.architecture())
                .unwrap_or(if c.qwen2 {
                    "Qwen2MoeForCausalLM"
                } else {
                    "Qwen3MoeForCausalLM"
                })
                .to_string(),
            model_type: if c.qwen2 { "qwen2_moe" } else { "qwen3_moe" }.into(),
            family: "qwen3_moe",
            vocab_size: c.vocab,
            hidden_dim: c.hidden,
            n_layers: c.n_layers,
            max_positions: c.max_pos,
            experts: Some(layout),
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
