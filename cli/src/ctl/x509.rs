//! What `agent inspect` and `validate` need to know about a certificate: names, validity, usages,
//! who signed it and whether a private key belongs to it.

use anyhow::{Context as _, bail};
use sha2::Digest as _;
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

/// One parsed certificate, owned.
#[derive(Debug, Clone)]
pub struct CertInfo {
    /// The DER encoding.
    pub der: Vec<u8>,
    /// Subject as Go prints it (`CN=...,O=...`), what upstream's subject regexes see.
    pub subject: String,
    /// Issuer, same form.
    pub issuer: String,
    /// First CN of the subject.
    pub common_name: Option<String>,
    /// Start of validity.
    pub not_before: OffsetDateTime,
    /// End of validity.
    pub not_after: OffsetDateTime,
    /// `basicConstraints CA:TRUE`.
    pub is_ca: bool,
    /// Extended key usage `clientAuth`; `None` without an EKU extension (any usage).
    pub client_auth: Option<bool>,
    /// Extended key usage `serverAuth`; `None` without an EKU extension.
    pub server_auth: Option<bool>,
    /// SHA-256 of the DER, lower-case hex (upstream's `pki inspect` checksum).
    pub sha256: String,
    /// SANs, as `DNS:x`, `IP:x`, `URI:x`.
    pub sans: Vec<String>,
    /// The subject public key bits, to match a private key against.
    public_key: Vec<u8>,
}

/// Where a certificate stands in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Not valid before this time.
    NotYetValid(OffsetDateTime),
    /// Expired at this time.
    Expired(OffsetDateTime),
    /// Valid, but ends within the warning window.
    Soon(OffsetDateTime),
    /// Valid until this time, beyond the warning window.
    Valid(OffsetDateTime),
}

impl CertInfo {
    /// Parse one DER certificate.
    ///
    /// # Errors
    /// It does not parse.
    pub fn from_der(der: Vec<u8>) -> anyhow::Result<Self> {
        let mut info = Self::parse(&der)?;
        info.der = der;
        Ok(info)
    }

    /// Everything but the DER itself (which `cert` borrows).
    fn parse(der: &[u8]) -> anyhow::Result<Self> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| anyhow::anyhow!("the certificate does not parse: {e}"))?;
        let eku = cert.extended_key_usage().ok().flatten().map(|e| e.value);
        Ok(Self {
            subject: super::inspect::go_name(cert.subject()),
            issuer: super::inspect::go_name(cert.issuer()),
            common_name: cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).map(str::to_owned),
            not_before: cert.validity().not_before.to_datetime(),
            not_after: cert.validity().not_after.to_datetime(),
            is_ca: cert.is_ca(),
            client_auth: eku.map(|e| e.client_auth || e.any),
            server_auth: eku.map(|e| e.server_auth || e.any),
            sha256: hex::encode(sha2::Sha256::digest(der)),
            sans: sans(&cert),
            public_key: cert.public_key().subject_public_key.data.to_vec(),
            der: Vec::new(),
        })
    }

    /// Where this certificate stands at `now`, warning `warn_days` ahead of its end.
    #[must_use]
    pub fn expiry(&self, now: OffsetDateTime, warn_days: u32) -> Expiry {
        if now < self.not_before {
            Expiry::NotYetValid(self.not_before)
        } else if now > self.not_after {
            Expiry::Expired(self.not_after)
        } else if self.not_after - now < time::Duration::days(i64::from(warn_days)) {
            Expiry::Soon(self.not_after)
        } else {
            Expiry::Valid(self.not_after)
        }
    }

    /// Whether `ca`'s key signed this certificate.
    #[must_use]
    pub fn signed_by(&self, ca: &Self) -> bool {
        let (Ok((_, leaf)), Ok((_, ca))) =
            (x509_parser::parse_x509_certificate(&self.der), x509_parser::parse_x509_certificate(&ca.der))
        else {
            return false;
        };
        leaf.verify_signature(Some(ca.public_key())).is_ok()
    }

    /// Whether this certificate was signed by any of `cas`.
    #[must_use]
    pub fn signed_by_any(&self, cas: &[Self]) -> bool {
        cas.iter().any(|ca| self.signed_by(ca))
    }

    /// Check that the PEM private key `key_pem` belongs to this certificate.
    ///
    /// # Errors
    /// The key does not parse, or is another key.
    pub fn check_key(&self, key_pem: &str) -> anyhow::Result<()> {
        let key = super::keys::load_private_key_pem(key_pem)?;
        if key.public_key_raw() != self.public_key.as_slice() {
            bail!("the private key does not belong to the certificate");
        }
        Ok(())
    }
}

/// The first certificate of a PEM bundle.
///
/// # Errors
/// There is none, or it does not parse.
pub fn parse_pem(pem: &str) -> anyhow::Result<CertInfo> {
    CertInfo::from_der(super::certs::first_cert_der(pem)?)
}

/// Every certificate of a PEM bundle (a CA bundle may hold several).
///
/// # Errors
/// The PEM is malformed, holds no certificate, or one does not parse.
pub fn parse_bundle(pem: &str) -> anyhow::Result<Vec<CertInfo>> {
    let mut out = Vec::new();
    for item in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let item = item.map_err(|e| anyhow::anyhow!("invalid PEM: {e}"))?;
        if item.label == "CERTIFICATE" {
            out.push(CertInfo::from_der(item.contents).context("a certificate of the bundle")?);
        }
    }
    if out.is_empty() {
        bail!("no CERTIFICATE block in the PEM data");
    }
    Ok(out)
}

/// RFC 3339, as Go's `time.Time` marshals to JSON.
#[must_use]
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_else(|_| t.to_string())
}

fn sans(cert: &X509Certificate<'_>) -> Vec<String> {
    let Ok(Some(ext)) = cert.subject_alternative_name() else { return Vec::new() };
    ext.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(d) => Some(format!("DNS:{d}")),
            GeneralName::URI(u) => Some(format!("URI:{u}")),
            GeneralName::IPAddress(b) => match b.len() {
                4 => <[u8; 4]>::try_from(*b).ok().map(|a| format!("IP:{}", std::net::Ipv4Addr::from(a))),
                16 => <[u8; 16]>::try_from(*b).ok().map(|a| format!("IP:{}", std::net::Ipv6Addr::from(a))),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::certs::{self, Ca, LeafSpec, Usage};
    use crate::ctl::keys::KeyAlgorithm;

    #[test]
    fn chain_key_and_expiry() {
        let ca_key = KeyAlgorithm::EcdsaP256.generate().unwrap();
        let ca_pem = certs::generate_ca(&ca_key, 10).unwrap();
        let other_key = KeyAlgorithm::EcdsaP256.generate().unwrap();
        let other_pem = certs::generate_ca(&other_key, 10).unwrap();
        let ca = Ca::from_pem(&ca_pem, &ca_key.serialize_pem()).unwrap();
        let leaf_key = KeyAlgorithm::EcdsaP256.generate().unwrap();
        let spec =
            LeafSpec { common_name: "agent-1".into(), ips: vec![], dns: vec![], uris: vec![], usage: Usage::Client };
        let leaf = parse_pem(&ca.issue(&spec, &leaf_key, 5).unwrap()).unwrap();
        let ca_info = parse_pem(&ca_pem).unwrap();
        let other = parse_pem(&other_pem).unwrap();

        assert!(leaf.signed_by(&ca_info));
        assert!(!leaf.signed_by(&other));
        assert!(leaf.signed_by_any(&[other.clone(), ca_info.clone()]));
        leaf.check_key(&leaf_key.serialize_pem()).unwrap();
        assert!(leaf.check_key(&other_key.serialize_pem()).is_err());
        assert_eq!(leaf.common_name.as_deref(), Some("agent-1"));
        assert_eq!((leaf.client_auth, leaf.server_auth), (Some(true), Some(false)));
        assert!(ca_info.is_ca && !leaf.is_ca);

        let now = OffsetDateTime::now_utc();
        assert!(matches!(leaf.expiry(now, 30), Expiry::Soon(_)));
        assert!(matches!(leaf.expiry(now, 1), Expiry::Valid(_)));
        assert!(matches!(leaf.expiry(now + time::Duration::days(6), 1), Expiry::Expired(_)));
        assert!(matches!(leaf.expiry(now - time::Duration::days(1), 1), Expiry::NotYetValid(_)));
        assert_eq!(parse_bundle(&format!("{ca_pem}{other_pem}")).unwrap().len(), 2);
    }
}
