//! core/v1 Event and ObjectReference (`staging/src/k8s.io/api/core/v1/generated.proto`).

use serde_json::Value;

use super::meta::{Obj, ObjectMeta, Time, i, top};
use crate::error::ApiResult;

/// `core.v1.ObjectReference`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ObjectReference {
    /// `kind`.
    #[prost(string, optional, tag = "1")]
    pub kind: Option<String>,
    /// `namespace`.
    #[prost(string, optional, tag = "2")]
    pub namespace: Option<String>,
    /// `name`.
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    /// `uid`.
    #[prost(string, optional, tag = "4")]
    pub uid: Option<String>,
    /// `apiVersion`.
    #[prost(string, optional, tag = "5")]
    pub api_version: Option<String>,
    /// `resourceVersion`.
    #[prost(string, optional, tag = "6")]
    pub resource_version: Option<String>,
    /// `fieldPath`.
    #[prost(string, optional, tag = "7")]
    pub field_path: Option<String>,
}

/// `core.v1.EventSource`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventSource {
    /// `component`.
    #[prost(string, optional, tag = "1")]
    pub component: Option<String>,
    /// `host`.
    #[prost(string, optional, tag = "2")]
    pub host: Option<String>,
}

/// `core.v1.EventSeries`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventSeries {
    /// `count`.
    #[prost(int32, optional, tag = "1")]
    pub count: Option<i32>,
    /// `lastObservedTime` (a MicroTime).
    #[prost(message, optional, tag = "2")]
    pub last_observed_time: Option<Time>,
}

/// `core.v1.Event`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    /// `involvedObject`.
    #[prost(message, optional, tag = "2")]
    pub involved_object: Option<ObjectReference>,
    /// `reason`.
    #[prost(string, optional, tag = "3")]
    pub reason: Option<String>,
    /// `message`.
    #[prost(string, optional, tag = "4")]
    pub message: Option<String>,
    /// `source`.
    #[prost(message, optional, tag = "5")]
    pub source: Option<EventSource>,
    /// `firstTimestamp`.
    #[prost(message, optional, tag = "6")]
    pub first_timestamp: Option<Time>,
    /// `lastTimestamp`.
    #[prost(message, optional, tag = "7")]
    pub last_timestamp: Option<Time>,
    /// `count`.
    #[prost(int32, optional, tag = "8")]
    pub count: Option<i32>,
    /// `type`.
    #[prost(string, optional, tag = "9")]
    pub r#type: Option<String>,
    /// `eventTime` (a MicroTime).
    #[prost(message, optional, tag = "10")]
    pub event_time: Option<Time>,
    /// `series`.
    #[prost(message, optional, tag = "11")]
    pub series: Option<EventSeries>,
    /// `action`.
    #[prost(string, optional, tag = "12")]
    pub action: Option<String>,
    /// `related`.
    #[prost(message, optional, tag = "13")]
    pub related: Option<ObjectReference>,
    /// `reportingComponent`.
    #[prost(string, optional, tag = "14")]
    pub reporting_component: Option<String>,
    /// `reportingInstance`.
    #[prost(string, optional, tag = "15")]
    pub reporting_instance: Option<String>,
}

fn object_reference(r: &ObjectReference) -> ApiResult<Value> {
    let mut o = Obj::new();
    o.str("kind", &r.kind)
        .str("namespace", &r.namespace)
        .str("name", &r.name)
        .str("uid", &r.uid)
        .str("apiVersion", &r.api_version)
        .str("resourceVersion", &r.resource_version)
        .str("fieldPath", &r.field_path);
    Ok(o.build())
}

/// Event (core/v1) as JSON.
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn event_json(e: &Event, api_version: &str, kind: &str) -> ApiResult<Value> {
    let mut o = top(api_version, kind, e.metadata.as_ref())?;
    o.msg("involvedObject", e.involved_object.as_ref(), object_reference)?
        .str("reason", &e.reason)
        .str("message", &e.message)
        .msg("source", e.source.as_ref(), |s| {
            let mut o = Obj::new();
            o.str("component", &s.component).str("host", &s.host);
            Ok(o.build())
        })?
        .time("firstTimestamp", e.first_timestamp.as_ref(), "firstTimestamp", false)?
        .time("lastTimestamp", e.last_timestamp.as_ref(), "lastTimestamp", false)?
        .int("count", i(e.count))
        .str("type", &e.r#type)
        .time("eventTime", e.event_time.as_ref(), "eventTime", true)?
        .msg("series", e.series.as_ref(), |s| {
            let mut o = Obj::new();
            o.req_int("count", i(s.count));
            o.time("lastObservedTime", s.last_observed_time.as_ref(), "series.lastObservedTime", true)?;
            Ok(o.build())
        })?
        .str("action", &e.action)
        .msg("related", e.related.as_ref(), object_reference)?
        .str("reportingComponent", &e.reporting_component)
        .str("reportingInstance", &e.reporting_instance);
    Ok(o.build())
}
