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
    /// `key` is wrong: `message` says how (a text, or a typed error of
    /// the value's own).
    pub(crate) fn key(key: impl Into<String>, message: impl std::fmt::Display) -> Self {
        ConfigError::Key {
            key: key.into(),
            message: message.to_string(),
        }
    }

    /// Ok when `value` lies within `range`, else `key` "must be within
    /// A and B".
    pub(crate) fn within<T: PartialOrd + std::fmt::Display>(
        key: impl Into<String>,
        value: T,
        range: std::ops::RangeInclusive<T>,
    ) -> Result<(), ConfigError> {
        if range.contains(&value) {
            return Ok(());
        }
        let (a, b) = range.into_inner();
        Err(ConfigError::key(key, format!("must be within {a} and {b}")))
    }

    /// Ok when `d` is more than zero, else `key` "must be positive".
    pub(crate) fn positive(
        key: impl Into<String>,
        d: std::time::Duration,
    ) -> Result<(), ConfigError> {
        if d.is_zero() {
            return Err(ConfigError::key(key, "must be positive"));
        }
        Ok(())
    }

    /// The configuration key the error is about, if any.
    pub fn key_name(&self) -> Option<&str> {
        match self {
            ConfigError::Key { key, .. } => Some(key),
            ConfigError::File { .. } => None,
        }
    }
}
