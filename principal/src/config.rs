//! The principal's configuration, with upstream's defaults (docs/configuration.md).

use protocol::outbox::RetryPolicy;
use protocol::pb::MAX_MESSAGE_BYTES;
use std::time::Duration;

/// The version string `versionapi.Version` reports (upstream: `argocd-agent-<version>`).
pub const DEFAULT_VERSION: &str = concat!("argocd-agent-", env!("CARGO_PKG_VERSION"));

/// Upstream's default gRPC port (`--listen-port`).
pub const DEFAULT_LISTEN_PORT: u16 = 8443;

/// How an agent relates to the hub (upstream `--agent-mode`).
pub use protocol::mode::{AgentMode, InvalidAgentMode as BadMode};

/// What the principal needs to run. Agent mapping (§4.9) is namespace-based by default (an
/// agent's name is the hub namespace holding its Applications) or destination-based.
#[derive(Debug, Clone)]
pub struct PrincipalConfig {
    /// Namespace of the principal's own state (`-n/--namespace`, required): the identity
    /// ConfigMap and the AppProjects it distributes.
    pub namespace: String,
    /// Globs (`*`, `?`) of agent namespaces the principal serves (`--allowed-namespaces`); an
    /// empty list admits no agent, as upstream.
    pub allowed_namespaces: Vec<String>,
    /// Create the hub namespace `<agent>` when an autonomous agent connects and it is missing
    /// (`--namespace-create-enable`, default off).
    pub namespace_create_enable: bool,
    /// Labels put on namespaces created that way (`--namespace-create-labels`).
    pub namespace_create_labels: std::collections::BTreeMap<String, String>,
    /// Only agents whose name matches get a namespace created (`--namespace-create-pattern`,
    /// a regular expression; `None`: every agent).
    pub namespace_create_pattern: Option<regex::Regex>,
    /// At most this many agents' events are applied at once (`--event-processors`; `None`:
    /// no limit besides one event at a time per agent).
    pub event_processors: Option<usize>,
    /// At most this many of one agent's events applied at once, across Applications; one
    /// Application's events, and everything else, in order (`--agent-event-concurrency`; 1:
    /// one at a time, as upstream).
    pub agent_event_concurrency: usize,
    /// The version reported by `versionapi.Version`.
    pub version: String,
    /// Retry timing for un-ACKed events sent to agents.
    pub retry: RetryPolicy,
    /// The largest gRPC message the principal reads or sends on `EventStream` (default
    /// [`MAX_MESSAGE_BYTES`], upstream's 200 MiB). A larger message from an agent ends its
    /// stream (`OutOfRange`); an event for an agent that would encode larger is never sent
    /// but given up on at once (docs/reliability.md).
    pub max_message_bytes: usize,
    /// Only hub objects whose labels match are distributed to managed agents
    /// (`--label-selector`): Applications, AppProjects, repository secrets, the GPG keys
    /// ConfigMap. Autonomous agents' hub copies are always kept.
    pub label_selector: Option<protocol::selector::LabelSelector>,
    /// Periodic resyncs of one agent closer together than this are not answered
    /// (`--resync-min-interval`): a misconfigured or looping agent cannot make the principal
    /// hash its resources more often.
    pub resync_min_interval: std::time::Duration,
    /// `--enable-self-cluster-registration`: each agent that authenticates gets a cluster secret
    /// for the hub's Argo CD ([`crate::registration`]).
    pub self_registration: Option<crate::registration::SelfRegistration>,
    /// `--client-cert-subject-match`: every call's client certificate CN must be the agent's
    /// name.
    pub client_cert_subject_match: bool,
    /// Destination-based mapping (`--destination-based-mapping`): a managed agent's
    /// Applications are the hub Applications whose `spec.destination.name` is its name, in the
    /// principal's namespace or any namespace `allowed_namespaces` covers; their namespace is
    /// kept on the agent. Autonomous agents keep namespace-based mapping (as upstream).
    pub destination_based_mapping: bool,
    /// `--agent-leases`: replicas of one hub share the agents, each owned by one replica at a
    /// time through a Lease ([`crate::lease`]). `None`: a lone principal.
    pub agent_leases: Option<LeaseConfig>,
    /// HTTP/2 keepalive of the agents' gRPC listener (`--http2-keepalive-interval`,
    /// `--http2-keepalive-timeout`): a dead agent's connection goes within interval + timeout.
    pub keepalive: Keepalive,
}

/// HTTP/2 keepalive of a server: a PING every `interval` without traffic, the connection closed
/// when one is not answered within `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Between PINGs.
    pub interval: Duration,
    /// For the answer.
    pub timeout: Duration,
}

impl Default for Keepalive {
    /// 30 s and 10 s.
    fn default() -> Self {
        Self { interval: Duration::from_secs(30), timeout: Duration::from_secs(10) }
    }
}

/// How hub Applications map to managed agents (§4.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// An agent's Applications are those in the hub namespace named after it (the default).
    Namespace,
    /// An agent's Applications are those whose `spec.destination.name` is its name
    /// (`--destination-based-mapping`).
    Destination,
}

/// `--agent-event-concurrency` unless given: a quarter of the hub client's requests in flight
/// (64), so that a few busy agents cannot take them all.
pub const DEFAULT_AGENT_EVENT_CONCURRENCY: usize = 16;

/// `--resync-min-interval` unless given.
pub const DEFAULT_RESYNC_MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

impl PrincipalConfig {
    /// A configuration for principal namespace `namespace` with upstream defaults.
    #[must_use]
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            allowed_namespaces: Vec::new(),
            namespace_create_enable: false,
            namespace_create_labels: std::collections::BTreeMap::new(),
            namespace_create_pattern: None,
            event_processors: None,
            agent_event_concurrency: DEFAULT_AGENT_EVENT_CONCURRENCY,
            version: DEFAULT_VERSION.to_owned(),
            retry: RetryPolicy::default(),
            max_message_bytes: MAX_MESSAGE_BYTES,
            label_selector: None,
            resync_min_interval: DEFAULT_RESYNC_MIN_INTERVAL,
            self_registration: None,
            client_cert_subject_match: false,
            destination_based_mapping: false,
            agent_leases: None,
            keepalive: Keepalive::default(),
        }
    }

    /// Whether `agent` may connect: an RFC 1123 DNS label (as upstream requires of agent
    /// names), covered by `allowed_namespaces`, and not the principal's own namespace.
    #[must_use]
    pub fn admits(&self, agent: &str) -> bool {
        is_dns_label(agent) && agent != self.namespace && self.allowed_namespaces.iter().any(|g| glob_match(g, agent))
    }

    /// The mapping in use.
    #[must_use]
    pub fn mapping(&self) -> Mapping {
        if self.destination_based_mapping { Mapping::Destination } else { Mapping::Namespace }
    }

    /// Whether hub Applications in namespace `ns` are the principal's to route: an admitted
    /// agent's namespace, and with destination-based mapping also the principal's own namespace
    /// and any other namespace `allowed_namespaces` covers.
    #[must_use]
    pub fn watches_app_namespace(&self, ns: &str) -> bool {
        if self.destination_based_mapping {
            ns == self.namespace || self.allowed_namespaces.iter().any(|g| glob_match(g, ns))
        } else {
            self.admits(ns)
        }
    }
}

/// Whether `s` is an RFC 1123 DNS label: 1-63 characters of `[a-z0-9-]`, alphanumeric at
/// both ends.
#[must_use]
pub fn is_dns_label(s: &str) -> bool {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            bytes.len() <= 63 && ok(first) && ok(last) && bytes.iter().all(|&b| ok(b) || b == b'-')
        }
        _ => false,
    }
}

pub use protocol::glob::glob_match;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission() {
        let mut c = PrincipalConfig::new("argocd");
        assert!(!c.admits("agent-1"), "empty allow list admits nothing");
        c.allowed_namespaces = vec!["*".into()];
        assert!(c.admits("agent-1"));
        assert!(!c.admits("argocd"));
        assert!(!c.admits("Agent_1"));
        assert!(!c.admits("-agent"));
        assert_eq!("managed".parse::<AgentMode>(), Ok(AgentMode::Managed));
        assert!("x".parse::<AgentMode>().is_err());
    }

    #[test]
    fn destination_based_mapping_watches_the_principal_namespace_and_allowed_ones() {
        let mut c = PrincipalConfig::new("argocd");
        c.allowed_namespaces = vec!["team-*".into()];
        assert!(!c.watches_app_namespace("argocd"), "namespace-based: only agent namespaces");
        assert!(c.watches_app_namespace("team-a"));
        c.destination_based_mapping = true;
        assert!(c.watches_app_namespace("argocd"));
        assert!(c.watches_app_namespace("team-a"));
        assert!(!c.watches_app_namespace("other"));
    }
}

/// How this replica shares agents with the others (`--agent-leases`).
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// This replica's name (`--replica-name`, by default the pod's name): the `holderIdentity`
    /// of the Leases it holds. Unique among the replicas of one hub.
    pub replica: String,
    /// How long a replica's Lease lasts without renewal (`--agent-lease-duration`).
    pub duration: Duration,
    /// `host:port` at which the other replicas reach this replica's resource proxy
    /// (`--replica-proxy-address`), published on its Lease: a replica that does not own an agent
    /// forwards the agent's resource-proxy requests there. `None`: this replica's agents are
    /// reached only through it.
    pub proxy_address: Option<String>,
}

impl LeaseConfig {
    /// Replica `replica` with Leases of `duration`.
    #[must_use]
    pub fn new(replica: impl Into<String>, duration: Duration) -> Self {
        Self { replica: replica.into(), duration, proxy_address: None }
    }

    /// Renewals of the replica's Lease are this far apart; each may take as long.
    pub(crate) fn renew_every(&self) -> Duration {
        self.duration / 3
    }

    /// How long after a renewal was sent the replica may act on it.
    pub(crate) fn valid_for(&self) -> Duration {
        self.duration - self.duration / 3
    }
}
