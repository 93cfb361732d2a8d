//! Checksum resync (upstream §4.13), agent side.
//!
//! What happens, when, why: after **every** (re)connect (upstream: once per process), so
//! changes missed while the stream was down converge:
//!
//! * managed (principal = source of truth): the agent sends a `request-update` with the spec
//!   checksum of every principal-owned Application, AppProject, repository secret and GPG keys
//!   ConfigMap it holds (the principal
//!   answers `spec-update` on mismatch, `delete` if the hub no longer has it) and a
//!   `request-synced-resource-list` with its resource-set checksum (on mismatch the principal
//!   lists its resources and the agent asks for those it lacks);
//! * autonomous (agent = source of truth): the agent sends `request-resource-resync`; the
//!   principal then sends `request-update`s and a `request-synced-resource-list`, which the
//!   agent answers with `spec-update`s, `delete`s and `response-synced-resource`s.
//!
//! Periodically too, with `--resync-interval` (ours; off by default, as upstream has none): one
//! `request-synced-resource-list` carrying the [`spec_digest`] of what the agent holds. Our
//! principal answers nothing when its digest agrees and runs the resync above when it does not
//! (upstream's principal takes it for a resource-set checksum that never matches, and lists its
//! resources: correct, not cheap).

use protocol::argocd::{AppProject, Application, ConfigMap, ObjectMeta, Secret};
use protocol::checksum::{
    RESYNC_KIND_APP_PROJECT, RESYNC_KIND_APPLICATION, RESYNC_KIND_GPG_KEY, RESYNC_KIND_REPOSITORY, ResourceKey,
    config_map_checksum, resource_set_checksum, secret_checksum, spec_checksum, spec_digest,
};
use protocol::event::new_uuid;
use protocol::kube_store::StoreError;
use protocol::payload::{DIGEST_SPEC, RequestResourceResync, RequestSyncedResourceList, RequestUpdate, SyncedResource};
use protocol::{Event, EventType, Payload, Target};
use serde::Serialize;

use crate::config::AgentMode;
use crate::error::InboundError;
use crate::spoke::{Spoke, shipped};

fn checksum_of<T: Serialize>(obj: &T) -> Option<Vec<u8>> {
    let value = serde_json::to_value(obj).ok()?;
    spec_checksum(&value).ok().map(|c| c.to_vec())
}

fn send<T: Serialize>(spoke: &Spoke, ty: EventType, payload: &T) {
    match Event::request(ty, Target::ResourceResync, &new_uuid()).with_json(payload) {
        Ok(ev) => spoke.mailbox.push(ev),
        Err(e) => tracing::error!(error = %e, "cannot encode a resync event"),
    }
}

fn request_update(kind: &str, meta: &ObjectMeta, checksum: Option<Vec<u8>>) -> RequestUpdate {
    RequestUpdate {
        name: meta.name.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        uid: meta.source_uid().or(meta.uid.as_deref()).unwrap_or_default().to_owned(),
        kind: kind.to_owned(),
        checksum,
    }
}

fn repo_checksum(repo: &Secret) -> Option<Vec<u8>> {
    secret_checksum(repo).map(|c| c.to_vec())
}

fn gpg_checksum(cm: &ConfigMap) -> Option<Vec<u8>> {
    config_map_checksum(cm).map(|c| c.to_vec())
}

/// Principal-owned Applications and AppProjects on the spoke (managed mode).
async fn managed_resources(spoke: &Spoke) -> Result<(Vec<Application>, Vec<AppProject>), StoreError> {
    let apps = spoke.list_apps().await?;
    let projects = spoke.projects.list::<AppProject>(spoke.ns()).await?;
    Ok((
        apps.into_iter().filter(|a| a.metadata.source_uid().is_some()).collect(),
        projects.into_iter().filter(|p| p.metadata.source_uid().is_some()).collect(),
    ))
}

/// What a managed agent holds of the principal's: kind, metadata and spec checksum of each.
async fn managed_held(spoke: &Spoke) -> Result<Vec<(&'static str, ObjectMeta, Option<Vec<u8>>)>, StoreError> {
    let (apps, projects) = managed_resources(spoke).await?;
    let repos = shipped::held::<Secret>(spoke).await?;
    let gpg = shipped::held::<ConfigMap>(spoke).await?;
    let mut held = Vec::new();
    // Applications as the principal knows them (one moved from its namespace, in that one).
    held.extend(apps.into_iter().map(|a| (RESYNC_KIND_APPLICATION, spoke.hub_meta(&a.metadata), checksum_of(&a))));
    held.extend(projects.into_iter().map(|p| (RESYNC_KIND_APP_PROJECT, p.metadata.clone(), checksum_of(&p))));
    held.extend(repos.into_iter().map(|r| (RESYNC_KIND_REPOSITORY, r.metadata.clone(), repo_checksum(&r))));
    held.extend(gpg.into_iter().map(|c| (RESYNC_KIND_GPG_KEY, c.metadata.clone(), gpg_checksum(&c))));
    Ok(held)
}

async fn send_request_updates(spoke: &Spoke) -> Result<Vec<ResourceKey>, StoreError> {
    let mut keys = Vec::new();
    for (kind, meta, checksum) in managed_held(spoke).await? {
        send(spoke, EventType::RequestUpdate, &request_update(kind, &meta, checksum));
        keys.push(ResourceKey::from_meta(kind, &meta));
    }
    Ok(keys)
}

/// One periodic resync request (see the module docs).
async fn periodic(spoke: &Spoke) -> Result<(), StoreError> {
    let held: Vec<(ResourceKey, Option<Vec<u8>>)> = match spoke.config.mode {
        AgentMode::Managed => managed_held(spoke)
            .await?
            .into_iter()
            .map(|(kind, meta, checksum)| (ResourceKey::from_meta(kind, &meta), checksum))
            .collect(),
        AgentMode::Autonomous => spoke
            .apps
            .list::<Application>(spoke.ns())
            .await?
            .into_iter()
            .filter(|a| !spoke.excluded(&a.metadata))
            .map(|a| (ResourceKey::from_meta(RESYNC_KIND_APPLICATION, &a.metadata), checksum_of(&a)))
            .collect(),
    };
    let digest = spec_digest(held.iter().map(|(k, c)| (k, c.as_deref()))).map(|d| d.to_vec());
    let request = RequestSyncedResourceList { checksum: digest, digest: Some(DIGEST_SPEC.to_owned()) };
    send(spoke, EventType::RequestSyncedResourceList, &request);
    Ok(())
}

/// Sends a periodic resync request every `every` (the first after a random share of it, so
/// agents that connected together do not tick together) while the stream lasts.
pub(crate) async fn every(spoke: std::sync::Arc<Spoke>, every: std::time::Duration) {
    use std::hash::{BuildHasher as _, Hasher as _};
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let first = every.mul_f64((random % 1000) as f64 / 1000.0);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + first, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Err(e) = periodic(&spoke).await {
            tracing::warn!(error = %e, "cannot read the spoke for the periodic resync; trying again at the next");
        }
    }
}

/// Starts the resync after a (re)connect.
pub(crate) async fn on_connect(spoke: &Spoke) -> Result<(), StoreError> {
    let started = std::time::Instant::now();
    let result = start(spoke).await;
    crate::metrics::global().resync(spoke.config.mode, started.elapsed(), result.is_ok());
    result
}

async fn start(spoke: &Spoke) -> Result<(), StoreError> {
    match spoke.config.mode {
        AgentMode::Managed => {
            let keys = send_request_updates(spoke).await?;
            let checksum = resource_set_checksum(&keys).map(|c| c.to_vec());
            send(spoke, EventType::RequestSyncedResourceList, &RequestSyncedResourceList::of_set(checksum));
        }
        AgentMode::Autonomous => send(spoke, EventType::RequestResourceResync, &RequestResourceResync {}),
    }
    tracing::info!(mode = %spoke.config.mode, "resync started");
    Ok(())
}

/// Handles a `resourceResync` event from the principal.
pub(crate) async fn handle(spoke: &Spoke, ev: &Event, payload: Payload) -> Result<(), InboundError> {
    let ns = spoke.ns();
    match (spoke.config.mode, payload) {
        (AgentMode::Managed, Payload::RequestResourceResync(_)) => {
            send_request_updates(spoke).await?;
            Ok(())
        }
        (AgentMode::Managed, Payload::SyncedResource(res)) => {
            let (meta, checksum) = if res.kind == RESYNC_KIND_APPLICATION {
                // Applications keep the hub's namespace under destination-based mapping (the
                // principal's own moves to the agent's): the copy here of the one named, if any.
                let at = spoke.app_namespace(Some(&res.namespace))?;
                match spoke.apps.get::<Application>(at.namespace, &res.name).await? {
                    Some(a) if !spoke.holds_other(&a.metadata, at) => {
                        (Some(spoke.hub_meta(&a.metadata)), checksum_of(&a))
                    }
                    _ => (None, None),
                }
            } else if res.kind == RESYNC_KIND_APP_PROJECT {
                match spoke.projects.get::<AppProject>(ns, &res.name).await? {
                    Some(p) => (Some(p.metadata.clone()), checksum_of(&p)),
                    None => (None, None),
                }
            } else if res.kind == RESYNC_KIND_REPOSITORY {
                match spoke.secrets.get::<Secret>(ns, &res.name).await? {
                    Some(r) => (Some(r.metadata.clone()), repo_checksum(&r)),
                    None => (None, None),
                }
            } else if res.kind == RESYNC_KIND_GPG_KEY {
                match spoke.config_maps.get::<ConfigMap>(ns, &res.name).await? {
                    Some(c) => (Some(c.metadata.clone()), gpg_checksum(&c)),
                    None => (None, None),
                }
            } else {
                return Ok(());
            };
            let req = match meta {
                Some(m) => request_update(&res.kind, &m, checksum),
                None => {
                    let namespace = if res.kind == RESYNC_KIND_APPLICATION { res.namespace } else { ns.to_owned() };
                    RequestUpdate { name: res.name, namespace, kind: res.kind, ..Default::default() }
                }
            };
            send(spoke, EventType::RequestUpdate, &req);
            Ok(())
        }
        (AgentMode::Autonomous, Payload::RequestSyncedResourceList(req)) => {
            let apps: Vec<Application> = spoke
                .apps
                .list::<Application>(ns)
                .await?
                .into_iter()
                .filter(|a| !spoke.excluded(&a.metadata))
                .collect();
            let keys: Vec<ResourceKey> =
                apps.iter().map(|a| ResourceKey::from_meta(RESYNC_KIND_APPLICATION, &a.metadata)).collect();
            if resource_set_checksum(&keys).map(|c| c.to_vec()) != req.checksum {
                for k in &keys {
                    send(spoke, EventType::ResponseSyncedResource, &SyncedResource::from(k));
                }
            }
            Ok(())
        }
        (AgentMode::Autonomous, Payload::RequestUpdate(req)) => {
            if req.kind != RESYNC_KIND_APPLICATION {
                return Ok(());
            }
            match spoke.apps.get::<Application>(ns, &req.name).await? {
                Some(app) if !spoke.excluded(&app.metadata) => {
                    // A pending deletion does not change the checksum; send it anyway.
                    if checksum_of(&app) != req.checksum || req.uid.is_empty() || app.is_being_deleted() {
                        spoke.send_object(EventType::SpecUpdate, Target::Application, &app.metadata, &app);
                    }
                }
                _ => {
                    let meta = ObjectMeta {
                        name: Some(req.name.clone()),
                        namespace: Some(ns.to_owned()),
                        uid: Some(req.uid.clone()),
                        ..Default::default()
                    };
                    let stub = Application { metadata: meta, ..Default::default() };
                    spoke.send_object(EventType::Delete, Target::Application, &stub.metadata, &stub);
                }
            }
            Ok(())
        }
        (mode, _) => {
            Err(InboundError::WrongMode { event_type: ev.event_type.clone(), target: ev.target.clone(), mode })
        }
    }
}
