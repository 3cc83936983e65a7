//! Where decoding time goes, for `strata bench`: wall time spent inside attention and inside MoE
//! layers (router, shared and routed experts, and the wait for expert reads, which the expert
//! store counts on its side), and of the MoE layers' time, the routed experts' products.
//! Process-wide counters; two clock reads per layer and step (and per batch of experts).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub struct Phases {
    pub attention_ns: AtomicU64,
    pub moe_ns: AtomicU64,
    /// Inside `moe_ns`: the routed experts' products (not their reads).
    pub routed_ns: AtomicU64,
}

pub static PHASES: Phases = Phases {
    attention_ns: AtomicU64::new(0),
    moe_ns: AtomicU64::new(0),
    routed_ns: AtomicU64::new(0),
};

impl Phases {
    /// [attention_ns, moe_ns, routed_ns]
    pub fn snapshot(&self) -> [u64; 3] {
        [
            self.attention_ns.load(Ordering::Relaxed),
            self.moe_ns.load(Ordering::Relaxed),
            self.routed_ns.load(Ordering::Relaxed),
        ]
    }
}

/// Runs `f`, adding its wall time to `counter`.
pub(crate) fn timed<T>(counter: &AtomicU64, f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let out = f();
    counter.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    out
}
