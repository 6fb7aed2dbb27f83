//! An image's digest as an installation request names it (CONTRACTS.md
//! §4a): the service checks it when an operator asks, the agent verifies
//! the image against it.

/// The digest algorithms a request may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Sha256,
    Sha512,
}

/// A request's `digest`: algorithm and lower-case hex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedDigest {
    pub algorithm: Algorithm,
    pub hex: String,
}

impl std::fmt::Display for ExpectedDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.algorithm {
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha512 => "sha512",
        };
        write!(f, "{name}:{}", self.hex)
    }
}

/// Reads `sha256:<64 hex>` or `sha512:<128 hex>`.
pub fn parse_digest(s: &str) -> Result<ExpectedDigest, String> {
    let (alg, hex) = s
        .trim()
        .split_once(':')
        .ok_or_else(|| format!("digest {s:?} is not ALGORITHM:HEX (sha256:… or sha512:…)"))?;
    let (algorithm, len) = match alg.to_ascii_lowercase().as_str() {
        "sha256" => (Algorithm::Sha256, 64),
        "sha512" => (Algorithm::Sha512, 128),
        other => {
            return Err(format!(
                "digest algorithm {other:?} is not supported (sha256 or sha512)"
            ));
        }
    };
    if hex.len() != len || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "digest {s:?}: a {alg} digest is {len} hexadecimal digits"
        ));
    }
    Ok(ExpectedDigest {
        algorithm,
        hex: hex.to_ascii_lowercase(),
    })
}
