//! The agent's configuration, with upstream's defaults (docs/configuration.md).

use std::fmt;
use std::time::Duration;

use protocol::outbox::RetryPolicy;

use crate::backoff::BackoffConfig;
use crate::credentials::MetadataFn;
use crate::transport::AgentTls;

/// HTTP/2 keepalive PING interval unless configured (upstream's code default is off, its Helm
/// chart's 50 s; a dead connection should not go unnoticed, so it is on here).
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(30);

/// The shortest [`AgentConfig::stream_silence_limit`].
pub const MIN_SILENCE_LIMIT: Duration = Duration::from_secs(10);

/// Upstream's default namespace for the agent's Applications (`-n/--namespace`).
pub const DEFAULT_NAMESPACE: &str = "argocd";

/// The agent's mode (one type for principal, agent and auth).
pub use protocol::mode::{AgentMode, InvalidAgentMode as BadMode};

/// What a managed agent does when the principal sends an Application whose name is taken here by
/// one from another source (`--source-uid-mismatch-policy`, per Application the
/// `argocd.argoproj.io/source-uid-mismatch-policy` annotation on the principal's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MismatchPolicy {
    /// Delete the one here, then create the principal's (upstream's default).
    #[default]
    Recreate,
    /// Update the one here in place, stamping the principal's identity.
    Upsert,
}

/// What a managed agent does when the principal creates an Application that already exists here
/// without the principal's `source-uid` (`--adoption-policy`, per Application the
/// `argocd.argoproj.io/adoption-policy` annotation on the one here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AdoptionPolicy {
    /// Take it over: stamp the principal's identity and write its spec (upstream's default).
    #[default]
    Always,
    /// Leave it alone and report an error, which marks the hub Application degraded.
    Never,
}

/// What a managed agent sets on a principal-owned Application it recreates after a local
/// deletion (`--on-application-recreate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecreateAction {
    /// Recreate it with the status it had (upstream's default).
    #[default]
    Ignore,
    /// Drop `status.operationState`.
    ClearStatus,
    /// Request a sync (`operation: {sync: {}}`).
    Resync,
}

macro_rules! parse_names {
    ($ty:ty, $flag:literal, $($name:literal => $v:expr),+) => {
        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($name => Ok($v),)+
                    other => Err(format!(concat!("unknown ", $flag, " {:?}: use one of ", $($name, " "),+), other)),
                }
            }
        }
    };
}
parse_names!(MismatchPolicy, "source-uid-mismatch-policy", "recreate" => Self::Recreate, "upsert" => Self::Upsert);
parse_names!(AdoptionPolicy, "adoption-policy", "always" => Self::Always, "never" => Self::Never);
parse_names!(RecreateAction, "on-application-recreate", "ignore" => Self::Ignore, "clear-status" => Self::ClearStatus, "resync" => Self::Resync);

/// What the agent needs to run.
#[derive(Clone)]
pub struct AgentConfig {
    /// The principal's gRPC endpoint as a URI (`https://host:443`, or `http://127.0.0.1:port`
    /// for plaintext), from `--server-address`/`--server-port`.
    pub principal_addr: String,
    /// TLS for the connection; `None` = plaintext h2c (`--insecure-plaintext`, or a mesh
    /// sidecar on loopback).
    pub tls: Option<AgentTls>,
    /// The agent's name (as the principal knows it; its hub namespace).
    pub name: String,
    /// Managed or autonomous.
    pub mode: AgentMode,
    /// Namespace on the spoke where Applications and AppProjects live.
    pub namespace: String,
    /// Adds credentials (and any other metadata) to the stream request; the auth crate
    /// supplies it. See [`crate::credentials`].
    pub credentials: Option<MetadataFn>,
    /// Reconnect timing.
    pub backoff: BackoffConfig,
    /// Retry timing for un-ACKed events sent to the principal.
    pub retry: RetryPolicy,
    /// Heartbeat interval (`--heartbeat-interval`; `None` = off, upstream's default). While
    /// heartbeats are on, a stream on which nothing arrives for [`Self::stream_silence_limit`]
    /// (the principal ACKs every heartbeat) is taken as dead and replaced: this works through
    /// sidecars, where HTTP/2 PINGs only reach the local proxy.
    pub heartbeat_interval: Option<Duration>,
    /// HTTP/2 keepalive PING interval (`--keep-alive-ping-interval`; `None` = off).
    pub keepalive: Option<Duration>,
    /// HTTP/2, or gRPC over WebSocket (`--enable-websocket`); see [`crate::transport::Wire`].
    pub wire: crate::transport::Wire,
    /// Notified when the principal refuses the stream's session (`Unauthenticated`: expired,
    /// revoked, blocklisted), so the credentials' owner refreshes or authenticates at once; the
    /// reconnect then picks up the new token from [`Self::credentials`].
    pub renew_session: Option<std::sync::Arc<tokio::sync::Notify>>,
    /// Largest gRPC message sent or received (`--grpc-max-message-size`); a larger outgoing
    /// event is given up (the next resync repairs) instead of failing the stream.
    pub max_message_bytes: usize,
    /// The session the agent keeps with the principal while it runs (see
    /// [`Self::with_session`]); `None` when the caller supplies [`Self::credentials`] itself.
    pub session: Option<std::sync::Arc<crate::session::Session>>,
    /// Autonomous: only Applications and AppProjects whose labels match go to the principal
    /// (`--label-selector`); one that stops matching is deleted there.
    pub label_selector: Option<protocol::selector::LabelSelector>,
    /// gzip on the event stream (`--enable-compression`): the agent compresses what it sends
    /// and the principal answers in kind (see [`crate::compression`]).
    pub compression: bool,
    /// Periodic resync interval (`--resync-interval`; `None` = off, the default): see
    /// [`crate::resync`].
    pub resync_interval: Option<Duration>,
    /// How often this cluster's Argo CD cluster info is read and, when it changed, reported
    /// to the principal (`--cache-refresh-interval`, upstream's 10 s; `None` = never): see
    /// [`crate::cluster_cache`]. Needs [`Self::redis`].
    pub cache_refresh_interval: Option<Duration>,
    /// Managed: destination-based mapping (`--destination-based-mapping`, §4.9): an Application
    /// keeps the hub namespace it comes from (this agent's [`Self::namespace`] or one
    /// [`Self::allowed_namespaces`] covers) instead of moving to [`Self::namespace`], and the
    /// agent watches Applications in those namespaces.
    pub destination_based_mapping: bool,
    /// With destination-based mapping, create an Application's namespace when it is missing
    /// (`--create-namespace`).
    pub create_namespace: bool,
    /// Globs of namespaces besides [`Self::namespace`] that may hold Applications
    /// (`--allowed-namespaces`).
    pub allowed_namespaces: Vec<String>,
    /// The principal's namespace, as its `Authenticate` answered (`AuthResponse.principalNamespace`).
    /// Under destination-based mapping, an Application from that namespace is kept in
    /// [`Self::namespace`] instead, marked `argocd.argoproj.io/namespace-remapped=true`, when the
    /// two differ (upstream §4.2). `None`: not known (credentials supplied without a session),
    /// and nothing is remapped.
    pub principal_namespace: Option<String>,
    /// Managed: an Application of another source in the way of the principal's.
    pub mismatch_policy: MismatchPolicy,
    /// Managed: an Application made here in the way of one the principal creates.
    pub adoption_policy: AdoptionPolicy,
    /// Managed: what a restored Application gets.
    pub on_recreate: RecreateAction,
    /// Execute the principal's resource-proxy requests (`--enable-resource-proxy`, upstream's
    /// default on); off, each is answered 403 saying so.
    pub enable_resource_proxy: bool,
    /// Run the principal's terminal requests (`kubectl exec`, Argo CD's web terminal) in pods of
    /// this cluster (`--enable-web-terminal`, default off: a terminal runs any command with the
    /// pod's privileges, so the operator opts in, as Argo CD's own `exec.enabled`); off, each is
    /// refused 403 saying so. Only pods an Application of this agent manages are reachable either
    /// way.
    pub enable_web_terminal: bool,
    /// This cluster's Argo CD Redis, which answers the principal's Redis-proxy requests
    /// (`--redis-addr` and friends); `None`: each is answered with an error saying so.
    pub redis: Option<RedisConfig>,
}

impl fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentConfig")
            .field("principal_addr", &self.principal_addr)
            .field("tls", &self.tls.is_some())
            .field("name", &self.name)
            .field("mode", &self.mode)
            .field("namespace", &self.namespace)
            .field("credentials", &self.credentials.is_some())
            .field("backoff", &self.backoff)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("keepalive", &self.keepalive)
            .field("compression", &self.compression)
            .finish_non_exhaustive()
    }
}

impl AgentConfig {
    /// A configuration with upstream defaults for agent `name` in `mode`, dialling
    /// `principal_addr`.
    #[must_use]
    pub fn new(principal_addr: impl Into<String>, name: impl Into<String>, mode: AgentMode) -> Self {
        Self {
            principal_addr: principal_addr.into(),
            tls: None,
            name: name.into(),
            mode,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            credentials: None,
            backoff: BackoffConfig::default(),
            retry: RetryPolicy::default(),
            heartbeat_interval: None,
            keepalive: Some(DEFAULT_KEEPALIVE),
            wire: crate::transport::Wire::Http2,
            max_message_bytes: protocol::pb::MAX_MESSAGE_BYTES,
            renew_session: None,
            session: None,
            label_selector: None,
            compression: false,
            resync_interval: None,
            cache_refresh_interval: Some(Duration::from_secs(10)),
            destination_based_mapping: false,
            create_namespace: false,
            allowed_namespaces: Vec::new(),
            principal_namespace: None,
            mismatch_policy: MismatchPolicy::default(),
            adoption_policy: AdoptionPolicy::default(),
            on_recreate: RecreateAction::default(),
            enable_resource_proxy: true,
            enable_web_terminal: false,
            redis: None,
        }
    }

    /// Whether Applications may live in namespace `ns` here: the agent's own, or one
    /// `--allowed-namespaces` covers under destination-based mapping.
    #[must_use]
    pub fn app_namespace_allowed(&self, ns: &str) -> bool {
        ns == self.namespace
            || (self.destination_based_mapping
                && self.allowed_namespaces.iter().any(|g| protocol::glob::glob_match(g, ns)))
    }

    /// The agent keeps `session` fresh while it runs, sends its access token (and `extra`) on
    /// every stream, and renews it at once when the principal refuses the stream's session.
    #[must_use]
    pub fn with_session(
        mut self,
        session: std::sync::Arc<crate::session::Session>,
        extra: Option<auth::CallMetadata>,
    ) -> Self {
        self.credentials = Some(session.stream_credentials(extra));
        self.renew_session = Some(session.renew());
        self.session = Some(session);
        self
    }

    /// With heartbeats on, how long the stream may stay silent before it is replaced: three
    /// heartbeat intervals, at least [`MIN_SILENCE_LIMIT`]; `None` without heartbeats.
    #[must_use]
    pub fn stream_silence_limit(&self) -> Option<Duration> {
        self.heartbeat_interval.map(|h| (h * 3).max(MIN_SILENCE_LIMIT))
    }
}

/// Where this cluster's Argo CD Redis is and how to reach it (`--redis-addr`,
/// `--redis-username`, `--redis-password`, `--redis-tls-*`).
#[derive(Clone)]
pub struct RedisConfig {
    /// `host:port` (upstream default `argocd-redis:6379`).
    pub address: String,
    /// ACL user name.
    pub username: Option<String>,
    /// Password.
    pub password: Option<String>,
    /// TLS; `None`: plaintext.
    pub tls: Option<RedisTls>,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("address", &self.address)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .finish()
    }
}

/// How the agent's Redis's certificate is checked.
#[derive(Clone, Debug)]
pub enum RedisTls {
    /// Against these CA certificates (PEM; `--redis-tls-ca-path` or the
    /// `--redis-tls-ca-secret-name` Secret).
    Ca(String),
    /// Against the system's roots.
    SystemRoots,
    /// Not at all (`--redis-tls-insecure`): encrypted, not authenticated.
    Insecure,
}
