//! Decoding untrusted bytes into a typed [`Event`], with the invariants a fuzzer checks.
//! The fuzz target `fuzz/fuzz_targets/event_decode.rs` calls [`check_event_decode`], and so
//! do the unit tests, so the target's logic runs in every `cargo test`.

use prost::Message as _;

use crate::checksum;
use crate::event::{AckRef, DecodeLimits, Event, EventError};
use crate::pb::eventstreamapi;

/// An invariant of decoding that did not hold.
#[derive(Debug, thiserror::Error)]
pub enum FuzzFinding {
    /// Re-encoding a decoded event and decoding it again gave a different event.
    #[error("re-encoded event decodes differently:\n first: {first:?}\nsecond: {second:?}")]
    RoundTripMismatch {
        /// The event decoded from the input.
        first: Box<Event>,
        /// The event decoded from its re-encoding.
        second: Box<Event>,
    },
    /// Re-encoding a decoded event produced something that does not decode.
    #[error("re-encoded event no longer decodes: {0}")]
    ReencodeFailed(#[source] EventError),
    /// The event decoded, but [`AckRef::of`] could not find the ids to acknowledge it by.
    #[error("decoded event has no AckRef")]
    AckRefMissing,
}

/// Decodes `bytes` as a protobuf stream message (`eventstreamapi.Event`) into a typed event,
/// with `limits`, and checks that whatever decodes re-encodes to the same event. Also runs
/// payload decoding, ACK construction, trace-context parsing and the spec checksum over the
/// result, none of which may panic.
///
/// Returns the decoded event, or `None` when the input is (correctly) rejected.
///
/// # Errors
///
/// A [`FuzzFinding`] when an invariant is broken: a bug.
pub fn check_event_decode(bytes: &[u8], limits: &DecodeLimits) -> Result<Option<Event>, FuzzFinding> {
    let Ok(msg) = eventstreamapi::Event::decode(bytes) else {
        return Ok(None);
    };
    let Some(ce) = msg.event else {
        return Ok(None);
    };
    let ack_ref = AckRef::of(&ce);
    let Ok(first) = Event::from_proto_with(ce, limits) else {
        return Ok(None);
    };
    if ack_ref.is_none() {
        return Err(FuzzFinding::AckRefMissing);
    }

    let _ = first.payload();
    let _ = first.processed_ack();
    // The peer's W3C trace context: parsed and checked, never a panic.
    let _ = (first.trace.parent(), first.trace.state());
    if let Some(data) = &first.data {
        let _ = checksum::spec_checksum(data);
    }

    let reencoded = first.to_wire().encode_to_vec();
    let second = Event::decode_wire_bytes(&reencoded, limits).map_err(FuzzFinding::ReencodeFailed)?;
    if second != first {
        return Err(FuzzFinding::RoundTripMismatch { first: Box::new(first), second: Box::new(second) });
    }
    Ok(Some(first))
}

/// Parses `bytes` as a resource-proxy request path ([`crate::payload::ApiPath`]) and checks that
/// a resource target renders back to a path that parses to the same target, and that a request
/// carrying arbitrary text as its target never renders a path the parser would read otherwise.
///
/// # Errors
///
/// A description of the broken invariant: a bug.
pub fn check_api_path(bytes: &[u8]) -> Result<(), String> {
    use crate::payload::{ApiPath, ApiResource, ResourceRequest};
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Ok(());
    };
    if let Ok(ApiPath::Resource(target)) = ApiPath::parse(text) {
        let rendered = target.path().map_err(|e| format!("{text:?} parsed but does not render: {e}"))?;
        let again =
            ApiPath::parse(&rendered).map_err(|e| format!("{rendered:?} (from {text:?}) does not parse: {e}"))?;
        if again != ApiPath::Resource(target.clone()) {
            return Err(format!("{text:?} -> {target:?} -> {rendered:?} -> {again:?}"));
        }
    }
    // The same text as every field of a request from the wire: a rendered path must parse, and
    // name what it renders (`/api/v1/namespaces/x/status` is read as resource `status` in `x`,
    // as the router does; rendered back it is the same path, which the API server reads right).
    let mut parts = text.splitn(6, '\u{1f}').map(str::to_owned);
    let mut next = || parts.next().unwrap_or_default();
    let req = ResourceRequest {
        group: next(),
        version: next(),
        namespace: next(),
        resource: next(),
        name: next(),
        subresource: next(),
        ..ResourceRequest::default()
    };
    let target = ApiResource::of(&req);
    if let Ok(rendered) = target.path() {
        match ApiPath::parse(&rendered) {
            Ok(ApiPath::Resource(back)) if back.path().as_ref() == Ok(&rendered) => {}
            other => return Err(format!("{target:?} rendered {rendered:?}, which parses as {other:?}")),
        }
    }
    Ok(())
}
