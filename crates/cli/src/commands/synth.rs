//! `strata synth` (hidden; a project tool): writes a large random checkpoint with a real model's
//! shapes and formats (Kimi K2 or DeepSeek-V3 numbers with experts as INT4 pack-quantized, FP8
//! block-scaled or BF16; Kimi K3 numbers with MXFP4 experts, its tensor list taken from the
//! family's own inventory; Qwen3-30B-A3B numbers in BF16), fewer layers, straight to disk in bounded memory, for benchmarks and
//! tests of the streaming path on models larger than RAM. The weights are noise.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    KimiK2,
    DeepseekV3,
    /// Kimi K3 (MXFP4 experts; --expert-format is ignored).
    KimiK3,
    /// Qwen3-30B-A3B's numbers (BF16 throughout; --expert-format is ignored).
    Qwen3Moe,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExpertFormat {
    Int4,
    Fp8,
    Bf16,
}

#[derive(clap::Args)]
pub struct SynthArgs {
    /// Output folder (created; must not hold a checkpoint already).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Whose shapes to use.
    #[arg(long, value_enum, default_value_t = Preset::KimiK2)]
    preset: Preset,
    /// Decoder layers (the preset's first dense layers come first).
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Routed experts per MoE layer (default: the preset's).
    #[arg(long)]
    experts: Option<usize>,
    /// Storage format of the routed experts.
    #[arg(long, value_enum, default_value_t = ExpertFormat::Int4)]
    expert_format: ExpertFormat,
    /// Vocabulary size (default: the preset's; smaller keeps embeddings small).
    #[arg(long)]
    vocab: Option<usize>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

struct Tensor {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    fill: Fill,
}

#[derive(Clone, Copy)]
enum Fill {
    /// BF16 uniform in [-a, a].
    Bf16(f32),
    /// BF16 ones.
    Ones,
    /// F32 zeros.
    Zeros,
    /// Random bytes (INT4 words: every nibble is valid).
    Bytes,
    /// FP8 E4M3 codes without NaN.
    Fp8,
    /// F32 constant.
    F32(f32),
    /// I64 values.
    Shape(i64, i64),
    /// F32 uniform in [-a, a].
    F32Rand(f32),
    /// One constant byte (MXFP4 E8M0 scales).
    Byte(u8),
}

impl Tensor {
    fn bytes(&self) -> u64 {
        let size = match self.dtype {
            "BF16" => 2,
            "F32" | "I32" => 4,
            "I64" => 8,
            _ => 1,
        };
        self.shape.iter().product::<usize>() as u64 * size
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn write_tensor(w: &mut impl Write, t: &Tensor, rng: &mut Rng) -> std::io::Result<()> {
    let total = t.bytes() as usize;
    let mut buf = Vec::with_capacity(1 << 20);
    let mut done = 0;
    while done < total {
        buf.clear();
        let n = (total - done).min(1 << 20);
        match t.fill {
            Fill::Bf16(a) => {
                for _ in 0..n / 2 {
                    let u = (rng.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                    buf.extend_from_slice(&((u * a).to_bits() >> 16).to_le_bytes()[..2]);
                }
            }
            Fill::Ones => (0..n / 2).for_each(|_| buf.extend_from_slice(&0x3f80u16.to_le_bytes())),
            Fill::Zeros => buf.resize(n, 0),
            Fill::Bytes => {
                for _ in 0..n / 8 {
                    buf.extend_from_slice(&rng.next().to_le_bytes());
                }
                buf.resize(n, 0);
            }
            Fill::Fp8 => {
                for _ in 0..n / 8 {
                    // Clear one exponent bit so no byte is a NaN (0x7f / 0xff) and values stay small.
                    let v = rng.next() & 0xbfbf_bfbf_bfbf_bfbf;
                    buf.extend_from_slice(&v.to_le_bytes());
                }
                buf.resize(n, 0);
            }
            Fill::F32(v) => (0..n / 4).for_each(|_| buf.extend_from_slice(&v.to_le_bytes())),
            Fill::F32Rand(a) => {
                for _ in 0..n / 4 {
                    let u = (rng.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                    buf.extend_from_slice(&(u * a).to_le_bytes());
                }
            }
            Fill::Byte(b) => buf.resize(n, b),
            Fill::Shape(a, b) => {
                buf.extend_from_slice(&a.to_le_bytes());
                buf.extend_from_slice(&b.to_le_bytes());
            }
        }
        w.write_all(&buf)?;
        done += n;
    }
    Ok(())
}

fn write_shard(path: &Path, tensors: &[Tensor], seed: u64) -> Result<()> {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for t in tensors {
        let end = offset + t.bytes();
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut json_bytes = serde_json::to_vec(&header)?;
    // Pad the header so the data section starts 8-byte aligned, as writers do.
    while !(8 + json_bytes.len()).is_multiple_of(8) {
        json_bytes.push(b' ');
    }
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = BufWriter::with_capacity(8 << 20, file);
    w.write_all(&(json_bytes.len() as u64).to_le_bytes())?;
    w.write_all(&json_bytes)?;
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    for t in tensors {
        write_tensor(&mut w, t, &mut rng)?;
    }
    w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(())
}

/// A SwiGLU MLP's three projections under `base`.
/// `out` created for a new checkpoint (refused when it holds one).
fn create_out(out: &Path) -> Result<()> {
    if out.join("config.json").exists() {
        bail!("{} already holds a model", out.display());
    }
    Ok(std::fs::create_dir_all(out)?)
}

/// A BF16 tensor uniform in +-0.02 sqrt(3) (a standard deviation of 0.02).
fn bf16(name: String, shape: Vec<usize>) -> Tensor {
    Tensor {
        name,
        dtype: "BF16",
        shape,
        fill: Fill::Bf16(0.02 * 3f32.sqrt()),
    }
}

/// A BF16 vector of ones (a norm's weight).
fn ones(name: String, n: usize) -> Tensor {
    Tensor {
        name,
        dtype: "BF16",
        shape: vec![n],
        fill: Fill::Ones,
    }
}

/// A decoder layer's two norms (before attention, before the MLP), under `prefix`.
fn layer_norms(prefix: &str, hidden: usize) -> Vec<Tensor> {
    vec![
        ones(format!("{prefix}.input_layernorm.weight"), hidden),
        ones(format!("{prefix}.post_attention_layernorm.weight"), hidden),
    ]
}

/// The embedding, final norm and head.
fn head_shard(vocab: usize, hidden: usize) -> Vec<Tensor> {
    vec![
        bf16("model.embed_tokens.weight".into(), vec![vocab, hidden]),
        ones("model.norm.weight".into(), hidden),
        bf16("lm_head.weight".into(), vec![vocab, hidden]),
    ]
}

/// `config.json` and a `generation_config.json` naming tokens 0 and 1 BOS and EOS.
fn write_config(out: &Path, config: &serde_json::Value) -> Result<()> {
    std::fs::write(out.join("config.json"), serde_json::to_string_pretty(config)?)?;
    std::fs::write(
        out.join("generation_config.json"),
        r#"{"bos_token_id": 0, "eos_token_id": 1}"#,
    )?;
    Ok(())
}

fn mlp(out: &mut Vec<Tensor>, base: &str, inter: usize, hidden: usize, format: ExpertFormat) {
    linear(out, &format!("{base}.gate_proj"), inter, hidden, format);
    linear(out, &format!("{base}.up_proj"), inter, hidden, format);
    linear(out, &format!("{base}.down_proj"), hidden, inter, format);
}

fn linear(out: &mut Vec<Tensor>, base: &str, rows: usize, cols: usize, format: ExpertFormat) {
    let std_uniform = 0.02 * 3f32.sqrt();
    match format {
        ExpertFormat::Bf16 => out.push(Tensor {
            name: format!("{base}.weight"),
            dtype: "BF16",
            shape: vec![rows, cols],
            fill: Fill::Bf16(std_uniform),
        }),
        ExpertFormat::Int4 => {
            out.push(Tensor {
                name: format!("{base}.weight_packed"),
                dtype: "I32",
                shape: vec![rows, cols.div_ceil(8)],
                fill: Fill::Bytes,
            });
            out.push(Tensor {
                name: format!("{base}.weight_scale"),
                dtype: "BF16",
                shape: vec![rows, cols.div_ceil(32)],
                fill: Fill::Bf16(0.008),
            });
            out.push(Tensor {
                name: format!("{base}.weight_shape"),
                dtype: "I64",
                shape: vec![2],
                fill: Fill::Shape(rows as i64, cols as i64),
            });
        }
        ExpertFormat::Fp8 => {
            out.push(Tensor {
                name: format!("{base}.weight"),
                dtype: "F8_E4M3",
                shape: vec![rows, cols],
                fill: Fill::Fp8,
            });
            out.push(Tensor {
                name: format!("{base}.weight_scale_inv"),
                dtype: "F32",
                shape: vec![rows.div_ceil(128), cols.div_ceil(128)],
                fill: Fill::F32(0.02),
            });
        }
    }
}

pub fn synth(args: SynthArgs) -> Result<()> {
    match args.preset {
        Preset::KimiK3 => return synth_k3(&args),
        Preset::Qwen3Moe => return synth_qwen3_moe(&args),
        Preset::KimiK2 | Preset::DeepseekV3 => {}
    }
    let (
        hidden,
        inter,
        moe_inter,
        heads,
        q_lora,
        kv_lora,
        nope,
        rope,
        v,
        experts,
        top_k,
        n_group,
        topk_group,
    ) = match args.preset {
        Preset::KimiK2 => (7168, 18432, 2048, 64, 1536, 512, 128, 64, 128, 384, 8, 1, 1),
        Preset::DeepseekV3 => (7168, 18432, 2048, 128, 1536, 512, 128, 64, 128, 256, 8, 8, 4),
        Preset::KimiK3 | Preset::Qwen3Moe => unreachable!("handled above"),
    };
    let experts = args.experts.unwrap_or(experts);
    let vocab = args.vocab.unwrap_or(match args.preset {
        Preset::KimiK2 => 163840,
        Preset::DeepseekV3 => 129280,
        Preset::KimiK3 | Preset::Qwen3Moe => unreachable!("handled above"),
    });
    let first_dense = 1.min(args.layers);
    if experts < top_k || !experts.is_multiple_of(n_group) {
        bail!("--experts must be at least {top_k} and a multiple of {n_group}");
    }
    create_out(&args.out)?;

    let mut shards: Vec<Vec<Tensor>> = vec![head_shard(vocab, hidden)];
    for l in 0..args.layers {
        let p = format!("model.layers.{l}");
        let mut t = layer_norms(&p, hidden);
        t.extend([
            bf16(format!("{p}.self_attn.q_a_proj.weight"), vec![q_lora, hidden]),
            ones(format!("{p}.self_attn.q_a_layernorm.weight"), q_lora),
            bf16(
                format!("{p}.self_attn.q_b_proj.weight"),
                vec![heads * (nope + rope), q_lora],
            ),
            bf16(
                format!("{p}.self_attn.kv_a_proj_with_mqa.weight"),
                vec![kv_lora + rope, hidden],
            ),
            ones(format!("{p}.self_attn.kv_a_layernorm.weight"), kv_lora),
            bf16(
                format!("{p}.self_attn.kv_b_proj.weight"),
                vec![heads * (nope + v), kv_lora],
            ),
            bf16(format!("{p}.self_attn.o_proj.weight"), vec![hidden, heads * v]),
        ]);
        if l < first_dense {
            mlp(&mut t, &format!("{p}.mlp"), inter, hidden, ExpertFormat::Bf16);
        } else {
            t.push(bf16(format!("{p}.mlp.gate.weight"), vec![experts, hidden]));
            t.push(Tensor {
                name: format!("{p}.mlp.gate.e_score_correction_bias"),
                dtype: "F32",
                shape: vec![experts],
                fill: Fill::Zeros,
            });
            mlp(
                &mut t,
                &format!("{p}.mlp.shared_experts"),
                moe_inter,
                hidden,
                ExpertFormat::Bf16,
            );
            for e in 0..experts {
                mlp(
                    &mut t,
                    &format!("{p}.mlp.experts.{e}"),
                    moe_inter,
                    hidden,
                    args.expert_format,
                );
            }
        }
        shards.push(t);
    }

    write_shards(&args.out, &shards, args.seed)?;

    let model_type = match args.preset {
        Preset::KimiK2 => "kimi_k2",
        Preset::DeepseekV3 => "deepseek_v3",
        Preset::KimiK3 | Preset::Qwen3Moe => unreachable!("handled above"),
    };
    let mut config = json!({
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "moe_intermediate_size": moe_inter,
        "num_hidden_layers": args.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "q_lora_rank": q_lora,
        "kv_lora_rank": kv_lora,
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v,
        "n_routed_experts": experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": top_k,
        "n_group": n_group,
        "topk_group": topk_group,
        "norm_topk_prob": true,
        "routed_scaling_factor": 2.827,
        "first_k_dense_replace": first_dense,
        "moe_layer_freq": 1,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131072,
        "rope_theta": 50000.0,
        "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        "tie_word_embeddings": false,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
        "strata_synthetic": "random weights written by `strata synth`",
    });
    match args.expert_format {
        ExpertFormat::Int4 => {
            config["quantization_config"] = json!({
                "quant_method": "compressed-tensors", "format": "pack-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                    "num_bits": 4, "type": "int", "symmetric": true, "group_size": 32, "strategy": "group"}}},
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|down)_proj.*", "re:.*mlp\\.gate$"],
            })
        }
        ExpertFormat::Fp8 => {
            config["quantization_config"] = json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})
        }
        ExpertFormat::Bf16 => {}
    }
    write_config(&args.out, &config)
}

/// Writes `shards` as `model-NNNNN-of-NNNNN.safetensors` plus the index, with progress.
fn write_shards(out: &Path, shards: &[Vec<Tensor>], seed: u64) -> Result<()> {
    let n = shards.len();
    let total: u64 = shards.iter().flatten().map(|t| t.bytes()).sum();
    eprintln!(
        "[strata synth] writing {n} shards, {:.2} GiB, to {}",
        total as f64 / (1u64 << 30) as f64,
        out.display()
    );
    let mut weight_map = serde_json::Map::new();
    let mut written = 0u64;
    let t0 = std::time::Instant::now();
    for (i, tensors) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, n);
        for t in tensors {
            weight_map.insert(t.name.clone(), json!(file));
        }
        write_shard(&out.join(&file), tensors, seed.wrapping_add(i as u64))?;
        written += tensors.iter().map(|t| t.bytes()).sum::<u64>();
        eprintln!(
            "[strata synth] {file}: {:.2}/{:.2} GiB, {:.0} MB/s",
            written as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64,
            written as f64 / t0.elapsed().as_secs_f64() / 1e6
        );
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(
        out.join("model.safetensors.index.json"),
        serde_json::to_string_pretty(&index)?,
    )?;

    eprintln!("[strata synth] done in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// Kimi K3's config (spec section 2) with `layers` layers (the real schedule rule: MLA at every
/// fourth one-based layer and the last), `experts` routed experts and `vocab` tokens.
fn k3_config(layers: usize, experts: usize, vocab: usize) -> serde_json::Value {
    let mla: Vec<usize> = (1..=layers)
        .filter(|i| i % 4 == 0 || *i == layers && layers > 1)
        .collect();
    let kda: Vec<usize> = (1..=layers).filter(|i| !mla.contains(i)).collect();
    let linear_attn = json!({"num_heads": 96, "head_dim": 128, "short_conv_kernel_size": 4,
        "use_full_rank_gate": true, "gate_lower_bound": -5.0,
        "kda_layers": kda, "full_attn_layers": mla});
    let weights = json!({"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32,
        "symmetric": true, "dynamic": false, "scale_dtype": "torch.uint8"});
    let quant = json!({"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
        "config_groups": {"group_0": {"format": "mxfp4-pack-quantized",
            "targets": ["re:.*block_sparse_moe\\.experts\\.\\d+\\.w[123]$"], "weights": weights}}});
    let mut text = json!({
            "vocab_size": vocab, "max_position_embeddings": 1048576, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": false, "num_nextn_predict_layers": 0,
            "linear_attn_config": linear_attn, "quantization_config": quant,
    });
    let rest = json!({
            "model_type": "kimi_linear", "hidden_act": "situ",
            "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
            "hidden_size": 7168, "intermediate_size": 33792, "moe_intermediate_size": 3072,
            "routed_expert_hidden_size": 3584, "latent_moe_use_norm": true,
            "num_hidden_layers": layers, "num_experts": experts, "num_experts_per_token": 16,
            "num_shared_experts": 2, "moe_router_activation_func": "sigmoid", "topk_method": "noaux_tc",
            "use_grouped_topk": true, "num_expert_group": 1, "topk_group": 1, "moe_renormalize": true,
            "routed_scaling_factor": 1.0, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "num_attention_heads": 96, "num_key_value_heads": 96, "q_lora_rank": 1536,
            "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "mla_use_nope": true, "mla_use_output_gate": true, "attn_res_block_size": 12,
    });
    for (key, value) in rest.as_object().expect("object") {
        text[key] = value.clone();
    }
    json!({
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "tie_word_embeddings": false,
        "bos_token_id": 0, "eos_token_id": 1,
        "strata_synthetic": "random weights written by `strata synth`",
        "text_config": text,
    })
}

/// A Qwen3-MoE-shaped checkpoint (Qwen3-30B-A3B's numbers, BF16), one shard per layer plus one
/// for the embeddings and head.
fn synth_qwen3_moe(args: &SynthArgs) -> Result<()> {
    let (hidden, inter, moe_inter, heads, kv_heads, head_dim) = (2048, 6144, 768, 32, 4, 128);
    let experts = args.experts.unwrap_or(128);
    let (top_k, vocab) = (8, args.vocab.unwrap_or(151936));
    if experts < top_k {
        bail!("--experts must be at least {top_k}");
    }
    create_out(&args.out)?;
    let mut shards: Vec<Vec<Tensor>> = vec![head_shard(vocab, hidden)];
    for l in 0..args.layers {
        let p = format!("model.layers.{l}");
        let mut t = layer_norms(&p, hidden);
        t.extend([
            bf16(
                format!("{p}.self_attn.q_proj.weight"),
                vec![heads * head_dim, hidden],
            ),
            bf16(
                format!("{p}.self_attn.k_proj.weight"),
                vec![kv_heads * head_dim, hidden],
            ),
            bf16(
                format!("{p}.self_attn.v_proj.weight"),
                vec![kv_heads * head_dim, hidden],
            ),
            bf16(
                format!("{p}.self_attn.o_proj.weight"),
                vec![hidden, heads * head_dim],
            ),
            ones(format!("{p}.self_attn.q_norm.weight"), head_dim),
            ones(format!("{p}.self_attn.k_norm.weight"), head_dim),
            bf16(format!("{p}.mlp.gate.weight"), vec![experts, hidden]),
        ]);
        for e in 0..experts {
            mlp(
                &mut t,
                &format!("{p}.mlp.experts.{e}"),
                moe_inter,
                hidden,
                ExpertFormat::Bf16,
            );
        }
        shards.push(t);
    }
    write_shards(&args.out, &shards, args.seed)?;
    let config = json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
        "moe_intermediate_size": moe_inter, "num_hidden_layers": args.layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "num_experts": experts, "num_experts_per_tok": top_k, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rope_scaling": null,
        "use_sliding_window": false, "tie_word_embeddings": false,
        "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
        "strata_synthetic": "random weights written by `strata synth`",
    });
    write_config(&args.out, &config)
}

/// A K3-shaped checkpoint: the tensor list is the `kimi_k3` family's own inventory of the config,
/// one shard per layer (plus one for the embeddings, head and output mixing).
fn synth_k3(args: &SynthArgs) -> Result<()> {
    let experts = args.experts.unwrap_or(896);
    let vocab = args.vocab.unwrap_or(163840);
    if experts < 16 {
        bail!("--experts must be at least 16 (K3 routes 16 per token)");
    }
    if args.out.join("config.json").exists() {
        bail!("{} already holds a model", args.out.display());
    }
    std::fs::create_dir_all(&args.out)?;
    let config = k3_config(args.layers.max(1), experts, vocab);
    let cfg_path = args.out.join("config.json");
    std::fs::write(&cfg_path, serde_json::to_string_pretty(&config)?)?;
    let cfg = strata_formats::JsonConfig::read(&cfg_path)?;
    let inventory = strata_models::family_for(&cfg)?
        .inventory
        .expect("kimi_k3 lists its tensors")(&cfg)?;
    let a = 0.02 * 3f32.sqrt();
    let mut shards: Vec<Vec<Tensor>> = (0..=args.layers.max(1)).map(|_| Vec::new()).collect();
    for t in inventory {
        let name = t.name;
        let fill = match (t.dtype, name.as_str()) {
            (strata_formats::DType::U8, n) if n.ends_with("weight_scale") => Fill::Byte(120), // 2^-7
            (strata_formats::DType::U8, _) => Fill::Bytes,
            (strata_formats::DType::F32, n) if n.ends_with("norm.weight") => Fill::F32(1.0),
            (strata_formats::DType::F32, n) if n.contains("conv1d") => Fill::F32Rand(0.5),
            (strata_formats::DType::F32, _) => Fill::Zeros,
            (_, n) if n.ends_with("norm.weight") => Fill::Ones,
            _ => Fill::Bf16(a),
        };
        let shard = name
            .split_once("layers.")
            .and_then(|(_, rest)| rest.split('.').next())
            .and_then(|l| l.parse::<usize>().ok())
            .map_or(0, |l| l + 1);
        shards[shard].push(Tensor {
            name,
            dtype: t.dtype.name(),
            shape: t.shape,
            fill,
        });
    }
    write_shards(&args.out, &shards, args.seed)?;
    std::fs::write(
        args.out.join("generation_config.json"),
        r#"{"bos_token_id": 0, "eos_token_id": 1}"#,
    )?;
    Ok(())
}
