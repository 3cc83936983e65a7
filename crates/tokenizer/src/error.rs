//! Tokenizer errors, naming the file or template at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error(
        "{dir}: no tokenizer found (expected tokenizer.json, or tiktoken.model with tokenizer_config.json)"
    )]
    NotFound { dir: PathBuf },
    #[error("tokenizer: {0}")]
    Encode(String),
    #[error("token id {id} is not in the vocabulary ({vocab} ids)")]
    UnknownId { id: u32, vocab: usize },
    #[error("chat template: {0}")]
    Template(String),
    #[error("this tokenizer has no chat template (tokenizer_config.json has no `chat_template`)")]
    NoTemplate,
}

impl TokenizerError {
    pub(crate) fn file(path: impl Into<PathBuf>, reason: impl std::fmt::Display) -> Self {
        TokenizerError::File {
            path: path.into(),
            reason: reason.to_string(),
        }
    }
}
