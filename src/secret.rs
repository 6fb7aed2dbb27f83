//! Secrets in configuration: an API key, a database password, a private key.
//!
//! A secret is given inline (`key = "…"`), by environment variable
//! (`key = { env = "VAR" }`) or from a file (`key = { file = "/path" }`). Its
//! value never reaches `Debug`, `Display`, `Serialize` or an error message:
//! only its source does (`{ env = "VAR" }`), and an inline value shows as
//! `<redacted>`.

use std::fmt;
use std::path::PathBuf;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Where a secret comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum SecretSource {
    Inline,
    Env(String),
    File(PathBuf),
}

/// A configured secret. `resolve` loads env and file secrets; `expose` hands
/// the value to the one place that needs it (an HTTP header, a connection).
#[derive(Clone)]
pub struct Secret {
    source: SecretSource,
    value: Option<String>,
}

/// A secret that could not be loaded: where it was to come from, never
/// its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("environment variable {0} is not set")]
    NoEnv(String),
    #[error("environment variable {0} is empty")]
    EmptyEnv(String),
    #[error("secret file {} is empty", .0.display())]
    EmptyFile(PathBuf),
    #[error("cannot read secret file {}: {message}", .path.display())]
    Unreadable { path: PathBuf, message: String },
}

impl Secret {
    /// An inline secret, for library users building configuration in code.
    pub fn inline(value: impl Into<String>) -> Self {
        Secret {
            source: SecretSource::Inline,
            value: Some(value.into()),
        }
    }

    pub fn from_env(var: impl Into<String>) -> Self {
        Secret {
            source: SecretSource::Env(var.into()),
            value: None,
        }
    }

    pub fn from_file(path: impl Into<PathBuf>) -> Self {
        Secret {
            source: SecretSource::File(path.into()),
            value: None,
        }
    }

    pub fn source(&self) -> &SecretSource {
        &self.source
    }

    /// Loads the value from its source. The error says what is missing but
    /// never what the value is.
    pub fn resolve(&mut self) -> Result<(), SecretError> {
        match &self.source {
            SecretSource::Inline => {}
            SecretSource::Env(var) => match std::env::var(var) {
                Ok(v) if !v.is_empty() => self.value = Some(v),
                Ok(_) => return Err(SecretError::EmptyEnv(var.clone())),
                Err(_) => return Err(SecretError::NoEnv(var.clone())),
            },
            SecretSource::File(path) => match std::fs::read_to_string(path) {
                Ok(v) => {
                    let v = v.trim_end_matches(['\n', '\r']).to_string();
                    if v.is_empty() {
                        return Err(SecretError::EmptyFile(path.clone()));
                    }
                    self.value = Some(v)
                }
                Err(e) => {
                    return Err(SecretError::Unreadable {
                        path: path.clone(),
                        message: e.to_string(),
                    });
                }
            },
        }
        Ok(())
    }

    /// The value. Panics if an env or file secret was never resolved: config
    /// validation resolves every secret before anything runs.
    pub fn expose(&self) -> &str {
        self.value
            .as_deref()
            .expect("secret used before configuration validation resolved it")
    }
}

/// Equal when from the same source with the same value (a changed
/// password makes a changed BMC).
impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source && self.value == other.value
    }
}

impl Eq for Secret {}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            SecretSource::Inline => f.write_str("<redacted>"),
            SecretSource::Env(var) => write!(f, "<from env {var}>"),
            SecretSource::File(path) => write!(f, "<from file {}>", path.display()),
        }
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match &self.source {
            SecretSource::Inline => s.serialize_str("<redacted>"),
            SecretSource::Env(var) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("env", var)?;
                m.end()
            }
            SecretSource::File(path) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("file", path)?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SecretVisitor;

        impl<'de> Visitor<'de> for SecretVisitor {
            type Value = Secret;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#"a string, { env = "VAR" } or { file = "PATH" }"#)
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Secret, E> {
                if v.is_empty() {
                    return Err(E::custom("secret is empty"));
                }
                Ok(Secret::inline(v))
            }

            // Scalars that are not strings (an all-digit token read from the
            // environment) are still secrets: never echo them in an error.
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Secret, E> {
                Ok(Secret::inline(v.to_string()))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Secret, E> {
                Ok(Secret::inline(v.to_string()))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Secret, E> {
                Ok(Secret::inline(v.to_string()))
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Secret, E> {
                Ok(Secret::inline(v.to_string()))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Secret, A::Error> {
                let mut out = None;
                while let Some(key) = map.next_key::<String>()? {
                    if out.is_some() {
                        return Err(de::Error::custom(
                            "a secret takes exactly one of `env` or `file`",
                        ));
                    }
                    match key.as_str() {
                        "env" => out = Some(Secret::from_env(map.next_value::<String>()?)),
                        "file" => out = Some(Secret::from_file(map.next_value::<PathBuf>()?)),
                        other => {
                            return Err(de::Error::custom(format!(
                                "unknown secret source `{other}`, expected `env` or `file`"
                            )));
                        }
                    }
                }
                out.ok_or_else(|| de::Error::custom("a secret needs `env` or `file`"))
            }
        }

        d.deserialize_any(SecretVisitor)
    }
}

/// Replaces the password of a PostgreSQL URL (`postgres://user:pw@host/db`)
/// or key/value connection string (`password=pw`) with `<redacted>`.
pub fn redact_database_url(url: &str) -> String {
    if let Some(rest) = url
        .strip_prefix("postgres://")
        .map(|r| ("postgres://", r))
        .or_else(|| {
            url.strip_prefix("postgresql://")
                .map(|r| ("postgresql://", r))
        })
    {
        let (scheme, rest) = rest;
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let authority = match authority.rfind('@') {
            Some(at) => {
                let (userinfo, host) = authority.split_at(at);
                match userinfo.find(':') {
                    Some(colon) => format!("{}:<redacted>{host}", &userinfo[..colon]),
                    None => authority.to_string(),
                }
            }
            None => authority.to_string(),
        };
        let tail = redact_query_password(tail);
        return format!("{scheme}{authority}{tail}");
    }
    // key=value form
    url.split_whitespace()
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=<redacted>"),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn redact_query_password(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_string();
    };
    let query = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=<redacted>"),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&");
    format!("{path}?{query}")
}

/// Writes `contents` to `path` readable by its owner only (0600), whole or
/// not at all (the agent writes its own state the same way).
pub use shepherd_proto::files::write_private;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_never_show_the_value() {
        let s = Secret::inline("hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(!format!("{s}").contains("hunter2"));
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn url_passwords_are_redacted() {
        assert_eq!(
            redact_database_url("postgres://bob:s3cret@db:5432/bmdb?sslmode=disable"),
            "postgres://bob:<redacted>@db:5432/bmdb?sslmode=disable"
        );
        assert_eq!(
            redact_database_url("postgresql://db/bmdb?user=bob&password=s3cret"),
            "postgresql://db/bmdb?user=bob&password=<redacted>"
        );
        assert_eq!(
            redact_database_url("host=db user=bob password=s3cret"),
            "host=db user=bob password=<redacted>"
        );
        assert_eq!(
            redact_database_url("postgres://db/bmdb"),
            "postgres://db/bmdb"
        );
    }
}
