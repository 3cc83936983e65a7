//! What `strata bench` does before it times anything (every expert read in for
//! `--compute-only`, and copied to the GPU with `--gpu-experts`; the GPU's warm-up) and the GPU's
//! figures after.

use std::time::Instant;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use strata_runtime::Request;

/// Copies the weights the GPU keeps and makes its pipelines before anything is timed: a
/// two-token prompt and two tokens (the second the first one-token step), untimed (their state
/// is dropped after; the experts they read stay in the cache, a head start of four tokens'
/// experts over a CPU run).
pub(super) fn warm_gpu(
    engine: &strata_runtime::Engine,
    request: &Request,
    g: &strata_gpu::Offload,
) -> Result<()> {
    let t = Instant::now();
    let warm = Request {
        prompt: request.prompt.iter().copied().take(2).collect(),
        max_new_tokens: 2,
        stop: vec![],
        ignore_eos: true,
        sampling: request.sampling.clone(),
    };
    engine.generate(std::slice::from_ref(&warm), |_, _| {})?;
    eprintln!(
        "gpu warm-up: {:.2} GiB of weights copied there in {:.2} s (not timed; the experts of its three tokens stay cached)",
        g.resident_bytes() as f64 / (1u64 << 30) as f64,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What the GPU did over the run, and its memory's read rate and the host link's copy rates
/// measured now (`host_to_gpu_gbps`: host to GPU, threads writing side by side through staging
/// memory, the link's way in as weights use it; `host_staged_gbps`: one thread;
/// `host_write_gbps`: through the queue; `host_copy_gbps`: GPU to host memory); `uses`: the routed experts' weight uses on it before the timed tokens
/// ([`strata_kernels::offload::expert_uses`]).
pub(super) fn gpu_figures(g: &strata_gpu::Offload, uses: (u64, u64)) -> serde_json::Value {
    let read = g.gpu().read_rate(1 << 30, 3).unwrap_or(0.0);
    let rates = g.gpu().upload_rates(256 << 20, 3).unwrap_or_default();
    let (hits, copies) = strata_kernels::offload::expert_uses();
    serde_json::json!({
        "adapter": g.gpu().adapter().to_string(),
        "kept_bytes": g.resident_bytes(),
        "copied_bytes": g.streamed_bytes(),
        "products": g.products(),
        "expert_products": g.expert_products(),
        "resident_layers": g.resident_layers(),
        "expert_hits": hits - uses.0,
        "expert_copies": copies - uses.1,
        "memory_read_gbps": read / 1e9,
        "host_to_gpu_gbps": rates.to_gpu / 1e9,
        "host_copy_gbps": rates.to_host / 1e9,
        "host_staged_gbps": rates.staged / 1e9,
        "host_write_gbps": rates.queued / 1e9,
    })
}

/// `--compute-only`: every expert read into the cache first, with a progress bar.
pub(super) fn load_every_expert(store: &strata_experts::CachedStore) -> Result<()> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "reading every expert into the cache {bar:40} {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .expect("progress template"),
    );
    // With --gpu-experts, every expert is copied to the GPU too while the budget has room, so
    // the timed tokens measure its compute, not the link (whose rate is said here).
    let gpu = super::gpu().filter(|g| strata_kernels::offload::Device::takes_experts(*g));
    let (mut copied, mut copy_s, mut room) = (0u64, 0f64, true);
    store
        .load_all(
            &mut |done, total| {
                bar.set_length(total);
                bar.set_position(done);
            },
            &mut |e| {
                if gpu.is_none() || !room {
                    return;
                }
                let t = Instant::now();
                for lin in [&e.gate, &e.up, &e.down] {
                    room &= lin.on_device().is_some_and(|c| c.is_kept());
                }
                copy_s += t.elapsed().as_secs_f64();
                copied += e.bytes() as u64;
            },
        )
        .map_err(|e| anyhow::anyhow!("--compute-only: {e}"))?;
    bar.finish_and_clear();
    if let Some(g) = gpu {
        let t = Instant::now();
        g.gpu()
            .flush()
            .map_err(|e| anyhow::anyhow!("--compute-only: {e}"))?;
        copy_s += t.elapsed().as_secs_f64();
        eprintln!(
            "gpu: {:.2} GiB of experts copied there in {:.2} s ({:.2} GB/s){}",
            copied as f64 / (1u64 << 30) as f64,
            copy_s,
            copied as f64 / copy_s.max(1e-9) / 1e9,
            if room {
                ""
            } else {
                "; --gpu-mem is full, the rest are copied per product"
            }
        );
    }
    Ok(())
}
