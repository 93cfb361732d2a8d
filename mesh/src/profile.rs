//! Mesh profiles: the defaults for running behind Istio, Linkerd or plain Envoy sidecars.
//!
//! Heartbeats: a quiet gRPC stream is closed by the mesh after its idle timeout, and HTTP/2
//! PINGs do not count (Istio's idle timer counts requests and messages), so the agent sends an
//! application-level heartbeat. Every profile uses 30 s: upstream argocd-agent recommends 30 s,
//! or 50–75 % of the mesh idle timeout (`docs/configuration/networking.md`), and 30 s is a
//! tenth of the shortest default idle timeout below, leaving room for a lost heartbeat or two.
//!
//! | profile | header | idle timeout that bites | source |
//! |---|---|---|---|
//! | istio | `x-forwarded-client-cert` | 300 s on a gateway; none sidecar to sidecar | istiod writes `stream_idle_timeout: 0s` (off) on sidecars' inbound and outbound HTTP connection managers unless ProxyConfig `connectionSettings.httpStreamIdleTimeout` sets one, and 300 s on gateways (seen from a real istiod, `tests/tests/istio_mesh.rs`); the profile takes the gateway's 300 s (see [`MeshProfile::ISTIO_GATEWAY_STREAM_IDLE_TIMEOUT`]). Istio's DestinationRule `http.idleTimeout` (1 h) is longer |
//! | envoy | `x-forwarded-client-cert` | 300 s | Envoy HCM `stream_idle_timeout` default (5 min); connection `idle_timeout` (1 h) fires only without streams |
//! | linkerd | `l5d-client-id` | none by default | `timeout.linkerd.io/idle` is opt-in; the heartbeat still covers load balancers and NAT on the path |

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::identity::{self, IdentityError};
use crate::policy::{AuthorizedAgent, SpiffePolicy};

/// How a mesh tells the principal who the caller is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IdentityHeader {
    /// Envoy's `x-forwarded-client-cert` (Istio, Envoy): parsed structurally, last element.
    Xfcc,
    /// Linkerd's `l5d-client-id: <sa>.<ns>.serviceaccount.identity.<cp-ns>.<trust-domain>`, set
    /// from the verified TLS identity and stripped on non-mTLS connections.
    LinkerdClientId,
}

impl IdentityHeader {
    /// The (lower-case) header name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Xfcc => "x-forwarded-client-cert",
            Self::LinkerdClientId => "l5d-client-id",
        }
    }

    /// The agent a header value identifies under `policy`.
    ///
    /// # Errors
    ///
    /// [`IdentityError`] from [`identity::identity_from_xfcc`] or
    /// [`identity::identity_from_linkerd`].
    pub fn identify(self, value: &str, policy: &SpiffePolicy) -> Result<AuthorizedAgent, IdentityError> {
        match self {
            Self::Xfcc => identity::identity_from_xfcc(value, policy),
            Self::LinkerdClientId => identity::identity_from_linkerd(value, policy),
        }
    }
}

/// A service mesh the principal and agents run in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MeshProfile {
    /// Istio sidecars (Envoy, `APPEND_FORWARD` with Subject, URI and DNS).
    Istio,
    /// Linkerd proxies.
    Linkerd,
    /// Plain Envoy sidecars configured by our own bootstrap (`envoy/`).
    Envoy,
}

/// A profile name that is none of `istio`, `linkerd`, `envoy`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown mesh profile {0:?}: expected one of istio, linkerd, envoy")]
pub struct UnknownProfile(
    /// The name given.
    pub String,
);

impl MeshProfile {
    /// Every profile.
    pub const ALL: [Self; 3] = [Self::Istio, Self::Linkerd, Self::Envoy];
    /// The heartbeat interval every profile defaults to (see the module docs).
    pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(30);
    /// Envoy's default HTTP connection manager `stream_idle_timeout`.
    pub const ENVOY_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
    /// The `stream_idle_timeout` istiod gives a gateway's HTTP connection managers (an ingress or
    /// egress gateway that terminates HTTP), and the one [`Self::stream_idle_timeout`] reports for
    /// [`Self::Istio`].
    ///
    /// Sidecars get none: istiod writes `stream_idle_timeout: 0s` on their inbound and outbound
    /// connection managers unless ProxyConfig `connectionSettings.httpStreamIdleTimeout` sets one
    /// (seen from a real istiod in `tests/tests/istio_mesh.rs`). So sidecar to sidecar, a quiet
    /// stream is not closed by Istio by default, and the shortest timer a stream meets is this
    /// one, when it crosses a gateway. The profile reports it rather than none so that the
    /// heartbeat is still sized against a real Istio timer: one a third of this or less also
    /// outlives any sidecar `httpStreamIdleTimeout` an operator sets at 90 s or more, and L4 idle
    /// timers (load balancers, NAT, an east-west gateway's `tcp_proxy`).
    pub const ISTIO_GATEWAY_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
    /// The trust domain Istio and Linkerd use unless configured otherwise.
    pub const DEFAULT_TRUST_DOMAIN: &'static str = "cluster.local";

    /// The profile's name, as [`FromStr`] accepts it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Istio => "istio",
            Self::Linkerd => "linkerd",
            Self::Envoy => "envoy",
        }
    }

    /// The header this mesh forwards the caller's identity in.
    #[must_use]
    pub fn identity_header(self) -> IdentityHeader {
        match self {
            Self::Istio | Self::Envoy => IdentityHeader::Xfcc,
            Self::Linkerd => IdentityHeader::LinkerdClientId,
        }
    }

    /// The default policy: trust domain `cluster.local`, pattern `/ns/{namespace}/sa/{agent}`,
    /// and the mesh's own namespace denied (Istio: `istio-system`, where its ingress gateway and
    /// istiod run; Linkerd: `linkerd`). Plain Envoy follows the same Kubernetes convention with no
    /// denied namespace, since there is no mesh namespace to know of.
    #[must_use]
    pub fn default_policy(self) -> SpiffePolicy {
        let denied: &[&str] = match self {
            Self::Istio => &["istio-system"],
            Self::Linkerd => &["linkerd"],
            Self::Envoy => &[],
        };
        SpiffePolicy::kubernetes(Self::DEFAULT_TRUST_DOMAIN, denied)
    }

    /// The idle timeout that closes a quiet stream by default, if the mesh has one: the one the
    /// agent's heartbeat must stay well under. Istio: a gateway's
    /// ([`Self::ISTIO_GATEWAY_STREAM_IDLE_TIMEOUT`]; its sidecars have none by default); plain
    /// Envoy: its HTTP connection manager's default ([`Self::ENVOY_STREAM_IDLE_TIMEOUT`], which
    /// `envoy/` writes out); Linkerd: none.
    #[must_use]
    pub fn stream_idle_timeout(self) -> Option<Duration> {
        match self {
            Self::Istio => Some(Self::ISTIO_GATEWAY_STREAM_IDLE_TIMEOUT),
            Self::Envoy => Some(Self::ENVOY_STREAM_IDLE_TIMEOUT),
            Self::Linkerd => None,
        }
    }

    /// The default agent heartbeat interval, well under [`Self::stream_idle_timeout`].
    #[must_use]
    pub fn heartbeat_interval(self) -> Duration {
        Self::DEFAULT_HEARTBEAT
    }
}

impl fmt::Display for MeshProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MeshProfile {
    type Err = UnknownProfile;

    /// Accepts `istio`, `linkerd` and `envoy`, ignoring ASCII case and surrounding whitespace.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownProfile(s.to_owned()))
    }
}
