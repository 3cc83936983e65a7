//! How a [`CachedStore`](super::CachedStore) is asked to hold and read experts.

use crate::direct::IoMode;

use super::Eviction;

/// When the expert cache's memory is faulted in: all of it while the model loads (on every core;
/// no token then waits for the kernel to zero fresh pages), or as experts are first read (a
/// quicker start, slower first tokens).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FaultIn {
    #[default]
    AtLoad,
    OnRead,
}

/// How a [`CachedStore`](super::CachedStore) holds and reads experts.
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheOptions {
    /// Bytes of decoded experts held in RAM at most.
    pub budget: usize,
    /// Read buffers (each an expert's reads) kept for reuse at most.
    pub kept_buffers: usize,
    /// Read predicted experts ahead (`ExpertStore::prefetch`).
    pub prefetch: bool,
    pub io: IoMode,
    pub eviction: Eviction,
    pub fault_in: FaultIn,
}
