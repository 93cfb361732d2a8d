//! Pod-log lines as they pass between the API server and the client, on the agent and on the
//! principal: in follow mode each line's kubelet timestamp is remembered (to resume from the
//! last line after a break) and removed again when the client did not ask for it; after a
//! resume, lines at or before the last one seen are repeats and are dropped. So a follower
//! sees every line once, in order, across a reconnect.

use jiff::Timestamp;

use super::ContainerLogRequest;

/// A partial line longer than this is passed on without looking for its timestamp.
pub const MAX_LINE: usize = 1 << 20;

/// The lines of one log request (see the module docs).
#[derive(Debug, Default)]
pub struct LogLines {
    /// Timestamps are tracked (Kubernetes is asked for them).
    track: bool,
    /// The client did not ask for timestamps: they are removed.
    strip: bool,
    /// A line not yet complete.
    partial: Vec<u8>,
    /// The timestamp of the last line passed on.
    last: Option<Timestamp>,
    /// After a resume: lines up to this one are repeats.
    repeat_until: Option<Timestamp>,
    /// Lines passed on.
    count: u64,
}

impl LogLines {
    /// The lines of `request`: tracked in follow mode without `limitBytes` (timestamps would
    /// change what the byte limit counts).
    #[must_use]
    pub fn new(request: &ContainerLogRequest) -> Self {
        let track = request.follow && request.limit_bytes.is_none();
        Self { track, strip: track && !request.timestamps, ..Self::default() }
    }

    /// Whether timestamps are tracked.
    #[must_use]
    pub fn tracks(&self) -> bool {
        self.track
    }

    /// `request` as it is asked of Kubernetes (or of the agent): with timestamps when tracked.
    #[must_use]
    pub fn wire_request(&self, request: &ContainerLogRequest) -> ContainerLogRequest {
        ContainerLogRequest { timestamps: request.timestamps || self.track, ..request.clone() }
    }

    /// The timestamp of the last line passed on.
    #[must_use]
    pub fn last(&self) -> Option<Timestamp> {
        self.last
    }

    /// Lines passed on so far.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// After a resume: lines up to the last one seen are dropped; a partial line is dropped too
    /// (it comes again, whole).
    pub fn resuming(&mut self) {
        self.repeat_until = self.last;
        self.partial.clear();
    }

    /// The bytes of `data` to pass on.
    pub fn push(&mut self, data: &[u8]) -> Vec<u8> {
        if !self.track {
            self.count += data.iter().filter(|&&b| b == b'\n').count() as u64;
            return data.to_vec();
        }
        self.partial.extend_from_slice(data);
        let mut out = Vec::with_capacity(self.partial.len());
        let mut start = 0;
        while let Some(nl) = self.partial[start..].iter().position(|&b| b == b'\n') {
            let end = start + nl + 1;
            let line = self.partial[start..end].to_vec();
            self.line(&line, &mut out);
            start = end;
        }
        self.partial.drain(..start);
        if self.partial.len() > MAX_LINE {
            out.append(&mut self.partial);
        }
        out
    }

    /// What is left at the end (a last line without a newline).
    pub fn finish(&mut self) -> Vec<u8> {
        let rest = std::mem::take(&mut self.partial);
        let mut out = Vec::new();
        if !rest.is_empty() {
            self.line(&rest, &mut out);
        }
        out
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<u8>) {
        let Some((ts, rest)) = split_timestamp(line) else {
            self.count += 1;
            out.extend_from_slice(line);
            return;
        };
        if let Some(until) = self.repeat_until {
            if ts <= until {
                return;
            }
            self.repeat_until = None;
        }
        self.last = Some(ts);
        self.count += 1;
        out.extend_from_slice(if self.strip { rest } else { line });
    }
}

/// A kubelet log line's leading RFC 3339 timestamp and the rest after its space.
#[must_use]
pub fn split_timestamp(line: &[u8]) -> Option<(Timestamp, &[u8])> {
    let space = line.iter().take(40).position(|&b| b == b' ')?;
    let ts: Timestamp = std::str::from_utf8(&line[..space]).ok()?.parse().ok()?;
    Some((ts, &line[space + 1..]))
}

/// `t` down to its whole second. `sinceTime` has whole seconds on the wire, and kube-rs rounds
/// to the *nearest* one: from 10:00:00.6 it would ask from 10:00:01 and lose the lines of the
/// 0.4 s between. Asked from 10:00:00 instead, the repeats are dropped by [`LogLines`].
#[must_use]
pub fn whole_second(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second() - i64::from(t.subsec_nanosecond() < 0)).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow() -> ContainerLogRequest {
        ContainerLogRequest { uuid: "u".into(), follow: true, ..ContainerLogRequest::default() }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a time")
    }

    #[test]
    fn timestamps_are_tracked_in_follow_mode_and_stripped_when_not_wanted() {
        let req = follow();
        let mut lines = LogLines::new(&req);
        assert!(lines.tracks() && lines.wire_request(&req).timestamps);
        assert_eq!(lines.push(b"2024-05-01T10:00:00.1Z one\n2024-05-01T10:00:00.12Z tw"), b"one\n");
        assert_eq!(lines.push(b"o\n"), b"two\n");
        assert_eq!(lines.last(), Some(at("2024-05-01T10:00:00.12Z")));
        assert_eq!(lines.push(b"no timestamp\n"), b"no timestamp\n");
        assert_eq!(lines.push(b"2024-05-01T10:00:01Z last"), b"");
        assert_eq!(lines.finish(), b"last");
        assert_eq!(lines.count(), 4);

        let wanted = ContainerLogRequest { timestamps: true, ..follow() };
        assert_eq!(LogLines::new(&wanted).push(b"2024-05-01T10:00:00Z a\n"), b"2024-05-01T10:00:00Z a\n");
        let once = ContainerLogRequest { follow: false, ..follow() };
        let mut plain = LogLines::new(&once);
        assert!(!plain.tracks() && !plain.wire_request(&once).timestamps);
        assert_eq!(plain.push(b"as is\nand this\n"), b"as is\nand this\n");
        assert_eq!(plain.count(), 2);
        let limited = ContainerLogRequest { limit_bytes: Some(10), ..follow() };
        assert!(!LogLines::new(&limited).wire_request(&limited).timestamps, "timestamps would change the limit");
    }

    #[test]
    fn after_a_resume_repeats_and_the_partial_line_are_dropped() {
        let req = follow();
        let mut lines = LogLines::new(&req);
        assert_eq!(
            lines.push(b"2024-05-01T10:00:00.1Z 1\n2024-05-01T10:00:00.7Z 2\n2024-05-01T10:00:00.8Z par"),
            b"1\n2\n"
        );
        lines.resuming();
        // Asked again from the whole second: 1 and 2 are repeats; the partial line comes whole.
        let again = b"2024-05-01T10:00:00.1Z 1\n2024-05-01T10:00:00.7Z 2\n2024-05-01T10:00:00.8Z part\n";
        assert_eq!(lines.push(again), b"part\n");
        assert_eq!(
            lines.push(b"2024-05-01T10:00:00.8Z same instant\n"),
            b"same instant\n",
            "only up to the resume point"
        );
        assert_eq!(lines.count(), 4);
    }

    #[test]
    fn resumes_ask_from_the_whole_second_before() {
        assert_eq!(whole_second(at("2024-05-01T10:00:00.7Z")), at("2024-05-01T10:00:00Z"));
        assert_eq!(whole_second(at("2024-05-01T10:00:00Z")), at("2024-05-01T10:00:00Z"));
        assert_eq!(whole_second(at("1969-12-31T23:59:59.5Z")), at("1969-12-31T23:59:59Z"));
    }

    #[test]
    fn only_a_leading_rfc3339_token_is_a_timestamp() {
        assert_eq!(split_timestamp(b"2024-05-01T10:00:00Z x\n").map(|(_, r)| r), Some(&b"x\n"[..]));
        assert!(split_timestamp(b"hello world\n").is_none());
        assert!(split_timestamp(b"2024-05-01T10:00:00Z\n").is_none(), "no space: not a kubelet line");
        assert!(split_timestamp(&[b'9'; 100]).is_none());
    }
}
