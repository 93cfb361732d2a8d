//! Argo CD and Kubernetes object types as serde types that keep what they do not model.
//!
//! Each type names the fields principal and agent read or rewrite and collects every other
//! field in a flattened `extra` map, so decoding and re-encoding an object written by a user
//! (or by a newer Argo CD) loses nothing. Free-form parts (`source`, `syncPolicy`, `status`
//! details) are kept as [`serde_json::Value`].

pub mod annotations;
pub mod application;
pub mod appproject;
pub mod cluster_info;
pub mod core;
pub mod meta;

pub use application::{Application, ApplicationDestination, ApplicationSpec, ApplicationStatus, OperationState};
pub use appproject::{AppProject, AppProjectSpec};
pub use core::{ConfigMap, Secret};
pub use meta::ObjectMeta;

/// Fields a type does not model, in their original order.
pub type Extra = serde_json::Map<String, serde_json::Value>;

/// `apiVersion` of Argo CD's CRDs.
pub const ARGOPROJ_API_VERSION: &str = "argoproj.io/v1alpha1";
/// `kind` of an Application.
pub const KIND_APPLICATION: &str = "Application";
/// `kind` of an AppProject.
pub const KIND_APP_PROJECT: &str = "AppProject";
/// `kind` of a Secret.
pub const KIND_SECRET: &str = "Secret";
/// `kind` of a ConfigMap.
pub const KIND_CONFIG_MAP: &str = "ConfigMap";
