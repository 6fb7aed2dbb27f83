//! A configuration error: the key it is about, and what is wrong.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{key}: {message}")]
    Key { key: String, message: String },
}

impl ConfigError {
    pub(crate) fn key(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Key {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The configuration key the error is about, if any.
    pub fn key_name(&self) -> Option<&str> {
        match self {
            ConfigError::Key { key, .. } => Some(key),
            ConfigError::File { .. } => None,
        }
    }
}
