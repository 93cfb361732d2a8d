//! Upstream's TLS knobs on the command line (`--tls-min-version`, `--tls-max-version`,
//! `--tls-ciphersuites`, see [`auth::tls_policy`]).

use std::sync::Arc;

use anyhow::Context as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// `--tls-ciphersuites list`: prints the suite names (as upstream does) and says so.
pub fn wants_cipher_list(suites: &[String]) -> bool {
    if suites.iter().any(|s| s == "list") {
        for name in auth::tls_policy::cipher_suite_names() {
            println!("{name}");
        }
        return true;
    }
    false
}

/// `--tls-min-version`, `--tls-max-version` and `--tls-ciphersuites` (an empty text is unset).
///
/// # Errors
/// A version or suite name is unknown, or nothing is left to negotiate.
pub fn policy(min: &str, max: Option<&str>, suites: &[String]) -> anyhow::Result<auth::tls_policy::TlsPolicy> {
    auth::tls_policy::TlsPolicy::parse(min, max.unwrap_or_default(), suites)
        .context("--tls-min-version, --tls-max-version or --tls-ciphersuites")
}

/// A rustls client configuration trusting `ca_pem`, presenting `identity` (certificate and key
/// PEM) when given, with the versions and suites of `policy`.
///
/// # Errors
/// The PEM cannot be read, or the policy or key cannot be used.
pub fn client_config(
    policy: &auth::tls_policy::TlsPolicy,
    ca_pem: &str,
    identity: Option<(&str, &str)>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.context("the CA is not PEM certificates")?).context("the CA certificate cannot be trusted")?;
    }
    anyhow::ensure!(!roots.is_empty(), "the CA holds no certificate");
    let builder = rustls::ClientConfig::builder_with_provider(policy.provider()?)
        .with_protocol_versions(&policy.versions()?)
        .context("the TLS versions")?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .context("the client certificate is not PEM")?;
            let key =
                PrivateKeyDer::from_pem_slice(key.as_bytes()).context("the client key is not a PEM private key")?;
            builder.with_client_auth_cert(chain, key).context("the client certificate or key was refused")?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
