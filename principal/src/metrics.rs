//! The principal's Prometheus metrics (docs/operations/metrics.md), in the text exposition
//! format 0.0.4 that `promtool check metrics` accepts.
//!
//! Names and labels are upstream's where upstream has the metric (docs/operations/metrics.md);
//!, with one systematic difference: counters always end in `_total` (upstream's
//! `principal_events_received` is `principal_events_received_total` here, the name it gets
//! when upstream is scraped as OpenMetrics). What upstream lacks carries the
//! `argocd_principal_` prefix: per-agent outbox depth and oldest-unacked age, resync counts and
//! durations, authentication failures by method and reason, stream ends by cause.
//!
//! The registry is process-wide ([`global`]), as upstream's default registry: instrumented
//! code records with one call, wherever it runs.
//!
//! **Per-agent series** (label `agent_name`) live as long as the agent is connected, and for
//! [`DEFAULT_AGENT_RETENTION`] (see [`PrincipalMetrics::set_agent_retention`]) after its last
//! stream ended; an agent disconnected longer than that counts as gone, and every series
//! naming it is removed at the next scrape (its counters start again from zero if it returns).
//! Upstream removes them when the agent's cluster secret is deleted; this implementation has
//! no cluster secrets yet.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use protocol::metrics::{CounterVec, DEFAULT_BUCKETS, HistogramVec, event_type, gauge, resource_type, single};
use protocol::{Event, Target};

use crate::config::AgentMode;
use crate::error::InboundError;
use crate::peer::Peers;

/// How long an agent's series outlive its last stream by default.
pub const DEFAULT_AGENT_RETENTION: Duration = Duration::from_secs(15 * 60);

/// The principal's metrics, shared by the whole process.
#[must_use]
pub fn global() -> &'static PrincipalMetrics {
    static METRICS: LazyLock<PrincipalMetrics> = LazyLock::new(PrincipalMetrics::new);
    &METRICS
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One agent's connection bookkeeping.
#[derive(Debug, Default)]
struct Presence {
    /// Streams open now (a replacing stream opens before the replaced one ends).
    streams: usize,
    connected_since: Option<Instant>,
    disconnected_at: Option<Instant>,
}

/// Every metric the principal exports. Record through [`global`].
#[derive(Debug)]
pub struct PrincipalMetrics {
    retention: Mutex<Duration>,
    agents: Mutex<BTreeMap<String, Presence>>,
    events_received: AtomicU64,
    events_sent: AtomicU64,
    event_processing: HistogramVec,
    errors: CounterVec,
    agent_connections: CounterVec,
    send_errors: CounterVec,
    discarded: CounterVec,
    disconnects: CounterVec,
    resyncs: CounterVec,
    resync_duration: HistogramVec,
    auth_failures: CounterVec,
    status_writes: CounterVec,
    proxy_requests: CounterVec,
    proxy_errors: CounterVec,
    proxy_duration: HistogramVec,
    /// Pod-log bytes streamed through the resource proxy, by agent.
    proxy_log_bytes: Mutex<BTreeMap<String, u64>>,
    redis_requests: CounterVec,
    redis_errors: CounterVec,
    redis_duration: HistogramVec,
    /// Agents' owner Leases this replica took from another replica, by whether that one was live.
    lease_takeovers: CounterVec,
    /// Requests forwarded to the replica that owns their agent, by surface and outcome.
    replica_forwards: CounterVec,
    /// Agents this replica stopped owning (taken by another, or its own Lease lapsed).
    leases_lost: AtomicU64,
    /// Agents' events not applied because this replica did not own the agent (re-sent by it).
    writes_fenced: AtomicU64,
}

impl Default for PrincipalMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Why a stream ended, from the status it was closed with (`None`: the agent hung up).
fn end_cause(status: Option<&tonic::Status>) -> &'static str {
    match status.map(tonic::Status::code) {
        None => "agent_closed",
        Some(tonic::Code::Aborted) => "replaced",
        Some(tonic::Code::Unauthenticated) => "session_ended",
        Some(tonic::Code::Unavailable) => "shutdown",
        Some(tonic::Code::OutOfRange) => "message_too_large",
        Some(_) => "stream_error",
    }
}

impl PrincipalMetrics {
    /// Empty metrics (tests; the process uses [`global`]).
    pub fn new() -> Self {
        Self {
            retention: Mutex::new(DEFAULT_AGENT_RETENTION),
            agents: Mutex::new(BTreeMap::new()),
            events_received: AtomicU64::new(0),
            events_sent: AtomicU64::new(0),
            event_processing: HistogramVec::new(
                "principal_event_processing_time",
                "Histogram of time taken to process events from agents (in seconds).",
                &["status", "agent_name", "resource_type"],
                DEFAULT_BUCKETS,
            ),
            errors: CounterVec::new(
                "principal_errors_total",
                "The total number of events from agents that could not be applied.",
                &["resource_type"],
            ),
            agent_connections: CounterVec::new(
                "argocd_principal_agent_connections_total",
                "The total number of successful stream connections from each agent to the principal.",
                &["agent_name"],
            ),
            send_errors: CounterVec::new(
                "principal_event_writer_send_errors_total",
                "The total number of events the principal could not write to an agent's stream.",
                &["agent_name", "reason"],
            ),
            discarded: CounterVec::new(
                "argocd_principal_event_writer_events_discarded_total",
                "The total number of events for agents given up on (retries exhausted or too large); resync repairs.",
                &["agent_name", "event_type", "resource_type"],
            ),
            disconnects: CounterVec::new(
                "argocd_principal_agent_disconnects_total",
                "The total number of agent streams that ended, by cause.",
                &["agent_name", "cause"],
            ),
            resyncs: CounterVec::new(
                "argocd_principal_resyncs_total",
                "The total number of resyncs of agents, on connect (started, failed) and periodic (in_sync, repaired, skipped), by result.",
                &["agent_name", "result"],
            ),
            resync_duration: HistogramVec::new(
                "argocd_principal_resync_duration_seconds",
                "Time to start a resync on connect: reading the hub and queueing the resync events (in seconds).",
                &["mode"],
                DEFAULT_BUCKETS,
            ),
            status_writes: CounterVec::new(
                "argocd_principal_status_writes_total",
                "The total number of managed agents' status updates written to the hub, by how: patched (one conditional merge patch), or read_modify_write after the patch was refused (refused), with no base known (no_base) or with nothing to patch against the base (unchanged).",
                &["path"],
            ),
            auth_failures: CounterVec::new(
                "argocd_principal_auth_failures_total",
                "The total number of refused authentications and calls, by method and reason.",
                &["method", "reason"],
            ),
            proxy_requests: CounterVec::new(
                "argocd_principal_resource_proxy_requests_total",
                "The total number of resource-proxy requests, by agent, verb and HTTP status.",
                &["agent_name", "verb", "code"],
            ),
            proxy_errors: CounterVec::new(
                "argocd_principal_resource_proxy_errors_total",
                "The total number of resource-proxy requests answered with an error status, by agent and reason.",
                &["agent_name", "reason"],
            ),
            redis_requests: CounterVec::new(
                "argocd_principal_redis_proxy_requests_total",
                "The total number of Redis-proxy requests sent to agents, by agent, command (get, subscribe, ping) and result.",
                &["agent_name", "command", "result"],
            ),
            redis_errors: CounterVec::new(
                "argocd_principal_redis_proxy_errors_total",
                "The total number of Redis-proxy requests to agents that failed, by agent, command and reason.",
                &["agent_name", "command", "reason"],
            ),
            redis_duration: HistogramVec::new(
                "argocd_principal_redis_proxy_request_duration_seconds",
                "Time an agent took to answer a Redis-proxy request (in seconds).",
                &["agent_name", "command"],
                DEFAULT_BUCKETS,
            ),
            proxy_log_bytes: Mutex::new(BTreeMap::new()),
            lease_takeovers: CounterVec::new(
                "argocd_principal_agent_lease_takeovers_total",
                "The total number of agents' owner Leases this replica took from another replica (--agent-leases), by whether that replica was live or expired.",
                &["from"],
            ),
            replica_forwards: CounterVec::new(
                "argocd_principal_replica_forwards_total",
                "The total number of requests this replica forwarded to the replica that owns their agent (--agent-leases), by surface (resource_proxy, redis_get, redis_subscribe) and outcome.",
                &["surface", "outcome"],
            ),
            leases_lost: AtomicU64::new(0),
            writes_fenced: AtomicU64::new(0),
            proxy_duration: HistogramVec::new(
                "argocd_principal_resource_proxy_request_duration_seconds",
                "Time to answer a resource-proxy request, agent round trip included (in seconds).",
                &["agent_name", "verb"],
                DEFAULT_BUCKETS,
            ),
        }
    }

    /// Keeps an agent's series for `retention` after its last stream ended (0: remove them at
    /// the next scrape after it disconnects).
    pub fn set_agent_retention(&self, retention: Duration) {
        *lock(&self.retention) = retention;
    }

    /// A stream of `agent` opened.
    pub fn agent_connected(&self, agent: &str) {
        let mut agents = lock(&self.agents);
        let p = agents.entry(agent.to_owned()).or_default();
        if p.streams == 0 {
            p.connected_since = Some(Instant::now());
        }
        p.streams += 1;
        p.disconnected_at = None;
        drop(agents);
        self.agent_connections.inc(&[agent]);
    }

    /// A stream of `agent` ended with `status` (`None`: the agent hung up cleanly).
    pub fn agent_disconnected(&self, agent: &str, status: Option<&tonic::Status>) {
        let mut agents = lock(&self.agents);
        let p = agents.entry(agent.to_owned()).or_default();
        p.streams = p.streams.saturating_sub(1);
        if p.streams == 0 {
            p.connected_since = None;
            p.disconnected_at = Some(Instant::now());
        }
        drop(agents);
        self.disconnects.inc(&[agent, end_cause(status)]);
    }

    /// A message arrived from an agent.
    pub fn event_received(&self) {
        self.events_received.fetch_add(1, Ordering::Relaxed);
    }

    /// A managed agent's status update went to the hub by `path` (see the family's help).
    pub fn status_write(&self, path: &str) {
        self.status_writes.inc(&[path]);
    }

    /// An event was written to an agent's stream.
    pub fn event_sent(&self) {
        self.events_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// An event from `agent` was processed with `result` in `elapsed`.
    pub(crate) fn event_processed(
        &self,
        agent: &str,
        target: &Target,
        result: &Result<(), InboundError>,
        elapsed: Duration,
    ) {
        let status = match result {
            Ok(()) => "success",
            Err(InboundError::WrongMode { .. }) => "not-allowed",
            Err(e) if link::Retryable::is_retryable(e) => "failure",
            Err(_) => "discarded",
        };
        self.event_processing.observe(&[status, agent, resource_type(target)], elapsed.as_secs_f64());
        if result.is_err() {
            self.errors.inc(&[resource_type(target)]);
        }
    }

    /// An event could not be written to `agent`'s stream (`reason`: `transport-closing`, ...).
    pub fn send_failed(&self, agent: &str, reason: &str) {
        self.send_errors.inc(&[agent, reason]);
    }

    /// An event for `agent` was given up on.
    pub fn event_discarded(&self, agent: &str, event: &Event) {
        self.discarded.inc(&[agent, event_type(&event.event_type), resource_type(&event.target)]);
    }

    /// A Redis-proxy request to `agent` ended with `result` (`hit`, `miss`, `subscribed`,
    /// `pong`, `error`), and `reason` when it failed.
    pub fn redis_request(&self, agent: &str, command: &str, result: &str, reason: Option<&str>, elapsed: Duration) {
        self.redis_requests.inc(&[agent, command, result]);
        if let Some(reason) = reason {
            self.redis_errors.inc(&[agent, command, reason]);
        }
        self.redis_duration.observe(&[agent, command], elapsed.as_secs_f64());
    }

    /// `bytes` more of a pod log of `agent` were streamed through the resource proxy.
    pub fn proxy_log_bytes(&self, agent: &str, bytes: u64) {
        if bytes > 0 {
            *lock(&self.proxy_log_bytes).entry(agent.to_owned()).or_default() += bytes;
        }
    }

    /// A resource-proxy request for `agent` (empty: not identified) was answered with `code`
    /// (`reason`: the Kubernetes `Status` reason of an error answer) in `elapsed`.
    pub fn proxy_request(&self, agent: &str, verb: &str, code: u16, reason: Option<&str>, elapsed: Duration) {
        self.proxy_requests.inc(&[agent, verb, &code.to_string()]);
        if let Some(reason) = reason {
            self.proxy_errors.inc(&[agent, reason]);
        }
        self.proxy_duration.observe(&[agent, verb], elapsed.as_secs_f64());
    }

    /// A resync for `agent` was started (`ok`: its events were queued) in `elapsed`.
    pub fn resync(&self, agent: &str, mode: AgentMode, elapsed: Duration, ok: bool) {
        self.resyncs.inc(&[agent, if ok { "started" } else { "failed" }]);
        self.resync_duration.observe(&[&mode.to_string()], elapsed.as_secs_f64());
    }

    /// A periodic resync request of `agent` (`--resync-interval` on the agent) was answered:
    /// `in_sync` (digests equal, nothing sent), `repaired` (they differed: the resync ran) or
    /// `skipped` (sooner than `--resync-min-interval` after the last).
    pub fn periodic_resync(&self, agent: &str, outcome: &str) {
        self.resyncs.inc(&[agent, outcome]);
    }

    /// This replica took an agent's owner Lease from another replica, `live` or expired.
    pub fn lease_taken_over(&self, live: bool) {
        self.lease_takeovers.inc(&[if live { "live" } else { "expired" }]);
    }

    /// A request of `surface` was forwarded to the replica that owns its agent, with `outcome`.
    pub fn replica_forward(&self, surface: &str, outcome: &str) {
        self.replica_forwards.inc(&[surface, outcome]);
    }

    /// This replica stopped owning an agent.
    pub fn lease_lost(&self) {
        self.leases_lost.fetch_add(1, Ordering::Relaxed);
    }

    /// An agent's event was not applied: this replica does not own the agent.
    pub fn write_fenced(&self) {
        self.writes_fenced.fetch_add(1, Ordering::Relaxed);
    }

    /// An authentication or call was refused: `method` (`mtls`, `xfcc`, ..., `access_token`,
    /// `refresh_token`) and a short `reason`.
    pub fn auth_failed(&self, method: &str, reason: &str) {
        self.auth_failures.inc(&[method, reason]);
    }

    /// Removes every series of agents disconnected longer than the retention; returns the
    /// agents kept.
    fn prune(&self) -> Vec<(String, bool, Option<Instant>)> {
        let retention = *lock(&self.retention);
        let now = Instant::now();
        let mut agents = lock(&self.agents);
        let gone: Vec<String> = agents
            .iter()
            .filter(|(_, p)| p.streams == 0 && p.disconnected_at.is_some_and(|t| now.duration_since(t) >= retention))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &gone {
            agents.remove(name);
        }
        let kept = agents.iter().map(|(n, p)| (n.clone(), p.streams > 0, p.connected_since)).collect();
        drop(agents);
        for name in &gone {
            tracing::debug!(agent = %name, "agent gone for longer than the metrics retention: its series are removed");
            for family in [
                &self.agent_connections,
                &self.send_errors,
                &self.discarded,
                &self.disconnects,
                &self.resyncs,
                &self.redis_requests,
                &self.redis_errors,
            ] {
                family.remove("agent_name", name);
            }
            self.event_processing.remove("agent_name", name);
            self.redis_duration.remove("agent_name", name);
            lock(&self.proxy_log_bytes).remove(name);
        }
        kept
    }

    /// The exposition text; outbox gauges come from `peers` when given.
    pub fn render(&self, peers: Option<&Peers>) -> String {
        let agents = self.prune();
        let now = Instant::now();
        let mut out = String::with_capacity(8192);
        let build: &[(&str, &str)] = &[
            ("version", env!("CARGO_PKG_VERSION")),
            ("git_revision", option_env!("ARGOCD_AGENT_GIT_REVISION").unwrap_or("unknown")),
        ];
        gauge(
            &mut out,
            "argocd_agent_build_info",
            "Build metadata for the running argocd-agent binary.",
            &[build],
            &[1.0],
        );
        let connected: Vec<_> = agents.iter().filter(|(_, c, _)| *c).collect();
        single(
            &mut out,
            "argocd_principal_connected_agents",
            "gauge",
            "The number of agents connected to the principal.",
            connected.len() as f64,
        );
        let minutes: f64 = connected
            .iter()
            .filter_map(|(_, _, since)| *since)
            .map(|s| now.duration_since(s).as_secs_f64() / 60.0)
            .sum();
        single(
            &mut out,
            "principal_agent_avg_connection_time",
            "gauge",
            "The average time the connected agents have been connected for (in minutes).",
            if connected.is_empty() { 0.0 } else { minutes / connected.len() as f64 },
        );
        single(
            &mut out,
            "principal_events_received_total",
            "counter",
            "The total number of events received by principal.",
            self.events_received.load(Ordering::Relaxed) as f64,
        );
        single(
            &mut out,
            "principal_events_sent_total",
            "counter",
            "The total number of events sent by principal.",
            self.events_sent.load(Ordering::Relaxed) as f64,
        );
        single(
            &mut out,
            "argocd_principal_agent_leases_lost_total",
            "counter",
            "The total number of agents this replica stopped owning: taken by another replica, or its own Lease lapsed (--agent-leases).",
            self.leases_lost.load(Ordering::Relaxed) as f64,
        );
        single(
            &mut out,
            "argocd_principal_hub_writes_fenced_total",
            "counter",
            "The total number of agents' events not applied because this replica did not own the agent (--agent-leases); the agent sends them again to its owner.",
            self.writes_fenced.load(Ordering::Relaxed) as f64,
        );
        let labels: Vec<[(&str, &str); 1]> = agents.iter().map(|(n, _, _)| [("agent_name", n.as_str())]).collect();
        let label_refs: Vec<&[(&str, &str)]> = labels.iter().map(|l| l.as_slice()).collect();
        let up: Vec<f64> = agents.iter().map(|(_, c, _)| if *c { 1.0 } else { 0.0 }).collect();
        gauge(
            &mut out,
            "argocd_principal_agent_connected",
            "Whether the agent has a live stream (1) or not (0); kept for the retention after it disconnects.",
            &label_refs,
            &up,
        );
        if let Some(peers) = peers {
            let backlog: Vec<(usize, Option<Duration>)> =
                agents.iter().map(|(n, _, _)| peers.get(n).map(|s| s.outbox_backlog()).unwrap_or_default()).collect();
            let depth: Vec<f64> = backlog.iter().map(|(d, _)| *d as f64).collect();
            let age: Vec<f64> = backlog.iter().map(|(_, a)| a.map_or(0.0, |a| a.as_secs_f64())).collect();
            gauge(
                &mut out,
                "argocd_principal_agent_outbox_depth",
                "Events queued for the agent or sent and awaiting its ACK.",
                &label_refs,
                &depth,
            );
            gauge(
                &mut out,
                "argocd_principal_agent_outbox_oldest_unacked_age_seconds",
                "How long the oldest event queued for the agent or awaiting its ACK has waited (0: none).",
                &label_refs,
                &age,
            );
        }
        for family in [
            &self.agent_connections,
            &self.disconnects,
            &self.errors,
            &self.send_errors,
            &self.discarded,
            &self.resyncs,
            &self.auth_failures,
            &self.status_writes,
            &self.proxy_requests,
            &self.proxy_errors,
            &self.redis_requests,
            &self.redis_errors,
            &self.lease_takeovers,
            &self.replica_forwards,
        ] {
            family.encode(&mut out);
        }
        let log_bytes = lock(&self.proxy_log_bytes).clone();
        if !log_bytes.is_empty() {
            let name = "argocd_principal_resource_proxy_log_bytes_total";
            protocol::metrics::header(
                &mut out,
                name,
                "counter",
                "The total number of pod-log bytes streamed through the resource proxy, by agent.",
            );
            for (agent, bytes) in log_bytes {
                protocol::metrics::sample(&mut out, name, &["agent_name"], &[agent.as_str()], None, &bytes.to_string());
            }
        }
        self.event_processing.encode(&mut out);
        self.resync_duration.encode(&mut out);
        self.proxy_duration.encode(&mut out);
        self.redis_duration.encode(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_series_appear_and_go_after_the_retention() {
        let m = PrincipalMetrics::new();
        m.set_agent_retention(Duration::ZERO);
        m.agent_connected("agent-1");
        m.agent_connected("agent-1"); // a replacing stream
        m.resync("agent-1", AgentMode::Managed, Duration::from_millis(3), true);
        let text = m.render(None);
        assert!(text.contains("argocd_principal_connected_agents 1\n"), "{text}");
        assert!(text.contains("argocd_principal_agent_connections_total{agent_name=\"agent-1\"} 2\n"), "{text}");
        assert!(text.contains("argocd_principal_resync_duration_seconds_bucket{mode=\"managed\",le=\"0.005\"} 1\n"));
        m.agent_disconnected("agent-1", Some(&tonic::Status::aborted("replaced")));
        let text = m.render(None);
        assert!(text.contains("agent_name=\"agent-1\",cause=\"replaced\"} 1"), "still connected: {text}");
        m.agent_disconnected("agent-1", None);
        let text = m.render(None);
        assert!(!text.contains("agent-1"), "removed after the retention: {text}");
        assert!(text.contains("argocd_principal_connected_agents 0\n"), "{text}");
    }

    #[test]
    fn labels_are_escaped() {
        let m = PrincipalMetrics::new();
        m.auth_failed("mtls", "a\"b\\c\nd");
        assert!(m.render(None).contains(r#"{method="mtls",reason="a\"b\\c\nd"} 1"#));
    }
}
