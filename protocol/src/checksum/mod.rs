//! Upstream's resync checksums (upstream's `internal/resync`; verified by the Go peer, docs/compatibility.md), byte-compatible with
//! `internal/resources/resources.go` and `internal/resync/resync.go`.
//!
//! * **Resource-set checksum** ([`resource_set_checksum`]): SHA-256 over the concatenation,
//!   without separator, of the sorted strings `<Kind>/<Name>/<UID>`, one per tracked
//!   resource, where UID is the `source-uid` annotation when present and the object's UID
//!   otherwise. Upstream tracks resources in a set keyed by kind, name, namespace *and* UID
//!   but leaves the namespace out of the string, so two resources differing only in
//!   namespace contribute the same string twice. An empty set has no checksum (`nil`).
//! * **Spec checksum** ([`spec_checksum`]): SHA-256 of Go's `json.Marshal` of the object's
//!   `spec` with the key `destination` removed; for a Secret of its `data` (required), for a
//!   ConfigMap of its `data` (`{}` when missing). Upstream deletes `destination` from whichever
//!   map it hashes, so a Secret data key named `destination` is left out too; we do the same.

pub mod go_json;

use std::collections::BTreeSet;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::argocd::{KIND_CONFIG_MAP, KIND_SECRET, ObjectMeta};

/// A SHA-256 digest.
pub type Checksum = [u8; 32];

/// Resource kind `Application` in resync messages and checksums.
pub const RESYNC_KIND_APPLICATION: &str = "Application";
/// Resource kind `AppProject`.
pub const RESYNC_KIND_APP_PROJECT: &str = "AppProject";
/// Resource kind `Repository` (a repository secret).
pub const RESYNC_KIND_REPOSITORY: &str = "Repository";
/// Resource kind `GPGKey` (the GPG keys ConfigMap).
pub const RESYNC_KIND_GPG_KEY: &str = "GPGKey";

/// A spec checksum could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChecksumError {
    /// The field to hash is absent.
    #[error("{kind} {name:?} has no `{field}` field to checksum")]
    MissingField {
        /// `kind` of the object.
        kind: String,
        /// `metadata.name` of the object.
        name: String,
        /// The field looked for.
        field: &'static str,
    },
    /// The field to hash is not a JSON object.
    #[error("`{field}` of {kind} {name:?} is not an object")]
    NotAnObject {
        /// `kind` of the object.
        kind: String,
        /// `metadata.name` of the object.
        name: String,
        /// The field.
        field: &'static str,
    },
}

/// One tracked resource, as upstream's `resources.ResourceKey`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey {
    /// `Application`, `AppProject`, `Repository` or `GPGKey`.
    pub kind: String,
    /// `metadata.name`
    pub name: String,
    /// `metadata.namespace` (not part of the checksum string).
    pub namespace: String,
    /// The source UID: the `source-uid` annotation if present, else `metadata.uid`.
    pub uid: String,
}

impl ResourceKey {
    /// The key of an object: the source-uid annotation wins over the object's own UID (even
    /// when empty, as upstream checks presence only).
    #[must_use]
    pub fn from_meta(kind: &str, meta: &ObjectMeta) -> Self {
        let uid = meta.source_uid().or(meta.uid.as_deref()).unwrap_or_default();
        Self {
            kind: kind.to_owned(),
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            uid: uid.to_owned(),
        }
    }

    /// The string this key contributes to the resource-set checksum: `<Kind>/<Name>/<UID>`.
    #[must_use]
    pub fn checksum_string(&self) -> String {
        format!("{}/{}/{}", self.kind, self.name, self.uid)
    }
}

/// The resource-set checksum of a set of tracked resources; `None` when there are none.
/// Duplicate keys count once (upstream keeps a set).
#[must_use]
pub fn resource_set_checksum<'a>(keys: impl IntoIterator<Item = &'a ResourceKey>) -> Option<Checksum> {
    let unique: BTreeSet<&ResourceKey> = keys.into_iter().collect();
    if unique.is_empty() {
        return None;
    }
    let mut strings: Vec<String> = unique.into_iter().map(ResourceKey::checksum_string).collect();
    strings.sort_unstable();
    let mut hasher = Sha256::new();
    for s in &strings {
        hasher.update(s.as_bytes());
    }
    Some(hasher.finalize().into())
}

/// Ours, for the periodic resync: one SHA-256 over every tracked resource **with** its spec
/// checksum, so two sides that hold the same resources with the same specs agree in one
/// message, whatever the number of resources. The lines `<Kind>/<Name>/<UID>/<hex spec checksum>`
/// (empty after the last `/` without a spec) are sorted and hashed with a newline after each;
/// duplicates count once. `None` when there are no resources, as [`resource_set_checksum`].
#[must_use]
pub fn spec_digest<'a>(entries: impl IntoIterator<Item = (&'a ResourceKey, Option<&'a [u8]>)>) -> Option<Checksum> {
    let lines: BTreeSet<String> = entries
        .into_iter()
        .map(|(key, spec)| {
            let hex: String = spec.unwrap_or_default().iter().map(|b| format!("{b:02x}")).collect();
            format!("{}/{hex}", key.checksum_string())
        })
        .collect();
    if lines.is_empty() {
        return None;
    }
    let mut hasher = Sha256::new();
    for line in &lines {
        hasher.update(line.as_bytes());
        hasher.update(b"\n");
    }
    Some(hasher.finalize().into())
}

/// The spec checksum of an object given as JSON (as read from the API server).
///
/// # Errors
///
/// [`ChecksumError::MissingField`] when a non-ConfigMap object lacks `spec` (`data` for a
/// Secret), [`ChecksumError::NotAnObject`] when that field is not an object.
pub fn spec_checksum(object: &Value) -> Result<Checksum, ChecksumError> {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
    let name = || object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let field = if kind == KIND_SECRET || kind == KIND_CONFIG_MAP { "data" } else { "spec" };
    let empty = Value::Object(serde_json::Map::new());
    let hashed = match object.get(field) {
        Some(v) => v,
        None if kind == KIND_CONFIG_MAP => &empty,
        None => {
            return Err(ChecksumError::MissingField { kind: kind.to_owned(), name: name(), field });
        }
    };
    let Value::Object(map) = hashed else {
        return Err(ChecksumError::NotAnObject { kind: kind.to_owned(), name: name(), field });
    };
    let mut map = map.clone();
    map.remove("destination");
    Ok(Sha256::digest(go_json::marshal(&Value::Object(map))).into())
}

/// The spec checksum of a repository secret: of its `data`, as [`spec_checksum`] computes it for
/// a `Secret` (whether or not the decoded object carries its `kind`, as Go's typed clients leave
/// it out); `None` without data, as upstream's error there.
#[must_use]
pub fn secret_checksum(secret: &crate::argocd::Secret) -> Option<Checksum> {
    let value = serde_json::json!({"kind": KIND_SECRET, "data": secret.data.as_ref()?});
    spec_checksum(&value).ok()
}

/// The spec checksum of the GPG keys ConfigMap: of its `data` (`{}` when missing), as
/// [`spec_checksum`] computes it for a `ConfigMap`.
#[must_use]
pub fn config_map_checksum(config_map: &crate::argocd::ConfigMap) -> Option<Checksum> {
    let value = serde_json::json!({"kind": KIND_CONFIG_MAP, "data": config_map.data.clone().unwrap_or_default()});
    spec_checksum(&value).ok()
}

/// Lower-case hex of a checksum, for logs.
#[must_use]
pub fn to_hex(checksum: &[u8]) -> String {
    hex::encode(checksum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: &str, name: &str, uid: &str) -> ResourceKey {
        ResourceKey { kind: kind.into(), name: name.into(), namespace: "ns".into(), uid: uid.into() }
    }

    #[test]
    fn spec_digest_changes_with_any_spec_and_not_with_order() {
        let (a, b) = (key("Application", "a", "1"), key("AppProject", "p", "2"));
        let (s1, s2) = ([1_u8; 32], [2_u8; 32]);
        let one = spec_digest([(&a, Some(&s1[..])), (&b, Some(&s2[..]))]);
        let same = spec_digest([(&b, Some(&s2[..])), (&a, Some(&s1[..])), (&a, Some(&s1[..]))]);
        assert!(one.is_some());
        assert_eq!(one, same, "order and duplicates do not matter");
        assert_ne!(one, spec_digest([(&a, Some(&s2[..])), (&b, Some(&s2[..]))]), "a spec differs");
        assert_ne!(one, spec_digest([(&a, Some(&s1[..]))]), "a resource is missing");
        assert_ne!(one, spec_digest([(&a, Some(&s1[..])), (&b, None)]), "a spec is missing");
        assert_ne!(
            spec_digest([(&a, Some(&s1[..]))]),
            resource_set_checksum([&a]),
            "never mistaken for upstream's resource-set checksum"
        );
        assert_eq!(spec_digest(std::iter::empty()), None);
    }
}
