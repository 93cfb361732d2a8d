//! core/v1 Namespace, Secret and ConfigMap (`staging/src/k8s.io/api/core/v1/generated.proto`).
//! Secret `data` and ConfigMap `binaryData` bytes become base64 strings, as in JSON.

use std::collections::BTreeMap;

use serde_json::Value;

use super::meta::{Obj, ObjectMeta, Time, top};
use crate::error::ApiResult;

/// `core.v1.NamespaceSpec`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceSpec {
    /// `finalizers`.
    #[prost(string, repeated, tag = "1")]
    pub finalizers: Vec<String>,
}

/// `core.v1.NamespaceCondition`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceCondition {
    /// `type`.
    #[prost(string, optional, tag = "1")]
    pub r#type: Option<String>,
    /// `status`.
    #[prost(string, optional, tag = "2")]
    pub status: Option<String>,
    /// `lastTransitionTime`.
    #[prost(message, optional, tag = "4")]
    pub last_transition_time: Option<Time>,
    /// `reason`.
    #[prost(string, optional, tag = "5")]
    pub reason: Option<String>,
    /// `message`.
    #[prost(string, optional, tag = "6")]
    pub message: Option<String>,
}

/// `core.v1.NamespaceStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceStatus {
    /// `phase`.
    #[prost(string, optional, tag = "1")]
    pub phase: Option<String>,
    /// `conditions`.
    #[prost(message, repeated, tag = "2")]
    pub conditions: Vec<NamespaceCondition>,
}

/// `core.v1.Namespace`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Namespace {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    /// `spec`.
    #[prost(message, optional, tag = "2")]
    pub spec: Option<NamespaceSpec>,
    /// `status`.
    #[prost(message, optional, tag = "3")]
    pub status: Option<NamespaceStatus>,
}

/// `core.v1.Secret`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Secret {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    /// `data` (raw bytes; base64 in JSON).
    #[prost(btree_map = "string, bytes", tag = "2")]
    pub data: BTreeMap<String, Vec<u8>>,
    /// `type`.
    #[prost(string, optional, tag = "3")]
    pub r#type: Option<String>,
    /// `stringData`.
    #[prost(btree_map = "string, string", tag = "4")]
    pub string_data: BTreeMap<String, String>,
    /// `immutable`.
    #[prost(bool, optional, tag = "5")]
    pub immutable: Option<bool>,
}

/// `core.v1.ConfigMap`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfigMap {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    /// `data`.
    #[prost(btree_map = "string, string", tag = "2")]
    pub data: BTreeMap<String, String>,
    /// `binaryData` (raw bytes; base64 in JSON).
    #[prost(btree_map = "string, bytes", tag = "3")]
    pub binary_data: BTreeMap<String, Vec<u8>>,
    /// `immutable`.
    #[prost(bool, optional, tag = "4")]
    pub immutable: Option<bool>,
}

/// Namespace as JSON.
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn namespace_json(ns: &Namespace, api_version: &str, kind: &str) -> ApiResult<Value> {
    let mut o = top(api_version, kind, ns.metadata.as_ref())?;
    o.msg("spec", ns.spec.as_ref(), |s| {
        let mut o = Obj::new();
        o.strs("finalizers", &s.finalizers);
        Ok(o.build())
    })?;
    o.msg("status", ns.status.as_ref(), |s| {
        let mut o = Obj::new();
        o.str("phase", &s.phase).msgs("conditions", &s.conditions, |c| {
            let mut o = Obj::new();
            o.req_str("type", &c.r#type).req_str("status", &c.status);
            o.time("lastTransitionTime", c.last_transition_time.as_ref(), "status.conditions", false)?
                .str("reason", &c.reason)
                .str("message", &c.message);
            Ok(o.build())
        })?;
        Ok(o.build())
    })?;
    Ok(o.build())
}

/// Secret as JSON: `data` values become base64 strings.
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn secret_json(s: &Secret, api_version: &str, kind: &str) -> ApiResult<Value> {
    let mut o = top(api_version, kind, s.metadata.as_ref())?;
    o.ptr_bool("immutable", s.immutable)
        .bytes_map("data", &s.data)
        .str_map("stringData", &s.string_data)
        .str("type", &s.r#type);
    Ok(o.build())
}

/// ConfigMap as JSON: `binaryData` values become base64 strings.
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn config_map_json(c: &ConfigMap, api_version: &str, kind: &str) -> ApiResult<Value> {
    let mut o = top(api_version, kind, c.metadata.as_ref())?;
    o.ptr_bool("immutable", c.immutable).str_map("data", &c.data).bytes_map("binaryData", &c.binary_data);
    Ok(o.build())
}
