//! coordination.k8s.io/v1 Lease (`staging/src/k8s.io/api/coordination/v1/generated.proto`).

use serde_json::Value;

use super::meta::{Obj, ObjectMeta, Time, i, top};
use crate::error::ApiResult;

/// `coordination.v1.LeaseSpec`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseSpec {
    /// `holderIdentity`.
    #[prost(string, optional, tag = "1")]
    pub holder_identity: Option<String>,
    /// `leaseDurationSeconds`.
    #[prost(int32, optional, tag = "2")]
    pub lease_duration_seconds: Option<i32>,
    /// `acquireTime` (a MicroTime).
    #[prost(message, optional, tag = "3")]
    pub acquire_time: Option<Time>,
    /// `renewTime` (a MicroTime).
    #[prost(message, optional, tag = "4")]
    pub renew_time: Option<Time>,
    /// `leaseTransitions`.
    #[prost(int32, optional, tag = "5")]
    pub lease_transitions: Option<i32>,
    /// `strategy`.
    #[prost(string, optional, tag = "6")]
    pub strategy: Option<String>,
    /// `preferredHolder`.
    #[prost(string, optional, tag = "7")]
    pub preferred_holder: Option<String>,
}

/// `coordination.v1.Lease`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Lease {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    /// `spec`.
    #[prost(message, optional, tag = "2")]
    pub spec: Option<LeaseSpec>,
}

/// Lease as JSON.
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn lease_json(l: &Lease, api_version: &str, kind: &str) -> ApiResult<Value> {
    let mut o = top(api_version, kind, l.metadata.as_ref())?;
    o.msg("spec", l.spec.as_ref(), |s| {
        let mut o = Obj::new();
        o.ptr_str("holderIdentity", &s.holder_identity).ptr_int("leaseDurationSeconds", i(s.lease_duration_seconds));
        o.time("acquireTime", s.acquire_time.as_ref(), "spec.acquireTime", true)?
            .time("renewTime", s.renew_time.as_ref(), "spec.renewTime", true)?
            .ptr_int("leaseTransitions", i(s.lease_transitions))
            .ptr_str("strategy", &s.strategy)
            .ptr_str("preferredHolder", &s.preferred_holder);
        Ok(o.build())
    })?;
    Ok(o.build())
}
