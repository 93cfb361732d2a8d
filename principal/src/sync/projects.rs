//! The hub AppProjects of the principal namespace as the watch last showed them, and which of
//! them match each agent: what an agent should hold is read without matching every project of
//! the hub against it each time. The digest entry of an agent's copy of a project is kept per
//! agent, and shared by the agents whose copies are the same (a project matching every agent:
//! one entry, not one per agent).

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use link::lock;
use protocol::argocd::AppProject;

use super::digest::{Entry, project_entry, same_version};
use crate::config::{Mapping, glob_match};
use crate::sync::rules::matches_agent;

/// The projects matching one agent, by name, each with the digest entry of that agent's copy
/// once a digest needed it.
type Held = BTreeMap<String, Option<Entry>>;

#[derive(Debug, Default)]
struct Inner {
    /// The last version of every hub AppProject the watch showed (or the distributor kept).
    seen: HashMap<String, AppProject>,
    /// The projects of `seen` by the agents they can match.
    reach: Reach,
    /// For every agent asked about since the principal started: the projects of `seen`
    /// matching it ([`matches_agent`]).
    agents: HashMap<String, Held>,
    /// The digest entries of the copies of each project of `seen` computed so far, by the
    /// destinations a copy keeps ([`copy_of`]).
    copies: HashMap<String, HashMap<Vec<usize>, Entry>>,
    /// Projects an agent was sent from a live read of the hub that the watch has not shown
    /// (yet), until it shows or deletes them: as `AppIndex`'s, so a re-list that no longer
    /// returns one deletes it on the agents.
    shipped: HashMap<String, AppProject>,
}

/// Which destinations of `p` the copy `agent` gets keeps: those whose name is not a deny and
/// matches the agent, as [`crate::sync::rules::agent_copy`] picks them. Nothing else of the
/// copy depends on the agent, so agents with the same ones get the same copy (the unit tests
/// check the digests against a full scan, which makes each copy afresh).
fn copy_of(p: &AppProject, agent: &str) -> Vec<usize> {
    let names = p.spec.destinations.iter().flatten().map(|d| d.name.as_deref());
    let kept = names.enumerate().filter(|(_, n)| n.is_some_and(|n| !n.starts_with('!') && glob_match(n, agent)));
    kept.map(|(i, _)| i).collect()
}

/// Projects by the agents they can match: a project matches an agent only if one of its
/// destination names (not a `!` deny) matches the agent's name, and a name without `*` or `?`
/// matches that name alone.
#[derive(Debug, Default)]
struct Reach {
    /// Projects whose destination names are all plain names, by each name.
    by_name: HashMap<String, BTreeSet<String>>,
    /// Projects with a pattern among their destination names: they may match any agent.
    patterned: BTreeSet<String>,
}

impl Reach {
    /// The destination names `p` can match by, `None` when one is a pattern.
    fn names(p: &AppProject) -> Option<Vec<&str>> {
        let allowed = p.spec.destinations.iter().flatten().filter_map(|d| d.name.as_deref());
        allowed.filter(|n| !n.starts_with('!')).map(|n| (!n.contains(['*', '?'])).then_some(n)).collect()
    }

    fn add(&mut self, name: &str, p: &AppProject) {
        match Self::names(p) {
            Some(names) => {
                for n in names {
                    self.by_name.entry(n.to_owned()).or_default().insert(name.to_owned());
                }
            }
            None => _ = self.patterned.insert(name.to_owned()),
        }
    }

    fn remove(&mut self, name: &str, p: &AppProject) {
        match Self::names(p) {
            Some(names) => {
                for n in names {
                    if let Some(projects) = self.by_name.get_mut(n) {
                        projects.remove(name);
                        if projects.is_empty() {
                            self.by_name.remove(n);
                        }
                    }
                }
            }
            None => _ = self.patterned.remove(name),
        }
    }

    /// The projects that may match `agent`.
    fn candidates<'a>(&'a self, agent: &str) -> impl Iterator<Item = &'a String> {
        self.by_name.get(agent).into_iter().flatten().chain(&self.patterned)
    }
}

/// The projects of `seen` matching `agent`: found once among those that can match it, and kept
/// in line with every change from then on.
fn held<'a>(
    seen: &HashMap<String, AppProject>,
    reach: &Reach,
    agents: &'a mut HashMap<String, Held>,
    agent: &str,
    mapping: Mapping,
) -> &'a mut Held {
    match agents.entry(agent.to_owned()) {
        MapEntry::Occupied(held) => held.into_mut(),
        MapEntry::Vacant(slot) => slot.insert(
            reach
                .candidates(agent)
                .filter(|name| seen.get(*name).is_some_and(|p| matches_agent(p, agent, mapping)))
                .map(|name| (name.clone(), None))
                .collect(),
        ),
    }
}

/// Hub AppProjects, and the ones matching each agent.
///
/// Invariant: for every agent in `agents`, its names are exactly the projects of `seen` that
/// match it, and a digest entry is that of the version of the project it was computed from.
#[derive(Debug)]
pub(crate) struct ProjectIndex {
    mapping: Mapping,
    inner: Mutex<Inner>,
}

impl ProjectIndex {
    /// Projects matched to agents under `mapping` (which decides whether `sourceNamespaces`
    /// counts).
    pub(crate) fn new(mapping: Mapping) -> Self {
        Self { mapping, inner: Mutex::default() }
    }

    /// Records `p` as the last version of `name`; returns the previous one.
    pub(crate) fn insert(&self, name: String, p: AppProject) -> Option<AppProject> {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        // What agents were sent from a live read is what this version is compared with.
        let shipped = inner.shipped.remove(&name);
        let prev = inner.seen.insert(name.clone(), p);
        let cur = &inner.seen[&name];
        if prev.as_ref().is_some_and(|prev| same_version(&prev.metadata, &cur.metadata)) {
            return prev; // the same version again (a re-list): nothing changes
        }
        if let Some(prev) = &prev {
            inner.reach.remove(&name, prev);
        }
        inner.reach.add(&name, cur);
        inner.copies.remove(&name);
        for (agent, held) in &mut inner.agents {
            if matches_agent(cur, agent, self.mapping) {
                held.insert(name.clone(), None);
            } else {
                held.remove(&name);
            }
        }
        prev.or(shipped)
    }

    /// Forgets `name`; returns its last version (or the one sent from a live read).
    pub(crate) fn remove(&self, name: &str) -> Option<AppProject> {
        let mut inner = lock(&self.inner);
        let shipped = inner.shipped.remove(name);
        let Some(prev) = inner.seen.remove(name) else { return shipped };
        inner.reach.remove(name, &prev);
        inner.copies.remove(name);
        for held in inner.agents.values_mut() {
            held.remove(name);
        }
        Some(prev)
    }

    /// The last version of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<AppProject> {
        lock(&self.inner).seen.get(name).cloned()
    }

    /// Every last version, and the projects agents were sent from a live read the watch has
    /// not shown: what a re-list that no longer returns one deletes.
    pub(crate) fn values(&self) -> Vec<AppProject> {
        let inner = lock(&self.inner);
        inner.seen.values().chain(inner.shipped.values()).cloned().collect()
    }

    /// An agent was sent `p`, read live from the hub: when the watch has not shown it, it is
    /// kept beside what the watch showed until the watch shows or deletes it.
    pub(crate) fn shipped_unwatched(&self, p: &AppProject) {
        let name = p.metadata.name.clone().unwrap_or_default();
        let mut inner = lock(&self.inner);
        if !inner.seen.contains_key(&name) {
            inner.shipped.insert(name, p.clone());
        }
    }

    /// Whether the principal knows `name` only from a live read ([`Self::shipped_unwatched`]).
    pub(crate) fn only_shipped(&self, name: &str) -> bool {
        let inner = lock(&self.inner);
        !inner.seen.contains_key(name) && inner.shipped.contains_key(name)
    }

    /// The projects matching `agent`.
    pub(crate) fn of_agent(&self, agent: &str) -> Vec<AppProject> {
        let mut guard = lock(&self.inner);
        let Inner { seen, reach, agents, .. } = &mut *guard;
        held(seen, reach, agents, agent, self.mapping).keys().filter_map(|name| seen.get(name).cloned()).collect()
    }

    /// The names of the projects matching `agent` that `keep` selects, and the periodic
    /// resync digest entries of the copies `agent` gets of them. An entry is computed
    /// ([`project_entry`]) only for a version of which no agent had the same copy yet, outside
    /// the lock.
    pub(crate) fn entries(&self, agent: &str, keep: impl Fn(&AppProject) -> bool) -> (Vec<String>, Vec<Entry>) {
        let (mut names, mut out, mut missing) = (Vec::new(), Vec::new(), Vec::new());
        {
            let mut guard = lock(&self.inner);
            let Inner { seen, reach, agents, copies, .. } = &mut *guard;
            for (name, entry) in held(seen, reach, agents, agent, self.mapping).iter_mut() {
                let Some(p) = seen.get(name).filter(|p| keep(p)) else { continue };
                names.push(name.clone());
                if entry.is_none() {
                    // Another agent's copy may be this agent's.
                    *entry = copies.get(name).and_then(|c| c.get(&copy_of(p, agent))).cloned();
                }
                match entry {
                    Some(entry) => out.push(entry.clone()),
                    None => missing.push((name.clone(), p.clone())),
                }
            }
        }
        if missing.is_empty() {
            return (names, out);
        }
        let computed: Vec<(String, AppProject, Entry)> = missing
            .into_iter()
            .map(|(name, p)| {
                let entry = Arc::new(project_entry(&p, agent, self.mapping));
                (name, p, entry)
            })
            .collect();
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        for (name, p, entry) in computed {
            // Kept only beside the version it was computed from (the watch may have moved on).
            if inner.seen.get(&name).is_some_and(|cur| same_version(&cur.metadata, &p.metadata))
                && let Some(slot) = inner.agents.get_mut(agent).and_then(|held| held.get_mut(&name))
            {
                *slot = Some(entry.clone());
                inner.copies.entry(name).or_default().insert(copy_of(&p, agent), entry.clone());
            }
            out.push(entry);
        }
        (names, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(name: &str, rv: u64, destinations: &[&str]) -> AppProject {
        let destinations: Vec<_> = destinations.iter().map(|d| serde_json::json!({"name": d, "server": "*"})).collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}"), "resourceVersion": rv.to_string()},
            "spec": {"destinations": destinations, "sourceNamespaces": ["*"]},
        }))
        .expect("an AppProject")
    }

    fn names(index: &ProjectIndex, agent: &str) -> Vec<String> {
        index.of_agent(agent).into_iter().filter_map(|p| p.metadata.name).collect()
    }

    #[test]
    fn the_projects_of_an_agent_follow_every_change_after_it_was_first_asked_about() {
        let index = ProjectIndex::new(Mapping::Namespace);
        index.insert("all".into(), project("all", 1, &["agent-*"]));
        index.insert("one".into(), project("one", 1, &["agent-1"]));
        assert_eq!(names(&index, "agent-1"), ["all", "one"]);
        assert_eq!(names(&index, "agent-2"), ["all"]);

        // A destination moves, a deny is added, a project goes and a new one comes.
        index.insert("one".into(), project("one", 2, &["agent-2"]));
        index.insert("all".into(), project("all", 2, &["agent-*", "!agent-2"]));
        assert_eq!(names(&index, "agent-1"), ["all"]);
        assert_eq!(names(&index, "agent-2"), ["one"]);
        assert_eq!(index.remove("one").and_then(|p| p.metadata.resource_version).as_deref(), Some("2"));
        index.insert("new".into(), project("new", 1, &["agent-?"]));
        assert_eq!(names(&index, "agent-1"), ["all", "new"]);
        assert_eq!(names(&index, "agent-2"), ["new"]);
        assert_eq!(names(&index, "agent-10"), ["all"], "first asked now: found by going through them all");
        assert!(index.remove("gone").is_none());
    }

    #[test]
    fn only_the_projects_that_can_match_an_agent_are_looked_at() {
        let index = ProjectIndex::new(Mapping::Namespace);
        for i in 0..5 {
            index.insert(format!("own-{i}"), project(&format!("own-{i}"), 1, &[&format!("agent-{i}"), "!agent-9"]));
        }
        index.insert("some".into(), project("some", 1, &["agent-1", "agent-?"]));
        let candidates = |agent: &str| {
            let inner = lock(&index.inner);
            let mut names: Vec<String> = inner.reach.candidates(agent).cloned().collect();
            names.sort();
            names
        };
        assert_eq!(candidates("agent-3"), ["own-3", "some"]);
        index.insert("own-3".into(), project("own-3", 2, &["agent-4"]));
        assert_eq!(candidates("agent-3"), ["some"]);
        assert_eq!(candidates("agent-4"), ["own-3", "own-4", "some"]);
        index.remove("some");
        assert_eq!(candidates("agent-1"), ["own-1"]);
        assert_eq!(names(&index, "agent-4"), ["own-3", "own-4"]);
    }

    #[test]
    fn an_agents_copy_keeps_its_entry_until_the_project_changes() {
        let index = ProjectIndex::new(Mapping::Destination);
        index.insert("all".into(), project("all", 1, &["agent-*"]));
        let (names, first) = index.entries("agent-1", |_| true);
        assert_eq!(names, ["all"]);
        let (_, again) = index.entries("agent-1", |_| true);
        assert!(Arc::ptr_eq(&first[0], &again[0]));
        // A re-list of the same version keeps it; a new version does not.
        index.insert("all".into(), project("all", 1, &["agent-*"]));
        assert!(Arc::ptr_eq(&first[0], &index.entries("agent-1", |_| true).1[0]));
        index.insert("all".into(), project("all", 2, &["agent-*", "other"]));
        let (_, changed) = index.entries("agent-1", |_| true);
        assert!(!Arc::ptr_eq(&first[0], &changed[0]));
        assert_eq!(
            *changed[0],
            project_entry(&project("all", 2, &["agent-*", "other"]), "agent-1", Mapping::Destination)
        );
        assert_eq!(index.entries("agent-1", |_| false), (Vec::new(), Vec::new()), "left out by the caller");
    }

    #[test]
    fn agents_with_the_same_copy_share_its_entry() {
        let index = ProjectIndex::new(Mapping::Namespace);
        index.insert("p".into(), project("p", 1, &["agent-*", "agent-1", "!agent-3"]));
        let one = index.entries("agent-1", |_| true).1;
        let two = index.entries("agent-2", |_| true).1;
        let twenty = index.entries("agent-20", |_| true).1;
        assert!(Arc::ptr_eq(&two[0], &twenty[0]), "the same destinations kept: one entry");
        assert!(!Arc::ptr_eq(&one[0], &two[0]), "agent-1 keeps one more destination");
        assert_ne!(one[0], two[0]);
        assert!(index.entries("agent-3", |_| true).1.is_empty(), "denied");
        for (agent, entry) in [("agent-1", &one[0]), ("agent-2", &two[0]), ("agent-20", &twenty[0])] {
            assert_eq!(**entry, project_entry(&index.get("p").expect("kept"), agent, Mapping::Namespace));
        }
        index.insert("p".into(), project("p", 2, &["agent-*"]));
        assert!(!Arc::ptr_eq(&two[0], &index.entries("agent-20", |_| true).1[0]), "a new version: computed again");
    }
}
