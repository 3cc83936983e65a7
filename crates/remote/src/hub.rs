//! The Hugging Face hub cache, read and written in the layout `huggingface_hub`, transformers
//! and vLLM use, so neither side downloads what the other has: `HF_HUB_CACHE` (or
//! `HUGGINGFACE_HUB_CACHE`, else `HF_HOME/hub`, `HF_HOME` defaulting to
//! `$XDG_CACHE_HOME/huggingface` or `~/.cache/huggingface`) holds `models--ORG--NAME/` with
//! `blobs/<etag>` (the files), `snapshots/<commit>/<name>` (relative links to the blobs) and
//! `refs/<revision>` (a branch's or tag's commit).
//!
//! strata reads complete files from there (a shard there is linked, never written through) and
//! resolves a revision offline from its `refs/`; `strata pull` shares what it fetched whole:
//! each complete file becomes a blob by a hard link to strata's copy (no second copy on disk),
//! named by the hub's ETag for it (the sha256 the hub gives large files in `X-Linked-Etag`, else
//! the file's own sha256; `huggingface_hub` names small git files by their git hash, so it
//! fetches those few bytes again once, online).

use std::path::{Path, PathBuf};

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
pub fn hf_home() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HOME").unwrap_or_else(|| {
        var("XDG_CACHE_HOME")
            .unwrap_or_else(|| var("HOME").unwrap_or_else(std::env::temp_dir).join(".cache"))
            .join("huggingface")
    })
}

/// `HF_HUB_CACHE`, else `HUGGINGFACE_HUB_CACHE`, else `HF_HOME/hub`.
pub fn hub_dir() -> PathBuf {
    ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"]
        .iter()
        .find_map(|k| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from))
        .unwrap_or_else(|| hf_home().join("hub"))
}

/// `HF_TOKEN`, else `HUGGING_FACE_HUB_TOKEN`, else the file `HF_TOKEN_PATH` names, else
/// `HF_HOME/token`.
pub fn token() -> Option<String> {
    for k in ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"] {
        if let Ok(t) = std::env::var(k) {
            if !t.trim().is_empty() {
                return Some(t.trim().to_string());
            }
        }
    }
    let path = std::env::var_os("HF_TOKEN_PATH")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("token"));
    std::fs::read_to_string(path)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// One repository's folder in the hub cache.
pub struct HubRepo {
    root: PathBuf,
}

/// A name the hub cache may hold as one path component (a revision, a file name, an ETag).
fn plain(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

fn err(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

impl HubRepo {
    /// `ORG/NAME`'s folder (it need not exist).
    pub fn of(repo: &str) -> HubRepo {
        HubRepo {
            root: hub_dir().join(format!("models--{}", repo.replace('/', "--"))),
        }
    }

    /// A complete file of `commit`, if the cache has it.
    pub fn file(&self, commit: &str, name: &str) -> Option<PathBuf> {
        if !plain(commit) || !plain(name) {
            return None;
        }
        let path = self.root.join("snapshots").join(commit).join(name);
        path.is_file().then_some(path)
    }

    /// The commit `refs/<revision>` names.
    pub fn read_ref(&self, revision: &str) -> Option<String> {
        if !plain(revision) {
            return None;
        }
        let commit = std::fs::read_to_string(self.root.join("refs").join(revision)).ok()?;
        let commit = commit.trim();
        (commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit())).then(|| commit.to_string())
    }

    /// Points `refs/<revision>` at `commit` (written whole: a reader sees the old or the new).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<(), String> {
        if !plain(revision) || revision == commit {
            return Ok(());
        }
        let refs = self.root.join("refs");
        std::fs::create_dir_all(&refs).map_err(|e| err(&refs, e))?;
        crate::mirror::write_atomic(&refs.join(revision), commit.as_bytes())
    }

    /// Puts `src` (a complete, verified file) in the cache as `commit`'s `name`: a hard link to
    /// it as `blobs/<etag>` (kept when there already), and the snapshot's relative link to that
    /// blob. Returns false when the cache is on another file system (nothing is copied).
    pub fn place(&self, commit: &str, name: &str, src: &Path, etag: &str) -> Result<bool, String> {
        if !plain(commit) || !plain(name) || !plain(etag) {
            return Err(format!(
                "{name}: not a name the hub cache can hold ({commit}, {etag})"
            ));
        }
        let blobs = self.root.join("blobs");
        let snap = self.root.join("snapshots").join(commit);
        for d in [&blobs, &snap] {
            std::fs::create_dir_all(d).map_err(|e| err(d, e))?;
        }
        let blob = blobs.join(etag);
        if !blob.is_file() {
            let tmp = blobs.join(format!("{etag}.strata-{}.incomplete", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            match std::fs::hard_link(src, &tmp) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => return Ok(false),
                Err(e) => return Err(err(&tmp, e)),
            }
            std::fs::rename(&tmp, &blob).map_err(|e| err(&blob, e))?;
        }
        let link = snap.join(name);
        let target = Path::new("../../blobs").join(etag);
        if std::fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
            let tmp = snap.join(format!(".{name}.strata-{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&target, &tmp).map_err(|e| err(&tmp, e))?;
            std::fs::rename(&tmp, &link).map_err(|e| err(&link, e))?;
        }
        Ok(true)
    }
}

/// What [`share`] did.
#[derive(Debug, Default)]
pub struct Shared {
    /// Files put in the hub cache (or there already).
    pub files: usize,
    /// Shards left out: not every byte of them is cached.
    pub partial: usize,
    /// The hub cache is on another file system: nothing was shared.
    pub other_fs: bool,
}

/// Puts every complete file of strata's cached revision `mirror_dir` (of `repo`, asked for as
/// `revision`) in the hub cache, and points the hub's ref for `revision` at its commit.
pub fn share(repo: &str, revision: &str, mirror_dir: &Path) -> Result<Shared, String> {
    use crate::mirror::{ABSENT_FILE, META_SUFFIX, RUNS_SUFFIX, USED_FILE};
    let commit = mirror_dir
        .file_name()
        .and_then(|c| c.to_str())
        .ok_or_else(|| err(mirror_dir, "not a cached revision"))?;
    let hub = HubRepo::of(repo);
    let mut shared = Shared::default();
    let mut names: Vec<String> = std::fs::read_dir(mirror_dir)
        .map_err(|e| err(mirror_dir, e))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            !(n.starts_with('.')
                || n.ends_with(RUNS_SUFFIX)
                || n.ends_with(META_SUFFIX)
                || n.contains(".strata-new-")
                || n == ABSENT_FILE
                || n == USED_FILE)
        })
        .collect();
    names.sort();
    for name in names {
        let path = mirror_dir.join(&name);
        let meta = std::fs::symlink_metadata(&path).map_err(|e| err(&path, e))?;
        if meta.file_type().is_symlink() || !meta.is_file() {
            continue; // a link into the hub cache already
        }
        let record = mirror_dir.join(format!("{name}{META_SUFFIX}"));
        let recorded: Option<serde_json::Value> = std::fs::read(&record)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let etag = if let Some(m) = &recorded {
            let journal = crate::Journal::open(&mirror_dir.join(format!("{name}{RUNS_SUFFIX}")))
                .map_err(|e| err(&path, e))?;
            if journal.covered_bytes() < meta.len() {
                shared.partial += 1;
                continue;
            }
            m["sha256"].as_str().map(str::to_string)
        } else {
            None
        };
        let etag = match etag {
            Some(e) => e,
            None => crate::maintain::sha256_file(&path).map_err(|e| err(&path, e))?,
        };
        if !hub.place(commit, &name, &path, &etag)? {
            shared.other_fs = true;
            return Ok(shared);
        }
        shared.files += 1;
    }
    if shared.files > 0 {
        hub.write_ref(revision, commit)?;
    }
    Ok(shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_leave_the_folder_are_refused() {
        let repo = HubRepo {
            root: std::env::temp_dir().join(format!("strata-hub-unit-{}", std::process::id())),
        };
        for bad in ["", "..", "a/b", "."] {
            assert!(repo.file("c", bad).is_none());
            assert!(repo.read_ref(bad).is_none());
            assert!(repo.place("c", bad, Path::new("/dev/null"), "e").is_err());
        }
    }

    #[test]
    fn a_placed_file_is_a_blob_with_a_relative_snapshot_link_and_a_ref() {
        let dir = std::env::temp_dir().join(format!("strata-hub-place-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let repo = HubRepo {
            root: dir.join("models--o--n"),
        };
        let src = dir.join("file");
        std::fs::write(&src, b"bytes").unwrap();
        let commit = "0123456789abcdef0123456789abcdef01234567";
        assert!(repo.place(commit, "config.json", &src, "abc").unwrap());
        // Twice is the same.
        assert!(repo.place(commit, "config.json", &src, "abc").unwrap());
        let link = dir
            .join("models--o--n/snapshots")
            .join(commit)
            .join("config.json");
        assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("../../blobs/abc"));
        assert_eq!(std::fs::read(&link).unwrap(), b"bytes");
        assert_eq!(repo.file(commit, "config.json"), Some(link));
        repo.write_ref("main", commit).unwrap();
        assert_eq!(repo.read_ref("main").as_deref(), Some(commit));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
