//! The last version of each object one side has seen or sent, under one lock.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

use crate::lock;

/// The last version of each object, by key: what a watch last showed, or what was last sent
/// to the peer (so an unchanged object is not sent again).
#[derive(Debug)]
pub struct Known<K, V> {
    map: Mutex<HashMap<K, V>>,
}

impl<K, V> Default for Known<K, V> {
    fn default() -> Self {
        Self { map: Mutex::new(HashMap::new()) }
    }
}

impl<K: Eq + Hash + Clone, V: Clone> Known<K, V> {
    /// Records `value` as the last version of `key`; returns the previous one.
    pub fn insert(&self, key: K, value: V) -> Option<V> {
        lock(&self.map).insert(key, value)
    }

    /// Forgets `key`; returns its last version.
    pub fn remove<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        lock(&self.map).remove(key)
    }

    /// The last version of `key`.
    pub fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        lock(&self.map).get(key).cloned()
    }

    /// Whether `key` is known.
    pub fn contains<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        lock(&self.map).contains_key(key)
    }

    /// Every last version.
    pub fn values(&self) -> Vec<V> {
        lock(&self.map).values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_version_of_each_key() {
        let known: Known<&str, u32> = Known::default();
        assert_eq!(known.insert("a", 1), None);
        assert_eq!(known.insert("a", 2), Some(1));
        known.insert("b", 3);
        assert!(known.contains(&"a"));
        let mut all = known.values();
        all.sort_unstable();
        assert_eq!(all, [2, 3]);
        assert_eq!(known.remove(&"a"), Some(2));
        assert_eq!(known.get(&"a"), None);
        known.remove(&"b");
        assert!(known.values().is_empty());
    }
}
