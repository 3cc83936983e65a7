//! The prefix cache's disk tier (`--prefix-cache-dir`): every snapshot the cache keeps is also
//! written to a file of its own, by a writer thread, so conversations survive the memory
//! tier's evictions and the server's restarts, within a byte budget (least recently used files
//! go first; a hit touches its file's time, which orders them at the next start).
//!
//! Files live in `<dir>/<key>/`, the key naming the model and what its state depends on
//! ([`Engine::state_key`](crate::Engine::state_key)). A file is written as `<name>.<pid>.tmp`,
//! synced, then renamed to `<name>.pc`, so a crash leaves either a whole file or a temporary one
//! that the next start removes. Its layout: `STRATAPC`, a version and a header length (u32
//! little-endian each), a JSON header (key, length, tokens, marks, each layer's shape), the
//! f32 values (each layer's keys, values, recurrent and convolution state, then each mark's
//! state), and an xxh3-64 of everything before it. A file that fails any check (a torn or
//! hostile file, another model's) is named in a warning, removed, and is a miss.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;

use serde_json::{json, Value};
use strata_models::{KvCache, LayerCache};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::prefix::{covers, usable, Mark, Snapshot};

const MAGIC: &[u8; 8] = b"STRATAPC";
const VERSION: u32 = 1;
/// Bytes before the header: magic, version, header length.
const LEAD: usize = 16;
/// A header longer than this is not one strata wrote (a 1M-token prompt's is ~8 MB).
const MAX_HEADER: usize = 64 << 20;
/// Bytes of writes queued at most: past it a snapshot is not written (memory the writer holds
/// must stay bounded when the disk is slower than the requests).
const MAX_QUEUED: u64 = 1 << 30;

/// One layer's shape: k_dim, v_dim, recurrent values, convolution values.
type Shape = [usize; 4];

fn shapes(cache: &KvCache) -> Vec<Shape> {
    (cache.layers.iter())
        .map(|l| [l.k_dim, l.v_dim, l.recurrent.len(), l.conv.len()])
        .collect()
}

/// What the disk tier holds and has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixDiskStats {
    pub bytes: u64,
    pub entries: usize,
    /// Lookups answered from disk.
    pub hits: u64,
}

struct DiskEntry {
    name: String,
    tokens: Vec<u32>,
    marks: Vec<usize>,
    bytes: u64,
    used: u64,
}

impl DiskEntry {
    fn points(&self) -> Vec<usize> {
        let mut p = self.marks.clone();
        p.push(self.tokens.len());
        p
    }

    fn path(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.pc", self.name))
    }
}

enum Op {
    Write {
        path: PathBuf,
        header: Vec<u8>,
        snapshot: Arc<Snapshot>,
    },
    Remove(PathBuf),
    Touch(PathBuf),
    /// Answered once every operation before it is done.
    Flush(Sender<()>),
}

pub struct PrefixDisk {
    /// Files queued for writing and their bytes (a lookup skips them; the writer clears them).
    pending: Arc<std::sync::Mutex<(std::collections::HashSet<PathBuf>, u64)>>,
    dir: PathBuf,
    key: String,
    budget: u64,
    shapes: Vec<Shape>,
    recurrent: bool,
    index: Vec<DiskEntry>,
    held: u64,
    clock: u64,
    hits: u64,
    writer: Sender<Op>,
}

impl PrefixDisk {
    /// Opens (creating) `<root>/<key>` for states shaped like `template`, holding at most
    /// `budget` bytes: lists the files there (removing broken ones and a dead process's
    /// temporary files) and starts the writer thread.
    pub fn open(root: &Path, key: &str, budget: u64, template: &KvCache) -> Result<PrefixDisk, String> {
        let dir = root.join(key);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let (writer, ops) = channel::<Op>();
        let pending = Arc::new(std::sync::Mutex::new((std::collections::HashSet::new(), 0u64)));
        let done = pending.clone();
        std::thread::Builder::new()
            .name("strata-prefix-disk".into())
            .spawn(move || {
                for op in ops {
                    let written = match &op {
                        Op::Write { path, snapshot, .. } => Some((path.clone(), snapshot.bytes() as u64)),
                        _ => None,
                    };
                    run(op);
                    if let Some((path, bytes)) = written {
                        let mut p = done.lock().unwrap_or_else(|e| e.into_inner());
                        p.0.remove(&path);
                        p.1 = p.1.saturating_sub(bytes);
                    }
                }
            })
            .map_err(|e| format!("starting the prefix cache's writer: {e}"))?;
        let mut disk = PrefixDisk {
            pending,
            dir,
            key: key.to_string(),
            budget,
            shapes: shapes(template),
            recurrent: template.has_recurrent(),
            index: Vec::new(),
            held: 0,
            clock: 0,
            hits: 0,
            writer,
        };
        disk.scan()?;
        disk.evict();
        Ok(disk)
    }

    /// Waits until every write and removal asked for so far is done.
    pub fn flush(&self) {
        let (done, wait) = channel();
        if self.writer.send(Op::Flush(done)).is_ok() {
            let _ = wait.recv();
        }
    }

    pub fn stats(&self) -> PrefixDiskStats {
        PrefixDiskStats {
            bytes: self.held,
            entries: self.index.len(),
            hits: self.hits,
        }
    }

    /// The files already there, oldest use first.
    fn scan(&mut self) -> Result<(), String> {
        let listing = std::fs::read_dir(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let mut found = Vec::new();
        for item in listing.flatten() {
            let path = item.path();
            let name = item.file_name().to_string_lossy().into_owned();
            if let Some(rest) = name.strip_suffix(".tmp") {
                let pid = rest.rsplit('.').next().and_then(|p| p.parse::<i32>().ok());
                // Our own pid: a crashed run's (a container restarts with the same pid).
                if pid.is_none_or(|p| !alive(p) || p as u32 == std::process::id()) {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            let Some(stem) = name.strip_suffix(".pc") else {
                continue;
            };
            match read_header(&path).and_then(|(h, _)| self.check(&h).map(|()| h)) {
                Ok(h) => {
                    let meta = item.metadata().ok();
                    let time = meta.as_ref().and_then(|m| m.modified().ok());
                    let bytes = meta.map_or(0, |m| m.len());
                    found.push((time, stem.to_string(), h, bytes));
                }
                Err(e) => self.discard(&path, &e),
            }
        }
        found.sort_by_key(|f| f.0);
        for (_, name, h, bytes) in found {
            self.clock += 1;
            self.held += bytes;
            self.index.push(DiskEntry {
                name,
                tokens: h.tokens,
                marks: h.marks,
                bytes,
                used: self.clock,
            });
        }
        Ok(())
    }

    /// A file that cannot be used: said and removed.
    fn discard(&self, path: &Path, why: &str) {
        tracing::warn!("prefix cache: {}: {why}; removed", path.display());
        let _ = self.writer.send(Op::Remove(path.to_path_buf()));
    }

    /// Whether a header is of this model and these shapes.
    fn check(&self, h: &Header) -> Result<(), String> {
        if h.key != self.key {
            return Err(format!("written for another model or build (key {})", h.key));
        }
        if h.shapes != self.shapes {
            return Err("its layers are not this model's".into());
        }
        if h.marks.iter().any(|&m| m > h.tokens.len()) {
            return Err("a mark lies beyond its tokens".into());
        }
        Ok(())
    }

    /// The longest prefix of `prompt` (within its first `most` tokens, longer than `beat`)
    /// that a file holds, read back: the snapshot and how many tokens it resumes.
    pub(crate) fn lookup(&mut self, prompt: &[u32], most: usize, beat: usize) -> Option<(Snapshot, usize)> {
        loop {
            let recurrent = self.recurrent;
            let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner()).0.clone();
            let (at, n) = (self.index.iter().enumerate())
                // A file still being written is not there yet (memory has its state meanwhile).
                .filter(|(_, e)| !pending.contains(&e.path(&self.dir)))
                .map(|(i, e)| {
                    (
                        i,
                        usable(&e.tokens, e.marks.iter().copied(), recurrent, prompt, most),
                    )
                })
                .filter(|&(_, n)| n > beat)
                .max_by_key(|&(i, n)| (n, self.index[i].used))?;
            let path = self.index[at].path(&self.dir);
            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            let expected = self.index[at].bytes;
            let read = (if size == expected {
                Ok(())
            } else {
                Err(format!("{size} bytes where {expected} were written"))
            })
            .and_then(|()| read_file(&path))
            .and_then(|(h, values)| {
                self.check(&h)?;
                if h.tokens != self.index[at].tokens {
                    return Err("its tokens changed since it was listed".into());
                }
                snapshot(h, &values)
            });
            match read {
                Ok(s) => {
                    self.clock += 1;
                    self.index[at].used = self.clock;
                    self.hits += 1;
                    let _ = self.writer.send(Op::Touch(path));
                    return Some((s, n));
                }
                Err(e) => {
                    let gone = self.index.swap_remove(at);
                    self.held -= gone.bytes;
                    self.discard(&path, &e);
                }
            }
        }
    }

    /// Writes `s` (in the background) unless a file already stands for it; removes the files
    /// it stands for and, past the budget, the least recently used.
    pub(crate) fn insert(&mut self, s: &Arc<Snapshot>) {
        let c = &s.cache;
        let whole = (c.layers.iter()).all(|l| l.k.len() == c.len * l.k_dim && l.v.len() == c.len * l.v_dim);
        if shapes(c) != self.shapes || !whole {
            return;
        }
        let marks: Vec<usize> = s.marks.iter().map(|m| m.at).collect();
        let mut points = marks.clone();
        points.push(s.tokens.len());
        self.clock += 1;
        let clock = self.clock;
        let recurrent = self.recurrent;
        if let Some(e) =
            (self.index.iter_mut()).find(|e| covers(&e.tokens, &e.points(), &s.tokens, &points, recurrent))
        {
            e.used = clock;
            let _ = self.writer.send(Op::Touch(e.path(&self.dir)));
            return;
        }
        let header = header(&self.key, s);
        let bytes = (LEAD + header.len() + 8 + s.bytes()) as u64;
        if bytes > self.budget {
            return;
        }
        {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if p.1 + s.bytes() as u64 > MAX_QUEUED {
                tracing::warn!(
                    "prefix cache: the disk is behind ({} MiB queued); a state is not written",
                    p.1 >> 20
                );
                return;
            }
            p.1 += s.bytes() as u64;
        }
        let mut h = Xxh3::new();
        h.update(&header);
        let entry = DiskEntry {
            name: format!("{:016x}", h.digest()),
            tokens: s.tokens.clone(),
            marks,
            bytes,
            used: clock,
        };
        // Written before what it stands for is removed: a stop between them loses nothing.
        let path = entry.path(&self.dir);
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .insert(path.clone());
        let _ = self.writer.send(Op::Write {
            path,
            header,
            snapshot: s.clone(),
        });
        let (dir, writer) = (&self.dir, &self.writer);
        let held = &mut self.held;
        self.index.retain(|e| {
            let covered = covers(&s.tokens, &points, &e.tokens, &e.points(), recurrent);
            if covered {
                *held -= e.bytes;
                let _ = writer.send(Op::Remove(e.path(dir)));
            }
            !covered
        });
        self.held += bytes;
        self.index.push(entry);
        self.evict();
    }

    /// Removes the least recently used files beyond the budget.
    fn evict(&mut self) {
        while self.held > self.budget {
            let Some(oldest) = (self.index.iter().enumerate())
                .min_by_key(|(_, e)| e.used)
                .map(|(i, _)| i)
            else {
                break;
            };
            let e = self.index.swap_remove(oldest);
            self.held -= e.bytes;
            let _ = self.writer.send(Op::Remove(e.path(&self.dir)));
        }
    }
}

/// Whether process `pid` runs (a temporary file of a live process is left alone).
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

/// One operation of the writer thread; failures are said, never fatal.
fn run(op: Op) {
    match op {
        Op::Write {
            path,
            header,
            snapshot,
        } => {
            if let Err(e) = write_file(&path, &header, &snapshot) {
                tracing::warn!("prefix cache: writing {}: {e}", path.display());
            }
        }
        Op::Remove(path) => {
            let _ = std::fs::remove_file(path);
        }
        Op::Touch(path) => {
            let now = std::time::SystemTime::now();
            let _ = File::options()
                .write(true)
                .open(path)
                .and_then(|f| f.set_modified(now));
        }
        Op::Flush(done) => {
            let _ = done.send(());
        }
    }
}

struct Header {
    key: String,
    tokens: Vec<u32>,
    marks: Vec<usize>,
    shapes: Vec<Shape>,
}

fn header(key: &str, s: &Snapshot) -> Vec<u8> {
    let marks: Vec<usize> = s.marks.iter().map(|m| m.at).collect();
    let value = json!({
        "key": key,
        "tokens": s.tokens,
        "marks": marks,
        "layers": shapes(&s.cache),
    });
    serde_json::to_vec(&value).expect("JSON of numbers and a string")
}

fn parse_header(bytes: &[u8]) -> Result<Header, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("its header is not JSON: {e}"))?;
    let numbers = |field: &str| -> Result<Vec<u64>, String> {
        let list = v[field]
            .as_array()
            .ok_or(format!("its header has no `{field}` list"))?;
        (list.iter())
            .map(|n| {
                n.as_u64()
                    .ok_or(format!("its header's `{field}` holds a non-number"))
            })
            .collect()
    };
    let tokens = (numbers("tokens")?.into_iter())
        .map(|t| u32::try_from(t).map_err(|_| format!("token id {t} is out of range")))
        .collect::<Result<_, _>>()?;
    let layers = v["layers"].as_array().ok_or("its header has no `layers` list")?;
    let shapes = (layers.iter())
        .map(|l| {
            let dims: Vec<usize> = (l.as_array().into_iter().flatten())
                .filter_map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect();
            <Shape>::try_from(dims).map_err(|_| "a layer's shape is not 4 numbers".to_string())
        })
        .collect::<Result<_, _>>()?;
    Ok(Header {
        key: v["key"].as_str().ok_or("its header has no `key`")?.to_string(),
        tokens,
        marks: numbers("marks")?.into_iter().map(|m| m as usize).collect(),
        shapes,
    })
}

/// The header of a file, and its length (for the values after it).
fn read_header(path: &Path) -> Result<(Header, usize), String> {
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    let mut lead = [0u8; LEAD];
    f.read_exact(&mut lead)
        .map_err(|_| "shorter than its lead".to_string())?;
    let n = lead_header_len(&lead)?;
    if (LEAD + n + 8) as u64 > size {
        return Err(format!("a header of {n} bytes in a file of {size}"));
    }
    let mut bytes = vec![0u8; n];
    f.read_exact(&mut bytes)
        .map_err(|_| "shorter than its header".to_string())?;
    Ok((parse_header(&bytes)?, n))
}

fn lead_header_len(lead: &[u8]) -> Result<usize, String> {
    if &lead[..8] != MAGIC {
        return Err("not a strata prefix cache file".into());
    }
    let version = u32::from_le_bytes(lead[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(format!("version {version}, this strata reads {VERSION}"));
    }
    let n = u32::from_le_bytes(lead[12..16].try_into().expect("4 bytes")) as usize;
    if n > MAX_HEADER {
        return Err(format!("a header of {n} bytes"));
    }
    Ok(n)
}

/// A whole file, checked against its hash: its header and values.
fn read_file(path: &Path) -> Result<(Header, Vec<f32>), String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    if bytes.len() < LEAD + 8 {
        return Err("shorter than its lead".into());
    }
    let n = lead_header_len(&bytes[..LEAD])?;
    let (body, hash) = bytes.split_at(bytes.len() - 8);
    if xxh3_64(body) != u64::from_le_bytes(hash.try_into().expect("8 bytes")) {
        return Err("its checksum does not match (a torn or altered file)".into());
    }
    let header = body.get(LEAD..LEAD + n).ok_or("shorter than its header")?;
    let values = &body[LEAD + n..];
    if values.len() % 4 != 0 {
        return Err("its values are not whole f32s".into());
    }
    let values = (values.chunks_exact(4))
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    Ok((parse_header(header)?, values))
}

/// The snapshot a checked header and its values describe.
fn snapshot(h: Header, values: &[f32]) -> Result<Snapshot, String> {
    let len = h.tokens.len();
    let state: usize = h.shapes.iter().map(|s| s[2] + s[3]).sum();
    let per_layer = |s: &Shape| -> Option<usize> { len.checked_mul(s[0] + s[1])?.checked_add(s[2] + s[3]) };
    let want = (h.shapes.iter())
        .try_fold(0usize, |acc, s| acc.checked_add(per_layer(s)?))
        .and_then(|n| n.checked_add(h.marks.len().checked_mul(state)?));
    if want != Some(values.len()) {
        return Err(format!(
            "it holds {} values; its header describes {}",
            values.len(),
            want.map_or("more than fit in memory".to_string(), |w| w.to_string())
        ));
    }
    let mut rest = values;
    let mut take = |n: usize| {
        let (a, b) = rest.split_at(n);
        rest = b;
        a.to_vec()
    };
    let layers = (h.shapes.iter())
        .map(|&[k_dim, v_dim, r, c]| LayerCache {
            k_dim,
            v_dim,
            k: take(len * k_dim),
            v: take(len * v_dim),
            recurrent: take(r),
            conv: take(c),
            gpu: Default::default(),
        })
        .collect();
    let marks = (h.marks.iter())
        .map(|&at| Mark {
            at,
            state: take(state),
        })
        .collect();
    Ok(Snapshot {
        tokens: h.tokens,
        cache: KvCache { layers, len },
        marks,
    })
}

/// Writes `s` as a temporary file, syncs it, and renames it to `path`.
fn write_file(path: &Path, header: &[u8], s: &Snapshot) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    let result = (|| {
        let mut out = Hashed {
            out: BufWriter::with_capacity(1 << 20, File::create(&tmp)?),
            hash: Xxh3::new(),
        };
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        out.write_all(&(header.len() as u32).to_le_bytes())?;
        out.write_all(header)?;
        for l in &s.cache.layers {
            for part in [&l.k, &l.v, &l.recurrent, &l.conv] {
                out.floats(part)?;
            }
        }
        for m in &s.marks {
            out.floats(&m.state)?;
        }
        let hash = out.hash.digest();
        let mut file = out.out.into_inner().map_err(|e| e.into_error())?;
        file.write_all(&hash.to_le_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A writer that hashes what it writes.
struct Hashed {
    out: BufWriter<File>,
    hash: Xxh3,
}

impl Hashed {
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.hash.update(bytes);
        self.out.write_all(bytes)
    }

    fn floats(&mut self, values: &[f32]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(16 << 10);
        for chunk in values.chunks(4096) {
            buf.clear();
            buf.extend(chunk.iter().flat_map(|v| v.to_le_bytes()));
            self.write_all(&buf)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "prefix_disk_tests.rs"]
mod tests;
