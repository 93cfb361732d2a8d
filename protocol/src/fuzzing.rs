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

/// Scans `bytes` as client commands for the Redis proxy ([`crate::resp`]) and checks: the
/// frames found are the same whether the bytes arrive at once or split where the first byte
/// says; every frame decodes; re-encoding a command's arguments gives a frame that scans and
/// decodes to the same arguments; Argo CD cache keys among the arguments parse consistently
/// ([`check_app_cache_key`]). Scanned again with the limits for a client that has not
/// authenticated ([`crate::resp::Limits::unauthenticated`]): the frames found are the same
/// whether split or not, they are the first of those found without those limits (all of them
/// unless it stopped at an error), and none has more arguments or longer ones than allowed.
///
/// # Errors
///
/// A description of the broken invariant: a bug.
pub fn check_resp_command(bytes: &[u8]) -> Result<(), String> {
    use crate::resp::{Grammar, Limits, Request};
    let step = usize::from(bytes.first().copied().unwrap_or(1)).max(1);
    let whole = scan_all(Grammar::Command, bytes, bytes.len(), FUZZ_LIMITS);
    let split = scan_all(Grammar::Command, bytes, step, FUZZ_LIMITS);
    if whole != split {
        return Err(format!("split scanning differs: {whole:?} vs {split:?}"));
    }
    let pre_auth = FUZZ_LIMITS.unauthenticated();
    let pre = scan_all(Grammar::Command, bytes, bytes.len(), pre_auth);
    let pre_split = scan_all(Grammar::Command, bytes, step, pre_auth);
    if pre != pre_split {
        return Err(format!("split scanning before authentication differs: {pre:?} vs {pre_split:?}"));
    }
    if !whole.0.starts_with(&pre.0) || (!pre.1 && pre != whole) {
        return Err(format!("the limits before authentication accept what others refuse: {pre:?} vs {whole:?}"));
    }
    let mut start = 0;
    for len in &pre.0 {
        let req = Request::decode(bytes::Bytes::copy_from_slice(&bytes[start..start + len]))
            .map_err(|e| format!("a command scanned before authentication does not decode: {e}"))?;
        start += len;
        if req.args().len() > Limits::UNAUTHENTICATED_ARGS
            || req.args().iter().any(|a| a.len() > Limits::UNAUTHENTICATED_BULK)
        {
            return Err(format!("{} arguments accepted before authentication", req.args().len()));
        }
    }
    let mut start = 0;
    for len in whole.0 {
        let raw = bytes::Bytes::copy_from_slice(&bytes[start..start + len]);
        start += len;
        let req = Request::decode(raw).map_err(|e| format!("a scanned command does not decode: {e}"))?;
        let again = Request::from_args(req.args().to_vec());
        let rescanned = scan_all(Grammar::Command, again.raw(), again.raw().len(), FUZZ_LIMITS);
        if rescanned.0 != [again.raw().len()] || rescanned.1 {
            return Err(format!("re-encoded {:?} does not scan as one command", req.args()));
        }
        let back = Request::decode(again.raw().clone()).map_err(|e| format!("re-encoded command: {e}"))?;
        if back.args() != req.args() {
            return Err(format!("{:?} re-encoded decodes as {:?}", req.args(), back.args()));
        }
        let _ = req.command();
        for arg in req.args() {
            if let Ok(key) = std::str::from_utf8(arg) {
                check_app_cache_key(key)?;
            }
        }
    }
    Ok(())
}

/// Scans `bytes` as replies from a Redis server and checks that scanning at once and in pieces
/// (split where the first byte says) finds the same frames, and that each frame rescans alone
/// to its own length. Tighter bounds on elements and string lengths find the same frames in
/// pieces and at once, and the first of those found without them.
///
/// # Errors
///
/// A description of the broken invariant: a bug.
pub fn check_resp_reply(bytes: &[u8]) -> Result<(), String> {
    use crate::resp::{Grammar, Limits, Scanner};
    let whole = scan_all(Grammar::Reply, bytes, bytes.len(), FUZZ_LIMITS);
    let step = usize::from(bytes.first().copied().unwrap_or(1)).max(1);
    let split = scan_all(Grammar::Reply, bytes, step, FUZZ_LIMITS);
    if whole != split {
        return Err(format!("split scanning differs: {whole:?} vs {split:?}"));
    }
    let tight = Limits { max_elements: 4, max_bulk: 8, ..FUZZ_LIMITS };
    let bounded = scan_all(Grammar::Reply, bytes, bytes.len(), tight);
    if bounded != scan_all(Grammar::Reply, bytes, step, tight) {
        return Err(format!("split scanning within tighter bounds differs from {bounded:?}"));
    }
    if !whole.0.starts_with(&bounded.0) || (!bounded.1 && bounded != whole) {
        return Err(format!("tighter bounds accept what others refuse: {bounded:?} vs {whole:?}"));
    }
    let mut start = 0;
    for len in whole.0 {
        let frame = &bytes[start..start + len];
        start += len;
        let mut alone = Scanner::new(Grammar::Reply, Limits::default());
        match alone.scan(frame) {
            Ok(Some(f)) if f.len == len => {}
            other => return Err(format!("frame {frame:?} rescans as {other:?}")),
        }
    }
    Ok(())
}

/// Small limits, so that fuzzed inputs reach them.
const FUZZ_LIMITS: crate::resp::Limits = crate::resp::Limits {
    max_frame_bytes: 1 << 16,
    max_depth: 8,
    max_line: 256,
    max_elements: usize::MAX,
    max_bulk: usize::MAX,
};

/// Frames found in `bytes` fed `step` bytes at a time within `limits`, and whether scanning
/// stopped at an error.
fn scan_all(
    grammar: crate::resp::Grammar,
    bytes: &[u8],
    step: usize,
    limits: crate::resp::Limits,
) -> (Vec<usize>, bool) {
    use crate::resp::Scanner;
    let mut scanner = Scanner::new(grammar, limits);
    let (mut frames, mut start, mut end) = (Vec::new(), 0, 0);
    while end < bytes.len() {
        end = (end + step).min(bytes.len());
        loop {
            match scanner.scan(&bytes[start..end]) {
                Ok(Some(f)) => {
                    frames.push(f.len);
                    start += f.len;
                }
                Ok(None) => break,
                Err(_) => return (frames, true),
            }
        }
    }
    (frames, false)
}

/// Parses `key` as an Argo CD application cache key and checks that the agent's form of it
/// ([`crate::payload::strip_app_namespace`]) is the same kind of key for the same Application,
/// without a namespace.
///
/// # Errors
///
/// A description of the broken invariant: a bug.
pub fn check_app_cache_key(key: &str) -> Result<(), String> {
    use crate::payload::{AppCacheKey, strip_app_namespace};
    let stripped = strip_app_namespace(key);
    match AppCacheKey::parse(key) {
        None => {
            if stripped != key {
                return Err(format!("{key:?} is no app key but was rewritten to {stripped:?}"));
            }
        }
        Some(parsed) => {
            let again =
                AppCacheKey::parse(&stripped).ok_or_else(|| format!("{stripped:?} (from {key:?}) no longer parses"))?;
            if (again.kind, again.name, again.gzip, again.namespace) != (parsed.kind, parsed.name, parsed.gzip, None) {
                return Err(format!("{key:?} -> {parsed:?}, stripped {stripped:?} -> {again:?}"));
            }
        }
    }
    Ok(())
}

/// Runs the resource-tree namespace rewrite ([`crate::resp::tree`]) over `bytes` (gzip when the
/// first byte is odd) and checks that a rewritten tree is valid (gzipped) JSON that a second
/// rewrite leaves alone.
///
/// # Errors
///
/// A description of the broken invariant: a bug.
pub fn check_tree_rewrite(bytes: &[u8]) -> Result<(), String> {
    use crate::resp::tree::rewrite_app_namespaces;
    let Some((&first, value)) = bytes.split_first() else { return Ok(()) };
    let gzip = first & 1 == 1;
    let Ok(Some(out)) = rewrite_app_namespaces(value, gzip, "agent-x", 1 << 20) else { return Ok(()) };
    match rewrite_app_namespaces(&out, gzip, "agent-x", 1 << 20) {
        Ok(None) => Ok(()),
        other => Err(format!("a rewritten tree rewrites again or fails: {other:?}")),
    }
}

/// Checks what the pod-log and terminal paths parse from untrusted peers: the log bytes an agent
/// (or the API server behind it) streams, through [`crate::payload::loglines::LogLines`] cut into
/// arbitrary chunks, and a client's `pods/exec` frame and subprotocol offer
/// ([`crate::remotecommand`]). The first byte picks follow/timestamps and where chunks are cut.
/// Nothing may panic; lines are only ever dropped or shortened (timestamps removed), never made
/// up; untracked logs pass unchanged; a close frame exists only in v5.
///
/// # Errors
///
/// A description of the broken invariant: a bug.
pub fn check_pod_streams(bytes: &[u8]) -> Result<(), String> {
    use crate::payload::ContainerLogRequest;
    use crate::payload::loglines::LogLines;
    use crate::remotecommand::{self, ClientFrame};
    let Some((&first, data)) = bytes.split_first() else { return Ok(()) };
    let request =
        ContainerLogRequest { follow: first & 1 == 1, timestamps: first & 2 == 2, ..ContainerLogRequest::default() };
    let mut lines = LogLines::new(&request);
    let cut = usize::from(first >> 2).max(1);
    let mut out = Vec::new();
    for (i, chunk) in data.chunks(cut).enumerate() {
        if i == 3 {
            lines.resuming();
        }
        out.extend(lines.push(chunk));
    }
    out.extend(lines.finish());
    if out.len() > data.len() {
        return Err(format!("{} bytes out of {} in", out.len(), data.len()));
    }
    if !lines.tracks() && out != data {
        return Err("an untracked log was changed".to_owned());
    }
    for v5 in [true, false] {
        if let Ok(ClientFrame::Close(_)) = remotecommand::parse_client_frame(data, v5)
            && !v5
        {
            return Err("a close frame in v4".to_owned());
        }
    }
    let text = String::from_utf8_lossy(data);
    match remotecommand::negotiate([text.as_ref()]) {
        None | Some(remotecommand::V5 | remotecommand::V4) => Ok(()),
        Some(other) => Err(format!("negotiated {other:?}")),
    }
}

/// Decodes `bytes` as a `replicationapi.ReplicatedEvent` from an HA peer and reads it as a
/// replica does ([`crate::replication::decode`]), checking: a change to apply, encoded again by
/// the active's encoder ([`crate::replication::encode`]), reads back as the same change (with
/// the agent's mode as the encoder sets it); and its event goes through payload decoding.
///
/// # Errors
///
/// A description of the broken invariant: a bug.
pub fn check_replication_decode(bytes: &[u8]) -> Result<(), String> {
    use crate::event::AttributeValue;
    use crate::replication::{self, Decoded, MODE_EXTENSION};
    let Ok(rep) = crate::pb::replicationapi::ReplicatedEvent::decode(bytes) else { return Ok(()) };
    let (seq, at) = (rep.sequence_num, rep.processed_at_unix);
    let Ok(Decoded::Apply(change)) = replication::decode(rep) else { return Ok(()) };
    let _ = change.event.payload();
    let mode = change.mode.unwrap_or_default();
    let again = replication::encode(&change.agent, mode, &change.event, seq, at);
    let reread = replication::decode(
        crate::pb::replicationapi::ReplicatedEvent::decode(again.encode_to_vec().as_slice())
            .map_err(|e| format!("a re-encoded replicated event is not protobuf: {e}"))?,
    )
    .map_err(|e| format!("a re-encoded replicated event does not decode: {e}"))?;
    let mut expected = change.clone();
    expected.mode = Some(mode);
    expected.event.extensions.insert(MODE_EXTENSION.to_owned(), AttributeValue::String(mode.to_string()));
    match reread {
        Decoded::Apply(back) if *back == *expected => Ok(()),
        other => Err(format!("{change:?} re-encoded reads as {other:?}")),
    }
}

/// Decodes `bytes` as a cluster info value from a spoke's Argo CD Redis, plain and gzipped, as
/// the agent reads it ([`crate::argocd::cluster_info::decode`]), checking: whatever it accepts,
/// written again as Argo CD writes it ([`crate::argocd::cluster_info::encode`]), reads back, and
/// once written (times in whole seconds, as Go writes them) reads back the same, plain and
/// gzipped.
///
/// # Errors
///
/// A description of the broken invariant: a bug.
pub fn check_cluster_info_decode(bytes: &[u8]) -> Result<(), String> {
    use crate::argocd::cluster_info::{decode, encode};
    for gzip in [false, true] {
        let Ok(info) = decode(bytes, gzip) else { continue };
        let written = decode(&encode(&info, false), false)
            .map_err(|e| format!("{info:?}, written as Argo CD writes it, does not read back: {e}"))?;
        for again_gzip in [false, true] {
            let again = decode(&encode(&written, again_gzip), again_gzip)
                .map_err(|e| format!("{written:?} (gzip: {again_gzip}) does not read back: {e}"))?;
            if again != written {
                return Err(format!("{written:?} (gzip: {again_gzip}) reads back as {again:?}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod resp_fuzz_tests {
    use super::*;

    #[test]
    fn resp_fuzz_logic_over_real_vectors_and_mutations() {
        let vectors: [&[u8]; 6] = [
            include_bytes!("resp/vectors/resp2-subscribe-client.bin"),
            include_bytes!("resp/vectors/resp3-assorted-client.bin"),
            include_bytes!("resp/vectors/resp3-subscribe-server.bin"),
            include_bytes!("resp/vectors/resp3-assorted-server.bin"),
            include_bytes!("resp/vectors/resp2-mget-server.bin"),
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        ];
        for v in vectors {
            for cut in 0..v.len() {
                let mut m = v.to_vec();
                m[cut] = m[cut].wrapping_add(1);
                for input in [&v[..cut], &m[..]] {
                    check_resp_command(input).expect("command invariants");
                    check_resp_reply(input).expect("reply invariants");
                    check_tree_rewrite(input).expect("tree invariants");
                }
            }
        }
        check_tree_rewrite(br#" {"nodes":[{"group":"argoproj.io","kind":"Application","namespace":"argocd"}]}"#)
            .expect("tree invariants");
    }

    #[test]
    fn pod_stream_fuzz_logic_over_kubelet_and_kubectl_shapes_and_mutations() {
        // Kubelet log lines (RFC 3339 with nanoseconds, trailing zeros trimmed), a line without
        // a timestamp, a partial last line; kubectl 1.37's exec frames (stdin, a resize, v5's
        // close of stdin) and its subprotocol offer.
        let vectors: [&[u8]; 6] = [
            b"\x032026-11-28T08:28:35.012345678Z tick 1\n2026-11-28T08:28:35.1Z tick 2\nno timestamp\n2026-11-28T08:28:36Z par",
            b"\x07\x002026-11-28T08:28:35Z a\n2026-11-28T08:28:35Z a\n",
            b"\x00\x00ls -la\n",
            b"\x00\x04{\"Width\":120,\"Height\":40}",
            b"\x00\xff\x00",
            b"\x00v4.channel.k8s.io, v5.channel.k8s.io",
        ];
        for v in vectors {
            for cut in 0..v.len() {
                let mut m = v.to_vec();
                m[cut] = m[cut].wrapping_add(1);
                for input in [&v[..cut], &m[..]] {
                    check_pod_streams(input).expect("pod stream invariants");
                }
            }
        }
    }
}
