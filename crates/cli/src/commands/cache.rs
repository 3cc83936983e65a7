//! `strata cache ls|verify|gc`: see, check and trim the cache of remote models.

use std::path::PathBuf;

use anyhow::{bail, Result};
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
    /// Remove cached revisions, least recently used first, down to --max-size, or every one
    /// with --all (one of the two must be given).
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

pub fn cache(args: CacheArgs) -> Result<()> {
    let dir = args.cache_dir.unwrap_or_else(strata_remote::default_cache_dir);
    match args.action {
        Action::Ls => {
            let models = maintain::list(&dir);
            if models.is_empty() {
                println!("{}: no cached models", dir.display());
            }
            for m in models {
                println!(
                    "{}  {}  {} of {} ({:.0} %), {} shards  {}",
                    m.name,
                    m.revision,
                    gb(m.present),
                    gb(m.size),
                    100.0 * m.present as f64 / m.size.max(1) as f64,
                    m.shards,
                    m.dir.display()
                );
            }
        }
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
