//! Checksum resync (upstream §4.13), principal side.
//!
//! What happens, when, why: on **every** connect (upstream: the first per principal process;
//! doing it every time costs one round of checksums and repairs anything lost while the
//! stream was down):
//!
//! * managed agent (hub = source of truth): the principal pushes every AppProject the agent
//!   matches, every repository secret of those projects and the GPG keys ConfigMap (and, to an
//!   upstream agent, a `create` of every Application it should hold, as upstream's principal
//!   does: upstream's agent lists what it holds only once per process), then asks for `request-resource-resync`; the agent answers with a
//!   `request-update` per resource it holds (the principal answers `delete` for what the hub
//!   no longer has, `spec-update` where the spec checksum differs) and a
//!   `request-synced-resource-list` (on checksum mismatch the principal lists what it has,
//!   and the agent asks for what it is missing);
//! * autonomous agent (agent = source of truth): the principal sends a `request-update` per
//!   hub copy it holds and a `request-synced-resource-list`; the agent answers the same way.
//!
//! Periodic resync (ours; `--resync-interval` on the agent, `--resync-min-interval` here): the
//! agent sends one `request-synced-resource-list` whose checksum is the
//! [`protocol::checksum::spec_digest`] of what it holds, spec checksums included. The principal
//! computes the same digest of what the agent should hold; equal, it sends nothing (one message
//! per agent per interval, and hashing from the watch caches, no hub request); different, it runs
//! the resync above for that agent, which sends only what differs. What the agent should hold
//! is read from the watch indexes by agent (its Applications by namespace or destination, the
//! projects matching it, their repositories), each object with the digest entry kept for its
//! version: a digest costs in proportion to what the agent holds and what changed since its
//! last one, not to the size of the hub.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use protocol::argocd::{AppProject, Application, ConfigMap, ObjectMeta, Secret};
use protocol::checksum::{
    Checksum, RESYNC_KIND_APP_PROJECT, RESYNC_KIND_APPLICATION, RESYNC_KIND_GPG_KEY, RESYNC_KIND_REPOSITORY,
    ResourceKey, config_map_checksum, resource_set_checksum, secret_checksum,
};
use protocol::event::new_uuid;
use protocol::kube_store::StoreError;
use protocol::payload::{RequestResourceResync, RequestSyncedResourceList, RequestUpdate, SyncedResource};
use protocol::{Event, EventType, Payload, Target};
use serde::Serialize;

use crate::config::AgentMode;
use crate::error::InboundError;
use crate::peer::AgentPeer;
use crate::sync::hub::{AgentApps, DigestEntry, Hub, Shipped, app_entry, digest, key_of, project_entry};
use crate::sync::route::{managed, project, repository};
use crate::sync::rules::{self, is_autonomous_copy};

/// The spec checksum of an object, `None` if it has no spec.
pub(crate) fn checksum_of<T: Serialize>(obj: &T) -> Option<Vec<u8>> {
    crate::sync::hub::spec_checksum(obj).map(|c| c.to_vec())
}

fn resync_event<T: Serialize>(ty: EventType, payload: &T) -> Option<Event> {
    match Event::request(ty, Target::ResourceResync, &new_uuid()).with_json(payload) {
        Ok(ev) => Some(ev),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode a resync event");
            None
        }
    }
}

fn push(session: &AgentPeer, ev: Option<Event>) {
    if let Some(ev) = ev {
        session.push(ev);
    }
}

// The resync reads the hub from the watchers' caches once they have listed it: a connecting
// agent then costs no LIST against the hub API server, so a reconnect storm of N agents is not
// N x 3 LISTs (each a pooled connection to the hub held afterwards). Before the first list (a
// principal that just started) the hub is read live. The cache may lag the hub by a watch
// event; for what the hub owns (managed mode) whatever it misses arrives as that event, through
// the agent's outbox, right after. The hub copies of an autonomous agent are the exception: a
// watch event of a copy sends nothing to its agent, so a copy the cache has not shown yet
// would never be checked. Those are listed live (one LIST per autonomous agent's connect).

/// One hub Application: from the watch cache when it has it, else read live (a cache miss is
/// rare, a deletion or an object the watch has not delivered yet, and must not be mistaken
/// for a deletion).
async fn agent_app(hub: &Hub, ns: &str, name: &str) -> Result<Option<Application>, StoreError> {
    if hub.apps_synced.load(Ordering::Relaxed)
        && let Some(app) = hub.seen_apps.get(&(ns.to_owned(), name.to_owned()))
    {
        return Ok(Some(app));
    }
    hub.apps.get::<Application>(ns, name).await
}

/// One AppProject of the principal namespace, as [`agent_app`].
async fn principal_project(hub: &Hub, name: &str) -> Result<Option<AppProject>, StoreError> {
    if hub.projects_synced.load(Ordering::Relaxed)
        && let Some(p) = hub.seen_projects.get(name)
    {
        return Ok(Some(p));
    }
    hub.projects.get::<AppProject>(&hub.config.namespace, name).await
}

/// Which hub Applications route to a managed agent: those in its namespace, or under
/// destination-based mapping those whose destination names it.
fn routed_to<'a>(hub: &Hub, agent: &'a str) -> AgentApps<'a> {
    if hub.config.destination_based_mapping { AgentApps::DestinedFor(agent) } else { AgentApps::InNamespace(agent) }
}

/// Whether a hub Application routed to a managed agent is one it holds.
fn managed_held(hub: &Hub, app: &Application) -> bool {
    !is_autonomous_copy(app) && !hub.excluded(&app.metadata)
}

/// The hub Applications a managed agent should hold: those in its namespace, or under
/// destination-based mapping those targeting it in every namespace the principal watches.
async fn managed_apps(hub: &Hub, agent: &str) -> Result<Vec<Application>, StoreError> {
    let held = |a: &Application| managed_held(hub, a);
    if hub.apps_synced.load(Ordering::Relaxed) {
        return Ok(hub.seen_apps.of_agent(routed_to(hub, agent), held));
    }
    if !hub.config.destination_based_mapping {
        return Ok(hub.apps.list::<Application>(agent).await?.into_iter().filter(held).collect());
    }
    let targets = |a: &Application| held(a) && hub.agent_of(a) == Some(agent);
    Ok(hub
        .apps
        .list_all::<Application>()
        .await?
        .into_iter()
        .filter(|a| hub.config.watches_app_namespace(a.metadata.namespace.as_deref().unwrap_or_default()) && targets(a))
        .collect())
}

async fn matching_projects(hub: &Hub, agent: &str) -> Result<Vec<AppProject>, StoreError> {
    if hub.projects_synced.load(Ordering::Relaxed) {
        return Ok(hub.seen_projects.of_agent(agent).into_iter().filter(|p| !hub.excluded(&p.metadata)).collect());
    }
    Ok(hub
        .projects
        .list::<AppProject>(&hub.config.namespace)
        .await?
        .into_iter()
        .filter(|p| !hub.excluded(&p.metadata) && rules::matches_agent(p, agent, hub.config.mapping()))
        .collect())
}

/// Before the repository watch has listed the hub once, the index learns the hub's
/// repository secrets from a live list (after that, from the watch alone).
async fn load_repos(hub: &Hub) -> Result<(), StoreError> {
    if !hub.repos_synced.load(Ordering::Relaxed) {
        let secrets = hub.secrets.list::<Secret>(&hub.config.namespace).await?;
        hub.repos.preload(secrets.into_iter().filter(Secret::is_repository).collect());
    }
    Ok(())
}

/// As [`load_repos`] for one repository secret (a `request-update` about it): one GET, not a
/// LIST per request while the watch has not listed the hub yet.
async fn load_repo(hub: &Hub, name: &str) -> Result<(), StoreError> {
    if !hub.repos_synced.load(Ordering::Relaxed) {
        let found = hub.secrets.get::<Secret>(&hub.config.namespace, name).await?;
        hub.repos.preload(found.into_iter().filter(Secret::is_repository).collect());
    }
    Ok(())
}

/// As [`load_repos`], for the GPG keys ConfigMap.
async fn load_gpg(hub: &Hub) -> Result<(), StoreError> {
    if !hub.gpg_synced.load(Ordering::Relaxed) {
        let found = hub
            .config_maps
            .get::<ConfigMap>(&hub.config.namespace, protocol::argocd::core::GPG_KEYS_CONFIG_MAP)
            .await?;
        hub.gpg.preload(found.into_iter().collect());
    }
    Ok(())
}

async fn autonomous_copies(hub: &Hub, agent: &str) -> Result<Vec<Application>, StoreError> {
    Ok(hub.apps.list::<Application>(agent).await?.into_iter().filter(is_autonomous_copy).collect())
}

/// Starts the resync for a freshly connected agent, once the events of the agent already being
/// applied (from its previous stream, whose transport may have died mid-event) are done: what
/// the resync reads of the hub then includes their writes.
pub(crate) async fn on_connect(hub: &Hub, session: &AgentPeer) -> Result<(), StoreError> {
    let _applying = session.applying_alone().await;
    let started = std::time::Instant::now();
    let result = start(hub, session).await;
    crate::metrics::global().resync(session.name(), session.mode(), started.elapsed(), result.is_ok());
    result
}

async fn start(hub: &Hub, session: &AgentPeer) -> Result<(), StoreError> {
    let agent = session.name();
    match session.mode() {
        AgentMode::Managed => {
            for p in matching_projects(hub, agent).await? {
                push(session, project::event_for(hub, EventType::SpecUpdate, &p, agent));
                hub.seen_projects.shipped_unwatched(&p);
            }
            load_repos(hub).await?;
            hub.repos.resync(agent, |r| repository::belongs_on(hub, r, agent), |a, ty, r| hub.ship(a, ty, r));
            load_gpg(hub).await?;
            hub.gpg.resync(agent, |c| !hub.excluded(&c.metadata), |a, ty, c| hub.ship(a, ty, c));
            if hub.is_upstream_agent(agent) {
                // Upstream's agent sends its `request-synced-resource-list` once per process
                // (`resyncOnStart`), so after a restart of this principal it never asks for what
                // the hub created meanwhile; upstream's principal queues a `create` of every hub
                // Application for it instead, and so does this one (an Application it holds
                // already is updated in place by upstream's agent).
                for app in managed_apps(hub, agent).await? {
                    push(session, managed::event_for(hub, EventType::Create, &app));
                    hub.seen_apps.shipped_unwatched(key_of(&app.metadata), &app);
                }
            }
            push(session, resync_event(EventType::RequestResourceResync, &RequestResourceResync {}));
        }
        AgentMode::Autonomous => {
            let copies = autonomous_copies(hub, agent).await?;
            for app in &copies {
                push(session, resync_event(EventType::RequestUpdate, &autonomous_request_update(agent, app)));
            }
            let keys: Vec<ResourceKey> =
                copies.iter().map(|a| ResourceKey::from_meta(RESYNC_KIND_APPLICATION, &a.metadata)).collect();
            let checksum = resource_set_checksum(&keys).map(|c| c.to_vec());
            push(
                session,
                resync_event(EventType::RequestSyncedResourceList, &RequestSyncedResourceList::of_set(checksum)),
            );
        }
    }
    tracing::info!(%agent, mode = %session.mode(), "resync started");
    Ok(())
}

fn autonomous_request_update(agent: &str, app: &Application) -> RequestUpdate {
    RequestUpdate {
        name: app.metadata.name.clone().unwrap_or_default(),
        namespace: agent.to_owned(),
        uid: app.metadata.source_uid().unwrap_or_default().to_owned(),
        kind: RESYNC_KIND_APPLICATION.to_owned(),
        checksum: checksum_of(&rules::agent_side_spec(agent, app)),
    }
}

/// Handles a `resourceResync` event from an agent.
pub(crate) async fn handle(hub: &Hub, session: &AgentPeer, ev: &Event, payload: Payload) -> Result<(), InboundError> {
    let agent = session.name();
    match (session.mode(), payload) {
        (mode, Payload::RequestSyncedResourceList(req)) if req.is_spec_digest() => {
            periodic(hub, session, mode, req.checksum.as_deref()).await?;
            Ok(())
        }
        (AgentMode::Managed, Payload::RequestSyncedResourceList(req)) => {
            let keys = ManagedHeld::read(hub, agent).await?.keys();
            let ours = resource_set_checksum(&keys).map(|c| c.to_vec());
            if ours != req.checksum {
                tracing::info!(%agent, resources = keys.len(), "resource sets differ; listing the hub's resources");
                for k in &keys {
                    push(session, resync_event(EventType::ResponseSyncedResource, &SyncedResource::from(k)));
                }
            }
            Ok(())
        }
        (AgentMode::Managed, Payload::RequestUpdate(req)) => managed_request_update(hub, session, &req).await,
        (AgentMode::Autonomous, Payload::SyncedResource(res)) => {
            if res.kind == RESYNC_KIND_APPLICATION {
                let req = match agent_app(hub, agent, &res.name).await? {
                    Some(app) => autonomous_request_update(agent, &app),
                    None => RequestUpdate {
                        name: res.name.clone(),
                        namespace: agent.to_owned(),
                        kind: res.kind.clone(),
                        ..Default::default()
                    },
                };
                push(session, resync_event(EventType::RequestUpdate, &req));
            }
            Ok(())
        }
        (AgentMode::Autonomous, Payload::RequestResourceResync(_)) => {
            for app in autonomous_copies(hub, agent).await? {
                push(session, resync_event(EventType::RequestUpdate, &autonomous_request_update(agent, &app)));
            }
            Ok(())
        }
        (mode, _) => {
            Err(InboundError::WrongMode { event_type: ev.event_type.clone(), target: ev.target.clone(), mode })
        }
    }
}

/// Answers a periodic resync request (see the module docs): nothing when the agent's digest
/// equals ours, the full resync of its mode when not.
async fn periodic(hub: &Hub, session: &AgentPeer, mode: AgentMode, theirs: Option<&[u8]>) -> Result<(), StoreError> {
    let agent = session.name();
    if !session.periodic_due(hub.config.resync_min_interval) {
        tracing::debug!(%agent, min = ?hub.config.resync_min_interval, "periodic resync sooner than --resync-min-interval; not answered");
        crate::metrics::global().periodic_resync(agent, "skipped");
        return Ok(());
    }
    let ours = match mode {
        AgentMode::Managed => managed_digest(hub, agent).await?,
        AgentMode::Autonomous => autonomous_digest(hub, agent).await?,
    };
    if ours.as_ref().map(|d| &d[..]) == theirs {
        crate::metrics::global().periodic_resync(agent, "in_sync");
        return Ok(());
    }
    tracing::info!(%agent, %mode, "periodic resync: the agent's resources differ from the hub's; resyncing");
    crate::metrics::global().periodic_resync(agent, "repaired");
    match mode {
        AgentMode::Managed => {
            // What the agent lacks: it asks for each listed resource it does not hold.
            for k in &ManagedHeld::read(hub, agent).await?.keys() {
                push(session, resync_event(EventType::ResponseSyncedResource, &SyncedResource::from(k)));
            }
            // What differs or is gone from the hub: the agent's request-updates.
            push(session, resync_event(EventType::RequestResourceResync, &RequestResourceResync {}));
        }
        AgentMode::Autonomous => start(hub, session).await?,
    }
    Ok(())
}

/// The digest of what a managed agent should hold ([`ManagedHeld`]), from the indexes by
/// agent and the digest entries they keep once the Application and AppProject watches have
/// listed the hub; read live before.
pub(crate) async fn managed_digest(hub: &Hub, agent: &str) -> Result<Option<Checksum>, StoreError> {
    if !hub.apps_synced.load(Ordering::Relaxed) || !hub.projects_synced.load(Ordering::Relaxed) {
        return Ok(ManagedHeld::read(hub, agent).await?.digest(agent));
    }
    load_repos(hub).await?;
    load_gpg(hub).await?;
    let kept = |meta: &ObjectMeta| !hub.excluded(meta);
    let mut entries = hub.seen_apps.entries(routed_to(hub, agent), |a| managed_held(hub, a));
    let (projects, project_entries) = hub.seen_projects.entries(agent, |p| kept(&p.metadata));
    entries.extend(project_entries);
    entries.extend(hub.repos.entries(Some(&projects), |r| kept(&r.metadata)));
    entries.extend(hub.gpg.entries(None, |c| kept(&c.metadata)));
    Ok(hub.last_digests.of(agent, entries))
}

/// What a managed agent should hold, read once for both the resource keys (the connect-time
/// list) and the digest (the periodic resync).
struct ManagedHeld {
    apps: Vec<Application>,
    projects: Vec<AppProject>,
    repos: Vec<Secret>,
    gpg: Vec<ConfigMap>,
    mapping: crate::config::Mapping,
}

impl ManagedHeld {
    async fn read(hub: &Hub, agent: &str) -> Result<Self, StoreError> {
        let apps = managed_apps(hub, agent).await?;
        let projects = matching_projects(hub, agent).await?;
        load_repos(hub).await?;
        load_gpg(hub).await?;
        // A repository goes where its project does (`repository::belongs_on`).
        let groups: Vec<String> =
            hub.seen_projects.of_agent(agent).into_iter().filter_map(|p| p.metadata.name).collect();
        let repos = hub.repos.in_groups(&groups, |r| !hub.excluded(&r.metadata));
        let gpg = hub.gpg.all().into_iter().filter(|c| !hub.excluded(&c.metadata)).collect();
        Ok(Self { apps, projects, repos, gpg, mapping: hub.config.mapping() })
    }

    fn keys(&self) -> Vec<ResourceKey> {
        let key = |kind, meta: &ObjectMeta| ResourceKey::from_meta(kind, meta);
        (self.apps.iter().map(|a| key(RESYNC_KIND_APPLICATION, &a.metadata)))
            .chain(self.projects.iter().map(|p| key(RESYNC_KIND_APP_PROJECT, &p.metadata)))
            .chain(self.repos.iter().map(|r| key(RESYNC_KIND_REPOSITORY, &r.metadata)))
            .chain(self.gpg.iter().map(|c| key(RESYNC_KIND_GPG_KEY, &c.metadata)))
            .collect()
    }

    /// The digest of these, each with the spec checksum the agent's copy has when in sync
    /// (computed afresh: [`managed_digest`] reads the ones the indexes keep).
    fn digest(&self, agent: &str) -> Option<Checksum> {
        let entries: Vec<Arc<DigestEntry>> = (self.apps.iter().map(app_entry))
            .chain(self.projects.iter().map(|p| project_entry(p, agent, self.mapping)))
            .chain(self.repos.iter().map(Shipped::digest_entry))
            .chain(self.gpg.iter().map(Shipped::digest_entry))
            .map(Arc::new)
            .collect();
        digest(&entries)
    }
}

/// The digest of an autonomous agent's hub copies, from the watch cache once it has listed the
/// hub (a copy it has not shown yet makes the digests differ, and the resync that follows
/// lists the hub).
async fn autonomous_digest(hub: &Hub, agent: &str) -> Result<Option<Checksum>, StoreError> {
    if hub.apps_synced.load(Ordering::Relaxed) {
        let entries = hub.seen_apps.entries(AgentApps::InNamespace(agent), is_autonomous_copy);
        return Ok(hub.last_digests.of(agent, entries));
    }
    let entries: Vec<Arc<DigestEntry>> =
        autonomous_copies(hub, agent).await?.iter().map(|a| Arc::new(app_entry(a))).collect();
    Ok(digest(&entries))
}

fn stub_meta(name: &str, namespace: &str, uid: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        uid: Some(uid.to_owned()),
        ..Default::default()
    }
}

async fn managed_request_update(hub: &Hub, session: &AgentPeer, req: &RequestUpdate) -> Result<(), InboundError> {
    let agent = session.name();
    if req.kind == RESYNC_KIND_APPLICATION {
        let ns = hub.managed_namespace(agent, Some(&req.namespace));
        match agent_app(hub, ns, &req.name).await? {
            Some(app) if is_autonomous_copy(&app) => {}
            Some(app) if !hub.excluded(&app.metadata) && hub.agent_of(&app) == Some(agent) => {
                // A deletion pending on the hub does not change the spec checksum; send it
                // anyway, or a hub deletion made while the agent was away would wait forever.
                if checksum_of(&app) != req.checksum || req.uid.is_empty() || app.is_being_deleted() {
                    push(session, managed::event_for(hub, EventType::SpecUpdate, &app));
                }
                // The agent holds it now: one the watch has not shown is deleted on the agent
                // by the re-list that no longer returns it.
                hub.seen_apps.shipped_unwatched(key_of(&app.metadata), &app);
            }
            _ => {
                let stub = Application { metadata: stub_meta(&req.name, ns, &req.uid), ..Default::default() };
                push(session, hub.app_event(EventType::Delete, &stub));
            }
        }
    } else if req.kind == RESYNC_KIND_APP_PROJECT {
        match principal_project(hub, &req.name).await? {
            Some(p) if !hub.excluded(&p.metadata) && rules::matches_agent(&p, agent, hub.config.mapping()) => {
                if checksum_of(&rules::agent_copy(&p, agent, hub.config.mapping())) != req.checksum
                    || req.uid.is_empty()
                {
                    push(session, project::event_for(hub, EventType::SpecUpdate, &p, agent));
                }
                hub.seen_projects.shipped_unwatched(&p);
            }
            _ => {
                let stub = AppProject { metadata: stub_meta(&req.name, agent, &req.uid), ..Default::default() };
                push(session, hub.object_event(EventType::Delete, Target::AppProject, &stub.metadata, &stub));
            }
        }
    } else if req.kind == RESYNC_KIND_REPOSITORY {
        // Upstream answers a differing repository with an error and relies on the next
        // connect's push; here it is sent again at once.
        load_repo(hub, &req.name).await?;
        let stub = Secret { metadata: stub_meta(&req.name, agent, &req.uid), ..Default::default() };
        hub.repos.answer(
            agent,
            &req.name,
            |r| repository::belongs_on(hub, r, agent),
            |r| req.uid.is_empty() || secret_checksum(r).map(|c| c.to_vec()) != req.checksum,
            &stub,
            |a, ty, r| hub.ship(a, ty, r),
        );
    } else if req.kind == RESYNC_KIND_GPG_KEY {
        load_gpg(hub).await?;
        let stub = ConfigMap { metadata: stub_meta(&req.name, agent, &req.uid), ..Default::default() };
        hub.gpg.answer(
            agent,
            &req.name,
            |c| !hub.excluded(&c.metadata),
            |c| req.uid.is_empty() || config_map_checksum(c).map(|c| c.to_vec()) != req.checksum,
            &stub,
            |a, ty, c| hub.ship(a, ty, c),
        );
    } else {
        tracing::debug!(%agent, kind = %req.kind, name = %req.name, "request-update for a kind not synced here");
    }
    Ok(())
}
