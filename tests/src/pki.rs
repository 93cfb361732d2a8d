//! A certificate authority for tests: the ones tests make (the real control plane's, the Envoy
//! sidecars', a CA rotated mid-test) and the one `argocd-agentctl pki init` stores on the hub,
//! read back to issue more certificates from it.

use anyhow::{Context as _, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;

/// A CA that can issue certificates.
pub struct Ca {
    /// The CA certificate, PEM.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("pem", &self.pem).finish_non_exhaustive()
    }
}

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert: String,
    /// The private key.
    pub key: String,
}

impl Issued {
    /// A client's TLS configuration presenting this certificate and trusting `server_ca`
    /// (`ring` provider, safe default protocol versions).
    ///
    /// # Errors
    /// The PEM does not parse, or rustls refuses the certificate or key.
    pub fn client_config(&self, server_ca: &CertificateDer<'static>) -> Result<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(server_ca.clone())?;
        let chain = CertificateDer::pem_slice_iter(self.cert.as_bytes()).collect::<Result<Vec<_>, _>>()?;
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(self.key.as_bytes())?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        Ok(rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?)
    }
}

impl Ca {
    /// A new self-signed CA with subject CN `cn`.
    ///
    /// # Errors
    /// Key generation or signing failed.
    pub fn generate(cn: &str) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let pem = params.self_signed(&key)?.pem();
        Ok(Self { pem, issuer: Issuer::new(params, key) })
    }

    /// The CA in `cert_pem` with its key `key_pem` (e.g. the hub's `argocd-agent-ca` Secret).
    ///
    /// # Errors
    /// Either PEM does not parse.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let key = KeyPair::from_pem(key_pem).context("CA key PEM")?;
        Ok(Self {
            issuer: Issuer::from_ca_cert_pem(cert_pem, key).context("CA certificate PEM")?,
            pem: cert_pem.to_owned(),
        })
    }

    /// The CA certificate, DER (a trust root for rustls).
    ///
    /// # Errors
    /// The PEM holds no certificate.
    pub fn der(&self) -> Result<CertificateDer<'static>> {
        CertificateDer::from_pem_slice(self.pem.as_bytes()).context("CA PEM")
    }

    /// A client certificate with subject CN `cn` (how agents are named under mTLS) and URI SANs
    /// `uris` (SPIFFE IDs).
    ///
    /// # Errors
    /// A URI is not valid for a SAN, or signing failed.
    pub fn client(&self, cn: &str, uris: &[&str]) -> Result<Issued> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        for uri in uris {
            params.subject_alt_names.push(SanType::URI((*uri).try_into()?));
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.issue(params)
    }

    /// A client certificate of the resource proxy's callers: subject CN `cn` and the mark
    /// (subject OU [`auth::roles::RESOURCE_PROXY_CLIENT_OU`]) `argocd-agentctl agent create` and
    /// `pki issue shared-client` put on it.
    ///
    /// # Errors
    /// Signing failed.
    pub fn proxy_client(&self, cn: &str) -> Result<Issued> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.distinguished_name.push(DnType::OrganizationalUnitName, auth::roles::RESOURCE_PROXY_CLIENT_OU);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.issue(params)
    }

    /// A server certificate with subject CN `cn` for `names` (DNS names and IP addresses, as
    /// rcgen reads them) and URI SANs `uris`.
    ///
    /// # Errors
    /// A name or URI is not valid for a SAN, or signing failed.
    pub fn server(&self, cn: &str, names: &[&str], uris: &[&str]) -> Result<Issued> {
        let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        for uri in uris {
            params.subject_alt_names.push(SanType::URI((*uri).try_into()?));
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// A certificate for `params` (a leaf: never a CA), with a new key.
    ///
    /// # Errors
    /// Signing failed.
    pub fn issue(&self, mut params: CertificateParams) -> Result<Issued> {
        params.is_ca = IsCa::ExplicitNoCa;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued { cert: cert.pem(), key: key.serialize_pem() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_chain_to_the_ca_and_name_their_subject() -> Result<()> {
        let ca = Ca::generate("test CA")?;
        let again = Ca::from_pem(&ca.pem, &ca.issuer.key().serialize_pem())?;
        for (issued, cn) in [
            (ca.client("agent-1", &["spiffe://example.org/ns/a/sa/agent-1"])?, "agent-1"),
            (again.server("principal", &["localhost", "127.0.0.1"], &[])?, "principal"),
        ] {
            let der = CertificateDer::from_pem_slice(issued.cert.as_bytes())?;
            let (_, cert) = x509_parser::parse_x509_certificate(&der)?;
            assert_eq!(cert.issuer().to_string(), "CN=test CA");
            assert_eq!(cert.subject().to_string(), format!("CN={cn}"));
            assert!(!cert.is_ca());
        }
        assert_eq!(ca.der()?.as_ref(), CertificateDer::from_pem_slice(ca.pem.as_bytes())?.as_ref());
        Ok(())
    }
}
