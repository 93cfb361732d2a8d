//! The hub side's shared state: the Kubernetes stores, the agent peers, the caches the watchers
//! and routers keep, and the write fence. No wing's state: each wing owns its own and is handed
//! what it needs by the composition root ([`crate::Principal`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use link::Copies;
use protocol::argocd::{Application, ObjectMeta};
use protocol::checksum::ResourceKey;
use protocol::kube_store::ObjectStore;
use protocol::{Event, EventType, Target};

pub(crate) use super::digest::{
    DigestEntry, LastDigests, app_entry, checksum_of as spec_checksum, digest, project_entry,
};
pub(crate) use super::index::{AgentApps, AppIndex, StatusBase};
pub(crate) use super::projects::ProjectIndex;
pub(crate) use super::rules::{Key, key_of};
pub(crate) use super::shipped::{GpgIndex, RepoIndex, Shipped};
use crate::config::PrincipalConfig;
use crate::peer::Peers;

/// Everything the principal's tasks share.
#[derive(Debug)]
pub(crate) struct Hub {
    pub(crate) config: PrincipalConfig,
    pub(crate) principal_uid: String,
    pub(crate) peers: Peers,
    pub(crate) apps: ObjectStore,
    pub(crate) projects: ObjectStore,
    pub(crate) secrets: ObjectStore,
    pub(crate) config_maps: ObjectStore,
    /// Hub Applications as the watch last showed them (to tell what changed), with the status
    /// bases of the principal's own writes.
    pub(crate) seen_apps: AppIndex,
    /// The last version of every hub AppProject in the principal namespace, and those matching
    /// each agent.
    pub(crate) seen_projects: ProjectIndex,
    /// Autonomous agents' Applications as last received (hub form), the source for reverting
    /// edits and deletions made on the hub (rebuilt from the hub at startup), and the hub
    /// copies whose deletion the owning agent asked for.
    pub(crate) autonomous: Copies<Key, Application>,
    /// Repository secrets of the principal namespace, and the agents each was sent to.
    pub(crate) repos: RepoIndex,
    /// The GPG keys ConfigMap of the principal namespace, and the agents it was sent to.
    pub(crate) gpg: GpgIndex,
    /// The last periodic resync digest of each agent, and what it was computed from.
    pub(crate) last_digests: LastDigests,
    /// Whether the Application, AppProject, repository secret and GPG keys watchers have each
    /// listed the hub once (readiness, `/healthz`).
    pub(crate) apps_synced: AtomicBool,
    pub(crate) projects_synced: AtomicBool,
    pub(crate) repos_synced: AtomicBool,
    pub(crate) gpg_synced: AtomicBool,
    /// Which path each status write took ([`crate::sync::route::managed::status_update`]).
    pub(crate) status_paths: StatusPathCounters,
    /// `--event-processors`: permits to apply an agent's event.
    pub(crate) processors: Option<tokio::sync::Semaphore>,
    /// `--agent-leases`: which agents this replica owns among the hub's replicas, the write
    /// fence every hub write for an agent passes ([`Self::write_deadline`]).
    pub(crate) leases: Option<crate::lease::Ownership>,
    /// Agents whose last `Authenticate` on this principal presented an upstream release's bare
    /// version (ours present `argocd-agent-<version>`): their resync differs
    /// ([`crate::sync::resync`]).
    upstream_agents: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// Counts of the paths a managed agent's status write takes, so tests can tell the one-request
/// conditional patch from the read-modify-write fallback (see [`crate::Principal::status_write_paths`]).
#[doc(hidden)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StatusWritePaths {
    /// Conditional merge patches the hub accepted (the fast path).
    pub patched: u64,
    /// Conditional merge patches the hub refused because the Application moved on since the
    /// principal's base (409 Conflict) or is gone; each is followed by a read-modify-write.
    pub patch_refused: u64,
    /// Read-modify-writes: after a refused patch, or with no base or nothing to patch.
    pub read_modify_write: u64,
}

#[derive(Debug, Default)]
pub(crate) struct StatusPathCounters {
    pub(crate) patched: AtomicU64,
    pub(crate) patch_refused: AtomicU64,
    pub(crate) read_modify_write: AtomicU64,
}

impl StatusPathCounters {
    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> StatusWritePaths {
        StatusWritePaths {
            patched: self.patched.load(Ordering::Relaxed),
            patch_refused: self.patch_refused.load(Ordering::Relaxed),
            read_modify_write: self.read_modify_write.load(Ordering::Relaxed),
        }
    }
}

impl Hub {
    pub(crate) fn new(config: PrincipalConfig, principal_uid: String, client: kube::Client) -> Self {
        let processors = config.event_processors.filter(|n| *n > 0).map(tokio::sync::Semaphore::new);
        let mapping = config.mapping();
        let leases =
            config.agent_leases.clone().map(|c| crate::lease::Ownership::new(c, client.clone(), &config.namespace));
        Self {
            peers: Peers::new(config.retry.clone()),
            config,
            principal_uid,
            apps: ObjectStore::applications(client.clone()),
            projects: ObjectStore::app_projects(client.clone()),
            secrets: ObjectStore::secrets(client.clone()),
            config_maps: ObjectStore::config_maps(client),
            seen_apps: AppIndex::default(),
            seen_projects: ProjectIndex::new(mapping),
            autonomous: Copies::default(),
            repos: RepoIndex::default(),
            gpg: GpgIndex::default(),
            last_digests: LastDigests::default(),
            apps_synced: AtomicBool::new(false),
            projects_synced: AtomicBool::new(false),
            repos_synced: AtomicBool::new(false),
            gpg_synced: AtomicBool::new(false),
            status_paths: StatusPathCounters::default(),
            processors,
            leases,
            upstream_agents: std::sync::Mutex::default(),
        }
    }

    /// Notes the version `agent` presented on `Authenticate`: an upstream release's bare
    /// version (`0.10.0`) or ours (`argocd-agent-<version>`).
    pub(crate) fn note_agent_version(&self, agent: &str, version: &str) {
        let upstream = !version.is_empty() && !version.starts_with(auth::version::QUALIFIED_PREFIX);
        let mut agents = link::lock(&self.upstream_agents);
        if upstream {
            agents.insert(agent.to_owned());
        } else {
            agents.remove(agent);
        }
    }

    /// Whether `agent` last authenticated here as an upstream agent (see
    /// [`Self::note_agent_version`]).
    pub(crate) fn is_upstream_agent(&self, agent: &str) -> bool {
        link::lock(&self.upstream_agents).contains(agent)
    }

    /// Whether this principal writes the hub for `agent`: always for a lone principal; among
    /// replicas (`--agent-leases`), only while it owns the agent.
    pub(crate) fn acts_for(&self, agent: &str) -> bool {
        self.leases.as_ref().is_none_or(|l| l.write_deadline(agent).is_some())
    }

    /// Until when this principal may write the hub for `agent` (`Ok(None)`: no bound, a lone
    /// principal), or why it may not.
    pub(crate) fn write_deadline(
        &self,
        agent: &str,
    ) -> Result<Option<tokio::time::Instant>, crate::error::InboundError> {
        let Some(leases) = &self.leases else { return Ok(None) };
        leases.write_deadline(agent).map(Some).ok_or_else(|| self.not_owner(agent))
    }

    /// Why an event of `agent` was not applied: this replica does not own it (any more).
    pub(crate) fn not_owner(&self, agent: &str) -> crate::error::InboundError {
        crate::error::InboundError::NotOwner {
            agent: agent.to_owned(),
            replica: self.leases.as_ref().map(|l| l.replica().to_owned()).unwrap_or_default(),
        }
    }

    /// A hub whose API server is never reached: every request fails. For unit tests of
    /// routing, resync and authorization on the indexes alone (in a tokio runtime: the client
    /// spawns its buffer task).
    pub(crate) fn offline(config: PrincipalConfig) -> Self {
        Self::new(config, "principal-uid".into(), link::testing::offline_client("default"))
    }

    /// Whether a hub object the principal distributes is left out: labelled
    /// `argocd-agent.argoproj-labs.io/ignore-sync=true`, or not matching `--label-selector`.
    /// Leaving out an object the agents hold deletes it there.
    pub(crate) fn excluded(&self, meta: &ObjectMeta) -> bool {
        meta.left_out(self.config.label_selector.as_ref())
    }

    /// The agent a hub Application belongs to (§4.9): an autonomous agent's copy by its
    /// namespace; a managed one by its namespace, or under destination-based mapping by
    /// `spec.destination.name` (none when empty or `in-cluster`).
    pub(crate) fn agent_of<'a>(&self, app: &'a Application) -> Option<&'a str> {
        if self.config.destination_based_mapping && !super::rules::is_autonomous_copy(app) {
            app.destination_agent()
        } else {
            app.metadata.namespace.as_deref()
        }
    }

    /// The hub namespace of the Application a managed agent's event is about: the agent's own
    /// namespace under namespace-based mapping, the namespace the event names under
    /// destination-based mapping (where the agent keeps the hub's namespaces).
    pub(crate) fn managed_namespace<'a>(&self, agent: &'a str, named: Option<&'a str>) -> &'a str {
        if self.config.destination_based_mapping { named.filter(|ns| !ns.is_empty()).unwrap_or(agent) } else { agent }
    }

    /// Queues `ty` of a shipped object (repository secret, GPG keys) for `agent`, if it still has
    /// a peer: the object as the hub has it, credentials included, without `managedFields`.
    pub(crate) fn ship<T: Shipped>(&self, agent: &str, ty: EventType, obj: &T) {
        self.shipper().ship(agent, ty, obj);
    }

    /// A [`Shipper`]: for one change that goes to many agents.
    pub(crate) fn shipper(&self) -> Shipper<'_> {
        Shipper { hub: self, built: Built::default() }
    }

    /// An Application event for an agent, stamped with the principal UID.
    pub(crate) fn app_event(&self, ty: EventType, app: &Application) -> Option<Event> {
        self.object_event(ty, Target::Application, &app.metadata, app)
    }

    /// An object event stamped with the principal UID; `None` (logged) if it cannot be built.
    pub(crate) fn object_event<T: serde::Serialize>(
        &self,
        ty: EventType,
        target: Target,
        meta: &ObjectMeta,
        obj: &T,
    ) -> Option<Event> {
        match Event::for_object(ty, target, meta, obj) {
            Ok(ev) => {
                let mut ev = ev.with_principal_uid(&self.principal_uid);
                // The receiver's span joins the trace of the hub change (or resync) at hand.
                protocol::otel::inject_current(&mut ev);
                Some(ev)
            }
            Err(e) => {
                tracing::error!(error = %e, name = ?meta.name, "cannot encode event");
                None
            }
        }
    }
}

/// The events of one change that goes to many agents, each built once per key: agents whose
/// copy is the same get clones of one event, sharing its encoded payload.
pub(crate) struct Built<K>(Vec<(K, Option<Event>)>);

impl<K: PartialEq> Default for Built<K> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<K: PartialEq> Built<K> {
    /// The event for `key`, built by `build` the first time.
    pub(crate) fn get_or_build(&mut self, key: K, build: impl FnOnce(&K) -> Option<Event>) -> Option<Event> {
        if let Some((_, ev)) = self.0.iter().find(|(k, _)| *k == key) {
            return ev.clone();
        }
        let ev = build(&key);
        self.0.push((key, ev.clone()));
        ev
    }
}

/// Ships objects to agents as [`Hub::ship`] does, building each event once: every agent gets
/// the same copy of a shipped object, so one change to a repository secret or the GPG keys is
/// encoded once and its payload shared by every agent's event.
pub(crate) struct Shipper<'h> {
    hub: &'h Hub,
    /// By event type and object version.
    built: Built<(EventType, ResourceKey, Option<String>)>,
}

impl Shipper<'_> {
    /// Queues `ty` of `obj` for `agent`, if it still has a peer.
    pub(crate) fn ship<T: Shipped>(&mut self, agent: &str, ty: EventType, obj: &T) {
        let Some(peer) = self.hub.peers.get(agent) else { return };
        tracing::debug!(%agent, name = ?obj.meta().name, target = %T::TARGET, event = ty.as_str(), "shipped object queued");
        let meta = obj.meta();
        let key = (ty, ResourceKey::from_meta(T::RESYNC_KIND, meta), meta.resource_version.clone());
        let hub = self.hub;
        let ev = self.built.get_or_build(key, |(ty, _, _)| {
            let mut copy = obj.clone();
            copy.meta_mut().extra.remove("managedFields");
            hub.object_event(ty.clone(), T::TARGET, meta, &copy)
        });
        if let Some(ev) = ev {
            peer.push(ev);
        }
    }
}
