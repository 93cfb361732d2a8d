//! AppProjects in managed mode (upstream §4.4): the hub's projects in the principal namespace
//! go to every managed agent they match, as an agent-specific copy.

use protocol::argocd::annotations::SOURCE_UID;
use protocol::argocd::{AppProject, ApplicationDestination};
use protocol::kube_store::StoreError;
use protocol::{Event, EventType, Target};

use crate::config::{AgentMode, Mapping, glob_match};
use crate::hub::Hub;
use crate::route::clear_server_fields;

/// The in-cluster server URL agent copies point their destinations at.
pub const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";
/// The in-cluster destination name.
pub use protocol::argocd::application::IN_CLUSTER_NAME;

fn dest_names(p: &AppProject) -> impl Iterator<Item = &str> {
    p.spec.destinations.iter().flatten().filter_map(|d| d.name.as_deref())
}

/// Whether `project` applies to `agent`: some destination name glob-matches it, no `!`-deny
/// destination matches it, and (namespace mapping) `sourceNamespaces` covers it. Under
/// destination-based mapping `sourceNamespaces` names the hub namespaces of Applications, not
/// agents, and is not checked.
#[must_use]
pub fn matches_agent(project: &AppProject, agent: &str, mapping: Mapping) -> bool {
    if project.metadata.source_uid().is_some() {
        return false; // an autonomous agent's project copy: not distributed
    }
    let allowed = dest_names(project).any(|n| !n.starts_with('!') && glob_match(n, agent));
    let denied = dest_names(project).any(|n| n.strip_prefix('!').is_some_and(|g| glob_match(g, agent)));
    let source_ns = mapping == Mapping::Destination
        || project.spec.source_namespaces.iter().flatten().any(|g| glob_match(g, agent));
    allowed && !denied && source_ns
}

/// The copy an agent gets: only the destinations matching it, rewritten to the in-cluster
/// server; no `roles`; no `sourceNamespaces` (namespace mapping: the agent keeps its
/// Applications in its own namespace) or `["*"]` (destination mapping: in the hub's namespaces,
/// as upstream's agent sets it).
#[must_use]
pub fn agent_copy(project: &AppProject, agent: &str, mapping: Mapping) -> AppProject {
    let mut p = project.clone();
    p.spec.destinations = project.spec.destinations.as_ref().map(|ds| {
        ds.iter()
            .filter(|d| d.name.as_deref().is_some_and(|n| !n.starts_with('!') && glob_match(n, agent)))
            .map(|d| ApplicationDestination {
                name: Some(IN_CLUSTER_NAME.into()),
                server: Some(IN_CLUSTER_SERVER.into()),
                ..d.clone()
            })
            .collect()
    });
    p.spec.source_namespaces = (mapping == Mapping::Destination).then(|| vec!["*".to_owned()]);
    p.spec.roles = None;
    p.status = None;
    p
}

pub(crate) fn event_for(hub: &Hub, ty: EventType, project: &AppProject, agent: &str) -> Option<Event> {
    let copy = agent_copy(project, agent, hub.config.mapping());
    hub.object_event(ty, Target::AppProject, &project.metadata, &copy)
}

/// A hub AppProject was added or changed: send it to the managed agents it matches, and a
/// delete to those it no longer matches.
pub(crate) fn hub_project_changed(hub: &Hub, prev: Option<&AppProject>, cur: &AppProject) {
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
        if let Some(ev) = event_for(hub, ty, cur, agent) {
            session.push(ev);
        }
    }
}

/// A hub AppProject was deleted: delete it on every managed agent it matched.
pub(crate) fn hub_project_deleted(hub: &Hub, project: &AppProject) {
    for session in hub.peers.all() {
        if session.mode() == AgentMode::Managed
            && matches_agent(project, session.name(), hub.config.mapping())
            && let Some(ev) = event_for(hub, EventType::Delete, project, session.name())
        {
            session.push(ev);
        }
    }
}

/// The hub copy of an autonomous agent's AppProject (upstream `principal/event.go:442-600`):
/// named `<agent>-<name>` in the principal namespace, `sourceNamespaces = [<agent>]`, every
/// destination `{name: <agent>, server: "*"}`, role policies renamed to the new project.
#[must_use]
pub fn autonomous_hub_copy(agent: &str, incoming: &AppProject, principal_ns: &str) -> AppProject {
    let mut p = incoming.clone();
    let old = incoming.metadata.name.clone().unwrap_or_default();
    let new = format!("{agent}-{old}");
    clear_server_fields(&mut p.metadata);
    p.metadata.name = Some(new.clone());
    p.metadata.namespace = Some(principal_ns.to_owned());
    p.metadata.set_annotation(SOURCE_UID, incoming.metadata.uid.clone().unwrap_or_default());
    p.spec.source_namespaces = Some(vec![agent.to_owned()]);
    p.spec.destinations = incoming.spec.destinations.as_ref().map(|ds| {
        ds.iter()
            .map(|d| ApplicationDestination {
                name: Some(agent.to_owned()),
                server: Some("*".into()),
                namespace: d.namespace.clone(),
                extra: d.extra.clone(),
            })
            .collect()
    });
    if let Some(roles) = p.spec.roles.as_mut() {
        for role in roles {
            let Some(policies) = role.get_mut("policies").and_then(serde_json::Value::as_array_mut) else { continue };
            for policy in policies {
                if let Some(text) = policy.as_str() {
                    *policy = rename_policy(text, &old, &new, agent).into();
                }
            }
        }
    }
    p.status = None;
    p
}

/// `p, proj:<old>:<role>, <res>, <act>, <old>/<obj>, <eff>` becomes
/// `p, proj:<new>:<role>, <res>, <act>, <new>/<agent>/<obj>, <eff>`.
fn rename_policy(policy: &str, old: &str, new: &str, agent: &str) -> String {
    policy
        .split(',')
        .map(|field| {
            let t = field.trim();
            let renamed = if let Some(rest) = t.strip_prefix(&format!("proj:{old}:")) {
                format!("proj:{new}:{rest}")
            } else if let Some(rest) = t.strip_prefix(&format!("{old}/")) {
                format!("{new}/{agent}/{rest}")
            } else {
                t.to_owned()
            };
            if field.starts_with(' ') { format!(" {renamed}") } else { renamed }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `create` / `spec-update` of an AppProject from an autonomous agent.
pub(crate) async fn agent_project_upsert(hub: &Hub, agent: &str, incoming: &AppProject) -> Result<(), StoreError> {
    let ns = hub.config.namespace.clone();
    let copy = autonomous_hub_copy(agent, incoming, &ns);
    let name = copy.metadata.name.clone().unwrap_or_default();
    if !hub.projects.create(&ns, &name, &copy).await? {
        hub.projects
            .update::<AppProject, _>(&ns, &name, |cur| {
                let before = cur.clone();
                cur.spec.clone_from(&copy.spec);
                cur.metadata.labels.clone_from(&copy.metadata.labels);
                cur.metadata.annotations.clone_from(&copy.metadata.annotations);
                *cur != before
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

#[cfg(test)]
mod tests {
    use super::*;

    fn project(dest: &[&str], src_ns: &[&str]) -> AppProject {
        let mut p = AppProject::default();
        p.spec.destinations = Some(
            dest.iter().map(|n| ApplicationDestination { name: Some((*n).into()), ..Default::default() }).collect(),
        );
        p.spec.source_namespaces = Some(src_ns.iter().map(|s| (*s).to_string()).collect());
        p
    }

    #[test]
    fn matching_follows_destinations_and_source_namespaces() {
        assert!(matches_agent(&project(&["agent-*"], &["*"]), "agent-1", Mapping::Namespace));
        assert!(!matches_agent(&project(&["agent-*", "!agent-1"], &["*"]), "agent-1", Mapping::Namespace));
        assert!(!matches_agent(&project(&["agent-*"], &[]), "agent-1", Mapping::Namespace));
        assert!(!matches_agent(&project(&["other"], &["*"]), "agent-1", Mapping::Namespace));
        let copy = agent_copy(&project(&["agent-*", "other"], &["*"]), "agent-1", Mapping::Namespace);
        let dests = copy.spec.destinations.unwrap_or_default();
        assert_eq!(dests.len(), 1);
        assert_eq!(dests[0].server.as_deref(), Some(IN_CLUSTER_SERVER));
        assert!(copy.spec.source_namespaces.is_none());
    }

    #[test]
    fn autonomous_policies_are_renamed() {
        assert_eq!(
            rename_policy("p, proj:dev:admin, applications, get, dev/*, allow", "dev", "agent-1-dev", "agent-1"),
            "p, proj:agent-1-dev:admin, applications, get, agent-1-dev/agent-1/*, allow"
        );
    }
}
