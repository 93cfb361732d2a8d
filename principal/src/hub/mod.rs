//! The hub side's shared state: the Kubernetes stores, the agent peers, and the caches the
//! watchers and routers keep.

pub mod watch;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use link::lock;
use protocol::argocd::{AppProject, Application, ObjectMeta};
use protocol::kube_store::ObjectStore;
use protocol::{Event, EventType, Target};

use crate::config::PrincipalConfig;
use crate::peer::Peers;

/// `(namespace, name)` of an object on the hub.
pub(crate) type Key = (String, String);

/// The key of an object's metadata.
pub(crate) fn key_of(meta: &ObjectMeta) -> Key {
    (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

/// Everything the principal's tasks share.
#[derive(Debug)]
pub(crate) struct Hub {
    pub(crate) config: PrincipalConfig,
    pub(crate) principal_uid: String,
    pub(crate) peers: Peers,
    pub(crate) apps: ObjectStore,
    pub(crate) projects: ObjectStore,
    /// The last version of every hub Application the watcher saw (to tell what changed).
    pub(crate) seen_apps: Mutex<HashMap<Key, Application>>,
    /// The last version of every hub AppProject in the principal namespace.
    pub(crate) seen_projects: Mutex<HashMap<String, AppProject>>,
    /// Autonomous agents' Applications as last received (hub form): the source for reverting
    /// edits and deletions made on the hub. Rebuilt from the hub at startup.
    pub(crate) auto_source: Mutex<HashMap<Key, Application>>,
    /// The status and operation the principal last wrote onto a hub Application, with the
    /// resourceVersion the write produced, until the watch catches up with that version: the
    /// base of the next status write's conditional patch ([`crate::route::managed`]).
    pub(crate) status_written: Mutex<HashMap<Key, StatusBase>>,
    /// Hub copies whose deletion the owning agent asked for.
    pub(crate) expected_deletes: Mutex<HashSet<Key>>,
    /// Whether the Application and AppProject watchers have each listed the hub once
    /// (readiness, `/healthz`).
    pub(crate) apps_synced: AtomicBool,
    pub(crate) projects_synced: AtomicBool,
    /// Which path each status write took ([`crate::route::managed::status_update`]).
    pub(crate) status_paths: StatusPathCounters,
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

/// A hub Application's status and operation (as JSON) at a resourceVersion.
#[derive(Debug, Clone)]
pub(crate) struct StatusBase {
    pub(crate) resource_version: String,
    pub(crate) status: serde_json::Value,
    pub(crate) operation: serde_json::Value,
}

impl StatusBase {
    /// `None` without a resourceVersion (nothing to hold a conditional write to).
    pub(crate) fn of(app: &Application) -> Option<Self> {
        Some(Self {
            resource_version: app.metadata.resource_version.clone()?,
            status: serde_json::to_value(&app.status).ok()?,
            operation: serde_json::to_value(&app.operation).ok()?,
        })
    }
}

impl Hub {
    pub(crate) fn new(config: PrincipalConfig, principal_uid: String, client: kube::Client) -> Self {
        Self {
            peers: Peers::new(config.retry.clone()),
            config,
            principal_uid,
            apps: ObjectStore::applications(client.clone()),
            projects: ObjectStore::app_projects(client),
            seen_apps: Mutex::new(HashMap::new()),
            seen_projects: Mutex::new(HashMap::new()),
            auto_source: Mutex::new(HashMap::new()),
            status_written: Mutex::new(HashMap::new()),
            expected_deletes: Mutex::new(HashSet::new()),
            apps_synced: AtomicBool::new(false),
            projects_synced: AtomicBool::new(false),
            status_paths: StatusPathCounters::default(),
        }
    }

    /// A hub whose API server is never reached: every request fails. For unit tests of
    /// routing, resync and authorization on the indexes alone (in a tokio runtime: the client
    /// spawns its buffer task).
    #[cfg(test)]
    pub(crate) fn offline(config: PrincipalConfig) -> Self {
        Self::new(config, "principal-uid".into(), offline_client())
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

    pub(crate) fn expect_delete(&self, key: Key) {
        lock(&self.expected_deletes).insert(key);
    }
}

/// A client whose every request fails (no API server): see [`Hub::offline`].
#[cfg(test)]
pub(crate) fn offline_client() -> kube::Client {
    let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
        Err::<http::Response<kube::client::Body>, _>(std::io::Error::other("unit test: there is no API server"))
    });
    kube::Client::new(service, "default")
}
