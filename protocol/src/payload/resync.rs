//! The resync protocol's payloads (target `resourceResync`, §4.13).

use serde::{Deserialize, Serialize};

use crate::checksum::ResourceKey;

/// `.request-synced-resource-list`: the resource-set checksum of the non-source-of-truth side.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequestSyncedResourceList {
    /// SHA-256 resource-set checksum; `None` (JSON `null`) when the side tracks nothing.
    #[serde(with = "crate::payload::go_bytes::option")]
    pub checksum: Option<Vec<u8>>,
    /// Ours, for the periodic resync: [`DIGEST_SPEC`] when `checksum` is the
    /// [`crate::checksum::spec_digest`] of the sender's resources (their spec checksums
    /// included), not upstream's resource-set checksum. Upstream ignores the field (its checksum
    /// then never matches, and it lists its resources: correct, only not cheap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// [`RequestSyncedResourceList::digest`] of a periodic resync.
pub const DIGEST_SPEC: &str = "spec";

impl RequestSyncedResourceList {
    /// Upstream's form: the resource-set checksum.
    #[must_use]
    pub fn of_set(checksum: Option<Vec<u8>>) -> Self {
        Self { checksum, digest: None }
    }

    /// Whether this carries a spec digest ([`DIGEST_SPEC`]) rather than a resource-set checksum.
    #[must_use]
    pub fn is_spec_digest(&self) -> bool {
        self.digest.as_deref() == Some(DIGEST_SPEC)
    }
}

/// `.response-synced-resource`: one resource the source of truth tracks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SyncedResource {
    /// Name.
    pub name: String,
    /// Namespace.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Source UID.
    pub uid: String,
    /// Kind (`Application`, `AppProject`, `Repository`, `GPGKey`).
    pub kind: String,
}

impl From<&ResourceKey> for SyncedResource {
    fn from(key: &ResourceKey) -> Self {
        Self { name: key.name.clone(), namespace: key.namespace.clone(), uid: key.uid.clone(), kind: key.kind.clone() }
    }
}

/// `.request-update`: asks the source of truth for a resource whose spec may differ.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequestUpdate {
    /// Name.
    pub name: String,
    /// Namespace.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Source UID (empty when the resource is missing locally).
    pub uid: String,
    /// Kind.
    pub kind: String,
    /// SHA-256 spec checksum; `None` (JSON `null`) when the resource is missing locally.
    #[serde(with = "crate::payload::go_bytes::option")]
    pub checksum: Option<Vec<u8>>,
}

/// `.request-resource-resync`: no fields (`{}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestResourceResync {}
