//! The agent's Prometheus metrics (docs/operations/metrics.md), in the text exposition format
//! 0.0.4 that `promtool check metrics` accepts.
//!
//! Names and labels are upstream's where upstream has the metric (docs/operations/metrics.md);
//! counters always end in `_total` (upstream's `agent_events_received` is
//! `agent_events_received_total` here, the name it gets when upstream is scraped as
//! OpenMetrics). What upstream lacks carries the `argocd_agent_` prefix: outbox depth and
//! oldest-unacked age, resync counts and durations, reconnects by cause.
//!
//! The registry is process-wide ([`global`]), as upstream's default registry. The exposition
//! helpers at the end are the same as the principal's (`principal::metrics`); the two crates
//! never depend on each other.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use link::Mailbox;
use protocol::metrics::{CounterVec, DEFAULT_BUCKETS, HistogramVec, event_type, gauge, resource_type, single};
use protocol::{AgentMode, Event};

use crate::error::InboundError;

/// The agent's metrics, shared by the whole process.
#[must_use]
pub fn global() -> &'static AgentMetrics {
    static METRICS: LazyLock<AgentMetrics> = LazyLock::new(AgentMetrics::new);
    &METRICS
}

/// Every metric the agent exports. Record through [`global`].
#[derive(Debug)]
pub struct AgentMetrics {
    connected: AtomicBool,
    /// Unix time (seconds) the current connection started, as `f64` bits.
    connection_start: AtomicU64,
    connections: AtomicU64,
    auth_failures: AtomicU64,
    events_received: AtomicU64,
    events_sent: AtomicU64,
    errors: AtomicU64,
    event_processing: HistogramVec,
    propagation: HistogramVec,
    discarded: CounterVec,
    reconnects: CounterVec,
    resyncs: CounterVec,
    resync_duration: HistogramVec,
    redis_requests: CounterVec,
    redis_errors: CounterVec,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Why the stream to the principal ended, from the status it failed with (`None`: the
/// principal closed it cleanly).
#[must_use]
pub fn stream_end_cause(status: Option<&tonic::Status>) -> &'static str {
    match status.map(tonic::Status::code) {
        None => "closed_by_principal",
        Some(tonic::Code::Aborted) => "replaced",
        Some(tonic::Code::Unauthenticated) => "unauthenticated",
        Some(tonic::Code::Unavailable) => "unavailable",
        Some(tonic::Code::OutOfRange) => "message_too_large",
        Some(_) => "stream_error",
    }
}

impl AgentMetrics {
    /// Empty metrics (tests; the process uses [`global`]).
    pub fn new() -> Self {
        Self {
            connected: AtomicBool::new(false),
            connection_start: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            events_received: AtomicU64::new(0),
            events_sent: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            event_processing: HistogramVec::new(
                "agent_event_processing_time",
                "Histogram of time taken to process events from the principal (in seconds).",
                &["status", "agent_mode", "resource_type"],
                DEFAULT_BUCKETS,
            ),
            propagation: HistogramVec::new(
                "agent_event_propagation_latency_seconds",
                "Histogram of time from the principal sending an event to the agent processing it (in seconds).",
                &["resource_type"],
                DEFAULT_BUCKETS,
            ),
            discarded: CounterVec::new(
                "argocd_agent_event_writer_events_discarded_total",
                "The total number of events for the principal given up on after exhausting retries; resync repairs.",
                &["event_type", "resource_type"],
            ),
            reconnects: CounterVec::new(
                "argocd_agent_reconnects_total",
                "The total number of times the agent had to (re)connect to the principal, by cause.",
                &["cause"],
            ),
            resyncs: CounterVec::new(
                "argocd_agent_resyncs_total",
                "The total number of resyncs started after (re)connecting, by result.",
                &["result"],
            ),
            resync_duration: HistogramVec::new(
                "argocd_agent_resync_duration_seconds",
                "Time to start a resync after (re)connecting: reading the spoke and queueing the resync events (in seconds).",
                &["mode"],
                DEFAULT_BUCKETS,
            ),
            redis_requests: CounterVec::new(
                "argocd_agent_redis_proxy_requests_total",
                "The total number of Redis-proxy requests from the principal, by command (get, subscribe, ping).",
                &["command"],
            ),
            redis_errors: CounterVec::new(
                "argocd_agent_redis_proxy_errors_total",
                "The total number of Redis-proxy requests from the principal that failed, by command.",
                &["command"],
            ),
        }
    }

    /// A Redis-proxy request (`command`: get, subscribe, ping) was answered; `failed` if with an
    /// error.
    pub fn redis_request(&self, command: &str, failed: bool) {
        self.redis_requests.inc(&[command]);
        if failed {
            self.redis_errors.inc(&[command]);
        }
    }

    /// The stream to the principal is up.
    pub fn connected(&self) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.connection_start.store(now.as_secs_f64().to_bits(), Ordering::Relaxed);
        self.connected.store(true, Ordering::Relaxed);
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// The stream to the principal is down.
    pub fn disconnected(&self) {
        self.connected.store(false, Ordering::Relaxed);
    }

    /// The agent goes back to connecting because of `cause` (see [`stream_end_cause`];
    /// `connect_failed`, `refused`).
    pub fn reconnect(&self, cause: &str) {
        self.reconnects.inc(&[cause]);
    }

    /// Authenticating to the principal failed.
    pub fn auth_failed(&self) {
        self.auth_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A message arrived from the principal.
    pub fn event_received(&self) {
        self.events_received.fetch_add(1, Ordering::Relaxed);
    }

    /// An event was written to the stream.
    pub fn event_sent(&self) {
        self.events_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// An event from the principal was processed with `result` in `elapsed`.
    pub(crate) fn event_processed(
        &self,
        mode: AgentMode,
        event: &Event,
        result: &Result<(), InboundError>,
        elapsed: Duration,
    ) {
        let status = match result {
            Ok(()) => "success",
            Err(InboundError::WrongMode { .. }) => "not-allowed",
            Err(e) if link::Retryable::is_retryable(e) => "failure",
            Err(_) => "discarded",
        };
        let target = resource_type(&event.target);
        self.event_processing.observe(&[status, &mode.to_string(), target], elapsed.as_secs_f64());
        if result.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(sent_at) = event.sent_at {
            let latency = (chrono::Utc::now() - sent_at).to_std().unwrap_or_default();
            self.propagation.observe(&[target], latency.as_secs_f64());
        }
    }

    /// An event for the principal was given up on.
    pub fn event_discarded(&self, event: &Event) {
        self.discarded.inc(&[event_type(&event.event_type), resource_type(&event.target)]);
    }

    /// A resync was started (`ok`: its events were queued) in `elapsed`.
    pub fn resync(&self, mode: AgentMode, elapsed: Duration, ok: bool) {
        self.resyncs.inc(&[if ok { "started" } else { "failed" }]);
        self.resync_duration.observe(&[&mode.to_string()], elapsed.as_secs_f64());
    }

    /// Whether the stream to the principal is up.
    #[must_use]
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// The exposition text; outbox gauges come from `mailbox` when given.
    pub fn render(&self, mailbox: Option<&Mailbox>) -> String {
        let mut out = String::with_capacity(4096);
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
        let connected = self.is_connected();
        single(
            &mut out,
            "argocd_agent_connection_status",
            "gauge",
            "Whether the agent is currently connected to the principal (1 = connected, 0 = disconnected).",
            if connected { 1.0 } else { 0.0 },
        );
        let start = f64::from_bits(self.connection_start.load(Ordering::Relaxed));
        single(
            &mut out,
            "argocd_agent_connection_start_timestamp_seconds",
            "gauge",
            "Unix timestamp of when the current connection to the principal was established (0: not connected).",
            if connected { start } else { 0.0 },
        );
        let counters = [
            (
                "argocd_agent_connections_total",
                "The total number of successful connections from the agent to the principal.",
                &self.connections,
            ),
            (
                "argocd_agent_auth_failures_total",
                "The total number of authentication failures when connecting to the principal.",
                &self.auth_failures,
            ),
            ("agent_events_received_total", "The total number of events received by agent.", &self.events_received),
            ("agent_events_sent_total", "The total number of events sent by agent.", &self.events_sent),
            (
                "agent_errors_total",
                "The total number of events from the principal that could not be applied.",
                &self.errors,
            ),
        ];
        for (name, help, value) in counters {
            single(&mut out, name, "counter", help, value.load(Ordering::Relaxed) as f64);
        }
        if let Some(mailbox) = mailbox {
            let (depth, age) = mailbox.backlog();
            single(
                &mut out,
                "argocd_agent_outbox_depth",
                "gauge",
                "Events queued for the principal or sent and awaiting its ACK.",
                depth as f64,
            );
            single(
                &mut out,
                "argocd_agent_outbox_oldest_unacked_age_seconds",
                "gauge",
                "How long the oldest event queued for the principal or awaiting its ACK has waited (0: none).",
                age.map_or(0.0, |a| a.as_secs_f64()),
            );
        }
        for family in [&self.reconnects, &self.discarded, &self.resyncs, &self.redis_requests, &self.redis_errors] {
            family.encode(&mut out);
        }
        for family in [&self.event_processing, &self.propagation, &self.resync_duration] {
            family.encode(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_and_reconnects() {
        let m = AgentMetrics::new();
        let text = m.render(None);
        assert!(text.contains("argocd_agent_connection_status 0\n"), "{text}");
        assert!(!text.contains("argocd_agent_reconnects_total"), "no series before the first: {text}");
        m.connected();
        m.disconnected();
        m.reconnect(stream_end_cause(Some(&tonic::Status::unavailable("bye"))));
        m.connected();
        let text = m.render(None);
        assert!(text.contains("argocd_agent_connection_status 1\n"), "{text}");
        assert!(text.contains("argocd_agent_connections_total 2\n"), "{text}");
        assert!(text.contains("argocd_agent_reconnects_total{cause=\"unavailable\"} 1\n"), "{text}");
    }
}
