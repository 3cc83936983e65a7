//! The "spine": a model's non-expert weights (attention, norms, routers, shared experts, dense
//! MLPs). When they fit the memory budget they are built once and stay resident; when they do not,
//! chosen decoder layers are *streamed*: their weights are read from disk each time the layer runs
//! and dropped after, by a [`LayerStore`] the runtime supplies (models do no I/O).
//!
//! A family describes how to build one decoder block from a checkpoint ([`BlockBuilder`]). For a
//! streamed layer that builder runs once at load time on a *dry* view of the checkpoint, where
//! large tensors read as zeros that cost no memory: every name, shape and dtype is checked then,
//! the layer's decoding-state shape is taken, and the tensors it reads are recorded, so the
//! store later reads exactly those. At run time the store builds the block again from a view
//! whose recorded tensors are served from its read buffers (weights view them, no copy).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use strata_formats::{BytesOwner, Checkpoint, DryView};

use crate::decoder::{Attention, Block};
use crate::{ExpertStore, LayerState, Result};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Builds decoder block `layer` from a checkpoint (or a view of it with bytes in memory).
pub type BlockBuilder = Arc<dyn Fn(&Checkpoint, usize) -> Result<Block> + Send + Sync>;

/// A layer whose weights stream: the tensors its block reads, as recorded at load time.
#[derive(Clone, Debug)]
pub struct StreamedLayer {
    pub layer: usize,
    /// Tensor names, sorted.
    pub tensors: Vec<String>,
}

/// Where streamed layers come from (the runtime's disk reader), built before the model: the
/// model hands it the layers to stream and how to build their blocks once it has checked them.
pub trait LayerStore: Send + Sync {
    /// Takes the streamed layers (as their dry builds recorded them) and the family's builder;
    /// resolves their reads. Called once, by the model's load.
    fn stream(&self, layers: Vec<StreamedLayer>, builder: BlockBuilder) -> Result<()>;

    /// Block `layer`, read and built (waiting for its read if needed). The store reads the next
    /// streamed layers ahead meanwhile.
    fn get(&self, layer: usize) -> std::result::Result<Arc<Block>, BoxError>;

    /// Block `layer` if it is ready now, without waiting or issuing reads.
    fn ready(&self, layer: usize) -> Option<Arc<Block>>;
}

/// How a family's load gets what it does not build itself: the stores, built from the config
/// before the model.
pub struct Loading {
    /// The routed-expert store (for the family's `expert_layout`).
    pub experts: Arc<dyn ExpertStore>,
    /// Decoder layers to stream instead of keeping resident.
    pub streamed: BTreeSet<usize>,
    /// The store of streamed layers (required when `streamed` is not empty).
    pub layers: Option<Arc<dyn LayerStore>>,
}

/// A decoder layer, held or streamed (one per layer, so the size difference does not matter).
#[allow(clippy::large_enum_variant)]
pub enum Layer {
    Resident(Block),
    Streamed,
}

pub(crate) struct Layers {
    pub layers: Vec<Layer>,
    /// Each layer's decoding state.
    pub states: Vec<LayerState>,
    pub store: Option<Arc<dyn LayerStore>>,
}

/// The decoder layer a tensor belongs to: the number after a `layers` path segment
/// (`model.layers.7.self_attn.q_proj.weight` -> 7).
pub fn layer_of(name: &str) -> Option<usize> {
    let mut parts = name.split('.');
    while let Some(p) = parts.next() {
        if p == "layers" {
            return parts.next()?.parse().ok();
        }
    }
    None
}

pub(crate) fn state_of(block: &Block) -> LayerState {
    match &block.attn {
        Attention::Gqa(a) => a.state(),
        Attention::Mla(a) => a.state(),
        Attention::Kda(a) => a.state(),
    }
}

/// Builds the resident layers, checks and records the streamed ones and hands those to the
/// loading's layer store.
pub(crate) fn build_layers(
    ckpt: &Checkpoint,
    n_layers: usize,
    loading: &Loading,
    builder: BlockBuilder,
) -> Result<Layers> {
    let mut by_layer: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    if !loading.streamed.is_empty() {
        for name in ckpt.tensor_names() {
            if let Some(l) = layer_of(name).filter(|l| loading.streamed.contains(l)) {
                by_layer.entry(l).or_default().push(name.to_string());
            }
        }
    }
    let mut layers = Vec::with_capacity(n_layers);
    let mut states = Vec::with_capacity(n_layers);
    let mut streamed = Vec::new();
    for l in 0..n_layers {
        let _span = tracing::debug_span!("build layer", l).entered();
        if loading.streamed.contains(&l) {
            let dry = Arc::new(DryView::new(ckpt, by_layer.remove(&l).unwrap_or_default()));
            let owner: BytesOwner = dry.clone();
            let block = builder(&ckpt.with_preloaded(dry.clone(), owner), l)?;
            states.push(state_of(&block));
            drop(block);
            streamed.push(StreamedLayer {
                layer: l,
                tensors: dry.asked(),
            });
            layers.push(Layer::Streamed);
        } else {
            let block = builder(ckpt, l)?;
            states.push(state_of(&block));
            layers.push(Layer::Resident(block));
        }
    }
    let store = if streamed.is_empty() {
        None
    } else {
        let store = loading.layers.clone().ok_or_else(|| crate::ModelError::Spine {
            layer: streamed[0].layer,
            cause: "no layer store to stream it from".into(),
        })?;
        store.stream(streamed, builder)?;
        Some(store)
    };
    Ok(Layers {
        layers,
        states,
        store,
    })
}
