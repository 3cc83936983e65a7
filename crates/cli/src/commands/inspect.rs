//! `strata inspect`: what a model is and what running it costs, from its headers and config
//! (no weights are read), or from a config.json alone (`--config-only`).

use anyhow::Result;
use strata_runtime::{MemoryPlan, ModelPlan};

use super::ModelArg;

#[derive(clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Plan memory for this budget (default: 90 % of the available memory).
    #[arg(long, value_name = "SIZE", value_parser = strata_runtime::parse_size)]
    mem: Option<usize>,
    /// Plan with this expert cache instead of what --mem leaves.
    #[arg(long, value_name = "SIZE", value_parser = strata_runtime::parse_size)]
    expert_cache: Option<usize>,
    /// Plan non-expert weights this way (see `strata run --help`).
    #[arg(long, value_enum, default_value_t = super::Spine::Auto)]
    spine: super::Spine,
    /// Plan the resident non-expert weights in this format (see `strata run --help`).
    #[arg(long, value_enum, default_value_t = super::SpineFormatArg::Native)]
    spine_format: super::SpineFormatArg,
    /// Plan decoding state for this context per sequence (see `strata run --help`).
    #[arg(long, short = 'c', value_name = "N")]
    ctx_size: Option<usize>,
    /// Plan this decoding-state pool (see `strata run --help`).
    #[arg(long, value_name = "N")]
    state_tokens: Option<usize>,
    /// Plan decoding state for this many sequences at once, as `strata serve --max-concurrent`
    /// does (default 1, as `strata run`).
    #[arg(long, default_value_t = 1, value_name = "N")]
    max_concurrent: usize,
    /// Plan this prompt chunk (see `strata run --help`).
    #[arg(long, value_name = "N")]
    prefill_chunk: Option<usize>,
    /// Print the figures as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Plan from this config.json alone, without weights: the family lists the tensors a
    /// checkpoint of that config holds, in the published storage formats (Kimi K3, Kimi Linear).
    #[arg(long, value_name = "CONFIG.json", conflicts_with = "model")]
    config_only: Option<std::path::PathBuf>,
}

/// The plan's shares, for `--json`.
/// The memory plan's shares and expected reads, as `inspect` and `bench` print them.
pub(crate) fn memory_json(m: &MemoryPlan) -> serde_json::Value {
    serde_json::json!({
                "mem": m.mem, "resident": m.resident, "streamed_layers": m.streamed,
                "streamed_bytes_per_token": m.streamed_bytes, "spine_buffers": m.spine_buffers,
                "spine_ahead": m.spine_ahead,
                "state_bytes_per_token": m.state_per_token,
                "state_bytes_per_sequence": m.state_per_sequence,
                "ctx_size": m.ctx_size, "sequences": m.sequences, "state_tokens": m.state_tokens,
                "state_reserve": m.state_reserve(), "prefill_chunk": m.prefill_chunk,
                "buffers": m.buffers, "reads_in_flight": m.in_flight, "work": m.work,
                "expert_cache": m.expert_cache, "unused": m.unused,
                "expected_read_per_token": m.expected_read_per_token,
                "spine_format": format!("{:?}", m.spine_format).to_lowercase(),
                "int8_alternative_read_per_token": m.int8_alternative,
                "cached_expert_share": m.expert_cache as f64 / m.expert_bytes.max(1) as f64,
    })
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {} ({b} B)", UNITS[u])
    }
}

fn human_count(n: u64) -> String {
    let v = n as f64;
    if v >= 1e12 {
        format!("{:.2}T", v / 1e12)
    } else if v >= 1e9 {
        format!("{:.2}B", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}K", v / 1e3)
    } else {
        n.to_string()
    }
}

pub fn inspect(args: InspectArgs) -> Result<()> {
    let (plan, source) = match &args.config_only {
        Some(path) => {
            let file = if path.is_dir() {
                path.join("config.json")
            } else {
                path.clone()
            };
            (
                ModelPlan::from_config(&file)?,
                format!("{} (config only)", file.display()),
            )
        }
        None => (
            ModelPlan::from_dir(&args.model.resolve()?)?,
            args.model.describe(),
        ),
    };
    let l = &plan.layout;
    let options = strata_runtime::LoadOptions {
        mem: args.mem,
        expert_cache: args.expert_cache,
        spine: args.spine.mode(),
        spine_format: args.spine_format.format(),
        ctx_size: args.ctx_size,
        state_tokens: args.state_tokens,
        sequences: args.max_concurrent,
        prefill_chunk: args.prefill_chunk,
        ..Default::default()
    };
    let memory = MemoryPlan::new(&plan, &options);
    if args.json {
        let body = serde_json::json!({
            "architecture": plan.architecture,
            "model_type": plan.model_type,
            "family": plan.family,
            "layers": plan.n_layers,
            "moe_layers": l.moe_layers.len(),
            "hidden_size": plan.hidden_dim,
            "vocab_size": plan.vocab_size,
            "routed_experts": l.n_experts,
            "active_experts": l.top_k,
            "total_params": plan.total_params,
            "active_params": plan.active_params(),
            "expert_params": plan.expert_params,
            "non_expert_params": plan.non_expert_params,
            "expert_bytes": plan.expert_bytes,
            "non_expert_bytes": plan.non_expert_bytes,
            "non_expert_bytes_int8": plan.non_expert_bytes_int8,
            "layer_bytes": plan.layer_bytes,
            "bytes_per_expert": plan.bytes_per_expert(),
            "uncached_token_bytes": plan.uncached_token_bytes(),
            "memory": memory.as_ref().ok().map(memory_json),
            "memory_error": memory.as_ref().err().map(|e| e.to_string()),
            "formats": plan.formats.iter().map(|(d, n, b)| serde_json::json!({"dtype": d, "tensors": n, "bytes": b})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    println!("model            {source}");
    println!(
        "architecture     {} (model_type {}, family {})",
        plan.architecture, plan.model_type, plan.family
    );
    println!(
        "layers           {} ({} MoE), hidden {}, vocab {}",
        plan.n_layers,
        l.moe_layers.len(),
        plan.hidden_dim,
        plan.vocab_size
    );
    if l.moe_layers.is_empty() {
        println!("experts          none: a dense model (every weight resident or streamed by layer)");
    } else {
        println!(
            "experts          {} routed per MoE layer, {} active per token, intermediate {}",
            l.n_experts, l.top_k, l.inter_dim
        );
    }
    println!(
        "parameters       {} total, {} active per token (input embedding not counted)",
        human_count(plan.total_params),
        human_count(plan.active_params())
    );
    println!(
        "  experts        {} params, {}",
        human_count(plan.expert_params),
        human_bytes(plan.expert_bytes)
    );
    println!(
        "  non-expert     {} params, {}",
        human_count(plan.non_expert_params),
        human_bytes(plan.non_expert_bytes)
    );
    println!("bytes per expert {}", human_bytes(plan.bytes_per_expert()));
    println!(
        "uncached token   {} of expert reads ({:.1} GB at zero cache hits)",
        human_bytes(plan.uncached_token_bytes()),
        plan.uncached_token_bytes() as f64 / 1e9
    );
    match &memory {
        Ok(m) => {
            println!("memory plan      --mem {}", human_bytes(m.mem as u64));
            if m.streamed.is_empty() {
                println!(
                    "  resident       {} (non-expert weights{})",
                    human_bytes(m.resident as u64),
                    if m.spine_format == strata_runtime::SpineFormat::Int8 {
                        ", linear layers as INT8"
                    } else {
                        ""
                    }
                );
            } else {
                println!(
                    "  resident       {} (non-expert weights of {} of {} layers, embedding, head)",
                    human_bytes(m.resident as u64),
                    plan.n_layers - m.streamed.len(),
                    plan.n_layers
                );
                println!(
                    "  streamed       {} layers read at every token: {} ({:.1} GB per token on top of experts)",
                    m.streamed.len(),
                    human_bytes(m.streamed_bytes as u64),
                    m.streamed_bytes as f64 / 1e9
                );
                println!(
                    "  layer buffers  {} (reading {} layer(s) ahead)",
                    human_bytes(m.spine_buffers as u64),
                    m.spine_ahead
                );
            }
            println!(
                "  state          {} per token + {} per sequence; {} reserved: {} positions for {} sequence(s), {} each at most (--ctx-size)",
                human_bytes(m.state_per_token as u64),
                human_bytes(m.state_per_sequence as u64),
                human_bytes(m.state_reserve() as u64),
                m.state_tokens,
                m.sequences,
                m.ctx_size
            );
            println!(
                "  read buffers   {} ({} expert reads in flight, as many kept, one layer computing)",
                human_bytes(m.buffers as u64),
                m.in_flight
            );
            println!(
                "  working memory {} (a {}-token prompt chunk's activations, logits, stacks)",
                human_bytes(m.work as u64),
                m.prefill_chunk
            );
            println!(
                "  expert cache   {} ({:.1} % of the experts{})",
                human_bytes(m.expert_cache as u64),
                100.0 * (m.expert_cache as f64 / plan.expert_bytes.max(1) as f64).min(1.0),
                if m.expert_cache_set {
                    ", set by --expert-cache"
                } else {
                    ""
                }
            );
            if m.unused > 0 {
                println!(
                    "  unused         {} (every expert fits: the model cannot use more)",
                    human_bytes(m.unused as u64)
                );
            }
            println!(
                "  reads/token    {} expected ({} of streamed layers, the rest experts missing from the cache if routing were uniform)",
                human_bytes(m.expected_read_per_token),
                human_bytes(m.streamed_bytes as u64)
            );
            if let Some(int8) = m.int8_alternative {
                println!(
                    "  with --spine-format int8 every layer stays resident: {} per token expected",
                    human_bytes(int8)
                );
            }
        }
        Err(e) => println!("memory plan      {e}"),
    }
    println!("tensor formats:");
    for (dtype, n, bytes) in &plan.formats {
        println!("  {dtype:<8} {n:>6} tensors  {}", human_bytes(*bytes));
    }
    Ok(())
}
