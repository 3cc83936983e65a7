//! A remote model's local mirror: a folder in the cache holding its small files whole and its
//! shards as sparse files of their full size, with a journal per shard of the byte runs present
//! (`journal.rs`). Everything else in strata reads the mirror like a local folder; the mirror is
//! a [`RangeSource`], so a read of bytes not yet present first fetches them with one `Range`
//! request per contiguous missing run.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use strata_formats::RangeSource;

use crate::http::{Http, RetryPolicy};
use crate::journal::{Journal, Run};
use crate::location::{Location, RemoteOptions};

/// Small files fetched whole when the model has them.
pub const SMALL_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tiktoken.model",
    "chat_template.jinja",
    "special_tokens_map.json",
    "model.safetensors.index.json",
];

/// Suffix of a shard's run journal and of its metadata.
pub const RUNS_SUFFIX: &str = ".strata-runs";
pub const META_SUFFIX: &str = ".strata-meta.json";
/// Small files a server said it does not have (so offline runs know too).
pub const ABSENT_FILE: &str = ".strata-absent.json";
/// Rewritten whenever the revision is opened: its time is the revision's last use.
pub const USED_FILE: &str = ".strata-used";

struct ShardState {
    data: File,
    journal: Journal,
    /// A complete file reused read-only (Hugging Face cache): nothing to fetch.
    complete: bool,
    /// Runs being fetched now (by any thread): others wait for them instead of asking again.
    inflight: Vec<(u64, u64)>,
}

struct Shard {
    state: Mutex<ShardState>,
    /// Signalled whenever a fetch ends.
    fetched: std::sync::Condvar,
}

/// `gap` minus the in-flight intervals: (parts to fetch, whether some part is in flight).
fn split_gap(gap: (u64, u64), inflight: &[(u64, u64)]) -> (Vec<(u64, u64)>, bool) {
    let (mut parts, mut busy) = (vec![(gap.0, gap.0 + gap.1)], false);
    for &(a, b) in inflight {
        let mut next = Vec::new();
        for (s, e) in parts {
            if b <= s || a >= e {
                next.push((s, e));
                continue;
            }
            busy = true;
            if s < a {
                next.push((s, a));
            }
            if b < e {
                next.push((b, e));
            }
        }
        parts = next;
    }
    (parts.into_iter().map(|(s, e)| (s, e - s)).collect(), busy)
}

pub struct Mirror {
    pub dir: PathBuf,
    /// URL of the folder at the resolved revision, ending in `/`.
    pub base: String,
    pub offline: bool,
    pub http: Option<Http>,
    shards: HashMap<String, Shard>,
    /// Shard names in the order the index lists them.
    pub shard_names: Vec<String>,
    /// A shard's path under `base` where it is not its name (a GGUF in a folder of the
    /// repository; the mirror holds it by its file name).
    remote: HashMap<String, String>,
    /// The model's GGUF file (the first of a split one), when the model is one.
    pub gguf: Option<String>,
}

fn err(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

/// Bytes one range request asks for at most (a longer missing run is fetched in pieces).
pub const MAX_REQUEST_BYTES: u64 = 64 << 20;

/// A write to the cache that failed, saying so plainly when the disk is full.
fn disk_error(path: &Path, e: std::io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOSPC) || e.kind() == std::io::ErrorKind::StorageFull {
        format!(
            "{}: the cache's disk is full (nothing half-written is trusted; free space or use --cache-dir elsewhere)",
            path.display()
        )
    } else {
        err(path, e)
    }
}

/// Writes a whole file atomically (temp file in the same folder, fsync, rename).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    replace_atomic(path, |tmp| std::fs::write(tmp, bytes))
}

/// Copies a file atomically (a partial copy never takes the destination's name).
fn copy_atomic(from: &Path, to: &Path) -> Result<(), String> {
    replace_atomic(to, |tmp| std::fs::copy(from, tmp).map(drop))
}

/// `fill` writes a temporary file beside `path`, which is synced and renamed onto it.
fn replace_atomic(path: &Path, fill: impl FnOnce(&Path) -> std::io::Result<()>) -> Result<(), String> {
    let tmp = temp_path(path);
    let filled = fill(&tmp)
        .and_then(|_| File::open(&tmp)?.sync_all())
        .map_err(|e| disk_error(&tmp, e));
    if let Err(e) = filled {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).map_err(|e| err(path, e))
}

/// A temporary name beside `path`, unique to this process and call.
fn temp_path(path: &Path) -> PathBuf {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

fn read_json(path: &Path) -> Option<Value> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
}

impl Mirror {
    /// Resolves `location` (a remote one) into a mirror folder with every small file and every
    /// shard header present. Offline, only what the cache holds is used.
    pub fn open(location: &Location, options: &RemoteOptions) -> Result<Mirror, String> {
        let (token, token_host) = location.credentials();
        let http = if options.offline {
            None
        } else {
            Some(Http::new(token, token_host, RetryPolicy::from_env())?)
        };
        let (dir, base) = location.resolve(options, http.as_ref())?;
        std::fs::create_dir_all(&dir).map_err(|e| err(&dir, e))?;
        let mut mirror = Mirror {
            dir,
            base,
            offline: options.offline,
            http,
            shards: HashMap::new(),
            shard_names: Vec::new(),
            remote: HashMap::new(),
            gguf: None,
        };
        if crate::gguf_pick::is_gguf(location) {
            mirror.open_gguf(location, options)?;
        } else {
            mirror.fetch_small_files(location, options)?;
            mirror.open_shards(location, options)?;
        }
        // When it was last used (`strata cache gc` removes the least recently used first).
        let _ = std::fs::write(mirror.dir.join(USED_FILE), b"");
        Ok(mirror)
    }

    pub(crate) fn url(&self, file: &str) -> String {
        format!(
            "{}{}",
            self.base,
            self.remote.get(file).map_or(file, String::as_str)
        )
    }

    fn fetch_small_files(&self, location: &Location, options: &RemoteOptions) -> Result<(), String> {
        let absent_path = self.dir.join(ABSENT_FILE);
        let mut absent: Vec<String> = read_json(&absent_path)
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        let mut changed = false;
        for &name in SMALL_FILES {
            let path = self.dir.join(name);
            if path.exists() || absent.iter().any(|a| a == name) {
                continue;
            }
            if let Some(found) = location.hf_cached_file(options, &self.dir, name) {
                copy_atomic(&found, &path)?;
                continue;
            }
            let Some(http) = &self.http else {
                if name == "config.json" {
                    return Err(format!(
                        "offline, and {} is not in the cache ({}): run once online or `strata pull` it first",
                        location.describe(),
                        self.dir.display()
                    ));
                }
                continue;
            };
            match http.get(&self.url(name)) {
                Ok(f) => write_atomic(&path, &f.body)?,
                Err(e) if e.not_found && name != "config.json" => {
                    absent.push(name.to_string());
                    changed = true;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        if changed {
            write_atomic(
                &absent_path,
                serde_json::to_string(&absent).expect("json").as_bytes(),
            )?;
        }
        Ok(())
    }

    fn open_shards(&mut self, location: &Location, options: &RemoteOptions) -> Result<(), String> {
        let index = self.dir.join(strata_formats::INDEX_FILE);
        let names: Vec<String> = if index.exists() {
            let v = read_json(&index).ok_or_else(|| err(&index, "not valid JSON"))?;
            let mut names: Vec<String> = v
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| err(&index, "no weight_map"))?
                .values()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            names.sort();
            names.dedup();
            names
        } else {
            vec![strata_formats::SINGLE_FILE.to_string()]
        };
        for name in &names {
            if name.contains('/') || name.contains("..") {
                return Err(format!(
                    "{}: shard name `{name}` is not a plain file name",
                    index.display()
                ));
            }
            self.add_shard(location, options, name, name)?;
            // The header: its length, then the header itself.
            self.ensure(name, 0, 8)?;
            let mut len = [0u8; 8];
            self.read_at(name, &mut len, 0)?;
            let n = u64::from_le_bytes(len);
            let size = self.size_of(name)?;
            if n == 0 || n > strata_formats::MAX_HEADER_BYTES || n.checked_add(8).is_none_or(|end| end > size)
            {
                self.forget_before(name, 8)?;
                return Err(format!(
                    "{}: header length {n} does not fit the {size}-byte file (or is over the {}-byte limit)",
                    self.url(name),
                    strata_formats::MAX_HEADER_BYTES
                ));
            }
            self.ensure(name, 8, n)?;
        }
        self.shard_names = names;
        Ok(())
    }

    /// Forgets the runs of a shard that start before `from` (they are not the file's), so the
    /// next open asks for them again.
    fn forget_before(&self, name: &str, from: u64) -> Result<(), String> {
        let mut st = self.shards[name].state.lock().expect("shard lock");
        if !st.complete {
            st.journal
                .retain(|r| r.offset >= from)
                .map_err(|e| err(st.journal.path(), e))?;
        }
        Ok(())
    }

    /// Forgets every run of a shard.
    pub(crate) fn forget(&self, name: &str) -> Result<(), String> {
        self.forget_before(name, u64::MAX)
    }

    pub(crate) fn size_of(&self, name: &str) -> Result<u64, String> {
        let path = self.dir.join(name);
        Ok(std::fs::metadata(&path).map_err(|e| err(&path, e))?.len())
    }

    /// Opens shard `name` of the mirror (`remote`: its path under the base URL): a complete
    /// copy in the Hugging Face cache linked, else a sparse file of the server's size, created
    /// with its first 8 bytes on first use.
    pub(crate) fn add_shard(
        &mut self,
        location: &Location,
        options: &RemoteOptions,
        name: &str,
        remote: &str,
    ) -> Result<(), String> {
        if remote != name {
            self.remote.insert(name.to_string(), remote.to_string());
        }
        let path = self.dir.join(name);
        let journal_path = self.dir.join(format!("{name}{RUNS_SUFFIX}"));
        let hf = location.hf_cached_file(options, &self.dir, remote);
        // A link into the Hugging Face cache is read, never written through: with the
        // complete file gone from there, it is replaced by a sparse file of our own.
        let linked = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink());
        if linked && hf.is_none() {
            std::fs::remove_file(&path).map_err(|e| err(&path, e))?;
        }
        let complete = hf.is_some();
        if let Some(found) = hf {
            if !path.exists() && !linked {
                std::os::unix::fs::symlink(&found, &path).map_err(|e| err(&path, e))?;
            }
        } else if !path.exists() {
            self.create_sparse(location, name, &journal_path)?;
        }
        let data = OpenOptions::new()
            .read(true)
            .write(!complete)
            .custom_flags(if complete { 0 } else { libc::O_NOFOLLOW })
            .open(&path)
            .map_err(|e| err(&path, e))?;
        let journal = Journal::open(&journal_path).map_err(|e| err(&journal_path, e))?;
        self.shards.insert(
            name.to_string(),
            Shard {
                state: Mutex::new(ShardState {
                    data,
                    journal,
                    complete,
                    inflight: Vec::new(),
                }),
                fetched: std::sync::Condvar::new(),
            },
        );
        Ok(())
    }

    /// A sparse file of the shard's full size holding its first 8 bytes, and its metadata.
    fn create_sparse(&self, location: &Location, name: &str, journal_path: &Path) -> Result<(), String> {
        let path = self.dir.join(name);
        let http = self.http.as_ref().ok_or_else(|| {
            format!(
                "offline, and shard {name} of {} is not in the cache",
                location.describe()
            )
        })?;
        // The first 8 bytes give the header length and, in Content-Range, the file size.
        let (f, first) = http
            .get_range_bytes(&self.url(name), 0, 8)
            .map_err(|e| e.to_string())?;
        let total = f
            .total
            .ok_or_else(|| format!("{}: no file size in Content-Range", self.url(name)))?;
        let meta = serde_json::json!({
            "size": total,
            "sha256": f.headers.get("x-linked-etag").and_then(|v| v.to_str().ok())
                .map(|s| s.trim_matches('"').to_string()),
            "url": self.url(name),
            "version": f.validator,
        });
        write_atomic(
            &self.dir.join(format!("{name}{META_SUFFIX}")),
            meta.to_string().as_bytes(),
        )?;
        let tmp = path.with_extension(format!("strata-new-{}", std::process::id()));
        let data = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&tmp)
            .map_err(|e| err(&tmp, e))?;
        data.set_len(total).map_err(|e| err(&tmp, e))?;
        data.write_all_at(&first, 0).map_err(|e| err(&tmp, e))?;
        data.sync_all().map_err(|e| err(&tmp, e))?;
        // Another process may create the same shard at the same moment: the first link
        // wins and only the winner starts its record afresh (a record left from an
        // earlier file of that name must not be trusted for this one).
        let won = std::fs::hard_link(&tmp, &path).is_ok();
        let _ = std::fs::remove_file(&tmp);
        if won {
            let mut j = Journal::open(journal_path).map_err(|e| err(journal_path, e))?;
            j.reset().map_err(|e| err(journal_path, e))?;
            j.append(Run {
                offset: 0,
                len: 8,
                xxh3: xxhash_rust::xxh3::xxh3_64(&first),
            })
            .map_err(|e| err(journal_path, e))?;
        }
        Ok(())
    }

    pub(crate) fn read_at(&self, name: &str, buf: &mut [u8], offset: u64) -> Result<(), String> {
        let st = self.shards[name].state.lock().expect("shard lock");
        st.data
            .read_exact_at(buf, offset)
            .map_err(|e| format!("{}/{name}: {e}", self.dir.display()))
    }

    /// The runs of `name` not yet present within [offset, offset + len).
    pub fn missing(&self, name: &str, offset: u64, len: u64) -> Result<Vec<(u64, u64)>, String> {
        let st = self
            .shards
            .get(name)
            .ok_or_else(|| format!("{name} is not a shard of {}", self.dir.display()))?;
        let mut st = st.state.lock().expect("shard lock");
        if st.complete {
            return Ok(Vec::new());
        }
        let gaps = st.journal.missing(offset, len);
        if gaps.is_empty() {
            return Ok(gaps);
        }
        // Another process may have filled them.
        st.journal.refresh().map_err(|e| err(st.journal.path(), e))?;
        Ok(st.journal.missing(offset, len))
    }

    /// Fetches one missing run, in pieces of at most [`MAX_REQUEST_BYTES`] (each its own
    /// request and record, so a slow link makes progress that survives an interruption).
    fn fetch_run(&self, name: &str, offset: u64, len: u64) -> Result<(), String> {
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let n = (end - at).min(MAX_REQUEST_BYTES);
            self.fetch_piece(name, at, n)?;
            at += n;
        }
        Ok(())
    }

    /// Fetches one piece straight into the shard file, syncs it, then records it; the file must
    /// still be the one cached (size, and ETag or Last-Modified when the server gives them).
    fn fetch_piece(&self, name: &str, offset: u64, len: u64) -> Result<(), String> {
        let http = self.http.as_ref().ok_or_else(|| {
            format!(
                "offline: bytes {offset}..{} of {name} are not in the cache ({})",
                offset + len,
                self.dir.display()
            )
        })?;
        let st = &self.shards[name].state;
        let data = {
            st.lock()
                .expect("shard lock")
                .data
                .try_clone()
                .map_err(|e| e.to_string())?
        };
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let path = self.dir.join(name);
        let mut write = |at: u64, chunk: &[u8]| -> Result<(), String> {
            if at == offset {
                hasher.reset(); // a retry starts over
            }
            hasher.update(chunk);
            data.write_all_at(chunk, at).map_err(|e| disk_error(&path, e))
        };
        let f = http
            .get_range(&self.url(name), offset, len, &mut write)
            .map_err(|e| e.to_string())?;
        let meta = read_json(&self.dir.join(format!("{name}{META_SUFFIX}")));
        if let (Some(total), Some(size)) = (f.total, meta.as_ref().and_then(|m| m["size"].as_u64())) {
            if total != size {
                return Err(format!(
                    "{}: the file is now {total} bytes, not the {size} it was when cached (changed on the server?)",
                    self.url(name)
                ));
            }
        }
        let cached = meta.as_ref().and_then(|m| m["version"].as_str());
        if let (Some(now), Some(then)) = (f.validator.as_deref(), cached) {
            if now != then {
                return Err(format!(
                    "{}: the file changed on the server since it was cached ({then} then, {now} now); its cached bytes are kept apart from the new ones: remove {} to start over",
                    self.url(name),
                    self.dir.display()
                ));
            }
        }
        data.sync_data().map_err(|e| disk_error(&path, e))?;
        let mut st = st.lock().expect("shard lock");
        st.journal
            .append(Run {
                offset,
                len,
                xxh3: hasher.digest(),
            })
            .map_err(|e| disk_error(st.journal.path(), e))
    }

    /// What the rest of strata opens: the folder, or the GGUF file in it.
    pub fn model_path(&self) -> PathBuf {
        match &self.gguf {
            Some(name) => self.dir.join(name),
            None => self.dir.clone(),
        }
    }

    /// Range requests that returned data so far (one per contiguous missing run).
    pub fn range_requests(&self) -> u64 {
        self.http
            .as_ref()
            .map_or(0, |h| h.range_requests.load(Ordering::Relaxed))
    }

    pub fn bytes_fetched(&self) -> u64 {
        self.http.as_ref().map_or(0, |h| h.bytes.load(Ordering::Relaxed))
    }

    /// (bytes present, file size) of a shard.
    pub fn shard_coverage(&self, name: &str) -> (u64, u64) {
        let st = self.shards[name].state.lock().expect("shard lock");
        let size = st.data.metadata().map(|m| m.len()).unwrap_or(0);
        if st.complete {
            (size, size)
        } else {
            (st.journal.covered_bytes().min(size), size)
        }
    }
}

impl RangeSource for Mirror {
    /// Fetches the missing runs of the range, each with one request; runs another thread is
    /// fetching already are waited for, not asked for twice.
    fn ensure(&self, file: &str, offset: u64, len: u64) -> Result<(), String> {
        if len == 0 {
            return Ok(());
        }
        let shard = self
            .shards
            .get(file)
            .ok_or_else(|| format!("{file} is not a shard of {}", self.dir.display()))?;
        loop {
            let gaps = self.missing(file, offset, len)?;
            if gaps.is_empty() {
                return Ok(());
            }
            let mut st = shard.state.lock().expect("shard lock");
            let (mut mine, mut busy) = (Vec::new(), false);
            for gap in st.journal.missing(offset, len) {
                let (parts, b) = split_gap(gap, &st.inflight);
                busy |= b;
                mine.extend(parts);
            }
            if mine.is_empty() {
                if busy {
                    drop(shard.fetched.wait(st).expect("shard lock"));
                }
                continue;
            }
            st.inflight.extend(mine.iter().map(|&(a, n)| (a, a + n)));
            drop(st);
            let mut result = Ok(());
            for &(a, n) in &mine {
                if result.is_ok() {
                    result = self.fetch_run(file, a, n);
                }
            }
            let mut st = shard.state.lock().expect("shard lock");
            st.inflight
                .retain(|r| !mine.iter().any(|&(a, n)| *r == (a, a + n)));
            drop(st);
            shard.fetched.notify_all();
            result?;
        }
    }
}

/// Opens a model location: a local folder as it is, or a remote one through its mirror.
pub fn open_location(spec: &str, options: &RemoteOptions) -> Result<(PathBuf, Option<Arc<Mirror>>), String> {
    match Location::parse(spec) {
        Location::Local(path) => Ok((path, None)),
        remote => {
            let mirror = Mirror::open(&remote, options)?;
            Ok((mirror.model_path(), Some(Arc::new(mirror))))
        }
    }
}
