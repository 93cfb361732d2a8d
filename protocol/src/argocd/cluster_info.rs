//! Argo CD's cluster info as its cache holds it: what `argocd cluster list`, `argocd cluster
//! get` and the Settings → Clusters page show for a cluster (version, connection status and
//! message, cache counts).
//!
//! Argo CD v3.5 (`util/cache/appstate/cache.go`, `util/cache/cache.go`, `util/cache/redis.go`,
//! `pkg/apis/application/v1alpha1/types.go`):
//! * **key**: `cluster|info|<server>` (`clusterInfoKey`), then `|` and the cache version
//!   `1.8.3` (`common.CacheVersion`, `generateFullKey`), then `.gz` when the cache compresses
//!   (`redisCache.getKey`; Argo CD's default `--redis-compression gzip`). `<server>` is the
//!   cluster secret's `server` exactly, query included (`https://host:port?agentName=a`).
//! * **value**: `ClusterInfo` as Go's `json.Encoder` writes it (struct field order, the
//!   `omitempty` tags below, `<`, `>`, `&` escaped, a trailing newline), gzipped when the key
//!   ends in `.gz` (`redisCache.marshal`), stored as is by go-redis/cache (a `[]byte` value is
//!   not msgpack'd).
//! * **TTL**: 10 minutes (`clusterInfoCacheExpiration`, not configurable): go-redis sends
//!   `SET key value EX 600`. A writer that wants the info to stay re-writes it before then.
//!
//! Times are `metav1.Time`: RFC 3339 in UTC, whole seconds; `null` when unset
//! (`attemptedAt` has no `omitempty`).

use std::io::{Read as _, Write as _};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Argo CD's `common.CacheVersion`, the suffix of every cache key.
pub const CACHE_VERSION: &str = "1.8.3";

/// Argo CD's `clusterInfoCacheExpiration`: a cluster info expires this long after it was
/// written.
pub const TTL_SECONDS: u64 = 600;

/// `ConnectionState.status` values (`ConnectionStatus*`).
pub const STATUS_SUCCESSFUL: &str = "Successful";
/// The connection failed (for an agent: it is not connected).
pub const STATUS_FAILED: &str = "Failed";
/// Not known.
pub const STATUS_UNKNOWN: &str = "Unknown";

/// The largest value [`decode`] reads (decompressed): a cluster info is a few hundred bytes,
/// a few KiB with API versions.
pub const MAX_DECODED_BYTES: usize = 1 << 20;

/// The cache key of `server`'s cluster info.
#[must_use]
pub fn key(server: &str, gzip: bool) -> String {
    format!("cluster|info|{server}|{CACHE_VERSION}{}", if gzip { ".gz" } else { "" })
}

/// `v1alpha1.ClusterInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInfo {
    /// The connection to the cluster (`omitempty` has no effect on a Go struct: always
    /// written).
    #[serde(default)]
    pub connection_state: ConnectionState,
    /// The Kubernetes version of the cluster (what Argo CD's VERSION column shows, and what
    /// `argocd app diff --local` renders Helm charts for).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub server_version: String,
    /// The cluster cache's counts (always written).
    #[serde(default)]
    pub cache_info: ClusterCacheInfo,
    /// Applications deployed to the cluster (always written).
    #[serde(default)]
    pub applications_count: i64,
    /// API versions the cluster serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_versions: Vec<String>,
}

/// `v1alpha1.ConnectionState`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionState {
    /// [`STATUS_SUCCESSFUL`], [`STATUS_FAILED`] or [`STATUS_UNKNOWN`].
    #[serde(default)]
    pub status: String,
    /// Human-readable detail (the MESSAGE column).
    #[serde(default)]
    pub message: String,
    /// When the status was determined (`ModifiedAt`, JSON name `attemptedAt`, `null` when
    /// unset).
    #[serde(rename = "attemptedAt", default, with = "go_time")]
    pub modified_at: Option<DateTime<Utc>>,
}

/// `v1alpha1.ClusterCacheInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCacheInfo {
    /// Resources in the cluster cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resources_count: i64,
    /// API resources (kinds) in the cluster cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub apis_count: i64,
    /// When the cluster cache last synchronised.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "go_time")]
    pub last_cache_sync_time: Option<DateTime<Utc>>,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// A value could not be read as a cluster info.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterInfoError {
    /// The gzip stream is broken.
    #[error("the cached cluster info is not valid gzip: {0}")]
    Gzip(#[source] std::io::Error),
    /// Larger than [`MAX_DECODED_BYTES`] decompressed.
    #[error("the cached cluster info is larger than {MAX_DECODED_BYTES} bytes")]
    TooLarge,
    /// Not the JSON of a cluster info.
    #[error("the cached cluster info is not a ClusterInfo in JSON: {0}")]
    Json(#[source] serde_json::Error),
}

/// `info` as Argo CD's cache stores it: Go's JSON and a newline, gzipped when `gzip`.
#[must_use]
pub fn encode(info: &ClusterInfo, gzip: bool) -> Vec<u8> {
    // Serialising plain structs of strings and integers cannot fail.
    let json = serde_json::to_string(info).unwrap_or_default();
    let mut text = go_escape(&json).into_bytes();
    text.push(b'\n');
    if !gzip {
        return text;
    }
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    let _ = encoder.write_all(&text);
    encoder.finish().unwrap_or_default()
}

/// A cached value (gzip when `gzip`) read as Argo CD reads it (`redisCache.unmarshal`: gunzip,
/// then one JSON value; fields it does not know are ignored).
///
/// # Errors
///
/// [`ClusterInfoError`] when the value is not a (gzipped) cluster info.
pub fn decode(value: &[u8], gzip: bool) -> Result<ClusterInfo, ClusterInfoError> {
    if !gzip {
        if value.len() > MAX_DECODED_BYTES {
            return Err(ClusterInfoError::TooLarge);
        }
        return first_value(value).map_err(ClusterInfoError::Json);
    }
    let mut out = Vec::new();
    let limit = u64::try_from(MAX_DECODED_BYTES).unwrap_or(u64::MAX).saturating_add(1);
    let read = flate2::read::GzDecoder::new(value).take(limit).read_to_end(&mut out);
    if out.len() > MAX_DECODED_BYTES {
        return Err(ClusterInfoError::TooLarge);
    }
    match read {
        Ok(_) => first_value(&out).map_err(ClusterInfoError::Json),
        // Argo CD releases before v3.5 flushed their gzip writer without closing it: no final
        // block, no trailer. Go's reader hands the JSON decoder every byte up to there, and it
        // stops after one value; so do we.
        Err(e) => first_value(&out).map_err(|_| ClusterInfoError::Gzip(e)),
    }
}

/// The first JSON value of `bytes` (Go's `json.Decoder.Decode` reads one and stops).
fn first_value(bytes: &[u8]) -> Result<ClusterInfo, serde_json::Error> {
    let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<ClusterInfo>();
    match values.next() {
        Some(value) => value,
        None => serde_json::from_slice(b""),
    }
}

/// JSON from `serde_json` escaped as Go's `encoding/json` escapes it: `<`, `>`, `&`, U+2028 and
/// U+2029 as `\u` escapes. These appear only inside strings, so replacing them in the whole
/// text is safe; control characters and quotes both encoders escape alike (Go ≥ 1.22).
#[must_use]
pub fn go_escape(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// `metav1.Time` in JSON: whole-second RFC 3339 in UTC; `null` for none.
mod go_time {
    use super::{DateTime, Deserialize as _, Deserializer, SecondsFormat, Serializer, Utc};

    #[allow(clippy::ref_option)] // serde's `with` passes a reference to the field
    pub(super) fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Secs, true)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(text) => DateTime::parse_from_rfc3339(&text)
                .map(|t| Some(t.with_timezone(&Utc)))
                .map_err(|e| serde::de::Error::custom(format!("{text:?} is not an RFC 3339 time: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).expect("time").with_timezone(&Utc)
    }

    #[test]
    fn keys_as_argo_cd_names_them() {
        assert_eq!(key("https://kubernetes.default.svc", true), "cluster|info|https://kubernetes.default.svc|1.8.3.gz");
        assert_eq!(
            key("https://proxy:9090?agentName=agent-a", false),
            "cluster|info|https://proxy:9090?agentName=agent-a|1.8.3"
        );
    }

    /// The info of the Argo CD vectors (`testdata/cluster_info_argocd_v3.5.1.tsv`).
    fn argo_cd_vector_info() -> ClusterInfo {
        ClusterInfo {
            connection_state: ConnectionState {
                status: STATUS_SUCCESSFUL.into(),
                message: "Agent: 'agent-a' is connected with principal <v0.1.0 & co>".into(),
                modified_at: Some(at("2026-12-02T17:31:23.456789Z")),
            },
            server_version: "1.37".into(),
            cache_info: ClusterCacheInfo {
                resources_count: 120,
                apis_count: 41,
                last_cache_sync_time: Some(at("2026-12-02T18:31:23+01:00")),
            },
            applications_count: 3,
            api_versions: vec![],
        }
    }

    /// The bytes Go's `json.NewEncoder(w).Encode(&v1alpha1.ClusterInfo{...})` writes, derived
    /// from the struct tags in Argo CD v3.5.1's `types.go` and `metav1.Time.MarshalJSON`.
    #[test]
    fn encodes_as_go_does() {
        let text = String::from_utf8(encode(&argo_cd_vector_info(), false)).expect("utf-8");
        assert_eq!(
            text,
            concat!(
                r#"{"connectionState":{"status":"Successful","message":"Agent: 'agent-a' is connected with principal \u003cv0.1.0 \u0026 co\u003e","attemptedAt":"2026-12-02T17:31:23Z"},"#,
                r#""serverVersion":"1.37","cacheInfo":{"resourcesCount":120,"apisCount":41,"lastCacheSyncTime":"2026-12-02T17:31:23Z"},"#,
                r#""applicationsCount":3}"#,
                "\n"
            )
        );
        // Go's zero values: empty structs and a count of 0 are still written, a nil time is null.
        let empty = String::from_utf8(encode(&ClusterInfo::default(), false)).expect("utf-8");
        assert_eq!(
            empty,
            "{\"connectionState\":{\"status\":\"\",\"message\":\"\",\"attemptedAt\":null},\"cacheInfo\":{},\"applicationsCount\":0}\n"
        );
    }

    /// What real Argo CD v3.5.1 stored (its cache code on a real redis-server): the same key and
    /// TTL; uncompressed, our bytes are Go's byte for byte; gzipped, the same text inside (gzip
    /// streams differ by compressor); both decode to the info (times in whole seconds).
    #[test]
    fn matches_real_argo_cd_v3_5_1() {
        let server = "https://127.0.0.1:9090?agentName=agent-a";
        let mut info = argo_cd_vector_info();
        let mut whole = info.clone();
        whole.connection_state.modified_at = Some(at("2026-12-02T17:31:23Z"));
        let gunzip = |bytes: &[u8]| {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(bytes).read_to_end(&mut out).expect("gunzip");
            out
        };
        let mut rows = 0;
        for line in include_str!("testdata/cluster_info_argocd_v3.5.1.tsv").lines().filter(|l| !l.starts_with('#')) {
            let fields: Vec<&str> = line.split('\t').collect();
            let [compression, stored_key, ttl, value] = fields[..] else { panic!("row {line:?}") };
            let stored = hex::decode(value).expect("hex");
            let gzip = compression == "gzip";
            assert_eq!(stored_key, key(server, gzip));
            assert_eq!(ttl, TTL_SECONDS.to_string());
            assert_eq!(decode(&stored, gzip).expect("decode"), whole);
            if gzip {
                assert_eq!(gunzip(&encode(&info, true)), gunzip(&stored));
            } else {
                assert_eq!(encode(&info, false), stored, "byte for byte");
            }
            rows += 1;
        }
        assert_eq!(rows, 2);
        info.connection_state.modified_at = None;
        assert!(decode(&encode(&info, true), true).expect("decode").connection_state.modified_at.is_none());
    }

    #[test]
    fn round_trips_through_gzip() {
        let info = ClusterInfo {
            connection_state: ConnectionState {
                status: STATUS_FAILED.into(),
                message: "Agent: 'a' is disconnected with principal".into(),
                modified_at: Some(at("2026-01-02T03:04:05Z")),
            },
            applications_count: 2,
            ..ClusterInfo::default()
        };
        let value = encode(&info, true);
        assert_eq!(&value[..2], &[0x1f, 0x8b], "gzip");
        assert_eq!(decode(&value, true).expect("decode"), info);
        assert!(decode(&value, false).is_err(), "gzip is not JSON");
        assert!(decode(b"{\"connectionState\":", false).is_err());
    }

    /// What Argo CD's own controller writes (`clusterinfoupdater.go`), with fields this type
    /// does not model, reads back; a value from an Argo CD that flushed its gzip stream without
    /// closing it too.
    #[test]
    fn decodes_what_argo_cd_writes() {
        let text = concat!(
            r#"{"connectionState":{"status":"Successful","message":"","attemptedAt":"2026-12-02T17:31:23Z"},"#,
            r#""serverVersion":"1.37","cacheInfo":{"resourcesCount":7,"apisCount":5,"lastCacheSyncTime":"2026-12-02T17:30:00Z"},"#,
            r#""applicationsCount":1,"apiVersions":["v1","apps/v1"],"newerField":{"x":1}}"#,
            "\n"
        );
        let mut flushed = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        flushed.write_all(text.as_bytes()).expect("write");
        flushed.flush().expect("flush");
        let unclosed = flushed.get_ref().clone();
        for value in [decode(text.as_bytes(), false), decode(&unclosed, true)] {
            let info = value.expect("decode");
            assert_eq!(info.connection_state.status, STATUS_SUCCESSFUL);
            assert_eq!(info.cache_info.resources_count, 7);
            assert_eq!(info.cache_info.last_cache_sync_time, Some(at("2026-12-02T17:30:00Z")));
            assert_eq!(info.api_versions, ["v1", "apps/v1"]);
            assert_eq!(info.server_version, "1.37");
        }
        let null_time = decode(br#"{"connectionState":{"status":"Unknown","message":"m","attemptedAt":null}}"#, false)
            .expect("decode");
        assert_eq!(null_time.connection_state.modified_at, None);
    }

    /// The fuzz target's check (`fuzz/fuzz_targets/cluster_info_decode.rs`) over what real Argo
    /// CD v3.5.1 stored, truncated and with a flipped byte.
    #[test]
    fn fuzz_check_over_real_argo_cd_values() {
        let mut inputs = vec![Vec::new(), b"null".to_vec(), b"{}\n{}".to_vec()];
        for line in include_str!("testdata/cluster_info_argocd_v3.5.1.tsv").lines().filter(|l| !l.starts_with('#')) {
            let value = hex::decode(line.rsplit('\t').next().expect("a value")).expect("hex");
            for cut in [value.len(), value.len() / 2, 10] {
                inputs.push(value[..cut.min(value.len())].to_vec());
            }
            let mut flipped = value.clone();
            let middle = flipped.len() / 2;
            flipped[middle] ^= 0x20;
            inputs.push(flipped);
        }
        for input in &inputs {
            crate::fuzzing::check_cluster_info_decode(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        }
    }
}
