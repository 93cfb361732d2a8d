//! What each hub object contributes to the periodic resync's spec digest
//! ([`protocol::checksum::spec_digest`]): its resource key and the spec checksum the agent's copy
//! has when in sync. The indexes keep the entry of each object beside it, for the version
//! (UID and resourceVersion) it was computed from, so a digest of unchanged objects hashes
//! nothing but the digest itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use link::lock;

use protocol::argocd::{AppProject, Application, ObjectMeta};
use protocol::checksum::{
    Checksum, RESYNC_KIND_APP_PROJECT, RESYNC_KIND_APPLICATION, ResourceKey, spec_checksum, spec_digest,
};
use serde::Serialize;

use crate::config::Mapping;
use crate::sync::rules::{self, is_autonomous_copy};

/// One object's part of a digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DigestEntry {
    pub(crate) key: ResourceKey,
    /// The spec checksum; `None` when the object has none.
    pub(crate) checksum: Option<Checksum>,
}

/// A digest entry computed once and shared by every digest that includes the object.
pub(crate) type Entry = Arc<DigestEntry>;

/// The version of an object an entry stands for: its UID and resourceVersion. `None` without a
/// resourceVersion: such an entry is never kept (nothing tells a later version from it).
pub(crate) fn version_of(meta: &ObjectMeta) -> Option<(String, String)> {
    Some((meta.uid.clone().unwrap_or_default(), meta.resource_version.clone()?))
}

/// Whether two objects are the same version, known to be (so an entry of one stands for the other).
pub(crate) fn same_version(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    version_of(a).is_some_and(|v| Some(v) == version_of(b))
}

/// The spec checksum of an object, `None` if it has no spec.
pub(crate) fn checksum_of<T: Serialize>(obj: &T) -> Option<Checksum> {
    let value = serde_json::to_value(obj).ok()?;
    spec_checksum(&value).ok()
}

/// A hub Application's entry: the spec as the hub has it (managed), or as its agent has it
/// (an autonomous agent's copy, whose namespace is the agent's name).
pub(crate) fn app_entry(app: &Application) -> DigestEntry {
    let checksum = if is_autonomous_copy(app) {
        let agent = app.metadata.namespace.as_deref().unwrap_or_default();
        checksum_of(&rules::agent_side_spec(agent, app))
    } else {
        checksum_of(app)
    };
    DigestEntry { key: ResourceKey::from_meta(RESYNC_KIND_APPLICATION, &app.metadata), checksum }
}

/// A hub AppProject's entry for `agent`: the spec of the copy that agent gets.
pub(crate) fn project_entry(p: &AppProject, agent: &str, mapping: Mapping) -> DigestEntry {
    DigestEntry {
        key: ResourceKey::from_meta(RESYNC_KIND_APP_PROJECT, &p.metadata),
        checksum: checksum_of(&rules::agent_copy(p, agent, mapping)),
    }
}

/// The digest of `entries` (`None` when there are none).
pub(crate) fn digest(entries: &[Entry]) -> Option<Checksum> {
    spec_digest(entries.iter().map(|e| (&e.key, e.checksum.as_ref().map(|c| &c[..]))))
}

/// The last digest computed for each agent, with the entries it was computed from: the same
/// entries again (each the same kept [`Entry`], so nothing changed) give the same digest
/// without hashing. The entries are kept, not their addresses, so an address is never that
/// of a newer entry.
#[derive(Debug, Default)]
pub(crate) struct LastDigests {
    by_agent: Mutex<HashMap<String, LastDigest>>,
}

/// An agent's last digest and the entries it was computed from.
type LastDigest = (Vec<Entry>, Option<Checksum>);

impl LastDigests {
    /// The digest of `entries` (see [`digest`]), for `agent`.
    pub(crate) fn of(&self, agent: &str, entries: Vec<Entry>) -> Option<Checksum> {
        let same =
            |last: &[Entry]| last.len() == entries.len() && last.iter().zip(&entries).all(|(a, b)| Arc::ptr_eq(a, b));
        if let Some((last, digest)) = lock(&self.by_agent).get(agent)
            && same(last)
        {
            return *digest;
        }
        let computed = digest(&entries);
        lock(&self.by_agent).insert(agent.to_owned(), (entries, computed));
        computed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, checksum: u8) -> Entry {
        let key = ResourceKey {
            kind: RESYNC_KIND_APPLICATION.into(),
            name: name.into(),
            namespace: "agent-1".into(),
            uid: format!("uid-{name}"),
        };
        Arc::new(DigestEntry { key, checksum: Some([checksum; 32]) })
    }

    #[test]
    fn the_same_entries_give_the_last_digest_and_any_other_entry_a_new_one() {
        let last = LastDigests::default();
        let (a, b) = (entry("a", 1), entry("b", 1));
        let first = last.of("agent-1", vec![a.clone(), b.clone()]);
        assert_eq!(first, digest(&[a.clone(), b.clone()]));
        assert_eq!(last.of("agent-1", vec![a.clone(), b.clone()]), first);
        // Equal content in a new entry is computed again, and agrees.
        assert_eq!(last.of("agent-1", vec![a.clone(), entry("b", 1)]), first);
        let changed = last.of("agent-1", vec![a.clone(), entry("b", 2)]);
        assert_ne!(changed, first);
        assert_eq!(last.of("agent-1", vec![a.clone()]), digest(std::slice::from_ref(&a)), "one fewer");
        assert_eq!(last.of("agent-2", Vec::new()), None, "each agent its own");
    }
}
