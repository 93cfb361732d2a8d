//! CloudEvent attribute values, the argocd-agent extension names, and the timestamp formats
//! used on the wire.

use chrono::{DateTime, Datelike, SecondsFormat, Timelike, Utc};

use crate::pb::cloudevents::cloud_event::{CloudEventAttributeValue, cloud_event_attribute_value::Attr};

use super::EventError;

/// Extension `resourceid`: `<name>_<uid>` for object events, a UUID otherwise.
pub const EXT_RESOURCE_ID: &str = "resourceid";
/// Extension `eventid`: `<name>_<uid>_<resourceVersion>` for object events, the request UUID
/// for requests and responses.
pub const EXT_EVENT_ID: &str = "eventid";
/// Extension `sentat`: RFC 3339 UTC time (nanoseconds, trailing zeros trimmed) of transmission.
pub const EXT_SENT_AT: &str = "sentat";
/// Extension `principaluid`: the principal's persistent identity.
pub const EXT_PRINCIPAL_UID: &str = "principaluid";
/// Extension `traceparent`: W3C trace context.
pub const EXT_TRACEPARENT: &str = "traceparent";
/// Extension `tracestate`: W3C trace context.
pub const EXT_TRACESTATE: &str = "tracestate";

/// Optional attribute `datacontenttype`.
pub const ATTR_DATA_CONTENT_TYPE: &str = "datacontenttype";
/// Optional attribute `dataschema` (the event target).
pub const ATTR_DATA_SCHEMA: &str = "dataschema";
/// Optional attribute `subject` (`<namespace>/<name>` for object events).
pub const ATTR_SUBJECT: &str = "subject";
/// Optional attribute `time`.
pub const ATTR_TIME: &str = "time";

/// The only CloudEvents spec version spoken.
pub const SPEC_VERSION: &str = "1.0";
/// The content type of every argocd-agent payload.
pub const CONTENT_TYPE_JSON: &str = "application/json";

/// The value of an extension attribute we keep without interpreting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttributeValue {
    /// `ce_boolean`
    Boolean(bool),
    /// `ce_integer`
    Integer(i32),
    /// `ce_string`
    String(String),
    /// `ce_bytes`
    Bytes(Vec<u8>),
    /// `ce_uri`
    Uri(String),
    /// `ce_uri_ref`
    UriRef(String),
    /// `ce_timestamp` (years 0001-9999, no leap second)
    Timestamp(DateTime<Utc>),
}

impl AttributeValue {
    /// The protobuf oneof name of this value, for error messages.
    #[must_use]
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Boolean(_) => "ce_boolean",
            Self::Integer(_) => "ce_integer",
            Self::String(_) => "ce_string",
            Self::Bytes(_) => "ce_bytes",
            Self::Uri(_) => "ce_uri",
            Self::UriRef(_) => "ce_uri_ref",
            Self::Timestamp(_) => "ce_timestamp",
        }
    }

    /// The value as text if it is string-like (`ce_string`, `ce_uri`, `ce_uri_ref`).
    #[must_use]
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::String(s) | Self::Uri(s) | Self::UriRef(s) => Some(s),
            _ => None,
        }
    }

    /// Converts a protobuf attribute value.
    ///
    /// # Errors
    ///
    /// [`EventError::EmptyAttribute`] if the oneof is unset, [`EventError::BadTimestamp`] if a
    /// timestamp is out of range.
    pub fn from_proto(name: &str, value: CloudEventAttributeValue) -> Result<Self, EventError> {
        Ok(match value.attr {
            None => {
                return Err(EventError::EmptyAttribute { name: name.to_owned() });
            }
            Some(Attr::CeBoolean(b)) => Self::Boolean(b),
            Some(Attr::CeInteger(i)) => Self::Integer(i),
            Some(Attr::CeString(s)) => Self::String(s),
            Some(Attr::CeBytes(b)) => Self::Bytes(b),
            Some(Attr::CeUri(s)) => Self::Uri(s),
            Some(Attr::CeUriRef(s)) => Self::UriRef(s),
            Some(Attr::CeTimestamp(ts)) => Self::Timestamp(timestamp_from_proto(name, &ts)?),
        })
    }

    /// Converts to a protobuf attribute value.
    #[must_use]
    pub fn to_proto(&self) -> CloudEventAttributeValue {
        let attr = match self {
            Self::Boolean(b) => Attr::CeBoolean(*b),
            Self::Integer(i) => Attr::CeInteger(*i),
            Self::String(s) => Attr::CeString(s.clone()),
            Self::Bytes(b) => Attr::CeBytes(b.clone()),
            Self::Uri(s) => Attr::CeUri(s.clone()),
            Self::UriRef(s) => Attr::CeUriRef(s.clone()),
            Self::Timestamp(t) => Attr::CeTimestamp(timestamp_to_proto(t)),
        };
        CloudEventAttributeValue { attr: Some(attr) }
    }
}

/// W3C trace context carried through as the `traceparent` / `tracestate` extensions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceContext {
    /// `traceparent`, passed through untouched.
    pub traceparent: Option<String>,
    /// `tracestate`, passed through untouched.
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// Whether neither header is present.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.traceparent.is_none() && self.tracestate.is_none()
    }
}

/// Whether `name` is a valid CloudEvents attribute name (`[a-z0-9]+`).
#[must_use]
pub fn is_valid_attribute_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Formats a time as Go's `time.RFC3339Nano` does for a UTC time: fractional seconds with
/// trailing zeros trimmed (none at all when zero) and `Z`.
#[must_use]
pub fn format_rfc3339_nano(t: &DateTime<Utc>) -> String {
    let mut out =
        format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", t.year(), t.month(), t.day(), t.hour(), t.minute(), t.second());
    // A leap second shows up as nanosecond >= 1e9; Go cannot represent it, so clamp.
    let nanos = t.nanosecond().min(999_999_999);
    if nanos != 0 {
        let digits = format!("{nanos:09}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

/// Parses an RFC 3339 time (any offset, any number of fractional digits) into UTC.
///
/// # Errors
///
/// [`EventError::BadTimestamp`] naming `name` when the text is not RFC 3339 or is outside
/// years 0001-9999.
pub fn parse_rfc3339(name: &str, text: &str) -> Result<DateTime<Utc>, EventError> {
    let t = DateTime::parse_from_rfc3339(text)
        .map_err(|e| EventError::BadTimestamp {
            name: name.to_owned(),
            reason: format!("{text:?} is not RFC 3339: {e}"),
        })?
        .with_timezone(&Utc);
    check_year(name, t)
}

fn check_year(name: &str, t: DateTime<Utc>) -> Result<DateTime<Utc>, EventError> {
    let reason = if !(1..=9999).contains(&t.year()) {
        format!("year {} is outside 0001-9999", t.year())
    } else if t.nanosecond() >= 1_000_000_000 {
        // Go's time package has no leap seconds either; refusing keeps round trips exact.
        "leap seconds are not supported".to_owned()
    } else {
        return Ok(t);
    };
    Err(EventError::BadTimestamp { name: name.to_owned(), reason })
}

/// Converts a protobuf timestamp to UTC.
///
/// # Errors
///
/// [`EventError::BadTimestamp`] when nanos are outside `0..1e9` or the instant is outside
/// years 0001-9999 (the range `google.protobuf.Timestamp` allows).
pub fn timestamp_from_proto(name: &str, ts: &prost_types::Timestamp) -> Result<DateTime<Utc>, EventError> {
    let nanos = u32::try_from(ts.nanos).ok().filter(|n| *n < 1_000_000_000).ok_or_else(|| {
        EventError::BadTimestamp { name: name.to_owned(), reason: format!("nanos {} outside 0..1e9", ts.nanos) }
    })?;
    let t = DateTime::from_timestamp(ts.seconds, nanos).ok_or_else(|| EventError::BadTimestamp {
        name: name.to_owned(),
        reason: format!("seconds {} out of range", ts.seconds),
    })?;
    check_year(name, t)
}

/// Converts a UTC time to a protobuf timestamp.
#[must_use]
pub fn timestamp_to_proto(t: &DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        // Always < 2e9 (leap seconds), which fits an i32; clamp to the protobuf range.
        nanos: i32::try_from(t.timestamp_subsec_nanos().min(999_999_999)).unwrap_or(0),
    }
}

/// Formats a time for the CloudEvents `time` attribute when it must travel as a string.
#[must_use]
pub fn format_rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_nano_matches_go() {
        let t = DateTime::from_timestamp(1_700_000_000, 120_000_000).unwrap();
        assert_eq!(format_rfc3339_nano(&t), "2023-11-14T22:13:20.12Z");
        let t = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        assert_eq!(format_rfc3339_nano(&t), "2023-11-14T22:13:20Z");
        let t = DateTime::from_timestamp(1_700_000_000, 1).unwrap();
        assert_eq!(format_rfc3339_nano(&t), "2023-11-14T22:13:20.000000001Z");
        assert_eq!(
            parse_rfc3339("sentat", "2023-11-14T23:13:20.12+01:00").unwrap(),
            DateTime::from_timestamp(1_700_000_000, 120_000_000).unwrap()
        );
    }

    #[test]
    fn attribute_names() {
        assert!(is_valid_attribute_name("resourceid"));
        assert!(is_valid_attribute_name("x1"));
        assert!(!is_valid_attribute_name(""));
        assert!(!is_valid_attribute_name("Resource"));
        assert!(!is_valid_attribute_name("a-b"));
    }

    #[test]
    fn bad_timestamps_are_named() {
        let err = timestamp_from_proto("time", &prost_types::Timestamp { seconds: 0, nanos: -1 }).unwrap_err();
        assert!(err.to_string().contains("time"));
        assert!(timestamp_from_proto("time", &prost_types::Timestamp { seconds: i64::MAX, nanos: 0 }).is_err());
        assert!(parse_rfc3339("sentat", "yesterday").is_err());
    }
}
