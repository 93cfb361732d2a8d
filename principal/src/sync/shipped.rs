//! Core objects of the principal namespace that the principal ships to managed agents (repository
//! secrets, the GPG keys ConfigMap), as the watch last showed them, and the agents each one was
//! sent to: one owner for "an agent holds a copy exactly while the object belongs there".
//! Repository secrets are also found by their project, each object with its periodic resync
//! digest entry once computed.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use link::lock;
use protocol::EventType;
use protocol::argocd::{ConfigMap, ObjectMeta, Secret};
use protocol::checksum::{
    Checksum, RESYNC_KIND_GPG_KEY, RESYNC_KIND_REPOSITORY, ResourceKey, config_map_checksum, secret_checksum,
};

use super::digest::{DigestEntry, Entry};

/// A kind of object the principal ships.
pub(crate) trait Shipped: Clone + PartialEq + serde::Serialize {
    /// Its event target.
    const TARGET: protocol::Target;
    /// Its kind in resync messages and checksums.
    const RESYNC_KIND: &'static str;
    fn meta(&self) -> &ObjectMeta;
    fn meta_mut(&mut self) -> &mut ObjectMeta;
    /// The spec checksum of the agent's copy.
    fn spec_checksum(&self) -> Option<Checksum>;
    /// What decides which agents it goes to, when something does: a repository's project.
    fn group(&self) -> Option<String>;
    /// Its part of a periodic resync digest.
    fn digest_entry(&self) -> DigestEntry {
        DigestEntry { key: ResourceKey::from_meta(Self::RESYNC_KIND, self.meta()), checksum: self.spec_checksum() }
    }
}

impl Shipped for Secret {
    const TARGET: protocol::Target = protocol::Target::Repository;
    const RESYNC_KIND: &'static str = RESYNC_KIND_REPOSITORY;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn spec_checksum(&self) -> Option<Checksum> {
        secret_checksum(self)
    }
    fn group(&self) -> Option<String> {
        self.project()
    }
}

impl Shipped for ConfigMap {
    const TARGET: protocol::Target = protocol::Target::GpgKey;
    const RESYNC_KIND: &'static str = RESYNC_KIND_GPG_KEY;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn spec_checksum(&self) -> Option<Checksum> {
        config_map_checksum(self)
    }
    fn group(&self) -> Option<String> {
        None
    }
}

#[derive(Debug)]
struct Inner<T> {
    /// The last version of every object the watch showed (or the hub listed).
    seen: HashMap<String, T>,
    /// The names in `seen` by [`Shipped::group`].
    groups: HashMap<String, BTreeSet<String>>,
    /// The periodic resync digest entry of objects of `seen`, once a digest needed it (dropped
    /// when the object changes).
    entries: HashMap<String, Entry>,
    /// The agents each object was last sent to (kept after the object or what made it belong
    /// is gone, so its deletion still reaches them: upstream's obj-to-agents cache).
    sent: HashMap<String, BTreeSet<String>>,
}

impl<T: Shipped> Inner<T> {
    /// Records `obj` as the last version of `name`, in its group; returns the previous one.
    fn put(&mut self, name: &str, obj: T) -> Option<T> {
        let prev = self.forget(name);
        if let Some(group) = obj.group() {
            self.groups.entry(group).or_default().insert(name.to_owned());
        }
        self.seen.insert(name.to_owned(), obj);
        prev
    }

    /// Forgets `name` (not where it was sent); returns its last version.
    fn forget(&mut self, name: &str) -> Option<T> {
        let prev = self.seen.remove(name)?;
        self.entries.remove(name);
        if let Some(group) = prev.group()
            && let Some(names) = self.groups.get_mut(&group)
        {
            names.remove(name);
            if names.is_empty() {
                self.groups.remove(&group);
            }
        }
        Some(prev)
    }

    /// The digest entry of `name`, computed once per version.
    fn entry(&mut self, name: &str) -> Option<Entry> {
        if let Some(entry) = self.entries.get(name) {
            return Some(entry.clone());
        }
        let entry = Arc::new(self.seen.get(name)?.digest_entry());
        self.entries.insert(name.to_owned(), entry.clone());
        Some(entry)
    }
}

/// Objects of one shipped kind, and where their copies are.
///
/// Every decision is made and its events are handed to `send` under one lock, so two tasks
/// (the object's watch, the project watch, an agent's resync) never queue an agent's events
/// for one object out of the order in which they decided them.
#[derive(Debug)]
pub(crate) struct ShippedIndex<T> {
    inner: Mutex<Inner<T>>,
}

impl<T> Default for ShippedIndex<T> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                seen: HashMap::new(),
                groups: HashMap::new(),
                entries: HashMap::new(),
                sent: HashMap::new(),
            }),
        }
    }
}

/// Repository and obj-creds secrets.
pub(crate) type RepoIndex = ShippedIndex<Secret>;
/// The GPG keys ConfigMap.
pub(crate) type GpgIndex = ShippedIndex<ConfigMap>;

impl<T: Shipped> ShippedIndex<T> {
    /// The last version of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<T> {
        lock(&self.inner).seen.get(name).cloned()
    }

    /// Every object.
    pub(crate) fn all(&self) -> Vec<T> {
        lock(&self.inner).seen.values().cloned().collect()
    }

    /// Adds the objects of a live list that the watch has not shown yet (before its first
    /// list, an agent's resync reads the hub live); a later watch event or re-list corrects them.
    pub(crate) fn preload(&self, objects: Vec<T>) {
        let mut inner = lock(&self.inner);
        for obj in objects {
            let name = obj.meta().name.clone().unwrap_or_default();
            if !inner.seen.contains_key(&name) {
                inner.put(&name, obj);
            }
        }
    }

    /// The objects of `groups` that `keep` selects.
    pub(crate) fn in_groups(&self, groups: &[String], keep: impl Fn(&T) -> bool) -> Vec<T> {
        let inner = lock(&self.inner);
        let names = groups.iter().filter_map(|g| inner.groups.get(g)).flatten();
        names.filter_map(|name| inner.seen.get(name)).filter(|obj| keep(obj)).cloned().collect()
    }

    /// The periodic resync digest entries of the objects of `groups` (every object: `None`)
    /// that `keep` selects.
    pub(crate) fn entries(&self, groups: Option<&[String]>, keep: impl Fn(&T) -> bool) -> Vec<Entry> {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        let mut names: Vec<String> = match groups {
            Some(groups) => groups.iter().filter_map(|g| inner.groups.get(g)).flatten().cloned().collect(),
            None => inner.seen.keys().cloned().collect(),
        };
        names.retain(|name| inner.seen.get(name).is_some_and(&keep));
        names.iter().filter_map(|name| inner.entry(name)).collect()
    }

    /// The watch shows the object (new or changed); `targets` are the agents it belongs on now.
    /// New targets get `create`, ones it left get `delete`, the others `spec-update` if it
    /// changed.
    pub(crate) fn observed(&self, obj: &T, targets: &BTreeSet<String>, mut send: impl FnMut(&str, EventType, &T)) {
        let name = obj.meta().name.clone().unwrap_or_default();
        let mut inner = lock(&self.inner);
        let changed = inner.seen.get(&name) != Some(obj);
        if changed {
            inner.put(&name, obj.clone());
        }
        let before = inner.sent.insert(name, targets.clone()).unwrap_or_default();
        for agent in before.difference(targets) {
            send(agent, EventType::Delete, obj);
        }
        for agent in targets {
            if !before.contains(agent) {
                send(agent, EventType::Create, obj);
            } else if changed {
                send(agent, EventType::SpecUpdate, obj);
            }
        }
    }

    /// The watch shows the object deleted (or stopped being one to ship):
    /// `delete` to every agent it was sent to and every one it still matches.
    pub(crate) fn deleted(&self, obj: &T, targets: &BTreeSet<String>, mut send: impl FnMut(&str, EventType, &T)) {
        let name = obj.meta().name.as_deref().unwrap_or_default();
        let mut inner = lock(&self.inner);
        let last = inner.forget(name);
        let sent = inner.sent.remove(name).unwrap_or_default();
        let obj = last.as_ref().unwrap_or(obj);
        for agent in sent.union(targets) {
            send(agent, EventType::Delete, obj);
        }
    }

    /// What makes objects belong changed (a project): every object that is `affected` goes
    /// where `targets_of` says now (`create` to agents it newly belongs on, `delete` to those
    /// it left).
    pub(crate) fn retarget(
        &self,
        affected: impl Fn(&T) -> bool,
        targets_of: impl Fn(&T) -> BTreeSet<String>,
        mut send: impl FnMut(&str, EventType, &T),
    ) {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        for (name, obj) in &inner.seen {
            if !affected(obj) {
                continue;
            }
            let now = targets_of(obj);
            let before = inner.sent.insert(name.clone(), now.clone()).unwrap_or_default();
            for agent in before.difference(&now) {
                send(agent, EventType::Delete, obj);
            }
            for agent in now.difference(&before) {
                send(agent, EventType::Create, obj);
            }
        }
    }

    /// An agent (re)connected: every repository that `belongs` on it is sent as `spec-update`
    /// (upstream's on-connect state push), and every one it holds that no longer belongs there
    /// as `delete`.
    pub(crate) fn resync(&self, agent: &str, belongs: impl Fn(&T) -> bool, mut send: impl FnMut(&str, EventType, &T)) {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        for (name, obj) in &inner.seen {
            let sent = inner.sent.entry(name.clone()).or_default();
            if belongs(obj) {
                sent.insert(agent.to_owned());
                send(agent, EventType::SpecUpdate, obj);
            } else if sent.remove(agent) {
                send(agent, EventType::Delete, obj);
            }
        }
    }

    /// The agent asked about `name` (resync `request-update`): `spec-update` if it belongs
    /// there and `differs` from the agent's copy, `delete` if it does not belong there (or is
    /// gone: `stub` stands for it).
    pub(crate) fn answer(
        &self,
        agent: &str,
        name: &str,
        belongs: impl Fn(&T) -> bool,
        differs: impl Fn(&T) -> bool,
        stub: &T,
        mut send: impl FnMut(&str, EventType, &T),
    ) {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        match inner.seen.get(name) {
            Some(obj) if belongs(obj) => {
                inner.sent.entry(name.to_owned()).or_default().insert(agent.to_owned());
                if differs(obj) {
                    send(agent, EventType::SpecUpdate, obj);
                }
            }
            found => {
                if let Some(sent) = inner.sent.get_mut(name) {
                    sent.remove(agent);
                }
                send(agent, EventType::Delete, found.unwrap_or(stub));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(name: &str, project: &str, rv: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "resourceVersion": rv,
                         "labels": {"argocd.argoproj.io/secret-type": "repository"}},
            "stringData": {"project": project},
        }))
        .unwrap_or_default()
    }

    fn set(agents: &[&str]) -> BTreeSet<String> {
        agents.iter().map(|a| (*a).to_owned()).collect()
    }

    /// Runs `f` with a sink and returns what it sent, as `agent:type`.
    fn sent(f: impl FnOnce(&mut dyn FnMut(&str, EventType, &Secret))) -> Vec<String> {
        let mut out = Vec::new();
        f(&mut |agent, ty, _| out.push(format!("{agent}:{}", ty.as_str().rsplit('.').next().unwrap_or_default())));
        out
    }

    #[test]
    fn a_repository_follows_its_targets_and_its_deletion_reaches_every_holder() {
        let index: RepoIndex = ShippedIndex::default();
        let r1 = repo("r", "team", "1");
        assert_eq!(sent(|s| index.observed(&r1, &set(&["a", "b"]), s)), ["a:create", "b:create"]);
        assert!(sent(|s| index.observed(&r1, &set(&["a", "b"]), s)).is_empty(), "a re-list of the same version");
        let r2 = repo("r", "team", "2");
        assert_eq!(sent(|s| index.observed(&r2, &set(&["b", "c"]), s)), ["a:delete", "b:spec-update", "c:create"]);
        // Deleted after its project went away (no target left): every agent that holds it.
        assert_eq!(sent(|s| index.deleted(&r2, &BTreeSet::new(), s)), ["b:delete", "c:delete"]);
        assert!(index.get("r").is_none());
    }

    #[test]
    fn a_project_change_moves_only_its_own_repositories() {
        let index: RepoIndex = ShippedIndex::default();
        index.observed(&repo("mine", "team", "1"), &set(&["a"]), |_, _, _| {});
        index.observed(&repo("other", "ops", "1"), &set(&["a"]), |_, _, _| {});
        let moved = sent(|s| index.retarget(|r| r.project().as_deref() == Some("team"), |_| set(&["b"]), s));
        assert_eq!(moved, ["a:delete", "b:create"]);
    }

    fn names(repos: Vec<Secret>) -> Vec<String> {
        let mut names: Vec<String> = repos.into_iter().filter_map(|r| r.metadata.name).collect();
        names.sort();
        names
    }

    #[test]
    fn repositories_are_found_by_their_project_as_it_changes() {
        let index: RepoIndex = ShippedIndex::default();
        let groups = |g: &[&str]| g.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        index.observed(&repo("r", "team", "1"), &set(&["a"]), |_, _, _| {});
        index.preload(vec![repo("s", "team", "1"), repo("r", "ops", "9")]);
        assert_eq!(
            names(index.in_groups(&groups(&["team"]), |_| true)),
            ["r", "s"],
            "a preload adds what is not there"
        );
        index.observed(&repo("r", "ops", "2"), &set(&["a"]), |_, _, _| {});
        assert_eq!(names(index.in_groups(&groups(&["team"]), |_| true)), ["s"]);
        assert_eq!(names(index.in_groups(&groups(&["ops", "team"]), |_| true)), ["r", "s"]);
        index.deleted(&repo("s", "team", "1"), &BTreeSet::new(), |_, _, _| {});
        assert!(index.in_groups(&groups(&["team"]), |_| true).is_empty());

        // Digest entries: kept while the secret is unchanged.
        let first = index.entries(Some(&groups(&["ops"])), |_| true);
        assert!(Arc::ptr_eq(&first[0], &index.entries(None, |_| true)[0]));
        index.observed(&repo("r", "ops", "3"), &set(&["a"]), |_, _, _| {});
        assert!(!Arc::ptr_eq(&first[0], &index.entries(None, |_| true)[0]));
        assert!(index.entries(None, |_| false).is_empty());
    }

    #[test]
    fn a_resync_sends_what_belongs_and_deletes_what_no_longer_does() {
        let index: RepoIndex = ShippedIndex::default();
        index.observed(&repo("kept", "team", "1"), &set(&["a"]), |_, _, _| {});
        index.observed(&repo("left", "ops", "1"), &set(&["a"]), |_, _, _| {});
        let mut out = sent(|s| index.resync("a", |r| r.project().as_deref() == Some("team"), s));
        out.sort();
        assert_eq!(out, ["a:delete", "a:spec-update"]);

        // request-update: unchanged sends nothing, a gone one is deleted by its stub.
        let stub = repo("gone", "", "");
        assert!(sent(|s| index.answer("a", "kept", |_| true, |_| false, &stub, s)).is_empty());
        assert_eq!(sent(|s| index.answer("a", "kept", |_| true, |_| true, &stub, s)), ["a:spec-update"]);
        assert_eq!(sent(|s| index.answer("a", "gone", |_| true, |_| true, &stub, s)), ["a:delete"]);
        assert_eq!(sent(|s| index.answer("a", "kept", |_| false, |_| true, &stub, s)), ["a:delete"]);
    }
}
