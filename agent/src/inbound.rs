//! Events from the principal: apply them to the spoke, then ACK.

use link::lock;
use protocol::argocd::annotations::{
    LAST_APPLIED_CONFIGURATION, NAMESPACE_REMAPPED, PRINCIPAL_UID, REFRESH, SOURCE_UID,
};
use protocol::argocd::{AppProject, Application, ApplicationDestination, OperationState};
use protocol::{Event, EventType, Payload, Target};

use crate::config::AgentMode;
pub use crate::error::InboundError;
use crate::resync;
use crate::spoke::{Placement, Spoke, clear_server_fields, shipped};

/// The destination name agent copies point at.
pub use protocol::argocd::application::IN_CLUSTER_NAME;

/// The spoke copy of a hub Application (managed mode, upstream §4.2), kept `at` its place here.
pub(crate) fn to_spoke(incoming: &Application, at: Placement<'_>, principal_uid: Option<&str>) -> Application {
    let mut app = incoming.clone();
    let source_uid = incoming.metadata.uid.clone().unwrap_or_default();
    clear_server_fields(&mut app.metadata);
    app.metadata.namespace = Some(at.namespace.to_owned());
    app.metadata.remove_annotation(LAST_APPLIED_CONFIGURATION);
    // Only this agent says whether its copy was moved.
    app.metadata.remove_annotation(NAMESPACE_REMAPPED);
    if at.remapped {
        app.metadata.set_annotation(NAMESPACE_REMAPPED, "true");
    }
    app.metadata.set_annotation(SOURCE_UID, source_uid);
    if let Some(uid) = principal_uid {
        app.metadata.set_annotation(PRINCIPAL_UID, uid);
    }
    let dest = incoming.spec.destination.clone().unwrap_or_default();
    app.spec.destination = Some(ApplicationDestination { name: Some(IN_CLUSTER_NAME.into()), server: None, ..dest });
    app.status = None;
    app
}

/// Applies one event from the principal.
pub(crate) async fn process(spoke: &Spoke, ev: &Event) -> Result<(), InboundError> {
    let _applying = spoke.applying.lock().await;
    if let Some(uid) = &ev.principal_uid {
        *lock(&spoke.principal_uid) = Some(uid.clone());
    }
    let mode = spoke.config.mode;
    let payload = ev.payload()?;
    let wrong = || InboundError::WrongMode { event_type: ev.event_type.clone(), target: ev.target.clone(), mode };
    match (mode, &ev.event_type, payload) {
        (_, _, Payload::Empty) => Ok(()),
        (AgentMode::Managed, EventType::Create | EventType::SpecUpdate, Payload::Application(app)) => {
            upsert_managed(spoke, &app, ev.principal_uid.as_deref(), ev.event_type == EventType::Create).await
        }
        (AgentMode::Managed, EventType::Delete, Payload::Application(app)) => {
            let (at, name) = spoke_key(spoke, &app)?;
            let ns = at.namespace.to_owned();
            // Events of different resources are not ordered: a delete of an older hub
            // incarnation (other UID) must not remove the copy of a newer one.
            let incoming_uid = app.metadata.uid.as_deref().filter(|u| !u.is_empty());
            if let Some(local) = spoke.apps.get::<Application>(&ns, &name).await? {
                let Some(local_uid) = local.metadata.source_uid() else {
                    // Made here, not by the principal (hybrid setups keep such Applications).
                    tracing::info!(app = %name, "delete for an Application the principal does not own here; ignored");
                    return Ok(());
                };
                if incoming_uid.is_some_and(|uid| uid != local_uid) {
                    tracing::info!(app = %name, "delete for an older incarnation of this Application; ignored");
                    return Ok(());
                }
                if collides(spoke, &local, at) && !same_source(&local, &app) {
                    tracing::info!(app = %name, %ns, hub_namespace = ?app.metadata.namespace,
                        "delete for a hub Application whose name is taken here by another; ignored");
                    return Ok(());
                }
            }
            let key = (ns, name);
            spoke.managed.expect_delete(key.clone());
            if !spoke.apps.delete(&key.0, &key.1).await? {
                spoke.managed.forget(&key);
            }
            Ok(())
        }
        (AgentMode::Autonomous, EventType::SpecUpdate, Payload::Application(app)) => {
            // The principal may only request a refresh or an operation here (upstream
            // `UpdateOperation`); the agent owns the rest.
            set_operation(spoke, &app, true).await
        }
        (_, EventType::SetOperation, Payload::Application(app)) => set_operation(spoke, &app, false).await,
        (_, EventType::TerminateOperation, Payload::Application(app)) => terminate(spoke, &app).await,
        (AgentMode::Managed, EventType::Create | EventType::SpecUpdate, Payload::AppProject(p)) => {
            upsert_project(spoke, &p).await
        }
        (AgentMode::Managed, EventType::Delete, Payload::AppProject(p)) => {
            let name = p.metadata.name.clone().unwrap_or_default();
            spoke.managed_projects.owner_deleted(name.clone());
            if !spoke.projects.delete(spoke.ns(), &name).await? {
                spoke.managed_projects.cancel_delete(&name);
            }
            Ok(())
        }
        (AgentMode::Managed, EventType::Create | EventType::SpecUpdate, Payload::Repository(repo)) => {
            shipped::upsert(spoke, &*repo).await
        }
        (AgentMode::Managed, EventType::Delete, Payload::Repository(repo)) => shipped::delete(spoke, &*repo).await,
        (AgentMode::Managed, EventType::Create | EventType::SpecUpdate, Payload::GpgKey(cm)) => {
            shipped::upsert(spoke, &*cm).await
        }
        (AgentMode::Managed, EventType::Delete, Payload::GpgKey(cm)) => shipped::delete(spoke, &*cm).await,
        (
            _,
            _,
            p @ (Payload::RequestSyncedResourceList(_)
            | Payload::SyncedResource(_)
            | Payload::RequestUpdate(_)
            | Payload::RequestResourceResync(_)),
        ) => resync::handle(spoke, ev, p).await,
        (_, _, Payload::Unrecognised(_)) => {
            tracing::warn!(event_type = %ev.event_type, target = %ev.target,
                "unknown event type or target (a newer principal?); acknowledged and ignored");
            Ok(())
        }
        _ => Err(wrong()),
    }
}

async fn upsert_managed(
    spoke: &Spoke,
    incoming: &Application,
    principal_uid: Option<&str>,
    create: bool,
) -> Result<(), InboundError> {
    let (at, name) = spoke_key(spoke, incoming)?;
    let ns = at.namespace;
    let key = (ns.to_owned(), name.clone());
    if create && !incoming.is_being_deleted() && !spoke.managed.has_source(&key) {
        // A new Application where, as far as this agent knows, nothing is (every copy here has
        // a source since the watch's first list): one request, the create. Only when something
        // is there after all is it read and decided on below. The source is recorded after the
        // create, so no copy of another source is ever held to this one; the applying lock
        // keeps the principal's next event for it behind this.
        let local = to_spoke(incoming, at, principal_uid);
        if create_in_namespace(spoke, ns, &name, &local).await? {
            spoke.managed.set_source(key, local);
            return Ok(());
        }
    }
    let existing = spoke.apps.get::<Application>(ns, &name).await?;
    // Another hub Application holds this place here (one from the principal's namespace
    // and one from the agent's, of one name): the first one stays.
    let taken = existing.as_ref().filter(|e| collides(spoke, e, at) && !same_source(e, incoming));
    if incoming.is_being_deleted() {
        // The hub is deleting it (finalizers pending there): delete here; our `delete` goes
        // up once the local object is gone, and the principal then completes its deletion.
        if taken.is_some() || existing.is_none() {
            spoke.send_object(EventType::Delete, Target::Application, &incoming.metadata, incoming);
            return Ok(());
        }
        spoke.managed.expect_delete(key.clone());
        if !spoke.apps.delete(ns, &name).await? {
            spoke.managed.cancel_delete(&key);
            spoke.send_object(EventType::Delete, Target::Application, &incoming.metadata, incoming);
        }
        return Ok(());
    }
    if let Some(other) = taken {
        return Err(collision(spoke, incoming, other, ns, name));
    }
    let local = to_spoke(incoming, at, principal_uid);
    if let Some(existing) = &existing {
        match identity(spoke, existing, incoming, principal_uid) {
            Identity::Same => {}
            Identity::Adopt => {
                tracing::info!(app = %name, %ns, "adopting an Application made here (adoption policy always)")
            }
            Identity::Transition => {
                tracing::info!(app = %name, %ns, "the Application now comes from another principal; updated in place");
            }
            Identity::Upsert => {
                tracing::info!(app = %name, %ns, "an Application of another source is in the way; updated in place (mismatch policy upsert)");
            }
            Identity::RefuseAdoption => {
                return Err(InboundError::AdoptionRefused { namespace: ns.to_owned(), name });
            }
            Identity::Recreate => {
                tracing::info!(app = %name, %ns, "an Application of another source is in the way; recreating it (mismatch policy recreate)");
                spoke.managed.expect_delete(key.clone());
                if !spoke.apps.delete(ns, &name).await? {
                    spoke.managed.cancel_delete(&key);
                }
                spoke.managed.set_source(key, local.clone());
                return match create_in_namespace(spoke, ns, &name, &local).await? {
                    true => Ok(()),
                    false => Err(InboundError::StillDeleting { namespace: ns.to_owned(), name }),
                };
            }
        }
    }
    spoke.managed.set_source(key, local.clone());
    // Only one that was not there is created (a create that finds one made meanwhile updates it).
    if existing.is_none() && create_in_namespace(spoke, ns, &name, &local).await? {
        return Ok(());
    }
    let updated = spoke
        .apps
        .update_from::<Application, _>(ns, &name, existing, |cur| {
            let before = cur.clone();
            cur.spec.clone_from(&local.spec);
            cur.metadata.labels.clone_from(&local.metadata.labels);
            let refresh = cur.metadata.annotation(REFRESH).map(str::to_owned);
            cur.metadata.annotations.clone_from(&local.metadata.annotations);
            if let Some(r) = refresh.filter(|_| local.metadata.annotation(REFRESH).is_none()) {
                cur.metadata.set_annotation(REFRESH, r);
            }
            cur.metadata.finalizers.clone_from(&local.metadata.finalizers);
            if create && local.operation.is_some() {
                cur.operation.clone_from(&local.operation);
            }
            *cur != before
        })
        .await?;
    if updated.is_none() {
        // Deleted since it was read: created instead.
        create_in_namespace(spoke, ns, &name, &local).await?;
    }
    Ok(())
}

/// How an Application from the principal relates to the one of that name here (upstream
/// `identityAction`).
#[derive(Debug, PartialEq, Eq)]
enum Identity {
    /// The principal's copy: updated.
    Same,
    /// Made here, taken over (adoption policy `always`).
    Adopt,
    /// Made here, left alone (adoption policy `never`).
    RefuseAdoption,
    /// The same Application from another principal (a failover), or a copy from before the
    /// principal's UID was stamped: updated in place.
    Transition,
    /// Another source's: deleted, then the principal's created (mismatch policy `recreate`).
    Recreate,
    /// Another source's: updated in place (mismatch policy `upsert`).
    Upsert,
}

fn identity(spoke: &Spoke, existing: &Application, incoming: &Application, principal_uid: Option<&str>) -> Identity {
    use crate::config::{AdoptionPolicy, MismatchPolicy};
    use protocol::argocd::annotations::{ADOPTION_POLICY, SOURCE_UID_MISMATCH_POLICY};
    let Some(existing_uid) = existing.metadata.source_uid() else {
        let policy = annotated(existing, ADOPTION_POLICY).unwrap_or(spoke.config.adoption_policy);
        return match policy {
            AdoptionPolicy::Always => Identity::Adopt,
            AdoptionPolicy::Never => Identity::RefuseAdoption,
        };
    };
    let incoming_uid = incoming.metadata.source_uid().or(incoming.metadata.uid.as_deref()).unwrap_or_default();
    if existing_uid == incoming_uid {
        return Identity::Same;
    }
    match (existing.metadata.annotation(PRINCIPAL_UID), principal_uid) {
        (Some(theirs), Some(ours)) if theirs != ours => return Identity::Transition,
        (None, _) => return Identity::Transition,
        _ => {}
    }
    match annotated(incoming, SOURCE_UID_MISMATCH_POLICY).unwrap_or(spoke.config.mismatch_policy) {
        MismatchPolicy::Recreate => Identity::Recreate,
        MismatchPolicy::Upsert => Identity::Upsert,
    }
}

/// A policy annotation's value, if it names one (an unknown value is logged and ignored, as
/// upstream falls back to the flag).
fn annotated<T: std::str::FromStr<Err = String>>(app: &Application, annotation: &str) -> Option<T> {
    let value = app.metadata.annotation(annotation)?;
    value
        .parse()
        .map_err(|e| tracing::warn!(app = ?app.metadata.name, %annotation, error = %e, "ignoring the annotation"))
        .ok()
}

/// Creates `app` in `ns`; `Ok(false)` if it exists. Under destination-based mapping a missing
/// namespace is created with `--create-namespace`, or reported (and the event resent) without.
async fn create_in_namespace(spoke: &Spoke, ns: &str, name: &str, app: &Application) -> Result<bool, InboundError> {
    match spoke.apps.create(ns, name, app).await {
        Err(e) if spoke.config.destination_based_mapping && ns != spoke.ns() && e.is_missing_namespace() => {
            if !spoke.config.create_namespace {
                return Err(InboundError::NamespaceMissing { namespace: ns.to_owned() });
            }
            let client = spoke.apps.client();
            protocol::kube_store::ensure_namespace(&client, ns, &std::collections::BTreeMap::new())
                .await
                .map_err(|source| InboundError::NamespaceCreate { namespace: ns.to_owned(), source })?;
            tracing::info!(namespace = %ns, "created the namespace of a principal-owned Application");
            Ok(spoke.apps.create(ns, name, app).await?)
        }
        other => Ok(other?),
    }
}

/// Where the spoke Application an event from the principal is about is kept, and its name.
fn spoke_key<'a>(spoke: &'a Spoke, incoming: &'a Application) -> Result<(Placement<'a>, String), InboundError> {
    Ok((
        spoke.app_namespace(incoming.metadata.namespace.as_deref())?,
        incoming.metadata.name.clone().unwrap_or_default(),
    ))
}

/// Whether `existing` holds the place `at` for another hub Application (see
/// [`Spoke::holds_other`]).
fn collides(spoke: &Spoke, existing: &Application, at: Placement<'_>) -> bool {
    spoke.holds_other(&existing.metadata, at)
}

/// Whether `existing` is the copy of the hub Application `incoming`.
fn same_source(existing: &Application, incoming: &Application) -> bool {
    let uid = incoming.metadata.source_uid().or(incoming.metadata.uid.as_deref()).filter(|u| !u.is_empty());
    uid.is_some() && existing.metadata.source_uid() == uid
}

/// The error that refuses `incoming`, whose place here `other` holds (see [`collides`]).
fn collision(spoke: &Spoke, incoming: &Application, other: &Application, ns: &str, name: String) -> InboundError {
    let err = InboundError::NamespaceCollision {
        namespace: ns.to_owned(),
        name,
        hub_namespace: incoming.metadata.namespace.clone().unwrap_or_default(),
        held_hub_namespace: spoke.hub_namespace(&other.metadata).to_owned(),
    };
    tracing::warn!(error = %err, "refused an Application");
    err
}

async fn set_operation(spoke: &Spoke, incoming: &Application, refresh_only: bool) -> Result<(), InboundError> {
    let (at, name) = spoke_key(spoke, incoming)?;
    let ns = at.namespace;
    let mut other = None;
    let written = spoke
        .apps
        .update::<Application, _>(ns, &name, |cur| {
            if collides(spoke, cur, at) && !same_source(cur, incoming) {
                other = Some(cur.clone());
                return false;
            }
            let before = cur.clone();
            if cur.is_terminating() && incoming.operation.is_some() {
                return false; // upstream ignores a new operation while terminating
            }
            if incoming.operation.is_some() || !refresh_only {
                cur.operation.clone_from(&incoming.operation);
            }
            if let Some(r) = incoming.metadata.annotation(REFRESH) {
                cur.metadata.set_annotation(REFRESH, r);
            }
            *cur != before
        })
        .await?;
    if let Some(other) = other {
        return Err(collision(spoke, incoming, &other, ns, name));
    }
    spoke.managed.update_source(&(ns.to_owned(), name.clone()), |src| src.operation.clone_from(&incoming.operation));
    match written {
        Some(_) => Ok(()),
        None => Err(InboundError::Missing { name, namespace: ns.to_owned() }),
    }
}

async fn terminate(spoke: &Spoke, incoming: &Application) -> Result<(), InboundError> {
    let (at, name) = spoke_key(spoke, incoming)?;
    let ns = at.namespace;
    let mut other = None;
    let written = spoke
        .apps
        .update::<Application, _>(ns, &name, |cur| {
            if collides(spoke, cur, at) && !same_source(cur, incoming) {
                other = Some(cur.clone());
                return false;
            }
            if cur.is_terminating() {
                return false;
            }
            let status = cur.status.get_or_insert_with(Default::default);
            status.operation_state.get_or_insert_with(Default::default).phase =
                Some(OperationState::PHASE_TERMINATING.to_owned());
            true
        })
        .await?;
    if let Some(other) = other {
        return Err(collision(spoke, incoming, &other, ns, name));
    }
    match written {
        Some(_) => Ok(()),
        None => Err(InboundError::Missing { name, namespace: ns.to_owned() }),
    }
}

async fn upsert_project(spoke: &Spoke, incoming: &AppProject) -> Result<(), InboundError> {
    let ns = spoke.ns();
    let name = incoming.metadata.name.clone().unwrap_or_default();
    let mut local = incoming.clone();
    let source_uid = incoming.metadata.uid.clone().unwrap_or_default();
    clear_server_fields(&mut local.metadata);
    local.metadata.namespace = Some(ns.to_owned());
    local.metadata.set_annotation(SOURCE_UID, source_uid);
    if spoke.config.destination_based_mapping {
        // Its Applications live in the hub's namespaces here (upstream's agent does the same).
        local.spec.source_namespaces = Some(vec!["*".to_owned()]);
    }
    spoke.managed_projects.set_source(name.clone(), local.clone());
    if spoke.projects.create(ns, &name, &local).await? {
        return Ok(());
    }
    spoke
        .projects
        .update::<AppProject, _>(ns, &name, |cur| {
            let before = cur.clone();
            cur.spec.clone_from(&local.spec);
            cur.metadata.labels.clone_from(&local.metadata.labels);
            cur.metadata.annotations.clone_from(&local.metadata.annotations);
            cur.metadata.finalizers.clone_from(&local.metadata.finalizers);
            *cur != before
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spoke_copy_is_stamped_and_rewritten_as_upstream() {
        let hub: Application = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "agent-1", "uid": "hub-uid", "resourceVersion": "3",
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {"destination": {"server": "https://remote", "namespace": "guestbook"}},
            "status": {"health": {"status": "Healthy"}},
        }))
        .unwrap_or_default();
        let local = to_spoke(&hub, Placement { namespace: "argocd", remapped: false }, Some("principal-uid"));
        assert_eq!(local.metadata.namespace.as_deref(), Some("argocd"));
        assert_eq!(local.metadata.source_uid(), Some("hub-uid"));
        assert_eq!(local.metadata.annotation(PRINCIPAL_UID), Some("principal-uid"));
        assert!(local.metadata.annotation(LAST_APPLIED_CONFIGURATION).is_none());
        assert!(local.metadata.uid.is_none() && local.status.is_none());
        let dest = local.spec.destination.unwrap_or_default();
        assert_eq!((dest.name.as_deref(), dest.server.as_deref()), (Some(IN_CLUSTER_NAME), None));
        assert_eq!(dest.namespace.as_deref(), Some("guestbook"));
    }

    #[test]
    fn only_the_agent_marks_a_moved_copy() {
        let mut hub: Application = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "argocd", "uid": "hub-uid"},
            "spec": {"destination": {"name": "agent-1", "namespace": "guestbook"}},
        }))
        .unwrap_or_default();
        let moved = to_spoke(&hub, Placement { namespace: "argocd-agent", remapped: true }, None);
        assert_eq!(moved.metadata.namespace.as_deref(), Some("argocd-agent"));
        assert_eq!(moved.metadata.annotation(NAMESPACE_REMAPPED), Some("true"));
        hub.metadata.set_annotation(NAMESPACE_REMAPPED, "true");
        let kept = to_spoke(&hub, Placement { namespace: "argocd", remapped: false }, None);
        assert_eq!(kept.metadata.annotation(NAMESPACE_REMAPPED), None, "a mark on the hub copy means nothing here");
    }
}
