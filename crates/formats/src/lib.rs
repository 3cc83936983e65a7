//! Bytes on disk -> a tensor index: where each tensor of a checkpoint lives (file, byte range), its
//! dtype and shape; plus the Hugging Face config files. No compute and no threads live here: reading
//! a tensor is one positioned read (`pread`) of its byte range, never a mapping of the whole file,
//! because the expert store reads experts one by one.

mod checkpoint;
mod config;
mod dry;
mod dtype;
mod error;
pub mod gguf;
mod gguf_kimi_linear;
mod gguf_model;
pub mod gguf_write;
mod quant;
mod safetensors;

pub use checkpoint::{
    bytes_to_f32, BytesOwner, Checkpoint, Int8Spine, Preloaded, RangeSource, TensorEntry, INDEX_FILE,
    SINGLE_FILE,
};
pub use config::{GenerationConfig, JsonConfig};
pub use dry::DryView;
pub use dtype::DType;
pub use error::FormatError;
pub use quant::QuantizationConfig;
pub use safetensors::{parse_header, parse_header_bytes, ShardHeader, TensorInfo, MAX_HEADER_BYTES};

pub use gguf_model::open_gguf;

/// A model's config and tensors: a Hugging Face folder (`config.json` and safetensors) or a
/// GGUF file (the first file of a split one).
pub fn open_model(path: &std::path::Path) -> Result<(JsonConfig, Checkpoint)> {
    if gguf::is_gguf(path) {
        return open_gguf(path);
    }
    let cfg = JsonConfig::read(&path.join("config.json"))?;
    Ok((cfg, Checkpoint::open(path)?))
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;
