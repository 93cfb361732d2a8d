//! What the agent's request-answering halves (the resource proxy's [`crate::live`], the Redis
//! proxy's [`crate::redis`]) need of the agent: its configuration and where their answers go.
//! [`crate::spoke::Spoke`] provides it; the halves never import it.

use link::Mailbox;

use crate::config::AgentConfig;

/// The agent as a request-answering half sees it.
pub(crate) trait Host: Send + Sync + 'static {
    /// The agent's configuration.
    fn config(&self) -> &AgentConfig;
    /// The mailbox answers are queued in, toward the principal.
    fn mailbox(&self) -> &Mailbox;
}
