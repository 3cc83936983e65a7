//! The expert store's counters.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct StoreStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_read: AtomicU64,
    pub evictions: AtomicU64,
    /// Wall time callers spent waiting for expert reads (and their decoding).
    pub wait_ns: AtomicU64,
    /// Experts asked for whose layer had a prediction, and how many of them were predicted.
    pub predicted_asked: AtomicU64,
    pub predicted_right: AtomicU64,
    /// Predicted experts the layer did not use (read or cancelled), and the bytes actually read for them.
    pub predicted_wrong: AtomicU64,
    pub wasted_bytes: AtomicU64,
    /// Wall time with at least one disk read in flight: bytes_read / busy is the bandwidth the
    /// reads achieved while the disk was in use, whatever compute overlapped them.
    pub busy_ns: AtomicU64,
    /// Expert matrices read from disk that compute straight on their read buffer, and those
    /// copied out of it (misaligned tensors, or scales widened to f32).
    pub zero_copy_matrices: AtomicU64,
    pub copied_matrices: AtomicU64,
    /// Streamed layers' non-expert weights: layers read, their bytes (also in `bytes_read`) and
    /// the wall time callers waited for them.
    pub spine_layers: AtomicU64,
    pub spine_bytes: AtomicU64,
    pub spine_wait_ns: AtomicU64,
    /// Reads in flight, and since when the count has been above zero.
    in_flight: std::sync::Mutex<(usize, Option<std::time::Instant>)>,
}

impl StoreStats {
    /// [hits, misses, bytes_read, evictions, wait_ns, busy_ns, spine_bytes, spine_wait_ns]
    pub fn snapshot(&self) -> [u64; 8] {
        [
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
            self.bytes_read.load(Ordering::Relaxed),
            self.evictions.load(Ordering::Relaxed),
            self.wait_ns.load(Ordering::Relaxed),
            self.busy_now(),
            self.spine_bytes.load(Ordering::Relaxed),
            self.spine_wait_ns.load(Ordering::Relaxed),
        ]
    }

    /// busy_ns, counting the stretch still running.
    fn busy_now(&self) -> u64 {
        let open = self.in_flight.lock().expect("in-flight lock").1;
        self.busy_ns.load(Ordering::Relaxed) + open.map_or(0, |t| t.elapsed().as_nanos() as u64)
    }

    pub(crate) fn read_started(&self) {
        let mut f = self.in_flight.lock().expect("in-flight lock");
        if f.0 == 0 {
            f.1 = Some(std::time::Instant::now());
        }
        f.0 += 1;
    }

    pub(crate) fn read_finished(&self) {
        let mut f = self.in_flight.lock().expect("in-flight lock");
        f.0 -= 1;
        if f.0 == 0 {
            if let Some(t) = f.1.take() {
                self.busy_ns
                    .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        }
    }
}
