//! Small status payloads: the agent's error report and cluster cache statistics.

use serde::{Deserialize, Serialize};

/// `.error` (target `application`): the agent could not apply an Application; the principal
/// marks it Degraded with condition `AgentError`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ErrorData {
    /// The Application's name.
    pub resource_name: String,
    /// The Application's namespace.
    pub resource_namespace: String,
    /// What went wrong.
    pub message: String,
}

/// `.cluster-cache-info-update`: cluster cache statistics (agent to principal), from the
/// agent's Argo CD cluster info. The principal writes them into the hub's Argo CD cache
/// ([`crate::argocd::cluster_info`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClusterCacheInfo {
    /// Applications on the agent.
    pub applications_count: i64,
    /// API resources in the cache.
    pub apis_count: i64,
    /// Resources in the cache.
    pub resources_count: i64,
    /// Our extension: when the agent's Argo CD last synchronised its cluster cache (RFC 3339).
    /// Upstream agents do not send it; upstream principals ignore it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_cache_sync_time: Option<String>,
    /// Our extension: the Kubernetes version of the agent's cluster, as its Argo CD reports it.
    /// Upstream agents do not send it; upstream principals ignore it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
}
