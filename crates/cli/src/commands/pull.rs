//! `strata pull MODEL [--experts all|none]`: fills the local cache of a remote model ahead of
//! time (the non-expert tensors always; every routed expert with `--experts all`), with a
//! progress bar; an interrupted pull resumes where it stopped (the cache records each run).

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use strata_formats::{Checkpoint, JsonConfig, RangeSource};

use super::ModelArg;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Experts {
    /// Only the non-expert tensors (experts are fetched when first used).
    None,
    /// Every byte of every shard.
    All,
}

#[derive(clap::Args)]
pub struct PullArgs {
    /// `hf://ORG/NAME[@REVISION]` (or a bare `ORG/NAME[@REVISION]`) or an `http(s)://` folder
    /// URL.
    #[arg(value_name = "MODEL")]
    model: String,
    /// Cache for remote models. Default: $XDG_CACHE_HOME/strata or ~/.cache/strata.
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<std::path::PathBuf>,
    /// Which routed experts to fetch now.
    #[arg(long, value_enum, default_value_t = Experts::None)]
    experts: Experts,
}

/// Requests of at most this many bytes (a progress step, and what an interruption loses).
const CHUNK: u64 = 64 << 20;
/// Requests in flight at once.
const PARALLEL: usize = 8;

pub fn pull(args: PullArgs) -> Result<()> {
    let model = ModelArg::of(args.model.clone(), args.cache_dir.clone(), false);
    let (dir, mirror) = model.open()?;
    let Some(mirror) = mirror else {
        bail!("{} is a local folder: there is nothing to pull", dir.display());
    };
    let cfg = JsonConfig::read(&dir.join("config.json"))?;
    let ckpt = Checkpoint::open(&dir)?;
    // (shard index -> sorted (offset, end)) of what to fetch.
    let mut wanted: BTreeMap<usize, Vec<(u64, u64)>> = BTreeMap::new();
    match args.experts {
        Experts::All => {
            for s in 0..ckpt.n_shards() {
                let size = std::fs::metadata(ckpt.shard_path(s))?.len();
                wanted.entry(s).or_default().push((0, size));
            }
        }
        Experts::None => {
            let family = strata_models::family_for(&cfg)?;
            let layout = (family.expert_layout)(&cfg)?;
            let mut prefixes = HashSet::new();
            for &l in &layout.moe_layers {
                for e in 0..layout.n_experts {
                    for p in 0..3 {
                        prefixes.insert(layout.tensor_base(l, e, p));
                    }
                }
            }
            for entry in ckpt.entries() {
                let is_expert = entry
                    .info
                    .name
                    .rsplit_once('.')
                    .is_some_and(|(base, _)| prefixes.contains(base));
                if !is_expert {
                    let (o, l) = (entry.info.offset, entry.info.len);
                    wanted.entry(entry.shard).or_default().push((o, o + l));
                }
            }
        }
    }
    // Adjacent tensors make one run; runs are split into chunks.
    let mut jobs: Vec<(String, u64, u64)> = Vec::new();
    let mut total = 0u64;
    for (shard, mut ranges) in wanted {
        ranges.sort_unstable();
        let name = ckpt
            .shard_path(shard)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (a, b) in ranges {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        for (a, b) in merged {
            for (gap_at, gap_len) in mirror.missing(&name, a, b - a).map_err(anyhow::Error::msg)? {
                let mut at = gap_at;
                while at < gap_at + gap_len {
                    let n = CHUNK.min(gap_at + gap_len - at);
                    jobs.push((name.clone(), at, n));
                    total += n;
                    at += n;
                }
            }
        }
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}")
            .expect("progress template"),
    );
    let t0 = Instant::now();
    // Several requests in flight (bounded), each chunk recorded as it lands.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL.min(jobs.len()).max(1) {
            scope.spawn(|| loop {
                if failed.lock().expect("pull lock").is_some() {
                    return;
                }
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((name, at, n)) = jobs.get(i) else { return };
                bar.set_message(name.clone());
                match mirror.ensure(name, *at, *n) {
                    Ok(()) => bar.inc(*n),
                    Err(e) => {
                        failed.lock().expect("pull lock").get_or_insert(e);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().expect("pull lock") {
        bar.abandon();
        return Err(anyhow::Error::msg(e)).with_context(|| format!("pulling {}", args.model));
    }
    bar.finish_and_clear();
    if args.experts == Experts::All {
        // Whole files: check them against the server's sha256 where it gave one.
        let report = strata_remote::maintain::verify(&dir, false)?;
        if let Some(bad) = report.bad.first() {
            bail!(
                "{}: {} (run `strata cache verify --repair`)",
                bad.file.display(),
                bad.reason
            );
        }
    }
    eprintln!(
        "[strata] pulled {} into {}: {:.1} MB in {} requests, {:.1} s",
        args.model,
        dir.display(),
        mirror.bytes_fetched() as f64 / 1e6,
        mirror.range_requests(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
