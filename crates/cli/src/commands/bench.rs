//! `strata bench`: decode speed of a model next to the bounds that matter, measured in one run:
//! the disk's own direct-read bandwidth for this model's expert reads, bytes read per token, the
//! time spent waiting for them, and how close token time comes to max(I/O, compute).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use strata_runtime::{Engine, GenEvent, Request, SamplingParams};

use super::{MemArgs, ModelArg};

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    mem: MemArgs,
    /// Tokens to decode (after a prompt of --prompt-len tokens).
    #[arg(long, default_value_t = 8)]
    tokens: usize,
    /// Prompt length (token ids 1..=N).
    #[arg(long, default_value_t = 4)]
    prompt_len: usize,
    /// Experts read (not decoded) to measure the disk's direct-read bandwidth first.
    #[arg(long, default_value_t = 48)]
    raw_samples: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn bench(args: BenchArgs) -> Result<()> {
    let dir = args.model.resolve()?;
    let t_load = Instant::now();
    let engine = Engine::load(&dir, &args.mem.load_options())
        .with_context(|| format!("loading model {}", args.model.describe()))?;
    let load_s = t_load.elapsed().as_secs_f64();
    let Some(store) = engine.experts.clone() else {
        bail!("this model has no routed experts to stream");
    };
    let (raw_bytes, raw_s) = store.raw_read_bandwidth(args.raw_samples)?;
    let raw_bw = raw_bytes as f64 / raw_s;

    let vocab = engine.model.info().vocab_size as u32;
    let prompt: Vec<u32> = (1..=args.prompt_len as u32).map(|i| i % vocab).collect();
    let request = Request {
        prompt,
        max_new_tokens: args.tokens,
        sampling: SamplingParams::default(),
        stop: vec![],
        ignore_eos: true,
    };
    let mut marks: Vec<(Instant, [u64; 5])> = Vec::new();
    let t0 = Instant::now();
    let before = store.stats.snapshot();
    engine.generate(std::slice::from_ref(&request), |_, e| {
        if let GenEvent::Token { .. } = e {
            marks.push((Instant::now(), store.stats.snapshot()));
        }
    })?;
    if marks.len() < 2 {
        bail!("--tokens must be at least 2 to time decoding");
    }
    let prefill_s = (marks[0].0 - t0).as_secs_f64();
    let prefill_stats = marks[0].1;
    let (first, last) = (&marks[0], &marks[marks.len() - 1]);
    let steps = (marks.len() - 1) as f64;
    let decode_s = (last.0 - first.0).as_secs_f64();
    let d = |i: usize| (last.1[i] - first.1[i]) as f64;
    let (hits, misses, bytes, wait_s) = (d(0), d(1), d(2), d(4) / 1e9);
    let per_token_s = decode_s / steps;
    let bytes_per_token = bytes / steps;
    let io_bound_s = bytes_per_token / raw_bw;
    let compute_s = (decode_s - wait_s) / steps;
    let effective_bw = if wait_s > 0.0 { bytes / wait_s } else { 0.0 };
    let hit_rate = if hits + misses > 0.0 {
        hits / (hits + misses)
    } else {
        0.0
    };
    let ratio = per_token_s / (io_bound_s + compute_s);
    let _ = before;
    let st = &store.stats;
    let asked = st.predicted_asked.load(std::sync::atomic::Ordering::Relaxed) as f64;
    let right = st.predicted_right.load(std::sync::atomic::Ordering::Relaxed) as f64;
    let wasted = st.wasted_bytes.load(std::sync::atomic::Ordering::Relaxed) as f64;
    let recall = if asked > 0.0 { right / asked } else { 0.0 };
    let total_read = (last.1[2] - before[2]) as f64;

    let layers: Vec<serde_json::Value> = store
        .layer_stats()
        .iter()
        .map(|&(l, h, m)| serde_json::json!({"layer": l, "hits": h, "misses": m}))
        .collect();
    if args.json {
        let body = serde_json::json!({
            "model": args.model.describe(),
            "load_s": load_s,
            "expert_cache_bytes": store.budget(),
            "raw_direct_read_gbs": raw_bw / 1e9,
            "prefill_tokens": request.prompt.len(),
            "prefill_s": prefill_s,
            "prefill_bytes_read": prefill_stats[2] - before[2],
            "decode_tokens": steps,
            "s_per_token": per_token_s,
            "tokens_per_s": 1.0 / per_token_s,
            "expert_bytes_read_per_token": bytes_per_token,
            "expert_hit_rate": hit_rate,
            "read_wait_s_per_token": wait_s / steps,
            "effective_read_gbs": effective_bw / 1e9,
            "effective_over_raw": effective_bw / raw_bw,
            "io_bound_s_per_token": io_bound_s,
            "compute_s_per_token": compute_s,
            "token_time_over_io_plus_compute": ratio,
            "per_layer": layers,
            "prefetch_recall": recall,
            "prefetch_wasted_bytes": wasted,
            "prefetch_wasted_share_of_reads": if total_read > 0.0 { wasted / total_read } else { 0.0 },
        });
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    println!("model                 {}", args.model.describe());
    println!(
        "load                  {load_s:.2} s; expert cache {:.2} GiB",
        store.budget() as f64 / (1u64 << 30) as f64
    );
    println!(
        "disk direct reads     {:.2} GB/s ({} experts' runs, same reads and parallelism as the store)",
        raw_bw / 1e9,
        args.raw_samples
    );
    println!(
        "prefill               {} tokens in {prefill_s:.2} s",
        request.prompt.len()
    );
    println!(
        "decode                {:.3} s/token ({:.2} tok/s) over {steps} tokens",
        per_token_s,
        1.0 / per_token_s
    );
    println!(
        "expert reads          {:.1} MB/token, hit rate {:.1} %, waiting {:.3} s/token",
        bytes_per_token / 1e6,
        hit_rate * 100.0,
        wait_s / steps
    );
    println!(
        "effective read        {:.2} GB/s = {:.0} % of the disk's direct-read bandwidth",
        effective_bw / 1e9,
        100.0 * effective_bw / raw_bw
    );
    println!(
        "bound                 I/O {io_bound_s:.3} s + compute {compute_s:.3} s per token; token time is {ratio:.2} x their sum"
    );
    let per_layer: Vec<String> = store
        .layer_stats()
        .iter()
        .map(|&(l, h, m)| format!("{l}: {:.0} %", 100.0 * h as f64 / (h + m).max(1) as f64))
        .collect();
    println!("hit rate per layer    {} (whole run)", per_layer.join(", "));
    println!(
        "prefetch              recall {:.1} % of routed experts guessed a layer early; {:.1} MB wasted ({:.1} % of bytes read)",
        recall * 100.0,
        wasted / 1e6,
        if total_read > 0.0 { 100.0 * wasted / total_read } else { 0.0 }
    );
    Ok(())
}
