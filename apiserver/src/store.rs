//! Durable object storage with one global resourceVersion and a retained event history.
//!
//! Objects live in a redb database in the data dir (the only state) and, for reads, in memory.
//! Writes are serialised: one writer at a time assigns the next resourceVersion, commits the
//! object with fsync (redb's immediate durability), then publishes the watch event. So commit
//! order, resourceVersion order and event order are the same, and a write is acknowledged only
//! once it is on disk.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

use bytes::Bytes;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::Value;
use tokio::sync::watch;

use crate::error::{ApiError, ApiResult};
use crate::object::meta_mut;
use crate::resource::GroupResource;

const OBJECTS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("objects");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const META_RV: &str = "resourceVersion";

/// Errors opening the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened or read.
    #[error("cannot open the data store {path} (is another server using this data dir?)")]
    Open {
        /// The database file.
        path: String,
        /// What redb said.
        #[source]
        source: redb::Error,
    },
    /// A stored object is not valid JSON (the file was modified by something else).
    #[error("stored object {key} is not valid JSON: {source}")]
    Corrupt {
        /// Storage key.
        key: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

/// What kind of change an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The object was created.
    Added,
    /// The object changed.
    Modified,
    /// The object is gone.
    Deleted,
}

impl EventKind {
    /// Wire name in a watch stream.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change, kept in the history for watchers.
#[derive(Debug)]
pub struct StoredEvent {
    /// resourceVersion of the change.
    pub rv: u64,
    /// Kind of change.
    pub kind: EventKind,
    /// Type of the object.
    pub gr: GroupResource,
    /// Namespace ("" when cluster-scoped).
    pub namespace: String,
    /// The object after the change (for deletes: the last state, with the deletion's rv).
    pub object: Arc<Value>,
    /// The object before the change, for selector transitions.
    pub old: Option<Arc<Value>>,
    encoded: OnceLock<Bytes>,
}

impl StoredEvent {
    /// The object serialised once, shared by every watcher.
    pub fn encoded_object(&self) -> &Bytes {
        self.encoded.get_or_init(|| Bytes::from(serde_json::to_vec(&*self.object).unwrap_or_default()))
    }
}

/// What a writer decided to do with an object.
#[derive(Debug)]
pub enum Change {
    /// Store this object (create or replace).
    Put(Value),
    /// Remove the object; the value is its final state.
    Delete(Value),
    /// Nothing to write; answer with the current object.
    Unchanged,
}

/// The result of a write.
#[derive(Debug, Clone)]
pub enum Applied {
    /// Written (created or updated).
    Written(Arc<Value>),
    /// Removed; the last state.
    Deleted(Arc<Value>),
    /// Not changed.
    Unchanged(Arc<Value>),
}

impl Applied {
    /// The object to answer with.
    #[must_use]
    pub fn object(&self) -> &Arc<Value> {
        match self {
            Self::Written(o) | Self::Deleted(o) | Self::Unchanged(o) => o,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    objects: BTreeMap<String, Arc<Value>>,
    per_namespace: HashMap<String, usize>,
    rv: u64,
    history: VecDeque<Arc<StoredEvent>>,
    /// Watches may start from any rv >= floor: every event after it is retained.
    floor: u64,
}

/// The object store.
#[derive(Debug)]
pub struct Store {
    db: Database,
    writer: Mutex<()>,
    state: RwLock<State>,
    notify: watch::Sender<u64>,
    history_limit: usize,
}

/// Storage key of an object.
#[must_use]
pub fn key(gr: &GroupResource, namespace: &str, name: &str) -> String {
    format!("{}/{}/{namespace}/{name}", gr.group, gr.resource)
}

/// Key prefix of a resource, optionally within one namespace.
#[must_use]
pub fn prefix(gr: &GroupResource, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("{}/{}/{ns}/", gr.group, gr.resource),
        None => format!("{}/{}/", gr.group, gr.resource),
    }
}

/// Split a key into (group, resource, namespace, name).
fn split_key(key: &str) -> Option<(&str, &str, &str, &str)> {
    let mut it = key.splitn(4, '/');
    Some((it.next()?, it.next()?, it.next()?, it.next()?))
}

fn storage_err(e: impl Into<redb::Error>) -> ApiError {
    let e: redb::Error = e.into();
    ApiError::internal(format!("storage write failed: {e}"))
}

impl Store {
    /// Open (or create) the store in `dir`, loading every object into memory.
    ///
    /// # Errors
    /// The database cannot be opened or holds a corrupt object.
    pub fn open(dir: &Path, history_limit: usize) -> Result<Self, StoreError> {
        let path = dir.join("store.redb");
        let open_err = |source: redb::Error| StoreError::Open { path: path.display().to_string(), source };
        let db = Database::create(&path).map_err(|e| open_err(e.into()))?;
        let mut state = State::default();
        {
            let txn = db.begin_write().map_err(|e| open_err(e.into()))?;
            // Create both tables so that read transactions find them.
            txn.open_table(OBJECTS).map_err(|e| open_err(e.into()))?;
            txn.open_table(META).map_err(|e| open_err(e.into()))?;
            txn.commit().map_err(|e| open_err(e.into()))?;
        }
        let read = db.begin_read().map_err(|e| open_err(e.into()))?;
        let objects = read.open_table(OBJECTS).map_err(|e| open_err(e.into()))?;
        for item in objects.iter().map_err(|e| open_err(e.into()))? {
            let (k, v) = item.map_err(|e| open_err(e.into()))?;
            let key = k.value().to_string();
            let obj: Value =
                serde_json::from_slice(v.value()).map_err(|source| StoreError::Corrupt { key: key.clone(), source })?;
            if let Some((_, _, ns, _)) = split_key(&key) {
                *state.per_namespace.entry(ns.to_string()).or_default() += 1;
            }
            state.objects.insert(key, Arc::new(obj));
        }
        let meta = read.open_table(META).map_err(|e| open_err(e.into()))?;
        state.rv = meta.get(META_RV).map_err(|e| open_err(e.into()))?.map(|g| g.value()).unwrap_or(0);
        state.floor = state.rv;
        let (notify, _) = watch::channel(state.rv);
        Ok(Self { db, writer: Mutex::new(()), state: RwLock::new(state), notify, history_limit: history_limit.max(1) })
    }

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The newest resourceVersion.
    #[must_use]
    pub fn current_rv(&self) -> u64 {
        self.read_state().rv
    }

    /// One object.
    #[must_use]
    pub fn get(&self, gr: &GroupResource, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.read_state().objects.get(&key(gr, namespace, name)).cloned()
    }

    /// Every object of a type (optionally in one namespace) after `start_after` (a key), in key
    /// order, with the resourceVersion they were read at.
    #[must_use]
    pub fn list(
        &self,
        gr: &GroupResource,
        namespace: Option<&str>,
        start_after: Option<&str>,
    ) -> (Vec<(String, Arc<Value>)>, u64) {
        let prefix = prefix(gr, namespace);
        let state = self.read_state();
        let range = match start_after {
            Some(k) if k.starts_with(&prefix) => {
                state.objects.range::<str, _>((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded))
            }
            _ => {
                state.objects.range::<str, _>((std::ops::Bound::Included(prefix.as_str()), std::ops::Bound::Unbounded))
            }
        };
        let items = range.take_while(|(k, _)| k.starts_with(&prefix)).map(|(k, v)| (k.clone(), v.clone())).collect();
        (items, state.rv)
    }

    /// Number of objects in a namespace (any type).
    #[must_use]
    pub fn count_in_namespace(&self, namespace: &str) -> usize {
        self.read_state().per_namespace.get(namespace).copied().unwrap_or(0)
    }

    /// Every (group, resource, name) stored in a namespace.
    #[must_use]
    pub fn keys_in_namespace(&self, namespace: &str) -> Vec<(GroupResource, String)> {
        self.read_state()
            .objects
            .keys()
            .filter_map(|k| split_key(k))
            .filter(|(_, _, ns, _)| *ns == namespace)
            .map(|(g, r, _, n)| (GroupResource::new(g, r), n.to_string()))
            .collect()
    }

    /// Every object stored for a type, all namespaces: (namespace, name).
    #[must_use]
    pub fn names_of(&self, gr: &GroupResource) -> Vec<(String, String)> {
        self.list(gr, None, None)
            .0
            .iter()
            .filter_map(|(k, _)| split_key(k).map(|(_, _, ns, n)| (ns.to_string(), n.to_string())))
            .collect()
    }

    /// A receiver that changes whenever a write is published.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.notify.subscribe()
    }

    /// Events after `rv` for one type, and the newest rv they cover.
    ///
    /// # Errors
    /// 410 Gone when events after `rv` are no longer retained.
    pub fn events_since(&self, rv: u64, gr: &GroupResource) -> ApiResult<(Vec<Arc<StoredEvent>>, u64)> {
        let state = self.read_state();
        if rv < state.floor {
            return Err(ApiError::gone(format!("too old resource version: {rv} ({})", state.floor + 1)));
        }
        let start = state.history.partition_point(|e| e.rv <= rv);
        let events = state.history.iter().skip(start).filter(|e| e.gr == *gr).cloned().collect();
        Ok((events, state.rv.max(rv)))
    }

    /// The oldest resourceVersion a watch or continue token may start from.
    #[must_use]
    pub fn floor(&self) -> u64 {
        self.read_state().floor
    }

    /// Read-modify-write one object under the writer lock. `decide` sees the current object and
    /// says what to store; the new resourceVersion is assigned here. With `dry_run`, nothing is
    /// persisted or published.
    ///
    /// # Errors
    /// Whatever `decide` returns, or 500 when the disk write fails (then nothing changed).
    pub fn write(
        &self,
        gr: &GroupResource,
        namespace: &str,
        name: &str,
        dry_run: bool,
        decide: impl FnOnce(Option<&Arc<Value>>) -> ApiResult<Change>,
    ) -> ApiResult<Applied> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let key = key(gr, namespace, name);
        let (current, rv) = {
            let s = self.read_state();
            (s.objects.get(&key).cloned(), s.rv + 1)
        };
        let change = decide(current.as_ref())?;
        let (kind, mut obj) = match change {
            Change::Unchanged => {
                return current
                    .map(Applied::Unchanged)
                    .ok_or_else(|| ApiError::not_found(&gr.group, &gr.resource, name));
            }
            Change::Put(obj) => (if current.is_some() { EventKind::Modified } else { EventKind::Added }, obj),
            Change::Delete(obj) => (EventKind::Deleted, obj),
        };
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let obj = Arc::new(obj);
        if dry_run {
            return Ok(if kind == EventKind::Deleted { Applied::Deleted(obj) } else { Applied::Written(obj) });
        }
        let txn = self.db.begin_write().map_err(storage_err)?;
        {
            let mut objects = txn.open_table(OBJECTS).map_err(storage_err)?;
            if kind == EventKind::Deleted {
                objects.remove(key.as_str()).map_err(storage_err)?;
            } else {
                let bytes =
                    serde_json::to_vec(&*obj).map_err(|e| ApiError::internal(format!("cannot encode object: {e}")))?;
                objects.insert(key.as_str(), bytes.as_slice()).map_err(storage_err)?;
            }
            let mut meta = txn.open_table(META).map_err(storage_err)?;
            meta.insert(META_RV, rv).map_err(storage_err)?;
        }
        txn.commit().map_err(storage_err)?;

        let event = Arc::new(StoredEvent {
            rv,
            kind,
            gr: gr.clone(),
            namespace: namespace.to_string(),
            object: obj.clone(),
            old: current.clone(),
            encoded: OnceLock::new(),
        });
        {
            let mut s = self.state.write().unwrap_or_else(PoisonError::into_inner);
            s.rv = rv;
            match kind {
                EventKind::Deleted => {
                    s.objects.remove(&key);
                    if let Some(n) = s.per_namespace.get_mut(namespace) {
                        *n = n.saturating_sub(1);
                    }
                }
                EventKind::Added => {
                    s.objects.insert(key, obj.clone());
                    *s.per_namespace.entry(namespace.to_string()).or_default() += 1;
                }
                EventKind::Modified => {
                    s.objects.insert(key, obj.clone());
                }
            }
            s.history.push_back(event);
            while s.history.len() > self.history_limit {
                if let Some(old) = s.history.pop_front() {
                    s.floor = old.rv;
                }
            }
        }
        self.notify.send_replace(rv);
        Ok(match kind {
            EventKind::Deleted => Applied::Deleted(obj),
            _ => Applied::Written(obj),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gr() -> GroupResource {
        GroupResource::new("argoproj.io", "applications")
    }

    #[test]
    fn writes_survive_reopen_and_rv_keeps_increasing() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let store = Store::open(dir.path(), 100)?;
            store.write(&gr(), "ns", "a", false, |_| Ok(Change::Put(json!({"metadata": {"name": "a"}}))))?;
            store.write(&gr(), "ns", "b", false, |_| Ok(Change::Put(json!({"metadata": {"name": "b"}}))))?;
            store.write(&gr(), "ns", "b", false, |cur| Ok(Change::Delete((**cur.expect("b exists")).clone())))?;
            assert_eq!(store.current_rv(), 3);
        }
        let store = Store::open(dir.path(), 100)?;
        assert_eq!(store.current_rv(), 3);
        assert!(store.get(&gr(), "ns", "a").is_some());
        assert!(store.get(&gr(), "ns", "b").is_none());
        assert_eq!(store.count_in_namespace("ns"), 1);
        // History is not kept across restarts: watching from before the restart is 410.
        assert_eq!(store.events_since(2, &gr()).err().map(|e| e.code), Some(410));
        assert!(store.events_since(3, &gr()).is_ok());
        Ok(())
    }

    #[test]
    fn history_is_trimmed_and_floor_moves() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), 2)?;
        for n in ["a", "b", "c"] {
            store.write(&gr(), "ns", n, false, |_| Ok(Change::Put(json!({"metadata": {"name": n}}))))?;
        }
        assert_eq!(store.events_since(0, &gr()).err().map(|e| e.code), Some(410));
        let (events, latest) = store.events_since(1, &gr())?;
        assert_eq!(events.iter().map(|e| e.rv).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(latest, 3);
        Ok(())
    }

    #[test]
    fn dry_run_and_errors_change_nothing() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), 10)?;
        store.write(&gr(), "ns", "a", true, |_| Ok(Change::Put(json!({"metadata": {"name": "a"}}))))?;
        let failed = store.write(&gr(), "ns", "a", false, |_| Err(ApiError::bad_request("no")));
        assert!(failed.is_err());
        assert_eq!(store.current_rv(), 0);
        assert!(store.get(&gr(), "ns", "a").is_none());
        Ok(())
    }
}
