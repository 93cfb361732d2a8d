//! Native mTLS: the agent name comes from the verified client certificate, through a regex over
//! its subject (`mtls:subject:<regex>`) or its URI SANs (`mtls:uri:<regex>`), capture group 1
//! (upstream `internal/auth/mtls/mtls.go`). Tokens bind to the SHA-256 of the leaf certificate.

use std::fmt;

use regex::Regex;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::dn::go_distinguished_name;
use super::{AuthContext, Authenticator};
use crate::error::AuthError;
use crate::identity::{AgentIdentity, AgentName, Binding, TransportIdentity};

/// Which part of the client certificate the regex reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdentitySource {
    /// The subject DN as Go renders it (`CN=agent-1,O=...`; see [`super::dn`]).
    Subject,
    /// Each URI SAN in turn (e.g. a SPIFFE ID); the first that matches wins.
    Uri,
}

impl IdentitySource {
    /// The `--auth` keyword: `subject` or `uri`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Subject => "subject",
            Self::Uri => "uri",
        }
    }

    fn field(self) -> &'static str {
        match self {
            Self::Subject => "subject",
            Self::Uri => "URI SAN",
        }
    }
}

impl fmt::Display for IdentitySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `mtls` method.
#[derive(Clone, Debug)]
pub struct MtlsAuthenticator {
    source: IdentitySource,
    regex: Regex,
}

impl MtlsAuthenticator {
    /// The method name agents send in `AuthRequest.method`.
    pub const METHOD: &'static str = "mtls";

    /// Reads the agent name from `source` with `regex`, whose capture group 1 is the name.
    /// Build it from `--auth` with [`super::spec::AuthMethodSpec::parse`], which also checks the
    /// regex has a capture group.
    #[must_use]
    pub fn new(source: IdentitySource, regex: Regex) -> Self {
        Self { source, regex }
    }

    /// Where the name is read from.
    #[must_use]
    pub fn source(&self) -> IdentitySource {
        self.source
    }

    /// The agent name regex.
    #[must_use]
    pub fn regex(&self) -> &Regex {
        &self.regex
    }

    /// The agent name in a DER certificate: the regex's capture group 1 over the subject or the
    /// first matching URI SAN, validated as a DNS-1123 label.
    ///
    /// # Errors
    ///
    /// [`AuthError`] for an unparsable certificate, no URI SAN, no match, an empty capture, or a
    /// name that is not a DNS-1123 label.
    pub fn agent_name(&self, der: &[u8]) -> Result<AgentName, AuthError> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| AuthError::BadCertificate { reason: e.to_string() })?;
        let (value, name) = match self.source {
            IdentitySource::Subject => {
                let subject = go_distinguished_name(cert.subject())
                    .map_err(|e| AuthError::BadCertificate { reason: e.to_string() })?;
                let Some(captures) = self.regex.captures(&subject) else {
                    return Err(AuthError::SubjectMismatch { subject, regex: self.regex.to_string() });
                };
                let name = captures.get(1).map(|m| m.as_str().to_owned());
                (subject, name)
            }
            IdentitySource::Uri => {
                let uris = uri_sans(&cert)?;
                if uris.is_empty() {
                    return Err(AuthError::NoUriSan);
                }
                let found = uris.iter().find_map(|uri| {
                    self.regex.captures(uri).map(|c| (uri.clone(), c.get(1).map(|m| m.as_str().to_owned())))
                });
                let Some(found) = found else {
                    return Err(AuthError::UriMismatch { uris: uris.join(", "), regex: self.regex.to_string() });
                };
                found
            }
        };
        let field = self.source.field();
        match name {
            Some(name) if !name.is_empty() => {
                AgentName::new(name).map_err(|reason| AuthError::InvalidAgentName { field, reason })
            }
            _ => Err(AuthError::EmptyAgentName { field, value, regex: self.regex.to_string() }),
        }
    }
}

/// The verified leaf certificate of a TLS connection.
fn leaf(transport: &TransportIdentity) -> Result<&[u8], AuthError> {
    let method = MtlsAuthenticator::METHOD;
    if !transport.is_tls() {
        return Err(AuthError::NotTls { method });
    }
    transport.leaf_certificate().map(AsRef::as_ref).ok_or(AuthError::NoClientCertificate { method })
}

impl Authenticator for MtlsAuthenticator {
    fn method(&self) -> &'static str {
        Self::METHOD
    }

    fn authenticate(&self, cx: &AuthContext<'_>) -> Result<AgentIdentity, AuthError> {
        let leaf = leaf(cx.transport)?;
        let name = self.agent_name(leaf)?;
        Ok(AgentIdentity::new(name, Self::METHOD, Binding::certificate(leaf)))
    }

    fn presented_binding(&self, cx: &AuthContext<'_>) -> Result<Binding, AuthError> {
        leaf(cx.transport).map(Binding::certificate)
    }
}

fn uri_sans(cert: &X509Certificate<'_>) -> Result<Vec<String>, AuthError> {
    let san = cert
        .subject_alternative_name()
        .map_err(|e| AuthError::BadCertificate { reason: format!("subject alternative name extension: {e}") })?;
    Ok(san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(uri) => Some((*uri).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rcgen::{CertificateParams, DnType, KeyPair, SanType};
    use rustls_pki_types::CertificateDer;

    use super::*;

    fn cert(cn: Option<&str>, uris: &[&str]) -> Vec<u8> {
        let mut params = CertificateParams::default();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
            params.distinguished_name.push(DnType::OrganizationName, "argocd-agent");
        }
        params.subject_alt_names = uris.iter().map(|u| SanType::URI((*u).try_into().expect("ia5"))).collect();
        let key = KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    fn subject(regex: &str) -> MtlsAuthenticator {
        MtlsAuthenticator::new(IdentitySource::Subject, Regex::new(regex).expect("regex"))
    }

    fn uri(regex: &str) -> MtlsAuthenticator {
        MtlsAuthenticator::new(IdentitySource::Uri, Regex::new(regex).expect("regex"))
    }

    #[test]
    fn subject_regex_takes_capture_group_one() {
        let der = cert(Some("agent-1"), &[]);
        let name = subject("CN=([^,]+)").agent_name(&der).expect("name");
        assert_eq!(name.as_str(), "agent-1");
        // The regex sees Go's rendering: CN before O.
        let name = subject("^CN=([^,]+),O=argocd-agent$").agent_name(&der).expect("name");
        assert_eq!(name.as_str(), "agent-1");
    }

    #[test]
    fn subject_mismatch_names_the_subject() {
        let der = cert(Some("agent-1"), &[]);
        let err = subject("^OU=([^,]+)").agent_name(&der).expect_err("mismatch");
        let msg = err.to_string();
        assert!(msg.contains("CN=agent-1,O=argocd-agent"), "{msg}");
        assert!(msg.contains("^OU=([^,]+)"), "{msg}");
    }

    #[test]
    fn name_must_be_a_dns_label() {
        let der = cert(Some("Agent_1"), &[]);
        let err = subject("CN=([^,]+)").agent_name(&der).expect_err("invalid");
        assert!(matches!(err, AuthError::InvalidAgentName { .. }), "{err}");
        assert!(err.to_string().contains("DNS-1123"), "{err}");
    }

    #[test]
    fn empty_capture_is_refused() {
        let der = cert(Some("agent-1"), &[]);
        let err = subject("CN=agent-1()").agent_name(&der).expect_err("empty");
        assert!(matches!(err, AuthError::EmptyAgentName { .. }), "{err}");
        let err = subject("CN=(x)?agent").agent_name(&der).expect_err("no participation");
        assert!(matches!(err, AuthError::EmptyAgentName { .. }), "{err}");
    }

    #[test]
    fn uri_regex_reads_the_first_matching_san() {
        let der = cert(None, &["https://example.com/x", "spiffe://cluster.local/ns/argocd/sa/agent-7"]);
        let name = uri("^spiffe://cluster\\.local/ns/[^/]+/sa/([^/]+)$").agent_name(&der).expect("name");
        assert_eq!(name.as_str(), "agent-7");
    }

    #[test]
    fn uri_without_sans_or_match_is_explained() {
        let der = cert(Some("agent-1"), &[]);
        assert!(matches!(uri("(.+)").agent_name(&der), Err(AuthError::NoUriSan)));
        let der = cert(None, &["spiffe://evil/ns/x/sa/agent-1"]);
        let err = uri("^spiffe://cluster\\.local/.*/sa/(.+)$").agent_name(&der).expect_err("mismatch");
        assert!(err.to_string().contains("spiffe://evil/ns/x/sa/agent-1"), "{err}");
    }

    #[test]
    fn authenticate_needs_tls_and_a_certificate() {
        let m = subject("CN=([^,]+)");
        let headers = http::HeaderMap::new();
        let plain = TransportIdentity::plaintext(None);
        let err = m.authenticate(&AuthContext::new(&plain, &headers)).expect_err("plaintext");
        assert!(matches!(err, AuthError::NotTls { .. }));
        let no_cert = TransportIdentity::tls(None, None);
        let err = m.authenticate(&AuthContext::new(&no_cert, &headers)).expect_err("no cert");
        assert!(err.to_string().starts_with("no client certificate"), "{err}");

        let der = cert(Some("agent-1"), &[]);
        let t = TransportIdentity::tls(None, Some(Arc::new(vec![CertificateDer::from(der.clone())])));
        let id = m.authenticate(&AuthContext::new(&t, &headers)).expect("identity");
        assert_eq!(id.name().as_str(), "agent-1");
        assert_eq!(id.method(), "mtls");
        assert_eq!(id.binding(), &Binding::certificate(&der));
        assert_eq!(m.presented_binding(&AuthContext::new(&t, &headers)).expect("binding"), Binding::certificate(&der));
    }
}
