//! What can be wrong with an event on the wire or with its payload.

use super::{EventType, Target};

/// An event could not be decoded from the wire, or its payload did not match its type.
///
/// Every variant names the attribute or field at fault so that a log line says what the peer
/// sent wrong.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The stream message (`eventstreamapi.Event`) carried no `event` field.
    #[error("stream message carries no CloudEvent (field `event` is unset)")]
    MissingCloudEvent,
    /// The bytes are not a protobuf `eventstreamapi.Event`.
    #[error("not a protobuf eventstreamapi.Event: {0}")]
    Protobuf(#[from] prost::DecodeError),
    /// `spec_version` is not `1.0`.
    #[error("unsupported CloudEvents spec_version {found:?}, expected \"1.0\"")]
    BadSpecVersion {
        /// What the peer sent.
        found: String,
    },
    /// The CloudEvent `id` is empty (only rejected when [`DecodeLimits::require_id`] is set:
    /// upstream never sets it).
    ///
    /// [`DecodeLimits::require_id`]: super::DecodeLimits::require_id
    #[error("CloudEvent id is empty")]
    MissingId,
    /// The CloudEvent `type` is empty.
    #[error("CloudEvent type is empty")]
    MissingType,
    /// A required optional-in-CloudEvents attribute (such as `dataschema`) is absent or empty.
    #[error("CloudEvent attribute `{name}` is missing or empty")]
    MissingAttribute {
        /// The attribute's name.
        name: &'static str,
    },
    /// A required argocd-agent extension (`resourceid`, `eventid`) is absent or empty.
    #[error("extension `{name}` is missing or empty; the event cannot be tracked or acknowledged")]
    MissingExtension {
        /// The extension's name.
        name: &'static str,
    },
    /// An attribute has a value type we cannot use for it.
    #[error("attribute `{name}` has type {found}, expected {expected}")]
    AttributeType {
        /// The attribute's name.
        name: String,
        /// What it must be.
        expected: &'static str,
        /// What it was.
        found: &'static str,
    },
    /// An attribute's oneof was not set.
    #[error("attribute `{name}` has no value")]
    EmptyAttribute {
        /// The attribute's name.
        name: String,
    },
    /// An attribute name is not `[a-z0-9]+`.
    #[error("attribute name {name:?} is not lower-case alphanumeric")]
    InvalidAttributeName {
        /// The offending name.
        name: String,
    },
    /// A timestamp attribute or extension could not be used.
    #[error("timestamp `{name}`: {reason}")]
    BadTimestamp {
        /// The attribute's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The data came as `proto_data`, which argocd-agent never uses.
    #[error("data is encoded as {encoding}; only binary_data and text_data carrying JSON are supported")]
    UnsupportedDataEncoding {
        /// The oneof member used.
        encoding: &'static str,
    },
    /// `datacontenttype` is not JSON.
    #[error("datacontenttype {content_type:?} is not JSON")]
    UnsupportedContentType {
        /// What the peer declared.
        content_type: String,
    },
    /// The data is larger than [`DecodeLimits::max_data_bytes`].
    ///
    /// [`DecodeLimits::max_data_bytes`]: super::DecodeLimits::max_data_bytes
    #[error("data is {size} bytes, more than the limit of {limit}")]
    DataTooLarge {
        /// The data's size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The data is not valid JSON.
    #[error("data is not valid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    /// The event has no data but its type needs a payload.
    #[error("{event_type} event for target {target} carries no data")]
    MissingData {
        /// The event's type.
        event_type: EventType,
        /// The event's target.
        target: Target,
    },
    /// The JSON payload does not have the shape its type and target call for.
    #[error("{event_type} event for target {target}: payload does not match: {source}")]
    PayloadMismatch {
        /// The event's type.
        event_type: EventType,
        /// The event's target.
        target: Target,
        /// Where the JSON differs from the expected shape.
        #[source]
        source: serde_json::Error,
    },
    /// A payload could not be serialised to JSON.
    #[error("payload cannot be serialised to JSON: {0}")]
    Serialize(#[source] serde_json::Error),
}
