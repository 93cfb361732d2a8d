//! Replies the Redis proxy writes itself (for what an agent answered), encoded with
//! `redis-protocol` in the protocol version the client chose with `HELLO`.

use bytes::{Bytes, BytesMut};

/// The protocol version of a client connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Version {
    /// RESP2, until `HELLO 3` succeeds (and again after `HELLO 2` or `RESET`).
    #[default]
    Resp2,
    /// RESP3 (go-redis v9, as Argo CD uses it, asks for it on connect).
    Resp3,
}

/// A reply of the proxy's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A value (`GET` hit).
    Bulk(Bytes),
    /// No value (`GET` miss): `$-1` in RESP2, `_` in RESP3, what Redis itself sends.
    Nil,
    /// An error; a leading upper-case word is its code (`ERR` when there is none).
    Error(String),
    /// A `SUBSCRIBE` confirmation: the channel and how many channels the connection holds.
    Subscribed {
        /// The channel.
        channel: Bytes,
        /// Subscriptions of the connection.
        count: i64,
    },
    /// A message on a subscribed channel, with an empty payload (what Argo CD publishes).
    Message {
        /// The channel.
        channel: Bytes,
    },
}

impl Reply {
    /// The bytes of this reply in `version`.
    #[must_use]
    pub fn encode(&self, version: Version) -> Bytes {
        let mut buf = BytesMut::new();
        // Encoding into a growable buffer only fails for frames these never are.
        let _ = match version {
            Version::Resp2 => redis_protocol::resp2::encode::extend_encode(&mut buf, &self.resp2(), false),
            Version::Resp3 => redis_protocol::resp3::encode::complete::extend_encode(&mut buf, &self.resp3(), false),
        };
        buf.freeze()
    }

    fn resp2(&self) -> redis_protocol::resp2::types::BytesFrame {
        use redis_protocol::resp2::types::BytesFrame as F;
        let pubsub = |kind: &'static [u8], channel: &Bytes, last: F| {
            F::Array(vec![F::BulkString(Bytes::from_static(kind)), F::BulkString(channel.clone()), last])
        };
        match self {
            Self::Bulk(b) => F::BulkString(b.clone()),
            Self::Nil => F::Null,
            Self::Error(message) => F::Error(error_line(message).into()),
            Self::Subscribed { channel, count } => pubsub(b"subscribe", channel, F::Integer(*count)),
            Self::Message { channel } => pubsub(b"message", channel, F::BulkString(Bytes::new())),
        }
    }

    fn resp3(&self) -> redis_protocol::resp3::types::BytesFrame {
        use redis_protocol::resp3::types::BytesFrame as F;
        let blob = |data: Bytes| F::BlobString { data, attributes: None };
        let push = |kind: &'static [u8], channel: &Bytes, last: F| F::Push {
            data: vec![blob(Bytes::from_static(kind)), blob(channel.clone()), last],
            attributes: None,
        };
        match self {
            Self::Bulk(b) => blob(b.clone()),
            Self::Nil => F::Null,
            Self::Error(message) => F::SimpleError { data: error_line(message).into(), attributes: None },
            Self::Subscribed { channel, count } => {
                push(b"subscribe", channel, F::Number { data: *count, attributes: None })
            }
            Self::Message { channel } => push(b"message", channel, blob(Bytes::new())),
        }
    }
}

/// An error message as one line, with a code (`ERR` unless it starts with an upper-case word).
fn error_line(message: &str) -> String {
    let line: String = message.chars().map(|c| if c == '\r' || c == '\n' { ' ' } else { c }).collect();
    let code = line.split(' ').next().unwrap_or("");
    if !code.is_empty() && code.chars().all(|c| c.is_ascii_uppercase()) { line } else { format!("ERR {line}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real replies of redis-server 7.0.15 to the same requests.
    #[test]
    fn replies_are_byte_for_byte_what_redis_sends() {
        let miss2 = include_bytes!("vectors/resp2-get-miss-server.bin");
        assert_eq!(&Reply::Nil.encode(Version::Resp2)[..], miss2);
        let hello_miss3 = include_bytes!("vectors/resp3-hello-get-miss-server.bin");
        assert!(hello_miss3.ends_with(&Reply::Nil.encode(Version::Resp3)));
        let ch = Bytes::from_static(b"app|managed-resources|guestbook|1.8.3");
        for (version, server) in [
            (Version::Resp2, &include_bytes!("vectors/resp2-subscribe-server.bin")[..]),
            (Version::Resp3, &include_bytes!("vectors/resp3-subscribe-server.bin")[..]),
        ] {
            let confirm = Reply::Subscribed { channel: ch.clone(), count: 1 }.encode(version);
            let message = Reply::Message { channel: ch.clone() }.encode(version);
            let expected = [&confirm[..], &message[..]].concat();
            assert!(server.windows(expected.len()).any(|w| w == expected), "{version:?}: {expected:?}");
        }
        let set = include_bytes!("vectors/resp2-set-client.bin");
        let hello = Reply::Bulk(Bytes::from_static(b"hello")).encode(Version::Resp2);
        assert!(set.ends_with(&hello), "a bulk string is encoded as Redis encodes one");
    }

    #[test]
    fn errors_are_one_line_with_a_code() {
        assert_eq!(&Reply::Error("agent gone\r\nnow".into()).encode(Version::Resp2)[..], b"-ERR agent gone  now\r\n");
        assert_eq!(&Reply::Error("BUSY try later".into()).encode(Version::Resp3)[..], b"-BUSY try later\r\n");
    }
}
