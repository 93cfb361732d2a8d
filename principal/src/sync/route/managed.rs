//! Managed mode (upstream §4.2): the hub owns Applications; specs flow down, status flows up.

use protocol::argocd::Application;
use protocol::argocd::annotations::{LAST_UPDATED, LEGACY_LAST_UPDATED, NAMESPACE_REMAPPED, REFRESH};
use protocol::kube_store::StoreError;
use protocol::{EventType, Target, merge_patch};

use crate::config::AgentMode;
use crate::sync::hub::{Hub, StatusBase, StatusPathCounters};
use crate::sync::rules::{
    IN_CLUSTER_NAME, IN_CLUSTER_SERVER, now, operation_appeared, owned_parts_differ, refresh_requested,
    termination_requested,
};

/// The events a hub change of a managed Application sends to its agent.
pub(crate) fn changes(prev: Option<&Application>, cur: &Application) -> Vec<EventType> {
    let Some(prev) = prev else { return vec![EventType::Create] };
    let mut out = Vec::new();
    if termination_requested(Some(prev), cur) {
        out.push(EventType::TerminateOperation);
    } else if owned_parts_differ(prev, cur) || refresh_requested(Some(prev), cur) {
        out.push(EventType::SpecUpdate);
    }
    if operation_appeared(Some(prev), cur) {
        out.push(EventType::SetOperation);
    }
    out
}

/// Builds the event of type `ty` for `app` (spec-updates go without `.operation`, as
/// upstream `callbacks.go:196-203`).
pub(crate) fn event_for(hub: &Hub, ty: EventType, app: &Application) -> Option<protocol::Event> {
    if ty == EventType::SpecUpdate {
        let mut stripped = app.clone();
        stripped.operation = None;
        hub.app_event(ty, &stripped)
    } else {
        hub.app_event(ty, app)
    }
}

/// A hub Application of a managed agent was added or changed. Under destination-based mapping
/// a new `spec.destination.name` moves it: `delete` to the agent it left, `create` to the one
/// it now targets (upstream `callbacks.go`).
pub(crate) fn hub_app_changed(hub: &Hub, prev: Option<&Application>, cur: &Application) {
    let before = prev.and_then(|p| hub.agent_of(p));
    let now = hub.agent_of(cur);
    if let Some(agent) = now
        && targets_the_hub(cur)
        && prev.is_none_or(|p| p.spec.destination != cur.spec.destination)
    {
        tracing::warn!(
            %agent,
            app = ?cur.metadata.name,
            namespace = ?cur.metadata.namespace,
            "hub Application for agent {agent} targets the hub's own cluster (destination server {IN_CLUSTER_SERVER} \
             or name {IN_CLUSTER_NAME}): the hub's Argo CD will read and write the hub's objects, not the agent's; \
             set spec.destination.name to {agent:?} (the agent's cluster secret) and drop spec.destination.server"
        );
    }
    let prev = if before == now {
        prev
    } else {
        if let Some(p) = prev {
            hub_app_deleted(hub, p);
        }
        None
    };
    let Some(session) = now.and_then(|agent| hub.peers.get(agent)) else { return };
    if session.mode() != AgentMode::Managed {
        return;
    }
    for ty in changes(prev, cur) {
        if let Some(ev) = event_for(hub, ty, cur) {
            session.push(ev);
        }
    }
}

/// Whether a hub Application's destination is the hub's own cluster (the in-cluster server or
/// name), which for an agent's Application is always a mistake: Argo CD on the hub would work on
/// the hub's objects instead of going through the resource proxy to the agent's cluster.
pub(crate) fn targets_the_hub(app: &Application) -> bool {
    let Some(d) = app.spec.destination.as_ref() else { return false };
    let server = d.server.as_deref().map(|s| s.trim_end_matches('/')).filter(|s| !s.is_empty());
    match (server, d.name.as_deref().filter(|n| !n.is_empty())) {
        (Some(server), _) => server == IN_CLUSTER_SERVER,
        (None, Some(name)) => name == IN_CLUSTER_NAME,
        (None, None) => false,
    }
}

/// A hub Application of a managed agent was deleted (or left that agent).
pub(crate) fn hub_app_deleted(hub: &Hub, app: &Application) {
    let Some(session) = hub.agent_of(app).and_then(|agent| hub.peers.get(agent)) else { return };
    if session.mode() == AgentMode::Managed
        && let Some(ev) = hub.object_event(EventType::Delete, Target::Application, &app.metadata, app)
    {
        session.push(ev);
    }
}

/// An Application from an agent as the hub knows it. Under destination-based mapping an agent
/// keeps an Application of the principal's namespace in its own when the two differ, marked
/// `argocd.argoproj.io/namespace-remapped=true` (upstream §4.2): one so marked is in the
/// principal's namespace here, whatever namespace it names. The mark is the agent's alone and
/// never reaches the hub.
pub(crate) fn from_agent(hub: &Hub, mut app: Application) -> Application {
    if unmark(&mut app) && hub.config.destination_based_mapping {
        app.metadata.namespace = Some(hub.config.namespace.clone());
    }
    app
}

/// Removes an agent's namespace-remapped mark from `app`; whether it was set.
pub(crate) fn unmark(app: &mut Application) -> bool {
    app.metadata.remove_annotation(NAMESPACE_REMAPPED).is_some_and(|v| v == "true")
}

/// Whether `agent` may write to the hub Application `app` (its own, by the mapping in use): an
/// agent is never let near another agent's Application, whatever namespace its event names.
fn owned_by(hub: &Hub, agent: &str, app: &Application) -> bool {
    let ok = hub.agent_of(app) == Some(agent);
    if !ok {
        tracing::warn!(%agent, app = ?app.metadata.name, namespace = ?app.metadata.namespace,
            target = ?hub.agent_of(app), "event for a hub Application of another agent; ignored");
    }
    ok
}

/// `status-update` from a managed agent: writes `.status` and `.operation` onto the hub
/// Application through the main resource (Argo CD's Application has no status subresource),
/// mirrors the refresh annotation and stamps `last-updated`.
///
/// One conditional merge patch against what the principal knows of the hub copy (its own last
/// write until the watch has caught up with it, else the watch cache); a read-modify-write when
/// that is stale (the hub refuses the patch), has nothing to change, or is missing.
pub(crate) async fn status_update(hub: &Hub, agent: &str, incoming: &Application) -> Result<(), StoreError> {
    let name = incoming.metadata.name.as_deref().unwrap_or_default();
    let ns = hub.managed_namespace(agent, incoming.metadata.namespace.as_deref());
    let key = (ns.to_owned(), name.to_owned());
    let now = now();
    // The conditional patch's base is a version the watch showed for this agent (or the
    // principal's own write to it), so a patch never lands on another agent's Application.
    if hub.seen_apps.seen_satisfies(&key, |seen| owned_by(hub, agent, seen)) == Some(false) {
        return Ok(());
    }
    let base = hub.seen_apps.status_base(&key);
    let paths = &hub.status_paths;
    let rmw_because = match base.as_ref().map(|b| status_patch(b, incoming, &now)) {
        None => "no_base",
        Some(None) => "unchanged",
        Some(Some(patch)) => {
            if let Some(written) = hub.apps.patch_if_unchanged::<Application>(ns, name, &patch).await? {
                StatusPathCounters::count(&paths.patched);
                crate::metrics::global().status_write("patched");
                hub.seen_apps.wrote_status(key, &written);
                return Ok(());
            }
            // 409: the hub moved on since the base (or the Application is gone).
            StatusPathCounters::count(&paths.patch_refused);
            "refused"
        }
    };
    StatusPathCounters::count(&paths.read_modify_write);
    crate::metrics::global().status_write(rmw_because);
    let mut foreign = false;
    let written = hub
        .apps
        .update::<Application, _>(ns, name, |hub_app| {
            if hub.agent_of(hub_app) != Some(agent) {
                foreign = true;
                return false;
            }
            if hub_app.status == incoming.status && hub_app.operation == incoming.operation {
                return false;
            }
            hub_app.status.clone_from(&incoming.status);
            hub_app.operation.clone_from(&incoming.operation);
            match incoming.metadata.annotation(REFRESH) {
                Some(v) => hub_app.metadata.set_annotation(REFRESH, v),
                None => {
                    hub_app.metadata.remove_annotation(REFRESH);
                }
            }
            hub_app.metadata.stamp_last_updated(&now);
            true
        })
        .await?;
    match written {
        Some(app) if foreign => _ = owned_by(hub, agent, &app),
        Some(app) => hub.seen_apps.wrote_status(key, &app),
        None => tracing::debug!(%agent, %name, "status-update for an Application the hub does not have; ignored"),
    }
    Ok(())
}

/// The merge patch that writes `incoming`'s status and operation over `base`, valid only while
/// the hub is still at `base`'s resourceVersion, stamped `last-updated` (the key of earlier
/// versions removed). `None` when there is nothing to change.
fn status_patch(base: &StatusBase, incoming: &Application, now: &str) -> Option<serde_json::Value> {
    let status = merge_patch::diff(&base.status, &serde_json::to_value(&incoming.status).ok()?);
    let operation = merge_patch::diff(&base.operation, &serde_json::to_value(&incoming.operation).ok()?);
    if status.is_none() && operation.is_none() {
        return None;
    }
    let mut patch = serde_json::json!({"metadata": {"resourceVersion": base.resource_version, "annotations": {
        REFRESH: incoming.metadata.annotation(REFRESH),
        LAST_UPDATED: now,
        LEGACY_LAST_UPDATED: null,
    }}});
    for (field, diff) in [("status", status), ("operation", operation)] {
        if let Some(d) = diff {
            patch[field] = d;
        }
    }
    Some(patch)
}

/// `delete` from a managed agent: completes a hub deletion that waits on the agent (the hub
/// Application has a deletion timestamp); otherwise ignored, the hub stays the source of truth.
pub(crate) async fn agent_deleted(hub: &Hub, agent: &str, incoming: &Application) -> Result<(), StoreError> {
    let name = incoming.metadata.name.as_deref().unwrap_or_default();
    let ns = hub.managed_namespace(agent, incoming.metadata.namespace.as_deref());
    match hub.apps.get::<Application>(ns, name).await? {
        Some(app) if app.is_being_deleted() && owned_by(hub, agent, &app) => {
            tracing::info!(%agent, %ns, %name, "agent finished deleting; removing finalizers on the hub");
            hub.apps.strip_finalizers(ns, name).await
        }
        _ => Ok(()),
    }
}

/// `.error` from a managed agent: the hub Application gets health `Degraded` and a condition
/// of type `AgentError` with the agent's message (upstream `principal/event.go:388-421`), stamped
/// `last-updated` as upstream's `UpdateStatus` stamps it.
pub(crate) async fn agent_error(hub: &Hub, agent: &str, err: &protocol::payload::ErrorData) -> Result<(), StoreError> {
    let now = now();
    let ns = hub.managed_namespace(agent, Some(&err.resource_namespace));
    hub.apps
        .update::<Application, _>(ns, &err.resource_name, |app| {
            if hub.agent_of(app) != Some(agent) {
                return false;
            }
            let status = app.status.get_or_insert_with(Default::default);
            status.extra.insert("health".into(), serde_json::json!({"status": "Degraded", "message": err.message}));
            let condition =
                serde_json::json!({"type": "AgentError", "message": err.message, "lastTransitionTime": now});
            let conditions = status.extra.entry("conditions").or_insert_with(|| serde_json::json!([]));
            match conditions.as_array_mut() {
                Some(list) => {
                    list.retain(|c| c.get("type").and_then(serde_json::Value::as_str) != Some("AgentError"));
                    list.push(condition.clone());
                }
                None => *conditions = serde_json::json!([condition]),
            }
            app.metadata.stamp_last_updated(&now);
            true
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(path: &str) -> Application {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "agent-1", "uid": "u1", "resourceVersion": "1"},
            "spec": {"source": {"path": path}},
        }))
        .unwrap_or_default()
    }

    #[test]
    fn the_in_cluster_destination_is_the_hubs_own_cluster() {
        use protocol::argocd::ApplicationDestination as D;
        let with = |d: D| {
            let mut a = app("p");
            a.spec.destination = Some(d);
            targets_the_hub(&a)
        };
        assert!(with(D { server: Some("https://kubernetes.default.svc/".into()), ..Default::default() }));
        assert!(with(D { name: Some("in-cluster".into()), ..Default::default() }));
        assert!(!with(D { name: Some("agent-1".into()), ..Default::default() }));
        assert!(!with(D { server: Some("https://proxy:8443?agentName=agent-1".into()), ..Default::default() }));
        assert!(!targets_the_hub(&app("p")), "no destination: nothing to say");
    }

    #[tokio::test]
    async fn destination_based_mapping_routes_by_destination_name_and_guards_other_agents_apps() {
        let mut config = crate::config::PrincipalConfig::new("argocd");
        config.destination_based_mapping = true;
        let hub = Hub::offline(config);
        let mut app = app("p");
        app.metadata.namespace = Some("team-a".into());
        assert_eq!(hub.agent_of(&app), None, "no destination name: no agent");
        app.spec.destination =
            Some(protocol::argocd::ApplicationDestination { name: Some("dm1".into()), ..Default::default() });
        assert_eq!(hub.agent_of(&app), Some("dm1"));
        assert!(owned_by(&hub, "dm1", &app));
        assert!(!owned_by(&hub, "dm2", &app), "another agent never writes to it");
        app.spec.destination =
            Some(protocol::argocd::ApplicationDestination { name: Some("in-cluster".into()), ..Default::default() });
        assert_eq!(hub.agent_of(&app), None, "in-cluster goes to no agent");
        assert_eq!(hub.managed_namespace("dm1", Some("team-a")), "team-a");
        assert_eq!(hub.managed_namespace("dm1", Some("")), "dm1");

        let hub = Hub::offline(crate::config::PrincipalConfig::new("argocd"));
        assert_eq!(hub.agent_of(&app), Some("team-a"), "namespace mapping: the namespace");
        assert_eq!(hub.managed_namespace("dm1", Some("team-a")), "dm1", "namespace mapping: the agent's own");
    }

    #[tokio::test]
    async fn a_moved_application_is_in_the_principal_namespace_and_loses_its_mark() {
        let mut config = crate::config::PrincipalConfig::new("argocd");
        config.destination_based_mapping = true;
        let hub = Hub::offline(config);
        let mut moved = app("p");
        moved.metadata.namespace = Some("argocd-agent".into());
        moved.metadata.set_annotation(NAMESPACE_REMAPPED, "true");
        moved.metadata.set_annotation(REFRESH, "normal");
        let seen = from_agent(&hub, moved.clone());
        assert_eq!(seen.metadata.namespace.as_deref(), Some("argocd"));
        assert_eq!(seen.metadata.annotation(NAMESPACE_REMAPPED), None);
        assert_eq!(seen.metadata.annotation(REFRESH), Some("normal"), "other annotations stay");

        let mut named = moved.clone();
        named.metadata.namespace = Some("argocd".into());
        let seen = from_agent(&hub, named);
        assert_eq!(seen.metadata.namespace.as_deref(), Some("argocd"), "already named as the hub knows it");

        let mut own = app("p");
        own.metadata.namespace = Some("argocd-agent".into());
        assert_eq!(from_agent(&hub, own.clone()), own, "an unmarked one is as named");

        let by_namespace = Hub::offline(crate::config::PrincipalConfig::new("argocd"));
        let seen = from_agent(&by_namespace, moved.clone());
        assert_eq!(seen.metadata.namespace.as_deref(), Some("argocd-agent"), "namespace mapping ignores the mark");
        assert_eq!(seen.metadata.annotation(NAMESPACE_REMAPPED), None, "but never writes it");

        // The status patch carries the refresh and last-updated annotations only (and removes
        // the last-updated key of earlier versions).
        let base = StatusBase {
            resource_version: "1".into(),
            status: serde_json::Value::Null,
            operation: serde_json::Value::Null,
        };
        let mut incoming = from_agent(&hub, moved);
        incoming.status = serde_json::from_value(serde_json::json!({"sync": {"status": "Synced"}})).ok();
        let patch = status_patch(&base, &incoming, "now").expect("a status change");
        let mut annotations: Vec<&String> =
            patch["metadata"]["annotations"].as_object().into_iter().flat_map(|a| a.keys()).collect();
        annotations.sort();
        assert_eq!(annotations, [LEGACY_LAST_UPDATED, LAST_UPDATED, REFRESH]);
        assert_eq!(patch["metadata"]["annotations"][LEGACY_LAST_UPDATED], serde_json::Value::Null);
    }

    #[test]
    fn hub_changes_map_to_upstream_event_types() {
        let base = app("p");
        assert_eq!(changes(None, &base), vec![EventType::Create]);
        assert!(changes(Some(&base), &base).is_empty(), "no change, no event");

        let mut status_only = base.clone();
        status_only.status = Some(Default::default());
        status_only.metadata.set_annotation(LAST_UPDATED, "now");
        assert!(changes(Some(&base), &status_only).is_empty(), "status writes are not echoed down");

        assert_eq!(changes(Some(&base), &app("q")), vec![EventType::SpecUpdate]);

        let mut op = base.clone();
        op.operation = Some(serde_json::json!({"sync": {}}));
        assert_eq!(changes(Some(&base), &op), vec![EventType::SetOperation]);

        let mut term = base.clone();
        term.status = serde_json::from_value(serde_json::json!({"operationState": {"phase": "Terminating"}})).ok();
        assert_eq!(changes(Some(&base), &term), vec![EventType::TerminateOperation]);

        let mut refresh = base.clone();
        refresh.metadata.set_annotation(REFRESH, "hard");
        assert_eq!(changes(Some(&base), &refresh), vec![EventType::SpecUpdate]);
    }
}
