//! The one error type of the formats crate: every variant names the file (and tensor or key) at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid safetensors file: {reason}")]
    BadSafetensors { path: PathBuf, reason: String },
    #[error("{path}: not a valid GGUF file: {reason}")]
    BadGguf { path: PathBuf, reason: String },
    #[error("{path}: tensor `{tensor}`: {reason}")]
    BadTensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("{path}: {reason}")]
    BadJson { path: PathBuf, reason: String },
    #[error("{path}: key `{key}`: {reason}")]
    BadKey {
        path: PathBuf,
        key: String,
        reason: String,
    },
    /// `note`: how the files name it when that differs (a GGUF model's tensors), or empty.
    #[error("{dir}: tensor `{tensor}`{note} not found in the checkpoint")]
    MissingTensor {
        dir: PathBuf,
        tensor: String,
        note: String,
    },
    #[error("{dir}: {reason}")]
    BadCheckpoint { dir: PathBuf, reason: String },
}

impl FormatError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FormatError::Io {
            path: path.into(),
            source,
        }
    }
}
