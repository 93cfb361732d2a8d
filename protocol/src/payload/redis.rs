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

/// What an Argo CD application-state cache key holds (`util/cache/appstate/cache.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppCacheKind {
    /// `app|managed-resources|<app>|<cache version>`: the managed resources (also the channel
    /// Argo CD publishes to when the tree changes).
    ManagedResources,
    /// `app|resources-tree|<app>[|<shard>]|<cache version>`: the resource tree.
    ResourcesTree,
}

/// An Argo CD cache key of one Application's state, the keys the Redis proxy routes to the
/// Application's agent (upstream `extractAgentNameFromRedisCommandKey`).
///
/// `<app>` is Argo CD's instance name: `<namespace>_<name>`, or `<name>` alone for an
/// Application in Argo CD's own namespace (a namespace or an Application name never holds
/// `_`). Keys of the gzip cache end in `.gz`. Besides upstream's four-field keys, the shard keys
/// Argo CD writes with `ARGOCD_APPLICATION_TREE_SHARD_SIZE` (`app|resources-tree|<app>|<n>|<v>`)
/// are recognised; upstream fails those.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppCacheKey<'a> {
    /// Which state.
    pub kind: AppCacheKind,
    /// The Application's namespace, when the key names one.
    pub namespace: Option<&'a str>,
    /// The Application's name.
    pub name: &'a str,
    /// Whether the value is gzip (`.gz`).
    pub gzip: bool,
}

const MANAGED_RESOURCES: &str = "app|managed-resources|";
const RESOURCES_TREE: &str = "app|resources-tree|";

impl<'a> AppCacheKey<'a> {
    /// Parses `key`; `None` for any other key (`mfst|`, `cluster|`, `git-refs|`,
    /// `new-revoked-token`, ..., or a malformed one), which stays on the hub's Redis.
    #[must_use]
    pub fn parse(key: &'a str) -> Option<Self> {
        let (kind, rest) = if let Some(rest) = key.strip_prefix(MANAGED_RESOURCES) {
            (AppCacheKind::ManagedResources, rest)
        } else if let Some(rest) = key.strip_prefix(RESOURCES_TREE) {
            (AppCacheKind::ResourcesTree, rest)
        } else {
            return None;
        };
        let fields: Vec<&str> = rest.split('|').collect();
        let (app, version) = match (kind, fields.as_slice()) {
            (_, [app, version]) => (*app, *version),
            (AppCacheKind::ResourcesTree, [app, shard, version])
                if !shard.is_empty() && shard.bytes().all(|b| b.is_ascii_digit()) =>
            {
                (*app, *version)
            }
            _ => return None,
        };
        if app.is_empty() || version.is_empty() {
            return None;
        }
        let (namespace, name) = match app.split_once('_') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('_') => (Some(ns), name),
            Some(_) => return None,
            None => (None, app),
        };
        Some(Self { kind, namespace, name, gzip: version.ends_with(".gz") })
    }
}

/// `key` as the agent's own Argo CD names it: the `<namespace>_` of the Application part
/// removed (upstream `stripNamespaceFromRedisKey`; the agent's Applications live in its Argo
/// CD's namespace). Any other key is returned unchanged.
#[must_use]
pub fn strip_app_namespace(key: &str) -> std::borrow::Cow<'_, str> {
    let Some(parsed) = AppCacheKey::parse(key) else { return key.into() };
    let Some(namespace) = parsed.namespace else { return key.into() };
    let prefix = match parsed.kind {
        AppCacheKind::ManagedResources => MANAGED_RESOURCES,
        AppCacheKind::ResourcesTree => RESOURCES_TREE,
    };
    let rest = &key[prefix.len() + namespace.len() + 1..];
    format!("{prefix}{rest}").into()
}

#[cfg(test)]
mod key_tests {
    use super::*;

    #[test]
    fn argo_cd_keys_name_their_application() {
        let k = AppCacheKey::parse("app|resources-tree|agent-managed_guestbook|1.8.3.gz").expect("app key");
        assert_eq!(
            k,
            AppCacheKey {
                kind: AppCacheKind::ResourcesTree,
                namespace: Some("agent-managed"),
                name: "guestbook",
                gzip: true
            }
        );
        let k = AppCacheKey::parse("app|managed-resources|guestbook|1.8.3").expect("app key");
        assert_eq!((k.kind, k.namespace, k.name, k.gzip), (AppCacheKind::ManagedResources, None, "guestbook", false));
        let shard = AppCacheKey::parse("app|resources-tree|a_b|2|1.8.3.gz").expect("shard key");
        assert_eq!((shard.namespace, shard.name), (Some("a"), "b"));
        for other in [
            "mfst|annotation:app.kubernetes.io/instance|agent-managed_my-app|abc|guestbook|3093507789|1.8.3.gz",
            "cluster|info|https://kubernetes.default.svc|1.8.3.gz",
            "new-revoked-token",
            "git-refs|https://github.com/x|1.8.3.gz",
            "app|managed-resources|a_b|2|1.8.3",
            "app|resources-tree|a_b|x|1.8.3",
            "app|resources-tree|a_b",
            "app|resources-tree|_b|1.8.3",
            "app|resources-tree|a_|1.8.3",
            "app|resources-tree||1.8.3",
            "app|resources-tree|a_b_c|1.8.3",
        ] {
            assert_eq!(AppCacheKey::parse(other), None, "{other}");
        }
    }

    #[test]
    fn the_agent_reads_its_keys_without_the_hub_namespace() {
        assert_eq!(
            strip_app_namespace("app|resources-tree|agent-managed_guestbook|1.8.3.gz"),
            "app|resources-tree|guestbook|1.8.3.gz"
        );
        assert_eq!(strip_app_namespace("app|managed-resources|a_b|1.8.3"), "app|managed-resources|b|1.8.3");
        assert_eq!(strip_app_namespace("app|resources-tree|a_b|3|1.8.3.gz"), "app|resources-tree|b|3|1.8.3.gz");
        assert_eq!(strip_app_namespace("app|managed-resources|b|1.8.3"), "app|managed-resources|b|1.8.3");
        assert_eq!(strip_app_namespace("mfst|x"), "mfst|x");
    }
}
