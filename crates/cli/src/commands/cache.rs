//! `strata cache ls|verify|gc`: see, check and trim the cache of remote models; `strata ls` and
//! `strata rm MODEL` as their short forms.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use strata_remote::maintain;

#[derive(clap::Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    action: Action,
    /// The cache. Default: $XDG_CACHE_HOME/strata or ~/.cache/strata.
    #[arg(long, value_name = "DIR", global = true)]
    cache_dir: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum Action {
    /// List cached models: revision, bytes present of their full size, shards.
    Ls,
    /// Re-read every cached byte run and check it against its recorded checksum (and whole
    /// shards against the server's sha256). Exits 1 when something is wrong.
    Verify {
        /// Drop bad runs from the record so they are fetched again.
        #[arg(long)]
        repair: bool,
    },
    /// Remove cached revisions, least recently used first (a revision is used when a command
    /// opens it), down to --max-size, or every one with --all (one of the two must be given).
    #[command(group(clap::ArgGroup::new("how_much").required(true).args(["max_size", "all"])))]
    Gc {
        #[arg(long, value_name = "SIZE", value_parser = strata_runtime::parse_size)]
        max_size: Option<usize>,
        /// Remove every cached model.
        #[arg(long)]
        all: bool,
    },
}

fn gb(b: u64) -> String {
    format!("{:.2} GB", b as f64 / 1e9)
}

/// `strata ls`.
#[derive(clap::Args)]
pub struct LsArgs {
    /// The cache. Default: $XDG_CACHE_HOME/strata or ~/.cache/strata.
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

/// `strata rm`.
#[derive(clap::Args)]
pub struct RmArgs {
    /// The cached model: as given to other commands (`hf://ORG/NAME[@REVISION]`, `ORG/NAME`, a
    /// URL) or as `strata ls` names it.
    #[arg(value_name = "MODEL")]
    model: String,
    /// Only this revision (branch, tag or commit); else every cached revision.
    #[arg(long, value_name = "REV")]
    revision: Option<String>,
    /// The cache. Default: $XDG_CACHE_HOME/strata or ~/.cache/strata.
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

/// The name other commands take for a cache folder's model (`hf--ORG--NAME` -> `hf://ORG/NAME`).
fn model_name(folder: &str) -> String {
    match folder.strip_prefix("hf--") {
        Some(rest) => format!("hf://{}", rest.replacen("--", "/", 1)),
        None => folder.to_string(),
    }
}

fn ago(t: SystemTime) -> String {
    let s = SystemTime::now().duration_since(t).map_or(0, |d| d.as_secs());
    match s {
        s if s < 120 => format!("{s} s ago"),
        s if s < 7200 => format!("{} min ago", s / 60),
        s if s < 2 * 86400 => format!("{} h ago", s / 3600),
        s => format!("{} days ago", s / 86400),
    }
}

fn list(dir: &Path) {
    let models = maintain::list(dir);
    if models.is_empty() {
        println!("{}: no cached models", dir.display());
    }
    for m in models {
        println!(
            "{}  {}  {} of {} ({:.0} %), {} shards, used {}  {}",
            model_name(&m.name),
            m.revision,
            gb(m.present),
            gb(m.size),
            100.0 * m.present as f64 / m.size.max(1) as f64,
            m.shards,
            ago(m.last_used),
            m.dir.display()
        );
    }
}

pub fn ls(args: LsArgs) -> Result<()> {
    list(&args.cache_dir.unwrap_or_else(strata_remote::default_cache_dir));
    Ok(())
}

pub fn rm(args: RmArgs) -> Result<()> {
    let cache = args
        .cache_dir
        .clone()
        .unwrap_or_else(strata_remote::default_cache_dir);
    let (root, spec_rev) = if args.model.starts_with("hf--") || args.model.starts_with("url--") {
        (cache.join("models").join(&args.model), None)
    } else {
        let spec = super::hub_shorthand(&args.model).unwrap_or_else(|| args.model.clone());
        let location = strata_remote::Location::parse(&spec);
        let rev = match &location {
            strata_remote::Location::Local(p) => {
                bail!("{} is not a cached model (strata ls lists them)", p.display())
            }
            strata_remote::Location::Hf { revision, .. } => spec.contains('@').then(|| revision.clone()),
            strata_remote::Location::Url(_) => None,
        };
        let options = strata_remote::RemoteOptions::new(Some(cache.clone()), true);
        (location.model_root(&options), rev)
    };
    if !root.is_dir() {
        bail!(
            "{} is not in the cache {} (strata ls lists what is)",
            args.model,
            cache.display()
        );
    }
    let revision = match (args.revision.clone(), spec_rev) {
        (Some(_), Some(_)) => bail!("give the revision once"),
        (r, None) | (None, r) => r,
    };
    let name = model_name(&root.file_name().unwrap_or_default().to_string_lossy());
    let gone: Vec<_> = maintain::list(&cache)
        .into_iter()
        .filter(|m| m.dir.starts_with(&root))
        .filter(|m| {
            revision
                .as_ref()
                .is_none_or(|r| revision_matches(&root, &m.revision, r))
        })
        .collect();
    if revision.is_some() && gone.is_empty() {
        bail!("{name} has no cached revision {}", revision.unwrap_or_default());
    }
    match &revision {
        None => std::fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?,
        Some(_) => {
            for m in &gone {
                std::fs::remove_dir_all(&m.dir).with_context(|| format!("removing {}", m.dir.display()))?;
            }
        }
    }
    for m in &gone {
        println!("removed {name} {} ({})", m.revision, gb(m.present));
    }
    Ok(())
}

/// Whether cached `commit` is revision `rev` (the commit itself, or a branch or tag whose ref
/// names it).
fn revision_matches(root: &Path, commit: &str, rev: &str) -> bool {
    commit == rev || std::fs::read_to_string(root.join("refs").join(rev)).is_ok_and(|c| c.trim() == commit)
}

pub fn cache(args: CacheArgs) -> Result<()> {
    let dir = args.cache_dir.unwrap_or_else(strata_remote::default_cache_dir);
    match args.action {
        Action::Ls => list(&dir),
        Action::Verify { repair } => {
            let mut bad = 0;
            for m in maintain::list(&dir) {
                let r = maintain::verify(&m.dir, repair)?;
                println!(
                    "{} {}: {} runs, {} checked, {} whole-file sha256 checks, {}",
                    m.name,
                    m.revision,
                    r.runs_checked,
                    gb(r.bytes_checked),
                    r.sha256_checked,
                    if r.bad.is_empty() {
                        "ok".to_string()
                    } else {
                        format!("{} BAD", r.bad.len())
                    }
                );
                for b in &r.bad {
                    println!(
                        "  {}: bytes {}..{}: {}{}",
                        b.file.display(),
                        b.run.offset,
                        b.run.offset + b.run.len,
                        b.reason,
                        if repair { " (dropped)" } else { "" }
                    );
                }
                bad += r.bad.len();
            }
            if bad > 0 && !repair {
                bail!("{bad} cached runs are corrupt; `strata cache verify --repair` drops them");
            }
        }
        Action::Gc { max_size, .. } => {
            // Without --max-size, --all was given (clap requires one): down to nothing.
            for m in maintain::gc(&dir, max_size.unwrap_or(0) as u64)? {
                println!("removed {} {} ({})", m.name, m.revision, gb(m.present));
            }
        }
    }
    Ok(())
}
