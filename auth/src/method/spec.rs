//! Parsing the principal's `--auth` value (upstream `cmd/argocd-agent/principal.go`,
//! `parseAuth` and `parseMTLSConfig`): `<method>:<config>`, split on the first `:`.
//!
//! | `--auth` | method |
//! |---|---|
//! | `mtls:subject:<regex>` | [`MtlsAuthenticator`] over the subject DN (Go rendering) |
//! | `mtls:uri:<regex>` | [`MtlsAuthenticator`] over the URI SANs |
//! | `mtls:<regex>` | deprecated upstream alias of `mtls:subject:<regex>` |
//! | `header:<name>:<regex>`, `xfcc:…`, `spiffe:x509…`, `spiffe:jwt…` | recognised, not supported yet (mesh authentication) |
//! | `userpass:<file>` | recognised, not supported (deprecated upstream) |
//!
//! Stricter than upstream, at startup instead of on the first agent: an empty regex or one
//! without a capture group is refused (upstream then fails every agent with "agent ID is empty").

use std::fmt;
use std::sync::Arc;

use regex::Regex;

use super::Authenticator;
use super::mtls::{IdentitySource, MtlsAuthenticator};

/// The regex upstream's documentation and `argocd-agentctl pki issue agent` pair with: agent
/// client certificates carry the agent name as their CN.
pub const DEFAULT_SUBJECT_REGEX: &str = "CN=([^,]+)";

/// A parsed `--auth` value.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AuthMethodSpec {
    /// `mtls:subject:<regex>`, `mtls:uri:<regex>` or the deprecated `mtls:<regex>`.
    Mtls {
        /// Subject or URI SANs.
        source: IdentitySource,
        /// The agent name regex (capture group 1).
        regex: Regex,
        /// Written in the deprecated `mtls:<regex>` form (the CLI should warn).
        deprecated_syntax: bool,
    },
}

/// Why an `--auth` value was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// Nothing given.
    #[error("--auth is empty: give an authentication method, e.g. --auth 'mtls:subject:{DEFAULT_SUBJECT_REGEX}'")]
    Empty,
    /// No `:` after the method.
    #[error("--auth \"{0}\" is not <method>:<config>, e.g. --auth 'mtls:subject:{DEFAULT_SUBJECT_REGEX}'")]
    MissingConfig(String),
    /// A method neither upstream nor this build knows.
    #[error(
        "--auth method \"{0}\" is unknown: use mtls:subject:<regex> or mtls:uri:<regex> (upstream also \
         knows header and userpass)"
    )]
    UnknownMethod(String),
    /// A method that is recognised but not implemented yet.
    #[error("--auth method \"{method}\" is recognised but not supported yet: {reason}")]
    NotSupportedYet {
        /// The method as written (`header`, `xfcc`, `spiffe:x509`, …).
        method: String,
        /// Why, and what to use meanwhile.
        reason: &'static str,
    },
    /// `mtls:subject:` or `mtls:uri:` with an empty regex.
    #[error(
        "--auth \"{spec}\" has an empty agent name regex: give one whose capture group 1 is the agent \
         name, e.g. mtls:subject:{DEFAULT_SUBJECT_REGEX}"
    )]
    EmptyRegex {
        /// The `--auth` value.
        spec: String,
    },
    /// The regex does not compile.
    #[error("--auth \"{spec}\": the agent name regex does not compile: {source}")]
    InvalidRegex {
        /// The `--auth` value.
        spec: String,
        /// The compiler's complaint.
        #[source]
        source: regex::Error,
    },
    /// The regex has no capture group for the agent name.
    #[error("--auth \"{spec}\": the agent name regex has no capture group; group 1 must capture the agent name")]
    NoCaptureGroup {
        /// The `--auth` value.
        spec: String,
    },
}

const MESH_LATER: &str = "it comes with mesh authentication; use mtls:subject:<regex> or mtls:uri:<regex> meanwhile";

impl AuthMethodSpec {
    /// Parses an `--auth` value.
    ///
    /// # Errors
    ///
    /// [`SpecError`] naming what is wrong with `spec`.
    pub fn parse(spec: &str) -> Result<Self, SpecError> {
        if spec.is_empty() {
            return Err(SpecError::Empty);
        }
        let Some((method, config)) = spec.split_once(':') else {
            return Err(match spec {
                "mtls" | "header" | "userpass" | "xfcc" | "spiffe" => SpecError::MissingConfig(spec.to_owned()),
                other => SpecError::UnknownMethod(other.to_owned()),
            });
        };
        match method {
            "mtls" => Self::parse_mtls(spec, config),
            "header" | "xfcc" => Err(SpecError::NotSupportedYet { method: method.to_owned(), reason: MESH_LATER }),
            "spiffe" => {
                let kind = config.split(':').next().unwrap_or_default();
                match kind {
                    "x509" | "jwt" => {
                        Err(SpecError::NotSupportedYet { method: format!("spiffe:{kind}"), reason: MESH_LATER })
                    }
                    _ => Err(SpecError::UnknownMethod(format!("spiffe:{kind}"))),
                }
            }
            "userpass" => Err(SpecError::NotSupportedYet {
                method: method.to_owned(),
                reason: "upstream deprecated userpass; use mtls:subject:<regex> with agent client certificates",
            }),
            other => Err(SpecError::UnknownMethod(other.to_owned())),
        }
    }

    fn parse_mtls(spec: &str, config: &str) -> Result<Self, SpecError> {
        let (source, pattern, deprecated_syntax) = if let Some(p) = config.strip_prefix("subject:") {
            (IdentitySource::Subject, p, false)
        } else if let Some(p) = config.strip_prefix("uri:") {
            (IdentitySource::Uri, p, false)
        } else {
            (IdentitySource::Subject, config, true)
        };
        if pattern.is_empty() {
            return Err(SpecError::EmptyRegex { spec: spec.to_owned() });
        }
        let regex = Regex::new(pattern).map_err(|source| SpecError::InvalidRegex { spec: spec.to_owned(), source })?;
        if regex.captures_len() < 2 {
            return Err(SpecError::NoCaptureGroup { spec: spec.to_owned() });
        }
        Ok(Self::Mtls { source, regex, deprecated_syntax })
    }

    /// The method name agents send in `AuthRequest.method`.
    #[must_use]
    pub fn method(&self) -> &'static str {
        match self {
            Self::Mtls { .. } => MtlsAuthenticator::METHOD,
        }
    }

    /// Whether the method needs the principal to serve TLS and request client certificates
    /// (upstream refuses `mtls` with `--insecure-plaintext` and forces `--require-client-certs`).
    #[must_use]
    pub fn requires_client_certificates(&self) -> bool {
        matches!(self, Self::Mtls { .. })
    }

    /// Builds the authenticator.
    #[must_use]
    pub fn authenticator(&self) -> Arc<dyn Authenticator> {
        match self {
            Self::Mtls { source, regex, .. } => Arc::new(MtlsAuthenticator::new(*source, regex.clone())),
        }
    }
}

impl fmt::Display for AuthMethodSpec {
    /// The canonical `--auth` form (the deprecated `mtls:<regex>` prints as `mtls:subject:<regex>`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Mtls { source, regex, .. } => write!(f, "mtls:{source}:{regex}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mtls(spec: &str) -> (IdentitySource, String, bool) {
        match AuthMethodSpec::parse(spec).expect("parses") {
            AuthMethodSpec::Mtls { source, regex, deprecated_syntax } => (source, regex.to_string(), deprecated_syntax),
        }
    }

    #[test]
    fn mtls_forms() {
        assert_eq!(mtls("mtls:subject:CN=([^,]+)"), (IdentitySource::Subject, "CN=([^,]+)".into(), false));
        assert_eq!(
            mtls("mtls:uri:spiffe://td/ns/argocd/sa/(.+)"),
            (IdentitySource::Uri, "spiffe://td/ns/argocd/sa/(.+)".into(), false)
        );
        // Deprecated alias; the regex itself may contain ':'.
        assert_eq!(mtls("mtls:CN=(a:b)"), (IdentitySource::Subject, "CN=(a:b)".into(), true));
        let spec = AuthMethodSpec::parse("mtls:CN=([^,]+)").expect("parses");
        assert_eq!(spec.to_string(), "mtls:subject:CN=([^,]+)");
        assert_eq!(spec.method(), "mtls");
        assert!(spec.requires_client_certificates());
        assert_eq!(spec.authenticator().method(), "mtls");
    }

    #[test]
    fn bad_mtls_configs_are_explained() {
        assert!(matches!(AuthMethodSpec::parse("mtls:subject:"), Err(SpecError::EmptyRegex { .. })));
        assert!(matches!(AuthMethodSpec::parse("mtls:"), Err(SpecError::EmptyRegex { .. })));
        assert!(matches!(AuthMethodSpec::parse("mtls:uri:("), Err(SpecError::InvalidRegex { .. })));
        let err = AuthMethodSpec::parse("mtls:subject:CN=agent").expect_err("no group");
        assert!(matches!(err, SpecError::NoCaptureGroup { .. }));
        assert!(err.to_string().contains("capture group"), "{err}");
        assert!(matches!(AuthMethodSpec::parse("mtls"), Err(SpecError::MissingConfig(_))));
        assert!(matches!(AuthMethodSpec::parse(""), Err(SpecError::Empty)));
    }

    #[test]
    fn mesh_and_legacy_methods_are_recognised_but_not_supported() {
        for (spec, method) in [
            ("header:x-forwarded-client-cert:^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)", "header"),
            ("xfcc:spiffe://cluster.local", "xfcc"),
            ("spiffe:x509", "spiffe:x509"),
            ("spiffe:jwt:aud", "spiffe:jwt"),
            ("userpass:/etc/users", "userpass"),
        ] {
            match AuthMethodSpec::parse(spec) {
                Err(SpecError::NotSupportedYet { method: m, .. }) => assert_eq!(m, method, "{spec}"),
                other => panic!("{spec}: {other:?}"),
            }
        }
        let msg = AuthMethodSpec::parse("header:x:(.*)").expect_err("unsupported").to_string();
        assert!(msg.contains("not supported yet") && msg.contains("mesh authentication"), "{msg}");
    }

    #[test]
    fn unknown_methods_are_refused() {
        assert!(matches!(AuthMethodSpec::parse("oidc:x"), Err(SpecError::UnknownMethod(m)) if m == "oidc"));
        assert!(matches!(AuthMethodSpec::parse("spiffe:k8s"), Err(SpecError::UnknownMethod(_))));
        assert!(matches!(AuthMethodSpec::parse("kerberos"), Err(SpecError::UnknownMethod(_))));
    }
}
