//! meta/v1 DeleteOptions (`staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`).
//!
//! client-go's typed clients for built-in kinds (v0.35 and later: `gentype.PrefersProtobuf`)
//! send the body of every `Delete` and `DeleteCollection` as protobuf, even an empty
//! `DeleteOptions{}`. The envelope names the client's group version (`v1`,
//! `coordination.k8s.io/v1`, `apiextensions.k8s.io/v1`, ...) with kind `DeleteOptions`:
//! kube-apiserver registers DeleteOptions as unversioned, so any apiVersion is accepted, and an
//! envelope that names no kind is taken as `meta.k8s.io/v1` DeleteOptions.

use prost::Message as _;
use serde_json::{Map, Value, json};

use super::{CONTENT_TYPE, MAGIC, Unknown};
use crate::error::{ApiError, ApiResult};

/// `metav1.Preconditions`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Preconditions {
    /// `uid`.
    #[prost(string, optional, tag = "1")]
    pub uid: Option<String>,
    /// `resourceVersion`.
    #[prost(string, optional, tag = "2")]
    pub resource_version: Option<String>,
}

/// `metav1.DeleteOptions`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteOptions {
    /// `gracePeriodSeconds`.
    #[prost(int64, optional, tag = "1")]
    pub grace_period_seconds: Option<i64>,
    /// `preconditions`.
    #[prost(message, optional, tag = "2")]
    pub preconditions: Option<Preconditions>,
    /// `orphanDependents` (deprecated).
    #[prost(bool, optional, tag = "3")]
    pub orphan_dependents: Option<bool>,
    /// `propagationPolicy`.
    #[prost(string, optional, tag = "4")]
    pub propagation_policy: Option<String>,
    /// `dryRun`.
    #[prost(string, repeated, tag = "5")]
    pub dry_run: Vec<String>,
    /// `ignoreStoreReadErrorWithClusterBreakingPotential`.
    #[prost(bool, optional, tag = "6")]
    pub ignore_store_read_error_with_cluster_breaking_potential: Option<bool>,
}

/// The kind an envelope must name (or leave empty).
pub const KIND: &str = "DeleteOptions";

/// Decode a protobuf DeleteOptions body into the JSON DeleteOptions the JSON path reads.
///
/// # Errors
/// 400 for a body without the `k8s\0` magic, an envelope or message that does not decode, an
/// envelope naming another kind, or an encoded payload (what kube-apiserver answers to each).
pub fn delete_options_json(body: &[u8]) -> ApiResult<Value> {
    let Some(rest) = body.strip_prefix(MAGIC.as_slice()) else {
        return Err(ApiError::bad_request(format!(
            "the DeleteOptions body is not Kubernetes protobuf: it must start with the 4 bytes \"k8s\\0\" \
             (Content-Type {CONTENT_TYPE})"
        )));
    };
    if rest.is_empty() {
        return Err(ApiError::bad_request("the protobuf DeleteOptions body is empty after the \"k8s\\0\" magic"));
    }
    let envelope = Unknown::decode(rest).map_err(|e| {
        ApiError::bad_request(format!("the protobuf DeleteOptions body is not a valid runtime.Unknown envelope: {e}"))
    })?;
    let type_meta = envelope.type_meta.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    if !kind.is_empty() && kind != KIND {
        return Err(ApiError::bad_request(format!(
            "the request body is a {} {kind:?}, not DeleteOptions: a DELETE's body must be DeleteOptions",
            type_meta.api_version.unwrap_or_default()
        )));
    }
    if envelope.content_encoding.as_deref().is_some_and(|e| !e.is_empty())
        || envelope.content_type.as_deref().is_some_and(|c| !c.is_empty() && c != CONTENT_TYPE)
    {
        return Err(ApiError::bad_request(
            "the protobuf DeleteOptions envelope names a content encoding or type: send it unencoded",
        ));
    }
    let o = DeleteOptions::decode(envelope.raw.unwrap_or_default().as_slice())
        .map_err(|e| ApiError::bad_request(format!("the protobuf body is not a valid DeleteOptions message: {e}")))?;
    let mut m = Map::new();
    if let Some(g) = o.grace_period_seconds {
        m.insert("gracePeriodSeconds".into(), json!(g));
    }
    if let Some(p) = &o.preconditions {
        let mut pm = Map::new();
        if let Some(u) = &p.uid {
            pm.insert("uid".into(), json!(u));
        }
        if let Some(rv) = &p.resource_version {
            pm.insert("resourceVersion".into(), json!(rv));
        }
        m.insert("preconditions".into(), Value::Object(pm));
    }
    if let Some(b) = o.orphan_dependents {
        m.insert("orphanDependents".into(), json!(b));
    }
    if let Some(p) = &o.propagation_policy {
        m.insert("propagationPolicy".into(), json!(p));
    }
    if !o.dry_run.is_empty() {
        m.insert("dryRun".into(), json!(o.dry_run));
    }
    if let Some(b) = o.ignore_store_read_error_with_cluster_breaking_potential {
        m.insert("ignoreStoreReadErrorWithClusterBreakingPotential".into(), json!(b));
    }
    Ok(Value::Object(m))
}
