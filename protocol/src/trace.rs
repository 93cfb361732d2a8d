//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>) as carried in an event's
//! `traceparent` / `tracestate` extensions (upstream §2.3).
//!
//! The headers come from the peer, so they are untrusted: [`TraceParent::parse`] and
//! [`is_valid_tracestate`] accept exactly the W3C grammar and never fail loudly. An invalid
//! `traceparent` means "no parent" (the receiver starts a new trace), an invalid `tracestate`
//! is dropped; neither is an error for the event that carries it.
//!
//! This module knows nothing of OpenTelemetry; [`crate::otel`] (feature `otel`) connects it to
//! `tracing` spans.

use std::fmt;

use crate::event::TraceContext;

/// The longest `tracestate` accepted (the W3C recommends propagating at least 512 characters;
/// anything much longer from a peer is refused rather than passed on).
pub const MAX_TRACESTATE_LEN: usize = 512;
/// The most list members a `tracestate` may have (W3C).
pub const MAX_TRACESTATE_MEMBERS: usize = 32;

/// Flag bit `sampled` of `trace-flags`.
pub const FLAG_SAMPLED: u8 = 0x01;

/// A parsed `traceparent`: which trace, which span is the parent, and the trace flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// `trace-id`: 16 bytes, never all zero.
    pub trace_id: [u8; 16],
    /// `parent-id` (the sender's span id): 8 bytes, never all zero.
    pub parent_id: [u8; 8],
    /// `trace-flags`.
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` header value.
    ///
    /// Version `00` must be exactly `00-<32 hex>-<16 hex>-<2 hex>`; a higher version (but not
    /// `ff`) may carry more after a `-`, which is ignored (W3C §3.2.4, forward compatibility).
    /// Hex must be lower case, and neither id may be all zeros. `None` for anything else.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let b = text.as_bytes();
        if b.len() < 55 {
            return None;
        }
        let version = hex_byte(&b[0..2])?;
        if version == 0xff || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        match (version, b.len()) {
            (0, 55) => {}
            (0, _) => return None,
            (_, 55) => {}
            (_, _) if b[55] == b'-' => {}
            _ => return None,
        }
        let mut trace_id = [0u8; 16];
        for (i, out) in trace_id.iter_mut().enumerate() {
            *out = hex_byte(&b[3 + 2 * i..5 + 2 * i])?;
        }
        let mut parent_id = [0u8; 8];
        for (i, out) in parent_id.iter_mut().enumerate() {
            *out = hex_byte(&b[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&b[53..55])?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self { trace_id, parent_id, flags })
    }

    /// Whether the sender sampled (recorded) its span.
    #[must_use]
    pub fn sampled(&self) -> bool {
        self.flags & FLAG_SAMPLED != 0
    }

    /// The trace id as 32 lower-case hex digits.
    #[must_use]
    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }
}

impl fmt::Display for TraceParent {
    /// The version `00` header (what we send, whatever version arrived).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{}-{}-{:02x}", hex::encode(self.trace_id), hex::encode(self.parent_id), self.flags)
    }
}

/// One lower-case hex byte; `None` for anything else (upper case included, as the W3C says).
fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    match two {
        [hi, lo] => Some((digit(*hi)? << 4) | digit(*lo)?),
        _ => None,
    }
}

/// Whether `text` is a valid `tracestate`: at most [`MAX_TRACESTATE_MEMBERS`] comma-separated
/// `key=value` members (optional spaces and tabs around each, empty members allowed), keys
/// unique, at most [`MAX_TRACESTATE_LEN`] bytes in all.
#[must_use]
pub fn is_valid_tracestate(text: &str) -> bool {
    if text.len() > MAX_TRACESTATE_LEN {
        return false;
    }
    let mut keys: Vec<&str> = Vec::new();
    for member in text.split(',') {
        let member = member.trim_matches(|c| c == ' ' || c == '\t');
        if member.is_empty() {
            continue;
        }
        let Some((key, value)) = member.split_once('=') else { return false };
        if !valid_key(key) || !valid_value(value) || keys.contains(&key) {
            return false;
        }
        keys.push(key);
        if keys.len() > MAX_TRACESTATE_MEMBERS {
            return false;
        }
    }
    true
}

/// `simple-key` or `tenant-id@system-id` (W3C §3.3.1.3.1).
fn valid_key(key: &str) -> bool {
    let rest_ok = |s: &[u8]| {
        s.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-' | b'*' | b'/'))
    };
    match key.split_once('@') {
        None => {
            let b = key.as_bytes();
            (1..=256).contains(&b.len()) && b[0].is_ascii_lowercase() && rest_ok(&b[1..])
        }
        Some((tenant, system)) => {
            let (t, s) = (tenant.as_bytes(), system.as_bytes());
            (1..=241).contains(&t.len())
                && (t[0].is_ascii_lowercase() || t[0].is_ascii_digit())
                && rest_ok(&t[1..])
                && (1..=14).contains(&s.len())
                && s[0].is_ascii_lowercase()
                && rest_ok(&s[1..])
        }
    }
}

/// `0*255(chr) nblk-chr` with `chr = %x20 / nblk-chr`, `nblk-chr = %x21-2B / %x2D-3C / %x3E-7E`.
fn valid_value(value: &str) -> bool {
    let b = value.as_bytes();
    let nblk = |c: u8| matches!(c, 0x21..=0x2b | 0x2d..=0x3c | 0x3e..=0x7e);
    match b.split_last() {
        None => false,
        Some((last, rest)) => b.len() <= 256 && nblk(*last) && rest.iter().all(|c| *c == b' ' || nblk(*c)),
    }
}

impl TraceContext {
    /// The parsed `traceparent`; `None` when absent or invalid.
    #[must_use]
    pub fn parent(&self) -> Option<TraceParent> {
        self.traceparent.as_deref().and_then(TraceParent::parse)
    }

    /// The `tracestate` if it is valid and goes with a valid `traceparent` (W3C: without a
    /// parent the state means nothing).
    #[must_use]
    pub fn state(&self) -> Option<&str> {
        self.parent()?;
        self.tracestate.as_deref().filter(|s| !s.trim().is_empty() && is_valid_tracestate(s))
    }

    /// The context to send for `parent` (our span) and its `tracestate`; an invalid or empty
    /// state is left out.
    #[must_use]
    pub fn from_parent(parent: &TraceParent, tracestate: Option<&str>) -> Self {
        Self {
            traceparent: Some(parent.to_string()),
            tracestate: tracestate.filter(|s| !s.trim().is_empty() && is_valid_tracestate(s)).map(str::to_owned),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_w3c_example() {
        let tp = TraceParent::parse(VALID).unwrap();
        assert_eq!(tp.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex::encode(tp.parent_id), "00f067aa0ba902b7");
        assert!(tp.sampled());
        assert_eq!(tp.to_string(), VALID);
        assert!(!TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap().sampled());
    }

    #[test]
    fn refuses_what_the_w3c_refuses() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn future_versions_keep_the_known_fields() {
        let tp = TraceParent::parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what-the-future-holds");
        let tp = tp.unwrap();
        assert_eq!(tp.flags, 0x09);
        assert_eq!(tp.to_string(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09");
        assert!(TraceParent::parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09").is_some());
    }

    #[test]
    fn tracestate_grammar() {
        for good in
            ["", "rojo=00f067aa0ba902b7", "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7", "a@b=1,,c=2", "t1@sys-x=v v"]
        {
            assert!(is_valid_tracestate(good), "{good:?}");
        }
        for bad in ["rojo", "Rojo=1", "rojo=", "a=1,a=2", "a=b=c", "a=1\u{e9}", "1a=1", "a@=1"] {
            assert!(!is_valid_tracestate(bad), "{bad:?}");
        }
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        assert!(!is_valid_tracestate(&many.join(",")));
        assert!(is_valid_tracestate(&many[..32].join(",")));
        assert!(!is_valid_tracestate(&format!("a={}", "x".repeat(MAX_TRACESTATE_LEN))));
    }

    #[test]
    fn context_drops_what_is_invalid() {
        let tc = TraceContext { traceparent: Some(VALID.into()), tracestate: Some("rojo=1".into()) };
        assert_eq!(tc.state(), Some("rojo=1"));
        let tc = TraceContext { traceparent: Some(VALID.into()), tracestate: Some("not valid".into()) };
        assert_eq!(tc.state(), None);
        let tc = TraceContext { traceparent: Some("garbage".into()), tracestate: Some("rojo=1".into()) };
        assert_eq!((tc.parent(), tc.state()), (None, None));
        let sent = TraceContext::from_parent(&TraceParent::parse(VALID).unwrap(), Some("bad state!"));
        assert_eq!(sent, TraceContext { traceparent: Some(VALID.into()), tracestate: None });
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(s in ".{0,80}", t in ".{0,600}") {
            let _ = TraceParent::parse(&s);
            let _ = is_valid_tracestate(&t);
            let tc = TraceContext { traceparent: Some(s), tracestate: Some(t) };
            let _ = tc.state();
        }

        #[test]
        fn near_misses_never_panic(s in "[0-9a-fA-F-]{50,60}") {
            if let Some(tp) = TraceParent::parse(&s) {
                // Whatever parses re-parses from its own rendering to the same value.
                prop_assert_eq!(TraceParent::parse(&tp.to_string()), Some(tp));
            }
        }

        #[test]
        fn round_trips(trace_id in any::<[u8; 16]>(), parent_id in any::<[u8; 8]>(), flags in any::<u8>()) {
            let tp = TraceParent { trace_id, parent_id, flags };
            let parsed = TraceParent::parse(&tp.to_string());
            if trace_id == [0; 16] || parent_id == [0; 8] {
                prop_assert_eq!(parsed, None);
            } else {
                prop_assert_eq!(parsed, Some(tp));
            }
        }
    }
}
