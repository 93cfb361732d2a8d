//! `k8s.io/apimachinery/pkg/apis/meta/v1` messages (ObjectMeta, Time, Condition) and the JSON
//! builder the kind converters share.
//!
//! Field numbers are those of `staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`.
//! Every scalar is proto2 `optional`, so prost keeps presence (`Option`): the converters use it to
//! tell a Go pointer that was set to its zero value from one that was left nil.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};

/// `meta.v1.Time` and `meta.v1.MicroTime` (the same wire shape).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Time {
    /// Seconds since the Unix epoch.
    #[prost(int64, optional, tag = "1")]
    pub seconds: Option<i64>,
    /// Nanoseconds within the second.
    #[prost(int32, optional, tag = "2")]
    pub nanos: Option<i32>,
}

/// `meta.v1.OwnerReference`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OwnerReference {
    /// `kind`.
    #[prost(string, optional, tag = "1")]
    pub kind: Option<String>,
    /// `name`.
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    /// `uid`.
    #[prost(string, optional, tag = "4")]
    pub uid: Option<String>,
    /// `apiVersion`.
    #[prost(string, optional, tag = "5")]
    pub api_version: Option<String>,
    /// `controller`.
    #[prost(bool, optional, tag = "6")]
    pub controller: Option<bool>,
    /// `blockOwnerDeletion`.
    #[prost(bool, optional, tag = "7")]
    pub block_owner_deletion: Option<bool>,
}

/// `meta.v1.ObjectMeta`. `managedFields` (17) is not decoded: the server drops it on every write.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ObjectMeta {
    /// `name`.
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// `generateName`.
    #[prost(string, optional, tag = "2")]
    pub generate_name: Option<String>,
    /// `namespace`.
    #[prost(string, optional, tag = "3")]
    pub namespace: Option<String>,
    /// `selfLink`.
    #[prost(string, optional, tag = "4")]
    pub self_link: Option<String>,
    /// `uid`.
    #[prost(string, optional, tag = "5")]
    pub uid: Option<String>,
    /// `resourceVersion`.
    #[prost(string, optional, tag = "6")]
    pub resource_version: Option<String>,
    /// `generation`.
    #[prost(int64, optional, tag = "7")]
    pub generation: Option<i64>,
    /// `creationTimestamp`.
    #[prost(message, optional, tag = "8")]
    pub creation_timestamp: Option<Time>,
    /// `deletionTimestamp`.
    #[prost(message, optional, tag = "9")]
    pub deletion_timestamp: Option<Time>,
    /// `deletionGracePeriodSeconds`.
    #[prost(int64, optional, tag = "10")]
    pub deletion_grace_period_seconds: Option<i64>,
    /// `labels`.
    #[prost(btree_map = "string, string", tag = "11")]
    pub labels: BTreeMap<String, String>,
    /// `annotations`.
    #[prost(btree_map = "string, string", tag = "12")]
    pub annotations: BTreeMap<String, String>,
    /// `ownerReferences`.
    #[prost(message, repeated, tag = "13")]
    pub owner_references: Vec<OwnerReference>,
    /// `finalizers`.
    #[prost(string, repeated, tag = "14")]
    pub finalizers: Vec<String>,
}

/// `meta.v1.Condition`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Condition {
    /// `type`.
    #[prost(string, optional, tag = "1")]
    pub r#type: Option<String>,
    /// `status`.
    #[prost(string, optional, tag = "2")]
    pub status: Option<String>,
    /// `observedGeneration`.
    #[prost(int64, optional, tag = "3")]
    pub observed_generation: Option<i64>,
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

/// Seconds of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z, the range Go's `time` renders in RFC 3339.
const MIN_SECONDS: i64 = -62_135_596_800;
const MAX_SECONDS: i64 = 253_402_300_799;

/// Render a Time as Go does in JSON: RFC 3339 in UTC, whole seconds (`micro`: six fractional
/// digits, as `MicroTime`). `None` for the zero time (an empty message), which Go renders as null.
///
/// # Errors
/// 400 when the time is outside years 1..=9999 or the nanoseconds are outside 0..1e9.
pub fn time_json(t: &Time, field: &str, micro: bool) -> ApiResult<Option<Value>> {
    if t.seconds.is_none() && t.nanos.is_none() {
        return Ok(None);
    }
    let secs = t.seconds.unwrap_or_default();
    let nanos = t.nanos.unwrap_or_default();
    if !(MIN_SECONDS..=MAX_SECONDS).contains(&secs) || !(0..1_000_000_000).contains(&nanos) {
        return Err(ApiError::bad_request(format!(
            "the protobuf body has an invalid time in {field}: seconds={secs} nanos={nanos} \
             (seconds must be within years 1 to 9999, nanos within 0 to 999999999)"
        )));
    }
    // Go keeps only whole seconds for Time; MicroTime keeps microseconds.
    let nanos = if micro { u32::try_from(nanos / 1000 * 1000).unwrap_or_default() } else { 0 };
    let Some(dt) = chrono::DateTime::from_timestamp(secs, nanos) else {
        return Err(ApiError::bad_request(format!("the protobuf body has an invalid time in {field}")));
    };
    let format = if micro { "%Y-%m-%dT%H:%M:%S%.6fZ" } else { "%Y-%m-%dT%H:%M:%SZ" };
    Ok(Some(Value::String(dt.format(format).to_string())))
}

/// A JSON object built field by field with Go's `omitempty` rules.
#[derive(Debug, Default)]
pub struct Obj(Map<String, Value>);

impl Obj {
    /// An empty object.
    pub fn new() -> Self {
        Self::default()
    }

    /// The finished object.
    pub fn build(self) -> Value {
        Value::Object(self.0)
    }

    /// Set `key` to any value.
    pub fn set(&mut self, key: &str, v: Value) -> &mut Self {
        self.0.insert(key.to_string(), v);
        self
    }

    /// A string with `omitempty`: absent and "" are left out.
    pub fn str(&mut self, key: &str, v: &Option<String>) -> &mut Self {
        if let Some(s) = v.as_ref().filter(|s| !s.is_empty()) {
            self.set(key, Value::String(s.clone()));
        }
        self
    }

    /// A string without `omitempty` (Go always writes it, "" when unset).
    pub fn req_str(&mut self, key: &str, v: &Option<String>) -> &mut Self {
        self.set(key, Value::String(v.clone().unwrap_or_default()))
    }

    /// A `*string`: written whenever it was sent, even "".
    pub fn ptr_str(&mut self, key: &str, v: &Option<String>) -> &mut Self {
        if let Some(s) = v {
            self.set(key, Value::String(s.clone()));
        }
        self
    }

    /// An integer with `omitempty`: absent and 0 are left out.
    pub fn int(&mut self, key: &str, v: Option<i64>) -> &mut Self {
        if let Some(n) = v.filter(|n| *n != 0) {
            self.set(key, Value::from(n));
        }
        self
    }

    /// An integer without `omitempty` (Go always writes it, 0 when unset).
    pub fn req_int(&mut self, key: &str, v: Option<i64>) -> &mut Self {
        self.set(key, Value::from(v.unwrap_or_default()))
    }

    /// A `*int32`/`*int64`: written whenever it was sent, even 0.
    pub fn ptr_int(&mut self, key: &str, v: Option<i64>) -> &mut Self {
        if let Some(n) = v {
            self.set(key, Value::from(n));
        }
        self
    }

    /// A bool with `omitempty`: absent and false are left out.
    pub fn bool(&mut self, key: &str, v: Option<bool>) -> &mut Self {
        if v == Some(true) {
            self.set(key, Value::Bool(true));
        }
        self
    }

    /// A `*bool`: written whenever it was sent, even false.
    pub fn ptr_bool(&mut self, key: &str, v: Option<bool>) -> &mut Self {
        if let Some(b) = v {
            self.set(key, Value::Bool(b));
        }
        self
    }

    /// A list of strings with `omitempty`.
    pub fn strs(&mut self, key: &str, v: &[String]) -> &mut Self {
        if !v.is_empty() {
            self.set(key, Value::from(v.to_vec()));
        }
        self
    }

    /// A `map[string]string` with `omitempty`.
    pub fn str_map(&mut self, key: &str, v: &BTreeMap<String, String>) -> &mut Self {
        if !v.is_empty() {
            let m = v.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
            self.set(key, Value::Object(m));
        }
        self
    }

    /// A `map[string][]byte` with `omitempty`: values become base64, as in JSON.
    pub fn bytes_map(&mut self, key: &str, v: &BTreeMap<String, Vec<u8>>) -> &mut Self {
        if !v.is_empty() {
            let b64 = &base64::engine::general_purpose::STANDARD;
            let m = v.iter().map(|(k, v)| (k.clone(), Value::String(b64.encode(v)))).collect();
            self.set(key, Value::Object(m));
        }
        self
    }

    /// A nested message, written when it was sent.
    pub fn msg<T>(&mut self, key: &str, v: Option<&T>, f: impl FnOnce(&T) -> ApiResult<Value>) -> ApiResult<&mut Self> {
        if let Some(m) = v {
            let value = f(m)?;
            self.set(key, value);
        }
        Ok(self)
    }

    /// A list of messages with `omitempty`.
    pub fn msgs<T>(&mut self, key: &str, v: &[T], f: impl Fn(&T) -> ApiResult<Value>) -> ApiResult<&mut Self> {
        if !v.is_empty() {
            let items = v.iter().map(f).collect::<ApiResult<Vec<_>>>()?;
            self.set(key, Value::Array(items));
        }
        Ok(self)
    }

    /// A Time (`micro`: a MicroTime) at `path` (for errors); the zero time is left out.
    pub fn time(&mut self, key: &str, v: Option<&Time>, path: &str, micro: bool) -> ApiResult<&mut Self> {
        if let Some(t) = v
            && let Some(s) = time_json(t, path, micro)?
        {
            self.set(key, s);
        }
        Ok(self)
    }
}

fn owner_reference(r: &OwnerReference) -> ApiResult<Value> {
    let mut o = Obj::new();
    o.req_str("apiVersion", &r.api_version)
        .req_str("kind", &r.kind)
        .req_str("name", &r.name)
        .req_str("uid", &r.uid)
        .ptr_bool("controller", r.controller)
        .ptr_bool("blockOwnerDeletion", r.block_owner_deletion);
    Ok(o.build())
}

/// ObjectMeta as JSON.
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn object_meta(m: &ObjectMeta) -> ApiResult<Value> {
    let mut o = Obj::new();
    o.str("name", &m.name)
        .str("generateName", &m.generate_name)
        .str("namespace", &m.namespace)
        .str("selfLink", &m.self_link)
        .str("uid", &m.uid)
        .str("resourceVersion", &m.resource_version)
        .int("generation", m.generation);
    o.time("creationTimestamp", m.creation_timestamp.as_ref(), "metadata.creationTimestamp", false)?
        .time("deletionTimestamp", m.deletion_timestamp.as_ref(), "metadata.deletionTimestamp", false)?
        .ptr_int("deletionGracePeriodSeconds", m.deletion_grace_period_seconds)
        .str_map("labels", &m.labels)
        .str_map("annotations", &m.annotations)
        .msgs("ownerReferences", &m.owner_references, owner_reference)?
        .strs("finalizers", &m.finalizers);
    Ok(o.build())
}

/// Condition as JSON (`path` names the list, for errors).
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn condition(c: &Condition, path: &str) -> ApiResult<Value> {
    let mut o = Obj::new();
    o.req_str("type", &c.r#type).req_str("status", &c.status).int("observedGeneration", c.observed_generation);
    o.time("lastTransitionTime", c.last_transition_time.as_ref(), path, false)?
        .req_str("reason", &c.reason)
        .req_str("message", &c.message);
    Ok(o.build())
}

/// The top of every object: apiVersion, kind, metadata (always an object, as the JSON path expects).
pub(super) fn top(api_version: &str, kind: &str, meta: Option<&ObjectMeta>) -> ApiResult<Obj> {
    let mut o = Obj::new();
    o.set("apiVersion", Value::from(api_version)).set("kind", Value::from(kind));
    let meta = match meta {
        Some(m) => object_meta(m)?,
        None => Value::Object(serde_json::Map::new()),
    };
    o.set("metadata", meta);
    Ok(o)
}

/// An `int32` field widened for JSON.
pub(super) fn i(v: Option<i32>) -> Option<i64> {
    v.map(i64::from)
}
