//! How a [`CachedStore`](super::CachedStore) is asked to hold and read experts.

use crate::direct::IoMode;

use super::Eviction;

/// When the expert cache's memory is faulted in, and with what.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FaultIn {
    /// While the model loads, by reading experts into it (as many as it holds, every MoE layer
    /// its share): the disk fills the cache at its sequential rate before the first token, so
    /// the first tokens hit as often as later ones instead of reading most of their experts. A
    /// remote model's experts are not fetched for this: its cache is faulted in empty
    /// (`AtLoad`).
    #[default]
    Preload,
    /// While the model loads, empty, on every core: no token waits for the kernel to zero
    /// fresh pages, but the first tokens read most of their experts.
    AtLoad,
    /// As experts are first read: the quickest start, the slowest first tokens.
    OnRead,
}

/// Which guesses of a later layer's experts (`ExpertStore::prefetch`) are read ahead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Prefetch {
    /// None (the default: neither kind below has paid on random weights yet; see
    /// docs/PERFORMANCE.md).
    #[default]
    Off,
    /// Guesses that name at least half of the layer's experts: those of prompts and batches,
    /// whose tokens together route to most experts of every layer (a 512-token prompt of a
    /// 128-expert, top-8 model to all of them), so the next layer's reads overlap this layer's
    /// compute; a lone token's guesses (right about half the time on a trained model, seldom on
    /// random weights) are not read.
    Batches,
    /// Every guess.
    On,
}

impl Prefetch {
    /// The CLI's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Prefetch::Off => "off",
            Prefetch::Batches => "auto",
            Prefetch::On => "on",
        }
    }
}

/// How a [`CachedStore`](super::CachedStore) holds and reads experts.
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheOptions {
    /// Bytes of decoded experts held in RAM at most.
    pub budget: usize,
    /// Read buffers (each an expert's reads) kept for reuse at most.
    pub kept_buffers: usize,
    /// Which predicted experts are read ahead (`ExpertStore::prefetch`).
    pub prefetch: Prefetch,
    pub io: IoMode,
    pub eviction: Eviction,
    pub fault_in: FaultIn,
}
