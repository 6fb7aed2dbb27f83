//! What shepherd's certificate verifiers that do not chain a certificate
//! (the agents' self-signed client certificates; a BMC's under
//! `tls = "insecure"`) share: the handshake's signatures are still
//! checked with the provider's algorithms, so the peer must hold the key
//! of the certificate it shows.

use rustls::DigitallySignedStruct;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;

/// A TLS 1.2 handshake's signature, checked against `cert`'s key.
pub fn verify_tls12(
    provider: &CryptoProvider,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    rustls::crypto::verify_tls12_signature(
        message,
        cert,
        dss,
        &provider.signature_verification_algorithms,
    )
}

/// A TLS 1.3 CertificateVerify, checked against `cert`'s key.
pub fn verify_tls13(
    provider: &CryptoProvider,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    rustls::crypto::verify_tls13_signature(
        message,
        cert,
        dss,
        &provider.signature_verification_algorithms,
    )
}
