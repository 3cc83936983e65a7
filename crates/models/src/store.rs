//! The seam between models and expert storage. A MoE layer asks for the experts its router picked;
//! the store decides where their bytes come from. Models never hold routed experts themselves.

use std::sync::Arc;

pub use strata_weights::{Expert, ExpertLayout};

pub trait ExpertStore: Send + Sync {
    /// The experts `ids` of MoE layer `layer` (a decoder layer index), in the order asked.
    /// Never fewer: a store that cannot produce an expert returns an error.
    fn get(
        &self,
        layer: usize,
        ids: &[usize],
    ) -> Result<Vec<Arc<Expert>>, Box<dyn std::error::Error + Send + Sync>>;

    /// Like `get`, but hands each expert to `on_ready(index in ids, expert)` as soon as it is
    /// available, so it can be computed while the others are still being read.
    fn get_each(
        &self,
        layer: usize,
        ids: &[usize],
        on_ready: &mut dyn FnMut(usize, Arc<Expert>) -> Result<(), Box<dyn std::error::Error + Send + Sync>>,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        for (i, expert) in self.get(layer, ids)?.into_iter().enumerate() {
            on_ready(i, expert)?;
        }
        Ok(())
    }

    /// `ids` of `layer` are needed now: start reading the misses (the `get` that follows waits).
    fn submit(&self, _layer: usize, _ids: &[usize]) {}

    /// A guess that `ids` of `layer` will be asked for soon (read them if there is room); the
    /// store scores the guess when the layer's real `get` arrives.
    fn prefetch(&self, _layer: usize, _ids: &[usize]) {}
}
