//! The sync core's pure rules: what a copy of an object looks like on the other side, whether an
//! object belongs to an agent, what changed between two versions. No state and no I/O (the clock
//! aside, for the `last-updated` stamp): the indexes, the routes and resync build on them, and
//! their tests need nothing but objects.

use protocol::argocd::annotations::{LAST_UPDATED_KEYS, NOTIFIED, REFRESH, SOURCE_UID};
use protocol::argocd::{AppProject, Application, ApplicationDestination, ObjectMeta};

use crate::config::{Mapping, glob_match};

/// `(namespace, name)` of an object on the hub.
pub(crate) type Key = (String, String);

/// The key of an object's metadata.
pub(crate) fn key_of(meta: &ObjectMeta) -> Key {
    (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

/// Whether a hub Application is the copy of an autonomous agent's Application (it carries the
/// `source-uid` annotation the principal stamps on such copies).
pub(crate) fn is_autonomous_copy(app: &Application) -> bool {
    app.metadata.source_uid().is_some()
}

/// Whether the parts the source of truth owns (spec, labels, annotations other than the
/// bookkeeping ones, finalizers, deletion) differ. Both `last-updated` keys are bookkeeping: an
/// object stamped by an earlier version of ours differs from its copy in nothing else.
pub(crate) fn owned_parts_differ(a: &Application, b: &Application) -> bool {
    let annotations = |app: &Application| {
        let mut m = app.metadata.annotations.clone().unwrap_or_default();
        for k in LAST_UPDATED_KEYS.into_iter().chain([NOTIFIED, REFRESH]) {
            m.remove(k);
        }
        m
    };
    a.spec != b.spec
        || a.metadata.labels.clone().unwrap_or_default() != b.metadata.labels.clone().unwrap_or_default()
        || annotations(a) != annotations(b)
        || a.metadata.finalizers.clone().unwrap_or_default() != b.metadata.finalizers.clone().unwrap_or_default()
        || a.metadata.deletion_timestamp != b.metadata.deletion_timestamp
}

/// Whether the operation was just requested (absent before, present now).
pub(crate) fn operation_appeared(prev: Option<&Application>, cur: &Application) -> bool {
    cur.operation.is_some() && prev.is_none_or(|p| p.operation.is_none())
}

/// Whether the operation just entered phase `Terminating`.
pub(crate) fn termination_requested(prev: Option<&Application>, cur: &Application) -> bool {
    cur.is_terminating() && !prev.is_some_and(Application::is_terminating)
}

/// Stamps `meta` as written by the principal now (`last-updated`, upstream's key; the key of
/// earlier versions removed). Upstream's managers stamp every principal write of an agent's data:
/// status, and the hub copies of autonomous agents' Applications and AppProjects.
pub(crate) fn stamp_written(meta: &mut ObjectMeta) {
    meta.stamp_last_updated(&now());
}

/// Now, as the principal writes timestamps (RFC 3339, UTC, whole seconds).
pub(crate) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Clears the fields a new copy must not carry over from the object it was made from.
pub(crate) fn clear_server_fields(m: &mut protocol::argocd::ObjectMeta) {
    m.uid = None;
    m.resource_version = None;
    m.generation = None;
    m.creation_timestamp = None;
    m.deletion_timestamp = None;
    m.owner_references = None;
    m.extra.remove("managedFields");
    m.extra.remove("deletionGracePeriodSeconds");
}

/// Whether the refresh annotation (`argocd.argoproj.io/refresh`) was just set: a refresh
/// request the hub's user or Argo CD makes, forwarded to the agent.
pub(crate) fn refresh_requested(prev: Option<&Application>, cur: &Application) -> bool {
    cur.metadata.annotation(REFRESH).is_some() && prev.is_none_or(|p| p.metadata.annotation(REFRESH).is_none())
}

/// The hub copy of an autonomous agent's Application: namespace `<agent>`, `source-uid` = the
/// agent's UID, project `<agent>-<project>`, no owner refs, and the destination the agent's
/// cluster: as upstream (`principal/event.go`), `name` is the agent's and `server` is cleared,
/// while `namespace` and every other destination field stay as the agent has them (the hub's
/// Argo CD shows and renders the Application into that namespace).
pub(crate) fn to_hub_copy(agent: &str, incoming: &Application) -> Application {
    let mut app = incoming.clone();
    let source_uid = incoming.metadata.uid.clone().unwrap_or_default();
    clear_server_fields(&mut app.metadata);
    app.metadata.deletion_timestamp.clone_from(&incoming.metadata.deletion_timestamp);
    app.metadata.namespace = Some(agent.to_owned());
    app.metadata.set_annotation(SOURCE_UID, source_uid);
    if let Some(project) = app.spec.project.as_mut() {
        *project = format!("{agent}-{project}");
    }
    let destination = app.spec.destination.get_or_insert_with(ApplicationDestination::default);
    destination.name = Some(agent.to_owned());
    destination.server = None;
    app
}

/// The spec of a hub copy as the agent has it, for checksums: project prefix removed.
/// (The destination is left out of checksums anyway.)
pub(crate) fn agent_side_spec(agent: &str, hub_copy: &Application) -> Application {
    let mut app = hub_copy.clone();
    if let Some(project) = app.spec.project.as_mut()
        && let Some(rest) = project.strip_prefix(&format!("{agent}-"))
    {
        *project = rest.to_owned();
    }
    app
}

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
            .filter(|d| keeps_destination(d, agent))
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

/// Whether an agent's copy of a project keeps destination `d` (its name, not a deny, matches).
fn keeps_destination(d: &ApplicationDestination, agent: &str) -> bool {
    d.name.as_deref().is_some_and(|n| !n.starts_with('!') && glob_match(n, agent))
}

/// What tells one agent's copy of `project` from another's: the destinations it keeps, by
/// position. Agents with the same key get the same [`agent_copy`] (everything else in the copy
/// is the same for every agent), so one change is encoded once per key, not once per agent.
#[must_use]
pub fn agent_copy_key(project: &AppProject, agent: &str) -> Vec<usize> {
    let kept = project.spec.destinations.iter().flatten().enumerate();
    kept.filter(|(_, d)| keeps_destination(d, agent)).map(|(i, _)| i).collect()
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
    fn agents_with_the_same_copy_key_get_the_same_copy() {
        let p = project(&["agent-*", "agent-1", "other-*", "!agent-2"], &["*"]);
        let key = |agent| agent_copy_key(&p, agent);
        assert_eq!(key("agent-1"), [0, 1]);
        assert_eq!(key("agent-2"), [0], "a deny destination is never kept");
        assert_eq!(key("other-9"), [2]);
        for (a, b) in [("agent-2", "agent-3"), ("other-1", "other-9"), ("agent-1", "agent-2"), ("x", "y")] {
            let same = key(a) == key(b);
            let copies = agent_copy(&p, a, Mapping::Destination) == agent_copy(&p, b, Mapping::Destination);
            assert_eq!(same, copies, "{a} and {b}: equal keys exactly when equal copies");
        }
    }

    #[test]
    fn autonomous_policies_are_renamed() {
        assert_eq!(
            rename_policy("p, proj:dev:admin, applications, get, dev/*, allow", "dev", "agent-1-dev", "agent-1"),
            "p, proj:agent-1-dev:admin, applications, get, agent-1-dev/agent-1/*, allow"
        );
    }

    #[test]
    fn hub_copy_carries_upstream_annotations_and_mapping() {
        let spoke: Application = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "argocd", "uid": "spoke-uid", "resourceVersion": "7",
                         "ownerReferences": [{"kind": "ApplicationSet"}]},
            "spec": {"project": "default", "destination": {"server": "https://kubernetes.default.svc"}},
            "status": {"health": {"status": "Healthy"}},
        }))
        .unwrap_or_default();
        let copy = to_hub_copy("agent-1", &spoke);
        assert_eq!(copy.metadata.namespace.as_deref(), Some("agent-1"));
        assert_eq!(copy.metadata.source_uid(), Some("spoke-uid"));
        assert!(copy.metadata.uid.is_none() && copy.metadata.resource_version.is_none());
        assert!(copy.metadata.owner_references.is_none());
        assert_eq!(copy.spec.project.as_deref(), Some("agent-1-default"));
        assert_eq!(copy.spec.destination.as_ref().and_then(|d| d.name.as_deref()), Some("agent-1"));
        assert_eq!(copy.status, spoke.status);
        assert_eq!(agent_side_spec("agent-1", &copy).spec.project.as_deref(), Some("default"));
    }

    /// Upstream names the agent's cluster and clears `server`; the namespace (where the hub's
    /// Argo CD renders the Application) and every other destination field stay.
    #[test]
    fn hub_copy_keeps_the_destination_but_names_the_agents_cluster() {
        let spoke: Application = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "argocd", "uid": "spoke-uid"},
            "spec": {"project": "default", "destination": {
                "server": "https://kubernetes.default.svc", "namespace": "guestbook", "futureField": {"x": 1}}},
        }))
        .unwrap_or_default();
        let copy = to_hub_copy("agent-1", &spoke);
        let dest = serde_json::to_value(copy.spec.destination.as_ref()).unwrap_or_default();
        assert_eq!(dest, serde_json::json!({"name": "agent-1", "namespace": "guestbook", "futureField": {"x": 1}}));
        // By name only (no server) is replaced too; no destination at all gets the agent's name.
        let mut named = spoke.clone();
        named.spec.destination =
            Some(ApplicationDestination { name: Some(IN_CLUSTER_NAME.into()), ..Default::default() });
        let copy = to_hub_copy("agent-1", &named);
        assert_eq!(copy.spec.destination.and_then(|d| d.name).as_deref(), Some("agent-1"));
        let mut bare = spoke;
        bare.spec.destination = None;
        let dest = to_hub_copy("agent-1", &bare).spec.destination.unwrap_or_default();
        assert_eq!((dest.name.as_deref(), dest.server, dest.namespace), (Some("agent-1"), None, None));
        // The copy is stable: made again from itself (as resync and the revert compare), it is equal.
        let copy = to_hub_copy("agent-1", &named);
        assert_eq!(to_hub_copy("agent-1", &copy).spec.destination, copy.spec.destination);
    }

    #[test]
    fn either_last_updated_key_is_bookkeeping() {
        use protocol::argocd::annotations::{LAST_UPDATED, LEGACY_LAST_UPDATED};
        let app = Application::default();
        for key in [LAST_UPDATED, LEGACY_LAST_UPDATED, NOTIFIED] {
            let mut stamped = app.clone();
            stamped.metadata.set_annotation(key, "2026-12-02T12:00:00Z");
            assert!(!owned_parts_differ(&app, &stamped), "{key}");
        }
        let mut stamped = app.clone();
        stamp_written(&mut stamped.metadata);
        assert!(stamped.metadata.annotation(LAST_UPDATED).is_some_and(|t| t.ends_with('Z')));
    }
}
