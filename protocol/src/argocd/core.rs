//! The two core Kubernetes kinds argocd-agent ships: repository `Secret`s and the GPG key
//! `ConfigMap`. Data values stay base64 text as the API serves them, so checksums are computed
//! over exactly what the peer sees.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Extra, ObjectMeta};

/// A `v1/Secret` (repository and repo-creds secrets travel as these, credentials included).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
