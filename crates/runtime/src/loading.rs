//! The long stages of a load, each told to a [`LoadProgress`] (the CLI's progress bars) and
//! logged at `info` with its size and time: fetching a remote model's non-expert weights,
//! reading the resident ones, and preloading the expert cache; and the memory plan in one line.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_experts::CachedStore;
use strata_formats::{Checkpoint, JsonConfig};
use strata_models::family_for;

use crate::{EngineError, MemoryPlan};

/// Told what a long load is doing (bytes done of a stage's total), for progress bars.
pub trait LoadProgress: Send + Sync {
    /// A stage begins: what it does and the bytes it will move.
    fn start(&self, what: &str, total: u64);
    /// Bytes done so far in the stage.
    fn set(&self, done: u64);
    /// The stage is over.
    fn finish(&self);
}

/// A [`LoadProgress`] in [`crate::LoadOptions`].
#[derive(Clone)]
pub struct Progress(pub Arc<dyn LoadProgress>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

/// A size in GiB, MiB or KiB.
fn size(b: u64) -> String {
    let (k, m, g) = (1u64 << 10, 1u64 << 20, 1u64 << 30);
    match b {
        b if b >= g => format!("{:.2} GiB", b as f64 / g as f64),
        b if b >= m => format!("{:.1} MiB", b as f64 / m as f64),
        b => format!("{:.0} KiB", b as f64 / k as f64),
    }
}

/// Runs `work` as a stage of `total` bytes, telling `progress` what `done()` says every 100 ms.
pub(crate) fn stage<R>(
    progress: Option<&Progress>,
    what: &str,
    total: u64,
    done: impl Fn() -> u64 + Sync,
    work: impl FnOnce() -> R,
) -> R {
    let Some(Progress(p)) = progress else {
        return work();
    };
    p.start(what, total);
    let over = std::sync::atomic::AtomicBool::new(false);
    let out = std::thread::scope(|scope| {
        let poller = scope.spawn(|| {
            while !over.load(std::sync::atomic::Ordering::Relaxed) {
                p.set(done());
                std::thread::park_timeout(Duration::from_millis(100));
            }
        });
        let out = work();
        over.store(true, std::sync::atomic::Ordering::Relaxed);
        poller.thread().unpark();
        out
    });
    p.set(done());
    p.finish();
    out
}

/// The plan in one line.
pub(crate) fn plan_line(m: &MemoryPlan) -> String {
    format!(
        "memory plan: --mem {} = non-expert weights {} resident ({} layers streamed, {} per token) + decoding state {} ({} positions per sequence) + read buffers {} + working memory {} + prefix cache {} + expert cache {} ({:.0} % of the experts' {}); a token is expected to read {}",
        size(m.mem as u64),
        size(m.resident as u64),
        m.streamed.len(),
        size(m.streamed_bytes as u64),
        size(m.state_reserve() as u64),
        m.ctx_size,
        size((m.buffers + m.spine_buffers) as u64),
        size(m.work as u64),
        size(m.prefix_cache as u64),
        size(m.expert_cache as u64),
        100.0 * (m.expert_cache as f64 / m.expert_bytes.max(1) as f64).min(1.0),
        size(m.expert_bytes),
        size(m.expected_read_per_token),
    )
}

/// Loads the resident weights with `load`, as a stage measured by the bytes `ckpt` reads.
pub(crate) fn resident<R>(
    progress: Option<&Progress>,
    ckpt: &Checkpoint,
    planned: u64,
    load: impl FnOnce() -> R,
) -> R {
    let (t0, before) = (Instant::now(), ckpt.bytes_read());
    let out = stage(
        progress,
        "loading the non-expert weights",
        planned,
        || ckpt.bytes_read() - before,
        load,
    );
    let (read, s) = (ckpt.bytes_read() - before, t0.elapsed().as_secs_f64());
    tracing::info!(
        "non-expert weights: {} read in {s:.2} s ({:.2} GB/s)",
        size(read),
        read as f64 / s.max(1e-9) / 1e9
    );
    out
}

/// For a checkpoint whose bytes come from a remote source: makes every non-expert tensor present
/// first, adjacent tensors merged into one range (one request per contiguous missing run rather
/// than one per tensor).
pub(crate) fn fetch_resident(
    cfg: &JsonConfig,
    ckpt: &Checkpoint,
    progress: Option<&Progress>,
) -> Result<(), EngineError> {
    let layout = (family_for(cfg)?.expert_layout)(cfg)?;
    let mut prefixes = HashSet::new();
    for &l in &layout.moe_layers {
        for e in 0..layout.n_experts {
            for p in 0..3 {
                prefixes.insert(layout.tensor_base(l, e, p));
            }
        }
    }
    let mut ranges: Vec<(usize, u64, u64)> = ckpt
        .entries()
        .filter(|e| {
            !e.info
                .name
                .rsplit_once('.')
                .is_some_and(|(base, _)| prefixes.contains(base))
        })
        .map(|e| (e.shard, e.info.offset, e.info.offset + e.info.len))
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(usize, u64, u64)> = Vec::new();
    for (shard, a, b) in ranges {
        match merged.last_mut() {
            Some(last) if last.0 == shard && a <= last.2 => last.2 = last.2.max(b),
            _ => merged.push((shard, a, b)),
        }
    }
    let total: u64 = merged.iter().map(|(_, a, b)| b - a).sum();
    let done = std::sync::atomic::AtomicU64::new(0);
    let t0 = Instant::now();
    stage(
        progress,
        "fetching the non-expert weights",
        total,
        || done.load(std::sync::atomic::Ordering::Relaxed),
        || -> Result<(), EngineError> {
            for &(shard, a, b) in &merged {
                ckpt.ensure(shard, a, b - a)?;
                done.fetch_add(b - a, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        },
    )?;
    tracing::info!(
        "non-expert weights present in the cache: {} in {} ranges, {:.2} s",
        size(total),
        merged.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Waits for the expert cache to be faulted in or preloaded (begun as the store opened, so
/// mostly done while the rest loaded), saying so when that wait is long.
pub(crate) fn finish_warming(
    store: &CachedStore,
    progress: Option<&Progress>,
) -> Result<strata_experts::Warmed, EngineError> {
    let t0 = Instant::now();
    let mut started = false;
    let warmed = store
        .finish_warming(&mut |done, total| {
            if let Some(Progress(p)) = progress {
                if !started {
                    p.start("reading experts into the cache", total);
                    started = true;
                }
                p.set(done);
            }
        })
        .map_err(|e| EngineError::Preload(e.to_string()));
    if let (true, Some(Progress(p))) = (started, progress) {
        p.finish();
    }
    let warmed = warmed?;
    let waited = t0.elapsed().as_secs_f64();
    let what = if warmed.preloaded_experts > 0 {
        format!(
            "{} experts ({}) read into it",
            warmed.preloaded_experts,
            size(warmed.preloaded_bytes)
        )
    } else {
        format!("{} of read buffers faulted in", size(warmed.faulted_in))
    };
    tracing::info!("expert cache: {what} as the model loaded ({waited:.2} s after the rest)");
    if waited >= 1.0 {
        eprintln!("[strata] expert cache: {what} as the model loaded ({waited:.1} s after the rest)");
    }
    Ok(warmed)
}
