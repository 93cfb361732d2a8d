//! The owner's side of Redis reads forwarded by another replica ([`super::forward`]): the
//! replica-only endpoints on the resource-proxy listener, under
//! [`crate::proxy::replica::REDIS_PATH`]. The resource proxy has already checked that the caller
//! presented a replica's certificate and named the agent; these answer from this replica's own
//! agent stream only (a forwarded read is never forwarded again).
//!
//! * `get?key=<key>`: 200 with the value, 204 for a miss, 502 with the reason (and
//!   [`FAILED_HEADER`]) when the agent could not answer.
//! * `subscribe?channel=<channel>`: 502 with the reason when the agent could not subscribe;
//!   otherwise 200 and a stream of frames ([`super::forward::frame`]): each message on the
//!   channel, a heartbeat when idle, and a last frame when the subscription is lost. The
//!   subscription is pinged as a client connection's is, and ends when either side closes.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use protocol::payload::AppCacheKey;
use tokio_util::sync::CancellationToken;

use super::RedisProxy;
use super::forward::{FAILED_HEADER, HEARTBEAT, TAG_HEARTBEAT, TAG_LOST, TAG_MESSAGE, frame};
use super::read::{self, Read};
use super::route::{AgentKey, agent_key};

/// What the endpoints answer with (the resource proxy's body type).
pub(crate) type Body = UnsyncBoxBody<Bytes, std::io::Error>;

fn whole(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()).map_err(|never: Infallible| match never {}).boxed_unsync());
    *resp.status_mut() = status;
    resp
}

fn text(status: StatusCode, message: String) -> Response<Body> {
    let mut resp = whole(status, message);
    resp.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; charset=utf-8"));
    resp
}

/// The reason a read failed, for the forwarding replica to pass on as the client's error.
fn failed(message: String) -> Response<Body> {
    let mut resp = text(StatusCode::BAD_GATEWAY, message);
    resp.headers_mut().insert(FAILED_HEADER, http::HeaderValue::from_static("1"));
    resp
}

/// Answers a forwarded request for `agent`: `what` is the path after the prefix, `query` its
/// query string.
pub(crate) async fn serve(proxy: &RedisProxy, agent: &str, what: &str, query: &str) -> Response<Body> {
    let params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
    let param = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    match what {
        "get" => match param("key") {
            Some(key) => get(proxy, agent, &key).await,
            None => text(StatusCode::BAD_REQUEST, "a forwarded Redis GET names its key in ?key=".to_owned()),
        },
        "subscribe" => match param("channel") {
            Some(channel) => subscribe(proxy, agent, &channel).await,
            None => {
                text(StatusCode::BAD_REQUEST, "a forwarded Redis SUBSCRIBE names its channel in ?channel=".to_owned())
            }
        },
        other => text(StatusCode::NOT_FOUND, format!("no replica Redis endpoint {other:?} (get, subscribe)")),
    }
}

/// `key` as a key of `agent`'s: an Application cache key that is not another agent's.
#[allow(clippy::result_large_err)]
fn agent_key_of(proxy: &RedisProxy, agent: &str, key: &str) -> Result<AgentKey, Response<Body>> {
    let Some(parsed) = AppCacheKey::parse(key) else {
        return Err(text(StatusCode::BAD_REQUEST, format!("{key:?} is not a key of an Application's cached state")));
    };
    match agent_key(&proxy.hub, key.as_bytes()) {
        Some(owned) if owned.agent != agent => Err(text(
            StatusCode::FORBIDDEN,
            format!("{key:?} is a key of agent {:?}, not of agent {agent:?}", owned.agent),
        )),
        Some(owned) => Ok(owned),
        // Not known here (yet): the forwarding replica mapped it to the agent.
        None => Ok(AgentKey { agent: agent.to_owned(), kind: parsed.kind, gzip: parsed.gzip }),
    }
}

async fn get(proxy: &RedisProxy, agent: &str, key: &str) -> Response<Body> {
    let target = match agent_key_of(proxy, agent, key) {
        Ok(t) => t,
        Err(resp) => return resp,
    };
    let conn = protocol::event::new_uuid();
    match read::get(proxy, &conn, &target, key).await {
        Read::Hit(value) => whole(StatusCode::OK, value),
        Read::Miss => whole(StatusCode::NO_CONTENT, Bytes::new()),
        Read::Failed(why) => failed(why),
    }
}

async fn subscribe(proxy: &RedisProxy, agent: &str, channel: &str) -> Response<Body> {
    if let Err(resp) = agent_key_of(proxy, agent, channel) {
        return resp;
    }
    let conn = protocol::event::new_uuid();
    let mut inbox = proxy.exchange.open(&conn);
    proxy.exchange.subscribed(&conn, agent, channel);
    if let Err(why) = read::subscribe(proxy, &conn, agent, channel).await {
        proxy.exchange.close(&conn);
        return failed(why);
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(16);
    let cancel = CancellationToken::new();
    tokio::spawn(read::keep_alive(proxy.clone(), conn.clone(), agent.to_owned(), cancel.clone()));
    let exchange = proxy.exchange.clone();
    let (agent, channel) = (agent.to_owned(), channel.to_owned());
    tokio::spawn(async move {
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        heartbeat.tick().await;
        loop {
            let next = tokio::select! {
                () = tx.closed() => break,
                message = inbox.messages.recv() => match message {
                    Some(channel) => frame(TAG_MESSAGE, &channel),
                    None => break,
                },
                changed = inbox.lost.changed() => {
                    let why = inbox.lost.borrow_and_update().clone();
                    match (changed, why) {
                        (Ok(()), Some(why)) => {
                            let _ = tx.send(Ok(Frame::data(frame(TAG_LOST, why.as_bytes())))).await;
                            break;
                        }
                        (Ok(()), None) => continue,
                        (Err(_), _) => break,
                    }
                }
                _ = heartbeat.tick() => Bytes::from_static(&[TAG_HEARTBEAT]),
            };
            if tx.send(Ok(Frame::data(next))).await.is_err() {
                break;
            }
        }
        cancel.cancel();
        exchange.close(&conn);
        tracing::debug!(%agent, %channel, conn, "forwarded Redis subscription ended");
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed_unsync();
    let mut resp = Response::new(body);
    resp.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/octet-stream"));
    resp
}
