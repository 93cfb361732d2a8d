//! The spoke side: connection lifecycle, inbound handlers, spoke watchers, resync.
//!
//! ```no_run
//! # async fn demo(spoke: kube::Client) -> Result<(), agent::AgentError> {
//! let config = agent::AgentConfig::new("http://127.0.0.1:8443", "agent-1", agent::AgentMode::Managed);
//! let agent = agent::Agent::new(config, spoke)?;
//! agent.run(tokio_util::sync::CancellationToken::new()).await;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backoff;
pub mod cluster_cache;
pub mod compression;
pub mod config;
pub mod connection;
pub mod credentials;
pub mod error;
mod host;
pub mod inbound;
mod live;
mod logs;
pub mod metrics;
mod otel;
mod recent;
pub mod redis;
pub mod resync;
pub mod session;
pub mod spoke;
mod terminal;
pub mod transport;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

pub use backoff::BackoffConfig;
pub use config::{AgentConfig, AgentMode, DEFAULT_NAMESPACE};
pub use credentials::{MetadataFn, bearer_token, static_headers};
pub use transport::AgentTls;

use spoke::Spoke;

/// The agent's configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The agent name is empty.
    #[error("the agent name is empty: set it (upstream derives it from the credentials)")]
    NoName,
    /// The namespace is empty.
    #[error("the agent namespace is empty: set --namespace (ARGOCD_AGENT_NAMESPACE), default \"argocd\"")]
    NoNamespace,
    /// The principal address is empty.
    #[error("the principal address is empty: set --server-address (ARGOCD_AGENT_REMOTE_SERVER)")]
    NoAddress,
}

/// The agent: spoke watcher, connection to the principal, inbound handlers and resync.
#[derive(Debug, Clone)]
pub struct Agent {
    spoke: Arc<Spoke>,
}

impl Agent {
    /// An agent writing to the spoke reached through `client`.
    ///
    /// # Errors
    ///
    /// [`AgentError`] when a required setting is empty.
    pub fn new(config: AgentConfig, client: kube::Client) -> Result<Self, AgentError> {
        if config.name.is_empty() {
            return Err(AgentError::NoName);
        }
        if config.namespace.is_empty() {
            return Err(AgentError::NoNamespace);
        }
        if config.principal_addr.is_empty() {
            return Err(AgentError::NoAddress);
        }
        Ok(Self { spoke: Arc::new(Spoke::new(config, client)) })
    }

    /// Whether a stream to the principal is up (for `/healthz`).
    #[must_use]
    pub fn is_connected(&self) -> bool {
        self.spoke.connected.load(Ordering::Relaxed)
    }

    /// The Prometheus exposition of [`metrics::global`], with this agent's outbox.
    #[must_use]
    pub fn metrics_text(&self) -> String {
        metrics::global().render(Some(&self.spoke.mailbox))
    }

    /// Runs the spoke watchers, the connection (reconnecting with backoff) and the session
    /// (when configured) until `cancel` fires.
    pub async fn run(&self, cancel: CancellationToken) {
        let span = tracing::info_span!("agent", agent = %self.spoke.config.name, mode = %self.spoke.config.mode);
        tracing::Instrument::instrument(
            async {
                let keep_session = async {
                    if let Some(session) = &self.spoke.config.session {
                        tokio::select! {
                            () = session.keep() => {}
                            () = cancel.cancelled() => {}
                        }
                    }
                };
                let shipped = async {
                    if self.spoke.config.mode == config::AgentMode::Managed {
                        tokio::join!(
                            spoke::shipped::run::<protocol::argocd::Secret>(self.spoke.clone(), cancel.clone()),
                            spoke::shipped::run::<protocol::argocd::ConfigMap>(self.spoke.clone(), cancel.clone()),
                        );
                    }
                };
                tokio::join!(
                    spoke::watch::run_applications(self.spoke.clone(), cancel.clone()),
                    spoke::projects::run_projects(self.spoke.clone(), cancel.clone()),
                    shipped,
                    connection::run(self.spoke.clone(), cancel.clone()),
                    keep_session,
                );
            },
            span,
        )
        .await;
    }
}
