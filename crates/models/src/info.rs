//! What a loaded model is: architecture, sizes, and the counts `strata inspect` reports.

use crate::ExpertLayout;

#[derive(Clone, Debug, Default)]
pub struct TensorSummary {
    /// Logical parameters (elements of the unquantized matrices).
    pub params: u64,
    /// Bytes on disk.
    pub bytes: u64,
}

#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub architecture: String,
    pub model_type: String,
    pub family: &'static str,
    pub vocab_size: usize,
    pub hidden_dim: usize,
    pub n_layers: usize,
    pub max_positions: usize,
    pub experts: Option<ExpertLayout>,
}
