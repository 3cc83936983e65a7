//! The seam between models and expert storage. A MoE layer asks for the experts its router picked;
//! the store decides where their bytes come from. Models never hold routed experts themselves.

use std::sync::Arc;

pub use strata_weights::{Expert, ExpertLayout};

/// Experts as a store hands them over: (index in the ids asked for, expert).
pub type Ready = [(usize, Arc<Expert>)];

/// What a store reports when it cannot produce an expert.
pub type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// What [`ExpertStore::get_batches`] calls with each batch.
pub type OnReady<'a> = dyn FnMut(&Ready) -> Result<(), StoreError> + 'a;

pub trait ExpertStore: Send + Sync {
    /// The experts `ids` of MoE layer `layer` (a decoder layer index), in the order asked.
    /// Never fewer: a store that cannot produce an expert returns an error.
    fn get(
        &self,
        layer: usize,
        ids: &[usize],
    ) -> Result<Vec<Arc<Expert>>, Box<dyn std::error::Error + Send + Sync>>;

    /// Like `get`, but hands the experts over in batches as they become available,
    /// `on_ready(&[(index in ids, expert)])`, so the ones at hand can be computed (together)
    /// while the others are still being read. Every index comes exactly once.
    fn get_batches(&self, layer: usize, ids: &[usize], on_ready: &mut OnReady) -> Result<(), StoreError> {
        let all: Vec<(usize, Arc<Expert>)> = self.get(layer, ids)?.into_iter().enumerate().collect();
        on_ready(&all)
    }

    /// `ids` of `layer` are needed now: start reading the misses (the `get` that follows waits).
    fn submit(&self, _layer: usize, _ids: &[usize]) {}

    /// Whether every expert of `layer` is in memory and stays there for the store's life (a
    /// cache that holds the whole model's experts): the GPU decoder then keeps the layer's
    /// experts on the GPU and lays out their products there, with no round trip.
    fn holds_layer(&self, _layer: usize) -> bool {
        false
    }

    /// What each token of a step picked at `layer` (before the experts are asked for): a store
    /// that records routing (`--trace`) writes it down.
    fn routed(&self, _layer: usize, _tokens: &[&[usize]]) {}

    /// A guess that `ids` of `layer` will be asked for soon (read them if there is room); the
    /// store scores the guess when the layer's real `get` arrives.
    fn prefetch(&self, _layer: usize, _ids: &[usize]) {}

    /// Whether [`ExpertStore::prefetch`] would use a guess (read it, score it or record it):
    /// where it would not, callers skip the next layer's router product that makes one.
    fn wants_guesses(&self) -> bool {
        false
    }
}
