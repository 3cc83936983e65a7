//! The disk-backed expert store: a RAM cache with a byte budget (LRU) over direct reads of the
//! checkpoint's shards, fed by a pool of reader threads. Every routed expert is returned; a miss is
//! read, never skipped.
//!
//! Reads are requests to the pool: `get` submits a layer's misses at once and waits for them;
//! `prefetch` submits reads of experts the model predicts for a later layer (their bytes arrive
//! while this layer computes). A request for an expert already in flight waits for that read
//! instead of issuing another. When the real routing of a layer arrives, queued guesses that lost
//! are cancelled; recall and wasted bytes are counted.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};

use strata_formats::Checkpoint;
use strata_models::ExpertStore;
use strata_weights::{Expert, ExpertLayout};

use crate::direct::{AlignedBuf, DirectFile, IoMode};
use strata_kernels::Owner;

use crate::engine::inflight::{Slot, Table};
use crate::engine::jobs::{stop_readers, Jobs};
use crate::engine::pool::{BufferPool, PooledBuffers, Warmer};
use crate::engine::readers::{Readers, Task};
use crate::engine::stats::StoreStats;
use crate::plan::ExpertPlan;

mod demand;
mod lru;
mod options;
mod uring;
mod warm;
pub use lru::Eviction;
use lru::{Entry, Lru};
pub use options::{CacheOptions, FaultIn, Prefetch};
pub use uring::available as uring_available;
use warm::{preload_keys, warm_lengths};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Key = (usize, usize);

/// The result of a queued guess that was cancelled before it was read.
const CANCELLED: &str = "cancelled";

/// One expert's read in flight (or queued): whoever needs the expert waits on its slot. A guess
/// (`speculative`) may be cancelled while still queued.
struct InFlight {
    slot: Slot<Arc<Expert>>,
    cancelled: AtomicBool,
    speculative: AtomicBool,
}

struct Shared {
    files: Vec<DirectFile>,
    /// A remote model's local cache, filled before each read, with each shard's file name.
    source: Option<(Arc<dyn strata_formats::RangeSource>, Vec<String>)>,
    plans: HashMap<Key, ExpertPlan>,
    budget: usize,
    lru: Mutex<Lru>,
    inflight: Table<Key, InFlight>,
    /// The model's reader pool (held weakly: a read task holding this store must never hold
    /// the last reference to the pool it runs on).
    readers: std::sync::Weak<Readers>,
    /// `--io uring`: the reads for the io_uring thread.
    jobs: Jobs<(Key, Arc<InFlight>)>,
    /// The latest prediction per layer, consumed by that layer's `get`.
    predictions: Mutex<HashMap<usize, HashSet<usize>>>,
    pool: Arc<BufferPool>,
    prefetch: Prefetch,
    /// layer -> its experts (what a guess is compared with under `Prefetch::Batches`).
    experts_per_layer: HashMap<usize, usize>,
    /// Bytes of every expert of the model together.
    all_bytes: u64,
    /// `--io mmap`: misses are read through the mapping on the threads that need them, with
    /// nothing read ahead or overlapped (what an engine computing on a mapping gets).
    demand_paging: bool,
    /// `--io uring`: reads go to the store's io_uring thread.
    uring: bool,
    eviction: Eviction,
    /// layer -> (hits, misses)
    layer_stats: Mutex<BTreeMap<usize, (u64, u64)>>,
    stats: Arc<StoreStats>,
}

pub struct CachedStore {
    shared: Arc<Shared>,
    /// The io_uring thread (`--io uring`); otherwise reads run on `readers`.
    workers: Vec<std::thread::JoinHandle<()>>,
    /// Keeps the reader pool alive while the store may queue reads on it.
    _readers: Arc<Readers>,
    /// Faults in read buffers ahead of the reads (none with `--io mmap`).
    warmer: Option<Warmer>,
    /// The reads of `FaultIn::Preload`, until `finish_warming` has waited for them.
    preload: Mutex<Vec<(Key, Arc<InFlight>)>>,
    /// The store's counters (streamed layers' reads count here too).
    pub stats: Arc<StoreStats>,
    /// Where routing decisions are written (`--trace`), and what the trace's header says.
    routing_log: Mutex<Option<Arc<crate::RoutingLog>>>,
    layout: ExpertLayout,
}

/// What the cache was given while the model loaded.
#[derive(Clone, Copy, Debug, Default)]
pub struct Warmed {
    /// Bytes of empty read buffers faulted in.
    pub faulted_in: u64,
    /// Experts read into the cache (`FaultIn::Preload`), and their bytes on disk.
    pub preloaded_experts: usize,
    pub preloaded_bytes: u64,
}

/// Reader threads: direct reads overlap each other (the device queues them) and compute.
pub const DEFAULT_IO_THREADS: usize = 8;

impl CachedStore {
    /// Resolves every expert of `layout` (all checks happen now, not mid-generation), opens the
    /// shards for direct reads and starts (`FaultIn::AtLoad`) the warmer; reads run on `readers`
    /// (or, `--io uring`, one io_uring thread of the store's own).
    pub fn open(
        ckpt: &Checkpoint,
        layout: &ExpertLayout,
        options: CacheOptions,
        readers: &Arc<Readers>,
    ) -> strata_models::Result<CachedStore> {
        let CacheOptions {
            budget,
            kept_buffers,
            prefetch,
            io,
            eviction,
            fault_in,
        } = options;
        let mut plans = HashMap::new();
        for &layer in &layout.moe_layers {
            for e in 0..layout.n_experts {
                plans.insert((layer, e), ExpertPlan::resolve(ckpt, layout, layer, e)?);
            }
        }
        // The largest expert's reads (with each run's alignment slack): the memory plan reserves
        // the reads in flight and as many buffers kept free.
        let largest = (plans.values())
            .map(|p: &ExpertPlan| {
                p.runs
                    .iter()
                    .map(|r| r.len as usize + 2 * crate::direct::ALIGN)
                    .sum()
            })
            .max()
            .unwrap_or(0);
        let preloading = fault_in == FaultIn::Preload && io != IoMode::Mmap && ckpt.source().is_none();
        // Preloaded experts fault in their own buffers as they are read: the warmer makes only
        // those of the reads in flight.
        let warm = warm_lengths(&plans, if preloading { 0 } else { budget }, kept_buffers.max(1));
        let warm_bytes = warm.iter().map(|&l| AlignedBuf::capacity_for(l)).sum::<usize>();
        let mut files = Vec::with_capacity(ckpt.n_shards());
        for s in 0..ckpt.n_shards() {
            let path = ckpt.shard_path(s);
            let file = DirectFile::open_mode(path, io).map_err(|e| strata_formats::FormatError::Io {
                path: path.to_path_buf(),
                source: e,
            })?;
            files.push(file);
        }
        let source = ckpt.source().map(|src| {
            let names = (0..ckpt.n_shards())
                .map(|s| {
                    ckpt.shard_path(s)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                })
                .collect();
            (src.clone(), names)
        });
        let mut experts_per_layer = HashMap::new();
        for &(layer, _) in plans.keys() {
            *experts_per_layer.entry(layer).or_insert(0) += 1;
        }
        let all_bytes = plans.values().map(|p| p.bytes).sum();
        let shared = Arc::new(Shared {
            files,
            source,
            plans,
            budget,
            lru: Mutex::new(Lru::default()),
            inflight: Table::default(),
            readers: Arc::downgrade(readers),
            jobs: Jobs::new(),
            predictions: Mutex::new(HashMap::new()),
            pool: Arc::new(BufferPool::new(warm_bytes.max(kept_buffers.max(1) * largest))),
            prefetch: if io == IoMode::Mmap {
                Prefetch::Off
            } else {
                prefetch
            },
            all_bytes,
            experts_per_layer,
            demand_paging: io == IoMode::Mmap,
            uring: io == IoMode::Uring,
            eviction,
            layer_stats: Mutex::new(BTreeMap::new()),
            stats: Arc::default(),
        });
        let workers = if io == IoMode::Uring {
            let ring = uring::Ring::new(&shared.files).map_err(|e| strata_formats::FormatError::Io {
                path: ckpt.shard_path(0).to_path_buf(),
                source: std::io::Error::new(e.kind(), format!("setting up io_uring: {e}")),
            })?;
            let shared = shared.clone();
            vec![std::thread::Builder::new()
                .name("strata-uring".into())
                .spawn(move || shared.uring_worker(ring))
                .expect("spawning the io_uring thread")]
        } else {
            Vec::new()
        };
        let warmer =
            (io != IoMode::Mmap && fault_in != FaultIn::OnRead).then(|| Warmer::start(&shared.pool, warm));
        let preload = if preloading {
            let keys = preload_keys(&shared.plans, budget);
            keys.into_iter().map(|k| (k, shared.request(k, true))).collect()
        } else {
            Vec::new()
        };
        Ok(CachedStore {
            stats: shared.stats.clone(),
            shared,
            workers,
            _readers: readers.clone(),
            warmer,
            preload: Mutex::new(preload),
            routing_log: Mutex::new(None),
            layout: layout.clone(),
        })
    }

    pub fn budget(&self) -> usize {
        self.shared.budget
    }

    /// Writes every routing decision from now on to `path` (`--trace`; see [`crate::RoutingLog`]).
    pub fn trace_to(&self, path: &std::path::Path) -> std::io::Result<()> {
        let expert_bytes = self.shared.plans.values().map(|p| p.bytes).max().unwrap_or(0);
        let log = crate::RoutingLog::create(path, &self.layout, expert_bytes)?;
        *self.routing_log.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(log));
        Ok(())
    }

    /// Writes out the routing trace's buffered lines.
    pub fn flush_trace(&self) -> std::io::Result<()> {
        self.routing_log().map_or(Ok(()), |log| log.flush())
    }

    fn routing_log(&self) -> Option<Arc<crate::RoutingLog>> {
        self.routing_log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Which predicted experts are read ahead (`--prefetch`).
    pub fn prefetch_mode(&self) -> Prefetch {
        self.shared.prefetch
    }

    /// (layer, hits, misses) for every MoE layer asked so far.
    pub fn layer_stats(&self) -> Vec<(usize, u64, u64)> {
        let stats = self.shared.layer_stats.lock().expect("stats lock");
        stats.iter().map(|(&l, &(h, m))| (l, h, m)).collect()
    }

    /// Bytes of read buffers allocated so far because no recycled one fitted (each costs its
    /// pages faulted in and zeroed).
    pub fn fresh_buffer_bytes(&self) -> u64 {
        self.shared.pool.fresh_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of read buffers faulted in ahead of need so far.
    pub fn warmed_buffer_bytes(&self) -> u64 {
        self.shared.pool.warmed_bytes.load(Ordering::Relaxed)
    }

    /// Waits until the whole cache is faulted in, empty or preloaded (begun by `open`, so it
    /// overlaps the rest of the model's loading), telling `progress` (bytes, of all) after each
    /// preloaded expert; an error names the expert a preload read failed on.
    pub fn finish_warming(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<Warmed, BoxError> {
        if let Some(w) = &self.warmer {
            w.wait();
        }
        let reads = std::mem::take(&mut *self.preload.lock().expect("preload lock"));
        let total = reads.iter().map(|(key, _)| self.shared.plans[key].bytes).sum();
        let (mut experts, mut bytes) = (0, 0);
        for (key, read) in reads {
            read.slot.wait()?;
            experts += 1;
            bytes += self.shared.plans[&key].bytes;
            progress(bytes, total);
        }
        Ok(Warmed {
            faulted_in: self.warmed_buffer_bytes(),
            preloaded_experts: experts,
            preloaded_bytes: bytes,
        })
    }

    /// Reads every expert into the cache (`strata bench --compute-only`: tokens then read
    /// nothing), handing each to `each` and telling `progress` (bytes so far, bytes in all)
    /// after each layer; an error naming both sizes when the cache cannot hold them all.
    pub fn load_all(
        &self,
        progress: &mut dyn FnMut(u64, u64),
        each: &mut dyn FnMut(&Expert),
    ) -> Result<(), BoxError> {
        let s = &self.shared;
        let total: u64 = s.plans.values().map(|p| p.bytes).sum();
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let too_small = || {
            format!(
                "the experts take {:.2} GiB and the expert cache holds {:.2} GiB: every expert must fit \
                 for --compute-only (raise --mem or --expert-cache)",
                gib(total),
                gib(s.budget as u64)
            )
        };
        if total > s.budget as u64 {
            return Err(too_small().into());
        }
        let mut layers: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &(layer, e) in s.plans.keys() {
            layers.entry(layer).or_default().push(e);
        }
        let mut done = 0;
        for (layer, mut ids) in layers {
            ids.sort_unstable();
            self.get(layer, &ids)?.iter().for_each(|e| each(e));
            done += ids.iter().map(|&e| s.plans[&(layer, e)].bytes).sum::<u64>();
            progress(done, total);
        }
        if s.lru.lock().expect("cache lock").map.len() != s.plans.len() {
            return Err(too_small().into());
        }
        Ok(())
    }

    /// Bytes of decoded experts held now.
    pub fn cached_bytes(&self) -> usize {
        self.shared.lru.lock().expect("cache lock").bytes
    }

    /// The disk's own bound for this access pattern: reads the byte runs of `samples` experts
    /// (spread over every MoE layer, drawn with `seed`) with the same direct reads and
    /// parallelism as the pool, without decoding. Returns (bytes, seconds). Vary the seed from
    /// call to call: bytes read again may come from a cache below the file system (a VM host's).
    pub fn raw_read_bandwidth(&self, samples: usize, seed: u64) -> std::io::Result<(u64, f64)> {
        let s = &self.shared;
        let mut keys: Vec<Key> = s.plans.keys().copied().collect();
        keys.sort();
        let mut state = 0x2545_F491_4F6C_DD1Du64 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut pick = Vec::with_capacity(samples);
        for _ in 0..samples.min(keys.len()) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            pick.push(keys[(state % keys.len() as u64) as usize]);
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        // Each thread's buffer is faulted in before the clock starts (as the store's pooled
        // buffers are), so the figure is the disk's, not the page allocator's.
        let largest = (pick.iter())
            .map(|k| {
                s.plans[k]
                    .runs
                    .iter()
                    .map(|r| r.len as usize + 2 * crate::direct::ALIGN)
                    .max()
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        // From the pool (and back to it below): probing between tokens takes no fresh memory.
        let mut buffers: Vec<AlignedBuf> = (0..DEFAULT_IO_THREADS).map(|_| s.pool.take(largest)).collect();
        let t0 = std::time::Instant::now();
        let bytes: std::io::Result<u64> = std::thread::scope(|scope| {
            let handles: Vec<_> = buffers
                .iter_mut()
                .map(|buf| {
                    scope.spawn(|| -> std::io::Result<u64> {
                        let mut n = 0;
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(key) = pick.get(i) else { return Ok(n) };
                            for run in &s.plans[key].runs {
                                s.files[run.shard].read_range_into(run.offset, run.len as usize, buf)?;
                                n += run.len;
                            }
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("reader thread"))
                .sum()
        });
        let seconds = t0.elapsed().as_secs_f64();
        for b in buffers {
            s.pool.give(b);
        }
        Ok((bytes?, seconds))
    }
}

impl Drop for CachedStore {
    fn drop(&mut self) {
        stop_readers(&self.shared.jobs, &mut self.workers);
    }
}

impl Shared {
    /// One queued read, on a reader thread: the expert (unless its guess was cancelled) to the
    /// cache and its waiters.
    fn serve(&self, key: Key, slot: &InFlight) {
        let result = if slot.cancelled.load(Ordering::Relaxed) {
            Err(CANCELLED.to_string())
        } else {
            self.read(key.0, key.1).map(Arc::new).map_err(|e| e.to_string())
        };
        self.finish(key, slot, result);
    }

    /// Reads one expert from disk, one direct read per run into buffers from the pool; its
    /// weights are then views into those buffers (no copy), which go back to the pool when the
    /// last user of the expert drops it.
    fn read(&self, layer: usize, expert: usize) -> Result<Expert, BoxError> {
        let plan = &self.plans[&(layer, expert)];
        let mut buffers = Vec::with_capacity(plan.runs.len());
        let mut skips = Vec::with_capacity(plan.runs.len());
        for run in &plan.runs {
            let file = &self.files[run.shard];
            self.ensure_local((layer, expert), run)?;
            let mut buf = self.pool.take(run.len as usize + 2 * crate::direct::ALIGN);
            self.stats.read_started();
            let read = file.read_range_into(run.offset, run.len as usize, &mut buf);
            self.stats.read_finished();
            let skip = read.map_err(|e| {
                format!(
                    "{}: reading expert {expert} of layer {layer} ({} bytes at {}): {e}",
                    file.path().display(),
                    run.len,
                    run.offset
                )
            })?;
            self.stats.bytes_read.fetch_add(run.len, Ordering::Relaxed);
            buffers.push(buf);
            skips.push(skip);
        }
        self.assemble(plan, buffers, &skips)
    }

    /// The expert whose runs were read into `buffers` (each run starting `skips[i]` bytes in):
    /// its weights view the buffers, which return to the pool with the expert's last user.
    fn assemble(
        &self,
        plan: &ExpertPlan,
        buffers: Vec<AlignedBuf>,
        skips: &[usize],
    ) -> Result<Expert, BoxError> {
        let owned = Arc::new(PooledBuffers {
            buffers,
            pool: self.pool.clone(),
        });
        let mut pieces: Vec<&[u8]> = vec![&[]; plan.tensors.len()];
        for ((run, buf), skip) in plan.runs.iter().zip(&owned.buffers).zip(skips) {
            let data = &buf.as_slice()[*skip..];
            for &(i, off, len) in &run.pieces {
                pieces[i] = &data[off as usize..(off + len) as usize];
            }
        }
        let owner: Owner = owned.clone();
        // SAFETY: every piece lies in `owned`'s buffers, which nobody writes again until the
        // owner (held by each weight that views them) is dropped and returns them to the pool.
        let expert = unsafe { Expert::build_in(&plan.specs, &pieces, Some(&owner)) }?;
        for m in [&expert.gate, &expert.up, &expert.down] {
            let counter = if m.data.is_borrowed() {
                &self.stats.zero_copy_matrices
            } else {
                &self.stats.copied_matrices
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Ok(expert)
    }

    /// Fetches run `run` of `key` into the local cache first when the model is remote.
    fn ensure_local(&self, key: Key, run: &crate::plan::ReadRun) -> Result<(), BoxError> {
        if let Some((source, names)) = &self.source {
            source
                .ensure(&names[run.shard], run.offset, run.len)
                .map_err(|e| {
                    format!(
                        "fetching expert {} of layer {} ({} bytes at {}): {e}",
                        key.1, key.0, run.len, run.offset
                    )
                })?;
        }
        Ok(())
    }

    /// What a finished read of `key` leaves behind: the cache gets the expert, waiters the result.
    fn finish(&self, key: Key, slot: &InFlight, result: Result<Arc<Expert>, String>) {
        if let Ok(expert) = &result {
            self.insert(key, expert.clone());
        }
        self.inflight.remove(&key);
        slot.slot.complete(result);
    }

    fn insert(&self, key: Key, expert: Arc<Expert>) {
        let bytes = expert.bytes();
        if bytes > self.budget {
            return; // used by whoever waits for it, then dropped
        }
        let mut lru = self.lru.lock().expect("cache lock");
        if lru.map.contains_key(&key) {
            return;
        }
        while lru.bytes + bytes > self.budget {
            let Some(old) = lru.victim(self.eviction) else {
                break;
            };
            if let Some(e) = lru.map.remove(&old) {
                lru.order.remove(&e.tick);
                lru.bytes -= e.bytes;
                self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        lru.tick += 1;
        let tick = lru.tick;
        lru.order.insert(tick, key);
        lru.bytes += bytes;
        lru.map.insert(
            key,
            Entry {
                expert,
                bytes,
                tick,
                score: 1.0,
            },
        );
    }

    /// A cached expert (refreshing its recency), if any.
    fn lookup(&self, key: Key) -> Option<Arc<Expert>> {
        let mut lru = self.lru.lock().expect("cache lock");
        lru.tick += 1;
        let tick = lru.tick;
        let Lru { map, order, .. } = &mut *lru;
        let entry = map.get_mut(&key)?;
        order.remove(&entry.tick);
        if let Eviction::LfuDecay { half_life } = self.eviction {
            entry.score = Lru::decayed(entry.score, tick - entry.tick, half_life) + 1.0;
        }
        entry.tick = tick;
        order.insert(tick, key);
        Some(entry.expert.clone())
    }

    /// The read of `key`, already in flight or newly queued.
    fn request(self: &Arc<Self>, key: Key, speculative: bool) -> Arc<InFlight> {
        let (slot, new) = self.inflight.get_or_start(key, || {
            Arc::new(InFlight {
                slot: Slot::default(),
                cancelled: AtomicBool::new(false),
                speculative: AtomicBool::new(speculative),
            })
        });
        if !new {
            if !speculative {
                slot.speculative.store(false, Ordering::Relaxed);
                slot.cancelled.store(false, Ordering::Relaxed);
            }
            return slot;
        }
        match self.readers.upgrade() {
            Some(readers) if !self.uring => {
                let (shared, job) = (self.clone(), slot.clone());
                readers.run([Box::new(move || shared.serve(key, &job)) as Task], !speculative);
            }
            _ => self.jobs.push([(key, slot.clone())], false),
        }
        slot
    }

    /// Scores the layer's prediction against its real routing and cancels queued losers.
    fn settle_prediction(&self, layer: usize, ids: &[usize]) {
        let Some(predicted) = self.predictions.lock().expect("prediction lock").remove(&layer) else {
            return;
        };
        let asked: HashSet<usize> = ids.iter().copied().collect();
        let right = asked.intersection(&predicted).count() as u64;
        self.stats
            .predicted_asked
            .fetch_add(asked.len() as u64, Ordering::Relaxed);
        self.stats.predicted_right.fetch_add(right, Ordering::Relaxed);
        let losers = predicted.difference(&asked).map(|&e| (layer, e));
        self.inflight.each_of(losers, |key, slot| {
            self.stats.predicted_wrong.fetch_add(1, Ordering::Relaxed);
            match slot {
                Some(slot) if slot.speculative.load(Ordering::Relaxed) => {
                    slot.cancelled.store(true, Ordering::Relaxed)
                }
                // Read already (or being read): its bytes were spent for nothing.
                _ => {
                    self.stats
                        .wasted_bytes
                        .fetch_add(self.plans[&key].bytes, Ordering::Relaxed);
                }
            }
        });
    }
}

impl ExpertStore for CachedStore {
    fn get(&self, layer: usize, ids: &[usize]) -> Result<Vec<Arc<Expert>>, BoxError> {
        let mut out: Vec<Option<Arc<Expert>>> = vec![None; ids.len()];
        self.get_batches(layer, ids, &mut |batch| {
            for (i, expert) in batch {
                out[*i] = Some(expert.clone());
            }
            Ok(())
        })?;
        Ok(out
            .into_iter()
            .map(|e| e.expect("every expert delivered"))
            .collect())
    }

    /// Hits are handed over at once (one batch), while every miss is already in flight; misses
    /// follow in the order their reads complete, each batch every read completed by then.
    fn get_batches(
        &self,
        layer: usize,
        ids: &[usize],
        on_ready: &mut strata_models::OnReady,
    ) -> Result<(), BoxError> {
        let s = &self.shared;
        for &e in ids {
            if !s.plans.contains_key(&(layer, e)) {
                return Err(format!("expert {e} of layer {layer} does not exist in this checkpoint").into());
            }
        }
        s.settle_prediction(layer, ids);
        let mut hits = Vec::new();
        let mut slots: Vec<Option<Arc<InFlight>>> = vec![None; ids.len()];
        let mut missed = Vec::new();
        for (i, &e) in ids.iter().enumerate() {
            match s.lookup((layer, e)) {
                Some(expert) => hits.push((i, expert)),
                None if s.demand_paging => missed.push(i),
                None => slots[i] = Some(s.request((layer, e), false)),
            }
        }
        let misses = ids.len() - hits.len();
        debug_assert!(missed.is_empty() || missed.len() == misses);
        s.stats.hits.fetch_add(hits.len() as u64, Ordering::Relaxed);
        s.stats.misses.fetch_add(misses as u64, Ordering::Relaxed);
        {
            let mut per_layer = s.layer_stats.lock().expect("stats lock");
            let e = per_layer.entry(layer).or_default();
            e.0 += hits.len() as u64;
            e.1 += misses as u64;
        }
        if !hits.is_empty() {
            on_ready(&hits)?;
        }
        if s.demand_paging {
            return s.read_on_demand(layer, ids, &missed, on_ready);
        }
        let (tx, rx) = channel();
        let mut waiting = 0;
        for (i, slot) in slots.iter().enumerate() {
            if let Some(slot) = slot {
                if slot.slot.result_or_listen(&tx, i).is_some() {
                    tx.send(i).expect("own channel");
                }
                waiting += 1;
            }
        }
        let mut waited = std::time::Duration::ZERO;
        let mut ready = Vec::new();
        while waiting > 0 {
            let t0 = std::time::Instant::now();
            let first = rx.recv().expect("a sender is held here");
            waited += t0.elapsed();
            // This read and every other one completed by now: one batch.
            for i in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                let slot = slots[i].as_ref().expect("slot of a miss");
                match slot.slot.result().expect("completed") {
                    Ok(expert) => {
                        waiting -= 1;
                        ready.push((i, expert));
                    }
                    // A guess cancelled just before this layer claimed it: read it now.
                    Err(msg) if msg == CANCELLED => {
                        let again = s.request((layer, ids[i]), false);
                        if again.slot.result_or_listen(&tx, i).is_some() {
                            tx.send(i).expect("own channel");
                        }
                        slots[i] = Some(again);
                    }
                    Err(msg) => return Err(msg.into()),
                }
            }
            if !ready.is_empty() {
                on_ready(&ready)?;
                ready.clear();
            }
        }
        s.stats
            .wait_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn submit(&self, layer: usize, ids: &[usize]) {
        let s = &self.shared;
        if s.demand_paging {
            return; // nothing is read before it is needed
        }
        s.settle_prediction(layer, ids);
        for &e in ids {
            if s.plans.contains_key(&(layer, e))
                && !s.lru.lock().expect("cache lock").map.contains_key(&(layer, e))
            {
                s.request((layer, e), false);
            }
        }
    }

    /// Every expert of `layer` is in the cache, and the cache holds every expert of the model
    /// (so none is ever evicted).
    fn holds_layer(&self, layer: usize) -> bool {
        let s = &self.shared;
        if s.demand_paging || s.all_bytes > s.budget as u64 {
            return false;
        }
        let Some(&n) = s.experts_per_layer.get(&layer) else {
            return false;
        };
        let lru = s.lru.lock().expect("cache lock");
        (0..n).all(|e| lru.map.contains_key(&(layer, e)))
    }

    fn routed(&self, layer: usize, tokens: &[&[usize]]) {
        if let Some(log) = self.routing_log() {
            log.routed(layer, tokens);
        }
    }

    fn wants_guesses(&self) -> bool {
        !matches!(self.shared.prefetch, Prefetch::Off) || self.routing_log().is_some()
    }

    fn prefetch(&self, layer: usize, ids: &[usize]) {
        if let Some(log) = self.routing_log() {
            log.guessed(layer, ids);
        }
        let s = &self.shared;
        let of_layer = s.experts_per_layer.get(&layer).copied().unwrap_or(0);
        let read = match s.prefetch {
            Prefetch::Off => false,
            Prefetch::Batches => 2 * ids.len() >= of_layer.max(1),
            Prefetch::On => true,
        };
        if !read {
            return;
        }
        let mut wanted = HashSet::new();
        for &e in ids {
            if !s.plans.contains_key(&(layer, e)) {
                continue;
            }
            wanted.insert(e);
            if s.lru.lock().expect("cache lock").map.contains_key(&(layer, e)) {
                continue;
            }
            s.request((layer, e), true);
        }
        s.predictions
            .lock()
            .expect("prediction lock")
            .insert(layer, wanted);
    }
}
