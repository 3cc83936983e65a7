//! `strata bench`: decode speed of a model next to the bounds that matter, measured in one run:
//! the disk's own direct-read bandwidth for this model's expert reads, bytes read per token, the
//! time spent waiting for them, where the rest of the time goes (expert compute, attention,
//! other), and how close token time comes to I/O + compute.

use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use strata_models::profile::PHASES;
use strata_runtime::{GenEvent, Request, SamplingParams};

use super::bench_prepare::{gpu_figures, load_every_expert, warm_gpu};
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
    /// Prompt length (token ids drawn with --seed).
    #[arg(long, default_value_t = 4)]
    prompt_len: usize,
    /// Seed of the prompt's token ids, of the sampled tokens (temperature 1) and of the experts
    /// the disk probes read. Default: a new
    /// one each run (printed), so a run reads experts the last one did not: bytes read again
    /// can come from a cache below the file system (a VM host's) and flatter both figures.
    #[arg(long)]
    seed: Option<u64>,
    /// Experts read (not decoded) to measure the disk's direct-read bandwidth, before the decode
    /// and again after it.
    #[arg(long, default_value_t = 64)]
    raw_samples: usize,
    /// Experts read to measure the disk again after every token (outside the token's time), so
    /// each token's reads compare with what the disk gave right around them; 0: only before and
    /// after the decode. A VM's disk can swing 3x within seconds. Off when layers stream (their
    /// reads run ahead across tokens).
    #[arg(long, default_value_t = 16, value_name = "N")]
    raw_probe: usize,
    /// Print the figures as one JSON object on the last line of stdout (after the text).
    #[arg(long)]
    json: bool,
    /// Also project the token time to a model of this many layers (e.g. 93 for a Kimi K3
    /// checkpoint written with fewer layers), scaling by MoE layers, and compare it with the
    /// physical bound of reading that many layers' experts at --reference-gbs.
    #[arg(long, value_name = "LAYERS")]
    extrapolate_to: Option<usize>,
    /// Disk bandwidth of the reference machine for --extrapolate-to, GB/s (a fast NVMe SSD).
    #[arg(long, default_value_t = 6.85)]
    reference_gbs: f64,
    /// Read every expert into the cache before the prompt (the cache must hold them all), so
    /// nothing is read while timing: the compute bound of a whole token, reported as weight
    /// bytes touched per second next to the memory's read bandwidth measured in the same run.
    #[arg(long)]
    compute_only: bool,
}

/// What the run measured, projected to a deeper model of the same shape.
struct Projection {
    layers: usize,
    moe_layers: usize,
    s_per_token: f64,
    /// Expert bytes per token of the deeper model, at this run's hit rate.
    bytes_per_token: f64,
    bound_here_s: f64,
    bound_reference_s: f64,
    at_this_efficiency_s: f64,
}

pub fn bench(args: BenchArgs) -> Result<()> {
    let t_load = Instant::now();
    let mut load = args.mem.load_options();
    load.positions = Some(args.prompt_len + args.tokens);
    let (engine, _) = args.model.load(&load)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let Some(store) = engine.experts.clone() else {
        bail!("this model has no routed experts to stream");
    };
    // Buffers the preload's reads made are the load's: the run's figure counts those after it.
    let fresh_at_load = store.fresh_buffer_bytes();
    // The disk's own rate, before the decode and again after it (a VM's disk drifts): the bound
    // is their mean.
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    // Each probe reads experts of its own.
    let probes = std::sync::atomic::AtomicU64::new(0);
    let probe_seed =
        || seed ^ (probes.fetch_add(1, Ordering::Relaxed) + 1).wrapping_mul(0xA24B_AED4_963E_E407);
    let raw = || -> Result<f64> {
        let (bytes, s) = store.raw_read_bandwidth(args.raw_samples, probe_seed())?;
        Ok(bytes as f64 / s)
    };
    if args.compute_only {
        load_every_expert(&store)?;
    }
    let raw_before = raw()?;
    // Streamed layers are read ahead across token boundaries: a probe between tokens would share
    // the disk with those reads, and the reads it waited for would leave the token's time.
    let raw_probe = if engine.spine.is_some() || args.compute_only {
        0
    } else {
        args.raw_probe
    };

    let vocab = engine.model.info().vocab_size as u32;
    let mut rng = strata_runtime::Rng::new(seed);
    let prompt: Vec<u32> = (0..args.prompt_len)
        .map(|_| 1 + (rng.next_u64() % (vocab as u64 - 1).max(1)) as u32)
        .collect();
    let request = Request {
        prompt,
        max_new_tokens: args.tokens,
        // Sampled, not greedy: greedy decoding of random weights falls into the same few tokens
        // whatever the prompt, and so reads the same experts run after run.
        sampling: SamplingParams {
            temperature: 1.0,
            seed,
            ..SamplingParams::default()
        },
        stop: vec![],
        ignore_eos: true,
    };
    if let Some(g) = super::gpu() {
        warm_gpu(&engine, &request, g)?;
    }
    let expert_uses = strata_kernels::offload::expert_uses();
    let st = &store.stats;
    let mark = || Mark {
        at: Instant::now(),
        store: st.snapshot(),
        phases: PHASES.snapshot(),
        asked: st.predicted_asked.load(Ordering::Relaxed),
        right: st.predicted_right.load(Ordering::Relaxed),
        weights: strata_kernels::weight_bytes_touched(),
    };
    let bar = ProgressBar::new((args.tokens) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} tokens {per_sec} ETA {eta}")
            .expect("progress template"),
    );
    // Per token: (its end, the disk's rate probed right after it, the next token's start).
    let mut marks: Vec<(Mark, Option<f64>, Mark)> = Vec::new();
    let mut probe_error = None;
    let profiling = strata_kernels::profile::enabled();
    let mut profiles = Vec::new();
    let t0 = Instant::now();
    let before = mark();
    if profiling {
        profiles.push(strata_kernels::profile::snapshot());
    }
    engine.generate(std::slice::from_ref(&request), |_, e| {
        if let GenEvent::Token { .. } = e {
            let end = mark();
            if profiling && marks.is_empty() {
                profiles.push(strata_kernels::profile::snapshot());
            }
            let probe = (raw_probe > 0).then(|| match store.raw_read_bandwidth(raw_probe, probe_seed()) {
                Ok((bytes, s)) => bytes as f64 / s,
                Err(e) => {
                    probe_error.get_or_insert(e);
                    f64::NAN
                }
            });
            marks.push((end, probe, mark()));
            bar.inc(1);
        }
    })?;
    bar.finish_and_clear();
    if let Some(e) = probe_error {
        bail!("measuring the disk between tokens: {e}");
    }
    if marks.len() < 2 {
        bail!("--tokens must be at least 2 to time decoding");
    }
    if let Some(spine) = &engine.spine {
        spine.wait_idle();
    }
    if profiling {
        profiles.push(strata_kernels::profile::snapshot());
    }
    let raw_after = raw()?;
    let compute = args
        .compute_only
        .then(|| ComputeFigures::measure(&before, &marks, request.prompt.len()));
    let prefill_s = (marks[0].0.at - t0).as_secs_f64();
    let prefill_stats = marks[0].0.store;
    // Where the prompt's time went (with its first token's sampling).
    let prefill = TokenFigures::between(&before, &marks[0].0, raw_before);
    let prefill_other_s =
        (prefill.seconds - prefill.wait_s - prefill.expert_s - prefill.attention_s).max(0.0);
    // Token i runs from token i-1's next start to its own end; its disk rate is the mean of the
    // probes on either side (or of the whole-run measurements without probes).
    let tokens: Vec<TokenFigures> = marks
        .windows(2)
        .map(|w| {
            let raw = match (w[0].1, w[1].1) {
                (Some(a), Some(b)) => (a + b) / 2.0,
                _ => (raw_before + raw_after) / 2.0,
            };
            TokenFigures::between(&w[0].2, &w[1].0, raw)
        })
        .collect();
    let total = TokenFigures::sum(&tokens);
    let raw_bw = total.raw_gbs * 1e9;
    let steps = tokens.len() as f64;
    let decode_s = total.seconds;
    let (bytes, wait_s) = (total.bytes, total.wait_s);
    let per_token_s = decode_s / steps;
    let bytes_per_token = bytes / steps;
    let io_bound_s = total.io_bound_s() / steps;
    let compute_s = (decode_s - wait_s) / steps;
    let effective_bw = total.read_gbs() * 1e9;
    let hit_rate = total.hit_rate();
    let ratio = per_token_s / (io_bound_s + compute_s);
    let wasted = st.wasted_bytes.load(Ordering::Relaxed) as f64;
    let recall = total.recall();
    let total_read = (marks[marks.len() - 1].0.store[2] - before.store[2]) as f64;

    let info = engine.model.info();
    let moe_here = info.experts.as_ref().map_or(0, |l| l.moe_layers.len()).max(1);
    let dense_here = info.n_layers - moe_here.min(info.n_layers);
    let projection = args.extrapolate_to.map(|layers| {
        let moe_layers = layers.saturating_sub(dense_here);
        let scale = moe_layers as f64 / moe_here as f64;
        let bytes = bytes_per_token * scale;
        let bound_reference_s = bytes / (args.reference_gbs * 1e9);
        Projection {
            layers,
            moe_layers,
            s_per_token: per_token_s * scale,
            bytes_per_token: bytes,
            bound_here_s: bytes / raw_bw,
            bound_reference_s,
            at_this_efficiency_s: if effective_bw > 0.0 {
                bound_reference_s * raw_bw / effective_bw
            } else {
                bound_reference_s
            },
        }
    });
    let layers: Vec<serde_json::Value> = store
        .layer_stats()
        .iter()
        .map(|&(l, h, m)| serde_json::json!({"layer": l, "hits": h, "misses": m}))
        .collect();
    println!("model                 {} (seed {seed})", args.model.describe());
    let gib = |b: f64| b / (1u64 << 30) as f64;
    println!(
        "load                  {load_s:.2} s; expert cache {:.2} GiB{}",
        gib(store.budget() as f64),
        match engine.warmed.preloaded_experts {
            0 => String::new(),
            n => format!(
                ", {:.2} GiB of it ({n} experts) read while loading",
                gib(engine.warmed.preloaded_bytes as f64)
            ),
        }
    );
    println!("memory plan           {}", plan_line(&engine.memory));
    println!(
        "disk direct reads     {:.2} GB/s before the decode, {:.2} after ({} experts' runs each, same reads and parallelism as the store); {}",
        raw_before / 1e9,
        raw_after / 1e9,
        args.raw_samples,
        if raw_probe > 0 {
            format!("between tokens ({raw_probe} experts each): \"disk GB/s\" below")
        } else {
            "each token compared with their mean".to_string()
        }
    );
    println!(
        "prefill               {} tokens in {prefill_s:.2} s: attention {:.2} s, MoE layers {:.2} s, waiting for reads {:.2} s, the rest {:.2} s",
        request.prompt.len(),
        prefill.attention_s,
        prefill.expert_s,
        prefill.wait_s,
        prefill_other_s
    );
    if let Some(c) = &compute {
        c.print();
    }
    println!(
        "decode                {:.3} s/token ({:.2} tok/s) over {steps} tokens",
        per_token_s,
        1.0 / per_token_s
    );
    println!(
        "{:>5} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9} {:>9} {:>6} {:>8}",
        "token",
        "s",
        "I/O wait",
        "experts",
        "attention",
        "other",
        "MB read",
        "read GB/s",
        "disk GB/s",
        "hit %",
        "recall %"
    );
    let row = |label: &str, t: &TokenFigures, n: f64| {
        println!(
            "{label:>5} {:>8.3} {:>8.3} {:>8.3} {:>9.3} {:>8.3} {:>8.1} {:>9.2} {:>9.2} {:>6.1} {:>8.1}",
            t.seconds / n,
            t.wait_s / n,
            t.expert_s / n,
            t.attention_s / n,
            t.other_s() / n,
            t.bytes / n / 1e6,
            t.read_gbs(),
            t.raw_gbs,
            100.0 * t.hit_rate(),
            100.0 * t.recall()
        )
    };
    for (i, t) in tokens.iter().enumerate() {
        row(&(i + 2).to_string(), t, 1.0);
    }
    row("mean", &total, steps);
    println!(
        "reads                 {:.1} MB/token, expert hit rate {:.1} %, waiting {:.3} s/token ({:.0} % of token time)",
        bytes_per_token / 1e6,
        hit_rate * 100.0,
        wait_s / steps,
        100.0 * wait_s / decode_s
    );
    if let Some(spine) = &engine.spine {
        println!(
            "streamed layers       {} of {} layers' non-expert weights read at every token: {:.1} MB/token (in the reads above), waiting {:.3} s/token",
            spine.layers().len(),
            info.n_layers,
            total.spine_bytes / steps / 1e6,
            total.spine_wait_s / steps
        );
    }
    println!(
        "effective read        {:.2} GB/s = {:.0} % of the disk's direct-read bandwidth around each token, {:.2} GB/s (bytes over the time reads were in flight)",
        effective_bw / 1e9,
        100.0 * effective_bw / raw_bw,
        raw_bw / 1e9
    );
    println!(
        "bound                 I/O {io_bound_s:.3} s + compute {compute_s:.3} s per token; token time is {ratio:.2} x their sum"
    );
    println!(
        "MoE layers            {:.3} s/token: the routed experts' products {:.3} s, the rest (router, shared expert, latent projections, sums) {:.3} s",
        total.expert_s / steps,
        total.routed_s / steps,
        (total.expert_s - total.routed_s).max(0.0) / steps
    );
    let per_layer: Vec<String> = store
        .layer_stats()
        .iter()
        .map(|&(l, h, m)| format!("{l}: {:.0} %", 100.0 * h as f64 / (h + m).max(1) as f64))
        .collect();
    println!("hit rate per layer    {} (whole run)", per_layer.join(", "));
    println!(
        "per layer             {:.3} s/token on average over {} layers ({} MoE)",
        per_token_s / info.n_layers as f64,
        info.n_layers,
        moe_here
    );
    if let Some(p) = &projection {
        println!(
            "at {} layers ({} MoE) {:.2} s/token here (scaled by MoE layers), {:.2} GB of expert reads per token",
            p.layers,
            p.moe_layers,
            p.s_per_token,
            p.bytes_per_token / 1e9
        );
        println!(
            "  I/O bound          {:.2} s/token on this disk; {:.2} s/token on a {:.2} GB/s SSD ({:.2} s at this run's read efficiency)",
            p.bound_here_s, p.bound_reference_s, args.reference_gbs, p.at_this_efficiency_s
        );
    }
    println!(
        "prefetch              {}: recall {:.1} % of routed experts guessed a layer early; {:.1} MB wasted ({:.1} % of bytes read)",
        store.prefetch_mode().name(),
        recall * 100.0,
        wasted / 1e6,
        if total_read > 0.0 { 100.0 * wasted / total_read } else { 0.0 }
    );
    if let [before, first, end] = &profiles[..] {
        use strata_kernels::profile::{between, table};
        print!(
            "profile: the prompt's products and spans (STRATA_PROFILE), per prompt\n{}",
            table(&between(before, first), 1.0)
        );
        print!(
            "profile: per decoded token\n{}",
            table(&between(first, end), steps)
        );
    }
    let gpu = super::gpu().map(|g| gpu_figures(g, expert_uses));
    if let Some(g) = &gpu {
        println!(
            "gpu                   {}: {:.2} GiB of weights kept there, {:.1} MB copied per token for single products, {} products on it ({} of routed experts); its memory reads {:.1} GB/s",
            g["adapter"].as_str().unwrap_or(""),
            g["kept_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64,
            g["copied_bytes"].as_f64().unwrap_or(0.0) / 1e6 / marks.len().max(1) as f64,
            g["products"],
            g["expert_products"],
            g["memory_read_gbps"].as_f64().unwrap_or(0.0),
        );
        let to_gpu = g["host_to_gpu_gbps"].as_f64().unwrap_or(0.0);
        println!(
            "gpu link              {:.1} GB/s host to GPU ({} threads writing side by side through staging memory, as a layer's experts are copied), {:.1} GB/s by one thread, {:.1} GB/s through the queue; {:.1} GB/s GPU to host",
            to_gpu,
            strata_gpu::WRITERS,
            g["host_staged_gbps"].as_f64().unwrap_or(0.0),
            g["host_write_gbps"].as_f64().unwrap_or(0.0),
            g["host_copy_gbps"].as_f64().unwrap_or(0.0),
        );
        let copied = g["copied_bytes"].as_f64().unwrap_or(0.0) / marks.len().max(1) as f64;
        if copied > 0.0 && per_token_s > 0.0 && to_gpu > 0.0 {
            let rate = copied / per_token_s / 1e9;
            println!(
                "gpu streaming         {:.1} MB copied per token in {per_token_s:.3} s: {rate:.1} GB/s = {:.0} % of the host-to-GPU rate measured above",
                copied / 1e6,
                100.0 * rate / to_gpu
            );
        }
        let (hits, copies) = (
            g["expert_hits"].as_u64().unwrap_or(0),
            g["expert_copies"].as_u64().unwrap_or(0),
        );
        if hits + copies > 0 {
            println!(
                "gpu experts           {:.1} % of the routed experts' weight uses found them in GPU memory ({hits} of {}; the rest copied there first)",
                100.0 * hits as f64 / (hits + copies) as f64,
                hits + copies
            );
        }
        // The decode's weights against the GPU memory's own read rate, where every weight is
        // on the GPU (compute-only with --gpu-experts).
        let gpu_read = g["memory_read_gbps"].as_f64().unwrap_or(0.0) * 1e9;
        if let (Some(c), true) = (&compute, gpu_read > 0.0 && copies == 0) {
            println!(
                "gpu decode            {:.3} GB of weights per token at {:.1} GB/s = {:.0} % of the GPU memory's read rate measured above",
                c.weight_bytes_per_token / 1e9,
                c.weights_bps() / 1e9,
                100.0 * c.weights_bps() / gpu_read
            );
        }
        let resident = g["resident_layers"].as_u64().unwrap_or(0);
        if resident > 0 {
            println!(
                "gpu resident layers   {resident} MoE layers with every expert kept on the GPU: their products laid out there, no wait"
            );
        }
    }
    if args.json {
        // The names a check outside the project reads come first.
        let mut body = serde_json::json!({
            "tokens": marks.len(),
            "timed_tokens": tokens.len(),
            "seconds_per_token": per_token_s,
            "bytes_read_per_token": bytes_per_token,
            "read_gbps": effective_bw / 1e9,
            "raw_gbps": raw_bw / 1e9,
            "raw_gbps_before": raw_before / 1e9,
            "raw_gbps_after": raw_after / 1e9,
            "hit_rate": hit_rate,
            "io_wait_fraction": if decode_s > 0.0 { wait_s / decode_s } else { 0.0 },
            "expert_compute_s_per_token": total.expert_s / steps,
            "routed_expert_s_per_token": total.routed_s / steps,
            "attention_s_per_token": total.attention_s / steps,
            "other_s_per_token": total.other_s() / steps,
            "per_token": tokens.iter().map(TokenFigures::json).collect::<Vec<_>>(),
        });
        let more = serde_json::json!({
            "model": args.model.describe(),
            "seed": seed,
            "threads": strata_kernels::threads(),
            "load_s": load_s,
            "expert_cache_bytes": store.budget(),
            "memory_plan": super::inspect::memory_json(&engine.memory),
            "fresh_read_buffer_bytes": store.fresh_buffer_bytes() - fresh_at_load,
            "preloaded_bytes": engine.warmed.preloaded_bytes,
            "preloaded_experts": engine.warmed.preloaded_experts,
            "warmed_read_buffer_bytes": store.warmed_buffer_bytes(),
            "prefill_tokens": request.prompt.len(),
            "prefill_s": prefill_s,
            "prefill_attention_s": prefill.attention_s,
            "prefill_moe_s": prefill.expert_s,
            "prefill_wait_s": prefill.wait_s,
            "prefill_other_s": prefill_other_s,
            "prefill_bytes_read": prefill_stats[2] - before.store[2],
            "tokens_per_s": 1.0 / per_token_s,
            "streamed_layers": engine.spine.as_ref().map_or(0, |s| s.layers().len()),
            "spine_bytes_per_token": total.spine_bytes / steps,
            "spine_wait_s_per_token": total.spine_wait_s / steps,
            "read_wait_s_per_token": wait_s / steps,
            "effective_over_raw": effective_bw / raw_bw,
            "io_bound_s_per_token": io_bound_s,
            "compute_s_per_token": compute_s,
            "token_time_over_io_plus_compute": ratio,
            "per_layer": layers,
            "layers": info.n_layers,
            "moe_layers": moe_here,
            "s_per_layer": per_token_s / info.n_layers as f64,
        });
        if let (Some(b), serde_json::Value::Object(m)) = (body.as_object_mut(), more) {
            b.extend(m);
        }
        body["projection"] = serde_json::json!(projection.as_ref().map(|p| serde_json::json!({
            "layers": p.layers, "moe_layers": p.moe_layers, "s_per_token": p.s_per_token,
            "expert_bytes_per_token": p.bytes_per_token, "io_bound_here_s": p.bound_here_s,
            "reference_gbs": args.reference_gbs, "io_bound_reference_s": p.bound_reference_s,
            "reference_at_this_run_efficiency_s": p.at_this_efficiency_s,
        })));
        let prefetch_figures = serde_json::json!({
            "prefetch": store.prefetch_mode().name(),
            "prefetch_recall": recall,
            "prefetch_wasted_bytes": wasted,
            "prefetch_wasted_share_of_reads": if total_read > 0.0 { wasted / total_read } else { 0.0 },
        });
        if let (Some(b), serde_json::Value::Object(m)) = (body.as_object_mut(), prefetch_figures) {
            b.extend(m);
        }
        body["compute_only"] = serde_json::json!(compute.as_ref().map(ComputeFigures::json));
        body["gpu"] = serde_json::json!(gpu);
        println!("{}", serde_json::to_string(&body)?);
    }
    Ok(())
}

/// `--compute-only`: weight bytes the products touched, against the memory's read bandwidth.
struct ComputeFigures {
    prefill_tokens_per_s: f64,
    prefill_weight_bytes: f64,
    weight_bytes_per_token: f64,
    decode_s_per_token: f64,
    memory_bps: f64,
}

impl ComputeFigures {
    /// From the marks before the prompt, at the first token and at the last, and the memory's
    /// bandwidth measured now (a buffer of 1 GiB, best of 3 passes, the kernels' threads).
    fn measure(before: &Mark, marks: &[(Mark, Option<f64>, Mark)], prompt_tokens: usize) -> ComputeFigures {
        let (first, last) = (&marks[0].0, &marks[marks.len() - 1].0);
        let prompt_s = (first.at - before.at).as_secs_f64();
        let steps = (marks.len() - 1).max(1) as f64;
        ComputeFigures {
            prefill_tokens_per_s: prompt_tokens as f64 / prompt_s.max(1e-9),
            prefill_weight_bytes: (first.weights - before.weights) as f64,
            weight_bytes_per_token: (last.weights - first.weights) as f64 / steps,
            decode_s_per_token: (last.at - first.at).as_secs_f64() / steps,
            memory_bps: strata_kernels::membw::read_bandwidth(1 << 30, 3),
        }
    }

    fn weights_bps(&self) -> f64 {
        self.weight_bytes_per_token / self.decode_s_per_token.max(1e-12)
    }

    fn print(&self) {
        println!(
            "compute only          every expert in the cache, nothing read; memory reads {:.1} GB/s ({} threads, 1 GiB, best of 3)",
            self.memory_bps / 1e9,
            strata_kernels::threads()
        );
        println!(
            "compute prefill       {:.1} tokens/s ({:.2} GB of weights touched)",
            self.prefill_tokens_per_s,
            self.prefill_weight_bytes / 1e9
        );
        println!(
            "compute decode        {:.3} GB of weights per token at {:.1} GB/s = {:.0} % of the memory's read bandwidth",
            self.weight_bytes_per_token / 1e9,
            self.weights_bps() / 1e9,
            100.0 * self.weights_bps() / self.memory_bps
        );
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "memory_gbs": self.memory_bps / 1e9,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "prefill_weight_bytes": self.prefill_weight_bytes,
            "weight_bytes_per_token": self.weight_bytes_per_token,
            "weights_gbs": self.weights_bps() / 1e9,
            "weights_over_memory": self.weights_bps() / self.memory_bps,
        })
    }
}

/// The counters at one moment of the run.
struct Mark {
    at: Instant,
    store: [u64; 8],
    phases: [u64; 3],
    asked: u64,
    right: u64,
    /// Weight bytes the matrix products have read so far.
    weights: u64,
}

/// What happened between two marks (one token, or the whole decode).
struct TokenFigures {
    /// The disk's direct-read rate around this token (for a sum: bytes over the sum of each
    /// token's bytes / rate).
    raw_gbs: f64,
    seconds: f64,
    /// Waiting for expert reads and for streamed layers' reads.
    wait_s: f64,
    spine_wait_s: f64,
    busy_s: f64,
    expert_s: f64,
    /// Of `expert_s`, the routed experts' products (the rest: router, shared expert, latent
    /// projections, the weighted sums).
    routed_s: f64,
    attention_s: f64,
    bytes: f64,
    /// Of `bytes`, streamed layers' non-expert weights.
    spine_bytes: f64,
    hits: f64,
    misses: f64,
    asked: f64,
    right: f64,
}

impl TokenFigures {
    fn between(a: &Mark, b: &Mark, raw_bw: f64) -> TokenFigures {
        let d = |i: usize| (b.store[i] - a.store[i]) as f64;
        let expert_wait_s = d(4) / 1e9;
        let spine_wait_s = d(7) / 1e9;
        let moe_s = (b.phases[1] - a.phases[1]) as f64 / 1e9;
        TokenFigures {
            raw_gbs: raw_bw / 1e9,
            seconds: (b.at - a.at).as_secs_f64(),
            wait_s: expert_wait_s + spine_wait_s,
            spine_wait_s,
            busy_s: d(5) / 1e9,
            // MoE layers' time less their wait for reads: router, shared and routed experts.
            expert_s: (moe_s - expert_wait_s).max(0.0),
            routed_s: (b.phases[2] - a.phases[2]) as f64 / 1e9,
            attention_s: (b.phases[0] - a.phases[0]) as f64 / 1e9,
            bytes: d(2),
            spine_bytes: d(6),
            hits: d(0),
            misses: d(1),
            asked: (b.asked - a.asked) as f64,
            right: (b.right - a.right) as f64,
        }
    }

    fn sum(all: &[TokenFigures]) -> TokenFigures {
        let add = |f: fn(&TokenFigures) -> f64| all.iter().map(f).sum::<f64>();
        let (bytes, bound) = (add(|t| t.bytes), add(|t| t.io_bound_s()));
        TokenFigures {
            raw_gbs: if bound > 0.0 {
                bytes / bound / 1e9
            } else {
                add(|t| t.raw_gbs) / all.len() as f64
            },
            seconds: add(|t| t.seconds),
            wait_s: add(|t| t.wait_s),
            spine_wait_s: add(|t| t.spine_wait_s),
            busy_s: add(|t| t.busy_s),
            expert_s: add(|t| t.expert_s),
            routed_s: add(|t| t.routed_s),
            attention_s: add(|t| t.attention_s),
            bytes,
            spine_bytes: add(|t| t.spine_bytes),
            hits: add(|t| t.hits),
            misses: add(|t| t.misses),
            asked: add(|t| t.asked),
            right: add(|t| t.right),
        }
    }

    /// The time the disk needs for these bytes at its measured rate.
    fn io_bound_s(&self) -> f64 {
        if self.raw_gbs > 0.0 {
            self.bytes / (self.raw_gbs * 1e9)
        } else {
            0.0
        }
    }

    /// Norms, embedding, dense MLPs, the LM head, sampling: what is neither reads, experts nor
    /// attention.
    fn other_s(&self) -> f64 {
        (self.seconds - self.wait_s - self.expert_s - self.attention_s).max(0.0)
    }

    /// Bytes over the time the disk had reads in flight.
    fn read_gbs(&self) -> f64 {
        if self.busy_s > 0.0 {
            self.bytes / self.busy_s / 1e9
        } else {
            0.0
        }
    }

    fn hit_rate(&self) -> f64 {
        if self.hits + self.misses > 0.0 {
            self.hits / (self.hits + self.misses)
        } else {
            0.0
        }
    }

    fn recall(&self) -> f64 {
        if self.asked > 0.0 {
            self.right / self.asked
        } else {
            0.0
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "seconds": self.seconds, "io_wait_s": self.wait_s, "expert_compute_s": self.expert_s,
            "attention_s": self.attention_s, "other_s": self.other_s(), "bytes_read": self.bytes,
            "spine_bytes_read": self.spine_bytes, "spine_wait_s": self.spine_wait_s,
            "read_gbps": self.read_gbs(), "raw_gbps": self.raw_gbs, "hit_rate": self.hit_rate(),
            "prefetch_recall": self.recall(),
        })
    }
}

/// The plan's decision in one line: where --mem went and the bytes a token is expected to read.
fn plan_line(m: &strata_runtime::MemoryPlan) -> String {
    let size = |b: usize| {
        if b >= 1 << 30 {
            format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
        } else {
            format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
        }
    };
    let streamed = if m.streamed.is_empty() {
        "resident".to_string()
    } else {
        format!(
            "{} layers streamed ({}/token)",
            m.streamed.len(),
            size(m.streamed_bytes)
        )
    };
    format!(
        "--mem {}: spine {} {streamed}, expert cache {} ({:.1} % of the experts), read buffers {}, working {}, state {}; expected reads {:.1} MB/token",
        size(m.mem),
        size(m.resident),
        size(m.expert_cache),
        100.0 * m.expert_cache as f64 / m.expert_bytes.max(1) as f64,
        size(m.buffers + m.spine_buffers),
        size(m.work),
        size(m.state_reserve()),
        m.expected_read_per_token as f64 / 1e6
    )
}
