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

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use mesh::workload::{JwtIdentity, WorkloadError};
use mesh::{MeshProfile, PathPattern, SpiffePolicy, TrustDomain, TrustedHops};
use regex::Regex;

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

const XFCC_KEY_LIST: [&str; 7] =
    ["profile", "trust-domain", "pattern", "namespaces", "denied-namespaces", "trusted-hops", "header"];

const XFCC_EXAMPLE: &str = "xfcc:profile=istio;trust-domain=cluster.local;pattern=/ns/{namespace}/sa/{agent}";

/// The keys `spiffe:x509` accepts, as error messages list them.
pub const SPIFFE_X509_KEYS: &str = "trust-domain, pattern, namespaces, denied-namespaces, endpoint";

/// The keys `spiffe:jwt` accepts, as error messages list them.
pub const SPIFFE_JWT_KEYS: &str = "trust-domain, pattern, namespaces, denied-namespaces, endpoint, audience";

const SPIFFE_KEY_LIST: [&str; 6] =
    ["trust-domain", "pattern", "namespaces", "denied-namespaces", "endpoint", "audience"];

const SPIFFE_DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

const HEADER_EXAMPLE: &str = "header:x-forwarded-client-cert:^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)";

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

/// Why an `--auth` value was refused, or does not fit the listener.
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
        "--auth method \"{0}\" is unknown: use mtls:subject:<regex>, mtls:uri:<regex>, xfcc:[key=value;...], \
         header:<header-name>:<regex>, spiffe:x509[:key=value;...] or spiffe:jwt[:key=value;...] (upstream also \
         knows userpass)"
    )]
    UnknownMethod(String),
    /// A method that is recognised but not implemented yet.
    #[error("--auth method \"{method}\" is recognised but not supported yet: {reason}")]
    NotSupportedYet {
        /// The method as written (`spiffe:x509`, `userpass`, …).
        method: String,
        /// Why, and what to use meanwhile.
        reason: &'static str,
    },
    /// An empty agent name regex.
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
    /// `header:` without a header name or without a regex.
    #[error("--auth \"{spec}\" is not header:<header-name>:<regex>, e.g. --auth '{HEADER_EXAMPLE}'")]
    HeaderSyntax {
        /// The `--auth` value.
        spec: String,
    },
    /// Not a valid HTTP header name.
    #[error("--auth \"{spec}\": \"{name}\" is not a valid header name")]
    BadHeaderName {
        /// The `--auth` value.
        spec: String,
        /// The name as given.
        name: String,
    },
    /// An `xfcc:` item that is not `key=value`, or a key given twice.
    #[error(
        "--auth \"{spec}\": {reason}; the syntax is xfcc:[key=value;...] with keys {XFCC_KEYS}, \
         e.g. --auth '{XFCC_EXAMPLE}'"
    )]
    XfccSyntax {
        /// The `--auth` value.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// An `xfcc:` key that does not exist.
    #[error("--auth \"{spec}\": unknown xfcc key \"{key}\"; valid keys: {XFCC_KEYS}")]
    XfccUnknownKey {
        /// The `--auth` value.
        spec: String,
        /// The unknown key.
        key: String,
    },
    /// An `xfcc:` value that is not valid for its key.
    #[error("--auth \"{spec}\": xfcc key {key}: {reason}")]
    XfccValue {
        /// The `--auth` value.
        spec: String,
        /// The key.
        key: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
    /// Trusted hops set twice (in `xfcc:` and by the caller), or for a method that reads no header.
    #[error("trusted hops cannot be set for --auth \"{spec}\": {reason}")]
    TrustedHopsConflict {
        /// The `--auth` value.
        spec: String,
        /// Why.
        reason: &'static str,
    },
    /// A `spiffe:` item that is not `key=value`, a key given twice, or an unknown key.
    #[error("--auth \"{spec}\": {reason}; the syntax is spiffe:{kind}[:key=value;...] with keys {keys}")]
    SpiffeSyntax {
        /// The `--auth` value.
        spec: String,
        /// `x509` or `jwt`.
        kind: &'static str,
        /// What is wrong.
        reason: String,
        /// The valid keys.
        keys: &'static str,
    },
    /// A `spiffe:` value that is not valid for its key.
    #[error("--auth \"{spec}\": spiffe key {key}: {reason}")]
    SpiffeValue {
        /// The `--auth` value.
        spec: String,
        /// The key.
        key: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
    /// The SPIFFE Workload API could not be reached for a `spiffe:` method.
    #[error("--auth \"{spec}\": {source}")]
    WorkloadApi {
        /// The `--auth` value.
        spec: String,
        /// What failed.
        #[source]
        source: Box<WorkloadError>,
    },
    /// A header-based method on a TLS listener.
    #[error(
        "--auth \"{spec}\" reads the agent identity a mesh sidecar forwards, so the principal must serve \
         plaintext gRPC behind the sidecar (--insecure-plaintext): TLS and client certificates are the \
         sidecar's job"
    )]
    PlaintextRequired {
        /// The `--auth` value.
        spec: String,
    },
    /// `mtls` on a plaintext listener.
    #[error(
        "--auth \"{spec}\" identifies agents by their TLS client certificate, which a plaintext listener \
         (--insecure-plaintext) never sees: serve TLS, or behind a mesh sidecar use --auth xfcc: or \
         header:<name>:<regex>"
    )]
    TlsRequired {
        /// The `--auth` value.
        spec: String,
    },
    /// Trusted hops that trust every source (a `/0` network) or none.
    #[error(
        "--auth \"{spec}\": trusted hops ({trusted}) {reason}; header-based methods believe the identity header only \
         from the sidecar (loopback, the default) or listed proxy addresses (upstream trusts any caller that \
         reaches the plaintext port; this principal does not)"
    )]
    UnrestrictedTrust {
        /// The `--auth` value.
        spec: String,
        /// The trusted networks.
        trusted: String,
        /// What is wrong with them.
        reason: &'static str,
    },
}

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
            return match spec {
                "xfcc" => Self::parse_xfcc(spec, ""),
                "mtls" | "header" | "userpass" | "spiffe" => Err(SpecError::MissingConfig(spec.to_owned())),
                other => Err(SpecError::UnknownMethod(other.to_owned())),
            };
        };
        match method {
            "mtls" => Self::parse_mtls(spec, config),
            "xfcc" => Self::parse_xfcc(spec, config),
            "header" => Self::parse_header(spec, config),
            "spiffe" => {
                let (kind, options) = config.split_once(':').unwrap_or((config, ""));
                match kind {
                    "x509" => Self::parse_spiffe(spec, "x509", options),
                    "jwt" => Self::parse_spiffe(spec, "jwt", options),
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
        let regex = agent_regex(spec, pattern)?;
        Ok(Self::Mtls { source, regex, deprecated_syntax })
    }

    fn parse_header(spec: &str, config: &str) -> Result<Self, SpecError> {
        let Some((name, pattern)) = config.split_once(':') else {
            return Err(SpecError::HeaderSyntax { spec: spec.to_owned() });
        };
        if name.is_empty() {
            return Err(SpecError::HeaderSyntax { spec: spec.to_owned() });
        }
        let header = header_name(name)
            .ok_or_else(|| SpecError::BadHeaderName { spec: spec.to_owned(), name: name.to_owned() })?;
        let regex = agent_regex(spec, pattern)?;
        Ok(Self::Header { header, regex, trusted_hops: None })
    }

    fn parse_xfcc(spec: &str, config: &str) -> Result<Self, SpecError> {
        let syntax = |reason: String| SpecError::XfccSyntax { spec: spec.to_owned(), reason };
        let unknown = |key: &str| SpecError::XfccUnknownKey { spec: spec.to_owned(), key: key.to_owned() };
        let items =
            parse_options(config, |k| XFCC_KEY_LIST.iter().copied().find(|known| *known == k), &syntax, &unknown)?;
        let value_error =
            |key: &'static str, reason: String| SpecError::XfccValue { spec: spec.to_owned(), key, reason };
        let list = |key: &'static str| option_list(&items, key);
        let non_empty = |key: &'static str| option_non_empty(&items, key, &value_error);

        let profile = match items.get("profile") {
            Some(name) => name.parse::<MeshProfile>().map_err(|e| value_error("profile", e.to_string()))?,
            None => MeshProfile::Istio,
        };
        let defaults = profile.default_policy();
        let trust_domains = match non_empty("trust-domain")? {
            Some(names) => names
                .into_iter()
                .map(|n| TrustDomain::new(n).map_err(|e| value_error("trust-domain", format!("{n:?}: {e}"))))
                .collect::<Result<Vec<_>, _>>()?,
            None => defaults.trust_domains().to_vec(),
        };
        let patterns = match non_empty("pattern")? {
            Some(patterns) => patterns
                .into_iter()
                .map(|p| PathPattern::new(p).map_err(|e| value_error("pattern", e.to_string())))
                .collect::<Result<Vec<_>, _>>()?,
            None => defaults.patterns().to_vec(),
        };
        let mut policy =
            SpiffePolicy::new(trust_domains, patterns).map_err(|e| value_error("pattern", e.to_string()))?;
        let denied: Vec<String> = match list("denied-namespaces") {
            Some(names) => names.into_iter().map(str::to_owned).collect(),
            None => defaults.denied_namespaces().iter().cloned().collect(),
        };
        if !denied.is_empty() {
            let key = if items.contains_key("denied-namespaces") { "denied-namespaces" } else { "pattern" };
            policy = policy.with_denied_namespaces(denied).map_err(|e| {
                value_error(
                    key,
                    format!(
                        "{e} (the {profile} profile denies its mesh namespace; give denied-namespaces= to deny none)"
                    ),
                )
            })?;
        }
        if let Some(allowed) = non_empty("namespaces")? {
            policy = policy.with_allowed_namespaces(allowed).map_err(|e| value_error("namespaces", e.to_string()))?;
        }
        let trusted_hops = match items.get("trusted-hops") {
            Some(list) => {
                let hops = TrustedHops::parse_list(list).map_err(|e| value_error("trusted-hops", e.to_string()))?;
                if hops.networks().is_empty() {
                    return Err(value_error("trusted-hops", "the list is empty; omit the key for loopback".to_owned()));
                }
                Some(hops)
            }
            None => None,
        };
        let header = match items.get("header") {
            Some(name) => header_name(name)
                .ok_or_else(|| value_error("header", format!("{name:?} is not a valid header name")))?,
            None => HeaderName::from_static(profile.identity_header().name()),
        };
        Ok(Self::Xfcc { profile, header, policy, trusted_hops })
    }

    fn parse_spiffe(spec: &str, kind: &'static str, config: &str) -> Result<Self, SpecError> {
        let keys = if kind == "jwt" { SPIFFE_JWT_KEYS } else { SPIFFE_X509_KEYS };
        let syntax = |reason: String| SpecError::SpiffeSyntax { spec: spec.to_owned(), kind, reason, keys };
        let unknown = |key: &str| syntax(format!("unknown key \"{key}\""));
        let known = |k: &str| {
            SPIFFE_KEY_LIST.iter().copied().find(|known| *known == k && (kind == "jwt" || *known != "audience"))
        };
        let items = parse_options(config, known, &syntax, &unknown)?;
        let value_error =
            |key: &'static str, reason: String| SpecError::SpiffeValue { spec: spec.to_owned(), key, reason };
        let list = |key: &'static str| option_list(&items, key);
        let non_empty = |key: &'static str| option_non_empty(&items, key, &value_error);
        let trust_domains = non_empty("trust-domain")?
            .unwrap_or_else(|| vec![SPIFFE_DEFAULT_TRUST_DOMAIN])
            .into_iter()
            .map(|n| TrustDomain::new(n).map_err(|e| value_error("trust-domain", format!("{n:?}: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let patterns = non_empty("pattern")?
            .unwrap_or_else(|| vec![mesh::policy::KUBERNETES_PATTERN])
            .into_iter()
            .map(|p| PathPattern::new(p).map_err(|e| value_error("pattern", e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let mut policy =
            SpiffePolicy::new(trust_domains, patterns).map_err(|e| value_error("pattern", e.to_string()))?;
        if let Some(denied) = list("denied-namespaces").filter(|d| !d.is_empty()) {
            policy =
                policy.with_denied_namespaces(denied).map_err(|e| value_error("denied-namespaces", e.to_string()))?;
        }
        if let Some(allowed) = non_empty("namespaces")? {
            policy = policy.with_allowed_namespaces(allowed).map_err(|e| value_error("namespaces", e.to_string()))?;
        }
        let endpoint = match items.get("endpoint").copied() {
            Some("") => {
                return Err(value_error("endpoint", "empty; omit the key for SPIFFE_ENDPOINT_SOCKET".to_owned()));
            }
            Some(endpoint) => Some(endpoint.to_owned()),
            None => None,
        };
        if kind == "x509" {
            return Ok(Self::SpiffeX509 { policy, endpoint });
        }
        let audience = match items.get("audience").copied() {
            Some("") => return Err(value_error("audience", "empty; omit the key for the default".to_owned())),
            Some(audience) if audience.contains(',') => {
                return Err(value_error("audience", "give exactly one audience".to_owned()));
            }
            Some(audience) => audience.to_owned(),
            None => SpiffeJwtAuthenticator::DEFAULT_AUDIENCE.to_owned(),
        };
        Ok(Self::SpiffeJwt { policy, audience, endpoint })
    }

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

/// A compiled agent name regex: not empty, with a capture group.
fn agent_regex(spec: &str, pattern: &str) -> Result<Regex, SpecError> {
    if pattern.is_empty() {
        return Err(SpecError::EmptyRegex { spec: spec.to_owned() });
    }
    let regex = Regex::new(pattern).map_err(|source| SpecError::InvalidRegex { spec: spec.to_owned(), source })?;
    if regex.captures_len() < 2 {
        return Err(SpecError::NoCaptureGroup { spec: spec.to_owned() });
    }
    Ok(regex)
}

/// A header name, lower-cased as upstream does (gRPC metadata keys are lower case).
fn header_name(name: &str) -> Option<HeaderName> {
    HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes()).ok()
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

/// The `key=value;key=value` options of `xfcc:` and `spiffe:` methods: every item non-empty,
/// `key=value`, a key `known` maps to its canonical name, and no key twice.
fn parse_options<'a>(
    config: &'a str,
    known: impl Fn(&str) -> Option<&'static str>,
    syntax: &dyn Fn(String) -> SpecError,
    unknown: &dyn Fn(&str) -> SpecError,
) -> Result<BTreeMap<&'static str, &'a str>, SpecError> {
    let mut items = BTreeMap::new();
    if config.trim().is_empty() {
        return Ok(items);
    }
    for item in config.split(';') {
        let item = item.trim();
        if item.is_empty() {
            return Err(syntax("an item is empty (two ';' in a row, or a trailing ';')".to_owned()));
        }
        let Some((key, value)) = item.split_once('=') else {
            return Err(syntax(format!("\"{item}\" is not key=value")));
        };
        let key = key.trim();
        let Some(known) = known(key) else {
            return Err(unknown(key));
        };
        if items.insert(known, value.trim()).is_some() {
            return Err(syntax(format!("key {known} is given twice")));
        }
    }
    Ok(items)
}

/// An option's comma-separated values, blanks dropped; `None` when the key is absent.
fn option_list<'a>(items: &BTreeMap<&'static str, &'a str>, key: &'static str) -> Option<Vec<&'a str>> {
    items.get(key).map(|v| v.split(',').map(str::trim).filter(|s| !s.is_empty()).collect())
}

/// Like [`option_list`], but a key given with no values is an error (omit it for the default).
fn option_non_empty<'a>(
    items: &BTreeMap<&'static str, &'a str>,
    key: &'static str,
    value_error: &dyn Fn(&'static str, String) -> SpecError,
) -> Result<Option<Vec<&'a str>>, SpecError> {
    match option_list(items, key) {
        Some(values) if values.is_empty() => {
            Err(value_error(key, "the list is empty; omit the key for the default".to_owned()))
        }
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mtls(spec: &str) -> (IdentitySource, String, bool) {
        match AuthMethodSpec::parse(spec).expect("parses") {
            AuthMethodSpec::Mtls { source, regex, deprecated_syntax } => (source, regex.to_string(), deprecated_syntax),
            other => panic!("{spec}: {other:?}"),
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
    fn userpass_is_recognised_but_not_supported() {
        match AuthMethodSpec::parse("userpass:/etc/users") {
            Err(SpecError::NotSupportedYet { method, .. }) => assert_eq!(method, "userpass"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn spiffe_x509_defaults_and_options() {
        let spec = AuthMethodSpec::parse("spiffe:x509").expect("parses");
        let AuthMethodSpec::SpiffeX509 { policy, endpoint } = &spec else { panic!("{spec:?}") };
        assert_eq!(join(policy.trust_domains()), "cluster.local");
        assert_eq!(join(policy.patterns()), "/ns/{namespace}/sa/{agent}");
        assert!(policy.denied_namespaces().is_empty() && policy.allowed_namespaces().is_none());
        assert_eq!(endpoint, &None);
        assert_eq!(spec.method(), "spiffe-x509");
        assert!(spec.requires_client_certificates() && !spec.requires_plaintext_behind_proxy());
        assert!(spec.uses_workload_api() && spec.trusted_hops().is_none());
        assert!(matches!(spec.check_listener(true), Err(SpecError::TlsRequired { .. })));
        assert!(spec.check_listener(false).is_ok());
        assert_eq!(spec.authenticator().method(), "spiffe-x509");
        assert_eq!(spec.to_string(), "spiffe:x509:trust-domain=cluster.local;pattern=/ns/{namespace}/sa/{agent}");
        assert!(matches!(
            spec.clone().with_trusted_hops(TrustedHops::loopback()),
            Err(SpecError::TrustedHopsConflict { .. })
        ));

        let spec = AuthMethodSpec::parse(
            "spiffe:x509:trust-domain=prod.example,cluster.local; pattern=/agents/{namespace}/{agent};namespaces=a,b;\
             denied-namespaces=kube-system;endpoint=unix:///run/spire/agent.sock",
        )
        .expect("parses");
        let AuthMethodSpec::SpiffeX509 { policy, endpoint } = &spec else { panic!("{spec:?}") };
        assert_eq!(join(policy.trust_domains()), "prod.example,cluster.local");
        assert_eq!(policy.allowed_namespaces().map(join), Some("a,b".to_owned()));
        assert_eq!(join(policy.denied_namespaces()), "kube-system");
        assert_eq!(endpoint.as_deref(), Some("unix:///run/spire/agent.sock"));
        assert_eq!(spec.workload_endpoint(), Some("unix:///run/spire/agent.sock"));
        let again = AuthMethodSpec::parse(&spec.to_string()).expect("round trip");
        assert_eq!(again.to_string(), spec.to_string());
    }

    #[test]
    fn spiffe_jwt_defaults_and_options() {
        let spec = AuthMethodSpec::parse("spiffe:jwt").expect("parses");
        let AuthMethodSpec::SpiffeJwt { audience, .. } = &spec else { panic!("{spec:?}") };
        assert_eq!(audience, "argocd-agent-principal");
        assert_eq!(spec.method(), "spiffe-jwt");
        assert!(!spec.requires_client_certificates() && !spec.requires_plaintext_behind_proxy());
        assert!(spec.check_listener(true).is_ok() && spec.check_listener(false).is_ok());
        let spec =
            AuthMethodSpec::parse("spiffe:jwt:audience=principal.example;trust-domain=prod.example").expect("parses");
        assert_eq!(
            spec.to_string(),
            "spiffe:jwt:audience=principal.example;trust-domain=prod.example;pattern=/ns/{namespace}/sa/{agent}"
        );
        let again = AuthMethodSpec::parse(&spec.to_string()).expect("round trip");
        assert_eq!(again.to_string(), spec.to_string());
        // Without a Workload API connection the authenticator refuses with a reason.
        let t = crate::identity::TransportIdentity::plaintext(None);
        let h = http::HeaderMap::new();
        let creds = std::collections::HashMap::from([("token".to_owned(), "x.y.z".to_owned())]);
        let cx = super::super::AuthContext { transport: &t, metadata: &h, credentials: Some(&creds) };
        let err = spec.authenticator().authenticate(&cx).expect_err("unconnected");
        assert!(err.to_string().contains("connect_authenticator"), "{err}");
    }

    #[test]
    fn spiffe_errors_are_explained() {
        for (spec, needle) in [
            ("spiffe:x509:audience=a", "unknown key \"audience\""),
            ("spiffe:x509:trust_domain=a", "unknown key"),
            ("spiffe:jwt:audience", "is not key=value"),
            ("spiffe:jwt:audience=a;audience=b", "given twice"),
            ("spiffe:x509:pattern=/a;", "an item is empty"),
        ] {
            let err = AuthMethodSpec::parse(spec).expect_err(spec);
            assert!(matches!(err, SpecError::SpiffeSyntax { .. }), "{spec}: {err}");
            assert!(err.to_string().contains(needle), "{spec}: {err}");
        }
        assert!(AuthMethodSpec::parse("spiffe:x509:x=1").expect_err("x").to_string().contains(SPIFFE_X509_KEYS));
        for (spec, key) in [
            ("spiffe:x509:trust-domain=Bad.Domain", "trust-domain"),
            ("spiffe:x509:trust-domain=", "trust-domain"),
            ("spiffe:x509:pattern=/ns/{namespace}", "pattern"),
            ("spiffe:x509:pattern=/agent/{agent};namespaces=a", "namespaces"),
            ("spiffe:x509:endpoint=", "endpoint"),
            ("spiffe:jwt:audience=", "audience"),
            ("spiffe:jwt:audience=a,b", "audience"),
        ] {
            match AuthMethodSpec::parse(spec) {
                Err(SpecError::SpiffeValue { key: k, .. }) => assert_eq!(k, key, "{spec}"),
                other => panic!("{spec}: {other:?}"),
            }
        }
        assert!(matches!(AuthMethodSpec::parse("spiffe"), Err(SpecError::MissingConfig(_))));
    }

    fn xfcc(spec: &str) -> (MeshProfile, HeaderName, SpiffePolicy, Option<TrustedHops>) {
        match AuthMethodSpec::parse(spec).expect("parses") {
            AuthMethodSpec::Xfcc { profile, header, policy, trusted_hops } => (profile, header, policy, trusted_hops),
            other => panic!("{spec}: {other:?}"),
        }
    }

    fn xfcc_err(spec: &str) -> SpecError {
        AuthMethodSpec::parse(spec).expect_err(spec)
    }

    #[test]
    fn xfcc_alone_is_the_istio_profile() {
        for spec in ["xfcc:", "xfcc", "xfcc: "] {
            let (profile, header, policy, hops) = xfcc(spec);
            assert_eq!(profile, MeshProfile::Istio);
            assert_eq!(header.as_str(), "x-forwarded-client-cert");
            assert_eq!(policy, MeshProfile::Istio.default_policy());
            assert_eq!(hops, None);
        }
        let spec = AuthMethodSpec::parse("xfcc:").expect("parses");
        assert_eq!(spec.method(), "header");
        assert!(spec.requires_plaintext_behind_proxy() && !spec.requires_client_certificates());
        assert_eq!(spec.trusted_hops(), Some(TrustedHops::loopback()));
        assert_eq!(spec.authenticator().method(), "header");
        assert_eq!(
            spec.to_string(),
            "xfcc:profile=istio;trust-domain=cluster.local;pattern=/ns/{namespace}/sa/{agent};\
             denied-namespaces=istio-system;trusted-hops=127.0.0.0/8,::1/128;header=x-forwarded-client-cert"
        );
        // The canonical form parses back to the same configuration.
        let again = AuthMethodSpec::parse(&spec.to_string()).expect("round trip");
        assert_eq!(again.to_string(), spec.to_string());
    }

    #[test]
    fn xfcc_every_key() {
        let (profile, header, policy, hops) = xfcc(
            "xfcc:profile=envoy;trust-domain=cluster.local,prod.example;pattern=/ns/{namespace}/sa/{agent},\
             /agents/{namespace}/{agent};namespaces=a,b;denied-namespaces=kube-system;\
             trusted-hops=127.0.0.1/32,::1/128,10.0.0.7;header=X-Client-Identity",
        );
        assert_eq!(profile, MeshProfile::Envoy);
        assert_eq!(header.as_str(), "x-client-identity");
        assert_eq!(join(policy.trust_domains()), "cluster.local,prod.example");
        assert_eq!(join(policy.patterns()), "/ns/{namespace}/sa/{agent},/agents/{namespace}/{agent}");
        assert_eq!(policy.allowed_namespaces().map(join), Some("a,b".to_owned()));
        assert_eq!(join(policy.denied_namespaces()), "kube-system");
        assert_eq!(hops.map(|h| join(h.networks())), Some("127.0.0.1/32,::1/128,10.0.0.7/32".to_owned()));

        let (profile, header, policy, _) = xfcc("xfcc:profile=linkerd");
        assert_eq!((profile, header.as_str()), (MeshProfile::Linkerd, "l5d-client-id"));
        assert_eq!(policy, MeshProfile::Linkerd.default_policy());
        // denied-namespaces= (empty) denies none, so a pattern without {namespace} is allowed.
        let (_, _, policy, _) = xfcc("xfcc:pattern=/agent/{agent};denied-namespaces=");
        assert!(policy.denied_namespaces().is_empty());
        // Whitespace around items is tolerated.
        let (profile, ..) = xfcc("xfcc: profile = envoy ");
        assert_eq!(profile, MeshProfile::Envoy);
    }

    #[test]
    fn xfcc_errors_are_explained() {
        let err = xfcc_err("xfcc:profile=istio;trust_domain=x");
        assert!(matches!(&err, SpecError::XfccUnknownKey { key, .. } if key == "trust_domain"), "{err}");
        assert!(err.to_string().contains(XFCC_KEYS), "{err}");
        for (spec, needle) in [
            ("xfcc:profile", "\"profile\" is not key=value"),
            ("xfcc:profile=istio;", "an item is empty"),
            ("xfcc:profile=istio;;header=x", "an item is empty"),
            ("xfcc:profile=istio;profile=envoy", "key profile is given twice"),
        ] {
            let err = xfcc_err(spec);
            assert!(matches!(err, SpecError::XfccSyntax { .. }), "{spec}: {err}");
            assert!(err.to_string().contains(needle) && err.to_string().contains(XFCC_KEYS), "{spec}: {err}");
        }
        for (spec, key, needle) in [
            ("xfcc:profile=consul", "profile", "expected one of istio, linkerd, envoy"),
            ("xfcc:trust-domain=Cluster.Local", "trust-domain", "Cluster.Local"),
            ("xfcc:trust-domain=", "trust-domain", "the list is empty"),
            ("xfcc:pattern=ns/{namespace}/sa/{agent}", "pattern", "must start with '/'"),
            ("xfcc:pattern=/ns/{namespace}/sa/{sa}", "pattern", "no {agent} placeholder"),
            ("xfcc:pattern=/sa/{agent}", "pattern", "give denied-namespaces= to deny none"),
            ("xfcc:pattern=/sa/{agent};denied-namespaces=x", "denied-namespaces", "no {namespace} placeholder"),
            ("xfcc:namespaces=", "namespaces", "the list is empty"),
            ("xfcc:pattern=/sa/{agent};denied-namespaces=;namespaces=a", "namespaces", "no {namespace} placeholder"),
            ("xfcc:trusted-hops=", "trusted-hops", "the list is empty"),
            ("xfcc:trusted-hops=127.0.0.1/33", "trusted-hops", "prefix length"),
            ("xfcc:trusted-hops=localhost", "trusted-hops", "not an IP address"),
            ("xfcc:header=", "header", "not a valid header name"),
            ("xfcc:header=x forwarded", "header", "not a valid header name"),
        ] {
            match xfcc_err(spec) {
                SpecError::XfccValue { key: k, reason, .. } => {
                    assert_eq!(k, key, "{spec}");
                    assert!(reason.contains(needle), "{spec}: {reason}");
                }
                other => panic!("{spec}: {other:?}"),
            }
        }
    }

    #[test]
    fn header_mode_is_upstreams_syntax() {
        let istio = "header:X-Forwarded-Client-Cert:^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)";
        match AuthMethodSpec::parse(istio).expect("parses") {
            AuthMethodSpec::Header { header, regex, trusted_hops } => {
                assert_eq!(header.as_str(), "x-forwarded-client-cert");
                assert_eq!(regex.as_str(), "^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)");
                assert_eq!(trusted_hops, None);
            }
            other => panic!("{other:?}"),
        }
        let spec = AuthMethodSpec::parse(r"header:l5d-client-id:^([^.]+)\..*").expect("parses");
        assert_eq!(spec.to_string(), r"header:l5d-client-id:^([^.]+)\..*");
        assert_eq!((spec.method(), spec.authenticator().method()), ("header", "header"));
        assert!(spec.requires_plaintext_behind_proxy());
        // The regex may contain ':'.
        assert!(AuthMethodSpec::parse("header:x-id:^a:(.+)$").is_ok());

        for spec in ["header:x-id", "header::(.+)"] {
            assert!(matches!(AuthMethodSpec::parse(spec), Err(SpecError::HeaderSyntax { .. })), "{spec}");
        }
        assert!(matches!(AuthMethodSpec::parse("header"), Err(SpecError::MissingConfig(_))));
        assert!(matches!(AuthMethodSpec::parse("header:x id:(.+)"), Err(SpecError::BadHeaderName { .. })));
        assert!(matches!(AuthMethodSpec::parse("header:x-id:"), Err(SpecError::EmptyRegex { .. })));
        assert!(matches!(AuthMethodSpec::parse("header:x-id:("), Err(SpecError::InvalidRegex { .. })));
        assert!(matches!(AuthMethodSpec::parse("header:x-id:agent"), Err(SpecError::NoCaptureGroup { .. })));
    }

    #[test]
    fn trusted_hops_are_set_in_one_place() {
        let ten = TrustedHops::parse_list("10.9.9.9/32").expect("hops");
        let spec =
            AuthMethodSpec::parse("header:x-id:(.+)").expect("parses").with_trusted_hops(ten.clone()).expect("set");
        assert_eq!(spec.trusted_hops(), Some(ten.clone()));
        let spec = AuthMethodSpec::parse("xfcc:").expect("parses").with_trusted_hops(ten.clone()).expect("set");
        assert_eq!(spec.trusted_hops(), Some(ten.clone()));
        let err = AuthMethodSpec::parse("xfcc:trusted-hops=::1").expect("parses").with_trusted_hops(ten.clone());
        assert!(matches!(err, Err(SpecError::TrustedHopsConflict { .. })), "{err:?}");
        let err = AuthMethodSpec::parse("mtls:subject:CN=(.+)").expect("parses").with_trusted_hops(ten);
        assert!(matches!(err, Err(SpecError::TrustedHopsConflict { .. })), "{err:?}");
        assert_eq!(AuthMethodSpec::parse("mtls:subject:CN=(.+)").expect("parses").trusted_hops(), None);
    }

    #[test]
    fn listener_checks() {
        let mtls = AuthMethodSpec::parse("mtls:subject:CN=([^,]+)").expect("parses");
        let xfcc = AuthMethodSpec::parse("xfcc:").expect("parses");
        let header = AuthMethodSpec::parse("header:x-forwarded-client-cert:URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)")
            .expect("parses");
        let loopback = TrustedHops::loopback();

        assert!(check_listener(&mtls, false, &loopback).is_ok());
        let err = check_listener(&mtls, true, &loopback).expect_err("mtls on plaintext");
        assert!(
            matches!(err, SpecError::TlsRequired { .. }) && err.to_string().contains("--insecure-plaintext"),
            "{err}"
        );
        assert!(mtls.check_listener(true).is_err());

        for spec in [&xfcc, &header] {
            assert!(check_listener(spec, true, &loopback).is_ok(), "{spec}");
            assert!(spec.check_listener(true).is_ok(), "{spec}");
            let err = check_listener(spec, false, &loopback).expect_err("header over TLS");
            assert!(matches!(err, SpecError::PlaintextRequired { .. }), "{err}");
            assert!(err.to_string().contains("plaintext gRPC behind the sidecar"), "{err}");
            assert!(spec.check_listener(false).is_err());

            let any = TrustedHops::parse_list("127.0.0.1, 0.0.0.0/0").expect("hops");
            let err = check_listener(spec, true, &any).expect_err("any source");
            assert!(matches!(err, SpecError::UnrestrictedTrust { .. }), "{err}");
            assert!(err.to_string().contains("trusts every source") && err.to_string().contains("0.0.0.0/0"), "{err}");
            let err = check_listener(spec, true, &TrustedHops::parse_list("::/0").expect("hops")).expect_err("v6 any");
            assert!(err.to_string().contains("upstream trusts any caller"), "{err}");
            let err = check_listener(spec, true, &TrustedHops::new([])).expect_err("none");
            assert!(err.to_string().contains("trust no source"), "{err}");
        }
        let wide = AuthMethodSpec::parse("xfcc:trusted-hops=0.0.0.0/0").expect("parses");
        assert!(matches!(wide.check_listener(true), Err(SpecError::UnrestrictedTrust { .. })));
    }

    #[test]
    fn unknown_methods_are_refused() {
        assert!(matches!(AuthMethodSpec::parse("oidc:x"), Err(SpecError::UnknownMethod(m)) if m == "oidc"));
        assert!(matches!(AuthMethodSpec::parse("spiffe:k8s"), Err(SpecError::UnknownMethod(_))));
        assert!(matches!(AuthMethodSpec::parse("kerberos"), Err(SpecError::UnknownMethod(_))));
    }
}
