//! Kubernetes `ObjectMeta`, with the fields argocd-agent uses typed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Extra;
use super::annotations::SOURCE_UID;

/// `metadata` of a Kubernetes object. Fields not listed here (`managedFields`,
/// `generateName`, ...) are kept in [`extra`](Self::extra).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// `name`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `namespace`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `uid`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// `resourceVersion`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// `generation`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// `creationTimestamp`, as written (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
    /// `deletionTimestamp`, as written (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<String>,
    /// `labels`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// `annotations`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// `finalizers`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalizers: Option<Vec<String>>,
    /// `ownerReferences`, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_references: Option<Vec<serde_json::Value>>,
    /// Every other field.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ObjectMeta {
    /// When the principal last wrote the object: upstream's
    /// [`LAST_UPDATED`](super::annotations::LAST_UPDATED), else the
    /// [`LEGACY_LAST_UPDATED`](super::annotations::LEGACY_LAST_UPDATED) an earlier version of
    /// ours stamped.
    #[must_use]
    pub fn last_updated(&self) -> Option<&str> {
        self.annotation(super::annotations::LAST_UPDATED)
            .or_else(|| self.annotation(super::annotations::LEGACY_LAST_UPDATED))
    }

    /// Stamps the object as written at `now` (RFC 3339) under upstream's key, and removes the
    /// key of earlier versions of ours.
    pub fn stamp_last_updated(&mut self, now: &str) {
        self.remove_annotation(super::annotations::LEGACY_LAST_UPDATED);
        self.set_annotation(super::annotations::LAST_UPDATED, now);
    }

    /// The value of annotation `key`.
    #[must_use]
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }

    /// Sets annotation `key` to `value`.
    pub fn set_annotation(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.annotations.get_or_insert_with(BTreeMap::new).insert(key.into(), value.into());
    }

    /// Removes annotation `key`, returning its value.
    pub fn remove_annotation(&mut self, key: &str) -> Option<String> {
        self.annotations.as_mut()?.remove(key)
    }

    /// The value of label `key`.
    #[must_use]
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }

    /// Whether the labels satisfy `selector`.
    #[must_use]
    pub fn selected_by(&self, selector: &crate::selector::LabelSelector) -> bool {
        let labels: serde_json::Map<String, serde_json::Value> =
            self.labels.iter().flatten().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
        selector.matches(self.labels.as_ref().map(|_| &labels))
    }

    /// Whether the object is left out of synchronisation (upstream §4.10): labelled
    /// `argocd-agent.argoproj-labs.io/ignore-sync=true`, or not matching `selector` (a side's
    /// `--label-selector`).
    #[must_use]
    pub fn left_out(&self, selector: Option<&crate::selector::LabelSelector>) -> bool {
        self.label(super::annotations::IGNORE_SYNC) == Some("true") || selector.is_some_and(|s| !self.selected_by(s))
    }

    /// The `argocd.argoproj.io/source-uid` annotation, present even if empty.
    #[must_use]
    pub fn source_uid(&self) -> Option<&str> {
        self.annotation(SOURCE_UID)
    }

    /// The event `resourceid` of this object: `<name>_<uid>`.
    #[must_use]
    pub fn resource_id(&self) -> String {
        format!("{}_{}", self.name.as_deref().unwrap_or_default(), self.uid.as_deref().unwrap_or_default())
    }

    /// The event `eventid` of this version of the object: `<name>_<uid>_<resourceVersion>`.
    #[must_use]
    pub fn event_id(&self) -> String {
        format!("{}_{}", self.resource_id(), self.resource_version.as_deref().unwrap_or_default())
    }

    /// Whether nothing at all is set (an absent `metadata` decodes to this).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::ObjectMeta;
    use crate::selector::LabelSelector;

    #[test]
    fn left_out_by_ignore_sync_or_by_the_selector() {
        let meta = |labels: serde_json::Value| -> ObjectMeta {
            serde_json::from_value(serde_json::json!({"labels": labels})).expect("metadata")
        };
        let team_a = LabelSelector::parse("team=a").expect("selector");
        assert!(!meta(serde_json::json!({"team": "a"})).left_out(Some(&team_a)));
        assert!(meta(serde_json::json!({"team": "b"})).left_out(Some(&team_a)));
        assert!(!meta(serde_json::json!({})).left_out(None));
        let ignored = meta(serde_json::json!({"team": "a", "argocd-agent.argoproj-labs.io/ignore-sync": "true"}));
        assert!(ignored.left_out(Some(&team_a)) && ignored.left_out(None));
        let no_labels = ObjectMeta::default();
        assert!(no_labels.left_out(Some(&team_a)) && !no_labels.left_out(None));
    }
}
