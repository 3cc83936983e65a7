//! Mixtral: GQA with a NeoX rotation and no q/k norm (and an optional `sliding_window`); every
//! layer is MoE (`block_sparse_moe`), softmax top-k renormalised, experts named w1 (gate), w3 (up),
//! w2 (down).

use std::sync::Arc;

use strata_formats::{Checkpoint, JsonConfig};

use crate::decoder::{Attention, Block, Decoder, Ffn};
use crate::layers::attention::GqaAttention;
use crate::layers::math::Activation;
use crate::layers::moe::{MoeLayer, Router, RoutingRule};
use crate::layers::rope::{Rope, RopeStyle};
use crate::registry::{check_gqa, gqa_summary, load_ends, names, ConfigSummary};
use crate::spine::{build_layers, BlockBuilder, Loading};
use crate::weights::{load_linear, load_vector};
use crate::{ExpertLayout, Model, ModelInfo, Result};

struct Config {
    vocab: usize,
    hidden: usize,
    inter: usize,
    n_layers: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    n_experts: usize,
    top_k: usize,
    eps: f32,
    max_pos: usize,
    sliding_window: Option<usize>,
}

impl Config {
    fn read(cfg: &JsonConfig) -> Result<Config> {
        let hidden = cfg.usize("hidden_size")?;
        let n_heads = cfg.usize("num_attention_heads")?;
        let c = Config {
            vocab: cfg.usize("vocab_size")?,
            hidden,
            inter: cfg.usize("intermediate_size")?,
            n_layers: cfg.usize("num_hidden_layers")?,
            n_heads,
            n_kv_heads: cfg.opt_usize("num_key_value_heads")?.unwrap_or(n_heads),
            head_dim: cfg.opt_usize("head_dim")?.unwrap_or(hidden / n_heads.max(1)),
            n_experts: cfg.usize("num_local_experts")?,
            top_k: cfg.usize("num_experts_per_tok")?,
            eps: cfg.opt_f64("rms_norm_eps")?.unwrap_or(1e-5) as f32,
            max_pos: cfg.usize("max_position_embeddings")?,
            sliding_window: cfg.opt_usize("sliding_window")?,
        };
        check_gqa(cfg, c.n_heads, c.n_kv_heads, c.head_dim, c.top_k, c.n_experts)?;
        Ok(c)
    }
}

pub fn expert_layout(cfg: &JsonConfig) -> Result<ExpertLayout> {
    let c = Config::read(cfg)?;
    Ok(ExpertLayout {
        prefix: "model.layers.{layer}.block_sparse_moe.experts.{expert}.".into(),
        projections: ["w1".into(), "w3".into(), "w2".into()],
        hidden_dim: c.hidden,
        inter_dim: c.inter,
        n_experts: c.n_experts,
        moe_layers: (0..c.n_layers).collect(),
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
    // A GGUF file's q and k rows come permuted for adjacent-pair rotation (`rope_interleaved`).
    let style = RopeStyle::of(cfg)?;
    let rope = Rope::from_config(cfg, c.head_dim, 1e6, style)?;
    let c = Arc::new(c);
    let builder: BlockBuilder = {
        let c = c.clone();
        Arc::new(move |ckpt: &Checkpoint, l: usize| -> Result<Block> {
            let p = names::layer(l);
            let mut attn = GqaAttention::load(
                ckpt,
                &format!("{p}.self_attn"),
                c.hidden,
                c.n_heads,
                c.n_kv_heads,
                c.head_dim,
                false,
                rope.clone(),
                c.eps,
            )?;
            attn.sliding_window = c.sliding_window;
            Ok(Block {
                attn_norm: load_vector(ckpt, &format!("{p}.input_layernorm.weight"), c.hidden)?,
                attn: Attention::Gqa(Box::new(attn)),
                ffn_norm: load_vector(ckpt, &format!("{p}.post_attention_layernorm.weight"), c.hidden)?,
                ffn: Ffn::Moe(MoeLayer {
                    layer: l,
                    router: Router {
                        weight: load_linear(
                            ckpt,
                            &format!("{p}.block_sparse_moe.gate"),
                            c.n_experts,
                            c.hidden,
                        )?,
                        top_k: c.top_k,
                        rule: RoutingRule::SoftmaxTopK { norm_topk_prob: true },
                    },
                    shared: None,
                    latent: None,
                    shared_gate: None,
                    act: Activation::Silu,
                    store: store.clone(),
                }),
                res: None,
            })
        })
    };
    let layers = build_layers(ckpt, c.n_layers, loading, builder)?;
    let (embed, norm, lm_head) = load_ends(cfg, ckpt, c.vocab, c.hidden)?;
    Ok(Box::new(Decoder {
        info: ModelInfo {
            architecture: cfg.architecture().unwrap_or("MixtralForCausalLM").to_string(),
            model_type: "mixtral".into(),
            family: "mixtral",
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
