//! Redis-proxy requests and responses (target `redis`).

use serde::{Deserialize, Serialize};

/// A Redis command forwarded from the principal's redis proxy to an agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RedisRequest {
    /// The request's UUID.
    pub uuid: String,
    /// The proxied client connection's UUID.
    pub connection_uuid: String,
    /// The command.
    pub body: RedisCommandBody,
}

/// One of the supported Redis commands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RedisCommandBody {
    /// `GET key`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub get: Option<RedisGet>,
    /// `SUBSCRIBE channel`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscribe: Option<RedisSubscribe>,
    /// `PING`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ping: Option<Empty>,
}

/// `GET` arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RedisGet {
    /// The key.
    pub key: String,
}

/// `SUBSCRIBE` arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RedisSubscribe {
    /// The channel.
    pub channel: String,
}

/// An empty JSON object, `{}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

/// The agent's answer to a [`RedisRequest`], or a message pushed on a subscription.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RedisResponse {
    /// The request's UUID.
    pub uuid: String,
    /// The proxied client connection's UUID.
    pub connection_uuid: String,
    /// The result.
    pub body: RedisResponseBody,
}

/// One of the Redis results.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RedisResponseBody {
    /// Result of `GET`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub get: Option<RedisGetResponse>,
    /// Result of `SUBSCRIBE`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscribe_response: Option<RedisSubscribeResponse>,
    /// A message on a subscribed channel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push_from_subscribe: Option<RedisPushFromSubscribe>,
    /// Result of `PING`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pong: Option<Empty>,
}

/// Result of `GET`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RedisGetResponse {
    /// The value (base64 in JSON; `null` when nil).
    #[serde(with = "super::go_bytes::option")]
    pub bytes: Option<Vec<u8>>,
    /// Whether the key existed.
    pub cache_hit: bool,
    /// An error message, empty on success.
    pub error: String,
}

/// Result of `SUBSCRIBE`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RedisSubscribeResponse {
    /// An error message, empty on success.
    pub error: String,
}

/// A message on a subscribed channel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RedisPushFromSubscribe {
    /// The channel.
    pub channel_name: String,
}
