//! Conversion between the typed [`Event`] and the protobuf `io.cloudevents.v1.CloudEvent`,
//! attribute for attribute what cloudevents sdk-go v2.16.2's `binding/format/protobuf/v2`
//! (`ToProto` / `FromProto`, the version upstream pins) writes and reads:
//!
//! * `dataschema` travels as `ce_uri`: sdk-go's `ToProto` writes it from a parsed URL, and its
//!   `FromProto` reads it only from `ce_uri` (a `ce_string` would arrive as an empty
//!   dataschema, and upstream drops the event as "unknown event target").
//! * `datacontenttype`, `subject` and every string extension (`resourceid`, `eventid`,
//!   `sentat`, `principaluid`, `traceparent`, `tracestate`) travel as `ce_string`; `time` as
//!   `ce_timestamp`; extensions we keep without interpreting go out with the type they came in.
//! * Data always goes out as `binary_data` (empty when there is none), as sdk-go does; `text_data`
//!   would reach a Go peer JSON-encoded a second time.
//!
//! On the way in, every form a released upstream could send is accepted: `dataschema` (and the
//! other text attributes) as `ce_string`, `ce_uri` or `ce_uri_ref` (sdk-go before v2.15 wrote
//! `ce_string`), `sentat` and `time` as a string or a `ce_timestamp`, data as `binary_data` or
//! `text_data`. docs/compatibility.md lists the rules and the Go peer test that checks each.
//!
//! Decoding never panics: anything malformed is an [`EventError`] naming the field.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::pb::cloudevents::CloudEvent;
use crate::pb::cloudevents::cloud_event::{CloudEventAttributeValue, Data};
use crate::pb::eventstreamapi;

use super::attributes::{
    ATTR_DATA_CONTENT_TYPE, ATTR_DATA_SCHEMA, ATTR_SUBJECT, ATTR_TIME, AttributeValue, EXT_EVENT_ID, EXT_PRINCIPAL_UID,
    EXT_RESOURCE_ID, EXT_SENT_AT, EXT_TRACEPARENT, EXT_TRACESTATE, SPEC_VERSION, TraceContext, format_rfc3339_nano,
    is_valid_attribute_name, parse_rfc3339,
};
use super::data::JsonData;
use super::{Event, EventError, EventType, Target};

/// The default data limit: the largest gRPC message upstream accepts.
pub const DEFAULT_MAX_DATA_BYTES: usize = crate::pb::MAX_MESSAGE_BYTES;

/// Limits and strictness applied when decoding untrusted events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Data larger than this is rejected with [`EventError::DataTooLarge`].
    pub max_data_bytes: usize,
    /// Reject an empty CloudEvent `id` ([`EventError::MissingId`]). Off by default: upstream
    /// never sets `id`, so a Go peer's events would all be rejected.
    pub require_id: bool,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self { max_data_bytes: DEFAULT_MAX_DATA_BYTES, require_id: false }
    }
}

/// The ids needed to acknowledge an event, read from a raw CloudEvent without validating the
/// rest of it: lets a receiver answer (ACK or error) an event it cannot decode instead of
/// leaving the sender to retry it forever.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckRef {
    /// `resourceid`.
    pub resource_id: String,
    /// `eventid` (empty if absent).
    pub event_id: String,
}

impl AckRef {
    /// Reads `resourceid`/`eventid` from a raw CloudEvent; `None` without a usable `resourceid`.
    #[must_use]
    pub fn of(raw: &CloudEvent) -> Option<Self> {
        let text = |name: &str| {
            raw.attributes
                .get(name)
                .and_then(|v| AttributeValue::from_proto(name, v.clone()).ok())
                .and_then(|v| v.as_text().map(str::to_owned))
        };
        let resource_id = text(EXT_RESOURCE_ID).filter(|s| !s.is_empty())?;
        Some(Self { resource_id, event_id: text(EXT_EVENT_ID).unwrap_or_default() })
    }
}

impl Event {
    /// Decodes a stream message with the default [`DecodeLimits`].
    ///
    /// # Errors
    ///
    /// [`EventError::MissingCloudEvent`] if the message is empty, otherwise as
    /// [`Event::from_proto`].
    pub fn from_wire(msg: eventstreamapi::Event) -> Result<Self, EventError> {
        Self::from_proto(msg.event.ok_or(EventError::MissingCloudEvent)?)
    }

    /// Wraps this event in a stream message.
    #[must_use]
    pub fn to_wire(&self) -> eventstreamapi::Event {
        eventstreamapi::Event { event: Some(self.to_proto()) }
    }

    /// Decodes a protobuf-encoded stream message (`eventstreamapi.Event` bytes).
    ///
    /// # Errors
    ///
    /// [`EventError::Protobuf`] for bytes that are not the message, otherwise as
    /// [`Event::from_proto_with`].
    pub fn decode_wire_bytes(bytes: &[u8], limits: &DecodeLimits) -> Result<Self, EventError> {
        let msg = <eventstreamapi::Event as prost::Message>::decode(bytes)?;
        Self::from_proto_with(msg.event.ok_or(EventError::MissingCloudEvent)?, limits)
    }

    /// Decodes a CloudEvent with the default [`DecodeLimits`].
    ///
    /// # Errors
    ///
    /// As [`Event::from_proto_with`].
    pub fn from_proto(ce: CloudEvent) -> Result<Self, EventError> {
        Self::from_proto_with(ce, &DecodeLimits::default())
    }

    /// Decodes a CloudEvent.
    ///
    /// # Errors
    ///
    /// * [`EventError::BadSpecVersion`] unless `spec_version` is `1.0`;
    /// * [`EventError::MissingType`], [`EventError::MissingId`] (only with `require_id`);
    /// * [`EventError::MissingAttribute`] without `dataschema`;
    /// * [`EventError::MissingExtension`] without `resourceid` or `eventid`;
    /// * [`EventError::InvalidAttributeName`], [`EventError::EmptyAttribute`],
    ///   [`EventError::AttributeType`], [`EventError::BadTimestamp`] for bad attributes;
    /// * [`EventError::UnsupportedDataEncoding`], [`EventError::UnsupportedContentType`],
    ///   [`EventError::DataTooLarge`], [`EventError::InvalidJson`] for bad data.
    pub fn from_proto_with(ce: CloudEvent, limits: &DecodeLimits) -> Result<Self, EventError> {
        if ce.spec_version != SPEC_VERSION {
            return Err(EventError::BadSpecVersion { found: ce.spec_version });
        }
        if limits.require_id && ce.id.is_empty() {
            return Err(EventError::MissingId);
        }
        if ce.r#type.is_empty() {
            return Err(EventError::MissingType);
        }

        let mut attrs = Attributes::decode(ce.attributes)?;
        let data_content_type = attrs.take_text(ATTR_DATA_CONTENT_TYPE)?;
        let target = attrs
            .take_text(ATTR_DATA_SCHEMA)?
            .filter(|s| !s.is_empty())
            .ok_or(EventError::MissingAttribute { name: ATTR_DATA_SCHEMA })?;
        let subject = attrs.take_text(ATTR_SUBJECT)?;
        let time = attrs.take_time(ATTR_TIME)?;
        let resource_id = attrs.take_required(EXT_RESOURCE_ID)?;
        let event_id = attrs.take_required(EXT_EVENT_ID)?;
        let sent_at = attrs.take_time(EXT_SENT_AT)?;
        let principal_uid = attrs.take_text(EXT_PRINCIPAL_UID)?;
        let trace = TraceContext {
            traceparent: attrs.take_text(EXT_TRACEPARENT)?,
            tracestate: attrs.take_text(EXT_TRACESTATE)?,
        };

        let data = decode_data(ce.data, data_content_type.as_deref(), limits)?;

        Ok(Self {
            id: ce.id,
            source: ce.source,
            event_type: EventType::from(ce.r#type),
            target: Target::from(target),
            subject,
            time,
            data_content_type,
            resource_id,
            event_id,
            sent_at,
            principal_uid,
            trace,
            extensions: attrs.0.into_iter().collect(),
            data,
        })
    }

    /// Encodes this event as a CloudEvent the way sdk-go does (see the module docs).
    #[must_use]
    pub fn to_proto(&self) -> CloudEvent {
        let mut attributes: HashMap<String, CloudEventAttributeValue> =
            self.extensions.iter().map(|(k, v)| (k.clone(), v.to_proto())).collect();
        let mut put = |name: &str, value: AttributeValue| {
            attributes.insert(name.to_owned(), value.to_proto());
        };
        let string = |s: &str| AttributeValue::String(s.to_owned());

        if let Some(ct) = &self.data_content_type {
            put(ATTR_DATA_CONTENT_TYPE, string(ct));
        }
        // sdk-go: `attributeFor(url.Parse(dataschema))`, i.e. ce_uri (see the module docs).
        put(ATTR_DATA_SCHEMA, AttributeValue::Uri(self.target.as_str().to_owned()));
        if let Some(subject) = &self.subject {
            put(ATTR_SUBJECT, string(subject));
        }
        if let Some(t) = &self.time {
            put(ATTR_TIME, AttributeValue::Timestamp(*t));
        }
        put(EXT_RESOURCE_ID, string(&self.resource_id));
        put(EXT_EVENT_ID, string(&self.event_id));
        if let Some(t) = &self.sent_at {
            put(EXT_SENT_AT, AttributeValue::String(format_rfc3339_nano(t)));
        }
        if let Some(uid) = &self.principal_uid {
            put(EXT_PRINCIPAL_UID, string(uid));
        }
        if let Some(tp) = &self.trace.traceparent {
            put(EXT_TRACEPARENT, string(tp));
        }
        if let Some(ts) = &self.trace.tracestate {
            put(EXT_TRACESTATE, string(ts));
        }

        let data = self.data.as_ref().map(JsonData::encoded).unwrap_or_default();

        CloudEvent {
            id: self.id.clone(),
            source: self.source.clone(),
            spec_version: SPEC_VERSION.to_owned(),
            r#type: self.event_type.as_str().to_owned(),
            attributes,
            data: Some(Data::BinaryData(data)),
        }
    }
}

impl TryFrom<CloudEvent> for Event {
    type Error = EventError;

    fn try_from(ce: CloudEvent) -> Result<Self, Self::Error> {
        Self::from_proto(ce)
    }
}

impl From<&Event> for CloudEvent {
    fn from(ev: &Event) -> Self {
        ev.to_proto()
    }
}

/// Decoded attributes, consumed field by field; what remains are the extensions.
struct Attributes(HashMap<String, AttributeValue>);

impl Attributes {
    fn decode(raw: HashMap<String, CloudEventAttributeValue>) -> Result<Self, EventError> {
        raw.into_iter()
            .map(|(name, value)| {
                if !is_valid_attribute_name(&name) {
                    return Err(EventError::InvalidAttributeName { name });
                }
                let value = AttributeValue::from_proto(&name, value)?;
                Ok((name, value))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Removes a string-like attribute.
    fn take_text(&mut self, name: &'static str) -> Result<Option<String>, EventError> {
        match self.0.remove(name) {
            None => Ok(None),
            Some(AttributeValue::String(s) | AttributeValue::Uri(s) | AttributeValue::UriRef(s)) => Ok(Some(s)),
            Some(other) => Err(type_error(name, "ce_string", &other)),
        }
    }

    /// Removes a time attribute: a `ce_timestamp`, or RFC 3339 text (how `sentat` travels).
    fn take_time(&mut self, name: &'static str) -> Result<Option<DateTime<Utc>>, EventError> {
        match self.0.remove(name) {
            None => Ok(None),
            Some(AttributeValue::Timestamp(t)) => Ok(Some(t)),
            Some(AttributeValue::String(s) | AttributeValue::Uri(s) | AttributeValue::UriRef(s)) => {
                parse_rfc3339(name, &s).map(Some)
            }
            Some(other) => Err(type_error(name, "ce_timestamp", &other)),
        }
    }

    /// Removes a string attribute that must be present and non-empty.
    fn take_required(&mut self, name: &'static str) -> Result<String, EventError> {
        self.take_text(name)?.filter(|s| !s.is_empty()).ok_or(EventError::MissingExtension { name })
    }
}

fn type_error(name: &str, expected: &'static str, found: &AttributeValue) -> EventError {
    EventError::AttributeType { name: name.to_owned(), expected, found: found.type_name() }
}

fn decode_data(
    data: Option<Data>,
    content_type: Option<&str>,
    limits: &DecodeLimits,
) -> Result<Option<JsonData>, EventError> {
    let bytes: bytes::Bytes = match data {
        None => return Ok(None),
        Some(Data::BinaryData(b)) => b,
        Some(Data::TextData(s)) => s.into(),
        Some(Data::ProtoData(_)) => {
            return Err(EventError::UnsupportedDataEncoding { encoding: "proto_data" });
        }
    };
    if bytes.is_empty() {
        return Ok(None);
    }
    if bytes.len() > limits.max_data_bytes {
        return Err(EventError::DataTooLarge { size: bytes.len(), limit: limits.max_data_bytes });
    }
    if let Some(ct) = content_type
        && !is_json_content_type(ct)
    {
        return Err(EventError::UnsupportedContentType { content_type: ct.to_owned() });
    }
    serde_json::from_slice(&bytes).map(|v| Some(JsonData::new(v))).map_err(EventError::InvalidJson)
}

/// `application/json`, `text/json` or any `+json` media type, parameters ignored.
fn is_json_content_type(ct: &str) -> bool {
    let media = ct.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    media.is_empty() || media == "application/json" || media == "text/json" || media.ends_with("+json")
}
