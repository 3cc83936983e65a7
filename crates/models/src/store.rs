//! The seam between models and expert storage. A MoE layer asks for the experts its router picked;
//! the store decides where their bytes come from. Models never hold routed experts themselves.

use std::sync::Arc;

use strata_kernels::Linear;

/// One routed expert: a SwiGLU MLP, `down(silu(gate(x)) * up(x))`.
#[derive(Debug)]
pub struct Expert {
    /// (F, D)
    pub gate: Linear,
    /// (F, D)
    pub up: Linear,
    /// (D, F)
    pub down: Linear,
}

impl Expert {
    pub fn bytes(&self) -> usize {
        self.gate.bytes() + self.up.bytes() + self.down.bytes()
    }
}

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

/// Where a family's routed experts live in the checkpoint and what shape they have.
#[derive(Clone, Debug)]
pub struct ExpertLayout {
    /// Tensor-name template with `{layer}` and `{expert}`, ending before the projection name,
    /// e.g. `model.layers.{layer}.mlp.experts.{expert}.`
    pub prefix: String,
    /// Projection names for gate, up, down (e.g. `gate_proj`, `up_proj`, `down_proj`).
    pub projections: [String; 3],
    pub hidden_dim: usize,
    pub inter_dim: usize,
    pub n_experts: usize,
    /// Decoder layers that have routed experts.
    pub moe_layers: Vec<usize>,
    /// Experts each token activates.
    pub top_k: usize,
}

impl ExpertLayout {
    /// Base name of one projection's tensors (`...gate_proj`); format suffixes follow (`.weight`, ...).
    pub fn tensor_base(&self, layer: usize, expert: usize, projection: usize) -> String {
        let prefix = self
            .prefix
            .replace("{layer}", &layer.to_string())
            .replace("{expert}", &expert.to_string());
        format!("{prefix}{}", self.projections[projection])
    }

    /// (out, in) of gate, up, down.
    pub fn shapes(&self) -> [(usize, usize); 3] {
        [
            (self.inter_dim, self.hidden_dim),
            (self.inter_dim, self.hidden_dim),
            (self.hidden_dim, self.inter_dim),
        ]
    }
}
