//! TLS to BMCs: the web's roots (awc's default), a CA of the operator's
//! (`tls = { ca_file = … }`), or no certificate check (`tls = "insecure"`,
//! for the self-signed certificates BMCs ship with). Even then the
//! handshake's signatures are checked: the peer must hold the key of the
//! certificate it shows.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn with_alpn(mut c: ClientConfig) -> ClientConfig {
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    c
}

/// A BMC's CA file that cannot be trusted from: it names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaFileError {
    #[error("{path}: {message}")]
    Unreadable { path: String, message: String },
    #[error("{path}: no certificate in it")]
    Empty { path: String },
}

/// Trusts exactly the CAs in `ca_file` (PEM).
pub fn ca_client_config(ca_file: &Path) -> Result<ClientConfig, CaFileError> {
    let path = || ca_file.display().to_string();
    let bad = |e: &dyn std::fmt::Display| CaFileError::Unreadable {
        path: path(),
        message: e.to_string(),
    };
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file).map_err(|e| bad(&e))?;
    for c in certs {
        let c = c.map_err(|e| bad(&e))?;
        roots.add(c).map_err(|e| bad(&e))?;
    }
    if roots.is_empty() {
        return Err(CaFileError::Empty { path: path() });
    }
    Ok(with_alpn(
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&e))?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}

/// Accepts any certificate (signatures still verified).
pub fn insecure_client_config() -> ClientConfig {
    let p = provider();
    with_alpn(
        ClientConfig::builder_with_provider(p.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(p)))
            .with_no_client_auth(),
    )
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crate::tls::verify_tls12(&self.0, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crate::tls::verify_tls13(&self.0, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
