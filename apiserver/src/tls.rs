//! The server's TLS identity: a CA kept in the data dir (so kubeconfigs stay valid across
//! restarts) and a serving certificate for loopback issued from it at every start.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Errors creating the TLS identity.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Reading or writing the CA files failed.
    #[error("TLS files in {dir}: {source}")]
    Io {
        /// The directory.
        dir: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Generating or loading a certificate failed.
    #[error("cannot generate the API server certificate: {0}")]
    Cert(#[from] rcgen::Error),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// A PEM file in the data dir does not parse.
    #[error("TLS files in the data dir are corrupt ({0}); remove the tls/ folder to regenerate them")]
    Pem(String),
}

/// The CA (for kubeconfigs) and the rustls server configuration.
#[derive(Debug)]
pub struct TlsIdentity {
    /// PEM of the CA certificate clients must trust.
    pub ca_pem: String,
    /// Server configuration (HTTP/2 and HTTP/1.1 via ALPN).
    pub server_config: Arc<rustls::ServerConfig>,
}

fn io(dir: &Path) -> impl Fn(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io { dir: dir.display().to_string(), source }
}

fn load_or_create_ca(dir: &Path) -> Result<(String, String), TlsError> {
    let (cert_path, key_path) = (dir.join("ca.crt"), dir.join("ca.key"));
    if cert_path.exists() && key_path.exists() {
        let cert = std::fs::read_to_string(&cert_path).map_err(io(dir))?;
        let key = std::fs::read_to_string(&key_path).map_err(io(dir))?;
        return Ok((cert, key));
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "argocd-agent embedded apiserver CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_after = rcgen::date_time_ymd(2100, 1, 1);
    let cert = params.self_signed(&key)?;
    // Key first: a crash between the two writes leaves no cert without its key.
    crate::private_file::write(&key_path, key.serialize_pem().as_bytes()).map_err(io(dir))?;
    crate::private_file::write(&cert_path, cert.pem().as_bytes()).map_err(io(dir))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Load the CA from `dir` (creating it on first start) and issue a serving certificate for
/// `localhost`, the loopback addresses and `listen_ip`.
///
/// # Errors
/// The files cannot be read or written, or certificate generation fails.
pub fn identity(dir: &Path, listen_ip: IpAddr) -> Result<TlsIdentity, TlsError> {
    let (ca_pem, ca_key_pem) = load_or_create_ca(dir)?;
    let ca_key = KeyPair::from_pem(&ca_key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["localhost".to_string()])?;
    params.distinguished_name.push(DnType::CommonName, "argocd-agent-embedded-apiserver");
    let mut ips: Vec<IpAddr> = vec![[127, 0, 0, 1].into(), std::net::Ipv6Addr::LOCALHOST.into()];
    if !ips.contains(&listen_ip) && !listen_ip.is_unspecified() {
        ips.push(listen_ip);
    }
    params.subject_alt_names.extend(ips.into_iter().map(SanType::IpAddress));
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer)?;
    let chain = vec![cert.der().clone()];
    let key_der =
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).map_err(|e| TlsError::Pem(e.to_string()))?;
    let _ = CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(|e| TlsError::Pem(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsIdentity { ca_pem, server_config: Arc::new(cfg) })
}
