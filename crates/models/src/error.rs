//! Model errors: bad config, bad tensors, expert store failures. Each names what is at fault.

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] strata_formats::FormatError),
    #[error("{path}: unknown architecture {arch:?} (model_type {model_type:?}); supported: {supported}")]
    UnknownArchitecture {
        path: String,
        arch: Option<String>,
        model_type: Option<String>,
        supported: String,
    },
    #[error("{path}: {reason}")]
    BadConfig { path: String, reason: String },
    /// The store's message is part of this one (not a separate `source`, which `{:#}` would
    /// print a second time).
    #[error("layer {layer}: expert store failed: {cause}")]
    Experts {
        layer: usize,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A streamed layer's weights could not be read or built (the message names the file).
    #[error("layer {layer}: streaming its weights failed: {cause}")]
    Spine { layer: usize, cause: String },
    #[error("token id {id} is out of range for a vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("GPU: {0}")]
    Gpu(String),
    #[error("sequence would reach {positions} positions, past the model's context of {max}")]
    ContextOverflow { positions: usize, max: usize },
}
