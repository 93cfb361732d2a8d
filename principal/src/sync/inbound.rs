//! Events from an agent: decode, route by mode and target, decide whether to ACK.

use protocol::{Event, EventType, Payload};

use crate::config::AgentMode;
pub use crate::error::InboundError;
use crate::peer::AgentPeer;
use crate::sync::hub::Hub;
use crate::sync::resync;
use crate::sync::route::{autonomous, managed, project};

/// An autonomous agent's Application without the namespace-remapped mark (only managed agents
/// under destination-based mapping set it; it never reaches the hub).
fn unmarked(mut app: protocol::argocd::Application) -> protocol::argocd::Application {
    managed::unmark(&mut app);
    app
}

/// Applies one event from `session`'s agent to the hub.
pub(crate) async fn process(hub: &Hub, session: &AgentPeer, ev: &Event) -> Result<(), InboundError> {
    let agent = session.name();
    let mode = session.mode();
    let payload = ev.payload()?;
    match (mode, &ev.event_type, payload) {
        (_, _, Payload::Empty) => Ok(()),
        // An Application from an agent is named as the hub knows it, without the agent's
        // namespace-remapped mark (`managed::from_agent`).
        (AgentMode::Managed, EventType::StatusUpdate, Payload::Application(app)) => {
            Ok(managed::status_update(hub, agent, &managed::from_agent(hub, *app)).await?)
        }
        (AgentMode::Managed, EventType::Delete, Payload::Application(app)) => {
            Ok(managed::agent_deleted(hub, agent, &managed::from_agent(hub, *app)).await?)
        }
        (AgentMode::Autonomous, EventType::Create | EventType::SpecUpdate, Payload::Application(app)) => {
            Ok(autonomous::agent_upsert(hub, agent, &unmarked(*app)).await?)
        }
        (AgentMode::Autonomous, EventType::Delete, Payload::Application(app)) => {
            Ok(autonomous::agent_deleted(hub, agent, &unmarked(*app)).await?)
        }
        (AgentMode::Autonomous, EventType::Create | EventType::SpecUpdate, Payload::AppProject(p)) => {
            Ok(project::agent_project_upsert(hub, agent, &p).await?)
        }
        (AgentMode::Autonomous, EventType::Delete, Payload::AppProject(p)) => {
            Ok(project::agent_project_deleted(hub, agent, &p).await?)
        }
        (AgentMode::Managed, EventType::Error, Payload::AgentError(err)) => {
            tracing::warn!(%agent, app = %err.resource_name, message = %err.message, "agent reports an error");
            Ok(managed::agent_error(hub, agent, &err).await?)
        }
        (_, _, Payload::ClusterCacheInfo(info)) => {
            tracing::debug!(%agent, ?info, "cluster cache info");
            Ok(())
        }
        (
            _,
            _,
            p @ (Payload::RequestSyncedResourceList(_)
            | Payload::SyncedResource(_)
            | Payload::RequestUpdate(_)
            | Payload::RequestResourceResync(_)),
        ) => resync::handle(hub, session, ev, p).await,
        (_, _, Payload::Unrecognised(_)) => {
            tracing::warn!(%agent, event_type = %ev.event_type, target = %ev.target,
                "unknown event type or target (a newer peer?); acknowledged and ignored");
            Ok(())
        }
        _ => Err(InboundError::WrongMode { event_type: ev.event_type.clone(), target: ev.target.clone(), mode }),
    }
}
