//! `--io mmap`: demand paging, kept only so benchmarks can measure what it costs.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use strata_weights::Expert;

use super::{BoxError, Shared};

impl Shared {
    /// `--io mmap`: the misses (indices into `ids`) read through the mapping by as many threads
    /// as the kernels use, all of it counted as waiting: the bytes fault in when the compute
    /// needs them, as they would under a kernel multiplying on the mapping itself.
    pub(super) fn read_on_demand(
        &self,
        layer: usize,
        ids: &[usize],
        misses: &[usize],
        on_ready: &mut strata_models::OnReady,
    ) -> Result<(), BoxError> {
        let t0 = std::time::Instant::now();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let mut read: Vec<(usize, Result<Expert, String>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..strata_kernels::threads().min(misses.len()))
                .map(|_| {
                    scope.spawn(|| {
                        let mut out = Vec::new();
                        while let Some(&i) = misses.get(next.fetch_add(1, Ordering::Relaxed)) {
                            out.push((i, self.read(layer, ids[i]).map_err(|e| e.to_string())));
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("demand-paging thread"))
                .collect()
        });
        self.stats
            .wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        read.sort_by_key(|r| r.0);
        let mut batch = Vec::with_capacity(read.len());
        for (i, result) in read {
            let expert = Arc::new(result?);
            self.insert((layer, ids[i]), expert.clone());
            batch.push((i, expert));
        }
        on_ready(&batch)
    }
}
