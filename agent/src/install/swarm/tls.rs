//! TLS between the members of a swarm: each shows the self-signed
//! certificate of its callback key, as it does to shepherd. A member
//! serving chunks requires a client certificate and serves only the keys
//! shepherd listed as members; a member fetching accepts only the key
//! shepherd named for that address. TLS 1.3 only; the handshake's
//! signature is checked against the very key the certificate is known by
//! here ([`key_of`]), so a certificate naming one key and signed with
//! another proves nothing.

use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DistinguishedName, SignatureScheme};

use crate::install::fetch::AgentKey;

/// An ed25519 public key.
pub type Key = [u8; 32];

/// The DER of an ed25519 SubjectPublicKeyInfo (RFC 8410) before its key.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// The ed25519 key a certificate is known by: that of the first ed25519
/// SubjectPublicKeyInfo in its DER (an agent's certificate holds one).
/// [`verify`] checks the handshake against this same key.
pub fn key_of(cert: &[u8]) -> Option<Key> {
    let at = cert
        .windows(SPKI_PREFIX.len())
        .position(|w| w == SPKI_PREFIX)?
        + SPKI_PREFIX.len();
    cert.get(at..at + 32)?.try_into().ok()
}

/// The handshake's signature, by the key the certificate is known by.
fn verify(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    use rustls::{CertificateError, Error};
    if dss.scheme != SignatureScheme::ED25519 {
        return Err(Error::PeerMisbehaved(
            rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
        ));
    }
    let key = key_of(cert).ok_or(Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(&key)
        .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let sig = ed25519_dalek::Signature::from_slice(dss.signature())
        .map_err(|_| Error::InvalidCertificate(CertificateError::BadSignature))?;
    key.verify_strict(message, &sig)
        .map_err(|_| Error::InvalidCertificate(CertificateError::BadSignature))?;
    Ok(HandshakeSignatureValid::assertion())
}

/// The handshake checks both verifiers share: TLS 1.3 alone, ed25519
/// alone, by the key the certificate is known by.
macro_rules! ed25519_tls13_only {
    () => {
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
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
            verify(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            vec![SignatureScheme::ED25519]
        }
    };
}

/// A client of a member's chunk server: any ed25519 certificate, its key
/// matched against the members per request.
#[derive(Debug)]
struct AnyMember;

impl ClientCertVerifier for AnyMember {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        key_of(end_entity)
            .map(|_| ClientCertVerified::assertion())
            .ok_or(rustls::Error::InvalidCertificate(
                rustls::CertificateError::BadEncoding,
            ))
    }

    ed25519_tls13_only!();
}

/// A member's chunk server, known by the key shepherd named for it.
#[derive(Debug)]
struct Pinned(Key);

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if key_of(end_entity) == Some(self.0) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    ed25519_tls13_only!();
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The chunk server's TLS: `key`'s certificate, a member's required.
pub fn server_config(key: &AgentKey) -> Result<Arc<rustls::ServerConfig>, String> {
    let (cert, private) = crate::callback::self_signed_agent_cert(&key.0)
        .map_err(|e| format!("the agent's certificate: {e}"))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(Arc::new(AnyMember))
        .with_single_cert(vec![cert], private)
        .map_err(|e| format!("the agent's certificate: {e}"))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// TLS to the member known by `peer`, showing `key`'s certificate.
pub fn client_config(key: &AgentKey, peer: Key) -> Result<Arc<rustls::ClientConfig>, String> {
    let (cert, private) = crate::callback::self_signed_agent_cert(&key.0)
        .map_err(|e| format!("the agent's certificate: {e}"))?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned(peer)))
        .with_client_auth_cert(vec![cert], private)
        .map_err(|e| format!("the agent's certificate: {e}"))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_certificate_is_known_by_its_callback_key() {
        let seed = [7u8; 32];
        let (cert, _) = crate::callback::self_signed_agent_cert(&seed).unwrap();
        let public = ed25519_dalek::SigningKey::from_bytes(&seed)
            .verifying_key()
            .to_bytes();
        assert_eq!(key_of(&cert), Some(public));
        assert_eq!(key_of(b"no key here"), None);
    }
}
