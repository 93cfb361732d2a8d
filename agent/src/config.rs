//! The agent's configuration, with upstream's defaults (docs/upstream-argocd-agent.md §7.2).

use std::fmt;
use std::time::Duration;

use protocol::outbox::RetryPolicy;

use crate::backoff::BackoffConfig;
use crate::credentials::MetadataFn;
use crate::transport::AgentTls;

/// Upstream's default namespace for the agent's Applications (`-n/--namespace`).
pub const DEFAULT_NAMESPACE: &str = "argocd";

/// The agent's mode (one type for principal, agent and auth).
pub use protocol::mode::{AgentMode, InvalidAgentMode as BadMode};

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
    /// Heartbeat interval (`--heartbeat-interval`; `None` = off, upstream's default).
    pub heartbeat_interval: Option<Duration>,
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
        }
    }
}
