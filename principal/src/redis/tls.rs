//! TLS to the hub's Redis (`--redis-tls-enabled` with `--redis-ca-path`,
//! `--redis-ca-secret-name` or `--redis-tls-insecure`, as upstream).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// How the proxy's connections to the hub's Redis are secured.
#[derive(Clone, Debug)]
pub struct UpstreamTls {
    pub(super) config: Arc<rustls::ClientConfig>,
}

/// The CA could not be used.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    /// No certificate in the PEM.
    #[error("the Redis CA holds no PEM certificate")]
    NoCertificate,
    /// A certificate rustls refused.
    #[error("the Redis CA certificate cannot be used: {0}")]
    Refused(#[source] rustls::Error),
    /// The PEM does not parse.
    #[error("the Redis CA is not PEM: {0}")]
    Pem(String),
}

impl UpstreamTls {
    /// Verifies the hub Redis's certificate against the CA certificates in `ca_pem`.
    ///
    /// # Errors
    ///
    /// [`UpstreamTlsError`] when `ca_pem` holds no usable certificate.
    pub fn with_ca(ca_pem: &str) -> Result<Self, UpstreamTlsError> {
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.map_err(|e| UpstreamTlsError::Pem(e.to_string()))?).map_err(UpstreamTlsError::Refused)?;
        }
        if roots.is_empty() {
            return Err(UpstreamTlsError::NoCertificate);
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(UpstreamTlsError::Refused)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self { config: Arc::new(config) })
    }

    /// Accepts any certificate of the hub's Redis (`--redis-tls-insecure`): encrypted, not
    /// authenticated.
    ///
    /// # Errors
    ///
    /// [`UpstreamTlsError::Refused`] if the TLS library cannot be configured.
    pub fn insecure() -> Result<Self, UpstreamTlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(UpstreamTlsError::Refused)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate { provider }))
            .with_no_client_auth();
        Ok(Self { config: Arc::new(config) })
    }

    /// A TLS connection over `tcp` to `host`.
    pub(super) async fn connect(
        &self,
        host: &str,
        tcp: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_owned())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{host:?}: {e}")))?;
        tokio_rustls::TlsConnector::from(self.config.clone()).connect(name, tcp).await
    }
}

/// Trusts any server certificate; handshake signatures are still checked.
#[derive(Debug)]
struct AnyCertificate {
    provider: Arc<rustls::crypto::CryptoProvider>,
}

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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
