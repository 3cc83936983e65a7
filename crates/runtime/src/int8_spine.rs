//! `--spine-format int8`: resident non-expert linear layers held as INT8 with one scale per
//! output row (half the bytes of BF16), converted once as they load and kept in a sidecar in
//! strata's cache, so later starts read INT8 directly.
//!
//! The sidecar is keyed by the checkpoint's identity (every shard's name and size, its
//! modification time unless it is a remote model's mirror, whose commit names its folder, and
//! every tensor's name, dtype, shape and offset): `<cache>/int8-spine/<key>/data.bin` holds each
//! converted layer's weight bytes then its f32 scales, appended under a lock (processes may
//! share it); `index.json` says where each layer is and is replaced atomically when a load
//! ends, after the data it names is synced. Data without an index entry is never read, so a
//! crash mid-write leaves nothing trusted that is wrong; a failed write (a full disk) only
//! stops the sidecar, never the load.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};
use strata_formats::{Checkpoint, Int8Spine};

/// Changes whenever the conversion or the layout of the sidecar does.
const VERSION: &str = "strata-int8-rows-v1";
const INDEX: &str = "index.json";
const DATA: &str = "data.bin";
/// Conversions this large print their progress.
const LOUD_BYTES: u64 = 256 << 20;

/// Where a layer's bytes are in the data file: the weight (out x in bytes), then its scales.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Place {
    offset: u64,
    out_dim: usize,
    in_dim: usize,
}

/// What a load took from the sidecar and what it converted.
#[derive(Debug, Default)]
pub struct Int8Stats {
    pub read_layers: AtomicU64,
    pub read_bytes: AtomicU64,
    pub converted_layers: AtomicU64,
    pub converted_bytes: AtomicU64,
}

pub struct Int8Sidecar {
    /// None: no cache folder, every start converts.
    dir: Option<PathBuf>,
    /// Layers an earlier start wrote.
    known: HashMap<String, Place>,
    data: Option<File>,
    /// Layers written by this load (the index gets them at [`Int8Sidecar::finish`]).
    added: Mutex<HashMap<String, Place>>,
    /// A write failed: this load writes no more.
    stopped: AtomicBool,
    /// Bytes the plan expects the INT8 spine to take (for the progress lines).
    expected: u64,
    pub stats: Int8Stats,
}

/// Holds an exclusive `flock` on a file while alive.
struct Locked<'a>(&'a File);

impl<'a> Locked<'a> {
    fn new(f: &'a File) -> std::io::Result<Locked<'a>> {
        // SAFETY: flock on an open descriptor.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Locked(f))
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// The checkpoint's identity, as a hex key.
pub(crate) fn identity(ckpt: &Checkpoint) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(VERSION.as_bytes());
    for s in 0..ckpt.n_shards() {
        let path = ckpt.shard_path(s);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        h.update(name.as_bytes());
        let meta = std::fs::metadata(path).ok();
        h.update(&meta.as_ref().map_or(0, |m| m.len()).to_le_bytes());
        // A mirror's shard changes its time as it fills; its folder is its commit.
        let mirror = path.with_file_name(format!("{name}.strata-runs")).exists();
        if !mirror {
            let mtime = meta
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            h.update(&mtime.to_le_bytes());
        }
    }
    let mut tensors: Vec<String> = ckpt
        .entries()
        .map(|e| {
            format!(
                "{} {} {:?} {} {}",
                e.info.name,
                e.info.dtype.name(),
                e.info.shape,
                e.shard,
                e.info.offset
            )
        })
        .collect();
    tensors.sort();
    for t in &tensors {
        h.update(t.as_bytes());
    }
    if ckpt.source().is_some() {
        h.update(ckpt.dir().to_string_lossy().as_bytes());
    }
    format!("{:016x}", h.digest())
}

fn read_index(path: &Path) -> HashMap<String, Place> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return HashMap::new();
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        tracing::warn!(
            "{}: not valid JSON; the INT8 spine is converted again",
            path.display()
        );
        return HashMap::new();
    };
    if v["version"] != VERSION {
        return HashMap::new();
    }
    let mut out = HashMap::new();
    for (name, place) in v["layers"].as_object().into_iter().flatten() {
        let field = |i: usize| place.get(i).and_then(Value::as_u64);
        if let (Some(offset), Some(out_dim), Some(in_dim)) = (field(0), field(1), field(2)) {
            out.insert(
                name.clone(),
                Place {
                    offset,
                    out_dim: out_dim as usize,
                    in_dim: in_dim as usize,
                },
            );
        }
    }
    out
}

impl Int8Sidecar {
    /// The sidecar of `ckpt` under `cache_dir` (none: nothing kept between starts).
    /// `expected`: the INT8 spine's bytes in the plan.
    pub fn open(cache_dir: Option<&Path>, ckpt: &Checkpoint, expected: u64) -> Int8Sidecar {
        let dir = cache_dir.map(|c| c.join("int8-spine").join(identity(ckpt)));
        let mut sidecar = Int8Sidecar {
            dir: None,
            known: HashMap::new(),
            data: None,
            added: Mutex::new(HashMap::new()),
            stopped: AtomicBool::new(false),
            expected,
            stats: Int8Stats::default(),
        };
        let Some(dir) = dir else { return sidecar };
        let opened = std::fs::create_dir_all(&dir).and_then(|_| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(dir.join(DATA))
        });
        match opened {
            Ok(file) => {
                sidecar.known = read_index(&dir.join(INDEX));
                sidecar.data = Some(file);
                sidecar.dir = Some(dir);
            }
            Err(e) => tracing::warn!(
                "{}: {e}; the INT8 spine is converted at every start",
                dir.display()
            ),
        }
        sidecar
    }

    /// Where the sidecar lives.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    fn read(&self, place: &Place) -> std::io::Result<(Vec<i8>, Vec<f32>)> {
        let file = self.data.as_ref().ok_or(std::io::ErrorKind::NotFound)?;
        let n = place.out_dim * place.in_dim;
        let mut w = vec![0u8; n];
        file.read_exact_at(&mut w, place.offset)?;
        let mut s = vec![0u8; place.out_dim * 4];
        file.read_exact_at(&mut s, place.offset + n as u64)?;
        let scales = s
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        // i8 and u8 have one layout.
        let w = w.into_iter().map(|b| b as i8).collect();
        Ok((w, scales))
    }

    fn append(&self, w: &[i8], scales: &[f32]) -> std::io::Result<u64> {
        let file = self.data.as_ref().ok_or(std::io::ErrorKind::NotFound)?;
        let mut bytes = Vec::with_capacity(w.len() + scales.len() * 4);
        bytes.extend(w.iter().map(|&q| q as u8));
        for s in scales {
            bytes.extend_from_slice(&s.to_le_bytes());
        }
        let _lock = Locked::new(file)?;
        let at = file.metadata()?.len();
        file.write_all_at(&bytes, at)?;
        Ok(at)
    }

    /// Syncs what this load appended and records it in the index (merged with what other
    /// processes recorded meanwhile). Returns the layers recorded.
    pub fn finish(&self) -> usize {
        let added = std::mem::take(&mut *self.added.lock().expect("sidecar lock"));
        let (Some(dir), Some(file)) = (&self.dir, &self.data) else {
            return 0;
        };
        if added.is_empty() || self.stopped.load(Ordering::Relaxed) {
            return 0;
        }
        let written = (|| -> std::io::Result<()> {
            file.sync_data()?;
            let _lock = Locked::new(file)?;
            let mut layers = read_index(&dir.join(INDEX));
            layers.extend(added.iter().map(|(k, v)| (k.clone(), *v)));
            let body = json!({
                "version": VERSION,
                "layers": layers.iter().map(|(k, p)| (k.clone(), json!([p.offset, p.out_dim, p.in_dim]))).collect::<serde_json::Map<_, _>>(),
            });
            let tmp = dir.join(format!(".{INDEX}.tmp-{}", std::process::id()));
            std::fs::write(&tmp, body.to_string())?;
            File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, dir.join(INDEX))
        })();
        match written {
            Ok(()) => added.len(),
            Err(e) => {
                tracing::warn!("{}: {e}; the INT8 spine's sidecar was not updated", dir.display());
                0
            }
        }
    }

    /// A line every tenth of a large conversion (`before` -> `done` bytes converted).
    fn progress(&self, before: u64, done: u64) {
        if self.expected < LOUD_BYTES {
            return;
        }
        let step = self.expected / 10;
        if step > 0 && before / step != done / step {
            eprintln!(
                "[strata] INT8 spine: converted {:.1} of {:.1} GiB",
                done as f64 / (1u64 << 30) as f64,
                self.expected as f64 / (1u64 << 30) as f64
            );
        }
    }
}

impl Int8Spine for Int8Sidecar {
    fn converts(&self, base: &str) -> bool {
        // Routers stay as stored: a flipped expert choice costs more than its bytes save.
        !base.ends_with(".gate")
    }

    fn get(&self, base: &str, out_dim: usize, in_dim: usize) -> Option<(Vec<i8>, Vec<f32>)> {
        let place = self.known.get(base)?;
        if (place.out_dim, place.in_dim) != (out_dim, in_dim) {
            return None;
        }
        match self.read(place) {
            Ok(r) => {
                self.stats.read_layers.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .read_bytes
                    .fetch_add((r.0.len() + r.1.len() * 4) as u64, Ordering::Relaxed);
                Some(r)
            }
            Err(e) => {
                tracing::warn!("the INT8 spine's sidecar: {base}: {e}; converting it again");
                None
            }
        }
    }

    fn put(&self, base: &str, w: &[i8], scales: &[f32]) {
        self.stats.converted_layers.fetch_add(1, Ordering::Relaxed);
        let bytes = (w.len() + scales.len() * 4) as u64;
        let before = self.stats.converted_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.progress(before, before + bytes);
        if self.dir.is_none() || self.stopped.load(Ordering::Relaxed) {
            return;
        }
        match self.append(w, scales) {
            Ok(offset) => {
                let place = Place {
                    offset,
                    out_dim: scales.len(),
                    in_dim: w.len() / scales.len().max(1),
                };
                self.added
                    .lock()
                    .expect("sidecar lock")
                    .insert(base.to_string(), place);
            }
            Err(e) => {
                self.stopped.store(true, Ordering::Relaxed);
                tracing::warn!(
                    "the INT8 spine's sidecar in {}: {e}; this start keeps no more of it",
                    self.dir
                        .as_ref()
                        .map_or_else(String::new, |d| d.display().to_string())
                );
            }
        }
    }
}
