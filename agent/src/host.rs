//! What the agent's request-answering halves (the resource proxy's [`crate::live`], the Redis
//! proxy's [`crate::redis`]) need of the agent: its configuration, where their answers go, and
//! which Applications are this agent's (the resource proxy serves only what they manage).
//! [`crate::spoke::Spoke`] provides it; the halves never import it.

use link::Mailbox;
use protocol::argocd::Application;

use crate::config::AgentConfig;

/// The agent as a request-answering half sees it.
pub(crate) trait Host: Send + Sync + 'static {
    /// The agent's configuration.
    fn config(&self) -> &AgentConfig;
    /// The mailbox answers are queued in, toward the principal.
    fn mailbox(&self) -> &Mailbox;
    /// This agent's Application `namespace/name` on this cluster, if there is one the hub knows:
    /// managed, one the principal sent; autonomous, one sent up to the principal.
    fn application(&self, namespace: &str, name: &str) -> Option<Application>;
}
