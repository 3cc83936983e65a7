//! A GGUF model as the families read a Hugging Face folder: its metadata becomes the
//! `config.json` keys the family reads, and its tensors are indexed under the Hugging Face
//! names, with the byte ranges of the GGUF file. Experts stored as one `[n_expert, ...]` tensor
//! per layer and projection are indexed expert by expert (each a slice of that tensor), so the
//! expert store reads one expert with one read, as it does from safetensors.
//!
//! llama.cpp's converters keep the Qwen families' weights as Hugging Face stores them (rows
//! outermost; no permutation), so their bytes serve unchanged.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Map, Value as Json};

use crate::gguf::{GgmlType, Gguf, GgufTensor};
use crate::safetensors::TensorInfo;
use crate::{Checkpoint, DType, FormatError, JsonConfig, Result, TensorEntry};

/// The GGUF architectures strata maps to a family, with the family's `model_type`.
const ARCHITECTURES: &[(&str, &str, &str)] = &[("qwen3moe", "qwen3_moe", "Qwen3MoeForCausalLM")];

/// Opens a GGUF model: the config its family reads and its tensors under Hugging Face names.
pub fn open_gguf(path: &Path) -> Result<(JsonConfig, Checkpoint)> {
    let g = Gguf::open(path)?;
    let arch = g.architecture()?.to_string();
    let Some(&(_, model_type, class)) = ARCHITECTURES.iter().find(|(a, _, _)| *a == arch) else {
        let known: Vec<_> = ARCHITECTURES.iter().map(|(a, _, _)| *a).collect();
        return Err(g.key_error(
            "general.architecture",
            format!(
                "architecture `{arch}` is not supported (supported: {})",
                known.join(", ")
            ),
        ));
    };
    let tensors = index(&g)?;
    let config = config(&g, &arch, model_type, class, &tensors)?;
    let cfg = JsonConfig {
        path: path.to_path_buf(),
        value: config,
    };
    Ok((cfg, Checkpoint::from_index(path, &g.paths, tensors, gguf_name)?))
}

/// The storage dtype of a GGUF type the kernels read as they are.
fn dtype(ty: GgmlType) -> Option<DType> {
    match ty {
        GgmlType::F32 => Some(DType::F32),
        GgmlType::F16 => Some(DType::F16),
        GgmlType::BF16 => Some(DType::BF16),
        _ => None,
    }
}

/// The Hugging Face name of a per-layer GGUF tensor `blk.L.<stem>.<kind>`, or for the experts'
/// stacked tensors the projection's name (`mlp.experts.{E}.` goes before it).
enum Mapped {
    One(String),
    Experts(&'static str),
}

fn layer_tensor(stem: &str) -> Option<Mapped> {
    let one = |s: &str| Some(Mapped::One(s.to_string()));
    match stem {
        "attn_norm" => one("input_layernorm"),
        "attn_q" => one("self_attn.q_proj"),
        "attn_k" => one("self_attn.k_proj"),
        "attn_v" => one("self_attn.v_proj"),
        "attn_output" => one("self_attn.o_proj"),
        "attn_q_norm" => one("self_attn.q_norm"),
        "attn_k_norm" => one("self_attn.k_norm"),
        "ffn_norm" => one("post_attention_layernorm"),
        "ffn_gate_inp" => one("mlp.gate"),
        "ffn_gate" => one("mlp.gate_proj"),
        "ffn_up" => one("mlp.up_proj"),
        "ffn_down" => one("mlp.down_proj"),
        "ffn_gate_exps" => Some(Mapped::Experts("gate_proj")),
        "ffn_up_exps" => Some(Mapped::Experts("up_proj")),
        "ffn_down_exps" => Some(Mapped::Experts("down_proj")),
        _ => None,
    }
}

/// The GGUF name of a Hugging Face tensor name (`blk.L.ffn_gate_exps.weight, expert E` for an
/// expert's), for errors about tensors a GGUF file lacks.
fn gguf_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (base, kind) = rest.rsplit_once('.')?;
    if let Some(expert) = base.strip_prefix("mlp.experts.") {
        let (e, proj) = expert.split_once('.')?;
        let stem = ["gate_proj", "up_proj", "down_proj"]
            .iter()
            .position(|p| *p == proj)
            .map(|i| ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"][i])?;
        return Some(format!("blk.{layer}.{stem}.{kind}, expert {e}"));
    }
    const STEMS: &[&str] = &[
        "attn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "attn_q_norm",
        "attn_k_norm",
        "ffn_norm",
        "ffn_gate_inp",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ];
    let stem = STEMS
        .iter()
        .find(|s| matches!(layer_tensor(s), Some(Mapped::One(n)) if n == base))?;
    Some(format!("blk.{layer}.{stem}.{kind}"))
}

/// A Hugging Face tensor in a GGUF file: (name, shape, absolute offset, bytes).
type HfEntry = (String, Vec<usize>, u64, u64);

/// Hugging Face names of a GGUF tensor, each with its byte range (several for stacked experts).
fn hf_entries(t: &GgufTensor) -> Option<Vec<HfEntry>> {
    let whole = |name: &str| Some(vec![(name.to_string(), t.shape(), t.offset, t.len)]);
    match t.name.as_str() {
        "token_embd.weight" => return whole("model.embed_tokens.weight"),
        "output_norm.weight" => return whole("model.norm.weight"),
        "output.weight" => return whole("lm_head.weight"),
        _ => {}
    }
    let rest = t.name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (stem, kind) = rest.rsplit_once('.')?;
    let p = format!("model.layers.{layer}");
    match layer_tensor(stem)? {
        Mapped::One(name) => whole(&format!("{p}.{name}.{kind}")),
        Mapped::Experts(proj) => {
            let shape = t.shape();
            let (&n_expert, inner) = shape.split_first()?;
            if n_expert == 0 {
                return None;
            }
            let each = t.len / n_expert as u64;
            Some(
                (0..n_expert)
                    .map(|e| {
                        let name = format!("{p}.mlp.experts.{e}.{proj}.{kind}");
                        (name, inner.to_vec(), t.offset + e as u64 * each, each)
                    })
                    .collect(),
            )
        }
    }
}

fn index(g: &Gguf) -> Result<HashMap<String, TensorEntry>> {
    let mut out = HashMap::new();
    for t in &g.tensors {
        let Some(entries) = hf_entries(t) else {
            continue; // a tensor no family reads (e.g. precomputed rope frequencies)
        };
        let dtype = dtype(t.ty).ok_or_else(|| FormatError::BadTensor {
            path: g.paths[t.file].clone(),
            tensor: t.name.clone(),
            reason: format!(
                "weight type {} is not supported yet (supported: F32, F16, BF16)",
                t.ty
            ),
        })?;
        for (name, shape, offset, len) in entries {
            let info = TensorInfo {
                name: name.clone(),
                dtype,
                shape,
                offset,
                len,
            };
            out.insert(name, TensorEntry { shard: t.file, info });
        }
    }
    Ok(out)
}

/// The `config.json` keys of the family, from the GGUF metadata (`ARCH.block_count`, ...).
fn config(
    g: &Gguf,
    arch: &str,
    model_type: &str,
    class: &str,
    tensors: &HashMap<String, TensorEntry>,
) -> Result<Json> {
    let key = |k: &str| format!("{arch}.{k}");
    let embed = tensors
        .get("model.embed_tokens.weight")
        .ok_or_else(|| FormatError::MissingTensor {
            dir: g.paths[0].clone(),
            tensor: "token_embd.weight".into(),
            note: String::new(),
        })?;
    let vocab = embed.info.shape[0];
    let hidden = g.usize(&key("embedding_length"))?;
    let heads = g.usize(&key("attention.head_count"))?;
    let mut c = Map::new();
    c.insert("model_type".into(), json!(model_type));
    c.insert("architectures".into(), json!([class]));
    c.insert("vocab_size".into(), json!(vocab));
    c.insert("hidden_size".into(), json!(hidden));
    c.insert("num_hidden_layers".into(), json!(g.usize(&key("block_count"))?));
    c.insert("num_attention_heads".into(), json!(heads));
    let kv_heads = g.opt_usize(&key("attention.head_count_kv"))?.unwrap_or(heads);
    c.insert("num_key_value_heads".into(), json!(kv_heads));
    let head_dim = g
        .opt_usize(&key("attention.key_length"))?
        .unwrap_or(hidden / heads.max(1));
    c.insert("head_dim".into(), json!(head_dim));
    c.insert(
        "max_position_embeddings".into(),
        json!(g.usize(&key("context_length"))?),
    );
    c.insert(
        "intermediate_size".into(),
        json!(g.usize(&key("feed_forward_length"))?),
    );
    let eps = g
        .opt_f64(&key("attention.layer_norm_rms_epsilon"))?
        .unwrap_or(1e-6);
    c.insert("rms_norm_eps".into(), json!(eps));
    c.insert(
        "rope_theta".into(),
        json!(g.opt_f64(&key("rope.freq_base"))?.unwrap_or(10000.0)),
    );
    if let Some(scaling) = rope_scaling(g, arch)? {
        c.insert("rope_scaling".into(), scaling);
    }
    c.insert("num_experts".into(), json!(g.usize(&key("expert_count"))?));
    c.insert(
        "num_experts_per_tok".into(),
        json!(g.usize(&key("expert_used_count"))?),
    );
    c.insert(
        "moe_intermediate_size".into(),
        json!(g.usize(&key("expert_feed_forward_length"))?),
    );
    // llama.cpp's Qwen3-MoE always renormalises the chosen experts' weights.
    c.insert("norm_topk_prob".into(), json!(true));
    c.insert(
        "tie_word_embeddings".into(),
        json!(!tensors.contains_key("lm_head.weight")),
    );
    for (gguf_key, hf_key) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
    ] {
        if let Some(id) = g.opt_usize(gguf_key)? {
            c.insert(hf_key.into(), json!(id));
        }
    }
    Ok(Json::Object(c))
}

/// `rope_scaling` from `ARCH.rope.scaling.*` (none, or YaRN as the family reads it).
fn rope_scaling(g: &Gguf, arch: &str) -> Result<Option<Json>> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    match g.opt_str(&key("type"))? {
        None | Some("none") => Ok(None),
        Some("yarn") => {
            let factor = g.opt_f64(&key("factor"))?.unwrap_or(1.0);
            let original = g.usize(&key("original_context_length"))?;
            Ok(Some(json!({
                "rope_type": "yarn",
                "type": "yarn",
                "factor": factor,
                "original_max_position_embeddings": original,
            })))
        }
        Some(other) => Err(g.key_error(
            &key("type"),
            format!("rope scaling `{other}` is not supported (supported: yarn)"),
        )),
    }
}
