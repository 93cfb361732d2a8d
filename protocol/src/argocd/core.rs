//! The two core Kubernetes kinds argocd-agent ships: repository `Secret`s and the GPG key
//! `ConfigMap`. Data values stay base64 text as the API serves them, so checksums are computed
//! over exactly what the peer sees.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Extra, ObjectMeta};

/// A `v1/Secret` (repository and repo-creds secrets travel as these, credentials included).
///
/// Its `Debug` form names the data keys but never their values, so a logged secret leaks no
/// credential.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Secret {
    /// `apiVersion`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `kind`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `metadata`
    #[serde(default, skip_serializing_if = "ObjectMeta::is_empty")]
    pub metadata: ObjectMeta,
    /// `type`
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// `data`: base64 values, as served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<BTreeMap<String, String>>,
    /// `stringData`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string_data: Option<BTreeMap<String, String>>,
    /// Every other field (`immutable`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = |m: &Option<BTreeMap<String, String>>| m.as_ref().map(|m| m.keys().cloned().collect::<Vec<_>>());
        f.debug_struct("Secret")
            .field("metadata", &self.metadata)
            .field("type", &self.type_)
            .field("data (keys only)", &keys(&self.data))
            .field("stringData (keys only)", &keys(&self.string_data))
            .finish_non_exhaustive()
    }
}

/// The values of `argocd.argoproj.io/secret-type` that make a Secret a repository secret.
pub const REPOSITORY_SECRET_TYPES: [&str; 2] = ["repository", "repo-creds"];

/// The name of Argo CD's GPG keys ConfigMap, the only GPG object argocd-agent ships.
pub const GPG_KEYS_CONFIG_MAP: &str = "argocd-gpg-keys-cm";

/// The label selector that lists repository and repo-creds secrets (for a watch).
#[must_use]
pub fn repository_selector() -> String {
    format!("{} in ({})", super::annotations::SECRET_TYPE_LABEL, REPOSITORY_SECRET_TYPES.join(","))
}

/// The field selector that lists the GPG keys ConfigMap alone (for a watch).
#[must_use]
pub fn gpg_keys_selector() -> String {
    format!("metadata.name={GPG_KEYS_CONFIG_MAP}")
}

impl Secret {
    /// Whether it is labelled as a repository or repo-creds secret.
    #[must_use]
    pub fn is_repository(&self) -> bool {
        self.metadata.label(super::annotations::SECRET_TYPE_LABEL).is_some_and(|t| REPOSITORY_SECRET_TYPES.contains(&t))
    }

    /// The decoded value of one `data` key (`stringData` wins, as the API server merges it);
    /// `None` if absent or not base64 of UTF-8.
    #[must_use]
    pub fn data_str(&self, key: &str) -> Option<String> {
        use base64::Engine as _;
        if let Some(v) = self.string_data.as_ref().and_then(|m| m.get(key)) {
            return Some(v.clone());
        }
        let raw = self.data.as_ref()?.get(key)?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(raw).ok()?;
        String::from_utf8(bytes).ok()
    }

    /// The AppProject a repository secret is scoped to (`data.project`), if set and non-empty.
    #[must_use]
    pub fn project(&self) -> Option<String> {
        self.data_str("project").filter(|p| !p.is_empty())
    }
}

/// A `v1/ConfigMap` (the GPG keys ConfigMap `argocd-gpg-keys-cm`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMap {
    /// `apiVersion`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `kind`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `metadata`
    #[serde(default, skip_serializing_if = "ObjectMeta::is_empty")]
    pub metadata: ObjectMeta,
    /// `data`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<BTreeMap<String, String>>,
    /// `binaryData`: base64 values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary_data: Option<BTreeMap<String, String>>,
    /// Every other field.
    #[serde(flatten)]
    pub extra: Extra,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(json: serde_json::Value) -> Secret {
        serde_json::from_value(json).expect("a Secret")
    }

    #[test]
    fn a_repository_secret_names_its_project_and_debug_hides_credentials() {
        // As the API server serves an Argo CD repository secret (data base64).
        let s = repo(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "private-repo", "namespace": "argocd",
                         "labels": {"argocd.argoproj.io/secret-type": "repository"}},
            "data": {"url": "aHR0cHM6Ly9leGFtcGxlLmNvbS9yZXBvLmdpdA==", "project": "dGVhbQ==",
                     "password": "czNjcjN0"},
            "type": "Opaque"}));
        assert!(s.is_repository());
        assert_eq!(s.project().as_deref(), Some("team"));
        assert_eq!(s.data_str("url").as_deref(), Some("https://example.com/repo.git"));
        let shown = format!("{s:?}");
        assert!(shown.contains("password") && !shown.contains("czNjcjN0") && !shown.contains("s3cr3t"), "{shown}");
        let creds = repo(serde_json::json!({"metadata": {"labels": {"argocd.argoproj.io/secret-type": "repo-creds"}},
                                            "stringData": {"project": "p"}}));
        assert!(creds.is_repository());
        assert_eq!(creds.project().as_deref(), Some("p"));
        let other = repo(serde_json::json!({"metadata": {"labels": {"argocd.argoproj.io/secret-type": "cluster"}},
                                            "data": {"project": ""}}));
        assert!(!other.is_repository());
        assert_eq!(other.project(), None, "an empty project scopes to nothing");
        assert_eq!(repo(serde_json::json!({"data": {"project": "not base64!"}})).project(), None);
    }
}
