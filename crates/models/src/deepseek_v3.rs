//! DeepSeek-V3 and Kimi K2 (`model_type: kimi_k2` is DeepSeek-V3 with other numbers).
//!
//! Blocks: MLA attention (q and kv low-rank, interleaved YaRN rope, softmax scale with mscale^2);
//! the first `first_k_dense_replace` layers have a dense MLP, the rest are MoE with `noaux_tc`
//! routing (sigmoid + correction bias, group limit, renormalise, routed scaling) plus shared
//! experts added unweighted.

use std::sync::Arc;

use strata_formats::{Checkpoint, JsonConfig};

use crate::decoder::{Attention, Block, Decoder, Ffn};
use crate::layers::math::Activation;
use crate::layers::mla::{MlaAttention, QueryProj};
use crate::layers::mlp::Mlp;
use crate::layers::moe::{MoeLayer, Router, RoutingRule};
use crate::layers::rope::{yarn_mscale, Rope, RopeStyle};
use crate::registry::{bad_config, load_ends, names, ConfigSummary};
use crate::spine::{build_layers, BlockBuilder, Loading};
use crate::weights::{load_linear, load_vector};
use crate::{ExpertLayout, Model, ModelInfo, Result};

struct Config {
    vocab: usize,
    hidden: usize,
    inter: usize,
    moe_inter: usize,
    n_layers: usize,
    n_heads: usize,
    q_lora: Option<usize>,
    kv_lora: usize,
    nope: usize,
    rope: usize,
    v: usize,
    n_routed: usize,
    n_shared: usize,
    top_k: usize,
    n_group: usize,
    topk_group: usize,
    norm_topk_prob: bool,
    routed_scaling: f32,
    first_dense: usize,
    moe_freq: usize,
    eps: f32,
    max_pos: usize,
}

impl Config {
    fn read(cfg: &JsonConfig) -> Result<Config> {
        let c = Config {
            vocab: cfg.usize("vocab_size")?,
            hidden: cfg.usize("hidden_size")?,
            inter: cfg.usize("intermediate_size")?,
            moe_inter: cfg.usize("moe_intermediate_size")?,
            n_layers: cfg.usize("num_hidden_layers")?,
            n_heads: cfg.usize("num_attention_heads")?,
            q_lora: cfg.opt_usize("q_lora_rank")?,
            kv_lora: cfg.usize("kv_lora_rank")?,
            nope: cfg.usize("qk_nope_head_dim")?,
            rope: cfg.usize("qk_rope_head_dim")?,
            v: cfg.usize("v_head_dim")?,
            n_routed: cfg.usize("n_routed_experts")?,
            n_shared: cfg.opt_usize("n_shared_experts")?.unwrap_or(0),
            top_k: cfg.usize("num_experts_per_tok")?,
            n_group: cfg.opt_usize("n_group")?.unwrap_or(1).max(1),
            topk_group: cfg.opt_usize("topk_group")?.unwrap_or(1).max(1),
            norm_topk_prob: cfg.opt_bool("norm_topk_prob")?.unwrap_or(false),
            routed_scaling: cfg.opt_f64("routed_scaling_factor")?.unwrap_or(1.0) as f32,
            first_dense: cfg.opt_usize("first_k_dense_replace")?.unwrap_or(0),
            moe_freq: cfg.opt_usize("moe_layer_freq")?.unwrap_or(1).max(1),
            eps: cfg.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            max_pos: cfg.usize("max_position_embeddings")?,
        };
        if let Some(method) = cfg.opt_str("topk_method")? {
            if method != "noaux_tc" {
                return Err(bad_config(
                    cfg,
                    format!("topk_method `{method}` is not supported (noaux_tc)"),
                ));
            }
        }
        if let Some(scoring) = cfg.opt_str("scoring_func")? {
            if scoring != "sigmoid" {
                return Err(bad_config(
                    cfg,
                    format!("scoring_func `{scoring}` is not supported (sigmoid)"),
                ));
            }
        }
        if !c.n_routed.is_multiple_of(c.n_group) || c.topk_group > c.n_group || c.top_k > c.n_routed {
            return Err(bad_config(
                cfg,
                format!(
                    "inconsistent routing: {} experts, n_group {}, topk_group {}, top-{}",
                    c.n_routed, c.n_group, c.topk_group, c.top_k
                ),
            ));
        }
        if !c.rope.is_multiple_of(2) {
            return Err(bad_config(cfg, "qk_rope_head_dim must be even"));
        }
        Ok(c)
    }

    fn is_moe(&self, l: usize) -> bool {
        self.n_routed > 0 && l >= self.first_dense && l.is_multiple_of(self.moe_freq)
    }
}

pub fn expert_layout(cfg: &JsonConfig) -> Result<ExpertLayout> {
    let c = Config::read(cfg)?;
    Ok(ExpertLayout {
        prefix: "model.layers.{layer}.mlp.experts.{expert}.".into(),
        projections: ["gate_proj".into(), "up_proj".into(), "down_proj".into()],
        hidden_dim: c.hidden,
        inter_dim: c.moe_inter,
        n_experts: c.n_routed,
        moe_layers: (0..c.n_layers).filter(|&l| c.is_moe(l)).collect(),
        top_k: c.top_k,
    })
}

/// MLA caches the normed latent and the roped key per position per layer (f32).
pub fn summary(cfg: &JsonConfig) -> Result<ConfigSummary> {
    let c = Config::read(cfg)?;
    Ok(ConfigSummary {
        n_layers: c.n_layers,
        vocab_size: c.vocab,
        hidden_dim: c.hidden,
        max_positions: c.max_pos,
        state_bytes_per_token: c.n_layers * (c.kv_lora + c.rope) * 4,
        state_bytes_per_sequence: 0,
    })
}

pub fn load(cfg: &JsonConfig, ckpt: &Checkpoint, loading: &Loading) -> Result<Box<dyn Model>> {
    let c = Config::read(cfg)?;
    let layout = expert_layout(cfg)?;
    let store = loading.experts.clone();
    let rope = Rope::from_config(cfg, c.rope, 10000.0, RopeStyle::Interleaved)?;
    let qk = c.nope + c.rope;
    let mut softmax_scale = (qk as f64).powf(-0.5);
    if let Some(scaling) = cfg.opt_object("rope_scaling")? {
        let mscale_all_dim = scaling.opt_f64("mscale_all_dim")?.unwrap_or(0.0);
        if mscale_all_dim != 0.0 {
            let m = yarn_mscale(scaling.f64("factor")?, mscale_all_dim);
            softmax_scale *= m * m;
        }
    }

    let c = Arc::new(c);
    let builder: BlockBuilder = {
        let c = c.clone();
        Arc::new(move |ckpt: &Checkpoint, l: usize| -> Result<Block> {
            let p = names::layer(l);
            let a = format!("{p}.self_attn");
            let q = match c.q_lora {
                Some(r) => QueryProj::LowRank {
                    a: load_linear(ckpt, &format!("{a}.q_a_proj"), r, c.hidden)?,
                    norm: load_vector(ckpt, &format!("{a}.q_a_layernorm.weight"), r)?,
                    b: load_linear(ckpt, &format!("{a}.q_b_proj"), c.n_heads * qk, r)?,
                },
                None => QueryProj::Direct(load_linear(
                    ckpt,
                    &format!("{a}.q_proj"),
                    c.n_heads * qk,
                    c.hidden,
                )?),
            };
            let attn = MlaAttention {
                q,
                kv_a: load_linear(
                    ckpt,
                    &format!("{a}.kv_a_proj_with_mqa"),
                    c.kv_lora + c.rope,
                    c.hidden,
                )?,
                kv_a_norm: load_vector(ckpt, &format!("{a}.kv_a_layernorm.weight"), c.kv_lora)?,
                kv_b: strata_weights::load_kv_b(ckpt, &a, c.n_heads, c.nope, c.v, c.kv_lora)?,
                o: load_linear(ckpt, &format!("{a}.o_proj"), c.hidden, c.n_heads * c.v)?,
                gate: None,
                n_heads: c.n_heads,
                nope_dim: c.nope,
                rope_dim: c.rope,
                v_dim: c.v,
                kv_lora: c.kv_lora,
                softmax_scale: softmax_scale as f32,
                rope: Some(rope.clone()),
                eps: c.eps,
            };
            let mlp = |base: &str, inter: usize| -> Result<Mlp> {
                Ok(Mlp {
                    gate: load_linear(ckpt, &format!("{base}.gate_proj"), inter, c.hidden)?,
                    up: load_linear(ckpt, &format!("{base}.up_proj"), inter, c.hidden)?,
                    down: load_linear(ckpt, &format!("{base}.down_proj"), c.hidden, inter)?,
                    act: Activation::Silu,
                })
            };
            let ffn = if c.is_moe(l) {
                let gate = format!("{p}.mlp.gate");
                Ffn::Moe(MoeLayer {
                    layer: l,
                    router: Router {
                        weight: load_linear(ckpt, &gate, c.n_routed, c.hidden)?,
                        top_k: c.top_k,
                        rule: RoutingRule::SigmoidGrouped {
                            correction_bias: load_vector(
                                ckpt,
                                &format!("{gate}.e_score_correction_bias"),
                                c.n_routed,
                            )?,
                            n_group: c.n_group,
                            topk_group: c.topk_group,
                            norm_topk_prob: c.norm_topk_prob,
                            routed_scaling_factor: c.routed_scaling,
                        },
                    },
                    shared: if c.n_shared > 0 {
                        Some(mlp(&format!("{p}.mlp.shared_experts"), c.moe_inter * c.n_shared)?)
                    } else {
                        None
                    },
                    latent: None,
                    shared_gate: None,
                    act: Activation::Silu,
                    store: store.clone(),
                })
            } else {
                Ffn::Dense(mlp(&format!("{p}.mlp"), c.inter)?)
            };
            Ok(Block {
                attn_norm: load_vector(ckpt, &format!("{p}.input_layernorm.weight"), c.hidden)?,
                attn: Attention::Mla(Box::new(attn)),
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
            architecture: cfg.architecture().unwrap_or("DeepseekV3ForCausalLM").to_string(),
            model_type: cfg.opt_str("model_type")?.unwrap_or("deepseek_v3").to_string(),
            family: "deepseek_v3",
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
