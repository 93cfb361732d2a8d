//! Redis-proxy requests from the principal, answered from this cluster's Argo CD Redis
//! (upstream §5.2, `agent/inbound_redis.go`).
//!
//! The hub's Argo CD reads an agent's Application state (resource trees, managed resources)
//! through the principal's Redis proxy; the principal sends each `GET` and `SUBSCRIBE` of such
//! a key here as a `redis-request`:
//! * **GET**: the key as the agent's own Argo CD names it (the hub's `<namespace>_` removed,
//!   unless under destination-based mapping, where Applications keep their namespaces) is read
//!   from the agent's Redis; the answer is the value, a miss, or the error;
//! * **SUBSCRIBE**: the agent subscribes in its Redis (one connection per subscription, as
//!   upstream) and pushes a `redis-response` for every message on the channel (Argo CD
//!   publishes empty ones: "the tree changed"). At most [`MAX_SUBSCRIPTIONS`] are held; one
//!   whose principal-side connection has sent no ping for [`SUBSCRIPTION_IDLE`] is dropped
//!   (the principal pings every minute while its client is connected); a subscription whose
//!   Redis connection breaks reconnects with backoff;
//! * **PING**: keeps the connection's subscriptions alive, answered with a pong.
//!
//! Requests run in the background, never on the receive loop, and are acknowledged at once;
//! a request resent by the principal is executed once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use protocol::payload::{
    Empty, RedisGetResponse, RedisPushFromSubscribe, RedisRequest, RedisResponse, RedisResponseBody,
    RedisSubscribeResponse, strip_app_namespace,
};
use protocol::{Event, EventType, Payload, Target};
use tokio_util::sync::CancellationToken;

pub use crate::config::{RedisConfig, RedisTls};
use crate::error::InboundError;
use crate::host::Host;

/// Subscriptions held at most; more are refused with an error.
pub const MAX_SUBSCRIPTIONS: usize = 256;
/// A subscription whose principal-side connection sent no ping this long is dropped
/// (upstream's 10 minutes).
pub const SUBSCRIPTION_IDLE: Duration = Duration::from_secs(10 * 60);
/// How often subscriptions are checked for that.
const IDLE_CHECK: Duration = Duration::from_secs(60);
/// `GET`s executed at once; more wait for a slot.
const CONCURRENT: usize = 16;
/// Longest a connection to the agent's Redis or one of its answers may take.
const REDIS_TIMEOUT: Duration = Duration::from_secs(10);
/// First and longest pause before a broken subscription reconnects.
const RECONNECT_MIN: Duration = Duration::from_millis(500);
const RECONNECT_MAX: Duration = Duration::from_secs(30);

/// The Redis client could not be built from the configuration.
#[derive(Debug, thiserror::Error)]
#[error("the agent's Redis configuration cannot be used: {0}")]
pub struct RedisConfigError(#[source] redis::RedisError);

impl RedisConfig {
    /// The client for this configuration (nothing is dialled yet).
    ///
    /// # Errors
    ///
    /// [`RedisConfigError`] for an address or TLS material the client refuses.
    pub fn client(&self) -> Result<redis::Client, RedisConfigError> {
        use redis::IntoConnectionInfo as _;
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        let fragment = if matches!(self.tls, Some(RedisTls::Insecure)) { "/#insecure" } else { "" };
        let info = format!("{scheme}://{}{fragment}", self.address).into_connection_info().map_err(RedisConfigError)?;
        let mut settings = info.redis_settings().clone();
        if let Some(user) = &self.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = &self.password {
            settings = settings.set_password(password);
        }
        let info = info.set_redis_settings(settings);
        match &self.tls {
            Some(RedisTls::Ca(pem)) if !holds_certificate(pem) => Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "the Redis TLS CA holds no PEM certificate",
            ))),
            Some(RedisTls::Ca(pem)) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates { client_tls: None, root_cert: Some(pem.as_bytes().to_vec()) },
            ),
            _ => redis::Client::open(info),
        }
        .map_err(RedisConfigError)
    }
}

/// Whether `pem` holds a certificate (the client library would take an empty CA list).
fn holds_certificate(pem: &str) -> bool {
    use rustls_pki_types::pem::PemObject as _;
    rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()).any(|c| c.is_ok())
}

/// One subscription: a principal-side connection's channel.
type SubKey = (String, String);

/// The agent's side of the Redis proxy; lives as long as the agent runs.
pub(crate) struct Redis {
    client: Option<Result<redis::Client, String>>,
    manager: tokio::sync::Mutex<Option<redis::aio::ConnectionManager>>,
    slots: Arc<tokio::sync::Semaphore>,
    state: Mutex<State>,
    /// Cancels every subscription when the agent stops.
    cancel: CancellationToken,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    subscriptions: HashMap<SubKey, CancellationToken>,
    /// When each principal-side connection was last heard of.
    last_ping: HashMap<String, Instant>,
    seen: crate::recent::RecentIds,
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Whether `ev` is a Redis-proxy request (handled here, not by the event handlers).
pub(crate) fn is_request(ev: &Event) -> bool {
    ev.target == Target::Redis && ev.event_type == EventType::RedisRequest
}

impl Redis {
    /// The agent's side for `config` (`None`: no Redis; requests are answered with an error).
    pub(crate) fn new(config: Option<&RedisConfig>) -> Self {
        let client = config.map(|c| c.client().map_err(|e| e.to_string()));
        if let Some(Err(error)) = &client {
            tracing::warn!(%error, "Redis-proxy requests will be answered with this error");
        }
        Self {
            client,
            manager: tokio::sync::Mutex::new(None),
            slots: Arc::new(tokio::sync::Semaphore::new(CONCURRENT)),
            state: Mutex::new(State::default()),
            cancel: CancellationToken::new(),
        }
    }

    /// Whether request `uuid` arrives for the first time (remembering it).
    fn first_time(&self, uuid: &str) -> bool {
        link::lock(&self.state).seen.first_time(uuid)
    }

    fn client(&self) -> Result<&redis::Client, String> {
        match &self.client {
            Some(Ok(client)) => Ok(client),
            Some(Err(error)) => Err(error.clone()),
            None => Err("this agent has no Redis configured (--redis-addr)".to_owned()),
        }
    }

    /// A connection (kept and reconnected by the client library once made).
    async fn connection(&self) -> Result<redis::aio::ConnectionManager, String> {
        let mut slot = self.manager.lock().await;
        if let Some(manager) = slot.as_ref() {
            return Ok(manager.clone());
        }
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(REDIS_TIMEOUT))
            .set_response_timeout(Some(REDIS_TIMEOUT))
            .set_number_of_retries(2);
        let manager = tokio::time::timeout(REDIS_TIMEOUT, self.client()?.get_connection_manager_with_config(config))
            .await
            .map_err(|_| format!("connecting to Redis took longer than {REDIS_TIMEOUT:?}"))?
            .map_err(|e| format!("cannot connect to Redis: {e}"))?;
        *slot = Some(manager.clone());
        Ok(manager)
    }

    /// `GET key` on this cluster's Redis, for the agent's own reads (its cluster cache report,
    /// [`crate::cluster_cache`]): the value or a miss.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let mut conn = self.connection().await?;
        tokio::time::timeout(REDIS_TIMEOUT, redis::cmd("GET").arg(key).query_async(&mut conn))
            .await
            .map_err(|_| format!("reading {key:?} took longer than {REDIS_TIMEOUT:?}"))?
            .map_err(|e| format!("GET {key:?}: {e}"))
    }

    /// Whether a Redis is configured.
    pub(crate) fn is_configured(&self) -> bool {
        self.client.is_some()
    }

    /// The key (or channel) as this agent's Argo CD names it.
    fn local_key<'a, H: Host>(spoke: &H, key: &'a str) -> std::borrow::Cow<'a, str> {
        if spoke.config().destination_based_mapping { key.into() } else { strip_app_namespace(key) }
    }
}

/// Takes Redis-proxy request `ev`: it runs in the background and is answered with a
/// `redis-response`; the request itself is acknowledged at once.
pub(crate) fn accept<H: Host>(spoke: &Arc<H>, redis: &Arc<Redis>, ev: &Event) -> Result<(), InboundError> {
    let Payload::RedisRequest(req) = ev.payload()? else {
        return Ok(());
    };
    if req.uuid.is_empty() || req.uuid != ev.event_id {
        tracing::warn!(uuid = %req.uuid, event_id = %ev.event_id, "Redis-proxy request whose uuid is not its eventid; ignored");
        return Ok(());
    }
    if !redis.first_time(&req.uuid) {
        tracing::debug!(uuid = %req.uuid, "Redis-proxy request resent; executed once already");
        return Ok(());
    }
    if !req.connection_uuid.is_empty() {
        link::lock(&redis.state).last_ping.insert(req.connection_uuid.clone(), Instant::now());
    }
    let (spoke, redis) = (spoke.clone(), redis.clone());
    tokio::spawn(async move {
        if let Some(get) = &req.body.get {
            let answer = get_value(&*spoke, &redis, &get.key).await;
            crate::metrics::global().redis_request("get", !answer.error.is_empty());
            respond(&*spoke, &req, RedisResponseBody { get: Some(answer), ..RedisResponseBody::default() });
        } else if let Some(sub) = &req.body.subscribe {
            let error = subscribe(&spoke, &redis, &req, &sub.channel).await.err().unwrap_or_default();
            crate::metrics::global().redis_request("subscribe", !error.is_empty());
            let body = RedisSubscribeResponse { error };
            respond(
                &*spoke,
                &req,
                RedisResponseBody { subscribe_response: Some(body), ..RedisResponseBody::default() },
            );
        } else if req.body.ping.is_some() {
            crate::metrics::global().redis_request("ping", false);
            respond(&*spoke, &req, RedisResponseBody { pong: Some(Empty {}), ..RedisResponseBody::default() });
        } else {
            tracing::warn!(uuid = %req.uuid, "Redis-proxy request without a command; ignored");
        }
    });
    Ok(())
}

fn respond<H: Host>(spoke: &H, req: &RedisRequest, body: RedisResponseBody) {
    let answer = RedisResponse { uuid: req.uuid.clone(), connection_uuid: req.connection_uuid.clone(), body };
    match Event::response(EventType::RedisResponse, Target::Redis, &req.uuid).with_json(&answer) {
        Ok(ev) => spoke.mailbox().push(ev),
        Err(error) => tracing::warn!(uuid = %req.uuid, %error, "cannot encode a Redis-proxy answer"),
    }
}

/// `GET key` on the agent's Redis: the value, a miss, or the error.
async fn get_value<H: Host>(spoke: &H, redis: &Redis, key: &str) -> RedisGetResponse {
    let _slot = redis.slots.clone().acquire_owned().await;
    let local = Redis::local_key(spoke, key);
    let failure = |error: String| RedisGetResponse { bytes: None, cache_hit: false, error };
    let mut conn = match redis.connection().await {
        Ok(c) => c,
        Err(e) => return failure(e),
    };
    let read = tokio::time::timeout(REDIS_TIMEOUT, redis::cmd("GET").arg(local.as_ref()).query_async(&mut conn)).await;
    let value: Option<Vec<u8>> = match read {
        Err(_) => return failure(format!("reading {local:?} took longer than {REDIS_TIMEOUT:?}")),
        Ok(Err(e)) => return failure(format!("GET {local:?}: {e}")),
        Ok(Ok(value)) => value,
    };
    let Some(bytes) = value else {
        tracing::debug!(key, %local, "Redis-proxy GET: miss");
        return RedisGetResponse { bytes: None, cache_hit: false, error: String::new() };
    };
    // Base64 in JSON takes 4/3 of the value; leave room for the envelope.
    let room = spoke.config().max_message_bytes.saturating_sub(64 << 10) / 4 * 3;
    if bytes.len() > room {
        return failure(format!(
            "the value of {local:?} is {} bytes, more than the event stream carries ({room}; --grpc-max-message-size)",
            bytes.len()
        ));
    }
    tracing::debug!(key, %local, bytes = bytes.len(), "Redis-proxy GET: hit");
    RedisGetResponse { bytes: Some(bytes), cache_hit: true, error: String::new() }
}

/// Subscribes for the request's connection; answered once the agent's Redis confirmed it.
async fn subscribe<H: Host>(
    spoke: &Arc<H>,
    redis: &Arc<Redis>,
    req: &RedisRequest,
    channel: &str,
) -> Result<(), String> {
    let key: SubKey = (req.connection_uuid.clone(), channel.to_owned());
    let cancel = {
        let mut state = link::lock(&redis.state);
        if state.subscriptions.contains_key(&key) {
            return Ok(());
        }
        if state.subscriptions.len() >= MAX_SUBSCRIPTIONS {
            return Err(format!("this agent holds {MAX_SUBSCRIPTIONS} Redis subscriptions already"));
        }
        let cancel = redis.cancel.child_token();
        state.subscriptions.insert(key.clone(), cancel.clone());
        cancel
    };
    let local = Redis::local_key(&**spoke, channel).into_owned();
    let first = match open_subscription(redis, &local).await {
        Ok(pubsub) => pubsub,
        Err(error) => {
            link::lock(&redis.state).subscriptions.remove(&key);
            return Err(error);
        }
    };
    tracing::debug!(conn = %req.connection_uuid, channel, %local, "Redis-proxy subscription started");
    let (spoke, redis, req) = (spoke.clone(), redis.clone(), req.clone());
    tokio::spawn(async move {
        forward_messages(&*spoke, &redis, &req, &local, first, &cancel).await;
        let mut state = link::lock(&redis.state);
        state.subscriptions.remove(&key);
        if !state.subscriptions.keys().any(|(conn, _)| *conn == key.0) {
            state.last_ping.remove(&key.0);
        }
    });
    Ok(())
}

async fn open_subscription(redis: &Redis, channel: &str) -> Result<redis::aio::PubSub, String> {
    let client = redis.client()?;
    let mut pubsub = tokio::time::timeout(REDIS_TIMEOUT, client.get_async_pubsub())
        .await
        .map_err(|_| format!("connecting to Redis took longer than {REDIS_TIMEOUT:?}"))?
        .map_err(|e| format!("cannot connect to Redis: {e}"))?;
    tokio::time::timeout(REDIS_TIMEOUT, pubsub.subscribe(channel))
        .await
        .map_err(|_| format!("SUBSCRIBE {channel:?} took longer than {REDIS_TIMEOUT:?}"))?
        .map_err(|e| format!("SUBSCRIBE {channel:?}: {e}"))?;
    Ok(pubsub)
}

/// Pushes each message of `pubsub` to the principal until the subscription is idle or
/// cancelled; reconnects (with backoff) when the agent's Redis connection breaks.
async fn forward_messages<H: Host>(
    spoke: &H,
    redis: &Redis,
    req: &RedisRequest,
    local: &str,
    first: redis::aio::PubSub,
    cancel: &CancellationToken,
) {
    let channel = req.body.subscribe.as_ref().map(|s| s.channel.clone()).unwrap_or_default();
    let idle = || {
        link::lock(&redis.state).last_ping.get(&req.connection_uuid).is_none_or(|t| t.elapsed() >= SUBSCRIPTION_IDLE)
    };
    let mut pubsub = Some(first);
    let mut delay = RECONNECT_MIN;
    let mut check = tokio::time::interval(IDLE_CHECK);
    check.tick().await;
    loop {
        let mut current = match pubsub.take() {
            Some(p) => p,
            None => {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
                if idle() {
                    break;
                }
                match open_subscription(redis, local).await {
                    Ok(p) => {
                        delay = RECONNECT_MIN;
                        p
                    }
                    Err(error) => {
                        tracing::info!(%channel, %error, retry_in = ?delay, "Redis subscription cannot reconnect yet");
                        delay = (delay * 2).min(RECONNECT_MAX);
                        continue;
                    }
                }
            }
        };
        let mut messages = current.on_message();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = check.tick() => if idle() {
                    tracing::info!(conn = %req.connection_uuid, %channel,
                        "no ping from the principal for this subscription in {SUBSCRIPTION_IDLE:?}; dropped");
                    return;
                },
                msg = messages.next() => match msg {
                    Some(msg) => {
                        if !msg.get_payload_bytes().is_empty() {
                            // Argo CD only publishes empty messages; the event carries no payload.
                            tracing::debug!(%channel, "Redis message with a payload on a proxied channel; not forwarded");
                            continue;
                        }
                        let body = RedisResponseBody {
                            push_from_subscribe: Some(RedisPushFromSubscribe { channel_name: channel.clone() }),
                            ..RedisResponseBody::default()
                        };
                        respond(spoke, req, body);
                    }
                    None => {
                        tracing::info!(%channel, "the agent's Redis closed a subscription; reconnecting");
                        break;
                    }
                },
            }
        }
    }
    tracing::info!(conn = %req.connection_uuid, %channel, "Redis subscription dropped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_built_from_upstream_style_addresses() {
        let plain = RedisConfig { address: "argocd-redis:6379".into(), username: None, password: None, tls: None };
        assert!(plain.client().is_ok());
        let creds = RedisConfig {
            username: Some("argo".into()),
            password: Some("s3cret".into()),
            tls: Some(RedisTls::Insecure),
            ..plain.clone()
        };
        let client = creds.client().expect("client");
        assert_eq!(client.get_connection_info().redis_settings().password(), Some("s3cret"));
        assert!(!format!("{creds:?}").contains("s3cret"), "the password is not logged");
        let bad_ca = RedisConfig { tls: Some(RedisTls::Ca("not a certificate".into())), ..plain };
        assert!(bad_ca.client().is_err());
    }
}
