//! The disk-backed expert store: a RAM cache with a byte budget (LRU) over direct reads of the
//! checkpoint's shards. Every routed expert is returned; a miss is read, never skipped. The misses
//! of one call are read in parallel, one contiguous read per run of the expert's tensors.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use strata_formats::Checkpoint;
use strata_models::{Expert, ExpertLayout, ExpertStore};

use crate::direct::DirectFile;
use crate::plan::ExpertPlan;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Default)]
pub struct StoreStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_read: AtomicU64,
    pub evictions: AtomicU64,
}

struct Entry {
    expert: Arc<Expert>,
    bytes: usize,
    tick: u64,
}

#[derive(Default)]
struct Lru {
    map: HashMap<(usize, usize), Entry>,
    /// tick -> key, oldest first.
    order: BTreeMap<u64, (usize, usize)>,
    bytes: usize,
    tick: u64,
}

pub struct CachedStore {
    files: Vec<DirectFile>,
    plans: HashMap<(usize, usize), ExpertPlan>,
    budget: usize,
    io_threads: usize,
    lru: Mutex<Lru>,
    pub stats: StoreStats,
}

impl CachedStore {
    /// Resolves every expert of `layout` (all checks happen now, not mid-generation) and opens the
    /// shards for direct reads. `budget` bounds the decoded experts held in RAM.
    pub fn open(
        ckpt: &Checkpoint,
        layout: &ExpertLayout,
        budget: usize,
    ) -> strata_models::Result<CachedStore> {
        let mut plans = HashMap::new();
        for &layer in &layout.moe_layers {
            for e in 0..layout.n_experts {
                plans.insert((layer, e), ExpertPlan::resolve(ckpt, layout, layer, e)?);
            }
        }
        let mut files = Vec::with_capacity(ckpt.n_shards());
        for s in 0..ckpt.n_shards() {
            let path = ckpt.shard_path(s);
            let file = DirectFile::open(path).map_err(|e| strata_formats::FormatError::Io {
                path: path.to_path_buf(),
                source: e,
            })?;
            files.push(file);
        }
        Ok(CachedStore {
            files,
            plans,
            budget,
            io_threads: 8,
            lru: Mutex::new(Lru::default()),
            stats: StoreStats::default(),
        })
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes of decoded experts held now.
    pub fn cached_bytes(&self) -> usize {
        self.lru.lock().expect("cache lock").bytes
    }

    /// Reads and decodes one expert from disk.
    fn read(&self, layer: usize, expert: usize) -> Result<Expert, BoxError> {
        let plan = &self.plans[&(layer, expert)];
        let mut pieces: Vec<Option<Vec<u8>>> = vec![None; plan.tensors.len()];
        for run in &plan.runs {
            let file = &self.files[run.shard];
            let (buf, skip) = file.read_range(run.offset, run.len as usize).map_err(|e| {
                format!(
                    "{}: reading expert {expert} of layer {layer} ({} bytes at {}): {e}",
                    file.path().display(),
                    run.len,
                    run.offset
                )
            })?;
            self.stats.bytes_read.fetch_add(run.len, Ordering::Relaxed);
            let data = &buf.as_slice()[skip..];
            for &(i, off, len) in &run.pieces {
                pieces[i] = Some(data[off as usize..(off + len) as usize].to_vec());
            }
        }
        let mut next = 0;
        let mut build = |spec: &strata_models::LinearSpec| -> Result<strata_kernels::Linear, BoxError> {
            let refs: Vec<&[u8]> = (next..next + spec.tensors.len())
                .map(|i| pieces[i].as_deref().expect("every tensor is in a run"))
                .collect();
            next += spec.tensors.len();
            Ok(spec.build(&refs)?)
        };
        Ok(Expert {
            gate: build(&plan.specs[0])?,
            up: build(&plan.specs[1])?,
            down: build(&plan.specs[2])?,
        })
    }

    fn insert(&self, key: (usize, usize), expert: Arc<Expert>) {
        let bytes = expert.bytes();
        if bytes > self.budget {
            return; // used for this step only
        }
        let mut lru = self.lru.lock().expect("cache lock");
        if lru.map.contains_key(&key) {
            return;
        }
        while lru.bytes + bytes > self.budget {
            let Some((_, old)) = lru.order.pop_first() else {
                break;
            };
            if let Some(e) = lru.map.remove(&old) {
                lru.bytes -= e.bytes;
                self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        lru.tick += 1;
        let tick = lru.tick;
        lru.order.insert(tick, key);
        lru.bytes += bytes;
        lru.map.insert(key, Entry { expert, bytes, tick });
    }
}

impl ExpertStore for CachedStore {
    fn get(&self, layer: usize, ids: &[usize]) -> Result<Vec<Arc<Expert>>, BoxError> {
        let mut out: Vec<Option<Arc<Expert>>> = vec![None; ids.len()];
        let mut misses = Vec::new();
        {
            let mut lru = self.lru.lock().expect("cache lock");
            for (i, &e) in ids.iter().enumerate() {
                if !self.plans.contains_key(&(layer, e)) {
                    return Err(
                        format!("expert {e} of layer {layer} does not exist in this checkpoint").into(),
                    );
                }
                lru.tick += 1;
                let tick = lru.tick;
                let Lru { map, order, .. } = &mut *lru;
                if let Some(entry) = map.get_mut(&(layer, e)) {
                    order.remove(&entry.tick);
                    entry.tick = tick;
                    order.insert(tick, (layer, e));
                    out[i] = Some(entry.expert.clone());
                } else {
                    misses.push(i);
                }
            }
        }
        self.stats
            .hits
            .fetch_add((ids.len() - misses.len()) as u64, Ordering::Relaxed);
        self.stats
            .misses
            .fetch_add(misses.len() as u64, Ordering::Relaxed);
        // All misses of the call in flight together, a bounded number at a time.
        for chunk in misses.chunks(self.io_threads.max(1)) {
            let results: Vec<Result<Expert, BoxError>> = std::thread::scope(|s| {
                let handles: Vec<_> = chunk
                    .iter()
                    .map(|&i| s.spawn(move || self.read(layer, ids[i])))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err("expert reader thread panicked".into()))
                    })
                    .collect()
            });
            for (&i, r) in chunk.iter().zip(results) {
                let expert = Arc::new(r?);
                self.insert((layer, ids[i]), expert.clone());
                out[i] = Some(expert);
            }
        }
        Ok(out.into_iter().map(|e| e.expect("filled")).collect())
    }
}
