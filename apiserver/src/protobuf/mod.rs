//! Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`).
//!
//! kubectl and other Go clients send typed objects as protobuf: the 4-byte magic `k8s\0`, then a
//! `runtime.Unknown` envelope whose `typeMeta` names the kind and whose `raw` holds the object's
//! own message. [`decode`] turns the kinds kubectl creates this way (core/v1 Namespace, Secret,
//! ConfigMap, Service, Event and coordination.k8s.io/v1 Lease) into the same JSON object the
//! JSON path would produce, so the rest of the server never sees protobuf. Other kinds get a 415
//! that asks for JSON. Responses stay JSON: clients decode by the response's Content-Type.
//!
//! The messages are written by hand with `prost` derives (no protoc, no build script); field
//! numbers are those of the Kubernetes `generated.proto` files named in each submodule.

pub mod config;
pub mod event;
pub mod lease;
pub mod meta;
pub mod options;
pub mod service;

use prost::Message as _;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};

/// The media type of Kubernetes protobuf bodies.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The prefix of every Kubernetes protobuf body.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// `runtime.TypeMeta` (apimachinery/pkg/runtime/generated.proto).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeMeta {
    /// `apiVersion`.
    #[prost(string, optional, tag = "1")]
    pub api_version: Option<String>,
    /// `kind`.
    #[prost(string, optional, tag = "2")]
    pub kind: Option<String>,
}

/// `runtime.Unknown` (apimachinery/pkg/runtime/generated.proto): the envelope after the magic.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Unknown {
    /// `typeMeta`.
    #[prost(message, optional, tag = "1")]
    pub type_meta: Option<TypeMeta>,
    /// `raw`: the object's own message.
    #[prost(bytes = "vec", optional, tag = "2")]
    pub raw: Option<Vec<u8>>,
    /// `contentEncoding` (unused by Kubernetes; must be empty).
    #[prost(string, optional, tag = "3")]
    pub content_encoding: Option<String>,
    /// `contentType` (empty means protobuf in a protobuf body).
    #[prost(string, optional, tag = "4")]
    pub content_type: Option<String>,
}

/// The kinds decoded here, as (apiVersion, kind).
pub const SUPPORTED: &[(&str, &str)] = &[
    ("v1", "Namespace"),
    ("v1", "Secret"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("v1", "Event"),
    ("coordination.k8s.io/v1", "Lease"),
];

/// Whether a (lowercased) Content-Type header names Kubernetes protobuf.
pub fn is_protobuf(content_type: &str) -> bool {
    content_type.split(';').next().is_some_and(|media| media.trim() == CONTENT_TYPE)
}

/// Wrap an object message in the envelope kubectl sends: magic, then `runtime.Unknown`.
pub fn encode(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let envelope = Unknown {
        type_meta: Some(TypeMeta { api_version: Some(api_version.into()), kind: Some(kind.into()) }),
        raw: Some(raw.to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = MAGIC.to_vec();
    out.extend(envelope.encode_to_vec());
    out
}

fn decode_as<M: prost::Message + Default>(raw: &[u8], api_version: &str, kind: &str) -> ApiResult<M> {
    M::decode(raw).map_err(|e| {
        ApiError::bad_request(format!("the protobuf body is not a valid {api_version} {kind} message: {e}"))
    })
}

/// Decode a Kubernetes protobuf body into the JSON object the JSON path would have produced.
///
/// # Errors
/// 400 for a body without the `k8s\0` magic, an envelope or object that does not decode, or an
/// invalid timestamp; 415 for a kind not decoded here, or none named (send it as JSON), or an
/// encoded payload.
pub fn decode(body: &[u8]) -> ApiResult<Value> {
    let Some(rest) = body.strip_prefix(MAGIC.as_slice()) else {
        return Err(ApiError::bad_request(format!(
            "the request body is not Kubernetes protobuf: it must start with the 4 bytes \"k8s\\0\" \
             (Content-Type {CONTENT_TYPE})"
        )));
    };
    let envelope = Unknown::decode(rest).map_err(|e| {
        ApiError::bad_request(format!("the protobuf body is not a valid runtime.Unknown envelope: {e}"))
    })?;
    let type_meta = envelope.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    if let Some(enc) = envelope.content_encoding.as_deref().filter(|e| !e.is_empty()) {
        return Err(ApiError::unsupported_media_type(format!(
            "the protobuf envelope's content encoding {enc:?} is not supported: send the object unencoded, \
             or as application/json"
        )));
    }
    if let Some(ct) = envelope.content_type.as_deref().filter(|c| !c.is_empty() && *c != CONTENT_TYPE) {
        return Err(ApiError::unsupported_media_type(format!(
            "the protobuf envelope's content type {ct:?} is not supported: send the object as application/json"
        )));
    }
    let raw = envelope.raw.unwrap_or_default();
    let (av, k) = (api_version.as_str(), kind.as_str());
    match (av, k) {
        ("v1", "Namespace") => config::namespace_json(&decode_as(&raw, av, k)?, av, k),
        ("v1", "Secret") => config::secret_json(&decode_as(&raw, av, k)?, av, k),
        ("v1", "ConfigMap") => config::config_map_json(&decode_as(&raw, av, k)?, av, k),
        ("v1", "Service") => service::service_json(&decode_as(&raw, av, k)?, av, k),
        ("v1", "Event") => event::event_json(&decode_as(&raw, av, k)?, av, k),
        ("coordination.k8s.io/v1", "Lease") => lease::lease_json(&decode_as(&raw, av, k)?, av, k),
        _ => {
            // An envelope that names no kind is one more kind this server cannot decode.
            let what = if kind.is_empty() || api_version.is_empty() {
                format!("a protobuf envelope that names no apiVersion and kind (got {api_version:?}, {kind:?})")
            } else {
                format!("{api_version} {kind}")
            };
            let supported = SUPPORTED.iter().map(|(a, k)| format!("{a} {k}")).collect::<Vec<_>>().join(", ");
            Err(ApiError::unsupported_media_type(format!(
                "{what} is not supported as {CONTENT_TYPE}: send the object as application/json \
                 (protobuf bodies are decoded for {supported})"
            )))
        }
    }
}

#[cfg(test)]
mod tests;
