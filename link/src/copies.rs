//! The owner's version of every copy one side keeps in line, and the deletions it asked for.
//!
//! Both sides keep copies of objects that the other side owns: the agent in managed mode keeps
//! the principal's Applications and AppProjects, the principal keeps the hub copies of an
//! autonomous agent's Applications. A local edit to such a copy is reverted to the owner's
//! version, and a local deletion is reverted by recreating it, unless the side deleted it
//! itself on the owner's word. [`Copies`] holds both halves of that decision under one lock:
//!
//! * **the source**: what the owner last said each copy is. A copy first seen without one
//!   (e.g. after a restart, before the owner resent it) is adopted as it is;
//! * **expected deletions**: copies this side is deleting because the owner said so. When the
//!   deletion shows up in the watch it is settled once ([`Gone::Expected`]) and the source
//!   is forgotten with it; any other deletion is a local one, to revert ([`Gone::Restore`]).

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;

use crate::lock;

/// What a deletion seen in the watch means.
#[derive(Debug, PartialEq, Eq)]
pub enum Gone<V> {
    /// This side deleted it on the owner's word: done, source forgotten.
    Expected,
    /// Deleted locally behind the owner's back: recreate it as the owner has it.
    Restore(V),
    /// Not a copy this side keeps (never had a source).
    Unknown,
}

#[derive(Debug)]
struct Inner<K, V> {
    source: HashMap<K, V>,
    expected_deletes: HashSet<K>,
}

/// The owner's version of each copy, and the deletions this side asked for (see the module
/// documentation for the invariants).
#[derive(Debug)]
pub struct Copies<K, V> {
    inner: Mutex<Inner<K, V>>,
}

impl<K, V> Default for Copies<K, V> {
    fn default() -> Self {
        Self { inner: Mutex::new(Inner { source: HashMap::new(), expected_deletes: HashSet::new() }) }
    }
}

impl<K: Eq + Hash + Clone, V: Clone> Copies<K, V> {
    /// The owner's version of `key`, if known.
    pub fn source<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        lock(&self.inner).source.get(key).cloned()
    }

    /// Whether the owner's version of `key` is known (without copying it).
    pub fn has_source<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        lock(&self.inner).source.contains_key(key)
    }

    /// Records what the owner says `key` is; returns the previous version.
    pub fn set_source(&self, key: K, value: V) -> Option<V> {
        lock(&self.inner).source.insert(key, value)
    }

    /// Changes the owner's version of `key` in place, if there is one.
    pub fn update_source<Q: Hash + Eq + ?Sized>(&self, key: &Q, f: impl FnOnce(&mut V))
    where
        K: Borrow<Q>,
    {
        if let Some(v) = lock(&self.inner).source.get_mut(key) {
            f(v);
        }
    }

    /// The owner's version of `key` to hold a live copy to; when there is none, `live` is
    /// adopted as the source and `None` returned (nothing to revert).
    pub fn source_or_adopt<Q: Hash + Eq + ToOwned<Owned = K> + ?Sized>(&self, key: &Q, live: &V) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let mut inner = lock(&self.inner);
        if let Some(v) = inner.source.get(key) {
            return Some(v.clone());
        }
        inner.source.insert(key.to_owned(), live.clone());
        None
    }

    /// Every owner's version held.
    pub fn sources(&self) -> Vec<V> {
        lock(&self.inner).source.values().cloned().collect()
    }

    /// Every key with an owner's version.
    pub fn keys(&self) -> Vec<K> {
        lock(&self.inner).source.keys().cloned().collect()
    }

    /// The owner no longer has `key`, and this side is about to delete its copy: the deletion
    /// the watch will show is expected, and nothing is left to restore.
    pub fn owner_deleted(&self, key: K) {
        let mut inner = lock(&self.inner);
        inner.source.remove(&key);
        inner.expected_deletes.insert(key);
    }

    /// This side is about to delete its copy of `key` on the owner's word, keeping the source
    /// until the deletion shows up (or is [`Copies::forget`]ten).
    pub fn expect_delete(&self, key: K) {
        lock(&self.inner).expected_deletes.insert(key);
    }

    /// Whether a deletion of `key` is expected (so a copy being deleted is let go).
    pub fn is_delete_expected<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        lock(&self.inner).expected_deletes.contains(key)
    }

    /// An expected deletion will not happen after all (the copy was already gone, or the owner
    /// recreated it): the next deletion of `key` is a local one again.
    pub fn cancel_delete<Q: Hash + Eq + ?Sized>(&self, key: &Q)
    where
        K: Borrow<Q>,
    {
        lock(&self.inner).expected_deletes.remove(key);
    }

    /// Forgets `key` altogether: no source, no expected deletion (the copy is gone for good).
    pub fn forget<Q: Hash + Eq + ?Sized>(&self, key: &Q)
    where
        K: Borrow<Q>,
    {
        let mut inner = lock(&self.inner);
        inner.source.remove(key);
        inner.expected_deletes.remove(key);
    }

    /// The watch showed `key` deleted: settles an expected deletion (forgetting the source),
    /// or hands back the owner's version to restore.
    pub fn deleted<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Gone<V>
    where
        K: Borrow<Q>,
    {
        let mut inner = lock(&self.inner);
        if inner.expected_deletes.remove(key) {
            inner.source.remove(key);
            return Gone::Expected;
        }
        inner.source.get(key).cloned().map_or(Gone::Unknown, Gone::Restore)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_deletion_is_restored_an_expected_one_is_settled_once() {
        let copies: Copies<String, u32> = Copies::default();
        copies.set_source("a".into(), 1);
        assert_eq!(copies.deleted("a"), Gone::Restore(1), "deleted behind the owner's back");
        copies.expect_delete("a".into());
        assert!(copies.is_delete_expected("a"));
        assert_eq!(copies.deleted("a"), Gone::Expected);
        assert_eq!(copies.source("a"), None, "the source goes with the expected deletion");
        assert_eq!(copies.deleted("a"), Gone::Unknown, "settled once");
    }

    #[test]
    fn an_owner_deletion_leaves_nothing_to_restore_and_a_cancelled_one_is_local_again() {
        let copies: Copies<String, u32> = Copies::default();
        copies.set_source("a".into(), 1);
        copies.owner_deleted("a".into());
        assert_eq!(copies.source("a"), None);
        assert_eq!(copies.deleted("a"), Gone::Expected);

        copies.set_source("b".into(), 2);
        copies.expect_delete("b".into());
        copies.cancel_delete("b");
        assert_eq!(copies.deleted("b"), Gone::Restore(2));
        copies.forget("b");
        assert_eq!(copies.deleted("b"), Gone::Unknown);
    }

    #[test]
    fn a_copy_without_a_source_is_adopted_as_it_is() {
        let copies: Copies<String, u32> = Copies::default();
        assert!(!copies.has_source("a"));
        assert_eq!(copies.source_or_adopt("a", &7), None, "adopted: nothing to revert");
        assert!(copies.has_source("a"), "an adopted copy has a source");
        assert_eq!(copies.source_or_adopt("a", &8), Some(7), "the adopted version is the source now");
        copies.update_source("a", |v| *v = 9);
        assert_eq!(copies.sources(), [9]);
        assert_eq!(copies.keys(), ["a".to_string()]);
    }
}
