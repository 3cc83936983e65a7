//! Model families, one file each (`deepseek_v3.rs` also serves Kimi K2; `qwen3_moe.rs`;
//! `mixtral.rs`; `kimi_linear.rs`; `kimi_k3.rs`; `dense.rs`: Llama, Mistral, Qwen2, Qwen3 without experts), over shared layers in `layers/`. A family reads its config, names its tensors,
//! builds decoder blocks and routes tokens; it never does I/O or spawns threads: MoE layers get
//! their experts from an [`ExpertStore`], whose inside (RAM, disk, network) is not the model's
//! business.
//!
//! Legend used in shape comments: T tokens in the step (all sequences of the batch), D hidden,
//! H query heads, Hkv key/value heads, Dh head dim, E routed experts, K active experts, F expert
//! intermediate dim, V vocab, P cached positions of one sequence.

#![forbid(unsafe_code)]

mod cache;
mod decoder;
mod error;
mod gpu_decoder;
mod gpu_mla;
mod gpu_moe;
mod gpu_resident;
mod info;
pub mod layers;
pub mod profile;
mod registry;
mod spine;
mod store;
mod trace;
/// Weights are resolved and built by `strata_weights` (families name them `crate::weights::...`).
use strata_weights as weights;

mod deepseek_v3;
mod dense;
mod kimi_k3;
mod kimi_linear;
mod mixtral;
mod qwen3_moe;

pub use cache::{GpuKv, KvCache, KvMirror, LayerCache, LayerState};
pub use decoder::{Block, Decoder, SeqInput};
pub use error::ModelError;
pub use info::{ModelInfo, TensorSummary};
pub use registry::{family_for, load_model, ConfigSummary, Family, TensorDesc, FAMILIES};
pub use spine::{layer_of, BlockBuilder, Layer, LayerStore, Loading, StreamedLayer};
pub use store::{Expert, ExpertLayout, ExpertStore, OnReady, Ready, StoreError};
pub use strata_weights::{load_linear, load_vector, resolve_linear, LinearFormat, LinearSpec};
pub use trace::{RoutingRecord, Trace};

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// A loaded model: one forward pass over a batch of sequences.
pub trait Model: Send + Sync {
    fn info(&self) -> &ModelInfo;

    /// Empty per-sequence state (KV cache) for this model.
    fn new_cache(&self) -> KvCache;

    /// Runs the new tokens of every sequence in `batch` through the model, appending to each
    /// sequence's cache. Returns, per sequence, logits (n, V) for its last token (n = 1) or for
    /// every new token when `all_logits` is set.
    fn forward(&self, batch: &mut [SeqInput<'_>], trace: Option<&mut Trace>) -> Result<Vec<Vec<f32>>>;
}
