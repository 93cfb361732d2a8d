//! Certificates of the development PKI, shaped like upstream's (`internal/tlsutil/generate.go`):
//! a CA `CN=argocd-agent-ca,O=DO NOT USE IN PRODUCTION`, server certificates for the principal
//! and the resource proxy, and agent client certificates whose CN is the agent name (what
//! `--auth mtls:subject:CN=([^,]+)` extracts).
//!
//! Differences from upstream, all on the safe side: random serial numbers (upstream gives every
//! certificate serial 1), leaves carry no `keyCertSign` usage and an explicit `CA:FALSE`, and leaves
//! carry the CA's key identifier.

use std::net::IpAddr;

use anyhow::{Context as _, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};

/// Organization upstream puts in every subject.
pub const ORGANIZATION: &str = "DO NOT USE IN PRODUCTION";
/// CN of the CA (upstream names it after its secret).
pub const CA_COMMON_NAME: &str = "argocd-agent-ca";
/// CN of the principal's gRPC server certificate.
pub const PRINCIPAL_COMMON_NAME: &str = "argocd-agent-principal";
/// CN of the resource proxy's server certificate.
pub const RESOURCE_PROXY_COMMON_NAME: &str = "argocd-agent-resource-proxy";
/// Upstream's CA validity (`--days` of `pki init`).
pub const DEFAULT_CA_DAYS: u32 = 3650;
/// Upstream's leaf validity (`--days` of `pki issue ...`).
pub const DEFAULT_LEAF_DAYS: u32 = 180;

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// TLS server (`serverAuth`).
    Server,
    /// TLS server that also dials peers with the same certificate (`serverAuth` and
    /// `clientAuth`): the principal, whose cross-hub replica authenticates to its peer with it.
    ServerAndClient,
    /// TLS client (`clientAuth`).
    Client,
    /// TLS client of the resource proxy (`clientAuth`, and the subject OU
    /// [`auth::roles::RESOURCE_PROXY_CLIENT_OU`] that tells it from an agent's certificate): the
    /// certificate of a cluster secret, which the hub's Argo CD presents to the resource proxy.
    ProxyClient,
    /// TLS client of a principal replica forwarding a resource-proxy request to the replica that
    /// owns the agent (`clientAuth`, and the subject OU [`auth::roles::PRINCIPAL_REPLICA_OU`]).
    ReplicaClient,
}

/// The subject and names of a leaf certificate.
#[derive(Debug, Clone)]
pub struct LeafSpec {
    /// Subject CN.
    pub common_name: String,
    /// IP address SANs.
    pub ips: Vec<IpAddr>,
    /// DNS name SANs.
    pub dns: Vec<String>,
    /// URI SANs (SPIFFE IDs).
    pub uris: Vec<String>,
    /// Server or client.
    pub usage: Usage,
}

/// The CA as read back from its secret: certificate PEM and signing key.
#[derive(Debug)]
pub struct Ca {
    /// The CA certificate, PEM.
    pub cert_pem: String,
    key: KeyPair,
}

impl Ca {
    /// Load the CA from its PEM certificate and PEM private key.
    ///
    /// # Errors
    /// Either PEM does not parse, the key does not belong to the certificate, or the certificate is
    /// not a CA.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> anyhow::Result<Self> {
        let key = super::keys::load_private_key_pem(key_pem).context("CA private key (tls.key)")?;
        let der = first_cert_der(cert_pem).context("CA certificate (tls.crt)")?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der)
            .map_err(|e| anyhow::anyhow!("CA certificate (tls.crt) does not parse: {e}"))?;
        if !cert.is_ca() {
            bail!("the certificate in tls.crt is not a CA certificate (basicConstraints CA:TRUE missing)");
        }
        if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            bail!("the CA private key (tls.key) does not belong to the CA certificate (tls.crt)");
        }
        Ok(Self { cert_pem: cert_pem.to_owned(), key })
    }

    /// Sign a leaf for `spec` with a key of its own, valid for `days`.
    ///
    /// # Errors
    /// The CA certificate cannot serve as issuer or signing fails.
    pub fn issue(&self, spec: &LeafSpec, leaf_key: &KeyPair, days: u32) -> anyhow::Result<String> {
        let issuer =
            Issuer::from_ca_cert_pem(&self.cert_pem, &self.key).context("cannot use the CA certificate as issuer")?;
        let mut params = base_params(&spec.common_name, days)?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if leaf_key.algorithm() == &rcgen::PKCS_RSA_SHA256 {
            // As Go's crypto/tls does: key encipherment only makes sense for RSA keys.
            params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
        }
        params.extended_key_usages = match spec.usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client | Usage::ProxyClient | Usage::ReplicaClient => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::ServerAndClient => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        };
        if spec.usage == Usage::ProxyClient {
            params.distinguished_name.push(DnType::OrganizationalUnitName, auth::roles::RESOURCE_PROXY_CLIENT_OU);
        }
        if spec.usage == Usage::ReplicaClient {
            params.distinguished_name.push(DnType::OrganizationalUnitName, auth::roles::PRINCIPAL_REPLICA_OU);
        }
        for dns in &spec.dns {
            let name = dns.clone().try_into().with_context(|| format!("invalid DNS name {dns:?}"))?;
            params.subject_alt_names.push(SanType::DnsName(name));
        }
        for ip in &spec.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        for uri in &spec.uris {
            let value = uri.clone().try_into().with_context(|| format!("invalid URI {uri:?}"))?;
            params.subject_alt_names.push(SanType::URI(value));
        }
        let cert = params.signed_by(leaf_key, &issuer).context("cannot sign the certificate")?;
        Ok(cert.pem())
    }
}

/// Create a self-signed CA certificate for `key`, valid for `days`; returns its PEM.
///
/// # Errors
/// Signing fails.
pub fn generate_ca(key: &KeyPair, days: u32) -> anyhow::Result<String> {
    let mut params = base_params(CA_COMMON_NAME, days)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyCertSign];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth, ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.self_signed(key).context("cannot self-sign the CA certificate")?;
    Ok(cert.pem())
}

/// Subject, serial and validity shared by every certificate.
fn base_params(common_name: &str, days: u32) -> anyhow::Result<CertificateParams> {
    if days == 0 {
        bail!("--days must be at least 1");
    }
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    // Go encodes O before CN, so pkix.Name.String() reads "CN=<name>,O=DO NOT USE IN PRODUCTION"
    // for upstream's certificates; keep that order so subject regexes see the same string.
    dn.push(DnType::OrganizationName, ORGANIZATION);
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now;
    params.not_after = now + time::Duration::days(i64::from(days));
    params.serial_number = Some(random_serial());
    Ok(params)
}

/// A positive 128-bit serial number from the OS random source.
fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01; // keep it 16 bytes long and positive
    SerialNumber::from_slice(&bytes)
}

/// The DER of the first certificate in a PEM bundle.
///
/// # Errors
/// There is no `CERTIFICATE` block.
pub fn first_cert_der(pem: &str) -> anyhow::Result<Vec<u8>> {
    for item in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let item = item.map_err(|e| anyhow::anyhow!("invalid PEM: {e}"))?;
        if item.label == "CERTIFICATE" {
            return Ok(item.contents);
        }
    }
    bail!("no CERTIFICATE block in the PEM data")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::keys::KeyAlgorithm;

    #[test]
    fn leaf_chains_to_ca_and_carries_names() {
        let ca_key = KeyAlgorithm::EcdsaP256.generate().unwrap();
        let ca_pem = generate_ca(&ca_key, 10).unwrap();
        let ca = Ca::from_pem(&ca_pem, &ca_key.serialize_pem()).unwrap();
        let leaf_key = KeyAlgorithm::Ed25519.generate().unwrap();
        let spec = LeafSpec {
            common_name: "agent-1".into(),
            ips: vec!["127.0.0.1".parse().unwrap()],
            dns: vec!["localhost".into()],
            uris: vec!["spiffe://cluster.local/ns/argocd/sa/agent-1".into()],
            usage: Usage::Client,
        };
        let leaf_pem = ca.issue(&spec, &leaf_key, 5).unwrap();
        let leaf_der = first_cert_der(&leaf_pem).unwrap();
        let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).unwrap();
        let ca_der = first_cert_der(&ca_pem).unwrap();
        let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        leaf.verify_signature(Some(ca_cert.public_key())).unwrap();
        assert_eq!(leaf.subject().to_string(), "O=DO NOT USE IN PRODUCTION, CN=agent-1");
        assert!(!leaf.is_ca());
        let validity = leaf.validity().time_to_expiration().unwrap();
        assert!(validity.whole_days() >= 4 && validity.whole_days() <= 5);
    }

    /// The certificates must be accepted by rustls/webpki (what our principal and agent use) in a
    /// full mutual-TLS handshake.
    #[test]
    fn rustls_accepts_the_pki_in_a_mutual_tls_handshake() {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        use std::sync::Arc;

        for alg in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::Ed25519, KeyAlgorithm::Rsa(2048)] {
            let ca_key = alg.generate().unwrap();
            let ca_pem = generate_ca(&ca_key, 10).unwrap();
            let ca = Ca::from_pem(&ca_pem, &ca_key.serialize_pem()).unwrap();
            let leaf = |cn: &str, usage, dns: Vec<String>| {
                let key = alg.generate().unwrap();
                let spec = LeafSpec { common_name: cn.into(), ips: vec![], dns, uris: vec![], usage };
                let cert = ca.issue(&spec, &key, 1).unwrap();
                let der = CertificateDer::from(first_cert_der(&cert).unwrap());
                (vec![der], PrivateKeyDer::try_from(key.serialize_der()).unwrap())
            };
            let (server_chain, server_key) = leaf(PRINCIPAL_COMMON_NAME, Usage::Server, vec!["localhost".into()]);
            let (client_chain, client_key) = leaf("agent-1", Usage::Client, vec![]);

            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut roots = rustls::RootCertStore::empty();
            roots.add(CertificateDer::from(first_cert_der(&ca_pem).unwrap())).unwrap();
            let roots = Arc::new(roots);
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .unwrap();
            let server_cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_client_cert_verifier(verifier)
                .with_single_cert(server_chain, server_key)
                .unwrap();
            let client_cfg = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_client_auth_cert(client_chain, client_key)
                .unwrap();
            let mut client =
                rustls::ClientConnection::new(Arc::new(client_cfg), ServerName::try_from("localhost").unwrap())
                    .unwrap();
            let mut server = rustls::ServerConnection::new(Arc::new(server_cfg)).unwrap();
            for _ in 0..10 {
                let mut buf = Vec::new();
                client.write_tls(&mut buf).unwrap();
                server.read_tls(&mut buf.as_slice()).unwrap();
                server.process_new_packets().unwrap_or_else(|e| panic!("{alg:?}: server: {e}"));
                let mut buf = Vec::new();
                server.write_tls(&mut buf).unwrap();
                client.read_tls(&mut buf.as_slice()).unwrap();
                client.process_new_packets().unwrap_or_else(|e| panic!("{alg:?}: client: {e}"));
                if !client.is_handshaking() && !server.is_handshaking() {
                    break;
                }
            }
            assert!(!server.is_handshaking() && !client.is_handshaking(), "{alg:?}: handshake incomplete");
            assert!(server.peer_certificates().is_some_and(|c| c.len() == 1), "{alg:?}: client cert seen");
        }
    }

    #[test]
    fn ca_rejects_a_foreign_key() {
        let ca_key = KeyAlgorithm::EcdsaP256.generate().unwrap();
        let other = KeyAlgorithm::EcdsaP256.generate().unwrap();
        let ca_pem = generate_ca(&ca_key, 10).unwrap();
        let err = Ca::from_pem(&ca_pem, &other.serialize_pem()).unwrap_err();
        assert!(err.to_string().contains("does not belong"), "{err:#}");
    }
}
