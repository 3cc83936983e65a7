//! The aligned read buffers of every read (experts' runs, streamed layers' arenas): faulted in
//! once (while the model loads, or when first made), then recycled.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::direct::AlignedBuf;

/// Read buffers that held experts no one uses any more (or none yet), kept for the next reads:
/// a fresh buffer would have the kernel fault in and zero every one of its pages again.
pub(crate) struct BufferPool {
    /// Free buffers by capacity, and their bytes.
    free: Mutex<(BTreeMap<usize, Vec<AlignedBuf>>, usize)>,
    /// Most bytes kept free.
    max_bytes: usize,
    /// Bytes of buffers allocated (and faulted in) by a read because none free fitted.
    pub(crate) fresh_bytes: AtomicU64,
    /// Bytes of buffers faulted in by the warmer before any read needed them.
    pub(crate) warmed_bytes: AtomicU64,
    /// Bytes of buffers alive (free, in the cache or being read into).
    live_bytes: AtomicUsize,
}

impl BufferPool {
    pub(crate) fn new(max_bytes: usize) -> BufferPool {
        BufferPool {
            free: Mutex::new((BTreeMap::new(), 0)),
            max_bytes,
            fresh_bytes: AtomicU64::new(0),
            warmed_bytes: AtomicU64::new(0),
            live_bytes: AtomicUsize::new(0),
        }
    }

    /// The smallest free buffer of at least `len` bytes, or a new one.
    pub(crate) fn take(&self, len: usize) -> AlignedBuf {
        let mut free = self.free.lock().expect("pool lock");
        let (map, bytes) = &mut *free;
        if let Some(cap) = map.range(len..).next().map(|(&cap, _)| cap) {
            let list = map.get_mut(&cap).expect("a listed capacity");
            let buf = list.pop().expect("no capacity is listed without buffers");
            if list.is_empty() {
                map.remove(&cap);
            }
            *bytes -= buf.capacity();
            return buf;
        }
        drop(free);
        // Fault the new pages in now: left to the direct read, the kernel pins them one by one
        // inside it (3-4x slower reads).
        let buf = AlignedBuf::new(len);
        let buf = self.faulted_in(buf);
        self.fresh_bytes
            .fetch_add(buf.capacity() as u64, Ordering::Relaxed);
        buf
    }

    pub(crate) fn give(&self, buf: AlignedBuf) {
        let mut free = self.free.lock().expect("pool lock");
        if free.1 + buf.capacity() <= self.max_bytes {
            free.1 += buf.capacity();
            free.0.entry(buf.capacity()).or_default().push(buf);
        } else {
            self.live_bytes.fetch_sub(buf.capacity(), Ordering::Relaxed);
        }
    }

    fn faulted_in(&self, mut buf: AlignedBuf) -> AlignedBuf {
        buf.touch();
        self.live_bytes.fetch_add(buf.capacity(), Ordering::Relaxed);
        buf
    }

    /// Bytes of free buffers.
    #[cfg(test)]
    fn free_bytes(&self) -> usize {
        self.free.lock().expect("pool lock").1
    }
}

/// Faulting a page in can cost the kernel more than the disk takes to fill it (1-2 GB/s of one
/// core in a VM whose disk gives 2 GB/s), so a cache filling from reads would spend its first
/// tokens zeroing pages on the cores the experts are computed on, and the reads would wait
/// behind that work. The warmer faults in every buffer the plan gave the cache and the reads, of
/// the lengths the experts' runs need, on every core while the model loads; decoding then
/// recycles them. A read that finds none free that fits still makes its own.
pub(crate) struct Warmer {
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Warmer {
    /// Starts faulting in one buffer of each of `lengths` into `pool`.
    pub(crate) fn start(pool: &Arc<BufferPool>, lengths: Vec<usize>) -> Warmer {
        let stop = Arc::new(AtomicBool::new(false));
        let n = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
        let jobs = Arc::new((lengths, AtomicUsize::new(0)));
        let threads = (0..n)
            .filter_map(|i| {
                let (pool, jobs, stop) = (Arc::downgrade(pool), jobs.clone(), stop.clone());
                std::thread::Builder::new()
                    .name(format!("strata-warm-{i}"))
                    .spawn(move || warm(pool, &jobs.0, &jobs.1, &stop))
                    .ok()
            })
            .collect();
        Warmer {
            stop,
            threads: Mutex::new(threads),
        }
    }

    /// Waits until every buffer is faulted in.
    pub(crate) fn wait(&self) {
        let threads = std::mem::take(&mut *self.threads.lock().expect("warmer lock"));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Warmer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.wait();
    }
}

fn warm(pool: Weak<BufferPool>, lengths: &[usize], next: &AtomicUsize, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let Some(&len) = lengths.get(next.fetch_add(1, Ordering::Relaxed)) else {
            return;
        };
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let buf = pool.faulted_in(AlignedBuf::new(len));
        pool.warmed_bytes
            .fetch_add(buf.capacity() as u64, Ordering::Relaxed);
        pool.give(buf);
    }
}

/// An expert's read buffers while its weights view them; back to the pool when dropped.
pub(crate) struct PooledBuffers {
    pub(crate) buffers: Vec<AlignedBuf>,
    pub(crate) pool: Arc<BufferPool>,
}

impl Drop for PooledBuffers {
    fn drop(&mut self) {
        for b in self.buffers.drain(..) {
            self.pool.give(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warmer_fills_the_pool_and_reads_take_the_smallest_that_fits() {
        let pool = Arc::new(BufferPool::new(1 << 20));
        let lengths = [10_000, 3_000, 10_000, 3_000, 3_000];
        let total: usize = lengths.iter().map(|&l| AlignedBuf::capacity_for(l)).sum();
        Warmer::start(&pool, lengths.to_vec()).wait();
        assert_eq!(pool.warmed_bytes.load(Ordering::Relaxed) as usize, total);
        assert_eq!(pool.live_bytes.load(Ordering::Relaxed), total);
        assert_eq!(pool.free_bytes(), total);
        let b = pool.take(2_000);
        assert_eq!(b.capacity(), AlignedBuf::capacity_for(3_000));
        let big = pool.take(9_000);
        assert_eq!(big.capacity(), AlignedBuf::capacity_for(10_000));
        assert_eq!(
            pool.fresh_bytes.load(Ordering::Relaxed),
            0,
            "no read made its own"
        );
        let huge = pool.take(50_000);
        assert_eq!(pool.fresh_bytes.load(Ordering::Relaxed) as usize, huge.capacity());
        for b in [b, big, huge] {
            pool.give(b);
        }
        assert_eq!(pool.free_bytes(), pool.live_bytes.load(Ordering::Relaxed));
    }

    #[test]
    fn a_stopped_warmer_stops_and_a_full_pool_releases() {
        let pool = Arc::new(BufferPool::new(1 << 30));
        drop(Warmer::start(&pool, vec![1 << 20; 1024])); // stops at once, then joins
        let warmed = pool.warmed_bytes.load(Ordering::Relaxed) as usize;
        assert!(warmed < 1 << 30 && warmed.is_multiple_of(1 << 20));
        assert_eq!(pool.live_bytes.load(Ordering::Relaxed), warmed);
        // A buffer beyond what the pool keeps free is released, and no longer alive.
        let small = Arc::new(BufferPool::new(0));
        let b = small.take(100);
        assert_eq!(small.live_bytes.load(Ordering::Relaxed), b.capacity());
        small.give(b);
        assert_eq!(small.live_bytes.load(Ordering::Relaxed), 0);
        assert_eq!(small.free_bytes(), 0);
    }
}
