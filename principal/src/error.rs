//! Why an event from the agent could not be applied: the error the receive loop's ACK policy
//! ([`link::recv`]) and the metrics read.

use protocol::kube_store::StoreError;
use protocol::{EventError, EventType, Target};

use crate::config::AgentMode;

/// An event from an agent could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum InboundError {
    /// The payload does not fit its type and target.
    #[error("event payload does not decode: {0}")]
    Payload(#[from] EventError),
    /// Writing the hub failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The event is not valid for the agent's mode.
    #[error("{event_type} for target {target} is not valid from a {mode} agent (is the agent's --agent-mode right?)")]
    WrongMode {
        /// The event type.
        event_type: EventType,
        /// The target.
        target: Target,
        /// The agent's mode.
        mode: AgentMode,
    },
    /// This replica does not own the agent (`--agent-leases`), or its ownership ran out while
    /// the event was applied: it is not acknowledged, so the agent sends it to its owner.
    #[error(
        "principal replica {replica:?} does not own agent {agent:?} now (another replica does, or this one cannot renew its Lease); not applied, the agent sends it again"
    )]
    NotOwner {
        /// The agent.
        agent: String,
        /// This replica.
        replica: String,
    },
}

impl link::Retryable for InboundError {
    /// Whether the peer should resend (the event is then not ACKed).
    fn is_retryable(&self) -> bool {
        matches!(self, Self::Store(e) if e.is_retryable()) || matches!(self, Self::NotOwner { .. })
    }
}
