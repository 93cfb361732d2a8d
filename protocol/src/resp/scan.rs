//! Where one RESP frame ends, without decoding it: the boundary scanner of the Redis proxy.
//!
//! Replies from the hub's Redis are forwarded to the client byte for byte; the proxy only needs
//! to know where each one ends (to keep replies in the order of the commands) and whether it is
//! an out-of-band push. Commands from clients are scanned by the stricter grammar Redis itself
//! accepts for requests (an array of bulk strings), then decoded by `redis-protocol`.
//!
//! The scanner reads RESP2 and RESP3 alike (the union of both grammars: RESP2's `$-1` and
//! `*-1` nulls, RESP3's streamed strings and aggregates, attributes and pushes). It is
//! resumable: called again with more bytes, it continues where it stopped, so a large frame
//! arriving in many reads is scanned once, not once per read. It never recurses (nesting is an
//! explicit stack bounded by [`Limits::max_depth`]) and refuses a frame as soon as its
//! declared sizes exceed [`Limits::max_frame_bytes`], [`Limits::max_elements`] or
//! [`Limits::max_bulk`], so a peer cannot make the proxy buffer without bound: the refusal
//! comes from the header (`*11`, `$524288000`), before any byte of the body is read.
//!
//! [`Limits::unauthenticated`] are Redis's own bounds for a client that has not authenticated
//! (10 arguments of at most 16 KiB each, since Redis 6.2.6, CVE-2021-32675).

/// Bounds on one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame, headers included (default: Redis's own `proto-max-bulk-len`, 512 MiB).
    pub max_frame_bytes: usize,
    /// Deepest nesting of aggregates (default 32; Redis's replies nest a handful deep).
    pub max_depth: usize,
    /// Longest header or simple line (default 64 KiB, Redis's inline limit).
    pub max_line: usize,
    /// Most elements one aggregate may declare, e.g. a command's arguments (default: no bound
    /// but [`Self::max_frame_bytes`]).
    pub max_elements: usize,
    /// Longest bulk string (a streamed string: each chunk) one may declare (default: no bound
    /// but [`Self::max_frame_bytes`]).
    pub max_bulk: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame_bytes: 512 << 20,
            max_depth: 32,
            max_line: 64 << 10,
            max_elements: usize::MAX,
            max_bulk: usize::MAX,
        }
    }
}

impl Limits {
    /// Most arguments Redis accepts in a command from a client that has not authenticated.
    pub const UNAUTHENTICATED_ARGS: usize = 10;
    /// Longest argument Redis accepts from a client that has not authenticated (16 KiB).
    pub const UNAUTHENTICATED_BULK: usize = 16 << 10;

    /// These limits, tightened to what Redis accepts from a client that has not authenticated
    /// ([`Self::UNAUTHENTICATED_ARGS`] arguments of at most [`Self::UNAUTHENTICATED_BULK`]
    /// bytes; Redis answers `ERR Protocol error: unauthenticated multibulk length` or
    /// `... bulk length` and closes the connection).
    #[must_use]
    pub fn unauthenticated(self) -> Self {
        Self {
            max_elements: self.max_elements.min(Self::UNAUTHENTICATED_ARGS),
            max_bulk: self.max_bulk.min(Self::UNAUTHENTICATED_BULK),
            ..self
        }
    }
}

/// Why bytes are not a RESP frame (or not one within the limits).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScanError {
    /// A type byte RESP does not have (or not allowed here).
    #[error("Protocol error: unexpected {found:?} where a RESP {expected} was expected")]
    UnexpectedType {
        /// The byte found.
        found: char,
        /// What was allowed.
        expected: &'static str,
    },
    /// A length or count that is not a number in range.
    #[error("Protocol error: invalid length {0:?}")]
    BadLength(String),
    /// A line longer than [`Limits::max_line`].
    #[error("Protocol error: a line longer than {max} bytes")]
    LineTooLong {
        /// The limit.
        max: usize,
    },
    /// A frame larger than [`Limits::max_frame_bytes`].
    #[error("Protocol error: a frame of at least {declared} bytes, more than the {max} allowed")]
    TooLarge {
        /// What the frame needs at least.
        declared: usize,
        /// The limit.
        max: usize,
    },
    /// An aggregate declaring more elements than [`Limits::max_elements`].
    #[error("Protocol error: an aggregate of {declared} elements, more than the {max} allowed")]
    TooManyElements {
        /// The count declared.
        declared: usize,
        /// The limit.
        max: usize,
    },
    /// A bulk string declared longer than [`Limits::max_bulk`].
    #[error("Protocol error: a bulk string of {declared} bytes, more than the {max} allowed")]
    BulkTooLong {
        /// The length declared.
        declared: usize,
        /// The limit.
        max: usize,
    },
    /// Aggregates nested deeper than [`Limits::max_depth`].
    #[error("Protocol error: aggregates nested deeper than {max}")]
    TooDeep {
        /// The limit.
        max: usize,
    },
    /// A bulk string not followed by CRLF.
    #[error("Protocol error: a bulk string is not terminated by CRLF")]
    MissingCrlf,
    /// A line holding what its type does not allow (a `_` null with content, a bad boolean).
    #[error("Protocol error: malformed {0} line")]
    BadLine(&'static str),
}

/// Which grammar a [`Scanner`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grammar {
    /// A client's command: `*<n>` then `n` bulk strings (`*0` and `*-1` are empty commands,
    /// which Redis skips without a reply).
    Command,
    /// A server's reply or push, RESP2 or RESP3.
    Reply,
}

/// One complete frame at the start of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Its length in bytes.
    pub len: usize,
    /// The type byte of the value (after any attribute): `+`, `-`, `$`, `*`, `>`, ...
    pub kind: u8,
}

impl Frame {
    /// Whether it is an out-of-band RESP3 push (pub/sub messages, tracking invalidations).
    #[must_use]
    pub fn is_push(&self) -> bool {
        self.kind == b'>'
    }

    /// Whether it is an error reply (simple or blob).
    #[must_use]
    pub fn is_error(&self) -> bool {
        self.kind == b'-' || self.kind == b'!'
    }
}

/// An aggregate being scanned.
#[derive(Debug, Clone, Copy)]
enum Open {
    /// `remaining` more elements; an attribute's elements do not count for its parent.
    Counted { remaining: u64, attribute: bool },
    /// A streamed aggregate (`*?`, `~?`, `%?`), ended by `.`.
    Streamed,
}

/// Finds where frames end, one at a time; see the module docs.
#[derive(Debug, Clone)]
pub struct Scanner {
    grammar: Grammar,
    limits: Limits,
    /// Bytes of the current frame scanned so far.
    pos: usize,
    stack: Vec<Open>,
    /// Inside a streamed string (`$?`), reading `;<n>` chunks.
    chunks: bool,
    /// The value's type byte, once seen.
    kind: Option<u8>,
}

/// What scanning one element found.
enum Step {
    NeedMore,
    /// A scalar (or an empty aggregate) of `len` bytes.
    Scalar(usize),
    /// An aggregate header of `len` bytes opening `open`.
    Opened(usize, Open),
    /// `.`: the end of a streamed aggregate.
    EndAggregate(usize),
    /// `$?`: the start of a streamed string.
    StartChunks(usize),
    /// `|0`: an empty attribute, which is no element of its own.
    EmptyAttribute(usize),
}

impl Scanner {
    /// A scanner for `grammar` within `limits`.
    #[must_use]
    pub fn new(grammar: Grammar, limits: Limits) -> Self {
        Self { grammar, limits, pos: 0, stack: Vec::new(), chunks: false, kind: None }
    }

    /// Changes the limits from the next frame on (the proxy relaxes them once a client has
    /// authenticated, tightens them again after `RESET`). Call between frames.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Scans `buf`, which starts with the current frame and holds at least the bytes given on
    /// earlier calls. Returns the frame once it is complete (the scanner is then ready for the
    /// next one, at the start of the bytes after it), or `None` when more bytes are needed.
    ///
    /// # Errors
    ///
    /// [`ScanError`] when the bytes are not a frame of the grammar or exceed the limits; the
    /// stream cannot be resynchronised after that.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<Frame>, ScanError> {
        loop {
            if self.chunks {
                match self.chunk(buf)? {
                    None => return Ok(None),
                    Some((len, last)) => {
                        self.advance(len)?;
                        if last {
                            self.chunks = false;
                            if let Some(frame) = self.element_done(false) {
                                return Ok(Some(frame));
                            }
                        }
                        continue;
                    }
                }
            }
            let step = self.element(buf)?;
            match step {
                Step::NeedMore => return Ok(None),
                Step::Scalar(len) => {
                    self.advance(len)?;
                    if let Some(frame) = self.element_done(false) {
                        return Ok(Some(frame));
                    }
                }
                Step::Opened(len, open) => {
                    self.advance(len)?;
                    if self.stack.len() >= self.limits.max_depth {
                        return Err(ScanError::TooDeep { max: self.limits.max_depth });
                    }
                    self.stack.push(open);
                }
                Step::EndAggregate(len) => {
                    self.advance(len)?;
                    self.stack.pop();
                    if let Some(frame) = self.element_done(false) {
                        return Ok(Some(frame));
                    }
                }
                Step::StartChunks(len) => {
                    self.advance(len)?;
                    self.chunks = true;
                }
                Step::EmptyAttribute(len) => {
                    self.advance(len)?;
                    let _ = self.element_done(true);
                }
            }
        }
    }

    fn advance(&mut self, len: usize) -> Result<(), ScanError> {
        self.pos += len;
        if self.pos > self.limits.max_frame_bytes {
            return Err(ScanError::TooLarge { declared: self.pos, max: self.limits.max_frame_bytes });
        }
        Ok(())
    }

    /// An element ended (`attribute`: it was an attribute map, which does not count as one of
    /// its parent's elements): closes finished aggregates; returns the frame when it is whole.
    fn element_done(&mut self, attribute: bool) -> Option<Frame> {
        let mut attribute = attribute;
        loop {
            match self.stack.last_mut() {
                None => {
                    if attribute {
                        // The value the attribute annotates follows.
                        self.kind = None;
                        return None;
                    }
                    let frame = Frame { len: self.pos, kind: self.kind.unwrap_or(b'?') };
                    self.pos = 0;
                    self.kind = None;
                    return Some(frame);
                }
                Some(_) if attribute => return None,
                Some(Open::Streamed) => return None,
                Some(Open::Counted { remaining, attribute: this_is_attribute }) => {
                    *remaining = remaining.saturating_sub(1);
                    if *remaining > 0 {
                        return None;
                    }
                    attribute = *this_is_attribute;
                    self.stack.pop();
                }
            }
        }
    }

    /// The line after the type byte at `self.pos`: its content and the length up to and
    /// including its CRLF (type byte included).
    fn line<'a>(&self, buf: &'a [u8]) -> Result<Option<(&'a [u8], usize)>, ScanError> {
        let start = self.pos + 1;
        let rest = buf.get(start..).unwrap_or_default();
        let window = &rest[..rest.len().min(self.limits.max_line + 2)];
        match window.windows(2).position(|w| w == b"\r\n") {
            Some(end) => Ok(Some((&rest[..end], end + 3))),
            None if window.len() >= self.limits.max_line + 2 => {
                Err(ScanError::LineTooLong { max: self.limits.max_line })
            }
            None => Ok(None),
        }
    }

    /// Whether `len` more bytes after the current position fit the frame limit.
    fn fits(&self, len: usize) -> Result<(), ScanError> {
        let declared = self.pos.saturating_add(len);
        if declared > self.limits.max_frame_bytes {
            return Err(ScanError::TooLarge { declared, max: self.limits.max_frame_bytes });
        }
        Ok(())
    }

    /// Whether a bulk string (or chunk) of `len` bytes is within [`Limits::max_bulk`].
    fn bulk_fits(&self, len: usize) -> Result<(), ScanError> {
        if len > self.limits.max_bulk {
            return Err(ScanError::BulkTooLong { declared: len, max: self.limits.max_bulk });
        }
        Ok(())
    }

    fn element(&mut self, buf: &[u8]) -> Result<Step, ScanError> {
        let Some(&ty) = buf.get(self.pos) else { return Ok(Step::NeedMore) };
        self.check_type(ty)?;
        let Some((line, header)) = self.line(buf)? else { return Ok(Step::NeedMore) };
        let top_level = self.stack.is_empty();
        if top_level && ty != b'|' && self.kind.is_none() {
            self.kind = Some(ty);
        }
        match ty {
            b'+' | b'-' | b'(' => Ok(Step::Scalar(header)),
            b':' => {
                parse_signed(line)?;
                Ok(Step::Scalar(header))
            }
            b',' => Ok(Step::Scalar(header)),
            b'_' if line.is_empty() => Ok(Step::Scalar(header)),
            b'_' => Err(ScanError::BadLine("null")),
            b'#' if line == b"t" || line == b"f" => Ok(Step::Scalar(header)),
            b'#' => Err(ScanError::BadLine("boolean")),
            b'$' | b'!' | b'=' => {
                if ty == b'$' && line == b"?" && self.grammar == Grammar::Reply {
                    return Ok(Step::StartChunks(header));
                }
                if ty == b'$' && line == b"-1" && self.grammar == Grammar::Reply {
                    return Ok(Step::Scalar(header));
                }
                let len = parse_len(line)?;
                self.bulk_fits(len)?;
                let total = header.saturating_add(len).saturating_add(2);
                self.fits(total)?;
                let end = self.pos + total;
                if buf.len() < end {
                    return Ok(Step::NeedMore);
                }
                if &buf[end - 2..end] != b"\r\n" {
                    return Err(ScanError::MissingCrlf);
                }
                Ok(Step::Scalar(total))
            }
            b'*' | b'~' | b'>' | b'%' | b'|' => {
                let streamable = matches!(ty, b'*' | b'~' | b'%');
                if line == b"?" && streamable && self.grammar == Grammar::Reply {
                    return Ok(Step::Opened(header, Open::Streamed));
                }
                if line == b"-1" && ty == b'*' {
                    // RESP2's null array; for a command, an empty one.
                    return Ok(Step::Scalar(header));
                }
                let declared = parse_len(line)?;
                if declared > self.limits.max_elements {
                    return Err(ScanError::TooManyElements { declared, max: self.limits.max_elements });
                }
                let count = declared as u64;
                let elements = if matches!(ty, b'%' | b'|') { count.saturating_mul(2) } else { count };
                // Every element takes at least three bytes: refuse a count that cannot fit.
                let least = usize::try_from(elements.saturating_mul(3)).unwrap_or(usize::MAX);
                self.fits(header.saturating_add(least))?;
                if elements == 0 {
                    return Ok(if ty == b'|' { Step::EmptyAttribute(header) } else { Step::Scalar(header) });
                }
                Ok(Step::Opened(header, Open::Counted { remaining: elements, attribute: ty == b'|' }))
            }
            b'.' if line.is_empty() && matches!(self.stack.last(), Some(Open::Streamed)) => {
                Ok(Step::EndAggregate(header))
            }
            _ => Err(ScanError::UnexpectedType { found: char::from(ty), expected: "value" }),
        }
    }

    fn check_type(&self, ty: u8) -> Result<(), ScanError> {
        if self.grammar == Grammar::Command {
            let expected = if self.stack.is_empty() { b'*' } else { b'$' };
            if ty != expected {
                return Err(ScanError::UnexpectedType {
                    found: char::from(ty),
                    expected: if expected == b'*' {
                        "command (an array of bulk strings; inline commands are not accepted)"
                    } else {
                        "bulk string (a command argument)"
                    },
                });
            }
        }
        Ok(())
    }

    /// One `;<n>` chunk of a streamed string: its length, and whether it was the last (`;0`).
    fn chunk(&mut self, buf: &[u8]) -> Result<Option<(usize, bool)>, ScanError> {
        let Some(&ty) = buf.get(self.pos) else { return Ok(None) };
        if ty != b';' {
            return Err(ScanError::UnexpectedType { found: char::from(ty), expected: "string chunk" });
        }
        let Some((line, header)) = self.line(buf)? else { return Ok(None) };
        let len = parse_len(line)?;
        if len == 0 {
            return Ok(Some((header, true)));
        }
        self.bulk_fits(len)?;
        let total = header.saturating_add(len).saturating_add(2);
        self.fits(total)?;
        let end = self.pos + total;
        if buf.len() < end {
            return Ok(None);
        }
        if &buf[end - 2..end] != b"\r\n" {
            return Err(ScanError::MissingCrlf);
        }
        Ok(Some((total, false)))
    }
}

/// A non-negative decimal length.
fn parse_len(line: &[u8]) -> Result<usize, ScanError> {
    let bad = || ScanError::BadLength(String::from_utf8_lossy(line).into_owned());
    if line.is_empty() || line.len() > 19 || !line.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    std::str::from_utf8(line).ok().and_then(|s| s.parse().ok()).ok_or_else(bad)
}

/// A signed decimal integer (`:` lines).
fn parse_signed(line: &[u8]) -> Result<i64, ScanError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ScanError::BadLength(String::from_utf8_lossy(line).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every frame of `bytes`, scanned in one go and again one byte at a time.
    fn frames(grammar: Grammar, bytes: &[u8]) -> Vec<Frame> {
        let mut whole = Vec::new();
        let mut s = Scanner::new(grammar, Limits::default());
        let mut rest = bytes;
        while !rest.is_empty() {
            let f = s.scan(rest).expect("valid").expect("complete");
            whole.push(f);
            rest = &rest[f.len..];
        }
        let mut trickled = Vec::new();
        let mut s = Scanner::new(grammar, Limits::default());
        let mut start = 0;
        for end in 1..=bytes.len() {
            if let Some(f) = s.scan(&bytes[start..end]).expect("valid") {
                trickled.push(f);
                start += f.len;
            }
        }
        assert_eq!(start, bytes.len(), "bytes left over");
        assert_eq!(whole, trickled, "byte-at-a-time scanning finds the same frames");
        whole
    }

    fn kinds(frames: &[Frame]) -> String {
        frames.iter().map(|f| char::from(f.kind)).collect()
    }

    #[test]
    fn real_resp2_exchanges() {
        assert_eq!(kinds(&frames(Grammar::Reply, include_bytes!("vectors/resp2-set-server.bin"))), "+");
        assert_eq!(kinds(&frames(Grammar::Reply, include_bytes!("vectors/resp2-get-miss-server.bin"))), "$");
        assert_eq!(kinds(&frames(Grammar::Reply, include_bytes!("vectors/resp2-mget-server.bin"))), "*");
        // subscribe confirmation, message, pong, unsubscribe: four arrays, none a push.
        let sub = frames(Grammar::Reply, include_bytes!("vectors/resp2-subscribe-server.bin"));
        assert_eq!(kinds(&sub), "****");
        for client in [
            &include_bytes!("vectors/resp2-set-client.bin")[..],
            include_bytes!("vectors/resp2-get-miss-client.bin"),
            include_bytes!("vectors/resp2-mget-client.bin"),
        ] {
            assert_eq!(kinds(&frames(Grammar::Command, client)), "*");
        }
        assert_eq!(frames(Grammar::Command, include_bytes!("vectors/resp2-subscribe-client.bin")).len(), 3);
    }

    #[test]
    fn real_resp3_exchanges() {
        let hello = frames(Grammar::Reply, include_bytes!("vectors/resp3-hello-get-miss-server.bin"));
        assert_eq!(kinds(&hello), "%_");
        let sub = frames(Grammar::Reply, include_bytes!("vectors/resp3-subscribe-server.bin"));
        assert_eq!(kinds(&sub), "%>>+>");
        assert_eq!(sub.iter().filter(|f| f.is_push()).count(), 3);
        // HELLO 3, an unknown command, ZADD, ZSCORE (double), SADD, SMEMBERS (set), CLIENT
        // INFO (verbatim), SET, GET, GET of a missing key (RESP3 null), HELLO 2, GET missing
        // (RESP2 null).
        let assorted = frames(Grammar::Reply, include_bytes!("vectors/resp3-assorted-server.bin"));
        assert_eq!(kinds(&assorted), "%-:,:~=+$_*$");
        assert!(assorted[1].is_error());
        assert_eq!(frames(Grammar::Command, include_bytes!("vectors/resp3-assorted-client.bin")).len(), 12);
        assert_eq!(frames(Grammar::Command, include_bytes!("vectors/resp3-subscribe-client.bin")).len(), 4);
    }

    #[test]
    fn resp3_streamed_and_attributed_values() {
        // From the RESP3 specification's examples.
        let streamed = b"$?\r\n;4\r\nHell\r\n;5\r\no wor\r\n;1\r\nd\r\n;0\r\n";
        assert_eq!(kinds(&frames(Grammar::Reply, streamed)), "$");
        let agg = b"*?\r\n:1\r\n:2\r\n:3\r\n.\r\n";
        assert_eq!(kinds(&frames(Grammar::Reply, agg)), "*");
        let attributed = b"|1\r\n+key-popularity\r\n%2\r\n$1\r\na\r\n,0.1923\r\n$1\r\nb\r\n,0.0012\r\n*2\r\n:2039123\r\n:9543892\r\n";
        let f = frames(Grammar::Reply, attributed);
        assert_eq!((f.len(), f[0].kind, f[0].len), (1, b'*', attributed.len()));
        let nested = b"*2\r\n|1\r\n+ttl\r\n:3600\r\n+a\r\n|0\r\n#t\r\n";
        assert_eq!(frames(Grammar::Reply, nested)[0].len, nested.len());
        let empty = b"*0\r\n%0\r\n~0\r\n>0\r\n";
        assert_eq!(kinds(&frames(Grammar::Reply, empty)), "*%~>");
    }

    #[test]
    fn bad_input_is_refused_with_a_reason() {
        let err = |grammar, bytes: &[u8], limits| Scanner::new(grammar, limits).scan(bytes).expect_err("refused");
        let d = Limits::default();
        assert!(matches!(err(Grammar::Command, b"PING\r\n", d), ScanError::UnexpectedType { found: 'P', .. }));
        assert!(matches!(err(Grammar::Command, b"*1\r\n:1\r\n", d), ScanError::UnexpectedType { found: ':', .. }));
        assert!(matches!(err(Grammar::Command, b"*1\r\n$?\r\n", d), ScanError::BadLength(_)));
        assert!(matches!(err(Grammar::Reply, b"$3\r\nabcd\r\n", d), ScanError::MissingCrlf));
        assert!(matches!(err(Grammar::Reply, b"$x\r\n", d), ScanError::BadLength(_)));
        assert!(matches!(err(Grammar::Reply, b"_x\r\n", d), ScanError::BadLine("null")));
        assert!(matches!(err(Grammar::Reply, b".\r\n", d), ScanError::UnexpectedType { found: '.', .. }));
        let small = Limits { max_frame_bytes: 64, max_depth: 3, max_line: 8, ..Limits::default() };
        assert!(matches!(err(Grammar::Reply, b"$100\r\n", small), ScanError::TooLarge { .. }));
        assert!(matches!(err(Grammar::Reply, b"*1000\r\n", small), ScanError::TooLarge { .. }));
        assert!(matches!(err(Grammar::Reply, b"*1\r\n*1\r\n*1\r\n*1\r\n", small), ScanError::TooDeep { max: 3 }));
        assert!(matches!(err(Grammar::Reply, b"+0123456789abc", small), ScanError::LineTooLong { max: 8 }));
        // Deep nesting never recurses: refused at the limit, however deep the input.
        let deep = b"*1\r\n".repeat(100_000);
        assert!(matches!(err(Grammar::Reply, &deep, d), ScanError::TooDeep { .. }));
    }

    /// Redis's bounds for a client that has not authenticated refuse a command on its header:
    /// the count of arguments, the declared length of one; nothing of the body is needed.
    #[test]
    fn unauthenticated_limits_refuse_on_the_declared_sizes() {
        let pre = Limits::default().unauthenticated();
        let scan = |limits, bytes: &[u8]| Scanner::new(Grammar::Command, limits).scan(bytes);
        assert_eq!(scan(pre, b"*11\r\n"), Err(ScanError::TooManyElements { declared: 11, max: 10 }));
        assert_eq!(
            scan(pre, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$16385\r\n"),
            Err(ScanError::BulkTooLong { declared: 16385, max: 16384 })
        );
        // 500 MiB declared, a few bytes sent: refused at once, not awaited.
        assert_eq!(
            scan(pre, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$524288000\r\nxxxx"),
            Err(ScanError::BulkTooLong { declared: 524_288_000, max: 16384 })
        );
        // Exactly at the bounds: 10 arguments of 16 KiB.
        let value = vec![b'v'; Limits::UNAUTHENTICATED_BULK];
        let mut at_bounds = b"*10\r\n".to_vec();
        for _ in 0..10 {
            at_bounds.extend_from_slice(format!("${}\r\n", value.len()).as_bytes());
            at_bounds.extend_from_slice(&value);
            at_bounds.extend_from_slice(b"\r\n");
        }
        assert_eq!(scan(pre, &at_bounds).expect("valid").map(|f| f.len), Some(at_bounds.len()));
        // The same scanner relaxed (the client authenticated) takes 11 arguments and more.
        let mut s = Scanner::new(Grammar::Command, pre);
        assert!(s.scan(b"*11\r\n").is_err());
        let mut s = Scanner::new(Grammar::Command, pre);
        assert_eq!(s.scan(b"*1\r\n$4\r\nPING\r\n").expect("valid").map(|f| f.len), Some(14));
        s.set_limits(Limits::default());
        let big = format!("*11\r\n{}", "$1\r\na\r\n".repeat(10)) + "$20000\r\n";
        assert_eq!(s.scan(big.as_bytes()).expect("valid"), None, "waits for the 20000 bytes");
        // The bounds hold for replies too: declared map pairs, streamed chunks.
        let tight = Limits { max_elements: 5, max_bulk: 16, ..Limits::default() };
        let reply = |bytes: &[u8]| Scanner::new(Grammar::Reply, tight).scan(bytes);
        assert_eq!(reply(b"%6\r\n"), Err(ScanError::TooManyElements { declared: 6, max: 5 }));
        assert_eq!(reply(b"$?\r\n;17\r\n"), Err(ScanError::BulkTooLong { declared: 17, max: 16 }));
        assert_eq!(reply(b"!17\r\n"), Err(ScanError::BulkTooLong { declared: 17, max: 16 }));
    }

    #[test]
    fn incomplete_frames_wait_for_more() {
        let mut s = Scanner::new(Grammar::Reply, Limits::default());
        assert_eq!(s.scan(b"$5\r\nhel").expect("valid"), None);
        assert_eq!(s.scan(b"$5\r\nhello\r").expect("valid"), None);
        assert_eq!(s.scan(b"$5\r\nhello\r\n+OK\r\n").expect("valid"), Some(Frame { len: 11, kind: b'$' }));
        assert_eq!(s.scan(b"+OK\r\n").expect("valid"), Some(Frame { len: 5, kind: b'+' }));
    }
}
