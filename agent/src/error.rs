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
    /// Destination-based mapping: the Application's hub namespace is not one this agent keeps
    /// Applications in.
    #[error(
        "Application namespace {namespace} is not allowed on this agent (add it to the agent's --allowed-namespaces)"
    )]
    NamespaceNotAllowed {
        /// The namespace the principal named.
        namespace: String,
    },
    /// Destination-based mapping: the Application's namespace does not exist here (resent
    /// until it does).
    #[error(
        "namespace {namespace} does not exist on this cluster (create it, or start the agent with --create-namespace)"
    )]
    NamespaceMissing {
        /// The namespace.
        namespace: String,
    },
    /// The principal creates an Application that exists here without its `source-uid`, and the
    /// adoption policy is `never`.
    #[error(
        "Application {namespace}/{name} already exists on this agent's cluster and its adoption policy is \"never\": delete it there or change the policy (--adoption-policy, or the argocd.argoproj.io/adoption-policy annotation on it), then recreate this Application"
    )]
    AdoptionRefused {
        /// The namespace here.
        namespace: String,
        /// The name.
        name: String,
    },
    /// Recreating an Application of another source: the old one is still being deleted
    /// (finalizers); resent until it is gone.
    #[error(
        "Application {namespace}/{name} of another source is still being deleted here; the principal's is created once it is gone"
    )]
    StillDeleting {
        /// The namespace here.
        namespace: String,
        /// The name.
        name: String,
    },
    /// Destination-based mapping: an Application of the principal's namespace is kept in the
    /// agent's, where the principal's Application of that name from the agent's namespace
    /// already is (or the other way round). The one here stays.
    #[error(
        "Application {name:?} of hub namespace {hub_namespace} would be kept here as {namespace}/{name}, which holds the Application of hub namespace {held_hub_namespace}: Applications of the principal's namespace move to the agent's under destination-based mapping, so rename one of the two on the hub"
    )]
    NamespaceCollision {
        /// The namespace here.
        namespace: String,
        /// The name.
        name: String,
        /// The hub namespace of the refused Application.
        hub_namespace: String,
        /// The hub namespace of the one here.
        held_hub_namespace: String,
    },
    /// Destination-based mapping with `--create-namespace`: the namespace could not be created.
    #[error("cannot create namespace {namespace}: {source}")]
    NamespaceCreate {
        /// The namespace.
        namespace: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

impl link::Retryable for InboundError {
    /// Whether the peer should resend (the event is then not ACKed).
    fn is_retryable(&self) -> bool {
        match self {
            Self::Store(e) => e.is_retryable(),
            Self::NamespaceMissing { .. } | Self::NamespaceCreate { .. } | Self::StillDeleting { .. } => true,
            _ => false,
        }
    }
}
