//! TLS for the agent callback (CONTRACTS.md §4).
//!
//! shepherd is its own CA: on first start it generates a CA and a server
//! certificate signed by it (files beside its SSH key, keys 0600) and sends
//! the CA's DER to every agent in `TakeoverInit.ca_certificate`. The CA is
//! kept for good (agents in the field trust it); the server certificate is
//! reissued when the names it must carry change.
//!
//! Agents present a self-signed ed25519 certificate of the key they
//! returned at takeover. The server asks for one but chains it to nothing:
//! the handshake's signature proves the agent holds the key, and the key is
//! what the heartbeat is authenticated by (against `machine_agent_started`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// The ed25519 public key length: the agent protocol's.
pub use shepherd_proto::takeover::AGENT_KEY_LEN as KEY_LEN;

pub use shepherd_proto::callback::TlsError;
use shepherd_proto::callback::tls_err;

/// Where the callback's certificates live, or come from.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl CertFiles {
    /// The generated files in `dir` (beside shepherd's SSH key).
    pub fn in_dir(dir: &Path) -> CertFiles {
        CertFiles {
            ca_cert: dir.join("callback-ca.pem"),
            ca_key: dir.join("callback-ca.key"),
            server_cert: dir.join("callback-server.pem"),
            server_key: dir.join("callback-server.key"),
        }
    }
}

/// The callback server's identity: its certificate chain and key, and the
/// CA agents are told to trust.
pub struct ServerIdentity {
    pub ca_der: Vec<u8>,
    pub chain: Vec<CertificateDer<'static>>,
    key: PrivatePkcs8KeyDer<'static>,
}

impl std::fmt::Debug for ServerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerIdentity")
            .field("ca_bytes", &self.ca_der.len())
            .finish_non_exhaustive()
    }
}

fn write_private(path: &Path, text: &str) -> Result<(), TlsError> {
    crate::secret::write_private(path, text.as_bytes())
        .map_err(|e| tls_err(path.display().to_string(), e))
}

fn read_private(path: &Path) -> Result<String, TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let what = path.display().to_string();
    let mode = std::fs::metadata(path)
        .map_err(|e| tls_err(&what, e))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(tls_err(
            &what,
            format!(
                "mode {:o} lets others read a private key; chmod 600 it",
                mode & 0o777
            ),
        ));
    }
    std::fs::read_to_string(path).map_err(|e| tls_err(&what, e))
}

fn pem_der(path: &Path) -> Result<Vec<u8>, TlsError> {
    let text = std::fs::read_to_string(path).map_err(|e| tls_err(path.display().to_string(), e))?;
    let p = pem::parse(text).map_err(|e| tls_err(path.display().to_string(), e))?;
    Ok(p.contents().to_vec())
}

/// The names (DNS or IP) a server certificate must carry for `names`.
fn san_types(names: &[String]) -> Vec<rcgen::SanType> {
    names
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => rcgen::SanType::IpAddress(ip),
            Err(_) => rcgen::SanType::DnsName(
                n.clone()
                    .try_into()
                    .unwrap_or_else(|_| "invalid.invalid".try_into().expect("a valid name")),
            ),
        })
        .collect()
}

/// Whether the certificate at `der` names every one of `names`.
fn covers(der: &[u8], names: &[String]) -> bool {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return false;
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return false;
    };
    use x509_parser::extensions::GeneralName;
    names.iter().all(|n| {
        san.value
            .general_names
            .iter()
            .any(|g| match (g, n.parse::<IpAddr>()) {
                (GeneralName::DNSName(d), Err(_)) => d.eq_ignore_ascii_case(n),
                (GeneralName::IPAddress(b), Ok(IpAddr::V4(ip))) => *b == ip.octets(),
                (GeneralName::IPAddress(b), Ok(IpAddr::V6(ip))) => *b == ip.octets(),
                _ => false,
            })
    })
}

/// A new CA for the agent callback: its DER certificate and its key's
/// PKCS#8 PEM.
pub fn new_ca() -> Result<(Vec<u8>, String), TlsError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| tls_err("generating the callback CA key", e))?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(|e| tls_err("callback CA", e))?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "shepherd agent callback CA");
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2124, 1, 1);
    let cert = params
        .self_signed(&key)
        .map_err(|e| tls_err("callback CA", e))?;
    Ok((cert.der().to_vec(), key.serialize_pem()))
}

/// A server certificate for `names`, signed by the CA: its DER and its
/// key's PKCS#8 PEM.
fn issue_server(
    ca_der: &[u8],
    ca_key: &rcgen::KeyPair,
    names: &[String],
) -> Result<(Vec<u8>, String), TlsError> {
    let issuer = rcgen::Issuer::from_ca_cert_der(&ca_der.to_vec().into(), ca_key)
        .map_err(|e| tls_err("the callback CA certificate", e))?;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| tls_err("generating the callback server key", e))?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(|e| tls_err("callback server certificate", e))?;
    params.subject_alt_names = san_types(names);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "shepherd agent callback");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2124, 1, 1);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| tls_err("callback server certificate", e))?;
    Ok((cert.der().to_vec(), key.serialize_pem()))
}

/// The CA in `files`, if there is one (a shepherd from before the fleet's
/// CA lived in the BMDB: its agents trust it, so it seeds the BMDB).
pub fn local_ca(files: &CertFiles) -> Result<Option<(Vec<u8>, String)>, TlsError> {
    if !files.ca_cert.exists() {
        return Ok(None);
    }
    Ok(Some((
        pem_der(&files.ca_cert)?,
        read_private(&files.ca_key)?,
    )))
}

impl ServerIdentity {
    /// Loads the CA and server certificate from `files`, generating what is
    /// missing: the CA on first start, the server certificate whenever it
    /// does not name every one of `names` (the host agents are told, and
    /// the addresses it is reached on).
    pub fn load_or_generate(
        files: &CertFiles,
        names: &[String],
    ) -> Result<ServerIdentity, TlsError> {
        // Shepherds started together on one directory take turns.
        let dir = files
            .ca_cert
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| tls_err(dir.display().to_string(), e))?;
        }
        let lock_path = dir.join("callback.lock");
        let lock_file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| tls_err(lock_path.display().to_string(), e))?;
        let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| tls_err(lock_path.display().to_string(), e))?;
        Self::load_or_generate_locked(files, names)
    }

    fn load_or_generate_locked(
        files: &CertFiles,
        names: &[String],
    ) -> Result<ServerIdentity, TlsError> {
        let (ca_der, ca_key) = if files.ca_cert.exists() {
            let der = pem_der(&files.ca_cert)?;
            let key = rcgen::KeyPair::from_pem(&read_private(&files.ca_key)?)
                .map_err(|e| tls_err(files.ca_key.display().to_string(), e))?;
            (der, key)
        } else {
            let (der, key_pem) = new_ca()?;
            let key = rcgen::KeyPair::from_pem(&key_pem)
                .map_err(|e| tls_err("the new callback CA key", e))?;
            write_private(&files.ca_key, &key_pem)?;
            write_private(
                &files.ca_cert,
                &pem::encode(&pem::Pem::new("CERTIFICATE", der.clone())),
            )?;
            tracing::info!(path = %files.ca_cert.display(), "generated the agent callback CA");
            (der, key)
        };
        let existing = if files.server_cert.exists() && files.server_key.exists() {
            let der = pem_der(&files.server_cert)?;
            covers(&der, names).then_some(der)
        } else {
            None
        };
        let (server_der, server_key_pem) = match existing {
            Some(der) => (der, read_private(&files.server_key)?),
            None => {
                let (der, key_pem) = issue_server(&ca_der, &ca_key, names)?;
                write_private(&files.server_key, &key_pem)?;
                write_private(
                    &files.server_cert,
                    &pem::encode(&pem::Pem::new("CERTIFICATE", der.clone())),
                )?;
                tracing::info!(names = %names.join(", "), "issued the agent callback server certificate");
                (der, key_pem)
            }
        };
        Self::assemble(
            ca_der,
            server_der,
            &server_key_pem,
            &files.server_key.display().to_string(),
        )
    }

    /// The identity of a shepherd serving the fleet's CA (stored in the
    /// BMDB, `bmdb::callback`): a server certificate for `names`, issued
    /// in memory at each start by that CA.
    pub fn issued_by(
        ca_der: &[u8],
        ca_key_pem: &str,
        names: &[String],
    ) -> Result<ServerIdentity, TlsError> {
        let ca_key = rcgen::KeyPair::from_pem(ca_key_pem)
            .map_err(|e| tls_err("the fleet's callback CA key (callback_ca)", e))?;
        let (der, key_pem) = issue_server(ca_der, &ca_key, names)?;
        Self::assemble(ca_der.to_vec(), der, &key_pem, "the callback server key")
    }

    fn assemble(
        ca_der: Vec<u8>,
        server_der: Vec<u8>,
        server_key_pem: &str,
        what: &str,
    ) -> Result<ServerIdentity, TlsError> {
        let key_der = pem::parse(server_key_pem)
            .map_err(|e| tls_err(what, e))?
            .contents()
            .to_vec();
        Ok(ServerIdentity {
            chain: vec![CertificateDer::from(server_der)],
            ca_der,
            key: PrivatePkcs8KeyDer::from(key_der),
        })
    }

    /// The rustls server configuration: TLS 1.3, ALPN `h2`, and a client
    /// certificate required (see [`AgentCertVerifier`]).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| tls_err("callback TLS", e))?
            .with_client_cert_verifier(Arc::new(AgentCertVerifier {
                provider,
                mandatory: true,
            }))
            .with_single_cert(
                self.chain.clone(),
                PrivateKeyDer::Pkcs8(self.key.clone_key()),
            )
            .map_err(|e| tls_err("callback server certificate", e))?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(cfg))
    }
}

impl ServerIdentity {
    /// The certificate chain and its key (the admin server's HTTPS).
    pub fn parts(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        (
            self.chain.clone(),
            PrivateKeyDer::Pkcs8(self.key.clone_key()),
        )
    }

    /// A rustls configuration for plain HTTPS with the same certificate
    /// (the image server): TLS 1.2 and 1.3, ALPN `http/1.1`, a client
    /// certificate asked for but not required (an agent's, as the
    /// callback takes it: the image server answers a download without one
    /// 401 itself, readably, rather than failing the handshake).
    pub fn web_server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("image server TLS", e))?
            .with_client_cert_verifier(Arc::new(AgentCertVerifier {
                provider,
                mandatory: false,
            }))
            .with_single_cert(
                self.chain.clone(),
                PrivateKeyDer::Pkcs8(self.key.clone_key()),
            )
            .map_err(|e| tls_err("image server certificate", e))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(cfg)
    }
}

/// The ed25519 public key of a certificate, if that is its key.
pub fn ed25519_key(cert: &[u8]) -> Option<[u8; KEY_LEN]> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert).ok()?;
    let spki = cert.public_key();
    // id-Ed25519, RFC 8410.
    if spki.algorithm.algorithm.to_id_string() != "1.3.101.112" {
        return None;
    }
    spki.subject_public_key.data.as_ref().try_into().ok()
}

/// Accepts any client certificate whose key is ed25519, without chaining
/// it anywhere: TLS 1.3's CertificateVerify, checked below, proves the
/// client holds the key, and the key is matched against the BMDB per call.
#[derive(Debug)]
pub struct AgentCertVerifier {
    provider: Arc<rustls::crypto::CryptoProvider>,
    /// The callback requires a certificate; the image server only asks.
    mandatory: bool,
}

impl ClientCertVerifier for AgentCertVerifier {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match ed25519_key(end_entity) {
            Some(_) => Ok(ClientCertVerified::assertion()),
            None => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::BadEncoding,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crate::tls::verify_tls13(&self.provider, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_files_are_reused_and_reissued_for_new_names() {
        let dir = tempfile::tempdir().unwrap();
        let files = CertFiles::in_dir(dir.path());
        let names = vec!["bmaas.example".to_string(), "127.0.0.1".to_string()];
        let a = ServerIdentity::load_or_generate(&files, &names).unwrap();
        let b = ServerIdentity::load_or_generate(&files, &names).unwrap();
        assert_eq!(a.ca_der, b.ca_der);
        assert_eq!(a.chain, b.chain, "the server certificate is reused");
        use std::os::unix::fs::PermissionsExt;
        for k in [&files.ca_key, &files.server_key] {
            let mode = std::fs::metadata(k).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", k.display());
        }
        let c = ServerIdentity::load_or_generate(&files, &["other.example".to_string()]).unwrap();
        assert_eq!(a.ca_der, c.ca_der, "the CA stays");
        assert_ne!(
            a.chain, c.chain,
            "a new name reissues the server certificate"
        );
        assert!(covers(&c.chain[0], &["other.example".to_string()]));
        a.server_config().unwrap();
    }

    #[test]
    fn an_agent_certificate_carries_its_key() {
        let seed = [7u8; 32];
        let (cert, _) = shepherd_agent::callback::self_signed_agent_cert(&seed).unwrap();
        let public = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key();
        assert_eq!(ed25519_key(&cert), Some(public.to_bytes()));
    }
}
