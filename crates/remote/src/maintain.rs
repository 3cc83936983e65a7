//! `strata cache ls|verify|gc`: what the cache holds, whether every recorded run still has the
//! bytes it was recorded with, and trimming it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::journal::{Journal, Run};
use crate::mirror::{META_SUFFIX, RUNS_SUFFIX};

/// One cached model revision (a mirror folder).
#[derive(Clone, Debug)]
pub struct CachedModel {
    /// `hf--ORG--NAME` or `url--...`.
    pub name: String,
    /// The commit (Hugging Face) or `files` (plain URL).
    pub revision: String,
    pub dir: PathBuf,
    /// Bytes present on disk (sparse shards count what their journals record).
    pub present: u64,
    /// Size of the files in full.
    pub size: u64,
    pub shards: usize,
    pub last_used: std::time::SystemTime,
}

fn shard_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    names.sort();
    names
}

fn describe(name: String, revision: String, dir: PathBuf) -> CachedModel {
    let (mut present, mut size) = (0, 0);
    let mut last_used = std::time::UNIX_EPOCH;
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        last_used = last_used.max(meta.modified().unwrap_or(std::time::UNIX_EPOCH));
        let file = entry.file_name().to_string_lossy().into_owned();
        if file.ends_with(RUNS_SUFFIX) || file.ends_with(META_SUFFIX) || file.ends_with(".safetensors") {
            continue;
        }
        present += meta.len();
        size += meta.len();
    }
    let shards = shard_names(&dir);
    for s in &shards {
        let path = dir.join(s);
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        size += len;
        let journal = dir.join(format!("{s}{RUNS_SUFFIX}"));
        present += if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            len
        } else {
            Journal::open(&journal)
                .map(|j| j.covered_bytes().min(len))
                .unwrap_or(0)
        };
    }
    CachedModel {
        name,
        revision,
        dir,
        present,
        size,
        shards: shards.len(),
        last_used,
    }
}

/// Every cached model revision under `cache_dir`.
pub fn list(cache_dir: &Path) -> Vec<CachedModel> {
    let mut out = Vec::new();
    let models = cache_dir.join("models");
    let mut entries: Vec<_> = std::fs::read_dir(&models)
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for model in entries {
        let name = model.file_name().to_string_lossy().into_owned();
        let files = model.path().join("files");
        if files.is_dir() {
            out.push(describe(name.clone(), "files".into(), files));
        }
        let mut snaps: Vec<_> = std::fs::read_dir(model.path().join("snapshots"))
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        snaps.sort_by_key(|e| e.file_name());
        for snap in snaps {
            out.push(describe(
                name.clone(),
                snap.file_name().to_string_lossy().into_owned(),
                snap.path(),
            ));
        }
    }
    out
}

/// A recorded run whose bytes no longer match.
#[derive(Clone, Debug)]
pub struct BadRun {
    pub file: PathBuf,
    pub run: Run,
    pub reason: String,
}

#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    pub runs_checked: u64,
    pub bytes_checked: u64,
    pub bad: Vec<BadRun>,
    /// Whole shards checked against the server's sha256 (`X-Linked-Etag`).
    pub sha256_checked: u64,
}

/// Re-reads every recorded run of every shard in `dir` and checks its xxh3; a shard present in
/// full with a known sha256 is checked against it too. With `repair`, bad runs are dropped from
/// their journals (they will be fetched again).
pub fn verify(dir: &Path, repair: bool) -> std::io::Result<VerifyReport> {
    let mut report = VerifyReport::default();
    for shard in shard_names(dir) {
        let path = dir.join(&shard);
        if std::fs::symlink_metadata(&path)?.file_type().is_symlink() {
            continue; // a complete file of the Hugging Face cache, not ours
        }
        let journal_path = dir.join(format!("{shard}{RUNS_SUFFIX}"));
        let journal = Journal::open(&journal_path)?;
        let file = File::open(&path)?;
        let size = file.metadata()?.len();
        let mut bad_here = Vec::new();
        let runs: Vec<Run> = journal.runs().copied().collect();
        for run in &runs {
            report.runs_checked += 1;
            if run.offset + run.len > size {
                bad_here.push((run, format!("past the end of the {size}-byte file")));
                continue;
            }
            let mut buf = vec![0u8; run.len as usize];
            file.read_exact_at(&mut buf, run.offset)?;
            report.bytes_checked += run.len;
            if xxhash_rust::xxh3::xxh3_64(&buf) != run.xxh3 {
                bad_here.push((run, "checksum mismatch".into()));
            }
        }
        if bad_here.is_empty() && journal.covered_bytes() >= size {
            let meta: Option<serde_json::Value> =
                std::fs::read_to_string(dir.join(format!("{shard}{META_SUFFIX}")))
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok());
            if let Some(want) = meta
                .as_ref()
                .and_then(|m| m["sha256"].as_str())
                .filter(|s| s.len() == 64)
            {
                let got = sha256_file(&path)?;
                report.sha256_checked += 1;
                if got != want {
                    report.bad.push(BadRun {
                        file: path.clone(),
                        run: Run {
                            offset: 0,
                            len: size,
                            xxh3: 0,
                        },
                        reason: format!("sha256 {got} differs from the server's {want}"),
                    });
                }
            }
        }
        if repair && !bad_here.is_empty() {
            // Under the journal's lock, so a process fetching into this cache loses nothing.
            let mut journal = journal;
            journal.retain(|r| !bad_here.iter().any(|(b, _)| *b == r))?;
        }
        for (run, reason) in bad_here {
            report.bad.push(BadRun {
                file: path.clone(),
                run: *run,
                reason,
            });
        }
    }
    Ok(report)
}

pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 8 << 20];
    let mut at = 0u64;
    loop {
        let n = file.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Removes whole cached revisions, least recently used first, until the cache holds at most
/// `max_bytes` (0 removes all). Returns what was removed.
pub fn gc(cache_dir: &Path, max_bytes: u64) -> std::io::Result<Vec<CachedModel>> {
    let mut models = list(cache_dir);
    models.sort_by_key(|m| m.last_used);
    let mut total: u64 = models.iter().map(|m| m.present).sum();
    let mut removed = Vec::new();
    for m in models {
        if total <= max_bytes && max_bytes > 0 {
            break;
        }
        std::fs::remove_dir_all(&m.dir)?;
        total = total.saturating_sub(m.present);
        removed.push(m);
    }
    Ok(removed)
}
