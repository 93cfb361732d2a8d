//! Why an event from the principal could not be applied: the error the receive loop's ACK
//! policy ([`link::recv`]) and the metrics read.

use protocol::kube_store::StoreError;
use protocol::{AgentMode, EventError, EventType, Target};

/// An event from the principal could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum InboundError {
    /// The payload does not fit its type and target.
    #[error("event payload does not decode: {0}")]
    Payload(#[from] EventError),
    /// Writing the spoke failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The event does not make sense in this agent's mode.
    #[error(
        "{event_type} for target {target} is not valid for a {mode} agent (do agent --agent-mode and the principal agree?)"
    )]
    WrongMode {
        /// The type.
        event_type: EventType,
        /// The target.
        target: Target,
        /// This agent's mode.
        mode: AgentMode,
    },
    /// The Application the event refers to does not exist here.
    #[error("Application {name:?} does not exist in namespace {namespace}")]
    Missing {
        /// The name.
        name: String,
        /// The agent namespace.
        namespace: String,
    },
}

impl link::Retryable for InboundError {
    /// Whether the peer should resend (the event is then not ACKed).
    fn is_retryable(&self) -> bool {
        matches!(self, Self::Store(e) if e.is_retryable())
    }
}
