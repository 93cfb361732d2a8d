//! AppProjects in managed mode (upstream §4.4): the hub's projects in the principal namespace
//! go to every managed agent they match, as an agent-specific copy.

use protocol::argocd::AppProject;
use protocol::argocd::annotations::LAST_UPDATED;
use protocol::kube_store::StoreError;
use protocol::{Event, EventType, Target};

use crate::config::AgentMode;
use crate::sync::hub::{Built, Hub};
use crate::sync::rules::{agent_copy, agent_copy_key, autonomous_hub_copy, matches_agent, stamp_written};

pub(crate) fn event_for(hub: &Hub, ty: EventType, project: &AppProject, agent: &str) -> Option<Event> {
    let copy = agent_copy(project, agent, hub.config.mapping());
    hub.object_event(ty, Target::AppProject, &project.metadata, &copy)
}

/// The events of one project change, each built once for every agent that gets the same copy
/// ([`agent_copy_key`]): a project that matches every agent is encoded once, not once per agent.
type Events = Built<(EventType, Vec<usize>)>;

fn event_once(events: &mut Events, hub: &Hub, ty: EventType, project: &AppProject, agent: &str) -> Option<Event> {
    events.get_or_build((ty, agent_copy_key(project, agent)), |(ty, _)| event_for(hub, ty.clone(), project, agent))
}

/// A hub AppProject was added or changed: send it to the managed agents it matches, and a
/// delete to those it no longer matches.
pub(crate) fn hub_project_changed(hub: &Hub, prev: Option<&AppProject>, cur: &AppProject) {
    let mut events = Events::default();
    for session in hub.peers.all() {
        if session.mode() != AgentMode::Managed {
            continue;
        }
        let agent = session.name();
        let before = prev.is_some_and(|p| matches_agent(p, agent, hub.config.mapping()));
        let ty = match (before, matches_agent(cur, agent, hub.config.mapping())) {
            (false, true) => EventType::Create,
            (true, true) if prev != Some(cur) => EventType::SpecUpdate,
            (true, false) => EventType::Delete,
            _ => continue,
        };
        if let Some(ev) = event_once(&mut events, hub, ty, cur, agent) {
            session.push(ev);
        }
    }
}

/// A hub AppProject was deleted: delete it on every managed agent it matched.
pub(crate) fn hub_project_deleted(hub: &Hub, project: &AppProject) {
    let mut events = Events::default();
    for session in hub.peers.all() {
        if session.mode() == AgentMode::Managed
            && matches_agent(project, session.name(), hub.config.mapping())
            && let Some(ev) = event_once(&mut events, hub, EventType::Delete, project, session.name())
        {
            session.push(ev);
        }
    }
}

/// `create` / `spec-update` of an AppProject from an autonomous agent: the hub copy, stamped
/// `last-updated` when written (as upstream's AppProject manager stamps the principal's writes).
pub(crate) async fn agent_project_upsert(hub: &Hub, agent: &str, incoming: &AppProject) -> Result<(), StoreError> {
    let ns = hub.config.namespace.clone();
    let copy = autonomous_hub_copy(agent, incoming, &ns);
    let name = copy.metadata.name.clone().unwrap_or_default();
    let mut created = copy.clone();
    stamp_written(&mut created.metadata);
    if !hub.projects.create(&ns, &name, &created).await? {
        hub.projects
            .update::<AppProject, _>(&ns, &name, |cur| {
                let before = cur.clone();
                let stamp = cur.metadata.annotation(LAST_UPDATED).map(str::to_owned);
                cur.spec.clone_from(&copy.spec);
                cur.metadata.labels.clone_from(&copy.metadata.labels);
                cur.metadata.annotations.clone_from(&copy.metadata.annotations);
                // The current stamp is kept for the comparison; a write gets a new one.
                if let Some(stamp) = stamp {
                    cur.metadata.set_annotation(LAST_UPDATED, stamp);
                }
                let changed = *cur != before;
                if changed {
                    stamp_written(&mut cur.metadata);
                }
                changed
            })
            .await?;
    }
    Ok(())
}

/// `delete` of an AppProject from an autonomous agent.
pub(crate) async fn agent_project_deleted(hub: &Hub, agent: &str, incoming: &AppProject) -> Result<(), StoreError> {
    let name = format!("{agent}-{}", incoming.metadata.name.as_deref().unwrap_or_default());
    hub.projects.strip_finalizers(&hub.config.namespace, &name).await?;
    hub.projects.delete(&hub.config.namespace, &name).await?;
    Ok(())
}
