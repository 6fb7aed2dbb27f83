//! HTTPS for the admin server and the Metal API (`admin.tls`): tenants
//! reach shepherd over networks it does not own.
//!
//! - A certificate and key from files (`cert_file`, `key_file`), looked at
//!   again at most once a second as connections come: a renewed
//!   certificate is served from the next handshake on; one that does not
//!   load is refused with a warning and the last good one kept.
//! - Without them, a certificate issued at each start by the fleet's CA
//!   (the callback's, kept in the BMDB) for `localhost`, the loopback
//!   addresses, the listen address and `names`; the CA's certificate is
//!   written beside the callback's files as `fleet-ca.pem`, for tenants
//!   and tools to trust.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::config::AdminTlsConfig;

/// A certificate and key pair that cannot be served: it names the file
/// (or both) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    #[error("{file}: {message}")]
    File { file: String, message: String },
    #[error("{cert} and {key}: the key is not the certificate's ({message})")]
    Mismatch {
        cert: String,
        key: String,
        message: String,
    },
    /// A certificate issued by the fleet's CA that could not be made.
    #[error("the issued admin certificate: {0}")]
    Issued(String),
}

/// The certificate chain and key in two PEM files, as rustls serves them;
/// the error names the file and what is wrong.
pub fn load_pair(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, PairError> {
    let bad = |p: &Path, message: String| PairError::File {
        file: p.display().to_string(),
        message,
    };
    let read = |p: &Path| std::fs::read(p).map_err(|e| bad(p, e.to_string()));
    let certs: Vec<CertificateDer<'static>> = pem::parse_many(read(cert)?)
        .map_err(|e| bad(cert, format!("not PEM ({e})")))?
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| CertificateDer::from(p.into_contents()))
        .collect();
    if certs.is_empty() {
        return Err(bad(cert, "no CERTIFICATE in it".into()));
    }
    let key_der = pem::parse_many(read(key)?)
        .map_err(|_| bad(key, "not PEM".into()))?
        .into_iter()
        .find_map(|p| match p.tag() {
            "PRIVATE KEY" => Some(PrivateKeyDer::Pkcs8(p.into_contents().into())),
            "RSA PRIVATE KEY" => Some(PrivateKeyDer::Pkcs1(p.into_contents().into())),
            "EC PRIVATE KEY" => Some(PrivateKeyDer::Sec1(p.into_contents().into())),
            _ => None,
        })
        .ok_or_else(|| bad(key, "no private key in it".into()))?;
    let provider = rustls::crypto::ring::default_provider();
    let signer = provider
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| bad(key, e.to_string()))?;
    let certified = CertifiedKey::new(certs, signer);
    match certified.keys_match() {
        // Unknown: the key type cannot say; the handshake will.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(e) => {
            return Err(PairError::Mismatch {
                cert: cert.display().to_string(),
                key: key.display().to_string(),
                message: e.to_string(),
            });
        }
    }
    Ok(Arc::new(certified))
}

/// Serves the pair in two files, read again when either changes.
#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    looked_at: Instant,
    stamp: Option<Stamp>,
    current: Arc<CertifiedKey>,
}

type Stamp = (SystemTime, u64, SystemTime, u64);

fn stamp(cert: &Path, key: &Path) -> Option<Stamp> {
    let (c, k) = (std::fs::metadata(cert).ok()?, std::fs::metadata(key).ok()?);
    Some((c.modified().ok()?, c.len(), k.modified().ok()?, k.len()))
}

/// How often the files are looked at, at most.
const LOOK_EVERY: Duration = Duration::from_secs(1);

impl ReloadingCert {
    /// Loads the pair now; the error names the file.
    pub fn new(cert: &Path, key: &Path) -> Result<ReloadingCert, PairError> {
        let current = load_pair(cert, key)?;
        Ok(ReloadingCert {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            state: Mutex::new(Loaded {
                looked_at: Instant::now(),
                stamp: stamp(cert, key),
                current,
            }),
        })
    }

    /// The pair to serve now, read again if the files changed.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.looked_at.elapsed() >= LOOK_EVERY {
            s.looked_at = Instant::now();
            let now = stamp(&self.cert, &self.key);
            if now.is_some() && now != s.stamp {
                // Once per change: a half-written pair is looked at again
                // when it changes once more.
                s.stamp = now;
                match load_pair(&self.cert, &self.key) {
                    Ok(k) => {
                        s.current = k;
                        tracing::info!(cert = %self.cert.display(), "admin TLS certificate reloaded");
                    }
                    Err(e) => tracing::warn!(
                        "admin TLS certificate not reloaded, the last good one is served: {e}"
                    ),
                }
            }
        }
        s.current.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A rustls configuration (TLS 1.2 and 1.3, HTTP/1.1) serving `resolver`.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> rustls::ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    cfg
}

/// A fixed pair (the certificate issued at start).
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// The names a certificate issued for the admin server carries.
pub fn names(tls: &AdminTlsConfig, listen: std::net::SocketAddr) -> Vec<String> {
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    let ip = listen.ip();
    if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
        names.push(ip.to_string());
    }
    for n in &tls.names {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    names
}

/// The configuration for a certificate issued by the fleet's CA.
pub fn issued(
    ca_der: &[u8],
    ca_key_pem: &str,
    names: &[String],
) -> Result<rustls::ServerConfig, PairError> {
    let identity = crate::callback::ServerIdentity::issued_by(ca_der, ca_key_pem, names)
        .map_err(|e| PairError::Issued(e.to_string()))?;
    let (chain, key) = identity.parts();
    let signer = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| PairError::Issued(format!("its key: {e}")))?;
    Ok(server_config(Arc::new(Fixed(Arc::new(CertifiedKey::new(
        chain, signer,
    ))))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf, Vec<u8>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (c, k) = (dir.join("admin.pem"), dir.join("admin.key"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k, cert.der().to_vec())
    }

    #[test]
    fn a_renewed_certificate_is_served_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, first) = pair(dir.path(), "one.example");
        let r = ReloadingCert::new(&cert, &key).unwrap();
        assert_eq!(r.current().cert[0].as_ref(), first.as_slice());
        // Renewed: served once the files are looked at again.
        std::thread::sleep(LOOK_EVERY + Duration::from_millis(50));
        let (_, _, second) = pair(dir.path(), "two.example");
        std::thread::sleep(LOOK_EVERY + Duration::from_millis(50));
        assert_eq!(r.current().cert[0].as_ref(), second.as_slice());
        // A key that is not the certificate's: the last good pair stays.
        let other = rcgen::KeyPair::generate().unwrap();
        std::fs::write(&key, other.serialize_pem()).unwrap();
        std::thread::sleep(LOOK_EVERY + Duration::from_millis(50));
        assert_eq!(r.current().cert[0].as_ref(), second.as_slice());
        // Naming the file and what is wrong.
        let e = load_pair(&cert, &key).unwrap_err().to_string();
        assert!(
            e.contains("admin.key") && e.contains("not the certificate's"),
            "{e}"
        );
        std::fs::write(&cert, "not pem").unwrap();
        let e = load_pair(&cert, &key).unwrap_err().to_string();
        assert!(e.contains("admin.pem"), "{e}");
    }
}
