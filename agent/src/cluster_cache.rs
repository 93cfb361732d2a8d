//! The agent's cluster cache report (upstream `addClusterCacheInfoUpdateToQueue`): what this
//! cluster's Argo CD knows of its own cluster, sent to the principal as a
//! `cluster-cache-info-update`, which writes it into the hub's Argo CD Redis so that `argocd
//! cluster list` and the Clusters page show this agent's counts.
//!
//! As upstream, the source is the cluster info this cluster's application controller caches
//! for the in-cluster destination (`cluster|info|https://kubernetes.default.svc|1.8.3.gz` in
//! this cluster's Argo CD Redis, [`protocol::argocd::cluster_info`]); nothing is sent while it
//! is missing (no controller, or it has not synced yet). Sent: the applications, API resources
//! and resources counts (upstream's fields), and, our extension that upstream principals
//! ignore, the cache's last sync time and the cluster's Kubernetes version.
//!
//! Better than upstream: sent at once when a stream starts and then every
//! `--cache-refresh-interval` (upstream: 10 s, first after one interval) only when it changed
//! (the principal keeps the last report for the stream's life); also by autonomous agents
//! (upstream: managed only), so both kinds show counts on the hub; a cache written without
//! compression (Argo CD's `--redis-compression none`) is read too.

use std::sync::Arc;
use std::time::Duration;

use protocol::argocd::cluster_info::{self, ClusterInfo};
use protocol::payload::ClusterCacheInfo;
use protocol::{Event, EventType, Target};

use crate::host::Host;
use crate::redis::Redis;

/// The destination upstream's agent reads its cluster's info for.
pub const IN_CLUSTER: &str = "https://kubernetes.default.svc";

/// Reports this cluster's cache to the principal every `interval` while the stream lasts
/// (abort the task when it ends).
pub(crate) async fn every<H: Host>(spoke: Arc<H>, redis: Arc<Redis>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last: Option<ClusterCacheInfo> = None;
    let mut last_error: Option<String> = None;
    loop {
        tick.tick().await;
        match read(&redis).await {
            Ok(Some(report)) => {
                last_error = None;
                if last.as_ref() == Some(&report) {
                    continue;
                }
                match Event::request(
                    EventType::ClusterCacheInfoUpdate,
                    Target::ClusterCacheInfoUpdate,
                    &protocol::event::new_uuid(),
                )
                .with_json(&report)
                {
                    Ok(ev) => {
                        tracing::debug!(?report, "cluster cache info queued for the principal");
                        spoke.mailbox().push(ev);
                        last = Some(report);
                    }
                    Err(error) => tracing::warn!(%error, "cannot encode the cluster cache info"),
                }
            }
            Ok(None) => tracing::debug!("no cluster info in this cluster's Argo CD Redis yet; nothing reported"),
            Err(error) => {
                if last_error.as_ref() != Some(&error) {
                    tracing::warn!(%error, "cannot read this cluster's Argo CD cluster info; retrying each interval");
                }
                last_error = Some(error);
            }
        }
    }
}

/// The report from this cluster's Argo CD Redis; `None` when it holds no cluster info.
async fn read(redis: &Redis) -> Result<Option<ClusterCacheInfo>, String> {
    for gzip in [true, false] {
        let key = cluster_info::key(IN_CLUSTER, gzip);
        if let Some(value) = redis.get(&key).await? {
            let info = cluster_info::decode(&value, gzip).map_err(|e| format!("{key:?}: {e}"))?;
            return Ok(Some(report(&info)));
        }
    }
    Ok(None)
}

/// What is reported of `info`.
#[must_use]
pub fn report(info: &ClusterInfo) -> ClusterCacheInfo {
    ClusterCacheInfo {
        applications_count: info.applications_count,
        apis_count: info.cache_info.apis_count,
        resources_count: info.cache_info.resources_count,
        last_cache_sync_time: info
            .cache_info
            .last_cache_sync_time
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        server_version: Some(info.server_version.clone()).filter(|v| !v.is_empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_upstreams_counts_and_our_extensions() {
        let value = concat!(
            r#"{"connectionState":{"status":"Successful","message":"","attemptedAt":"2026-12-02T17:31:23Z"},"#,
            r#""serverVersion":"1.37","cacheInfo":{"resourcesCount":7,"apisCount":5,"lastCacheSyncTime":"2026-12-02T17:30:00Z"},"#,
            r#""applicationsCount":1}"#
        );
        let info = cluster_info::decode(value.as_bytes(), false).expect("decode");
        let sent = serde_json::to_value(report(&info)).expect("json");
        assert_eq!(
            sent,
            serde_json::json!({"applicationsCount": 1, "apisCount": 5, "resourcesCount": 7,
                "lastCacheSyncTime": "2026-12-02T17:30:00Z", "serverVersion": "1.37"})
        );
        // Nothing known: upstream's three counts only.
        let sent = serde_json::to_value(report(&ClusterInfo::default())).expect("json");
        assert_eq!(sent, serde_json::json!({"applicationsCount": 0, "apisCount": 0, "resourcesCount": 0}));
    }
}
