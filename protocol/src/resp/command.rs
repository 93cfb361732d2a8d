//! A client's command: decoded with `redis-protocol` from a frame the [`super::Scanner`]
//! delimited, and classified by what the Redis proxy does with it.

use bytes::Bytes;
use redis_protocol::resp2::types::BytesFrame;

/// A command that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// `redis-protocol` refused the bytes.
    #[error("Protocol error: {0}")]
    Decode(String),
    /// The frame is not an array of bulk strings.
    #[error("Protocol error: a command is an array of bulk strings")]
    NotCommand,
}

/// One command, its bytes as received (forwarded verbatim to the hub's Redis) and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    raw: Bytes,
    args: Vec<Bytes>,
}

/// What the proxy does with a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command<'a> {
    /// `*0` or `*-1`: nothing (Redis does not reply).
    Empty,
    /// `GET key`.
    Get(&'a [u8]),
    /// `SUBSCRIBE channel [channel ...]`.
    Subscribe(&'a [Bytes]),
    /// `HELLO [protover ...]`: the protocol version asked for, when it is one.
    Hello(Option<u8>),
    /// `RESET`: the connection returns to RESP2.
    Reset,
    /// A command after which the hub's Redis sends frames that answer no command: in RESP2,
    /// pub/sub subscriptions (`PSUBSCRIBE`, `SSUBSCRIBE`, and `SUBSCRIBE` of other channels),
    /// `MONITOR`, and `CLIENT REPLY`, which stops or skips replies.
    Unpaired,
    /// `UNSUBSCRIBE`, `PUNSUBSCRIBE`, `SUNSUBSCRIBE`: answered by pushes in RESP3.
    Unsubscribe,
    /// Anything else: forwarded, one reply expected.
    Other,
}

impl Request {
    /// Decodes one complete command frame (as [`super::Scanner`] with
    /// [`super::Grammar::Command`] delimited it).
    ///
    /// # Errors
    ///
    /// [`CommandError`] when the bytes are not exactly one array of bulk strings.
    pub fn decode(raw: Bytes) -> Result<Self, CommandError> {
        let decoded =
            redis_protocol::resp2::decode::decode_bytes(&raw).map_err(|e| CommandError::Decode(e.to_string()))?;
        let args = match decoded {
            Some((BytesFrame::Array(items), used)) if used == raw.len() => items
                .into_iter()
                .map(|item| match item {
                    BytesFrame::BulkString(b) => Ok(b),
                    _ => Err(CommandError::NotCommand),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some((BytesFrame::Null, used)) if used == raw.len() => Vec::new(),
            _ => return Err(CommandError::NotCommand),
        };
        Ok(Self { raw, args })
    }

    /// A command with `args`, encoded as a client sends it.
    #[must_use]
    pub fn from_args(args: Vec<Bytes>) -> Self {
        let frame = BytesFrame::Array(args.iter().cloned().map(BytesFrame::BulkString).collect());
        let mut buf = bytes::BytesMut::new();
        // Encoding an array of bulk strings into a growable buffer cannot fail.
        let _ = redis_protocol::resp2::encode::extend_encode(&mut buf, &frame, false);
        Self { raw: buf.freeze(), args }
    }

    /// The bytes as received.
    #[must_use]
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }

    /// The arguments, the command name first.
    #[must_use]
    pub fn args(&self) -> &[Bytes] {
        &self.args
    }

    /// The command name, upper-cased (empty for an empty command).
    #[must_use]
    pub fn name(&self) -> String {
        self.args.first().map(|n| String::from_utf8_lossy(n).to_ascii_uppercase()).unwrap_or_default()
    }

    /// What the proxy does with it. Names match case-insensitively, as Redis matches them
    /// (upstream's proxy only recognises lower-case `get` and `subscribe`).
    #[must_use]
    pub fn command(&self) -> Command<'_> {
        let Some(name) = self.args.first() else { return Command::Empty };
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        if is("GET") && self.args.len() == 2 {
            Command::Get(&self.args[1])
        } else if is("SUBSCRIBE") && self.args.len() >= 2 {
            Command::Subscribe(&self.args[1..])
        } else if is("HELLO") {
            Command::Hello(self.args.get(1).and_then(|v| match &v[..] {
                b"2" => Some(2),
                b"3" => Some(3),
                _ => None,
            }))
        } else if is("RESET") {
            Command::Reset
        } else if is("PSUBSCRIBE")
            || is("SSUBSCRIBE")
            || is("MONITOR")
            || is("SUBSCRIBE")
            || (is("CLIENT") && self.args.get(1).is_some_and(|s| s.eq_ignore_ascii_case(b"REPLY")))
        {
            Command::Unpaired
        } else if is("UNSUBSCRIBE") || is("PUNSUBSCRIBE") || is("SUNSUBSCRIBE") {
            Command::Unsubscribe
        } else {
            Command::Other
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::{Grammar, Limits, Scanner};

    fn requests(bytes: &[u8]) -> Vec<Request> {
        let mut s = Scanner::new(Grammar::Command, Limits::default());
        let mut rest = Bytes::copy_from_slice(bytes);
        let mut out = Vec::new();
        while !rest.is_empty() {
            let f = s.scan(&rest).expect("valid").expect("complete");
            out.push(Request::decode(rest.split_to(f.len)).expect("decodes"));
        }
        out
    }

    #[test]
    fn real_commands_are_classified() {
        let get = requests(include_bytes!("vectors/resp2-get-miss-client.bin"));
        assert_eq!(get[0].command(), Command::Get(b"app|resources-tree|missing|1.8.3.gz"));
        assert_eq!(&get[0].raw()[..], include_bytes!("vectors/resp2-get-miss-client.bin"));
        let set = requests(include_bytes!("vectors/resp2-set-client.bin"));
        assert_eq!((set[0].name().as_str(), set[0].command()), ("SET", Command::Other));
        let sub = requests(include_bytes!("vectors/resp3-subscribe-client.bin"));
        let kinds: Vec<_> = sub.iter().map(Request::command).collect();
        assert_eq!(kinds[0], Command::Hello(Some(3)));
        assert!(matches!(kinds[1], Command::Subscribe([ch]) if &ch[..] == b"app|managed-resources|guestbook|1.8.3"));
        assert_eq!(&kinds[2..], &[Command::Other, Command::Unsubscribe]);
        let assorted = requests(include_bytes!("vectors/resp3-assorted-client.bin"));
        assert_eq!(assorted[10].command(), Command::Hello(Some(2)));
    }

    #[test]
    fn names_match_in_any_case_as_redis_does() {
        let get = Request::from_args(vec![Bytes::from_static(b"get"), Bytes::from_static(b"k")]);
        assert_eq!(get.command(), Command::Get(b"k"));
        assert_eq!(&get.raw()[..], b"*2\r\n$3\r\nget\r\n$1\r\nk\r\n");
        let reply = Request::from_args(vec!["client".into(), "reply".into(), "off".into()]);
        assert_eq!(reply.command(), Command::Unpaired);
        assert_eq!(Request::from_args(vec!["GET".into()]).command(), Command::Other, "GET without a key");
        assert_eq!(Request::decode(Bytes::from_static(b"*0\r\n")).expect("empty").command(), Command::Empty);
        assert!(Request::decode(Bytes::from_static(b"*1\r\n:1\r\n")).is_err());
        assert!(Request::decode(Bytes::from_static(b"*1\r\n$1\r\na\r\n+x")).is_err(), "trailing bytes");
    }
}
