//! `strata pull MODEL`: fills the local cache of a remote model ahead of time, as `hf download`
//! does: every byte by default (`--experts none`: only the non-expert tensors, experts fetched
//! when first used), shards chosen with `--include`/`--exclude` globs, a progress bar, and
//! `--local-dir` for a plain folder of the files; an interrupted pull resumes where it stopped
//! (the cache records each run).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use strata_formats::RangeSource;

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
    cache_dir: Option<PathBuf>,
    /// The revision (branch, tag or commit) of an hf:// model, as `@REVISION` gives it.
    #[arg(long, value_name = "REV")]
    revision: Option<String>,
    /// Which routed experts to fetch now: all (every byte, the default) or none.
    #[arg(long, value_enum, default_value_t = Experts::All)]
    experts: Experts,
    /// Fetch only the shards whose file name matches this glob (`*`, `?`; may be given several
    /// times). The small files (config, tokenizer) always come.
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Skip the shards whose file name matches this glob (may be given several times).
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Also put the files in this folder (hard links into the cache where they can be, else
    /// copies): a plain model folder any tool reads. Needs every byte (not with --experts none).
    #[arg(long, value_name = "DIR")]
    local_dir: Option<PathBuf>,
}

/// Whether `name` matches `glob` (`*` any run of characters, `?` one character).
pub fn glob_match(glob: &str, name: &str) -> bool {
    let (g, n): (Vec<char>, Vec<char>) = (glob.chars().collect(), name.chars().collect());
    // The classic two-pointer match with one backtrack point for the last `*`.
    let (mut gi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if gi < g.len() && (g[gi] == '?' || g[gi] == n[ni]) {
            gi += 1;
            ni += 1;
        } else if gi < g.len() && g[gi] == '*' {
            star = Some(gi);
            mark = ni;
            gi += 1;
        } else if let Some(s) = star {
            gi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|&c| c == '*')
}

/// The model spec with `--revision` applied.
fn spec_of(args: &PullArgs) -> Result<String> {
    let Some(rev) = &args.revision else {
        return Ok(args.model.clone());
    };
    let spec = super::hub_shorthand(&args.model).unwrap_or_else(|| args.model.clone());
    if !spec.starts_with("hf://") {
        bail!("--revision is for hf:// models; {} is not one", args.model);
    }
    if spec.contains('@') {
        bail!("give the revision once: {} already names one", args.model);
    }
    Ok(format!("{spec}@{rev}"))
}

/// Requests of at most this many bytes (a progress step, and what an interruption loses).
const CHUNK: u64 = 64 << 20;
/// Requests in flight at once.
const PARALLEL: usize = 8;

pub fn pull(args: PullArgs) -> Result<()> {
    let spec = spec_of(&args)?;
    if args.local_dir.is_some() && args.experts == Experts::None {
        bail!("--local-dir needs every byte of the files: not with --experts none");
    }
    let model = ModelArg::of(spec.clone(), args.cache_dir.clone(), false);
    let (dir, mirror) = model.open()?;
    let Some(mirror) = mirror else {
        bail!("{} is a local folder: there is nothing to pull", dir.display());
    };
    // A safetensors folder, or a GGUF file in the mirror's folder.
    let (cfg, ckpt) = strata_formats::open_model(&dir)?;
    let dir = mirror.dir.clone();
    let shard_name = |s: usize| {
        ckpt.shard_path(s)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let chosen: HashSet<usize> = (0..ckpt.n_shards())
        .filter(|&s| {
            let name = shard_name(s);
            (args.include.is_empty() || args.include.iter().any(|g| glob_match(g, &name)))
                && !args.exclude.iter().any(|g| glob_match(g, &name))
        })
        .collect();
    if chosen.is_empty() {
        bail!("--include/--exclude leave none of the {} shards", ckpt.n_shards());
    }
    // (shard index -> sorted (offset, end)) of what to fetch.
    let mut wanted: BTreeMap<usize, Vec<(u64, u64)>> = BTreeMap::new();
    match args.experts {
        Experts::All => {
            for s in (0..ckpt.n_shards()).filter(|s| chosen.contains(s)) {
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
            for entry in ckpt.entries().filter(|e| chosen.contains(&e.shard)) {
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
        return Err(anyhow::Error::msg(e)).with_context(|| format!("pulling {spec}"));
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
    let full = super::hub_shorthand(&spec).unwrap_or_else(|| spec.clone());
    if let strata_remote::Location::Hf {
        repo,
        revision,
        pick: None,
    } = strata_remote::Location::parse(&full)
    {
        // What was fetched whole, for huggingface_hub, transformers and vLLM too.
        let shared = strata_remote::hub::share(&repo, &revision, &dir).map_err(anyhow::Error::msg)?;
        let hub = strata_remote::hub::hub_dir();
        if shared.other_fs {
            eprintln!(
                "[strata] the Hugging Face cache {} is on another file system: not shared (a copy would double the disk used)",
                hub.display()
            );
        } else if shared.files > 0 {
            eprintln!(
                "[strata] {} complete files shared with the Hugging Face cache {}{}",
                shared.files,
                hub.display(),
                if shared.partial > 0 {
                    format!(" ({} partial shards not yet)", shared.partial)
                } else {
                    String::new()
                }
            );
        }
    }
    if let Some(local) = &args.local_dir {
        let shards: Vec<String> = chosen.iter().map(|&s| shard_name(s)).collect();
        let n = place_files(&dir, local, &shards)?;
        eprintln!("[strata] {n} files in {}", local.display());
    }
    eprintln!(
        "[strata] pulled {spec} into {}: {:.1} MB in {} requests, {:.1} s",
        dir.display(),
        mirror.bytes_fetched() as f64 / 1e6,
        mirror.range_requests(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Puts the cache's small files and the `shards` pulled into `local`, hard-linked where the two
/// share a file system, else copied; returns how many.
fn place_files(cache: &Path, local: &Path, shards: &[String]) -> Result<usize> {
    std::fs::create_dir_all(local).with_context(|| format!("creating {}", local.display()))?;
    let mut n = 0;
    for entry in std::fs::read_dir(cache).with_context(|| format!("reading {}", cache.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let ours = name.ends_with(strata_remote::RUNS_SUFFIX)
            || name.ends_with(strata_remote::META_SUFFIX)
            || name == strata_remote::ABSENT_FILE
            || name.starts_with('.');
        let shard = name.ends_with(".safetensors");
        if ours || (shard && !shards.contains(&name)) {
            continue;
        }
        // A shard may be a link to the Hugging Face cache's copy: the file it names.
        let from = std::fs::canonicalize(cache.join(&name))
            .with_context(|| format!("{}/{name}", cache.display()))?;
        let to = local.join(&name);
        let _ = std::fs::remove_file(&to);
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn globs_match_as_shells_do() {
        for (g, n) in [
            ("*", "model-00001-of-00004.safetensors"),
            ("*.safetensors", "a.safetensors"),
            (
                "model-?????-of-00004.safetensors",
                "model-00002-of-00004.safetensors",
            ),
            ("*-00001-*", "model-00001-of-00004.safetensors"),
            ("a*b*c", "aXbYc"),
            ("", ""),
        ] {
            assert!(glob_match(g, n), "{g} {n}");
        }
        for (g, n) in [
            ("*.json", "a.safetensors"),
            ("model-?-of", "model-12-of"),
            ("a*b*c", "aXbY"),
            ("abc", "abcd"),
            ("", "a"),
        ] {
            assert!(!glob_match(g, n), "{g} {n}");
        }
    }
}
