//! Kimi Linear (`model_type: kimi_linear`): a hybrid of KDA linear attention and MLA without
//! rotary embeddings (NoPE), on the layer schedule of `linear_attn_config` (one-based
//! `kda_layers` / `full_attn_layers`); the first `first_k_dense_replace` layers have a dense MLP,
//! the rest are MoE with sigmoid `noaux_tc` routing and shared experts.
//!
//! Kimi K3 (`kimi_k3.rs`) is the same hybrid with other switches, all read from config here:
//! `hidden_act: situ` (SiTU-GLU), `gate_lower_bound` (bounded forget gate),
//! `use_full_rank_gate` (KDA output gate), `mla_use_output_gate`, `routed_expert_hidden_size`
//! (LatentMoE) and `attn_res_block_size` (Block AttnRes).

use std::sync::Arc;

use strata_formats::{Checkpoint, DType, JsonConfig};
use strata_kernels::Linear;

use crate::decoder::{Attention, Block, Decoder, Ffn};
use crate::layers::attn_res::{AttnRes, LayerRes, ResMix};
use crate::layers::kda::{ForgetGate, KdaAttention, OutputGate};
use crate::layers::math::Activation;
use crate::layers::mla::{MlaAttention, QueryProj};
use crate::layers::mlp::Mlp;
use crate::layers::moe::{LatentProj, MoeLayer, Router, RoutingRule};
use crate::registry::{bad_config, ConfigSummary, TensorDesc};
use crate::spine::{build_layers, BlockBuilder, Loading};
use crate::weights::{load_linear, load_vector};
use crate::{ExpertLayout, ExpertStore, Model, ModelInfo, Result};

/// How `A_log` (KDA's per-head decay rate) is laid out when stored as one vector of `head_dim`
/// values (Kimi K3). Kimi Linear stores `[1, 1, heads, 1]`, which is unambiguous.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum ALogLayout {
    /// The first `heads` entries are the per-head values, the rest zero padding (the default).
    PerHeadPadded,
    /// One value per key channel, shared by every head.
    PerChannel,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum LayerKind {
    Kda,
    Mla,
}

/// Where the tensors are: `model.` and `lm_head` (Kimi Linear) or under `language_model.` (K3).
pub(crate) struct Names {
    pub model: &'static str,
    pub head: &'static str,
}

pub(crate) const KIMI_LINEAR_NAMES: Names = Names {
    model: "model.",
    head: "lm_head",
};

pub(crate) struct Config {
    vocab: usize,
    hidden: usize,
    inter: usize,
    moe_inter: usize,
    n_layers: usize,
    kinds: Vec<LayerKind>,
    // MLA
    n_heads: usize,
    q_lora: Option<usize>,
    kv_lora: usize,
    nope: usize,
    rope: usize,
    v: usize,
    mla_gate: bool,
    latent_eps: f32,
    // KDA
    kda_heads: usize,
    kda_dim: usize,
    conv: usize,
    full_rank_gate: bool,
    forget: ForgetGate,
    a_log_layout: ALogLayout,
    // MoE
    n_routed: usize,
    n_shared: usize,
    top_k: usize,
    n_group: usize,
    topk_group: usize,
    renormalize: bool,
    routed_scaling: f32,
    first_dense: usize,
    moe_freq: usize,
    latent: Option<usize>,
    latent_norm: bool,
    act: Activation,
    attn_res_block: Option<usize>,
    /// K3 naming and storage (F32 conv taps and o_norm, `[head_dim]` A_log).
    k3: bool,
    /// q/k normalised as x / max(|x|, 1e-12) instead of x / sqrt(sum x^2 + 1e-6).
    l2_clamp: bool,
    eps: f32,
    max_pos: usize,
}

impl Config {
    /// `text` is the language model's config; `switches` holds the spec's recorded choices
    /// (`k3ref` in K3 fixtures), when any.
    pub(crate) fn read(text: &JsonConfig, switches: Option<&JsonConfig>, k3: bool) -> Result<Config> {
        let la = text
            .opt_object("linear_attn_config")?
            .ok_or_else(|| bad_config(text, "linear_attn_config is missing"))?;
        let n_layers = text.usize("num_hidden_layers")?;
        let mut kinds = vec![None; n_layers];
        for (key, kind) in [
            ("kda_layers", LayerKind::Kda),
            ("full_attn_layers", LayerKind::Mla),
        ] {
            let list = la
                .opt_usize_list(key)?
                .ok_or_else(|| bad_config(&la, format!("{key} is missing (one-based layer ids)")))?;
            for id in list {
                if id == 0 || id > n_layers || kinds[id - 1].is_some() {
                    return Err(bad_config(
                        &la,
                        format!("{key}: layer {id} is out of 1..={n_layers} or listed twice"),
                    ));
                }
                kinds[id - 1] = Some(kind);
            }
        }
        let kinds = kinds
            .iter()
            .enumerate()
            .map(|(i, k)| {
                k.ok_or_else(|| {
                    bad_config(
                        &la,
                        format!(
                            "layer {} (one-based) is in neither kda_layers nor full_attn_layers",
                            i + 1
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let eps = text.opt_f64("rms_norm_eps")?.unwrap_or(1e-5) as f32;
        let switch = |key: &str| -> Result<Option<String>> {
            Ok(match switches {
                Some(s) => s.opt_str(key)?.map(str::to_string),
                None => None,
            })
        };
        let a_log_layout = match switch("a_log_layout")?.as_deref() {
            None | Some("per_head_padded") => ALogLayout::PerHeadPadded,
            Some("per_channel") => ALogLayout::PerChannel,
            Some(other) => return Err(bad_config(text, format!("a_log_layout `{other}` is not known"))),
        };
        let one_of = |key: &str, allowed: &[&str], default: &str| -> Result<String> {
            let v = switch(key)?.unwrap_or_else(|| default.to_string());
            if allowed.contains(&v.as_str()) {
                Ok(v)
            } else {
                Err(bad_config(
                    text,
                    format!("{key} `{v}` is not supported ({})", allowed.join(", ")),
                ))
            }
        };
        let l2_clamp = one_of("qk_l2norm", &["fla", "clamp"], "fla")? == "clamp";
        one_of("mxfp4_nibble_order", &["low_first"], "low_first")?;
        let residual_default = if k3 { "attn_res" } else { "standard" };
        let attn_res = one_of("residual_mode", &["attn_res", "standard"], residual_default)? == "attn_res";
        // transformers' Kimi Linear hard-codes 1e-6 for the MLA latent norms; K3 uses rms_norm_eps.
        let latent_eps = match switches.map(|s| s.opt_f64("mla_latent_norm_eps")).transpose()? {
            Some(Some(e)) => e as f32,
            _ if k3 => eps,
            _ => 1e-6,
        };
        let act = match text.opt_str("hidden_act")?.unwrap_or("silu") {
            "silu" => Activation::Silu,
            "situ" => Activation::Situ {
                beta: text.opt_f64("activation_situ_beta")?.unwrap_or(4.0) as f32,
                linear_beta: text.opt_f64("activation_situ_linear_beta")?.unwrap_or(25.0) as f32,
            },
            other => {
                return Err(bad_config(
                    text,
                    format!("hidden_act `{other}` is not supported (silu, situ)"),
                ))
            }
        };
        let forget = match la.opt_f64("gate_lower_bound")? {
            Some(b) => ForgetGate::Bounded {
                lower_bound: b as f32,
            },
            None => ForgetGate::Softplus,
        };
        let c = Config {
            vocab: text.usize("vocab_size")?,
            hidden: text.usize("hidden_size")?,
            inter: text.usize("intermediate_size")?,
            moe_inter: text.usize("moe_intermediate_size")?,
            n_layers,
            kinds,
            n_heads: text.usize("num_attention_heads")?,
            q_lora: text.opt_usize("q_lora_rank")?,
            kv_lora: text.usize("kv_lora_rank")?,
            nope: text.usize("qk_nope_head_dim")?,
            rope: text.usize("qk_rope_head_dim")?,
            v: text.usize("v_head_dim")?,
            mla_gate: text.opt_bool("mla_use_output_gate")?.unwrap_or(false),
            latent_eps,
            kda_heads: la.usize("num_heads")?,
            kda_dim: la.usize("head_dim")?,
            conv: la.usize("short_conv_kernel_size")?,
            full_rank_gate: la.opt_bool("use_full_rank_gate")?.unwrap_or(false),
            forget,
            a_log_layout,
            n_routed: text.usize("num_experts")?,
            n_shared: text.opt_usize("num_shared_experts")?.unwrap_or(1),
            top_k: text.usize("num_experts_per_token")?,
            n_group: text.opt_usize("num_expert_group")?.unwrap_or(1).max(1),
            topk_group: text.opt_usize("topk_group")?.unwrap_or(1).max(1),
            renormalize: text.opt_bool("moe_renormalize")?.unwrap_or(true),
            routed_scaling: text.opt_f64("routed_scaling_factor")?.unwrap_or(1.0) as f32,
            first_dense: text.opt_usize("first_k_dense_replace")?.unwrap_or(0),
            moe_freq: text.opt_usize("moe_layer_freq")?.unwrap_or(1).max(1),
            latent: text.opt_usize("routed_expert_hidden_size")?,
            latent_norm: text.opt_bool("latent_moe_use_norm")?.unwrap_or(false),
            act,
            attn_res_block: if attn_res {
                Some(text.usize("attn_res_block_size")?)
            } else {
                None
            },
            k3,
            l2_clamp,
            eps,
            max_pos: match text.opt_usize("max_position_embeddings")? {
                Some(n) => n,
                None => text.usize("model_max_length")?,
            },
        };
        if let Some(method) = text.opt_str("topk_method")? {
            if method != "noaux_tc" {
                return Err(bad_config(
                    text,
                    format!("topk_method `{method}` is not supported (noaux_tc)"),
                ));
            }
        }
        if let Some(f) = text.opt_str("moe_router_activation_func")? {
            if f != "sigmoid" {
                return Err(bad_config(
                    text,
                    format!("moe_router_activation_func `{f}` is not supported (sigmoid)"),
                ));
            }
        }
        if !c.n_routed.is_multiple_of(c.n_group) || c.topk_group > c.n_group || c.top_k > c.n_routed {
            return Err(bad_config(
                text,
                format!(
                    "inconsistent routing: {} experts, num_expert_group {}, topk_group {}, top-{}",
                    c.n_routed, c.n_group, c.topk_group, c.top_k
                ),
            ));
        }
        if c.conv == 0 || c.kda_heads == 0 || c.kda_dim == 0 || c.attn_res_block == Some(0) {
            return Err(bad_config(
                text,
                "short_conv_kernel_size, KDA heads/head_dim and attn_res_block_size must be positive",
            ));
        }
        Ok(c)
    }

    fn is_moe(&self, l: usize) -> bool {
        self.n_routed > 0 && l >= self.first_dense && l.is_multiple_of(self.moe_freq)
    }

    fn kda_width(&self) -> usize {
        self.kda_heads * self.kda_dim
    }

    pub(crate) fn expert_layout(&self, names: &Names) -> ExpertLayout {
        ExpertLayout {
            prefix: format!(
                "{}layers.{{layer}}.block_sparse_moe.experts.{{expert}}.",
                names.model
            ),
            projections: ["w1".into(), "w3".into(), "w2".into()],
            hidden_dim: self.latent.unwrap_or(self.hidden),
            inter_dim: self.moe_inter,
            n_experts: self.n_routed,
            moe_layers: (0..self.n_layers).filter(|&l| self.is_moe(l)).collect(),
            top_k: self.top_k,
        }
    }

    /// MLA layers cache [c_kv | k_rope] per position; KDA layers hold a fixed (heads, Dk, Dk)
    /// state plus the last K-1 convolution inputs, whatever the length (all f32).
    pub(crate) fn summary(&self) -> ConfigSummary {
        let mla = self.kinds.iter().filter(|k| **k == LayerKind::Mla).count();
        let kda = self.n_layers - mla;
        let kda_state = self.kda_heads * self.kda_dim * self.kda_dim + (self.conv - 1) * 3 * self.kda_width();
        ConfigSummary {
            n_layers: self.n_layers,
            vocab_size: self.vocab,
            hidden_dim: self.hidden,
            max_positions: self.max_pos,
            state_bytes_per_token: mla * (self.kv_lora + self.rope) * 4,
            state_bytes_per_sequence: kda * kda_state * 4,
        }
    }

    /// Every tensor the checkpoint holds for this config, with the storage dtype of the real
    /// checkpoints (routed experts: MXFP4 when the config says so, else BF16).
    pub(crate) fn inventory(&self, names: &Names, mxfp4_experts: bool) -> Vec<TensorDesc> {
        let mut out = Vec::new();
        let mut push =
            |name: String, shape: Vec<usize>, dtype: DType| out.push(TensorDesc { name, shape, dtype });
        let (d, m, bf, f32_) = (self.hidden, names.model, DType::BF16, DType::F32);
        let k3 = self.k3;
        let small = if k3 { f32_ } else { bf }; // conv taps and o_norm
        push(format!("{m}embed_tokens.weight"), vec![self.vocab, d], bf);
        push(format!("{m}norm.weight"), vec![d], bf);
        push(format!("{}.weight", names.head), vec![self.vocab, d], bf);
        let attn_res = self.attn_res_block.is_some();
        if attn_res {
            push(format!("{m}output_attn_res_norm.weight"), vec![d], bf);
            push(format!("{m}output_attn_res_proj.weight"), vec![1, d], bf);
        }
        let (c, dk, nh) = (self.kda_width(), self.kda_dim, self.kda_heads);
        let layout = self.expert_layout(names);
        for l in 0..self.n_layers {
            let p = format!("{m}layers.{l}.");
            push(format!("{p}input_layernorm.weight"), vec![d], bf);
            push(format!("{p}post_attention_layernorm.weight"), vec![d], bf);
            if attn_res {
                for n in ["self_attention_res", "mlp_res"] {
                    push(format!("{p}{n}_norm.weight"), vec![d], bf);
                    push(format!("{p}{n}_proj.weight"), vec![1, d], bf);
                }
            }
            let a = format!("{p}self_attn.");
            match self.kinds[l] {
                LayerKind::Kda => {
                    for n in ["q", "k", "v"] {
                        push(format!("{a}{n}_proj.weight"), vec![c, d], bf);
                        push(format!("{a}{n}_conv1d.weight"), vec![c, 1, self.conv], small);
                    }
                    if k3 {
                        push(format!("{a}A_log"), vec![dk], f32_);
                    } else {
                        push(format!("{a}A_log"), vec![1, 1, nh, 1], f32_);
                    }
                    push(format!("{a}dt_bias"), vec![c], f32_);
                    push(format!("{a}f_a_proj.weight"), vec![dk, d], bf);
                    push(format!("{a}f_b_proj.weight"), vec![c, dk], bf);
                    push(format!("{a}b_proj.weight"), vec![nh, d], bf);
                    if self.full_rank_gate {
                        push(format!("{a}g_proj.weight"), vec![c, d], bf);
                    } else {
                        push(format!("{a}g_a_proj.weight"), vec![dk, d], bf);
                        push(format!("{a}g_b_proj.weight"), vec![c, dk], bf);
                    }
                    push(format!("{a}o_norm.weight"), vec![dk], small);
                    push(format!("{a}o_proj.weight"), vec![d, c], bf);
                }
                LayerKind::Mla => {
                    let qk = self.nope + self.rope;
                    match self.q_lora {
                        Some(r) => {
                            push(format!("{a}q_a_proj.weight"), vec![r, d], bf);
                            push(format!("{a}q_a_layernorm.weight"), vec![r], bf);
                            push(format!("{a}q_b_proj.weight"), vec![self.n_heads * qk, r], bf);
                        }
                        None => push(format!("{a}q_proj.weight"), vec![self.n_heads * qk, d], bf),
                    }
                    push(
                        format!("{a}kv_a_proj_with_mqa.weight"),
                        vec![self.kv_lora + self.rope, d],
                        bf,
                    );
                    push(format!("{a}kv_a_layernorm.weight"), vec![self.kv_lora], bf);
                    push(
                        format!("{a}kv_b_proj.weight"),
                        vec![self.n_heads * (self.nope + self.v), self.kv_lora],
                        bf,
                    );
                    if self.mla_gate {
                        push(format!("{a}g_proj.weight"), vec![self.n_heads * self.v, d], bf);
                    }
                    push(format!("{a}o_proj.weight"), vec![d, self.n_heads * self.v], bf);
                }
            }
            let mlp = |push: &mut dyn FnMut(String, Vec<usize>, DType), base: String, inter: usize| {
                push(format!("{base}gate_proj.weight"), vec![inter, d], bf);
                push(format!("{base}up_proj.weight"), vec![inter, d], bf);
                push(format!("{base}down_proj.weight"), vec![d, inter], bf);
            };
            if !self.is_moe(l) {
                mlp(&mut push, format!("{p}mlp."), self.inter);
                continue;
            }
            let b = format!("{p}block_sparse_moe.");
            push(format!("{b}gate.weight"), vec![self.n_routed, d], bf);
            push(
                format!("{b}gate.e_score_correction_bias"),
                vec![self.n_routed],
                f32_,
            );
            if let Some(r) = self.latent {
                push(format!("{b}routed_expert_down_proj.weight"), vec![r, d], bf);
                if self.latent_norm {
                    push(format!("{b}routed_expert_norm.weight"), vec![r], bf);
                }
                push(format!("{b}routed_expert_up_proj.weight"), vec![d, r], bf);
            }
            if self.n_shared > 0 {
                mlp(
                    &mut push,
                    format!("{b}shared_experts."),
                    self.moe_inter * self.n_shared,
                );
            }
            for e in 0..self.n_routed {
                for (proj, (rows, cols)) in layout.shapes().iter().enumerate() {
                    let base = layout.tensor_base(l, e, proj);
                    if mxfp4_experts {
                        push(format!("{base}.weight_packed"), vec![*rows, cols / 2], DType::U8);
                        push(
                            format!("{base}.weight_scale"),
                            vec![*rows, cols.div_ceil(32)],
                            DType::U8,
                        );
                    } else {
                        push(format!("{base}.weight"), vec![*rows, *cols], bf);
                    }
                }
            }
        }
        out
    }
}

/// `exp(A_log)` for every key channel (C,), from either stored layout of `{attn}A_log`, or
/// from `{attn}A`, the rates' negatives (-exp(A_log)) as GGUF conversions store them.
fn decay_rates(ckpt: &Checkpoint, attn: &str, c: &Config) -> Result<Vec<f32>> {
    let (nh, dk) = (c.kda_heads, c.kda_dim);
    let negated = format!("{attn}A");
    if ckpt.contains(&negated) {
        let shape = ckpt.entry(&negated)?.info.shape.clone();
        if shape.iter().product::<usize>() != nh || shape.iter().filter(|&&n| n != 1).count() > 1 {
            let reason = format!("expected {nh} per-head values (e.g. [1, 1, {nh}, 1]), found {shape:?}");
            return Err(bad_tensor(ckpt, &negated, reason));
        }
        let values = ckpt.read_f32(&negated, &shape)?;
        if let Some(v) = values.iter().find(|v| v.is_nan() || **v >= 0.0) {
            let reason = format!("holds {v}, but -exp(A_log) is always negative");
            return Err(bad_tensor(ckpt, &negated, reason));
        }
        return Ok((0..nh * dk).map(|i| -values[i / dk]).collect());
    }
    let name = &format!("{attn}A_log");
    let shape = ckpt.entry(name)?.info.shape.clone();
    let values = ckpt.read_f32(name, &shape)?;
    let per_head: Vec<f32> = if shape == [1, 1, nh, 1] || shape == [nh] {
        values
    } else if shape.len() == 1 && shape[0] >= nh {
        match c.a_log_layout {
            ALogLayout::PerHeadPadded => {
                if values[nh..].iter().any(|v| *v != 0.0) {
                    tracing::warn!("{name}: entries past the {nh} heads are not zero padding");
                }
                values[..nh].to_vec()
            }
            ALogLayout::PerChannel if shape[0] == dk => {
                return Ok((0..nh * dk).map(|i| values[i % dk].exp()).collect());
            }
            ALogLayout::PerChannel => {
                return Err(bad_tensor(
                    ckpt,
                    name,
                    format!("per_channel A_log needs {dk} values, found {shape:?}"),
                ))
            }
        }
    } else {
        return Err(bad_tensor(
            ckpt,
            name,
            format!("expected [1, 1, {nh}, 1] or [{dk}] (per-head, zero padded), found {shape:?}"),
        ));
    };
    Ok((0..nh * dk).map(|i| per_head[i / dk].exp()).collect())
}

fn bad_tensor(ckpt: &Checkpoint, name: &str, reason: String) -> crate::ModelError {
    strata_formats::FormatError::BadTensor {
        path: ckpt.dir().to_path_buf(),
        tensor: ckpt.label(name),
        reason,
    }
    .into()
}

fn load_kda(ckpt: &Checkpoint, a: &str, c: &Config) -> Result<KdaAttention> {
    let (d, nh, dk, k) = (c.hidden, c.kda_heads, c.kda_dim, c.conv);
    let w = c.kda_width();
    let mut conv = Vec::with_capacity(3 * w * k);
    for n in ["q", "k", "v"] {
        conv.extend(ckpt.read_f32(&format!("{a}{n}_conv1d.weight"), &[w, 1, k])?);
    }
    let out_gate = if c.full_rank_gate {
        OutputGate::Full(load_linear(ckpt, &format!("{a}g_proj"), w, d)?)
    } else {
        OutputGate::LowRank {
            a: load_linear(ckpt, &format!("{a}g_a_proj"), dk, d)?,
            b: load_linear(ckpt, &format!("{a}g_b_proj"), w, dk)?,
        }
    };
    Ok(KdaAttention {
        q: load_linear(ckpt, &format!("{a}q_proj"), w, d)?,
        k: load_linear(ckpt, &format!("{a}k_proj"), w, d)?,
        v: load_linear(ckpt, &format!("{a}v_proj"), w, d)?,
        conv,
        a: decay_rates(ckpt, a, c)?,
        dt_bias: load_vector(ckpt, &format!("{a}dt_bias"), w)?,
        f_a: load_linear(ckpt, &format!("{a}f_a_proj"), dk, d)?,
        f_b: load_linear(ckpt, &format!("{a}f_b_proj"), w, dk)?,
        b: load_linear(ckpt, &format!("{a}b_proj"), nh, d)?,
        forget: c.forget,
        out_gate,
        o_norm: load_vector(ckpt, &format!("{a}o_norm.weight"), dk)?,
        o: load_linear(ckpt, &format!("{a}o_proj"), d, w)?,
        n_heads: nh,
        head_dim: dk,
        kernel: k,
        eps: c.eps,
        l2_clamp: c.l2_clamp,
        chunk: 64,
    })
}

fn load_mla(ckpt: &Checkpoint, a: &str, c: &Config) -> Result<MlaAttention> {
    let qk = c.nope + c.rope;
    let q = match c.q_lora {
        Some(r) => QueryProj::LowRank {
            a: load_linear(ckpt, &format!("{a}q_a_proj"), r, c.hidden)?,
            norm: load_vector(ckpt, &format!("{a}q_a_layernorm.weight"), r)?,
            b: load_linear(ckpt, &format!("{a}q_b_proj"), c.n_heads * qk, r)?,
        },
        None => QueryProj::Direct(load_linear(
            ckpt,
            &format!("{a}q_proj"),
            c.n_heads * qk,
            c.hidden,
        )?),
    };
    Ok(MlaAttention {
        q,
        kv_a: load_linear(
            ckpt,
            &format!("{a}kv_a_proj_with_mqa"),
            c.kv_lora + c.rope,
            c.hidden,
        )?,
        kv_a_norm: load_vector(ckpt, &format!("{a}kv_a_layernorm.weight"), c.kv_lora)?,
        // Whole, or split into k_b and v_b as GGUF conversions store it.
        kv_b: strata_weights::load_kv_b(ckpt, a.trim_end_matches('.'), c.n_heads, c.nope, c.v, c.kv_lora)?,
        o: load_linear(ckpt, &format!("{a}o_proj"), c.hidden, c.n_heads * c.v)?,
        gate: if c.mla_gate {
            Some(load_linear(
                ckpt,
                &format!("{a}g_proj"),
                c.n_heads * c.v,
                c.hidden,
            )?)
        } else {
            None
        },
        n_heads: c.n_heads,
        nope_dim: c.nope,
        rope_dim: c.rope,
        v_dim: c.v,
        kv_lora: c.kv_lora,
        softmax_scale: (qk as f32).powf(-0.5),
        rope: None,
        eps: c.latent_eps,
    })
}

fn res_mix(ckpt: &Checkpoint, base: &str, d: usize) -> Result<ResMix> {
    Ok(ResMix {
        norm: load_vector(ckpt, &format!("{base}_norm.weight"), d)?,
        proj: ckpt.read_f32(&format!("{base}_proj.weight"), &[1, d])?,
    })
}

/// Builds the hybrid decoder (Kimi Linear, or Kimi K3 when `c` has AttnRes).
pub(crate) fn load_hybrid(
    c: Config,
    names: &'static Names,
    info: ModelInfo,
    ckpt: &Checkpoint,
    loading: &Loading,
) -> Result<Box<dyn Model>> {
    let layout = c.expert_layout(names);
    let store = loading.experts.clone();
    let d = c.hidden;
    let c = Arc::new(c);
    let builder: BlockBuilder = {
        let c = c.clone();
        Arc::new(move |ckpt: &Checkpoint, l: usize| load_block(&c, names, ckpt, l, &store))
    };
    let layers = build_layers(ckpt, c.n_layers, loading, builder)?;
    let attn_res = match c.attn_res_block {
        Some(block_size) => Some(AttnRes {
            block_size,
            output: res_mix(ckpt, &format!("{}output_attn_res", names.model), d)?,
        }),
        None => None,
    };
    let embed: Linear = load_linear(ckpt, &format!("{}embed_tokens", names.model), c.vocab, d)?;
    let lm_head = load_linear(ckpt, names.head, c.vocab, d)?;
    Ok(Box::new(Decoder {
        info: ModelInfo {
            experts: Some(layout),
            ..info
        },
        embed,
        layers: layers.layers,
        states: layers.states,
        spine: layers.store,
        norm: load_vector(ckpt, &format!("{}norm.weight", names.model), d)?,
        lm_head,
        eps: c.eps,
        attn_res,
        gpu: Default::default(),
    }))
}

/// Decoder block `l`: KDA or MLA attention, then a dense MLP or (Latent)MoE, and AttnRes mixing.
fn load_block(
    c: &Config,
    names: &Names,
    ckpt: &Checkpoint,
    l: usize,
    store: &Arc<dyn ExpertStore>,
) -> Result<Block> {
    let d = c.hidden;
    let mlp = |base: &str, inter: usize| -> Result<Mlp> {
        Ok(Mlp {
            gate: load_linear(ckpt, &format!("{base}gate_proj"), inter, d)?,
            up: load_linear(ckpt, &format!("{base}up_proj"), inter, d)?,
            down: load_linear(ckpt, &format!("{base}down_proj"), d, inter)?,
            act: c.act,
        })
    };
    let p = format!("{}layers.{l}.", names.model);
    let a = format!("{p}self_attn.");
    let attn = match c.kinds[l] {
        LayerKind::Kda => Attention::Kda(Box::new(load_kda(ckpt, &a, c)?)),
        LayerKind::Mla => Attention::Mla(Box::new(load_mla(ckpt, &a, c)?)),
    };
    let ffn = if c.is_moe(l) {
        let b = format!("{p}block_sparse_moe.");
        let gate = format!("{b}gate");
        let latent = match c.latent {
            Some(r) => Some(LatentProj {
                down: load_linear(ckpt, &format!("{b}routed_expert_down_proj"), r, d)?,
                norm: if c.latent_norm {
                    Some(load_vector(ckpt, &format!("{b}routed_expert_norm.weight"), r)?)
                } else {
                    None
                },
                up: load_linear(ckpt, &format!("{b}routed_expert_up_proj"), d, r)?,
                eps: c.eps,
            }),
            None => None,
        };
        Ffn::Moe(MoeLayer {
            layer: l,
            router: Router {
                weight: load_linear(ckpt, &gate, c.n_routed, d)?,
                top_k: c.top_k,
                rule: RoutingRule::SigmoidGrouped {
                    correction_bias: load_vector(
                        ckpt,
                        &format!("{gate}.e_score_correction_bias"),
                        c.n_routed,
                    )?,
                    n_group: c.n_group,
                    topk_group: c.topk_group,
                    norm_topk_prob: c.renormalize,
                    routed_scaling_factor: c.routed_scaling,
                },
            },
            shared: if c.n_shared > 0 {
                Some(mlp(&format!("{b}shared_experts."), c.moe_inter * c.n_shared)?)
            } else {
                None
            },
            latent,
            shared_gate: None,
            act: c.act,
            store: store.clone(),
        })
    } else {
        Ffn::Dense(mlp(&format!("{p}mlp."), c.inter)?)
    };
    let res = match c.attn_res_block {
        Some(_) => Some(LayerRes {
            attn: res_mix(ckpt, &format!("{p}self_attention_res"), d)?,
            mlp: res_mix(ckpt, &format!("{p}mlp_res"), d)?,
        }),
        None => None,
    };
    Ok(Block {
        attn_norm: load_vector(ckpt, &format!("{p}input_layernorm.weight"), d)?,
        attn,
        ffn_norm: load_vector(ckpt, &format!("{p}post_attention_layernorm.weight"), d)?,
        ffn,
        res,
    })
}

fn model_info(cfg: &JsonConfig, c: &Config, family: &'static str, arch: &str) -> Result<ModelInfo> {
    Ok(ModelInfo {
        architecture: cfg.architecture().unwrap_or(arch).to_string(),
        model_type: cfg.opt_str("model_type")?.unwrap_or(family).to_string(),
        family,
        vocab_size: c.vocab,
        hidden_dim: c.hidden,
        n_layers: c.n_layers,
        max_positions: c.max_pos,
        experts: None,
    })
}

pub fn expert_layout(cfg: &JsonConfig) -> Result<ExpertLayout> {
    Ok(Config::read(cfg, None, false)?.expert_layout(&KIMI_LINEAR_NAMES))
}

pub fn summary(cfg: &JsonConfig) -> Result<ConfigSummary> {
    Ok(Config::read(cfg, None, false)?.summary())
}

pub fn inventory(cfg: &JsonConfig) -> Result<Vec<TensorDesc>> {
    Ok(Config::read(cfg, None, false)?.inventory(&KIMI_LINEAR_NAMES, false))
}

pub fn load(cfg: &JsonConfig, ckpt: &Checkpoint, loading: &Loading) -> Result<Box<dyn Model>> {
    let c = Config::read(cfg, None, false)?;
    let info = model_info(cfg, &c, "kimi_linear", "KimiLinearForCausalLM")?;
    load_hybrid(c, &KIMI_LINEAR_NAMES, info, ckpt, loading)
}

pub(crate) fn k3_model_info(root: &JsonConfig, c: &Config) -> Result<ModelInfo> {
    model_info(root, c, "kimi_k3", "KimiK3ForConditionalGeneration")
}
