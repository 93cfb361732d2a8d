//! Certificate summaries for `pki inspect`, with upstream's field names (`cmd/ctl/ca.go`,
//! `certificateSummary`): subject in Go's `pkix.Name.String()` form, RFC 1123Z times and the
//! lower-case hex SHA-256 of the DER.

use anyhow::Context as _;
use serde::Serialize;
use sha2::Digest as _;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::public_key::PublicKey;

/// OID of Ed25519 public keys.
const OID_ED25519: &str = "1.3.101.112";

/// What `pki inspect` shows of one certificate.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSummary {
    /// Subject, as Go prints it (`CN=...,O=...`).
    pub subject: String,
    /// RSA, ECDSA or Ed25519.
    pub key_type: String,
    /// Key length in bits.
    pub key_length: usize,
    /// Start of validity (RFC 1123 with numeric zone).
    pub not_before: String,
    /// End of validity.
    pub not_after: String,
    /// SHA-256 of the DER, lower-case hex.
    #[serde(rename = "sha256")]
    pub checksum: String,
    /// IP SANs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// DNS SANs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dns: Vec<String>,
    /// URI SANs (SPIFFE IDs); not in upstream's summary.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uris: Vec<String>,
    /// What looks wrong.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Summarize the first certificate of `pem`; `expect_ca` adds a warning when it is not a CA.
///
/// # Errors
/// The PEM holds no parsable certificate.
pub fn summarize(pem: &str, expect_ca: bool) -> anyhow::Result<CertificateSummary> {
    let der = super::certs::first_cert_der(pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| anyhow::anyhow!("the certificate does not parse: {e}"))?;
    let (key_type, key_length) = key_info(&cert);
    let mut warnings = Vec::new();
    if expect_ca && !cert.is_ca() {
        warnings.push("This is not a CA certificate".to_owned());
    }
    if cert.basic_constraints().ok().flatten().is_none() {
        warnings.push("Basic constraints are invalid".to_owned());
    }
    if !cert.validity().is_valid() {
        warnings.push("The certificate is not valid now (expired or not yet valid)".to_owned());
    }
    let (mut ips, mut dns, mut uris) = (Vec::new(), Vec::new(), Vec::new());
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push((*d).to_owned()),
                GeneralName::URI(u) => uris.push((*u).to_owned()),
                GeneralName::IPAddress(bytes) => ips.push(ip_string(bytes)),
                _ => {}
            }
        }
    }
    Ok(CertificateSummary {
        subject: go_name(cert.subject()),
        key_type,
        key_length,
        not_before: rfc1123z(cert.validity().not_before.to_datetime())?,
        not_after: rfc1123z(cert.validity().not_after.to_datetime())?,
        checksum: hex::encode(sha2::Sha256::digest(&der)),
        ips,
        dns,
        uris,
        warnings,
    })
}

/// Key algorithm and size.
fn key_info(cert: &X509Certificate<'_>) -> (String, usize) {
    let spki = cert.public_key();
    if spki.algorithm.algorithm.to_id_string() == OID_ED25519 {
        return ("Ed25519".to_owned(), 256);
    }
    match spki.parsed() {
        Ok(PublicKey::RSA(rsa)) => ("RSA".to_owned(), rsa.key_size()),
        Ok(key @ PublicKey::EC(_)) => ("ECDSA".to_owned(), key.key_size()),
        _ => (spki.algorithm.algorithm.to_id_string(), 0),
    }
}

/// A subject or issuer as Go's `pkix.Name.String()` prints it: RDNs in reverse order, comma-separated.
pub(crate) fn go_name(name: &x509_parser::x509::X509Name<'_>) -> String {
    let rdns: Vec<_> = name.iter().collect();
    let mut parts = Vec::new();
    for rdn in rdns.iter().rev() {
        for attr in rdn.iter() {
            let oid = attr.attr_type().to_id_string();
            let key = match oid.as_str() {
                "2.5.4.3" => "CN",
                "2.5.4.10" => "O",
                "2.5.4.11" => "OU",
                "2.5.4.6" => "C",
                "2.5.4.7" => "L",
                "2.5.4.8" => "ST",
                "2.5.4.9" => "STREET",
                "2.5.4.17" => "POSTALCODE",
                "2.5.4.5" => "SERIALNUMBER",
                other => other,
            };
            let value = attr.as_str().map_or_else(|_| "#".to_owned() + &hex::encode(attr.as_slice()), str::to_owned);
            parts.push(format!("{key}={value}"));
        }
    }
    parts.join(",")
}

fn ip_string(bytes: &[u8]) -> String {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).map(|b| std::net::Ipv4Addr::from(b).to_string()).unwrap_or_default(),
        16 => <[u8; 16]>::try_from(bytes).map(|b| std::net::Ipv6Addr::from(b).to_string()).unwrap_or_default(),
        _ => hex::encode(bytes),
    }
}

/// Go's `time.RFC1123Z`, which is RFC 2822's layout.
fn rfc1123z(t: time::OffsetDateTime) -> anyhow::Result<String> {
    t.format(&time::format_description::well_known::Rfc2822).context("cannot format a certificate time")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::certs::{self, Ca, LeafSpec, Usage};
    use crate::ctl::keys::KeyAlgorithm;

    #[test]
    fn summary_has_upstream_fields() {
        let ca_key = KeyAlgorithm::EcdsaP256.generate().unwrap();
        let ca_pem = certs::generate_ca(&ca_key, 10).unwrap();
        let sum = summarize(&ca_pem, true).unwrap();
        assert_eq!(sum.subject, "CN=argocd-agent-ca,O=DO NOT USE IN PRODUCTION");
        assert_eq!((sum.key_type.as_str(), sum.key_length), ("ECDSA", 256));
        assert!(sum.warnings.is_empty(), "{:?}", sum.warnings);
        assert_eq!(sum.checksum.len(), 64);

        let ca = Ca::from_pem(&ca_pem, &ca_key.serialize_pem()).unwrap();
        let key = KeyAlgorithm::Ed25519.generate().unwrap();
        let spec = LeafSpec {
            common_name: "argocd-agent-principal".into(),
            ips: vec!["127.0.0.1".parse().unwrap()],
            dns: vec!["localhost".into()],
            uris: vec![],
            usage: Usage::Server,
        };
        let sum = summarize(&ca.issue(&spec, &key, 1).unwrap(), false).unwrap();
        assert_eq!((sum.key_type.as_str(), sum.key_length), ("Ed25519", 256));
        assert_eq!(sum.ips, vec!["127.0.0.1".to_owned()]);
        assert_eq!(sum.dns, vec!["localhost".to_owned()]);
        let json = serde_json::to_value(&sum).unwrap();
        for field in ["subject", "keyType", "keyLength", "notBefore", "notAfter", "sha256", "ips", "dns"] {
            assert!(json.get(field).is_some(), "{field} missing in {json}");
        }
    }
}
