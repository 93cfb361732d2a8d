//! What an agent answers for one key or channel, on the replica that holds the agent's stream:
//! `GET` (the value, a miss, or why not), `SUBSCRIBE` (subscribed, or why not) and the
//! subscription's keep-alive. The client connections of this replica's Redis proxy use it
//! ([`super::connection`]), and so do the requests other replicas forward to this one
//! ([`super::replica`]).

use std::time::Instant;

use protocol::payload::{AppCacheKind, RedisCommandBody, RedisGet, RedisSubscribe};
use tokio_util::sync::CancellationToken;

use super::RedisProxy;
use super::ask::{AskError, ask};
use super::route::AgentKey;
use crate::config::AgentMode;

/// What a `GET` of an agent's key read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Read {
    /// The value (an autonomous agent's resource tree rewritten, upstream #1048).
    Hit(Vec<u8>),
    /// No such key.
    Miss,
    /// Why there is no answer (the client's error reply).
    Failed(String),
}

/// `GET` of `target`'s `key` through its agent, for client connection `conn`.
pub(super) async fn get(proxy: &RedisProxy, conn: &str, target: &AgentKey, key: &str) -> Read {
    let started = Instant::now();
    let config = &proxy.config;
    let asked = ask(
        &proxy.hub,
        &proxy.exchange,
        &target.agent,
        conn,
        RedisCommandBody { get: Some(RedisGet { key: key.to_owned() }), ..RedisCommandBody::default() },
        config.request_timeout,
        config.max_in_flight_per_agent,
    )
    .await;
    let metrics = crate::metrics::global();
    match asked {
        Ok(body) => match body.get {
            Some(answer) if !answer.error.is_empty() => {
                metrics.redis_request(&target.agent, "get", "error", Some("agent_error"), started.elapsed());
                Read::Failed(format!("agent {:?} cannot read its Redis: {}", target.agent, answer.error))
            }
            Some(answer) if answer.cache_hit => {
                metrics.redis_request(&target.agent, "get", "hit", None, started.elapsed());
                let value = answer.bytes.unwrap_or_default();
                Read::Hit(rewritten(proxy, target, key, value))
            }
            Some(_) => {
                metrics.redis_request(&target.agent, "get", "miss", None, started.elapsed());
                Read::Miss
            }
            None => {
                metrics.redis_request(&target.agent, "get", "error", Some("bad_answer"), started.elapsed());
                Read::Failed(format!("agent {:?} answered GET without a value or a miss", target.agent))
            }
        },
        Err(error) => {
            metrics.redis_request(&target.agent, "get", "error", Some(error.reason()), started.elapsed());
            tracing::info!(conn, agent = %target.agent, %key, %error, "Redis GET through the agent failed");
            Read::Failed(error.to_string())
        }
    }
}

/// An autonomous agent's resource tree with its Applications in the agent's hub namespace
/// (upstream #1048); anything else as it came.
fn rewritten(proxy: &RedisProxy, target: &AgentKey, key: &str, value: Vec<u8>) -> Vec<u8> {
    let autonomous = proxy.hub.peers.get(&target.agent).is_some_and(|p| p.mode() == AgentMode::Autonomous);
    if !autonomous || target.kind != AppCacheKind::ResourcesTree {
        return value;
    }
    match protocol::resp::tree::rewrite_app_namespaces(&value, target.gzip, &target.agent, proxy.config.max_tree_bytes)
    {
        Ok(Some(tree)) => tree,
        Ok(None) => value,
        Err(error) => {
            tracing::warn!(agent = %target.agent, %key, %error, "cached resource tree passed on without the namespace rewrite");
            value
        }
    }
}

/// `SUBSCRIBE` of `channel` through `agent` for connection `conn` (registered with the
/// exchange by the caller first: a message may follow the agent's answer at once); `Err`: why
/// not.
pub(super) async fn subscribe(proxy: &RedisProxy, conn: &str, agent: &str, channel: &str) -> Result<(), String> {
    let started = Instant::now();
    let config = &proxy.config;
    let asked = ask(
        &proxy.hub,
        &proxy.exchange,
        agent,
        conn,
        RedisCommandBody {
            subscribe: Some(RedisSubscribe { channel: channel.to_owned() }),
            ..RedisCommandBody::default()
        },
        config.request_timeout,
        config.max_in_flight_per_agent,
    )
    .await;
    let error = match asked {
        Ok(body) => match body.subscribe_response {
            Some(answer) if answer.error.is_empty() => None,
            Some(answer) => {
                Some((format!("agent {agent:?} cannot subscribe to {channel:?}: {}", answer.error), "agent_error"))
            }
            None => Some((format!("agent {agent:?} answered SUBSCRIBE without a result"), "bad_answer")),
        },
        Err(e) => Some((e.to_string(), e.reason())),
    };
    let metrics = crate::metrics::global();
    if let Some((message, reason)) = error {
        metrics.redis_request(agent, "subscribe", "error", Some(reason), started.elapsed());
        tracing::info!(conn, %agent, %channel, %message, "Redis SUBSCRIBE through the agent failed");
        return Err(message);
    }
    metrics.redis_request(agent, "subscribe", "subscribed", None, started.elapsed());
    tracing::debug!(conn, %agent, %channel, "subscribed through the agent");
    Ok(())
}

/// Pings `agent` for connection `conn` while it lives, as upstream's principal does (an
/// upstream agent drops subscriptions it has seen no ping for in 10 minutes); no answer loses
/// the connection's subscriptions.
pub(super) async fn keep_alive(proxy: RedisProxy, conn: String, agent: String, cancel: CancellationToken) {
    let config = &proxy.config;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(config.ping_interval) => {}
        }
        let started = Instant::now();
        let body = RedisCommandBody { ping: Some(protocol::payload::Empty {}), ..RedisCommandBody::default() };
        let asked = tokio::select! {
            () = cancel.cancelled() => return,
            asked = ask(&proxy.hub, &proxy.exchange, &agent, &conn, body, config.request_timeout, config.max_in_flight_per_agent) => asked,
        };
        match asked {
            Ok(_) => crate::metrics::global().redis_request(&agent, "ping", "pong", None, started.elapsed()),
            Err(error) => {
                crate::metrics::global().redis_request(
                    &agent,
                    "ping",
                    "error",
                    Some(error.reason()),
                    started.elapsed(),
                );
                let lost = match error {
                    AskError::Busy { .. } => continue,
                    other => other,
                };
                proxy.exchange.lose(&conn, format!("agent {agent:?} did not answer the subscription's ping: {lost}"));
                return;
            }
        }
    }
}
