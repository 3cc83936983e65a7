//! Text <-> token ids for every checkpoint layout strata loads: Hugging Face `tokenizer.json`
//! (the `tokenizers` crate, pure-Rust regex backend) and tiktoken rank files as Kimi ships them
//! (`tiktoken.model` + `tokenizer_config.json`). Also chat templates (minijinja with the Python
//! compatibility transformers has; Kimi K3's XTML format in `xtml.rs`) and an incremental
//! detokenizer for streaming.

mod chat;
mod error;
pub mod gguf;
mod gguf_spm;
mod pyjson;
mod stream;
mod tiktoken;
mod tokenizer;
pub mod xtml;

pub use chat::{ChatTemplate, MAX_RENDERED_BYTES, RESERVED_TEMPLATE_KEYS, TEMPLATE_FUEL};
pub use error::TokenizerError;
pub use pyjson::python_json_dumps;
pub use stream::{StreamDecoder, MAX_HELD};
pub use tiktoken::{TiktokenBackend, KIMI_PATTERN};
pub use tokenizer::{AddedToken, Tokenizer};

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
