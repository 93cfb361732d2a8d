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
//! | `spiffe-jwt:<regex>` | upstream v0.10's form of the same: capture group 1 of a regex over the JWT-SVID's SPIFFE ID ([`JwtSubjects::Regex`]) |
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
//! # Upstream's SPIRE defaults
//!
//! Upstream v0.10's principal with `--spire-agent-socket` and an empty `--auth` uses
//! [`SPIRE_MTLS_DEFAULT`] (`--spire-auth-method mtls`) or [`SPIRE_JWT_DEFAULT`] (`jwt`), and
//! audience `argocd-agent-principal`; [`AuthMethodSpec::spire_default`] gives the same. The
//! socket becomes the Workload API endpoint ([`AuthMethodSpec::with_workload_endpoint`]).
//! `spiffe-jwt` sessions are bound on every call unless the principal opts in to upstream's
//! login-only binding ([`AuthMethodSpec::with_jwt_binding`], [`JwtSessionBinding`]).
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
pub use super::spiffe_jwt::{JwtSessionBinding, JwtSubjects};
use super::spiffe_x509::SpiffeX509Authenticator;
use super::xfcc::XfccAuthenticator;

/// The regex upstream's documentation and `argocd-agentctl pki issue agent` pair with: agent
/// client certificates carry the agent name as their CN.
pub const DEFAULT_SUBJECT_REGEX: &str = "CN=([^,]+)";

/// Upstream's `--auth` when SPIRE is on with `--spire-auth-method mtls` and `--auth` is empty.
pub const SPIRE_MTLS_DEFAULT: &str = "mtls:uri:spiffe://[^/]+/(.+)";

/// Upstream's `--auth` when SPIRE is on with `--spire-auth-method jwt` and `--auth` is empty.
pub const SPIRE_JWT_DEFAULT: &str = "spiffe-jwt:spiffe://[^/]+/(.+)";

/// Upstream's `--spire-auth-method`: which SVID agents authenticate with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpireAuthMethod {
    /// `mtls`: the X.509-SVID as TLS client certificate (method name `mtls`).
    Mtls,
    /// `jwt`: a JWT-SVID on `Authenticate` (method name `spiffe-jwt`).
    Jwt,
}

impl std::str::FromStr for SpireAuthMethod {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "mtls" => Ok(Self::Mtls),
            "jwt" => Ok(Self::Jwt),
            other => Err(format!("must be 'jwt' or 'mtls', got {other:?}")),
        }
    }
}

impl fmt::Display for SpireAuthMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Mtls => "mtls",
            Self::Jwt => "jwt",
        })
    }
}

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
        /// What later calls present besides the session token.
        binding: JwtSessionBinding,
    },
    /// Upstream's `spiffe-jwt:<regex>`: a JWT-SVID for `audience`, its whole SPIFFE ID matched by
    /// a regex whose capture group 1 is the agent name (any trust domain with a JWT bundle).
    SpiffeJwtRegex {
        /// The agent name regex (capture group 1).
        regex: Regex,
        /// The audience JWT-SVIDs must carry (upstream: always `argocd-agent-principal`).
        audience: String,
        /// The Workload API endpoint; `None`: `SPIFFE_ENDPOINT_SOCKET`.
        endpoint: Option<String>,
        /// What later calls present besides the session token.
        binding: JwtSessionBinding,
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
            Self::SpiffeX509 { endpoint, .. }
            | Self::SpiffeJwt { endpoint, .. }
            | Self::SpiffeJwtRegex { endpoint, .. } => endpoint.as_deref(),
            _ => None,
        }
    }

    /// Whether the method needs the SPIFFE Workload API (`spiffe:x509` for the TLS config,
    /// `spiffe:jwt` for the JWT bundles).
    #[must_use]
    pub fn uses_workload_api(&self) -> bool {
        matches!(self, Self::SpiffeX509 { .. } | Self::SpiffeJwt { .. } | Self::SpiffeJwtRegex { .. })
    }

    /// Upstream's `--auth` for SPIRE when `--auth` is empty ([`SPIRE_MTLS_DEFAULT`] or
    /// [`SPIRE_JWT_DEFAULT`]), reading the Workload API at `endpoint`.
    ///
    /// # Errors
    ///
    /// None in practice: both defaults parse (unit-tested).
    pub fn spire_default(method: SpireAuthMethod, endpoint: Option<&str>) -> Result<Self, SpecError> {
        let spec = match method {
            SpireAuthMethod::Mtls => SPIRE_MTLS_DEFAULT,
            SpireAuthMethod::Jwt => SPIRE_JWT_DEFAULT,
        };
        Ok(Self::parse(spec)?.with_workload_endpoint(endpoint))
    }

    /// Gives a `spiffe` method without an `endpoint` the Workload API endpoint `endpoint`
    /// (upstream's `--spire-agent-socket`); other methods and set endpoints are unchanged.
    #[must_use]
    pub fn with_workload_endpoint(mut self, endpoint: Option<&str>) -> Self {
        if let (
            Self::SpiffeX509 { endpoint: slot @ None, .. }
            | Self::SpiffeJwt { endpoint: slot @ None, .. }
            | Self::SpiffeJwtRegex { endpoint: slot @ None, .. },
            Some(endpoint),
        ) = (&mut self, endpoint)
        {
            *slot = Some(endpoint.to_owned());
        }
        self
    }

    /// Sets what later calls of a JWT-SVID session must present ([`JwtSessionBinding`]).
    ///
    /// # Errors
    ///
    /// [`SpecError::NotJwt`] for a method other than `spiffe:jwt` and `spiffe-jwt:<regex>`.
    pub fn with_jwt_binding(mut self, new: JwtSessionBinding) -> Result<Self, SpecError> {
        match &mut self {
            Self::SpiffeJwt { binding, .. } | Self::SpiffeJwtRegex { binding, .. } => {
                *binding = new;
                Ok(self)
            }
            _ => Err(SpecError::NotJwt { spec: self.to_string() }),
        }
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
            Self::SpiffeJwt { endpoint, .. } | Self::SpiffeJwtRegex { endpoint, .. } => {
                let jwt = JwtIdentity::connect(endpoint.as_deref(), initial_sync_timeout)
                    .await
                    .map_err(|source| SpecError::WorkloadApi { spec: self.to_string(), source: Box::new(source) })?;
                Ok(self.jwt_authenticator(Some(jwt)))
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
            Self::SpiffeJwt { .. } | Self::SpiffeJwtRegex { .. } => SpiffeJwtAuthenticator::METHOD,
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
            Self::Mtls { .. } | Self::SpiffeX509 { .. } | Self::SpiffeJwt { .. } | Self::SpiffeJwtRegex { .. } => None,
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
            Self::SpiffeX509 { .. } | Self::SpiffeJwt { .. } | Self::SpiffeJwtRegex { .. } => {
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
            Self::SpiffeJwt { .. } | Self::SpiffeJwtRegex { .. } => self.jwt_authenticator(None),
        }
    }

    /// The JWT-SVID method of a `spiffe:jwt` or `spiffe-jwt:` spec (`jwt`: `None` refuses every
    /// call); for another spec its [`Self::authenticator`].
    fn jwt_authenticator(&self, jwt: Option<JwtIdentity>) -> Arc<dyn Authenticator> {
        let (subjects, audience, binding) = match self {
            Self::SpiffeJwt { policy, audience, binding, .. } => {
                (JwtSubjects::Policy(policy.clone()), audience.as_str(), *binding)
            }
            Self::SpiffeJwtRegex { regex, audience, binding, .. } => {
                (JwtSubjects::Regex(regex.clone()), audience.as_str(), *binding)
            }
            _ => return self.authenticator(),
        };
        Arc::new(SpiffeJwtAuthenticator::with_subjects(subjects, audience, jwt).with_binding(binding))
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
            Self::SpiffeJwt { policy, audience, endpoint, .. } => {
                write!(f, "spiffe:jwt:audience={audience};")?;
                write_spiffe_options(f, policy, endpoint.as_deref())
            }
            Self::SpiffeJwtRegex { regex, .. } => write!(f, "spiffe-jwt:{regex}"),
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
