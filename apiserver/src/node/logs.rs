//! Container logs: a bounded in-memory log per container instance, the kubelet's log options
//! (`tailLines`, `sinceTime`, `sinceSeconds`, `limitBytes`, `timestamps`, `previous`, `follow`)
//! and `GET pods/{name}/log`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use http::{HeaderValue, StatusCode, header};
use tokio::sync::{mpsc, watch};

use crate::error::{ApiError, ApiResult};

/// Most log bytes kept per container instance; the oldest lines go first.
pub const MAX_LOG_BYTES: usize = 4 * 1024 * 1024;
/// Longest line kept as one line; longer output is split (as the kubelet does at 16 KiB).
pub const MAX_LINE_BYTES: usize = 16 * 1024;

/// One line of output (with its newline, unless the process ended mid-line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// When the line was read.
    pub time: DateTime<Utc>,
    /// The bytes.
    pub data: Bytes,
}

#[derive(Debug, Default)]
struct Buffer {
    lines: VecDeque<LogLine>,
    bytes: usize,
    /// Sequence number of `lines[0]` (lines dropped so far).
    first_seq: u64,
    ended: bool,
}

/// The log of one run of a container: what it wrote to stdout and stderr, interleaved.
#[derive(Debug)]
pub struct LogInstance {
    buf: Mutex<Buffer>,
    changed: watch::Sender<u64>,
    limit: usize,
}

impl Default for LogInstance {
    fn default() -> Self {
        Self::with_limit(MAX_LOG_BYTES)
    }
}

impl LogInstance {
    /// An empty log keeping at most `limit` bytes.
    #[must_use]
    pub fn with_limit(limit: usize) -> Self {
        Self { buf: Mutex::default(), changed: watch::channel(0).0, limit: limit.max(1) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buffer> {
        self.buf.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Append a line, dropping the oldest lines above the limit.
    pub fn push(&self, time: DateTime<Utc>, data: Bytes) {
        let data = if data.len() > self.limit { data.slice(data.len() - self.limit..) } else { data };
        let next = {
            let mut b = self.lock();
            b.bytes += data.len();
            b.lines.push_back(LogLine { time, data });
            while b.bytes > self.limit {
                let Some(old) = b.lines.pop_front() else { break };
                b.bytes -= old.data.len();
                b.first_seq += 1;
            }
            b.first_seq + b.lines.len() as u64
        };
        self.changed.send_replace(next);
    }

    /// The instance is over: followers stop after the last line.
    pub fn end(&self) {
        self.lock().ended = true;
        self.changed.send_modify(|_| {});
    }

    /// Whether [`Self::end`] was called.
    #[must_use]
    pub fn ended(&self) -> bool {
        self.lock().ended
    }

    /// Lines from sequence number `seq` on (from the oldest kept, if `seq` was dropped), the
    /// sequence number after them, and whether the instance has ended.
    #[must_use]
    pub fn read_from(&self, seq: u64) -> (Vec<LogLine>, u64, bool) {
        let b = self.lock();
        let skip = usize::try_from(seq.saturating_sub(b.first_seq)).unwrap_or(usize::MAX);
        let lines: Vec<LogLine> = b.lines.iter().skip(skip).cloned().collect();
        (lines, b.first_seq + b.lines.len() as u64, b.ended)
    }

    /// Sequence number of the oldest kept line.
    #[must_use]
    pub fn first_seq(&self) -> u64 {
        self.lock().first_seq
    }

    /// Bytes kept.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Changes whenever a line is added or the instance ends.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// Splits a byte stream into lines (bounded length) for a [`LogInstance`].
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    /// Feed bytes; complete lines go to `out`.
    pub fn feed(&mut self, mut data: &[u8], out: &LogInstance) {
        while !data.is_empty() {
            let room = MAX_LINE_BYTES - self.partial.len();
            let take = data.iter().take(room).position(|b| *b == b'\n').map(|i| i + 1);
            match take {
                Some(n) => {
                    self.partial.extend_from_slice(&data[..n]);
                    data = &data[n..];
                    out.push(Utc::now(), Bytes::from(std::mem::take(&mut self.partial)));
                }
                None => {
                    let n = room.min(data.len());
                    self.partial.extend_from_slice(&data[..n]);
                    data = &data[n..];
                    if self.partial.len() >= MAX_LINE_BYTES {
                        out.push(Utc::now(), Bytes::from(std::mem::take(&mut self.partial)));
                    }
                }
            }
        }
    }

    /// The stream ended: keep what is left of the last line.
    pub fn finish(&mut self, out: &LogInstance) {
        if !self.partial.is_empty() {
            out.push(Utc::now(), Bytes::from(std::mem::take(&mut self.partial)));
        }
    }
}

/// The `PodLogOptions` of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// `container`.
    pub container: Option<String>,
    /// `follow`.
    pub follow: bool,
    /// `previous`: the log of the container's previous instance.
    pub previous: bool,
    /// `timestamps`: prefix each line with its RFC 3339 time (nanoseconds) and a space.
    pub timestamps: bool,
    /// `sinceSeconds`.
    pub since_seconds: Option<i64>,
    /// `sinceTime`.
    pub since_time: Option<DateTime<Utc>>,
    /// `tailLines`.
    pub tail_lines: Option<i64>,
    /// `limitBytes`.
    pub limit_bytes: Option<i64>,
}

fn parse_bool(name: &str, v: &str) -> ApiResult<bool> {
    match v {
        "" | "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(ApiError::bad_request(format!("{name}: invalid value {v:?}: must be true or false"))),
    }
}

fn parse_int(name: &str, v: &str) -> ApiResult<i64> {
    v.parse().map_err(|_| ApiError::bad_request(format!("{name}: invalid value {v:?}: must be an integer")))
}

/// Parse and validate the query of a log request.
///
/// # Errors
/// 400 naming the parameter that is malformed or out of range.
pub fn parse_log_query(query: Option<&str>) -> ApiResult<LogOptions> {
    let mut o = LogOptions::default();
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "container" if !v.is_empty() => o.container = Some(v.into_owned()),
            "follow" => o.follow = parse_bool("follow", &v)?,
            "previous" => o.previous = parse_bool("previous", &v)?,
            "timestamps" => o.timestamps = parse_bool("timestamps", &v)?,
            "sinceSeconds" => o.since_seconds = Some(parse_int("sinceSeconds", &v)?),
            "tailLines" => o.tail_lines = Some(parse_int("tailLines", &v)?),
            "limitBytes" => o.limit_bytes = Some(parse_int("limitBytes", &v)?),
            "sinceTime" => {
                let t = DateTime::parse_from_rfc3339(&v).map_err(|e| {
                    ApiError::bad_request(format!("sinceTime: invalid value {v:?}: not an RFC 3339 time: {e}"))
                })?;
                o.since_time = Some(t.with_timezone(&Utc));
            }
            _ => {}
        }
    }
    if o.since_seconds.is_some() && o.since_time.is_some() {
        return Err(ApiError::bad_request("at most one of `sinceTime` or `sinceSeconds` may be specified"));
    }
    if o.since_seconds.is_some_and(|s| s < 1) {
        return Err(ApiError::bad_request("sinceSeconds: Invalid value: must be greater than 0"));
    }
    if o.tail_lines.is_some_and(|n| n < 0) {
        return Err(ApiError::bad_request("tailLines: Invalid value: must be greater than or equal to 0"));
    }
    if o.limit_bytes.is_some_and(|n| n < 1) {
        return Err(ApiError::bad_request("limitBytes: Invalid value: must be greater than 0"));
    }
    Ok(o)
}

impl LogOptions {
    /// The earliest time of a line shown, if limited.
    #[must_use]
    pub fn since(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.since_time.or_else(|| self.since_seconds.map(|s| now - chrono::Duration::seconds(s.min(1 << 40))))
    }

    /// Index of the first line to show among `len` kept lines (`tailLines`).
    #[must_use]
    pub fn tail_start(&self, len: usize) -> usize {
        match self.tail_lines {
            Some(n) => len.saturating_sub(usize::try_from(n).unwrap_or(usize::MAX)),
            None => 0,
        }
    }
}

/// Renders lines under the options: time filter, timestamps, and the byte limit.
#[derive(Debug)]
pub struct Renderer {
    since: Option<DateTime<Utc>>,
    timestamps: bool,
    remaining: Option<u64>,
}

impl Renderer {
    /// A renderer for a request made at `now`.
    #[must_use]
    pub fn new(o: &LogOptions, now: DateTime<Utc>) -> Self {
        Self {
            since: o.since(now),
            timestamps: o.timestamps,
            remaining: o.limit_bytes.map(|n| u64::try_from(n).unwrap_or(0)),
        }
    }

    /// Whether the byte limit is used up (a follower stops).
    #[must_use]
    pub fn exhausted(&self) -> bool {
        self.remaining == Some(0)
    }

    /// Append what `line` shows as to `out`.
    pub fn render(&mut self, line: &LogLine, out: &mut Vec<u8>) {
        if self.exhausted() || self.since.is_some_and(|s| line.time < s) {
            return;
        }
        let start = out.len();
        if self.timestamps {
            out.extend_from_slice(line.time.to_rfc3339_opts(SecondsFormat::Nanos, true).as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(&line.data);
        if let Some(rem) = &mut self.remaining {
            let written = (out.len() - start) as u64;
            if written > *rem {
                out.truncate(start + usize::try_from(*rem).unwrap_or(0));
                *rem = 0;
            } else {
                *rem -= written;
            }
        }
    }
}

/// The body of a non-following log request over `lines`.
#[must_use]
pub fn render_all(lines: &[LogLine], o: &LogOptions, now: DateTime<Utc>) -> Vec<u8> {
    let mut r = Renderer::new(o, now);
    let mut out = Vec::new();
    for line in &lines[o.tail_start(lines.len())..] {
        r.render(line, &mut out);
    }
    out
}

/// Answer a log request from one container instance.
pub(crate) fn respond(inst: Arc<LogInstance>, o: &LogOptions, mut shutdown: watch::Receiver<bool>) -> Response {
    let now = Utc::now();
    let first = inst.first_seq();
    let (lines, _, _) = inst.read_from(first);
    let mut resp = if o.follow {
        let mut renderer = Renderer::new(o, now);
        let mut seq = first + o.tail_start(lines.len()) as u64;
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        let mut changes = inst.subscribe();
        tokio::spawn(async move {
            loop {
                changes.mark_unchanged();
                let (lines, next, ended) = inst.read_from(seq);
                let mut out = Vec::new();
                for l in &lines {
                    renderer.render(l, &mut out);
                }
                seq = next;
                if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
                    return;
                }
                if ended || renderer.exhausted() {
                    return;
                }
                tokio::select! {
                    c = changes.changed() => if c.is_err() { return },
                    _ = shutdown.changed() => return,
                    () = tx.closed() => return,
                }
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Response::new(Body::from_stream(futures::StreamExt::map(stream, Ok::<_, std::convert::Infallible>)))
    } else {
        Response::new(Body::from(render_all(&lines, o, now)))
    };
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 123_000_000).unwrap_or_default()
    }

    fn log(n: i64) -> Vec<LogLine> {
        (0..n).map(|i| LogLine { time: t(i), data: Bytes::from(format!("line {i}\n")) }).collect()
    }

    fn q(s: &str) -> LogOptions {
        parse_log_query(Some(s)).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn text(lines: &[LogLine], query: &str, now: DateTime<Utc>) -> String {
        String::from_utf8_lossy(&render_all(lines, &q(query), now)).into_owned()
    }

    #[test]
    fn tail_since_limit_and_timestamps() {
        let lines = log(5);
        let now = t(10);
        assert_eq!(text(&lines, "", now), "line 0\nline 1\nline 2\nline 3\nline 4\n");
        assert_eq!(text(&lines, "tailLines=2", now), "line 3\nline 4\n");
        assert_eq!(text(&lines, "tailLines=0", now), "");
        assert_eq!(text(&lines, "tailLines=99", now).lines().count(), 5);
        // sinceSeconds=7 at t(10): lines at t(3) and later.
        assert_eq!(text(&lines, "sinceSeconds=7", now), "line 3\nline 4\n");
        let since = t(2).to_rfc3339_opts(SecondsFormat::Nanos, true);
        assert_eq!(text(&lines, &format!("sinceTime={}", since.replace('+', "%2B")), now), "line 2\nline 3\nline 4\n");
        // Tail first, then the time filter (as the kubelet).
        assert_eq!(text(&lines, "tailLines=3&sinceSeconds=9", now), "line 2\nline 3\nline 4\n");
        assert_eq!(text(&lines, "limitBytes=10", now), "line 0\nlin");
        assert_eq!(text(&lines, "limitBytes=7", now), "line 0\n");
        let ts = text(&lines, "timestamps=true&tailLines=1", now);
        assert_eq!(ts, format!("{} line 4\n", t(4).to_rfc3339_opts(SecondsFormat::Nanos, true)));
        assert!(ts.starts_with("2027-01-15T08:00:04.123000000Z "), "{ts}");
    }

    #[test]
    fn bad_parameters_are_400() {
        for bad in [
            "tailLines=-1",
            "tailLines=x",
            "sinceSeconds=0",
            "limitBytes=0",
            "follow=maybe",
            "sinceTime=yesterday",
            "sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_log_query(Some(bad)).err().map(|e| e.code), Some(400), "{bad}");
        }
        let o = q("container=web&follow=true&previous=1&timestamps=false");
        assert_eq!(o.container.as_deref(), Some("web"));
        assert!(o.follow && o.previous && !o.timestamps);
        assert_eq!(q("sinceTime=2026-01-01T00:00:00Z").since_time.map(|t| t.timestamp()), Some(1_767_225_600));
    }

    #[test]
    fn the_buffer_is_bounded_and_readers_catch_up() {
        let inst = LogInstance::with_limit(20);
        for l in log(5) {
            inst.push(l.time, l.data);
        }
        // 7 bytes a line: only two fit in 20.
        assert_eq!(inst.bytes(), 14);
        assert_eq!(inst.first_seq(), 3);
        let (lines, next, ended) = inst.read_from(0);
        assert_eq!(lines.len(), 2);
        assert_eq!((next, ended), (5, false));
        let (lines, next, _) = inst.read_from(4);
        assert_eq!((lines.len(), next), (1, 5));
        inst.end();
        assert!(inst.read_from(5).2);
    }

    #[test]
    fn lines_are_split_and_kept_whole() {
        let inst = LogInstance::default();
        let mut s = LineSplitter::default();
        s.feed(b"a\nb", &inst);
        s.feed(b"c\n", &inst);
        s.feed(&vec![b'x'; MAX_LINE_BYTES + 5], &inst);
        s.finish(&inst);
        let (lines, _, _) = inst.read_from(0);
        let data: Vec<usize> = lines.iter().map(|l| l.data.len()).collect();
        assert_eq!(data, vec![2, 3, MAX_LINE_BYTES, 5]);
        assert_eq!(&lines[1].data[..], b"bc\n");
    }

    #[tokio::test]
    async fn previous_and_follow_stream_until_the_instance_ends() {
        let inst = Arc::new(LogInstance::default());
        inst.push(t(0), Bytes::from_static(b"first\n"));
        let (_stop_tx, stop) = watch::channel(false);
        let resp = respond(inst.clone(), &q("follow=true&tailLines=1"), stop);
        let i2 = inst.clone();
        tokio::spawn(async move {
            i2.push(Utc::now(), Bytes::from_static(b"second\n"));
            i2.end();
        });
        let body =
            tokio::time::timeout(std::time::Duration::from_secs(10), axum::body::to_bytes(resp.into_body(), 1 << 20))
                .await
                .expect("the follow ends with the instance")
                .expect("body");
        assert_eq!(&body[..], b"first\nsecond\n");
    }
}
