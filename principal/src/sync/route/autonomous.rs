//! Autonomous mode (upstream §4.3): the agent owns its Applications; the hub keeps copies in
//! namespace `<agent>` and reverts edits and deletions made to them on the hub.

use link::Gone;
use protocol::EventType;
use protocol::argocd::Application;
use protocol::argocd::annotations::{LAST_UPDATED, NOTIFIED};
use protocol::kube_store::StoreError;

use crate::sync::hub::{Hub, Key, key_of};
use crate::sync::rules::{
    agent_side_spec, clear_server_fields, operation_appeared, refresh_requested, stamp_written, termination_requested,
    to_hub_copy,
};

/// `create` / `spec-update` from an autonomous agent: create or update the hub copy, stamped
/// `last-updated` when written (an update that changes nothing is not written).
pub(crate) async fn agent_upsert(hub: &Hub, agent: &str, incoming: &Application) -> Result<(), StoreError> {
    let copy = to_hub_copy(agent, incoming);
    let key = key_of(&copy.metadata);
    let name = key.1.clone();
    hub.autonomous.set_source(key.clone(), copy.clone());
    let mut create = copy.clone();
    create.metadata.deletion_timestamp = None;
    stamp_written(&mut create.metadata);
    if !hub.apps.create(agent, &name, &create).await? {
        hub.apps
            .update::<Application, _>(agent, &name, |cur| {
                let notified = cur.metadata.annotation(NOTIFIED).map(str::to_owned);
                let mut next = copy.clone();
                next.metadata.uid.clone_from(&cur.metadata.uid);
                next.metadata.resource_version.clone_from(&cur.metadata.resource_version);
                next.metadata.creation_timestamp.clone_from(&cur.metadata.creation_timestamp);
                next.metadata.deletion_timestamp.clone_from(&cur.metadata.deletion_timestamp);
                if let Some(n) = notified {
                    next.metadata.set_annotation(NOTIFIED, n);
                }
                // The current stamp is kept for the comparison; a write gets a new one.
                if let Some(stamp) = cur.metadata.annotation(LAST_UPDATED) {
                    next.metadata.set_annotation(LAST_UPDATED, stamp);
                }
                let changed = next != *cur;
                if changed {
                    stamp_written(&mut next.metadata);
                }
                *cur = next;
                changed
            })
            .await?;
    }
    if incoming.is_being_deleted() {
        hub.autonomous.expect_delete(key);
        hub.apps.delete(agent, &name).await?;
    }
    Ok(())
}

/// `delete` from an autonomous agent: remove the hub copy, finalizers first.
pub(crate) async fn agent_deleted(hub: &Hub, agent: &str, incoming: &Application) -> Result<(), StoreError> {
    let name = incoming.metadata.name.clone().unwrap_or_default();
    let key: Key = (agent.to_owned(), name.clone());
    hub.autonomous.owner_deleted(key);
    hub.apps.strip_finalizers(agent, &name).await?;
    hub.apps.delete(agent, &name).await?;
    Ok(())
}

/// A hub copy changed: revert spec edits made on the hub, let a hub deletion through to the
/// revert-by-recreate path, and forward sync requests (`.operation`) to the agent.
pub(crate) async fn hub_copy_changed(
    hub: &Hub,
    prev: Option<&Application>,
    cur: &Application,
) -> Result<(), StoreError> {
    let key = key_of(&cur.metadata);
    let (agent, name) = (key.0.clone(), key.1.clone());
    // Among replicas only the agent's owner reverts the hub (the others' indexes follow the watch).
    let owner = hub.acts_for(&agent);
    if cur.is_being_deleted() {
        if owner && !hub.autonomous.is_delete_expected(&key) {
            tracing::info!(%agent, %name, "hub copy of an autonomous Application is being deleted on the hub; it will be recreated");
            hub.apps.strip_finalizers(&agent, &name).await?;
        }
        return Ok(());
    }
    if let Some(src) = hub.autonomous.source_or_adopt(&key, cur)
        && src.spec != cur.spec
        && owner
    {
        tracing::info!(%agent, %name, "reverting a spec edit made on the hub to an autonomous agent's Application");
        hub.apps
            .update::<Application, _>(&agent, &name, |c| {
                let changed = c.spec != src.spec;
                c.spec.clone_from(&src.spec);
                if changed {
                    stamp_written(&mut c.metadata);
                }
                changed
            })
            .await?;
    }
    let Some(session) = hub.peers.get(&agent) else { return Ok(()) };
    let src_op = hub.autonomous.source(&key).and_then(|s| s.operation);
    if operation_appeared(prev, cur)
        && src_op != cur.operation
        && let Some(ev) = hub.app_event(EventType::SetOperation, &agent_side_spec(&agent, cur))
    {
        session.push(ev);
    }
    if refresh_requested(prev, cur)
        && let Some(ev) = hub.app_event(EventType::SpecUpdate, &agent_side_spec(&agent, cur))
    {
        session.push(ev);
    }
    if termination_requested(prev, cur)
        && let Some(ev) = hub.app_event(EventType::TerminateOperation, &agent_side_spec(&agent, cur))
    {
        session.push(ev);
    }
    Ok(())
}

/// A hub copy disappeared: expected (the agent deleted it) or reverted by recreating it.
pub(crate) async fn hub_copy_deleted(hub: &Hub, app: &Application) -> Result<(), StoreError> {
    let key = key_of(&app.metadata);
    // Holding the agent's events off until the restore is written, a `delete` from the agent
    // is applied wholly before (this deletion is then expected) or after (and deletes the
    // restored copy), never in between (upstream #1056).
    let peer = hub.peers.get(&key.0);
    let _applying = match &peer {
        Some(p) => Some(p.applying_alone().await),
        None => None,
    };
    let Gone::Restore(mut src) = hub.autonomous.deleted(&key) else { return Ok(()) };
    if !hub.acts_for(&key.0) {
        return Ok(());
    }
    tracing::info!(agent = %key.0, name = %key.1, "recreating an autonomous agent's Application deleted on the hub");
    clear_server_fields(&mut src.metadata);
    stamp_written(&mut src.metadata);
    hub.apps.create(&key.0, &key.1, &src).await?;
    Ok(())
}
