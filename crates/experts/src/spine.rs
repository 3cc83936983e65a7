//! Streamed layers: the non-expert weights of decoder layers that do not fit the memory budget,
//! read from disk each time they run with the same direct reads as experts, a few layers ahead of
//! the one computing, and dropped after use (their read buffers go back to a pool).
//!
//! Each layer's tensors (as its block's dry build recorded them) are resolved at load time into
//! the fewest contiguous reads and a place for each in one aligned arena; the reads of one layer
//! are spread over the reader threads, and the thread that completes a layer's last read builds
//! its block, whose weights view the arena. Arenas (each the size of the largest layer, its pages
//! faulted in once when allocated) are recycled: after the first pass no read waits for fresh
//! pages, and memory stays at a fixed number of arenas.
//! `get(l)` keeps layer `l` and the next [`SpineStore::ahead`] streamed layers (in model order,
//! wrapping to the next token's first) read or in flight, and lets go of the rest.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use strata_formats::{BytesOwner, Checkpoint, Preloaded};
use strata_models::{Block, BlockBuilder, LayerStore, StreamedLayer};

use crate::direct::{AlignedBuf, DirectFile, IoMode};
use crate::engine::inflight::{Slot, Table};
use crate::engine::pool::BufferPool;
use crate::engine::readers::{Readers, Task};
use crate::engine::stats::StoreStats;
use crate::plan::{coalesce, ReadRun};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Reads of one layer are split at tensor boundaries into pieces of at most this much, so that
/// several threads share a layer.
const MAX_RUN: u64 = 64 << 20;

/// Reader threads a model with streamed layers adds to the pool.
pub const SPINE_THREADS: usize = 4;

/// Streamed layers read ahead of the one in use, by default.
pub const DEFAULT_AHEAD: usize = 2;

struct LayerPlan {
    runs: Vec<ReadRun>,
    /// Where each run's aligned span starts in the arena, and where the last one ends.
    places: Vec<usize>,
    arena_bytes: usize,
    /// Where each run's range starts in its span.
    skips: Vec<usize>,
    /// Where each tensor lies in the arena once the reads have landed: name -> (offset, length).
    pieces: Arc<HashMap<String, (usize, usize)>>,
}

/// The start of a layer's arena, for the reader threads that fill disjoint parts of it.
struct ArenaPtr(*mut u8);

// SAFETY: each reader writes only its own run's span of the arena (disjoint by construction),
// and nothing reads the arena until every write has completed.
unsafe impl Send for ArenaPtr {}
// SAFETY: as above.
unsafe impl Sync for ArenaPtr {}

/// One layer's read: its arena (one aligned buffer from the pool, the size of the largest
/// layer) and where each run landed in it, then the block (or what went wrong).
struct LayerRead {
    layer: usize,
    arena: Mutex<Option<AlignedBuf>>,
    base: ArenaPtr,
    remaining: AtomicUsize,
    error: Mutex<Option<String>>,
    slot: Slot<Arc<Block>>,
}

/// A layer's arena with where each tensor lies in it: the bytes its block views.
struct LayerBytes {
    arena: Option<AlignedBuf>,
    /// name -> (offset, length)
    pieces: Arc<HashMap<String, (usize, usize)>>,
    arenas: Arc<BufferPool>,
}

// SAFETY: the arena is owned here, never written after the reads that filled it, and goes back
// to the free list only when this (the owner every viewing weight holds) is dropped.
unsafe impl Preloaded for LayerBytes {
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        let &(off, len) = self.pieces.get(name)?;
        Some(&self.arena.as_ref()?.as_slice()[off..off + len])
    }
}

impl Drop for LayerBytes {
    fn drop(&mut self) {
        if let Some(arena) = self.arena.take() {
            self.arenas.give(arena);
        }
    }
}

/// The streamed layers, handed over by the model's load.
struct Streamed {
    plans: BTreeMap<usize, LayerPlan>,
    /// Streamed layers in model order.
    order: Vec<usize>,
    builder: BlockBuilder,
    /// Arenas no layer uses, for the next reads (their pages faulted in once, when made: a
    /// direct read into pages not yet faulted in has the kernel pin them one by one, 3-4x
    /// slower).
    arenas: Arc<BufferPool>,
    arena_len: usize,
}

struct Shared {
    ckpt: Checkpoint,
    files: Vec<DirectFile>,
    /// `--io mmap`: each layer paged in when needed, by one thread, nothing read ahead.
    mapped: bool,
    streamed: OnceLock<Streamed>,
    ahead: usize,
    /// Layers read or in flight.
    slots: Table<usize, LayerRead>,
    /// The model's reader pool (held weakly, as the expert store holds it).
    readers: std::sync::Weak<Readers>,
    stats: Arc<StoreStats>,
}

pub struct SpineStore {
    shared: Arc<Shared>,
    /// Keeps the reader pool alive while the store may queue reads on it.
    _readers: Arc<Readers>,
}

impl SpineStore {
    /// Opens the checkpoint's shards for the reads of streamed layers, which run on `readers`;
    /// the layers come from the model's load ([`LayerStore::stream`]). Reads count in `stats`
    /// (with the experts' when the store is shared).
    pub fn open(
        ckpt: Checkpoint,
        io: IoMode,
        ahead: usize,
        stats: Arc<StoreStats>,
        readers: &Arc<Readers>,
    ) -> strata_models::Result<SpineStore> {
        let mapped = io == IoMode::Mmap;
        // `--io mmap` is the baseline of an engine computing on a mapping: each layer is paged in
        // when it is needed, by one thread, nothing read ahead.
        let (mode, ahead) = if mapped {
            (IoMode::Mmap, 0)
        } else {
            (IoMode::Direct, ahead)
        };
        let mut files = Vec::with_capacity(ckpt.n_shards());
        for s in 0..ckpt.n_shards() {
            let path = ckpt.shard_path(s);
            files.push(
                DirectFile::open_mode(path, mode).map_err(|e| strata_formats::FormatError::Io {
                    path: path.to_path_buf(),
                    source: e,
                })?,
            );
        }
        let shared = Arc::new(Shared {
            ckpt,
            files,
            mapped,
            streamed: OnceLock::new(),
            ahead,
            slots: Table::default(),
            readers: Arc::downgrade(readers),
            stats,
        });
        Ok(SpineStore {
            shared,
            _readers: readers.clone(),
        })
    }

    /// Waits until no layer read is in flight (so a measurement of the disk does not share it
    /// with reads ahead).
    pub fn wait_idle(&self) {
        for r in self.shared.slots.values() {
            let _ = r.slot.wait();
        }
    }

    /// The streamed layers, in model order.
    pub fn layers(&self) -> &[usize] {
        self.shared.streamed.get().map_or(&[], |s| &s.order)
    }
}

/// Each streamed layer's reads: its tensors grouped into the fewest contiguous runs (at most
/// [`MAX_RUN`] each) and a place for each in one arena.
fn plan_layers(
    ckpt: &Checkpoint,
    layers: &[StreamedLayer],
    mapped: bool,
) -> strata_models::Result<BTreeMap<usize, LayerPlan>> {
    let mut plans = BTreeMap::new();
    for l in layers {
        let mut located = Vec::with_capacity(l.tensors.len());
        for (i, name) in l.tensors.iter().enumerate() {
            let e = ckpt.entry(name)?;
            located.push((e.shard, e.info.offset, e.info.len, i));
        }
        let runs = coalesce(located, MAX_RUN);
        let mut places = Vec::with_capacity(runs.len());
        let mut skips = Vec::with_capacity(runs.len());
        let mut pieces = HashMap::with_capacity(l.tensors.len());
        let mut end = 0;
        for r in &runs {
            places.push(end);
            // Where the range starts in its span: a mapping copies it to the span's start, a
            // direct read lands the aligned block around it.
            let skip = if mapped { 0 } else { DirectFile::skip(r.offset) };
            skips.push(skip);
            for &(t, off, len) in &r.pieces {
                pieces.insert(l.tensors[t].clone(), (end + skip + off as usize, len as usize));
            }
            end += DirectFile::span(r.offset, r.len as usize);
        }
        plans.insert(
            l.layer,
            LayerPlan {
                runs,
                places,
                skips,
                pieces: Arc::new(pieces),
                arena_bytes: end,
            },
        );
    }
    Ok(plans)
}

impl Shared {
    /// Run `run` of a layer's reads, on a reader thread; the read that lands last builds the
    /// block.
    fn serve(&self, read: &LayerRead, run: usize) {
        if let Err(e) = self.read_run(read, run) {
            // The first error of a layer's reads is the one reported.
            read.error.lock().expect("layer lock").get_or_insert(e);
        }
        if read.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let result = match read.error.lock().expect("layer lock").take() {
                Some(e) => Err(e),
                None => self.assemble(read),
            };
            read.slot.complete(result);
        }
    }

    fn streamed(&self) -> &Streamed {
        self.streamed
            .get()
            .expect("reads are queued only for streamed layers")
    }

    fn read_run(&self, read: &LayerRead, i: usize) -> Result<(), String> {
        let run = &self.streamed().plans[&read.layer].runs[i];
        let file = &self.files[run.shard];
        let what = || {
            format!(
                "{}: reading the weights of layer {} ({} bytes at {})",
                file.path().display(),
                read.layer,
                run.len,
                run.offset
            )
        };
        self.ckpt
            .ensure(run.shard, run.offset, run.len)
            .map_err(|e| format!("{}: {e}", what()))?;
        let plan = &self.streamed().plans[&read.layer];
        let span = DirectFile::span(run.offset, run.len as usize);
        // SAFETY: the run's span lies inside the arena (sized for the largest layer's spans) and
        // no other run's span overlaps it; the arena lives in `read` until every run has landed.
        let dst = unsafe { std::slice::from_raw_parts_mut(read.base.0.add(plan.places[i]), span) };
        self.stats.read_started();
        let skip = file.read_into_slice(run.offset, run.len as usize, dst);
        self.stats.read_finished();
        let skip = skip.map_err(|e| format!("{}: {e}", what()))?;
        if skip != plan.skips[i] {
            return Err(format!(
                "{}: the range landed {skip} bytes into its buffer, not {} as planned",
                what(),
                plan.skips[i]
            ));
        }
        self.stats.bytes_read.fetch_add(run.len, Ordering::Relaxed);
        self.stats.spine_bytes.fetch_add(run.len, Ordering::Relaxed);
        Ok(())
    }

    /// The block of a layer whose reads have all landed.
    fn assemble(&self, read: &LayerRead) -> Result<Arc<Block>, String> {
        let streamed = self.streamed();
        let plan = &streamed.plans[&read.layer];
        let arena = read.arena.lock().expect("layer lock").take();
        let bytes = Arc::new(LayerBytes {
            arena,
            pieces: plan.pieces.clone(),
            arenas: streamed.arenas.clone(),
        });
        let owner: BytesOwner = bytes.clone();
        let view = self.ckpt.with_preloaded(bytes, owner);
        let block = (streamed.builder)(&view, read.layer).map_err(|e| e.to_string())?;
        self.stats.spine_layers.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(block))
    }

    /// Makes sure `layer` is read or in flight (its reads first in line when `urgent`).
    fn request(self: &Arc<Self>, layer: usize, urgent: bool) -> Arc<LayerRead> {
        let streamed = self.streamed();
        let n = streamed.plans[&layer].runs.len();
        let (read, new) = self.slots.get_or_start(layer, || {
            let mut arena = streamed.arenas.take(streamed.arena_len);
            Arc::new(LayerRead {
                layer,
                base: ArenaPtr(arena.as_mut_ptr()),
                arena: Mutex::new(Some(arena)),
                remaining: AtomicUsize::new(n),
                error: Mutex::new(None),
                slot: Slot::default(),
            })
        });
        if !new {
            return read;
        }
        match self.readers.upgrade() {
            Some(readers) if n > 0 => {
                let task = |runs: std::ops::Range<usize>| -> Task {
                    let (shared, read) = (self.clone(), read.clone());
                    Box::new(move || runs.for_each(|i| shared.serve(&read, i)))
                };
                if self.mapped {
                    // Paged in by one thread, run after run.
                    readers.run([task(0..n)], urgent);
                } else {
                    readers.run((0..n).map(|i| task(i..i + 1)), urgent);
                }
            }
            Some(_) => read.slot.complete(self.assemble(&read)),
            None => read.slot.complete(Err("the reader threads have stopped".into())),
        }
        read
    }
}

impl LayerStore for SpineStore {
    fn stream(&self, layers: Vec<StreamedLayer>, builder: BlockBuilder) -> strata_models::Result<()> {
        let s = &self.shared;
        let plans = plan_layers(&s.ckpt, &layers, s.mapped)?;
        let arena_len = plans.values().map(|p| p.arena_bytes).max().unwrap_or(0);
        let streamed = Streamed {
            order: plans.keys().copied().collect(),
            plans,
            builder,
            // Kept free: the layer in use, those read ahead, and one being let go.
            arenas: Arc::new(BufferPool::new(
                (s.ahead + 2) * AlignedBuf::capacity_for(arena_len),
            )),
            arena_len,
        };
        s.streamed
            .set(streamed)
            .map_err(|_| strata_models::ModelError::Spine {
                layer: layers.first().map_or(0, |l| l.layer),
                cause: "the streamed layers were handed over twice".into(),
            })
    }

    fn get(&self, layer: usize) -> Result<Arc<Block>, BoxError> {
        let s = &self.shared;
        let Some(order) = s.streamed.get().map(|st| &st.order) else {
            return Err(format!("layer {layer} is not a streamed layer (none are)").into());
        };
        let Some(pos) = order.iter().position(|&l| l == layer) else {
            return Err(format!("layer {layer} is not a streamed layer").into());
        };
        let read = {
            let wanted: Vec<usize> = (0..=s.ahead.min(order.len() - 1))
                .map(|i| order[(pos + i) % order.len()])
                .collect();
            // Let go first: the arenas of layers no longer wanted serve the new reads.
            s.slots.retain(|l| wanted.contains(l));
            let read = s.request(layer, true);
            for &l in &wanted[1..] {
                s.request(l, false);
            }
            read
        };
        let t0 = std::time::Instant::now();
        let result = read.slot.wait();
        s.stats
            .spine_wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        result.map_err(|e| {
            // Read again next time rather than keep failing on a stale result.
            s.slots.remove(&layer);
            e.into()
        })
    }

    fn ready(&self, layer: usize) -> Option<Arc<Block>> {
        let read = self.shared.slots.get(&layer)?;
        read.slot.result()?.ok()
    }
}
