//! A GGUF model as the families read a Hugging Face folder: its metadata becomes the
//! `config.json` keys the family reads, and its tensors are indexed under the Hugging Face
//! names, with the byte ranges of the GGUF file. Experts stored as one `[n_expert, ...]` tensor
//! per layer and projection are indexed expert by expert (each a slice of that tensor), so the
//! expert store reads one expert with one read, as it does from safetensors.
//!
//! llama.cpp's converters keep the weights' bytes as Hugging Face stores them (rows outermost),
//! except Llama's q and k, whose rows they permute within each head (see [`Family::Mixtral`]).

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Map, Value as Json};

use crate::gguf::{GgmlType, Gguf, GgufTensor};
use crate::safetensors::TensorInfo;
use crate::{Checkpoint, DType, FormatError, JsonConfig, Result, TensorEntry};

/// The families a GGUF model maps to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Qwen3Moe,
    /// Qwen2-MoE: q/k/v biases, a shared expert scaled by its gate (`ffn_gate_inp_shexp`).
    Qwen2Moe,
    /// `llama` with experts. llama.cpp's converter permutes the rows of each head of q and k so
    /// that rotating adjacent pairs (its rope) equals Hugging Face's rotation of the two halves:
    /// the family reads those weights as they are, with the interleaved rope.
    Mixtral,
    /// DeepSeek-V3/R1, Kimi K2: MLA (`kv_b` whole, or split into `k_b` and `v_b` as newer
    /// conversions store it), sigmoid routing with the correction bias, shared experts.
    DeepSeek2,
    /// `llama` without experts: q and k permuted as for Mixtral.
    Llama,
    /// Dense `qwen2` (q/k/v biases) and `qwen3` (q/k norms): NeoX rotation, rows as stored.
    Qwen2,
    Qwen3,
    /// Kimi Linear: KDA and MLA layers (`crate::gguf_kimi_linear`).
    KimiLinear,
}

const SUPPORTED: &str =
    "qwen3moe, qwen2moe, deepseek2, kimi-linear, llama (dense, or with experts: Mixtral), qwen2, qwen3";

impl Family {
    fn of(g: &Gguf, arch: &str) -> Result<Family> {
        match arch {
            "qwen3moe" => Ok(Family::Qwen3Moe),
            "qwen2moe" => Ok(Family::Qwen2Moe),
            "deepseek2" => Ok(Family::DeepSeek2),
            "llama" if g.opt_usize("llama.expert_count")?.unwrap_or(0) > 0 => Ok(Family::Mixtral),
            "llama" => Ok(Family::Llama),
            "qwen2" => Ok(Family::Qwen2),
            "qwen3" => Ok(Family::Qwen3),
            "kimi-linear" => Ok(Family::KimiLinear),
            _ => Err(g.key_error(
                "general.architecture",
                format!("architecture `{arch}` is not supported (supported: {SUPPORTED})"),
            )),
        }
    }

    fn names(self) -> &'static Names {
        match self {
            Family::Qwen3Moe => &QWEN3MOE,
            Family::Qwen2Moe => &QWEN2MOE,
            Family::Mixtral => &MIXTRAL,
            Family::DeepSeek2 => &DEEPSEEK2,
            Family::KimiLinear => &KIMI_LINEAR,
            Family::Llama | Family::Qwen2 | Family::Qwen3 => &DENSE,
        }
    }

    /// (`model_type`, `architectures`) of its Hugging Face config.
    fn hf(self) -> (&'static str, &'static str) {
        match self {
            Family::Qwen3Moe => ("qwen3_moe", "Qwen3MoeForCausalLM"),
            Family::Qwen2Moe => ("qwen2_moe", "Qwen2MoeForCausalLM"),
            Family::Mixtral => ("mixtral", "MixtralForCausalLM"),
            Family::DeepSeek2 => ("deepseek_v3", "DeepseekV3ForCausalLM"),
            Family::Llama => ("llama", "LlamaForCausalLM"),
            Family::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
            Family::Qwen3 => ("qwen3", "Qwen3ForCausalLM"),
            Family::KimiLinear => ("kimi_linear", "KimiLinearForCausalLM"),
        }
    }

    /// Whether its layers have routed experts.
    fn moe(self) -> bool {
        matches!(
            self,
            Family::Qwen3Moe | Family::Qwen2Moe | Family::Mixtral | Family::DeepSeek2 | Family::KimiLinear
        )
    }
}

/// Opens a GGUF model: the config its family reads and its tensors under Hugging Face names.
pub fn open_gguf(path: &Path) -> Result<(JsonConfig, Checkpoint)> {
    let g = Gguf::open(path)?;
    let arch = g.architecture()?.to_string();
    let family = Family::of(&g, &arch)?;
    let names = family.names();
    let tensors = index(&g, names)?;
    let config = config(&g, &arch, family, &tensors)?;
    let cfg = JsonConfig {
        path: path.to_path_buf(),
        value: config,
    };
    let file_name = std::sync::Arc::new(move |hf: &str| names.gguf_name(hf));
    Ok((cfg, Checkpoint::from_index(path, &g.paths, tensors, file_name)?))
}

/// The storage dtype of a GGUF type the kernels read as they are.
fn dtype(ty: GgmlType) -> Option<DType> {
    match ty {
        GgmlType::F32 => Some(DType::F32),
        GgmlType::F16 => Some(DType::F16),
        GgmlType::BF16 => Some(DType::BF16),
        GgmlType::Q8_0 => Some(DType::Q8_0),
        t if GgmlType::KERNEL_BLOCKS.contains(&t) => Some(DType::Ggml(t)),
        _ => None,
    }
}

/// The names of every weight type a GGUF may hold for strata.
fn supported_types() -> String {
    let mut names = vec!["F32".to_string(), "F16".into(), "BF16".into(), "Q8_0".into()];
    names.extend(GgmlType::KERNEL_BLOCKS.iter().map(|t| t.name()));
    names.join(", ")
}

/// How an architecture's per-layer GGUF tensors (`blk.L.<stem>.<kind>`) are named in its
/// Hugging Face checkpoints: (stem, name after `model.layers.L.`) for single tensors, in parts
/// (a stem no file of the architecture holds does no harm), and for the experts' stacked
/// tensors (stem, the experts' prefix, the projection).
struct Names {
    one: &'static [&'static [(&'static str, &'static str)]],
    experts: &'static [(&'static str, &'static str, &'static str)],
}

/// The tensors of a GQA attention block, as Llama-style checkpoints name them.
const GQA: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
];

/// A dense feed-forward block and its norm.
const FFN: &[(&str, &str)] = &[
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// MLA's own tensors (DeepSeek-style; Kimi Linear's MLA layers).
const MLA: &[(&str, &str)] = &[
    ("attn_q_a", "self_attn.q_a_proj"),
    ("attn_q_a_norm", "self_attn.q_a_layernorm"),
    ("attn_q_b", "self_attn.q_b_proj"),
    ("attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"),
    ("attn_kv_a_norm", "self_attn.kv_a_layernorm"),
    ("attn_kv_b", "self_attn.kv_b_proj"),
    ("attn_k_b", "self_attn.k_b_proj"),
    ("attn_v_b", "self_attn.v_b_proj"),
];

/// Kimi Linear's KDA tensors named by stem (llama.cpp's `ssm_*`).
const KDA: &[(&str, &str)] = &[
    ("ssm_conv1d_q", "self_attn.q_conv1d"),
    ("ssm_conv1d_k", "self_attn.k_conv1d"),
    ("ssm_conv1d_v", "self_attn.v_conv1d"),
    ("ssm_f_a", "self_attn.f_a_proj"),
    ("ssm_f_b", "self_attn.f_b_proj"),
    ("ssm_beta", "self_attn.b_proj"),
    ("ssm_g_a", "self_attn.g_a_proj"),
    ("ssm_g_b", "self_attn.g_b_proj"),
    ("ssm_norm", "self_attn.o_norm"),
];

/// Stacked experts as `mlp.experts.E.{gate,up,down}_proj`.
const MLP_EXPERTS: &[(&str, &str, &str)] = &[
    ("ffn_gate_exps", "mlp.experts", "gate_proj"),
    ("ffn_up_exps", "mlp.experts", "up_proj"),
    ("ffn_down_exps", "mlp.experts", "down_proj"),
];

/// Stacked experts as `block_sparse_moe.experts.E.w{1,3,2}` (Mixtral, Kimi Linear).
const W123_EXPERTS: &[(&str, &str, &str)] = &[
    ("ffn_gate_exps", "block_sparse_moe.experts", "w1"),
    ("ffn_up_exps", "block_sparse_moe.experts", "w3"),
    ("ffn_down_exps", "block_sparse_moe.experts", "w2"),
];

const QWEN3MOE: Names = Names {
    one: &[GQA, FFN],
    experts: MLP_EXPERTS,
};

const QWEN2MOE: Names = Names {
    one: &[
        GQA,
        FFN,
        &[
            ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
            ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
            ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
            ("ffn_gate_inp_shexp", "mlp.shared_expert_gate"),
        ],
    ],
    experts: MLP_EXPERTS,
};

const MIXTRAL: Names = Names {
    one: &[GQA, FFN],
    experts: W123_EXPERTS,
};

const DENSE: Names = Names {
    one: &[GQA, FFN],
    experts: &[],
};

const DEEPSEEK2: Names = Names {
    one: &[
        GQA,
        MLA,
        FFN,
        &[
            ("ffn_gate_shexp", "mlp.shared_experts.gate_proj"),
            ("ffn_up_shexp", "mlp.shared_experts.up_proj"),
            ("ffn_down_shexp", "mlp.shared_experts.down_proj"),
        ],
    ],
    experts: MLP_EXPERTS,
};

const KIMI_LINEAR: Names = Names {
    one: &[
        GQA,
        KDA,
        MLA,
        FFN,
        &[
            ("ffn_gate_shexp", "block_sparse_moe.shared_experts.gate_proj"),
            ("ffn_up_shexp", "block_sparse_moe.shared_experts.up_proj"),
            ("ffn_down_shexp", "block_sparse_moe.shared_experts.down_proj"),
        ],
    ],
    experts: W123_EXPERTS,
};

/// Kimi Linear's KDA tensors whose GGUF names have no Hugging Face twin by stem:
/// (`blk.L.` name, name after `model.layers.L.`). `ssm_a` is -exp(A_log), a name of its own.
const KDA_ODD: &[(&str, &str)] = &[("ssm_a", "self_attn.A"), ("ssm_dt.bias", "self_attn.dt_bias")];

/// `blk.L.exp_probs_b.bias`, the routing's correction bias: its GGUF name, and its Hugging Face
/// name after the router's.
const CORRECTION_BIAS: (&str, &str) = ("exp_probs_b.bias", "e_score_correction_bias");

/// The router, whose Hugging Face name differs between families.
fn router(names: &Names) -> &'static str {
    match names.experts.first().map_or("", |e| e.1) {
        "block_sparse_moe.experts" => "block_sparse_moe.gate",
        _ => "mlp.gate",
    }
}

/// The stem of the end tensors (outside the layers) by Hugging Face name.
const ENDS: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

impl Names {
    /// The Hugging Face name of `blk.L.<stem>` (single tensors).
    fn one(&self, stem: &str) -> Option<&'static str> {
        if stem == "ffn_gate_inp" {
            return Some(router(self));
        }
        self.one
            .iter()
            .flat_map(|part| part.iter())
            .find(|(s, _)| *s == stem)
            .map(|(_, h)| *h)
    }

    /// The GGUF name of a Hugging Face tensor name (`blk.L.ffn_gate_exps.weight, expert E` for
    /// an expert's), for errors about tensors a GGUF file lacks.
    fn gguf_name(&self, hf: &str) -> Option<String> {
        if let Some((g, _)) = ENDS.iter().find(|(_, h)| *h == hf) {
            return Some(g.to_string());
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        if rest == format!("{}.{}", router(self), CORRECTION_BIAS.1) {
            return Some(format!("blk.{layer}.{}", CORRECTION_BIAS.0));
        }
        if let Some((g, _)) = KDA_ODD.iter().find(|(_, h)| *h == rest) {
            return Some(format!("blk.{layer}.{g}"));
        }
        let (base, kind) = rest.rsplit_once('.')?;
        for (stem, prefix, proj) in self.experts {
            if let Some((e, p)) = base
                .strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('.')?.split_once('.'))
            {
                if p == *proj {
                    return Some(format!("blk.{layer}.{stem}.{kind}, expert {e}"));
                }
            }
        }
        if base == router(self) {
            return Some(format!("blk.{layer}.ffn_gate_inp.{kind}"));
        }
        let (stem, _) = self
            .one
            .iter()
            .flat_map(|part| part.iter())
            .find(|(_, h)| *h == base)?;
        Some(format!("blk.{layer}.{stem}.{kind}"))
    }
}

/// A Hugging Face tensor in a GGUF file: (name, shape, absolute offset, bytes).
type HfEntry = (String, Vec<usize>, u64, u64);

/// Hugging Face names of a GGUF tensor, each with its byte range (several for stacked experts).
fn hf_entries(names: &Names, t: &GgufTensor) -> Option<Vec<HfEntry>> {
    let whole = |name: &str| Some(vec![(name.to_string(), t.shape(), t.offset, t.len)]);
    if let Some((_, hf)) = ENDS.iter().find(|(g, _)| *g == t.name) {
        return whole(hf);
    }
    let rest = t.name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let p = format!("model.layers.{layer}");
    if rest == CORRECTION_BIAS.0 {
        return whole(&format!("{p}.{}.{}", router(names), CORRECTION_BIAS.1));
    }
    if let Some((_, hf)) = KDA_ODD.iter().find(|(g, _)| *g == rest) {
        return whole(&format!("{p}.{hf}"));
    }
    let (stem, kind) = rest.rsplit_once('.')?;
    if let Some(hf) = names.one(stem) {
        let name = format!("{p}.{hf}.{kind}");
        if hf.ends_with("_conv1d") {
            // llama.cpp's [1, C, 1, K] (or [C, 1, K]) taps as Hugging Face's [C, 1, K].
            let shape = t.shape();
            let taps = *shape.last()?;
            let channels = shape.iter().product::<usize>() / taps.max(1);
            return Some(vec![(name, vec![channels, 1, taps], t.offset, t.len)]);
        }
        if hf == "mlp.shared_expert_gate" && t.dims.len() == 1 {
            // llama.cpp stores this (1, D) gate as a vector.
            return Some(vec![(name, vec![1, t.shape()[0]], t.offset, t.len)]);
        }
        return whole(&name);
    }
    let (_, prefix, proj) = names.experts.iter().find(|(s, _, _)| *s == stem)?;
    let shape = t.shape();
    let (&n_expert, inner) = shape.split_first()?;
    if n_expert == 0 {
        return None;
    }
    let each = t.len / n_expert as u64;
    Some(
        (0..n_expert)
            .map(|e| {
                let name = format!("{p}.{prefix}.{e}.{proj}.{kind}");
                (name, inner.to_vec(), t.offset + e as u64 * each, each)
            })
            .collect(),
    )
}

fn index(g: &Gguf, names: &Names) -> Result<HashMap<String, TensorEntry>> {
    let mut out = HashMap::new();
    for t in &g.tensors {
        let Some(entries) = hf_entries(names, t) else {
            continue; // a tensor no family reads (e.g. precomputed rope frequencies)
        };
        let dtype = dtype(t.ty).ok_or_else(|| FormatError::BadTensor {
            path: g.paths[t.file].clone(),
            tensor: t.name.clone(),
            reason: format!(
                "weight type {} is not supported yet (supported: {})",
                t.ty,
                supported_types()
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
fn config(g: &Gguf, arch: &str, family: Family, tensors: &HashMap<String, TensorEntry>) -> Result<Json> {
    let key = |k: &str| format!("{arch}.{k}");
    let embed = tensors
        .get("model.embed_tokens.weight")
        .ok_or_else(|| FormatError::MissingTensor {
            dir: g.paths[0].clone(),
            tensor: "token_embd.weight".into(),
            note: String::new(),
        })?;
    let hidden = g.usize(&key("embedding_length"))?;
    let heads = g.usize(&key("attention.head_count"))?;
    let (model_type, class) = family.hf();
    let mut c = Map::new();
    let mut set = |k: &str, v: Json| {
        c.insert(k.to_string(), v);
    };
    set("model_type", json!(model_type));
    set("architectures", json!([class]));
    set("vocab_size", json!(embed.info.shape[0]));
    set("hidden_size", json!(hidden));
    set("num_hidden_layers", json!(g.usize(&key("block_count"))?));
    set("num_attention_heads", json!(heads));
    if family != Family::KimiLinear {
        // (Kimi Linear's is one count per layer: its layers' kinds.)
        let kv_heads = g.opt_usize(&key("attention.head_count_kv"))?.unwrap_or(heads);
        set("num_key_value_heads", json!(kv_heads));
    }
    let head_dim = g.opt_usize(&key("attention.key_length"))?;
    set("head_dim", json!(head_dim.unwrap_or(hidden / heads.max(1))));
    set("max_position_embeddings", json!(g.usize(&key("context_length"))?));
    set("intermediate_size", json!(g.usize(&key("feed_forward_length"))?));
    let eps = g.opt_f64(&key("attention.layer_norm_rms_epsilon"))?;
    set("rms_norm_eps", json!(eps.unwrap_or(1e-6)));
    let theta = g.opt_f64(&key("rope.freq_base"))?;
    set("rope_theta", json!(theta.unwrap_or(10000.0)));
    if let Some(scaling) = rope_scaling(g, arch)? {
        set("rope_scaling", scaling);
    }
    if let Some(factors) = rope_freqs(g)? {
        set("rope_scaling", factors);
    }
    if !family.moe() {
        // Qwen2's q/k/v biases are implied by its architecture; the others' are in the file.
        let has = |t: &str| tensors.contains_key(&format!("model.layers.0.self_attn.{t}.bias"));
        set("attention_bias", json!(has("o_proj")));
        set("qkv_bias", json!(has("q_proj")));
        if family == Family::Llama {
            set("rope_interleaved", json!(true));
        }
        set(
            "tie_word_embeddings",
            json!(!tensors.contains_key("lm_head.weight")),
        );
        bos_eos(g, &mut c)?;
        return Ok(Json::Object(c));
    }
    let experts = g.usize(&key("expert_count"))?;
    set("num_experts_per_tok", json!(g.usize(&key("expert_used_count"))?));
    match family {
        Family::Qwen3Moe => {
            set("num_experts", json!(experts));
            let moe_ffn = g.usize(&key("expert_feed_forward_length"))?;
            set("moe_intermediate_size", json!(moe_ffn));
            // llama.cpp's Qwen3-MoE always renormalises the chosen experts' weights.
            set("norm_topk_prob", json!(true));
        }
        Family::Qwen2Moe => {
            set("num_experts", json!(experts));
            set(
                "moe_intermediate_size",
                json!(g.usize(&key("expert_feed_forward_length"))?),
            );
            let shared = g.opt_usize(&key("expert_shared_feed_forward_length"))?;
            set("shared_expert_intermediate_size", json!(shared.unwrap_or(0)));
            // llama.cpp's Qwen2-MoE never renormalises them.
            set("norm_topk_prob", json!(false));
            set(
                "qkv_bias",
                json!(tensors.contains_key("model.layers.0.self_attn.q_proj.bias")),
            );
        }
        Family::Mixtral => {
            set("num_local_experts", json!(experts));
            set("rope_interleaved", json!(true));
        }
        Family::DeepSeek2 => {
            for (k, v) in deepseek2(g, arch, experts, tensors)? {
                set(k, v);
            }
        }
        Family::KimiLinear => {
            for (k, v) in crate::gguf_kimi_linear::config(g, arch, tensors)? {
                set(k, v);
            }
        }
        Family::Llama | Family::Qwen2 | Family::Qwen3 => unreachable!("dense families return above"),
    }
    set(
        "tie_word_embeddings",
        json!(!tensors.contains_key("lm_head.weight")),
    );
    bos_eos(g, &mut c)?;
    Ok(Json::Object(c))
}

/// `bos_token_id` and `eos_token_id` from the tokenizer's keys.
fn bos_eos(g: &Gguf, c: &mut Map<String, Json>) -> Result<()> {
    for (gguf_key, hf_key) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
    ] {
        if let Some(id) = g.opt_usize(gguf_key)? {
            c.insert(hf_key.to_string(), json!(id));
        }
    }
    Ok(())
}

/// The per-frequency divisors of a `rope_freqs` tensor (Llama 3's scaling as llama.cpp's
/// converter stores it), as the `rope_scaling` the families read.
fn rope_freqs(g: &Gguf) -> Result<Option<Json>> {
    let Some(t) = g.tensors.iter().find(|t| t.name == "rope_freqs.weight") else {
        return Ok(None);
    };
    let bad = |reason: String| FormatError::BadTensor {
        path: g.paths[t.file].clone(),
        tensor: t.name.clone(),
        reason,
    };
    if t.ty != GgmlType::F32 || t.len != t.numel() * 4 || t.numel() > 1 << 16 {
        return Err(bad(format!(
            "expected at most 65536 F32 values, found type {} ({} bytes)",
            t.ty, t.len
        )));
    }
    let bytes = crate::gguf::read_at(&g.paths[t.file], t.offset, t.len as usize)?;
    let factors: Vec<f64> = (bytes.chunks_exact(4))
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64)
        .collect();
    if factors.iter().any(|f| !f.is_finite() || *f <= 0.0) {
        return Err(bad("a frequency factor that is not a positive number".into()));
    }
    Ok(Some(json!({"rope_type": "freq_factors", "factors": factors})))
}

/// DeepSeek-V3's own keys: MLA's ranks and head sizes, the routing.
fn deepseek2(
    g: &Gguf,
    arch: &str,
    experts: usize,
    tensors: &HashMap<String, TensorEntry>,
) -> Result<Vec<(&'static str, Json)>> {
    let key = |k: &str| format!("{arch}.{k}");
    let rope = g.usize(&key("rope.dimension_count"))?;
    // Newer conversions give the latent sizes in `key_length`/`value_length` and the heads' in
    // the `_mla` keys; older ones the heads' in `key_length`/`value_length`.
    let qk = match g.opt_usize(&key("attention.key_length_mla"))? {
        Some(n) => n,
        None => g.usize(&key("attention.key_length"))?,
    };
    let v = match g.opt_usize(&key("attention.value_length_mla"))? {
        Some(n) => n,
        None => g.usize(&key("attention.value_length"))?,
    };
    if qk <= rope {
        return Err(g.key_error(
            &key("attention.key_length_mla"),
            format!("{qk} leaves no room beside the {rope} rotary dims"),
        ));
    }
    let scoring = match g.opt_usize(&key("expert_gating_func"))? {
        None | Some(1) => "softmax",
        Some(2) => "sigmoid",
        Some(n) => {
            return Err(g.key_error(&key("expert_gating_func"), format!("unknown gating function {n}")))
        }
    };
    let biased = tensors.keys().any(|k| k.ends_with(CORRECTION_BIAS.1));
    let q_lora = g.opt_usize(&key("attention.q_lora_rank"))?.filter(|&r| r > 0);
    let mut out = vec![
        ("q_lora_rank", json!(q_lora)),
        ("kv_lora_rank", json!(g.usize(&key("attention.kv_lora_rank"))?)),
        ("qk_nope_head_dim", json!(qk - rope)),
        ("qk_rope_head_dim", json!(rope)),
        ("v_head_dim", json!(v)),
        ("n_routed_experts", json!(experts)),
        (
            "moe_intermediate_size",
            json!(g.usize(&key("expert_feed_forward_length"))?),
        ),
        (
            "n_shared_experts",
            json!(g.opt_usize(&key("expert_shared_count"))?.unwrap_or(0)),
        ),
        (
            "first_k_dense_replace",
            json!(g.opt_usize(&key("leading_dense_block_count"))?.unwrap_or(0)),
        ),
        (
            "routed_scaling_factor",
            json!(g.opt_f64(&key("expert_weights_scale"))?.unwrap_or(1.0)),
        ),
        (
            "n_group",
            json!(g.opt_usize(&key("expert_group_count"))?.unwrap_or(1)),
        ),
        (
            "topk_group",
            json!(g.opt_usize(&key("expert_group_used_count"))?.unwrap_or(1)),
        ),
        ("scoring_func", json!(scoring)),
        ("topk_method", json!(if biased { "noaux_tc" } else { "greedy" })),
    ];
    let norm = g
        .get(&key("expert_weights_norm"))
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    out.push(("norm_topk_prob", json!(norm)));
    Ok(out)
}

/// `rope_scaling` from `ARCH.rope.scaling.*` (none, or YaRN as the family reads it).
fn rope_scaling(g: &Gguf, arch: &str) -> Result<Option<Json>> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    match g.opt_str(&key("type"))? {
        None | Some("none") => Ok(None),
        Some("yarn") => {
            let factor = g.opt_f64(&key("factor"))?.unwrap_or(1.0);
            let original = g.usize(&key("original_context_length"))?;
            let mut yarn = json!({
                "rope_type": "yarn",
                "type": "yarn",
                "factor": factor,
                "original_max_position_embeddings": original,
            });
            // llama.cpp's converter writes DeepSeek's mscale_all_dim as 0.1 x it (mscale alike).
            if let Some(log_mul) = g.opt_f64(&key("yarn_log_multiplier"))? {
                // In f32, as it was stored: 0.1 x 1.0 comes back as exactly 1.0.
                let mscale = (log_mul as f32 / 0.1f32) as f64;
                yarn["mscale"] = json!(mscale);
                yarn["mscale_all_dim"] = json!(mscale);
            }
            for (gguf_key, hf_key) in [("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")] {
                if let Some(b) = g.opt_f64(&key(gguf_key))? {
                    yarn[hf_key] = json!(b);
                }
            }
            Ok(Some(yarn))
        }
        Some("linear") => {
            let factor = g.opt_f64(&key("factor"))?.unwrap_or(1.0);
            Ok(Some(
                json!({"rope_type": "linear", "type": "linear", "factor": factor}),
            ))
        }
        Some(other) => Err(g.key_error(
            &key("type"),
            format!("rope scaling `{other}` is not supported (supported: yarn, linear)"),
        )),
    }
}
