//! The hub Applications as the watch last showed them, with the status bases the principal
//! wrote since: one owner for the invariant that ties the two together. The Applications are
//! also found by the agent they route to (by namespace, or by destination), each with its
//! periodic resync digest entry once computed, so what one agent should hold is read without
//! going through every Application of the hub.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use link::lock;
use protocol::argocd::Application;

use super::digest::{Entry, app_entry, same_version};
use super::rules::Key;
use crate::sync::rules::is_autonomous_copy;

/// A hub Application's status and operation (as JSON) at a resourceVersion: what a managed
/// agent's next status write is a conditional patch against ([`crate::sync::route::managed`]).
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

/// Which of the hub's Applications an agent is asked about.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AgentApps<'a> {
    /// Those in this namespace (namespace-based mapping; an autonomous agent's copies).
    InNamespace(&'a str),
    /// Those whose `spec.destination.name` is this agent, autonomous agents' copies excepted
    /// (destination-based mapping, [`Application::destination_agent`]).
    DestinedFor(&'a str),
}

/// One Application as the watch last showed it.
#[derive(Debug)]
struct Seen {
    app: Application,
    /// Its periodic resync digest entry, once a digest needed it (for this version).
    entry: Option<Entry>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The last version of every hub Application the watch showed, ordered by namespace (so
    /// one namespace's are a range).
    seen: BTreeMap<Key, Seen>,
    /// The keys of `seen` by the agent their destination names ([`AgentApps::DestinedFor`]).
    by_destination: HashMap<String, BTreeSet<Key>>,
    /// The status and operation the principal last wrote onto a hub Application, with the
    /// resourceVersion that write produced, until the watch shows that version (or a newer
    /// object replaces it).
    written: HashMap<Key, StatusBase>,
    /// Applications a managed agent holds from a live read of the hub, which the watch has not
    /// shown (yet): kept until the watch shows or deletes one, so a re-list that no longer
    /// returns it deletes it on the agent. Without them an Application created and deleted
    /// while the watch was down (a 410 Gone, an API server restart) would stay on its agent.
    shipped: HashMap<Key, Application>,
}

/// The agent an Application's destination names, for [`Inner::by_destination`].
fn destination(app: &Application) -> Option<&str> {
    if is_autonomous_copy(app) { None } else { app.destination_agent() }
}

impl Inner {
    /// Calls `f` on every Application of `which`.
    fn visit(&self, which: AgentApps<'_>, mut f: impl FnMut(&Key, &Seen)) {
        match which {
            AgentApps::InNamespace(ns) => {
                let from = (ns.to_owned(), String::new());
                for (key, seen) in self.seen.range(from..).take_while(|(key, _)| key.0 == ns) {
                    f(key, seen);
                }
            }
            AgentApps::DestinedFor(agent) => {
                for key in self.by_destination.get(agent).into_iter().flatten() {
                    if let Some(seen) = self.seen.get(key) {
                        f(key, seen);
                    }
                }
            }
        }
    }

    fn unindex(&mut self, key: &Key, app: &Application) {
        if let Some(agent) = destination(app)
            && let Some(keys) = self.by_destination.get_mut(agent)
        {
            keys.remove(key);
            if keys.is_empty() {
                self.by_destination.remove(agent);
            }
        }
    }

    fn index(&mut self, key: &Key, app: &Application) {
        if let Some(agent) = destination(app) {
            self.by_destination.entry(agent.to_owned()).or_default().insert(key.clone());
        }
    }
}

/// Hub Applications in agent namespaces, as last seen, and the principal's own status writes
/// the watch has not caught up with yet.
///
/// Invariant: the base of a status write is the principal's own last write until the watch
/// shows the version that write produced, and the watched object from then on; so a burst of
/// status updates patches against each other without waiting for the watch.
/// Invariant: `by_destination` holds exactly the keys of `seen` whose destination names an
/// agent, under that agent; a digest entry is that of the version it sits beside.
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
        lock(&self.inner).seen.get(key).map(|s| s.app.clone())
    }

    /// Every Application the watch has shown, and those agents were sent from a live read the
    /// watch has not shown ([`Self::shipped_unwatched`]): what a re-list that no longer returns
    /// one deletes.
    pub(crate) fn all(&self) -> Vec<Application> {
        let inner = lock(&self.inner);
        inner.seen.values().map(|s| s.app.clone()).chain(inner.shipped.values().cloned()).collect()
    }

    /// A managed agent holds `app`, read live from the hub: when the watch has not shown it,
    /// it is kept beside what the watch showed until the watch shows or deletes it.
    pub(crate) fn shipped_unwatched(&self, key: Key, app: &Application) {
        let mut inner = lock(&self.inner);
        if !inner.seen.contains_key(&key) {
            inner.shipped.insert(key, app.clone());
        }
    }

    /// Whether the principal knows `key` only from a live read ([`Self::shipped_unwatched`]).
    pub(crate) fn only_shipped(&self, key: &Key) -> bool {
        let inner = lock(&self.inner);
        !inner.seen.contains_key(key) && inner.shipped.contains_key(key)
    }

    /// The Applications of `which` that `keep` selects.
    pub(crate) fn of_agent(&self, which: AgentApps<'_>, keep: impl Fn(&Application) -> bool) -> Vec<Application> {
        let mut out = Vec::new();
        lock(&self.inner).visit(which, |_, s| {
            if keep(&s.app) {
                out.push(s.app.clone());
            }
        });
        out
    }

    /// The Applications `keep` selects, going through every one (the full scan the resync's
    /// reference digest makes, [`super::bench`]).
    pub(crate) fn matching(&self, keep: impl Fn(&Key, &Application) -> bool) -> Vec<Application> {
        let inner = lock(&self.inner);
        inner.seen.iter().filter(|(k, s)| keep(k, &s.app)).map(|(_, s)| s.app.clone()).collect()
    }

    /// The periodic resync digest entries of the Applications of `which` that `keep` selects.
    /// An entry is computed ([`app_entry`]) only for a version that has none yet, outside the
    /// lock, and kept beside that version.
    pub(crate) fn entries(&self, which: AgentApps<'_>, keep: impl Fn(&Application) -> bool) -> Vec<Entry> {
        let mut out = Vec::new();
        let mut missing = Vec::new();
        lock(&self.inner).visit(which, |key, s| {
            if keep(&s.app) {
                match &s.entry {
                    Some(entry) => out.push(entry.clone()),
                    None => missing.push((key.clone(), s.app.clone())),
                }
            }
        });
        if missing.is_empty() {
            return out;
        }
        let computed: Vec<(Key, Application, Entry)> = missing
            .into_iter()
            .map(|(key, app)| {
                let entry = Arc::new(app_entry(&app));
                (key, app, entry)
            })
            .collect();
        let mut inner = lock(&self.inner);
        for (key, app, entry) in computed {
            // Kept only beside the version it was computed from (the watch may have moved on).
            if let Some(s) = inner.seen.get_mut(&key)
                && same_version(&s.app.metadata, &app.metadata)
            {
                s.entry = Some(entry.clone());
            }
            out.push(entry);
        }
        out
    }

    /// What `check` says of the last version of `key` the watch showed (read in place, not
    /// copied); `None` when the watch has not shown it.
    pub(crate) fn seen_satisfies(&self, key: &Key, check: impl FnOnce(&Application) -> bool) -> Option<bool> {
        lock(&self.inner).seen.get(key).map(|s| check(&s.app))
    }

    /// The watch shows `app`: it becomes the last version (returning the previous one), and
    /// the base of status writes again once it is the version the principal's write produced.
    pub(crate) fn observed(&self, key: Key, app: &Application) -> Option<Application> {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        if inner.written.get(&key).is_some_and(|w| app.metadata.resource_version.as_ref() == Some(&w.resource_version))
        {
            inner.written.remove(&key);
        }
        // The same version again (a re-list) keeps its digest entry.
        let entry =
            inner.seen.get(&key).filter(|s| same_version(&s.app.metadata, &app.metadata)).and_then(|s| s.entry.clone());
        let shipped = inner.shipped.remove(&key);
        let prev = inner.seen.insert(key.clone(), Seen { app: app.clone(), entry }).map(|s| s.app);
        if let Some(prev) = &prev {
            inner.unindex(&key, prev);
        }
        inner.index(&key, app);
        // What the agent was sent from a live read is what this version is compared with.
        prev.or(shipped)
    }

    /// `key` is gone (deleted, or no longer one the principal routes): forgets it and any
    /// status write to it; returns the last version (or the one sent from a live read).
    pub(crate) fn forget(&self, key: &Key) -> Option<Application> {
        let mut inner = lock(&self.inner);
        inner.written.remove(key);
        let shipped = inner.shipped.remove(key);
        let prev = inner.seen.remove(key).map(|s| s.app);
        if let Some(prev) = &prev {
            inner.unindex(key, prev);
        }
        prev.or(shipped)
    }

    /// What the next status write to `key` is a patch against: the principal's own last write
    /// until the watch caught up with it, else the watched object.
    pub(crate) fn status_base(&self, key: &Key) -> Option<StatusBase> {
        let inner = lock(&self.inner);
        inner.written.get(key).cloned().or_else(|| inner.seen.get(key).and_then(|s| StatusBase::of(&s.app)))
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
        assert!(index.of_agent(AgentApps::InNamespace("agent-1"), |_| true).is_empty());
    }
}
