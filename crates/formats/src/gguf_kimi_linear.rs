//! Kimi Linear (`kimi-linear`) from GGUF, as llama.cpp's converter writes it: a layer's KV head
//! count says its kind (0: KDA, else MLA), the KDA sizes sit under `ssm.conv_kernel` and
//! `kda.head_dim`, the MLA sizes as for `deepseek2`, and the KDA tensors under `ssm_*` names.
//! Three of those tensors differ from the Hugging Face checkpoint: `ssm_a` holds -exp(A_log)
//! (indexed as `self_attn.A`, which the family reads as the negated decay rates), `ssm_dt.bias`
//! is `dt_bias`, and the convolution taps are `[1, C, 1, K]` (indexed as `[C, 1, K]`, the same
//! bytes).

use std::collections::HashMap;

use serde_json::{json, Value as Json};

use crate::gguf::Gguf;
use crate::{Result, TensorEntry};

/// Kimi Linear's own keys of its Hugging Face config, from the GGUF metadata (the caller sets
/// those every family shares: sizes, eps, vocabulary).
pub(crate) fn config(
    g: &Gguf,
    arch: &str,
    tensors: &HashMap<String, TensorEntry>,
) -> Result<Vec<(&'static str, Json)>> {
    let key = |k: &str| format!("{arch}.{k}");
    let layers = g.usize(&key("block_count"))?;
    let kv_key = key("attention.head_count_kv");
    let kv_heads = g
        .get(&kv_key)
        .and_then(|v| v.as_array())
        .ok_or_else(|| g.key_error(&kv_key, "expected an array: one KV head count per layer (0: KDA)"))?;
    if kv_heads.len() != layers {
        return Err(g.key_error(&kv_key, format!("{} entries for {layers} layers", kv_heads.len())));
    }
    let (mut kda, mut full) = (Vec::new(), Vec::new());
    for (i, v) in kv_heads.iter().enumerate() {
        match v.as_u64() {
            Some(0) => kda.push(i + 1),
            Some(_) => full.push(i + 1),
            None => return Err(g.key_error(&kv_key, format!("entry {i} is not a non-negative integer"))),
        }
    }
    let head_dim = g.usize(&key("kda.head_dim"))?;
    let kda_heads = kda_heads(g, tensors, &kda)?;
    let mut out = Vec::new();
    let mut set = |k: &'static str, v: Json| out.push((k, v));
    set(
        "linear_attn_config",
        json!({
            "kda_layers": kda,
            "full_attn_layers": full,
            "head_dim": head_dim,
            "num_heads": kda_heads,
            "short_conv_kernel_size": g.usize(&key("ssm.conv_kernel"))?,
        }),
    );
    let rope = g.usize(&key("rope.dimension_count"))?;
    let qk = g.usize(&key("attention.key_length_mla"))?;
    if qk < rope {
        return Err(g.key_error(
            &key("attention.key_length_mla"),
            format!("{qk} is less than the {rope} rotary dims"),
        ));
    }
    let q_lora = g.opt_usize(&key("attention.q_lora_rank"))?.filter(|&r| r > 0);
    set("q_lora_rank", json!(q_lora));
    set("kv_lora_rank", json!(g.usize(&key("attention.kv_lora_rank"))?));
    set("qk_nope_head_dim", json!(qk - rope));
    set("qk_rope_head_dim", json!(rope));
    set("v_head_dim", json!(g.usize(&key("attention.value_length_mla"))?));
    set("mla_use_nope", json!(true));
    set("num_experts", json!(g.usize(&key("expert_count"))?));
    set(
        "num_experts_per_token",
        json!(g.usize(&key("expert_used_count"))?),
    );
    let moe_ffn = g.usize(&key("expert_feed_forward_length"))?;
    set("moe_intermediate_size", json!(moe_ffn));
    let shared = g.opt_usize(&key("expert_shared_count"))?.unwrap_or(0);
    set("num_shared_experts", json!(shared));
    let dense = g.opt_usize(&key("leading_dense_block_count"))?.unwrap_or(0);
    set("first_k_dense_replace", json!(dense));
    let scale = g.opt_f64(&key("expert_weights_scale"))?.unwrap_or(1.0);
    set("routed_scaling_factor", json!(scale));
    set(
        "num_expert_group",
        json!(g.opt_usize(&key("expert_group_count"))?.unwrap_or(1)),
    );
    set(
        "topk_group",
        json!(g.opt_usize(&key("expert_group_used_count"))?.unwrap_or(1)),
    );
    // llama.cpp's Kimi Linear always renormalises the chosen experts' weights.
    set("moe_renormalize", json!(true));
    match g.opt_usize(&key("expert_gating_func"))? {
        None | Some(2) => set("moe_router_activation_func", json!("sigmoid")),
        Some(n) => {
            return Err(g.key_error(
                &key("expert_gating_func"),
                format!("gating function {n}: Kimi Linear routes with a sigmoid (2)"),
            ))
        }
    }
    Ok(out)
}

/// The KDA head count: the rows of the first KDA layer's `b_proj` (`ssm_beta`), one per head.
/// llama.cpp takes `head_count`, which real checkpoints give both attention kinds alike.
fn kda_heads(g: &Gguf, tensors: &HashMap<String, TensorEntry>, kda: &[usize]) -> Result<usize> {
    let Some(first) = kda.first() else {
        return g.usize(&format!("{}.attention.head_count", g.architecture()?));
    };
    let name = format!("model.layers.{}.self_attn.b_proj.weight", first - 1);
    match tensors.get(&name).map(|t| t.info.shape.as_slice()) {
        Some(&[heads, _]) => Ok(heads),
        _ => Err(crate::FormatError::MissingTensor {
            dir: g.paths[0].clone(),
            tensor: format!("blk.{}.ssm_beta.weight", first - 1),
            note: " (a KDA layer's [heads, hidden] beta projection)".into(),
        }),
    }
}
