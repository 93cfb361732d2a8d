//! Resource-proxy requests and responses (target `resource`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A Kubernetes API request forwarded from the principal's resource proxy to an agent. The
/// event type is the HTTP method.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ResourceRequest {
    /// The request's UUID; the response's `eventid` and `uuid` repeat it.
    pub uuid: String,
    /// Namespace of the resource; empty for cluster-scoped requests.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Name of the resource; empty for lists.
    pub name: String,
    /// Subresource (`status`, `scale`, `log`, ...).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
    /// HTTP method.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub method: String,
    /// Body of write requests (base64 in JSON).
    #[serde(with = "super::go_bytes::vec", skip_serializing_if = "Vec::is_empty")]
    pub body: Vec<u8>,
    /// Query parameters, first value of each key.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
    /// API group (empty for core).
    pub group: String,
    /// API version.
    pub version: String,
    /// Resource (plural), empty for discovery requests.
    pub resource: String,
}

impl ResourceRequest {
    /// A list request: neither resource nor name.
    #[must_use]
    pub fn is_list(&self) -> bool {
        self.resource.is_empty() && self.name.is_empty()
    }

    /// A request for one named resource.
    #[must_use]
    pub fn is_resource(&self) -> bool {
        !self.resource.is_empty() && !self.name.is_empty()
    }

    /// Upstream's validity rule: a single resource or a list.
    #[must_use]
    pub fn is_valid(&self) -> bool {
        self.is_resource() || self.is_list()
    }
}

/// The agent's answer to a [`ResourceRequest`] (type `.response`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ResourceResponse {
    /// The request's UUID.
    pub uuid: String,
    /// HTTP status code.
    pub status: i64,
    /// JSON text of the object or list.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource: String,
}
