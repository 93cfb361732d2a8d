//! Parsing the principal's `--auth` value (upstream `cmd/argocd-agent/principal.go`,
//! `parseAuth` and `parseMTLSConfig`): `<method>:<config>`, split on the first `:`.
//!
//! | `--auth` | method |
//! |---|---|
//! | `mtls:subject:<regex>` | [`MtlsAuthenticator`] over the subject DN (Go rendering) |
//! | `mtls:uri:<regex>` | [`MtlsAuthenticator`] over the URI SANs |
//! | `mtls:<regex>` | deprecated upstream alias of `mtls:subject:<regex>` |
//! | `xfcc:[<key>=<value>;…]` | [`XfccAuthenticator`]: the SPIFFE ID a mesh sidecar forwards, checked by a policy |
//! | `header:<header-name>:<regex>` | [`HeaderAuthenticator`]: upstream's regex over a forwarded header |
//! | `spiffe:x509[:<key>=<value>;…]` | [`SpiffeX509Authenticator`]: the verified client X.509-SVID's SPIFFE ID, checked by a policy |
//! | `spiffe:jwt[:<key>=<value>;…]` | [`SpiffeJwtAuthenticator`]: a JWT-SVID verified against the Workload API's JWT bundles |
//! | `userpass:<file>` | recognised, not supported (deprecated upstream) |
//!
//! Stricter than upstream, at startup instead of on the first agent: an empty regex or one
//! without a capture group is refused (upstream then fails every agent with "agent ID is empty").
//!
//! # `xfcc:`
//!
//! `xfcc:` alone (or `xfcc`) is the Istio profile with its defaults. Otherwise the config is
//! `;`-separated `key=value` items (no regex anywhere, so nothing to confuse with one); each key
//! at most once, unknown keys refused; lists are comma separated:
//!
//! | key | value | default |
//! |---|---|---|
//! | `profile` | `istio`, `envoy` or `linkerd`: the header format and defaults | `istio` |
//! | `trust-domain` | accepted trust domains, e.g. `cluster.local,prod.example` | `cluster.local` |
//! | `pattern` | SPIFFE path patterns, `{agent}` is the agent name, e.g. `/ns/{namespace}/sa/{agent}` | `/ns/{namespace}/sa/{agent}` |
//! | `namespaces` | only agents whose `{namespace}` is listed (not empty) | any namespace |
//! | `denied-namespaces` | agents whose `{namespace}` is listed are refused; empty for none | `istio-system` (istio), `linkerd` (linkerd), none (envoy) |
//! | `trusted-hops` | CIDRs or addresses the header is believed from (not empty) | `127.0.0.0/8,::1/128` |
//! | `header` | the header to read, in the profile's format | `x-forwarded-client-cert` (istio, envoy), `l5d-client-id` (linkerd) |
//!
//! e.g. `xfcc:profile=istio;trust-domain=cluster.local;pattern=/ns/{namespace}/sa/{agent};namespaces=agents;trusted-hops=127.0.0.1/32,::1/128;header=x-forwarded-client-cert`.
//!
//! # `spiffe:x509` and `spiffe:jwt`
//!
//! Both use the SPIFFE Workload API (`SPIFFE_ENDPOINT_SOCKET`, or the `endpoint` key). Options
//! follow the method after a `:`, as `;`-separated `key=value` items like `xfcc:`:
//!
//! | key | value | default |
//! |---|---|---|
//! | `trust-domain` | accepted trust domains, comma separated | `cluster.local` |
//! | `pattern` | SPIFFE path patterns, `{agent}` is the agent name | `/ns/{namespace}/sa/{agent}` |
//! | `namespaces` | only agents whose `{namespace}` is listed | any namespace |
//! | `denied-namespaces` | agents whose `{namespace}` is listed are refused | none |
//! | `endpoint` | the Workload API endpoint, e.g. `unix:///run/spire/sockets/agent.sock` | `SPIFFE_ENDPOINT_SOCKET` |
//! | `audience` | (`spiffe:jwt` only) the audience JWT-SVIDs must carry | `argocd-agent-principal` |
//!
//! e.g. `spiffe:x509:trust-domain=prod.example;pattern=/ns/{namespace}/sa/{agent};namespaces=agents`
//! or `spiffe:jwt:audience=argocd-agent-principal;trust-domain=prod.example`.
//!
//! `spiffe:x509` needs TLS served with [`mesh::workload::X509Identity::server_config`] (client
//! SVIDs required and verified against the Workload API bundles). `spiffe:jwt` needs a Workload
//! API connection for its JWT bundles: build it with [`AuthMethodSpec::connect_authenticator`]
//! ([`AuthMethodSpec::authenticator`] returns one that refuses every call).
//!
//! # `header:`
//!
//! `header:<header-name>:<regex>` as upstream: the header name (case-insensitive) ends at the
//! second `:`, the rest is the regex, whose capture group 1 is the agent name, e.g.
//! `header:x-forwarded-client-cert:^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)` or
//! `header:l5d-client-id:^([^.]+)\..*`. Unlike upstream the header is read only from trusted
//! hops: loopback, unless [`AuthMethodSpec::with_trusted_hops`] says otherwise.
//!
//! # Listener
//!
//! Both header-based methods need a plaintext listener behind the sidecar (TLS terminates in the
//! sidecar) and trust restricted to the sidecar or known proxies; `mtls` needs TLS. Check with
//! [`check_listener`] at startup.

mod error;
mod parse;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use mesh::workload::JwtIdentity;
use mesh::{MeshProfile, SpiffePolicy, TrustedHops};
use regex::Regex;

pub use error::SpecError;

use super::Authenticator;
use super::forwarded::describe;
use super::header::HeaderAuthenticator;
use super::mtls::{IdentitySource, MtlsAuthenticator};
use super::spiffe_jwt::SpiffeJwtAuthenticator;
use super::spiffe_x509::SpiffeX509Authenticator;
use super::xfcc::XfccAuthenticator;

/// The regex upstream's documentation and `argocd-agentctl pki issue agent` pair with: agent
/// client certificates carry the agent name as their CN.
pub const DEFAULT_SUBJECT_REGEX: &str = "CN=([^,]+)";

/// The keys `xfcc:` accepts, as error messages list them.
pub const XFCC_KEYS: &str = "profile, trust-domain, pattern, namespaces, denied-namespaces, trusted-hops, header";

/// The keys `spiffe:x509` accepts, as error messages list them.
pub const SPIFFE_X509_KEYS: &str = "trust-domain, pattern, namespaces, denied-namespaces, endpoint";

/// The keys `spiffe:jwt` accepts, as error messages list them.
pub const SPIFFE_JWT_KEYS: &str = "trust-domain, pattern, namespaces, denied-namespaces, endpoint, audience";

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
    /// `xfcc:[key=value;…]`: the SPIFFE ID a mesh sidecar forwards, checked by a policy.
    Xfcc {
        /// The mesh: header format and defaults.
        profile: MeshProfile,
        /// The header read.
        header: HeaderName,
        /// Which SPIFFE IDs are agents.
        policy: SpiffePolicy,
        /// The hops the header is believed from; `None`: loopback (the default).
        trusted_hops: Option<TrustedHops>,
    },
    /// `spiffe:x509[:key=value;…]`: the verified client X.509-SVID's SPIFFE ID, checked by a policy.
    SpiffeX509 {
        /// Which SPIFFE IDs are agents.
        policy: SpiffePolicy,
        /// The Workload API endpoint; `None`: `SPIFFE_ENDPOINT_SOCKET`.
        endpoint: Option<String>,
    },
    /// `spiffe:jwt[:key=value;…]`: a JWT-SVID for `audience`, verified against the Workload API's
    /// JWT bundles, its subject checked by a policy.
    SpiffeJwt {
        /// Which SPIFFE IDs are agents.
        policy: SpiffePolicy,
        /// The audience JWT-SVIDs must carry.
        audience: String,
        /// The Workload API endpoint; `None`: `SPIFFE_ENDPOINT_SOCKET`.
        endpoint: Option<String>,
    },
    /// `header:<name>:<regex>`: upstream's regex over a forwarded header.
    Header {
        /// The header read (lower case).
        header: HeaderName,
        /// The agent name regex (capture group 1).
        regex: Regex,
        /// The hops the header is believed from; `None`: loopback (the default).
        trusted_hops: Option<TrustedHops>,
    },
}

impl AuthMethodSpec {
    /// The SPIFFE Workload API endpoint a `spiffe:` method was configured with (`None`:
    /// `SPIFFE_ENDPOINT_SOCKET`, or not a `spiffe:` method).
    #[must_use]
    pub fn workload_endpoint(&self) -> Option<&str> {
        match self {
            Self::SpiffeX509 { endpoint, .. } | Self::SpiffeJwt { endpoint, .. } => endpoint.as_deref(),
            _ => None,
        }
    }

    /// Whether the method needs the SPIFFE Workload API (`spiffe:x509` for the TLS config,
    /// `spiffe:jwt` for the JWT bundles).
    #[must_use]
    pub fn uses_workload_api(&self) -> bool {
        matches!(self, Self::SpiffeX509 { .. } | Self::SpiffeJwt { .. })
    }

    /// Builds the authenticator, connecting to the SPIFFE Workload API when the method needs it
    /// in the authenticator (`spiffe:jwt`: waits at most `initial_sync_timeout` for the JWT
    /// bundles). For every other method the same as [`Self::authenticator`].
    ///
    /// # Errors
    ///
    /// [`SpecError::WorkloadApi`] when the Workload API gives no JWT bundles in time.
    pub async fn connect_authenticator(
        &self,
        initial_sync_timeout: std::time::Duration,
    ) -> Result<Arc<dyn Authenticator>, SpecError> {
        match self {
            Self::SpiffeJwt { policy, audience, endpoint } => {
                let jwt = JwtIdentity::connect(endpoint.as_deref(), initial_sync_timeout)
                    .await
                    .map_err(|source| SpecError::WorkloadApi { spec: self.to_string(), source: Box::new(source) })?;
                Ok(Arc::new(SpiffeJwtAuthenticator::new(policy.clone(), audience.clone(), jwt)))
            }
            _ => Ok(self.authenticator()),
        }
    }

    /// The method name agents send in `AuthRequest.method`: `mtls`, or `header` for both
    /// header-based methods (what `--creds header:` agents send).
    #[must_use]
    pub fn method(&self) -> &'static str {
        match self {
            Self::Mtls { .. } => MtlsAuthenticator::METHOD,
            Self::Xfcc { .. } => XfccAuthenticator::METHOD,
            Self::Header { .. } => HeaderAuthenticator::METHOD,
            Self::SpiffeX509 { .. } => SpiffeX509Authenticator::METHOD,
            Self::SpiffeJwt { .. } => SpiffeJwtAuthenticator::METHOD,
        }
    }

    /// Whether the method needs the principal to serve TLS and request client certificates
    /// (upstream refuses `mtls` with `--insecure-plaintext` and forces `--require-client-certs`).
    #[must_use]
    pub fn requires_client_certificates(&self) -> bool {
        matches!(self, Self::Mtls { .. } | Self::SpiffeX509 { .. })
    }

    /// Whether the method reads an identity header a sidecar forwards, so the principal must serve
    /// plaintext behind that sidecar (upstream: `header` requires `--insecure-plaintext`).
    #[must_use]
    pub fn requires_plaintext_behind_proxy(&self) -> bool {
        matches!(self, Self::Xfcc { .. } | Self::Header { .. })
    }

    /// The hops a header-based method believes its header from (loopback unless configured);
    /// `None` for `mtls`.
    #[must_use]
    pub fn trusted_hops(&self) -> Option<TrustedHops> {
        match self {
            Self::Mtls { .. } | Self::SpiffeX509 { .. } | Self::SpiffeJwt { .. } => None,
            Self::Xfcc { trusted_hops, .. } | Self::Header { trusted_hops, .. } => {
                Some(trusted_hops.clone().unwrap_or_default())
            }
        }
    }

    /// Sets the trusted hops of a header-based method (e.g. from a CLI flag; `header:` has no
    /// place for them in its syntax).
    ///
    /// # Errors
    ///
    /// [`SpecError::TrustedHopsConflict`] for `mtls`, or when `xfcc:` already sets `trusted-hops`.
    pub fn with_trusted_hops(mut self, hops: TrustedHops) -> Result<Self, SpecError> {
        let conflict = |spec: &Self, reason| SpecError::TrustedHopsConflict { spec: spec.to_string(), reason };
        match &mut self {
            Self::Mtls { .. } => Err(conflict(&self, "mtls reads no forwarded header")),
            Self::SpiffeX509 { .. } | Self::SpiffeJwt { .. } => {
                Err(conflict(&self, "spiffe methods verify SVIDs themselves and read no forwarded header"))
            }
            Self::Xfcc { trusted_hops: Some(_), .. } => {
                Err(conflict(&self, "the xfcc: value already sets trusted-hops; set them in one place"))
            }
            Self::Xfcc { trusted_hops, .. } | Self::Header { trusted_hops, .. } => {
                *trusted_hops = Some(hops);
                Ok(self)
            }
        }
    }

    /// [`check_listener`] with this spec's own trusted hops.
    ///
    /// # Errors
    ///
    /// As [`check_listener`].
    pub fn check_listener(&self, plaintext: bool) -> Result<(), SpecError> {
        check_listener(self, plaintext, &self.trusted_hops().unwrap_or_default())
    }

    /// Builds the authenticator. For `spiffe:jwt` it has no Workload API connection and refuses
    /// every call: use [`Self::connect_authenticator`].
    #[must_use]
    pub fn authenticator(&self) -> Arc<dyn Authenticator> {
        match self {
            Self::Mtls { source, regex, .. } => Arc::new(MtlsAuthenticator::new(*source, regex.clone())),
            Self::Xfcc { profile, header, policy, trusted_hops } => Arc::new(
                XfccAuthenticator::new(*profile, policy.clone(), trusted_hops.clone().unwrap_or_default())
                    .with_header(header.clone()),
            ),
            Self::Header { header, regex, trusted_hops } => Arc::new(HeaderAuthenticator::new(
                header.clone(),
                regex.clone(),
                trusted_hops.clone().unwrap_or_default(),
            )),
            Self::SpiffeX509 { policy, .. } => Arc::new(SpiffeX509Authenticator::new(policy.clone())),
            Self::SpiffeJwt { policy, audience, .. } => {
                Arc::new(SpiffeJwtAuthenticator::unconnected(policy.clone(), audience.clone()))
            }
        }
    }
}

/// Startup check of the listener against the method: header-based methods need a plaintext
/// listener (the sidecar terminates TLS) and `trusted_hops` that neither trust every source (a
/// `/0` network, upstream's behaviour) nor none; `mtls` needs TLS.
///
/// # Errors
///
/// [`SpecError::PlaintextRequired`], [`SpecError::TlsRequired`] or
/// [`SpecError::UnrestrictedTrust`].
pub fn check_listener(spec: &AuthMethodSpec, plaintext: bool, trusted_hops: &TrustedHops) -> Result<(), SpecError> {
    if spec.requires_client_certificates() && plaintext {
        return Err(SpecError::TlsRequired { spec: spec.to_string() });
    }
    if !spec.requires_plaintext_behind_proxy() {
        return Ok(());
    }
    if !plaintext {
        return Err(SpecError::PlaintextRequired { spec: spec.to_string() });
    }
    let unrestricted =
        |reason| SpecError::UnrestrictedTrust { spec: spec.to_string(), trusted: describe(trusted_hops), reason };
    if trusted_hops.networks().is_empty() {
        return Err(unrestricted("trust no source, so every agent would be refused"));
    }
    if trusted_hops.networks().iter().any(|n| n.prefix() == 0) {
        return Err(unrestricted("include a /0 network, which trusts every source"));
    }
    Ok(())
}

fn join<T: fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    items.into_iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

fn write_spiffe_options(f: &mut fmt::Formatter<'_>, policy: &SpiffePolicy, endpoint: Option<&str>) -> fmt::Result {
    write!(f, "trust-domain={};pattern={}", join(policy.trust_domains()), join(policy.patterns()))?;
    if let Some(allowed) = policy.allowed_namespaces() {
        write!(f, ";namespaces={}", join(allowed))?;
    }
    if !policy.denied_namespaces().is_empty() {
        write!(f, ";denied-namespaces={}", join(policy.denied_namespaces()))?;
    }
    if let Some(endpoint) = endpoint {
        write!(f, ";endpoint={endpoint}")?;
    }
    Ok(())
}

impl fmt::Display for AuthMethodSpec {
    /// The canonical `--auth` form (the deprecated `mtls:<regex>` prints as `mtls:subject:<regex>`;
    /// `xfcc:` prints every key, so the defaults it ran with are visible in logs).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Mtls { source, regex, .. } => write!(f, "mtls:{source}:{regex}"),
            Self::Header { header, regex, .. } => write!(f, "header:{header}:{regex}"),
            Self::SpiffeX509 { policy, endpoint } => {
                f.write_str("spiffe:x509:")?;
                write_spiffe_options(f, policy, endpoint.as_deref())
            }
            Self::SpiffeJwt { policy, audience, endpoint } => {
                write!(f, "spiffe:jwt:audience={audience};")?;
                write_spiffe_options(f, policy, endpoint.as_deref())
            }
            Self::Xfcc { profile, header, policy, trusted_hops } => {
                write!(
                    f,
                    "xfcc:profile={profile};trust-domain={};pattern={}",
                    join(policy.trust_domains()),
                    join(policy.patterns())
                )?;
                if let Some(allowed) = policy.allowed_namespaces() {
                    write!(f, ";namespaces={}", join(allowed))?;
                }
                let hops = trusted_hops.clone().unwrap_or_default();
                write!(
                    f,
                    ";denied-namespaces={};trusted-hops={};header={header}",
                    join(policy.denied_namespaces()),
                    join(hops.networks())
                )
            }
        }
    }
}
