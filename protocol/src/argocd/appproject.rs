//! Argo CD `AppProject` (`argoproj.io/v1alpha1`).

use serde::{Deserialize, Serialize};

use super::{ApplicationDestination, Extra, ObjectMeta};

/// An Argo CD AppProject; unknown top-level fields land in [`extra`](Self::extra).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppProject {
    /// `apiVersion`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `kind`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `metadata`
    #[serde(default, skip_serializing_if = "ObjectMeta::is_empty")]
    pub metadata: ObjectMeta,
    /// `spec`
    #[serde(default, skip_serializing_if = "AppProjectSpec::is_empty")]
    pub spec: AppProjectSpec,
    /// `status`, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
    /// Every other field.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec` of an AppProject: the fields the agent-specific copy rewrites are typed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppProjectSpec {
    /// `sourceRepos`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_repos: Option<Vec<String>>,
    /// `destinations`: matched against agent names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destinations: Option<Vec<ApplicationDestination>>,
    /// `sourceNamespaces`: matched against agent names under namespace mapping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_namespaces: Option<Vec<String>>,
    /// `roles`, kept as written (dropped from managed agent copies, rewritten in autonomous).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<Vec<serde_json::Value>>,
    /// Every other field (`description`, `clusterResourceWhitelist`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

impl AppProjectSpec {
    /// Whether nothing is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}
