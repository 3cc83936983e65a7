//! The read engine every store of a model shares: one pool of reader threads (or, `--io uring`,
//! a ring's thread), aligned read buffers that are faulted in once and recycled, reads in flight
//! deduplicated by key, and the counters. The expert cache (`cached.rs`) and the streamed layers
//! (`spine.rs`) are its two clients: each only says what to read and what to build from it.

pub(crate) mod inflight;
pub(crate) mod jobs;
pub(crate) mod pool;
pub mod readers;
pub(crate) mod stats;
