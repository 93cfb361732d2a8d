//! `argocd-agent agent --creds`: how the agent proves who it is.
//!
//! - `mtls:any` (or empty): the client certificate (upstream's default);
//! - `header:`: the identity a mesh sidecar forwards (principal `--auth xfcc:` or `header:`);
//! - `spiffe:x509[:endpoint=<uri>;principal-id=<spiffe id>,…]`: mTLS with this workload's
//!   X.509-SVID and trust bundles from the SPIFFE Workload API (principal `--auth spiffe:x509`).
//!   The principal must present an SVID of the agent's own trust domain, or one of the
//!   `principal-id`s when given;
//! - `spiffe:jwt[:audience=<aud>;endpoint=<uri>]`: a JWT-SVID for the principal's audience
//!   (default `argocd-agent-principal`) from the Workload API, sent on every call (principal
//!   `--auth spiffe:jwt`); over plaintext behind a sidecar, or TLS with the principal's CA.
//!
//! `endpoint` defaults to `SPIFFE_ENDPOINT_SOCKET`.

use std::collections::BTreeMap;

use anyhow::Context as _;
use mesh::SpiffeId;

/// The audience a JWT-SVID is fetched for unless `audience=` says otherwise (the principal's
/// default).
pub const DEFAULT_AUDIENCE: &str = auth::method::spiffe_jwt::SpiffeJwtAuthenticator::DEFAULT_AUDIENCE;

/// A parsed `--creds`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Creds {
    /// The client certificate.
    Mtls,
    /// A sidecar forwards the identity.
    Header,
    /// X.509-SVIDs from the Workload API.
    SpiffeX509 {
        /// The Workload API endpoint (`None`: `SPIFFE_ENDPOINT_SOCKET`).
        endpoint: Option<String>,
        /// The SPIFFE IDs the principal may present (empty: any of the agent's trust domain).
        principal_ids: Vec<SpiffeId>,
    },
    /// A JWT-SVID from the Workload API.
    SpiffeJwt {
        /// The Workload API endpoint (`None`: `SPIFFE_ENDPOINT_SOCKET`).
        endpoint: Option<String>,
        /// The principal's audience.
        audience: String,
    },
}

impl Creds {
    /// Parses `--creds`.
    ///
    /// # Errors
    /// An unknown kind or option, or a malformed value, named in the message.
    pub fn parse(creds: &str) -> anyhow::Result<Self> {
        let (kind, rest) = creds.split_once(':').unwrap_or((creds, ""));
        match kind {
            "" | "mtls" => Ok(Self::Mtls),
            "header" => Ok(Self::Header),
            // Upstream v0.10's name (with --spire-agent-socket): a JWT-SVID for its audience.
            "spiffe-jwt" => Ok(Self::SpiffeJwt { endpoint: None, audience: DEFAULT_AUDIENCE.to_owned() }),
            "spiffe" => {
                let (flavour, options) = rest.split_once(':').unwrap_or((rest, ""));
                let mut options = parse_options(creds, options)?;
                let endpoint = options.remove("endpoint").map(str::to_owned);
                let parsed = match flavour {
                    "x509" => {
                        let principal_ids = options
                            .remove("principal-id")
                            .map(|ids| {
                                ids.split(',')
                                    .map(|id| {
                                        SpiffeId::parse(id.trim())
                                            .with_context(|| format!("--creds {creds:?}: principal-id {id:?}"))
                                    })
                                    .collect::<anyhow::Result<Vec<_>>>()
                            })
                            .transpose()?
                            .unwrap_or_default();
                        Self::SpiffeX509 { endpoint, principal_ids }
                    }
                    "jwt" => {
                        let audience = options.remove("audience").unwrap_or(DEFAULT_AUDIENCE).to_owned();
                        Self::SpiffeJwt { endpoint, audience }
                    }
                    other => {
                        anyhow::bail!("--creds {creds:?}: unknown SPIFFE kind {other:?}; use spiffe:x509 or spiffe:jwt")
                    }
                };
                if let Some(key) = options.keys().next() {
                    anyhow::bail!("--creds {creds:?}: unknown option {key:?} for spiffe:{flavour}");
                }
                Ok(parsed)
            }
            other => anyhow::bail!(
                "--creds {creds:?}: unknown kind {other:?}; use mtls:any, header: behind a mesh sidecar, spiffe:x509 or spiffe:jwt"
            ),
        }
    }

    /// The `AuthRequest.method` the principal's `--auth` expects for these credentials.
    #[must_use]
    pub fn method(&self) -> &'static str {
        match self {
            Self::Mtls => auth::MtlsAuthenticator::METHOD,
            Self::Header => auth::HeaderAuthenticator::METHOD,
            Self::SpiffeX509 { .. } => auth::method::spiffe_x509::SpiffeX509Authenticator::METHOD,
            Self::SpiffeJwt { .. } => auth::method::spiffe_jwt::SpiffeJwtAuthenticator::METHOD,
        }
    }

    /// Whether the stream runs through a mesh sidecar (heartbeats on by default).
    #[must_use]
    pub fn implies_sidecar(&self) -> bool {
        matches!(self, Self::Header)
    }
}

/// `key=value;key=value` (empty: none); a repeated or empty key is an error.
fn parse_options<'a>(creds: &str, options: &'a str) -> anyhow::Result<BTreeMap<&'a str, &'a str>> {
    let mut out = BTreeMap::new();
    for item in options.split(';').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) =
            item.split_once('=').with_context(|| format!("--creds {creds:?}: option {item:?} is not key=value"))?;
        let (key, value) = (key.trim(), value.trim());
        anyhow::ensure!(!value.is_empty(), "--creds {creds:?}: option {key:?} has an empty value");
        anyhow::ensure!(out.insert(key, value).is_none(), "--creds {creds:?}: option {key:?} is given twice");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::Creds;

    #[test]
    fn kinds_and_methods() {
        assert_eq!(Creds::parse("").ok().map(|c| c.method()), Some("mtls"));
        assert_eq!(Creds::parse("mtls:any").ok().map(|c| c.method()), Some("mtls"));
        assert_eq!(Creds::parse("header:").ok().map(|c| c.method()), Some("header"));
        assert_eq!(Creds::parse("spiffe:x509").ok().map(|c| c.method()), Some("spiffe-x509"));
        assert_eq!(Creds::parse("spiffe:jwt").ok().map(|c| c.method()), Some("spiffe-jwt"));
        assert!(Creds::parse("kerberos:x").is_err());
    }

    #[test]
    fn spiffe_options() {
        let parsed = Creds::parse(
            "spiffe:x509:endpoint=unix:/run/spire/agent.sock;principal-id=spiffe://td/ns/argocd/sa/principal",
        )
        .expect("x509");
        let Creds::SpiffeX509 { endpoint, principal_ids } = parsed else { panic!("kind") };
        assert_eq!(endpoint.as_deref(), Some("unix:/run/spire/agent.sock"));
        assert_eq!(principal_ids.len(), 1);
        assert_eq!(
            Creds::parse("spiffe:jwt:audience=hub").expect("jwt"),
            Creds::SpiffeJwt { endpoint: None, audience: "hub".into() }
        );
        assert_eq!(
            Creds::parse("spiffe:jwt").expect("jwt"),
            Creds::SpiffeJwt { endpoint: None, audience: super::DEFAULT_AUDIENCE.into() }
        );
        for bad in [
            "spiffe:x509:principal-id=not-an-id",
            "spiffe:x509:colour=blue",
            "spiffe:jwt:audience=",
            "spiffe:jwt:audience=a;audience=b",
            "spiffe:x509:endpoint",
            "spiffe:svid",
        ] {
            let error = Creds::parse(bad).expect_err(bad).to_string();
            assert!(error.contains(bad), "{bad}: {error}");
        }
    }
}
