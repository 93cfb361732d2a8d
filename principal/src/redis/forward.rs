//! `GET` and `SUBSCRIBE` of an agent's key on a replica that does not hold the agent's stream
//! (`--agent-leases`, docs/ha.md): forwarded to the replica that owns the agent, over the link
//! the resource proxy forwards over ([`crate::proxy::replica`]: mutual TLS, the replica client
//! certificate, the owner's server certificate verified), to the owner's replica-only Redis
//! endpoints ([`super::replica`]). The owner answers from its own agent and never forwards
//! again.
//!
//! Without forwarding (no replica client certificate), or when the owner published no address,
//! the client gets an error naming the owner.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::{Buf as _, Bytes, BytesMut};
use http::StatusCode;
use http_body_util::{BodyExt as _, Empty};
use tokio_util::sync::CancellationToken;

use super::RedisProxy;
use super::read::Read;
use crate::proxy::replica::{REDIS_PATH, ReplicaForwarding, Sender, request};
use link::lock;

/// The header of the owner's answer saying its body is the reason the read failed (an error
/// reply for the client), as opposed to an error of the link.
pub(super) const FAILED_HEADER: &str = "x-argocd-agent-redis-failed";

/// Frames of a forwarded subscription's stream: a tag byte, then (but for a heartbeat) a
/// 4-byte big-endian length and that many bytes.
pub(super) const TAG_MESSAGE: u8 = b'm';
/// The subscription is lost; the bytes say why.
pub(super) const TAG_LOST: u8 = b'l';
/// Nothing happened; the stream is alive.
pub(super) const TAG_HEARTBEAT: u8 = b'h';
/// How often the owner sends a heartbeat on an idle subscription stream.
pub(super) const HEARTBEAT: Duration = Duration::from_secs(15);
/// How long the forwarding replica waits for any frame before it deems the owner gone.
const SILENCE: Duration = Duration::from_secs(60);

/// Where a read of `agent`'s key is served.
pub(super) enum Route {
    /// Here: this replica holds the agent's stream, or no other live replica owns it (the
    /// agent's answer, or its absence, says the rest).
    Here,
    /// At `owner`, reached at `address`.
    Owner { owner: String, address: String, link: ReplicaForwarding },
    /// Nowhere: why (an error naming the owner).
    Refused(String),
}

/// Where `agent`'s keys are read.
pub(super) fn route(proxy: &RedisProxy, agent: &str) -> Route {
    if proxy.hub.peers.get(agent).is_some_and(|p| p.is_connected()) {
        return Route::Here;
    }
    let Some(leases) = proxy.hub.leases.as_ref() else { return Route::Here };
    let Some((here, _)) = leases.owner_elsewhere(agent) else { return Route::Here };
    let Some((owner, address)) = leases.owner_proxy(agent) else { return Route::Here };
    let Some(link) = proxy.replicas.get().cloned() else {
        return Route::Refused(format!(
            "agent {agent:?} is connected to principal replica {owner:?}, not to this one ({here:?}), and this \
             replica does not forward to the owner (it needs the replica client certificate, argocd-agentctl pki \
             issue replica, and the resource proxy; docs/ha.md)"
        ));
    };
    let Some(address) = address else {
        return Route::Refused(format!(
            "agent {agent:?} is connected to principal replica {owner:?}, which published no resource-proxy address \
             to forward to (set --replica-proxy-host on every replica; docs/ha.md)"
        ));
    };
    Route::Owner { owner, address, link }
}

fn failure(owner: &str, address: &str, agent: &str, what: impl std::fmt::Display) -> String {
    format!("agent {agent:?} is connected to principal replica {owner:?}; forwarding to it at {address} failed: {what}")
}

/// Sends one forwarded request on `sender`.
async fn send(
    sender: &mut Sender<Empty<Bytes>>,
    address: &str,
    agent: &str,
    path: &str,
) -> Result<http::Response<hyper::body::Incoming>, String> {
    let req = request(address, agent, path, Empty::new())?;
    sender.send_request(req).await.map_err(|e| e.to_string())
}

/// Idle connections kept per replica for forwarded GETs.
const IDLE_PER_REPLICA: usize = 4;

/// Idle HTTP/1.1 connections to other replicas' resource proxies, by address: a forwarded
/// `GET` reuses one instead of a TLS handshake each time. Subscriptions hold their own.
#[derive(Debug, Default)]
pub(super) struct Pool {
    idle: Mutex<HashMap<String, Vec<Sender<Empty<Bytes>>>>>,
}

impl Pool {
    /// An idle connection to `address` that is still open, if any.
    async fn idle(&self, address: &str) -> Option<Sender<Empty<Bytes>>> {
        loop {
            let mut sender = lock(&self.idle).get_mut(address).and_then(Vec::pop)?;
            if !sender.is_closed() && sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    /// Keeps `sender` for the next request to `address`, unless enough are kept.
    fn keep(&self, address: &str, sender: Sender<Empty<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = lock(&self.idle);
        let kept = idle.entry(address.to_owned()).or_default();
        if kept.len() < IDLE_PER_REPLICA {
            kept.push(sender);
        }
    }
}

/// `GET` of `path` at `address` on a pooled connection (again on a new one if the pooled one
/// was closed meanwhile: a GET may be repeated), the whole answer read.
async fn get_pooled(
    pool: &Pool,
    link: &ReplicaForwarding,
    address: &str,
    agent: &str,
    path: &str,
) -> Result<(StatusCode, bool, Bytes), String> {
    let once = |mut sender: Sender<Empty<Bytes>>| async move {
        let resp = send(&mut sender, address, agent, path).await?;
        let status = resp.status();
        let failed = resp.headers().contains_key(FAILED_HEADER);
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        pool.keep(address, sender);
        Ok::<_, String>((status, failed, body))
    };
    if let Some(sender) = pool.idle(address).await
        && let Ok(answer) = once(sender).await
    {
        return Ok(answer);
    }
    once(link.connect(address).await?).await
}

/// `GET` of `agent`'s `key` at its owner; `timeout`: the owner's own time for the agent, plus the
/// link's.
pub(super) async fn get(
    pool: &Pool,
    owner: &str,
    address: &str,
    link: &ReplicaForwarding,
    agent: &str,
    key: &str,
    timeout: Duration,
) -> Read {
    let started = Instant::now();
    let path =
        format!("{REDIS_PATH}get?{}", form_urlencoded::Serializer::new(String::new()).append_pair("key", key).finish());
    let deadline = timeout + link.connect_timeout;
    let answered = tokio::time::timeout(deadline, get_pooled(pool, link, address, agent, &path)).await;
    let metrics = crate::metrics::global();
    let (read, outcome) = match answered {
        Err(_) => (Read::Failed(failure(owner, address, agent, format!("no answer within {deadline:?}"))), "timeout"),
        Ok(Err(e)) => (Read::Failed(failure(owner, address, agent, e)), "unreachable"),
        Ok(Ok((StatusCode::OK, _, body))) => (Read::Hit(body.to_vec()), "hit"),
        Ok(Ok((StatusCode::NO_CONTENT, _, _))) => (Read::Miss, "miss"),
        Ok(Ok((_, true, body))) => (Read::Failed(String::from_utf8_lossy(&body).into_owned()), "error"),
        Ok(Ok((status, false, body))) => (
            Read::Failed(failure(
                owner,
                address,
                agent,
                format!("{status}: {}", String::from_utf8_lossy(&body).trim()),
            )),
            "refused",
        ),
    };
    metrics.replica_forward("redis_get", outcome);
    if let Read::Failed(why) = &read {
        tracing::info!(%agent, %owner, %key, error = %why, elapsed = ?started.elapsed(), "forwarded Redis GET failed");
    }
    read
}

/// `SUBSCRIBE` of `agent`'s `channel` at its owner for connection `conn`: once the owner says
/// it subscribed, its messages reach the connection until either side ends; the end of the
/// owner's stream loses the connection's subscriptions (go-redis reconnects and subscribes
/// again, reaching whichever replica, which forwards to the owner of then).
pub(super) async fn subscribe(
    proxy: &RedisProxy,
    (owner, address, link): (&str, &str, &ReplicaForwarding),
    conn: &str,
    agent: &str,
    channel: &str,
    cancel: CancellationToken,
) -> Result<(), String> {
    let path = format!(
        "{REDIS_PATH}subscribe?{}",
        form_urlencoded::Serializer::new(String::new()).append_pair("channel", channel).finish()
    );
    let deadline = proxy.config.request_timeout + link.connect_timeout;
    let metrics = crate::metrics::global();
    let call = async {
        let mut sender = link.connect::<Empty<Bytes>>(address).await?;
        send(&mut sender, address, agent, &path).await
    };
    let resp = match tokio::time::timeout(deadline, call).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => {
            metrics.replica_forward("redis_subscribe", "unreachable");
            return Err(failure(owner, address, agent, e));
        }
        Err(_) => {
            metrics.replica_forward("redis_subscribe", "timeout");
            return Err(failure(owner, address, agent, format!("no answer within {deadline:?}")));
        }
    };
    if resp.status() != StatusCode::OK {
        let failed = resp.headers().contains_key(FAILED_HEADER);
        let status = resp.status();
        let body = tokio::time::timeout(deadline, resp.into_body().collect()).await;
        let text = match body {
            Ok(Ok(b)) => String::from_utf8_lossy(&b.to_bytes()).trim().to_owned(),
            _ => String::new(),
        };
        metrics.replica_forward("redis_subscribe", if failed { "error" } else { "refused" });
        return Err(if failed { text } else { failure(owner, address, agent, format!("{status}: {text}")) });
    }
    metrics.replica_forward("redis_subscribe", "subscribed");
    let relay = Relay {
        proxy: proxy.clone(),
        conn: conn.to_owned(),
        agent: agent.to_owned(),
        channel: channel.to_owned(),
        owner: owner.to_owned(),
    };
    tokio::spawn(relay.run(resp.into_body(), cancel));
    Ok(())
}

/// Hands the owner's messages on one forwarded subscription to the connection.
struct Relay {
    proxy: RedisProxy,
    conn: String,
    agent: String,
    channel: String,
    owner: String,
}

impl Relay {
    async fn run(self, mut body: hyper::body::Incoming, cancel: CancellationToken) {
        let mut buf = BytesMut::new();
        let why = loop {
            let frame = tokio::select! {
                () = cancel.cancelled() => return,
                frame = tokio::time::timeout(SILENCE, body.frame()) => frame,
            };
            match frame {
                Err(_) => break format!("no word from it in {SILENCE:?}"),
                Ok(None) => break "it ended the subscription".to_owned(),
                Ok(Some(Err(e))) => break format!("the stream broke: {e}"),
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        buf.extend_from_slice(&data);
                    }
                }
            }
            match self.drain(&mut buf) {
                Ok(()) => {}
                Err(why) => break why,
            }
        };
        tracing::info!(conn = %self.conn, agent = %self.agent, owner = %self.owner, channel = %self.channel, %why,
            "forwarded Redis subscription ended; the connection's subscriptions are lost");
        self.proxy.exchange.lose(
            &self.conn,
            format!(
                "agent {:?}: the subscription to {:?} through principal replica {:?} ended ({why}); reconnect to \
                 subscribe again",
                self.agent, self.channel, self.owner
            ),
        );
    }

    /// Delivers the whole frames in `buf`; `Err`: the subscription is lost, why.
    fn drain(&self, buf: &mut BytesMut) -> Result<(), String> {
        loop {
            let Some(&tag) = buf.first() else { return Ok(()) };
            if tag == TAG_HEARTBEAT {
                buf.advance(1);
                continue;
            }
            if tag != TAG_MESSAGE && tag != TAG_LOST {
                return Err(format!("it sent an unknown frame (tag {tag:#04x})"));
            }
            let Some(len) = buf.get(1..5).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize) else {
                return Ok(());
            };
            if len > MAX_FRAME {
                return Err(format!("it sent a frame of {len} bytes (at most {MAX_FRAME})"));
            }
            if buf.len() < 5 + len {
                return Ok(());
            }
            buf.advance(5);
            let bytes = buf.split_to(len).freeze();
            let text = String::from_utf8_lossy(&bytes).into_owned();
            if tag == TAG_LOST {
                return Err(text);
            }
            self.proxy.exchange.push(&self.agent, &self.conn, &text);
        }
    }
}

/// Largest frame of a subscription stream (a channel name, or why it was lost).
pub(super) const MAX_FRAME: usize = 64 << 10;

/// One frame of a subscription stream.
pub(super) fn frame(tag: u8, bytes: &[u8]) -> Bytes {
    let bytes = &bytes[..bytes.len().min(MAX_FRAME)];
    let mut out = BytesMut::with_capacity(5 + bytes.len());
    out.extend_from_slice(&[tag]);
    out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(bytes);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn relay() -> Relay {
        let hub = Arc::new(crate::sync::hub::Hub::offline(crate::PrincipalConfig::new("argocd")));
        let proxy = RedisProxy::new(
            hub,
            Arc::new(super::super::Exchange::default()),
            super::super::RedisProxyConfig::new("127.0.0.1:9"),
            Arc::default(),
        );
        Relay { proxy, conn: "c1".into(), agent: "agent-a".into(), channel: "ch".into(), owner: "r0".into() }
    }

    #[tokio::test]
    async fn the_owners_frames_reach_the_connection_whole_and_only_on_its_channels() {
        let relay = relay();
        let mut inbox = relay.proxy.exchange.open("c1");
        relay.proxy.exchange.subscribed("c1", "agent-a", "ch");
        let mut stream = BytesMut::new();
        stream.extend_from_slice(&[TAG_HEARTBEAT]);
        stream.extend_from_slice(&frame(TAG_MESSAGE, b"ch"));
        stream.extend_from_slice(&frame(TAG_MESSAGE, b"not-subscribed"));
        stream.extend_from_slice(&frame(TAG_LOST, b"agent gone"));
        // Byte by byte: a frame split anywhere waits for its rest.
        let mut buf = BytesMut::new();
        let mut ended = None;
        for byte in stream.iter() {
            buf.extend_from_slice(&[*byte]);
            if let Err(why) = relay.drain(&mut buf) {
                ended = Some(why);
                break;
            }
        }
        assert_eq!(ended.as_deref(), Some("agent gone"));
        assert_eq!(&inbox.messages.try_recv().expect("the subscribed channel's message")[..], b"ch");
        assert!(inbox.messages.try_recv().is_err(), "a channel not subscribed through the agent is refused");

        let mut unknown = BytesMut::from(&b"x"[..]);
        assert!(relay.drain(&mut unknown).is_err_and(|e| e.contains("unknown frame")));
        let mut huge = BytesMut::from(&[TAG_MESSAGE, 0xff, 0xff, 0xff, 0xff][..]);
        assert!(relay.drain(&mut huge).is_err_and(|e| e.contains("at most")), "a frame beyond the bound is refused");
    }
}
