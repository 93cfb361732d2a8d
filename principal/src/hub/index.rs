//! The hub Applications as the watch last showed them, with the status bases the principal
//! wrote since: one owner for the invariant that ties the two together.

use std::collections::HashMap;
use std::sync::Mutex;

use link::lock;
use protocol::argocd::Application;

use super::Key;

/// A hub Application's status and operation (as JSON) at a resourceVersion: what a managed
/// agent's next status write is a conditional patch against ([`crate::route::managed`]).
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

#[derive(Debug, Default)]
struct Inner {
    /// The last version of every hub Application the watch showed.
    seen: HashMap<Key, Application>,
    /// The status and operation the principal last wrote onto a hub Application, with the
    /// resourceVersion that write produced, until the watch shows that version (or a newer
    /// object replaces it).
    written: HashMap<Key, StatusBase>,
}

/// Hub Applications in agent namespaces, as last seen, and the principal's own status writes
/// the watch has not caught up with yet.
///
/// Invariant: the base of a status write is the principal's own last write until the watch
/// shows the version that write produced, and the watched object from then on; so a burst of
/// status updates patches against each other without waiting for the watch.
#[derive(Debug, Default)]
pub(crate) struct AppIndex {
    inner: Mutex<Inner>,
}

impl AppIndex {
    /// Whether the watch has shown `key`.
    pub(crate) fn contains(&self, key: &Key) -> bool {
        lock(&self.inner).seen.contains_key(key)
    }

    /// The last version of `key` the watch showed.
    pub(crate) fn get(&self, key: &Key) -> Option<Application> {
        lock(&self.inner).seen.get(key).cloned()
    }

    /// Every Application the watch has shown.
    pub(crate) fn all(&self) -> Vec<Application> {
        lock(&self.inner).seen.values().cloned().collect()
    }

    /// The Applications in namespace `agent`.
    pub(crate) fn of_agent(&self, agent: &str) -> Vec<Application> {
        self.matching(|(ns, _), _| ns == agent)
    }

    /// What `check` says of the last version of `key` the watch showed (read in place, not
    /// copied); `None` when the watch has not shown it.
    pub(crate) fn seen_satisfies(&self, key: &Key, check: impl FnOnce(&Application) -> bool) -> Option<bool> {
        lock(&self.inner).seen.get(key).map(check)
    }

    /// The Applications `keep` selects.
    pub(crate) fn matching(&self, keep: impl Fn(&Key, &Application) -> bool) -> Vec<Application> {
        lock(&self.inner).seen.iter().filter(|(k, app)| keep(k, app)).map(|(_, app)| app.clone()).collect()
    }

    /// The watch shows `app`: it becomes the last version (returning the previous one), and
    /// the base of status writes again once it is the version the principal's write produced.
    pub(crate) fn observed(&self, key: Key, app: &Application) -> Option<Application> {
        let mut inner = lock(&self.inner);
        if inner.written.get(&key).is_some_and(|w| app.metadata.resource_version.as_ref() == Some(&w.resource_version))
        {
            inner.written.remove(&key);
        }
        inner.seen.insert(key, app.clone())
    }

    /// `key` is gone (deleted, or no longer one the principal routes): forgets it and any
    /// status write to it; returns the last version.
    pub(crate) fn forget(&self, key: &Key) -> Option<Application> {
        let mut inner = lock(&self.inner);
        inner.written.remove(key);
        inner.seen.remove(key)
    }

    /// What the next status write to `key` is a patch against: the principal's own last write
    /// until the watch caught up with it, else the watched object.
    pub(crate) fn status_base(&self, key: &Key) -> Option<StatusBase> {
        let inner = lock(&self.inner);
        inner.written.get(key).cloned().or_else(|| inner.seen.get(key).and_then(StatusBase::of))
    }

    /// The principal wrote `app`'s status (the object the API server returned): its version
    /// is the base of the next write to `key`.
    pub(crate) fn wrote_status(&self, key: Key, app: &Application) {
        let mut inner = lock(&self.inner);
        match StatusBase::of(app) {
            Some(base) => inner.written.insert(key, base),
            None => inner.written.remove(&key),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(rv: &str, phase: &str) -> Application {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "agent-1", "resourceVersion": rv},
            "spec": {"destination": {}, "source": {"repoURL": "r"}, "project": "default"},
            "status": {"sync": {"status": phase}}
        }))
        .expect("an Application")
    }

    #[test]
    fn the_own_write_is_the_base_until_the_watch_catches_up_with_it() {
        let index = AppIndex::default();
        let key: Key = ("agent-1".into(), "a".into());
        assert!(index.status_base(&key).is_none(), "nothing known");
        assert!(index.observed(key.clone(), &app("1", "Unknown")).is_none());
        assert_eq!(index.status_base(&key).expect("watched").resource_version, "1");

        index.wrote_status(key.clone(), &app("5", "Synced"));
        index.observed(key.clone(), &app("4", "OutOfSync"));
        assert_eq!(index.status_base(&key).expect("own write").resource_version, "5", "the watch lags the write");
        index.observed(key.clone(), &app("5", "Synced"));
        index.observed(key.clone(), &app("6", "Synced"));
        assert_eq!(index.status_base(&key).expect("watched").resource_version, "6", "caught up: the watch again");

        index.wrote_status(key.clone(), &app("7", "Synced"));
        assert_eq!(index.forget(&key).expect("known").metadata.resource_version.as_deref(), Some("6"));
        assert!(index.status_base(&key).is_none(), "a forgotten Application has no base");
        assert_eq!(index.of_agent("agent-1").len(), 0);
    }
}
