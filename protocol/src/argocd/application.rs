//! Argo CD `Application` (`argoproj.io/v1alpha1`).

use serde::{Deserialize, Serialize};

use super::{Extra, ObjectMeta};

/// An Argo CD Application. `operation` and the free-form parts of `spec` and `status` are
/// kept as JSON; unknown top-level fields land in [`extra`](Self::extra).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Application {
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
    #[serde(default, skip_serializing_if = "ApplicationSpec::is_empty")]
    pub spec: ApplicationSpec,
    /// `operation`: a requested sync; its appearance triggers `set-operation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<serde_json::Value>,
    /// `status`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ApplicationStatus>,
    /// Every other field.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The destination name of the cluster Argo CD itself runs in.
pub const IN_CLUSTER_NAME: &str = "in-cluster";

impl Application {
    /// The agent this Application targets under destination-based mapping:
    /// `spec.destination.name`, unless empty or [`IN_CLUSTER_NAME`] (upstream routes those to
    /// no agent).
    #[must_use]
    pub fn destination_agent(&self) -> Option<&str> {
        let name = self.spec.destination.as_ref()?.name.as_deref()?;
        (!name.is_empty() && name != IN_CLUSTER_NAME).then_some(name)
    }

    /// `status.operationState.phase`, if any.
    #[must_use]
    pub fn operation_phase(&self) -> Option<&str> {
        self.status.as_ref()?.operation_state.as_ref()?.phase.as_deref()
    }

    /// Whether the running operation is being terminated (`phase == "Terminating"`).
    #[must_use]
    pub fn is_terminating(&self) -> bool {
        self.operation_phase() == Some(OperationState::PHASE_TERMINATING)
    }

    /// Whether `metadata.deletionTimestamp` is set.
    #[must_use]
    pub fn is_being_deleted(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
}

/// `spec` of an Application.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationSpec {
    /// `project`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// `destination`: rewritten by the agent, and the agent name under destination mapping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<ApplicationDestination>,
    /// `source`, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<serde_json::Value>,
    /// `sources`, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<Vec<serde_json::Value>>,
    /// `syncPolicy`, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_policy: Option<serde_json::Value>,
    /// Every other field (`ignoreDifferences`, `info`, `revisionHistoryLimit`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

impl ApplicationSpec {
    /// Whether nothing is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// `spec.destination` of an Application, and an entry of an AppProject's `destinations`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationDestination {
    /// `server`: the API server URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// `namespace`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `name`: the cluster name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Every other field.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `status` of an Application. Only `operationState` is typed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationStatus {
    /// `operationState`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_state: Option<OperationState>,
    /// Every other field (`sync`, `health`, `resources`, `history`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `status.operationState` of an Application.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationState {
    /// `phase`: `Running`, `Terminating`, `Succeeded`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `message`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Every other field.
    #[serde(flatten)]
    pub extra: Extra,
}

impl OperationState {
    /// The phase that triggers `terminate-operation`.
    pub const PHASE_TERMINATING: &'static str = "Terminating";
}
