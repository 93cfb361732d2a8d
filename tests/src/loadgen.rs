//! A load generator: N simulated agents in one tokio process against a running principal.
//!
//! Each simulated agent has its own identity, authenticated session and event stream, built on
//! the real client code where practical:
//!
//! - **identity**: the principal runs `--insecure-plaintext --auth xfcc:` (as behind a mesh
//!   sidecar on loopback, a trusted hop) and every agent sends its own
//!   `x-forwarded-client-cert` element, as Envoy would forward it for
//!   `spiffe://<trust domain>/ns/<namespace>/sa/agent-<n>`; the session is bound to that ID;
//! - **session**: `Authenticate` and `RefreshToken` through [`auth::Credentials`] (the agent's
//!   client code), refreshed when due, and refreshed at once when the principal refuses a
//!   stream with `Unauthenticated` (authenticating again when the refresh is refused too), as
//!   `argocd-agent agent` does;
//! - **transport**: one HTTP/2 connection per agent from [`agent::transport::connect`] (h2c,
//!   the agent's keepalive PINGs); the `Authenticate`/`RefreshToken` calls ride on the same
//!   connection as the `Subscribe` stream (the real agent keeps a second, lazy connection for
//!   them: that would double the file descriptors). With
//!   [`LoadConfig::streams_per_connection`] `k > 1`, `k` agents share one connection instead,
//!   as a principal's sidecar (Envoy) multiplexes its agents' streams onto a few upstream
//!   connections: every call still carries its own agent's `x-forwarded-client-cert`, and each
//!   agent keeps its own session, stream and reconnects;
//! - **stream**: `Subscribe` with the access token, and the agent's own peer machinery from
//!   [`link`]: its mailbox (ACKs and retries), send loop (heartbeats at an interval) and ACK
//!   policy (a `.processed` ACK for every event received); the stream is taken as dead after
//!   three silent heartbeat intervals;
//! - **resync** (upstream §4.13) on every connect, as `agent::resync` does with the
//!   Applications and AppProjects the simulated agent holds in memory (none at first): managed
//!   agents send `request-synced-resource-list` and answer the principal's
//!   `request-resource-resync`; autonomous agents send `request-resource-resync` and answer
//!   the principal's `request-synced-resource-list`. A resync counts as complete when the
//!   agent's own request is ACKed (all the real agent can know); the principal's requests are
//!   counted apart ([`Snapshot::principal_resyncs`]);
//! - **spec updates** from the principal (managed) are applied to the in-memory spoke and
//!   ACKed; optional **status updates** for every Application held, at a rate;
//! - **reconnects** with [`agent::backoff::BackoffConfig`] (exponential, jittered) when a
//!   stream ends or a connection fails.
//!
//! Not simulated: a spoke API server (the spoke is an in-memory map), and TLS unless
//! [`LoadConfig::mtls`] is set: then every agent dials the principal over TLS with its own client
//! certificate (the principal runs `--auth mtls:...`) and authenticates with `mtls`, as
//! `argocd-agent agent --creds mtls:any` does, instead of forwarding an identity.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use agent::backoff::BackoffConfig;
use auth::{AgentMode, AuthParams, ClientError, Credentials};
use link::Mailbox;
use link::recv::{Inbound, Next};
use link::send::{SendHooks, SendOptions};
use protocol::argocd::{AppProject, Application, ObjectMeta};
use protocol::checksum::{
    RESYNC_KIND_APP_PROJECT, RESYNC_KIND_APPLICATION, ResourceKey, resource_set_checksum, spec_checksum, spec_digest,
};
use protocol::event::new_uuid;
use protocol::outbox::RetryPolicy;
use protocol::payload::{DIGEST_SPEC, RequestResourceResync, RequestSyncedResourceList, RequestUpdate, SyncedResource};
use protocol::pb::authapi::authentication_client::AuthenticationClient;
use protocol::pb::eventstreamapi::Event as WireEvent;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::{Event, EventType, Payload, Target};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::Channel;

/// The header a mesh sidecar forwards the client's certificate in.
pub const XFCC: &str = "x-forwarded-client-cert";

/// The version string agents send (`argocd-agent agent` sends the same).
pub const VERSION: &str = concat!("argocd-agent-", env!("CARGO_PKG_VERSION"));

/// Events buffered between an agent and its stream (as `agent::connection`).
const STREAM_BUFFER: usize = 64;

/// First pause after a failed token refresh that may succeed on retry.
const REFRESH_RETRY: Duration = Duration::from_secs(1);

/// What to simulate.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// The principal, e.g. `http://127.0.0.1:8443` (plaintext h2c).
    pub principal_addr: String,
    /// More replicas of the same hub's principal (`--agent-leases`): agent `i` first dials
    /// address `i mod n` of [`Self::principal_addr`] and these, and the next one after every
    /// stream that ended and every failed connect, as a Service spreads new connections over
    /// ready replicas. Connections shared by several agents keep to [`Self::principal_addr`].
    pub more_principals: Vec<String>,
    /// How many agents.
    pub agents: usize,
    /// The first agent's number: agents are `agent-<first>` .. `agent-<first + agents - 1>`.
    pub first: usize,
    /// Managed or autonomous.
    pub mode: AgentMode,
    /// Heartbeat interval (`None`: off).
    pub heartbeat: Option<Duration>,
    /// HTTP/2 keepalive PING interval (`None`: off).
    pub keepalive: Option<Duration>,
    /// Send a status update for every Application held at this interval (`None`: never).
    pub status_interval: Option<Duration>,
    /// Reconnect timing.
    pub backoff: BackoffConfig,
    /// Spread the first connects evenly over this long (zero: all at once).
    pub ramp: Duration,
    /// SPIFFE trust domain of the forwarded identities.
    pub trust_domain: String,
    /// Kubernetes namespace of the agents' service accounts (in the SPIFFE ID).
    pub sa_namespace: String,
    /// The agents' namespace sent in `Authenticate` (and where their Applications live).
    pub agent_namespace: String,
    /// Send a periodic resync digest (`--resync-interval`, as `agent::resync` does) at this
    /// interval, the first after a share of it that depends on the agent's number (`None`:
    /// never).
    pub periodic_resync: Option<Duration>,
    /// Native mTLS instead of forwarded identities (`None`: plaintext h2c with
    /// `x-forwarded-client-cert`); [`Self::principal_addr`] is then `https://...`.
    pub mtls: Option<ClientTls>,
    /// How many agents share one HTTP/2 connection (1: one connection per agent; `k > 1`:
    /// agents `0..k`, `k..2k`, ... each share one, as the streams of an Envoy upstream pool).
    /// Every call still carries its agent's own `x-forwarded-client-cert`; every agent keeps its
    /// own session, `Subscribe` stream and backoff. When a shared connection is lost, its
    /// channel dials one new connection on the next call (tonic's reconnect) and every agent of
    /// the group reconnects through it. Plaintext only: with [`Self::mtls`] each agent shows
    /// its own certificate, so [`LoadGen::start`] keeps one connection per agent.
    /// The principal's HTTP/2 server advertises no `SETTINGS_MAX_CONCURRENT_STREAMS` (tonic's
    /// default: unlimited), so a connection carries any number of streams.
    pub streams_per_connection: usize,
    /// With [`Self::mtls`]: the TLS ends at the principal's sidecar, which forwards the agent's
    /// identity in its own `x-forwarded-client-cert`; agents authenticate with the header method
    /// (upstream's `header`) and send no XFCC of their own.
    pub mtls_to_sidecar: bool,
}

/// Makes agent `n`'s TLS towards the principal: its own client certificate (whose subject the
/// principal's `--auth mtls:...` maps to its name) and the CA it verifies the principal with.
/// Called once per agent, before its first connect; every reconnect uses the same configuration.
#[derive(Clone)]
pub struct ClientTls(pub Arc<dyn Fn(usize) -> anyhow::Result<agent::transport::AgentTls> + Send + Sync>);

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl LoadConfig {
    /// `agents` managed agents for `principal_addr`, heartbeats every 30 s (the mesh default),
    /// keepalive PINGs every 30 s, the agent's default backoff, no status updates, no ramp.
    #[must_use]
    pub fn new(principal_addr: impl Into<String>, agents: usize) -> Self {
        Self {
            principal_addr: principal_addr.into(),
            more_principals: Vec::new(),
            agents,
            first: 1,
            mode: AgentMode::Managed,
            heartbeat: Some(Duration::from_secs(30)),
            keepalive: Some(agent::config::DEFAULT_KEEPALIVE),
            status_interval: None,
            backoff: BackoffConfig::default(),
            ramp: Duration::ZERO,
            trust_domain: "cluster.local".to_owned(),
            sa_namespace: "agents".to_owned(),
            agent_namespace: agent::DEFAULT_NAMESPACE.to_owned(),
            periodic_resync: None,
            mtls: None,
            streams_per_connection: 1,
            mtls_to_sidecar: false,
        }
    }

    /// How many agents share each HTTP/2 connection: [`Self::streams_per_connection`], at least
    /// 1, and 1 with [`Self::mtls`].
    #[must_use]
    pub fn agents_per_connection(&self) -> usize {
        if self.mtls.is_some() { 1 } else { self.streams_per_connection.max(1) }
    }

    /// How many HTTP/2 connections [`Self::agents`] agents hold.
    #[must_use]
    pub fn connections(&self) -> usize {
        self.agents.div_ceil(self.agents_per_connection())
    }

    /// The SPIFFE ID agent `n` presents.
    #[must_use]
    pub fn spiffe_id(&self, n: usize) -> String {
        format!("spiffe://{}/ns/{}/sa/agent-{n}", self.trust_domain, self.sa_namespace)
    }

    /// The `x-forwarded-client-cert` value a sidecar forwards for agent `n` (one element, as
    /// Envoy and Istio send it: the principal's ID, a certificate hash, the client's URI SAN).
    #[must_use]
    pub fn xfcc(&self, n: usize) -> String {
        format!(
            "By=spiffe://{}/ns/argocd/sa/argocd-agent-principal;Hash={n:064x};Subject=\"\";URI={}",
            self.trust_domain,
            self.spiffe_id(n)
        )
    }
}

/// Running totals over all agents of one [`LoadGen`].
#[derive(Debug, Default)]
struct Counters {
    authenticated: AtomicU64,
    auth_failed: AtomicU64,
    refreshed: AtomicU64,
    dial_failed: AtomicU64,
    subscribed: AtomicU64,
    subscribe_refused: AtomicU64,
    streams_ended: AtomicU64,
    events_received: AtomicU64,
    acks_sent: AtomicU64,
    heartbeats_sent: AtomicU64,
    status_updates_sent: AtomicU64,
    objects_applied: AtomicU64,
    resyncs: AtomicU64,
    principal_resyncs: AtomicU64,
    digests_sent: AtomicU64,
    duplicates_received: AtomicU64,
}

/// A copy of the counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Agents with a stream open now.
    pub connected: usize,
    /// Successful `Authenticate` calls.
    pub authenticated: u64,
    /// Failed `Authenticate` calls.
    pub auth_failed: u64,
    /// Successful `RefreshToken` calls.
    pub refreshed: u64,
    /// Connections that could not be made.
    pub dial_failed: u64,
    /// Streams opened.
    pub subscribed: u64,
    /// `Subscribe` calls the principal refused.
    pub subscribe_refused: u64,
    /// Streams that ended.
    pub streams_ended: u64,
    /// Events received (ACKs included).
    pub events_received: u64,
    /// `.processed` ACKs sent.
    pub acks_sent: u64,
    /// Heartbeats sent.
    pub heartbeats_sent: u64,
    /// Status updates sent.
    pub status_updates_sent: u64,
    /// Applications and AppProjects created, updated or deleted from the principal.
    pub objects_applied: u64,
    /// Resyncs completed (the agent's own resync request ACKed).
    pub resyncs: u64,
    /// Resync requests from the principal received (`request-resource-resync` to a managed
    /// agent, `request-synced-resource-list` to an autonomous one): the principal's half.
    pub principal_resyncs: u64,
    /// Periodic resync digests sent ([`LoadConfig::periodic_resync`]).
    pub digests_sent: u64,
    /// Application and AppProject events received again: the same `eventid` as the last one of
    /// their resource (a retransmission, or a version sent twice), counted in
    /// [`Self::objects_applied`] too.
    pub duplicates_received: u64,
}

/// Per-agent state the harness reads.
#[derive(Debug, Default)]
struct Slot {
    up: AtomicBool,
    /// When the last resync completed: milliseconds since [`Shared::epoch`] plus one (zero:
    /// never).
    resynced_at: AtomicU64,
    /// When this agent applied an AppProject whose `spec.description`, or an Application whose
    /// `spec.source.path`, is the current marker ([`LoadGen::expect_marker`]): milliseconds
    /// since [`Shared::epoch`] plus one (zero: not yet).
    marked_at: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    config: LoadConfig,
    epoch: Instant,
    slots: Vec<Slot>,
    connected: AtomicUsize,
    counters: Counters,
    /// The marker agents look for in the AppProjects and Applications they apply.
    marker: std::sync::RwLock<Option<String>>,
    /// Failed `Authenticate` calls by gRPC code and message, see [`LoadGen::auth_failures`].
    auth_failures: std::sync::Mutex<BTreeMap<String, u64>>,
}

impl Shared {
    fn note_auth_failure(&self, error: &auth::ClientError) {
        let reason = match error {
            auth::ClientError::Refused { status, .. } if status.code() == tonic::Code::ResourceExhausted => {
                let hinted = if error.retry_after().is_some() { "with a retry hint" } else { "without a retry hint" };
                format!("{:?} {hinted}", status.code())
            }
            auth::ClientError::Refused { status, .. } => {
                // Messages carry per-agent details (names, addresses) past the first clause.
                let message: String = status.message().chars().take(80).collect();
                format!("{:?}: {message}", status.code())
            }
            other => other.to_string(),
        };
        *lock(&self.auth_failures).entry(reason).or_default() += 1;
    }

    fn since_epoch(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }
}

/// N simulated agents; stopped (streams closed) by [`LoadGen::stop`] or on drop.
#[derive(Debug)]
pub struct LoadGen {
    shared: Arc<Shared>,
    cancel: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
}

impl Drop for LoadGen {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl LoadGen {
    /// Starts every agent (each a task on the current runtime).
    #[must_use]
    pub fn start(config: LoadConfig) -> Self {
        let slots = (0..config.agents).map(|_| Slot::default()).collect();
        let shared = Arc::new(Shared {
            config,
            epoch: Instant::now(),
            slots,
            connected: AtomicUsize::new(0),
            counters: Counters::default(),
            marker: std::sync::RwLock::new(None),
            auth_failures: std::sync::Mutex::new(BTreeMap::new()),
        });
        let cancel = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        let n = shared.config.agents.max(1);
        let per_connection = shared.config.agents_per_connection();
        let mut group = Arc::new(SharedConnection::default());
        for i in 0..shared.config.agents {
            let delay = shared.config.ramp.mul_f64(i as f64 / n as f64);
            if i > 0 && i % per_connection == 0 {
                group = Arc::new(SharedConnection::default());
            }
            let conn = (per_connection > 1).then(|| group.clone());
            tasks.spawn(Box::pin(run_agent(shared.clone(), i, conn, delay, cancel.clone())));
        }
        Self { shared, cancel, tasks }
    }

    /// How many agents this runs.
    #[must_use]
    pub fn agents(&self) -> usize {
        self.shared.slots.len()
    }

    /// Failed `Authenticate` calls so far by cause: the gRPC code and the start of the
    /// principal's message (`ResourceExhausted with a retry hint`: deferred in a login storm,
    /// then retried after the hint).
    #[must_use]
    pub fn auth_failures(&self) -> BTreeMap<String, u64> {
        lock(&self.shared.auth_failures).clone()
    }

    /// The counters now.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            connected: self.shared.connected.load(Ordering::Relaxed),
            authenticated: get(&c.authenticated),
            auth_failed: get(&c.auth_failed),
            refreshed: get(&c.refreshed),
            dial_failed: get(&c.dial_failed),
            subscribed: get(&c.subscribed),
            subscribe_refused: get(&c.subscribe_refused),
            streams_ended: get(&c.streams_ended),
            events_received: get(&c.events_received),
            acks_sent: get(&c.acks_sent),
            heartbeats_sent: get(&c.heartbeats_sent),
            status_updates_sent: get(&c.status_updates_sent),
            objects_applied: get(&c.objects_applied),
            resyncs: get(&c.resyncs),
            principal_resyncs: get(&c.principal_resyncs),
            digests_sent: get(&c.digests_sent),
            duplicates_received: get(&c.duplicates_received),
        }
    }

    /// How many agents have a stream open and completed a resync on it after `since`.
    #[must_use]
    pub fn resynced_since(&self, since: Instant) -> usize {
        self.resynced_since_ms(self.shared.since_epoch(since)).0
    }

    /// (count, latest completion) of agents up and resynced after `since_ms`.
    fn resynced_since_ms(&self, since_ms: u64) -> (usize, u64) {
        let mut count = 0;
        let mut latest = 0;
        for slot in &self.shared.slots {
            let at = slot.resynced_at.load(Ordering::Relaxed);
            if at > since_ms && slot.up.load(Ordering::Relaxed) {
                count += 1;
                latest = latest.max(at - 1);
            }
        }
        (count, latest)
    }

    /// Waits until every agent has a stream open and completed a resync after `since`; returns
    /// how long after `since` the last one completed. `progress` is called about once a second
    /// with the count so far.
    ///
    /// # Errors
    /// Not all resynced within `timeout` (the error has the count and the counters).
    pub async fn wait_all_resynced(
        &self,
        since: Instant,
        timeout: Duration,
        mut progress: impl FnMut(usize, Duration),
    ) -> anyhow::Result<Duration> {
        let since_ms = self.shared.since_epoch(since);
        let deadline = Instant::now() + timeout;
        let mut next_report = Instant::now() + Duration::from_secs(1);
        loop {
            let (count, latest) = self.resynced_since_ms(since_ms);
            if count == self.agents() {
                let done = self.shared.epoch + Duration::from_millis(latest);
                return Ok(done.saturating_duration_since(since));
            }
            let now = Instant::now();
            if now >= deadline {
                anyhow::bail!(
                    "only {count} of {} agents resynced within {timeout:?}; counters: {:?}",
                    self.agents(),
                    self.snapshot()
                );
            }
            if now >= next_report {
                progress(count, now.saturating_duration_since(since));
                next_report = now + Duration::from_secs(1);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// From now on, count the agents that apply an AppProject whose `spec.description`, or an
    /// Application whose `spec.source.path`, is `marker` (a fan-out measurement: one hub change
    /// that must reach every agent; a latency measurement: one change per agent).
    pub fn expect_marker(&self, marker: &str) {
        for slot in &self.shared.slots {
            slot.marked_at.store(0, Ordering::Relaxed);
        }
        *self.shared.marker.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(marker.to_owned());
    }

    /// When each agent (in order) applied the object carrying the marker of
    /// [`Self::expect_marker`], as an instant (millisecond resolution); `None`: not yet.
    #[must_use]
    pub fn marked_at(&self) -> Vec<Option<Instant>> {
        let at = |ms: u64| (ms > 0).then(|| self.shared.epoch + Duration::from_millis(ms - 1));
        self.shared.slots.iter().map(|s| at(s.marked_at.load(Ordering::Relaxed))).collect()
    }

    /// Waits until every agent has applied the object carrying the marker of
    /// [`Self::expect_marker`]; returns how long after `since` the first and the last did.
    ///
    /// # Errors
    /// Not all within `timeout` (the error has the count).
    pub async fn wait_all_marked(&self, since: Instant, timeout: Duration) -> anyhow::Result<(Duration, Duration)> {
        let deadline = Instant::now() + timeout;
        loop {
            let times: Vec<Instant> = self.marked_at().into_iter().flatten().collect();
            if times.len() == self.agents() {
                let first = times.iter().min().map_or(Duration::ZERO, |t| t.saturating_duration_since(since));
                let last = times.iter().max().map_or(Duration::ZERO, |t| t.saturating_duration_since(since));
                return Ok((first, last));
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "only {} of {} agents applied the marked object within {timeout:?}",
                    times.len(),
                    self.agents()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops every agent (streams closed) and waits for their tasks.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// What an agent's session needs (shared with nothing, but `Sync`, so it can be borrowed
/// across awaits).
struct Session {
    shared: Arc<Shared>,
    creds: Credentials,
    params: AuthParams,
    /// See [`Session::take_hint`].
    hint: std::sync::Mutex<Option<Duration>>,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Session {
    async fn authenticate(&self, client: &mut AuthenticationClient<Channel>) -> bool {
        match self.creds.authenticate(client, &self.params).await {
            Ok(_) => {
                self.shared.counters.authenticated.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(error) => {
                self.shared.counters.auth_failed.fetch_add(1, Ordering::Relaxed);
                // RESOURCE_EXHAUSTED with a retry hint (a login storm): the next attempt waits
                // the hint, as the agent does, instead of the backoff.
                *lock(&self.hint) = error.retry_after();
                self.shared.note_auth_failure(&error);
                false
            }
        }
    }

    /// The principal's retry hint from the last failed `Authenticate`, once.
    fn take_hint(&self) -> Option<Duration> {
        lock(&self.hint).take()
    }

    /// Refreshes the session; authenticates again when the principal refuses it. Returns
    /// whether the agent holds a usable token.
    async fn refresh(&self, client: &mut AuthenticationClient<Channel>) -> bool {
        match self.creds.refresh(client).await {
            Ok(()) => {
                self.shared.counters.refreshed.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) if needs_reauth(&e) => {
                self.creds.clear();
                self.authenticate(client).await
            }
            Err(_) => false,
        }
    }
}

/// One HTTP/2 connection that several agents' calls share ([`LoadConfig::streams_per_connection`]):
/// dialled by the first agent of the group that needs it; the others wait for that dial.
#[derive(Debug, Default)]
struct SharedConnection {
    channel: tokio::sync::Mutex<Option<Channel>>,
}

impl SharedConnection {
    /// The group's channel, dialled now if no agent of the group has dialled it yet. A channel
    /// whose connection is lost dials a new one itself on its next call (tonic's reconnect: one
    /// connection at a time), so every agent of the group goes on sharing one connection.
    async fn channel(&self, config: &LoadConfig) -> Result<Channel, agent::transport::TransportError> {
        let mut slot = self.channel.lock().await;
        if let Some(channel) = slot.as_ref() {
            return Ok(channel.clone());
        }
        let channel = agent::transport::connect(&config.principal_addr, None, config.keepalive).await?;
        *slot = Some(channel.clone());
        Ok(channel)
    }
}

/// One simulated agent's state across connections.
struct Sim {
    shared: Arc<Shared>,
    index: usize,
    /// The connection this agent shares with others; `None`: one of its own per connect.
    conn: Option<Arc<SharedConnection>>,
    /// Connects so far (which replica the next one dials, [`LoadConfig::more_principals`]).
    dials: usize,
    xfcc: AsciiMetadataValue,
    /// TLS with the agent's own client certificate ([`LoadConfig::mtls`]); `None`: h2c + XFCC.
    tls: Option<agent::transport::AgentTls>,
    session: Session,
    /// The principal refused the session: refresh (or authenticate) before the next stream.
    renew: bool,
    mailbox: Arc<Mailbox>,
    apps: BTreeMap<String, Application>,
    projects: BTreeMap<String, AppProject>,
    /// The last `eventid` received per Application and AppProject (`resourceid`), to count
    /// duplicates.
    last_received: BTreeMap<String, String>,
}

/// How a connection attempt ended.
enum Outcome {
    /// A stream was open and has ended: reconnect after the first backoff step.
    Ended,
    /// No stream: back off further.
    Failed,
    /// Cancelled.
    Stopped,
}

async fn run_agent(
    shared: Arc<Shared>,
    index: usize,
    conn: Option<Arc<SharedConnection>>,
    delay: Duration,
    cancel: CancellationToken,
) {
    let n = shared.config.first + index;
    let Ok(xfcc) = AsciiMetadataValue::try_from(shared.config.xfcc(n)) else {
        return;
    };
    let tls = match &shared.config.mtls {
        None => None,
        Some(make) => match (make.0)(n) {
            Ok(tls) => Some(tls),
            Err(_) => {
                shared.counters.dial_failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        },
    };
    let header = xfcc.clone();
    let (creds, method) = if tls.is_some() {
        let method = if shared.config.mtls_to_sidecar {
            auth::HeaderAuthenticator::METHOD
        } else {
            auth::MtlsAuthenticator::METHOD
        };
        (Credentials::new(), method)
    } else {
        let creds = Credentials::new().with_call_metadata(Arc::new(move |md: &mut MetadataMap| {
            md.insert(XFCC, header.clone());
        }));
        (creds, auth::HeaderAuthenticator::METHOD)
    };
    let params = AuthParams {
        method: method.to_owned(),
        credentials: Default::default(),
        mode: shared.config.mode,
        version: VERSION.to_owned(),
        agent_namespace: shared.config.agent_namespace.clone(),
    };
    let mut sim = Sim {
        shared: shared.clone(),
        index,
        conn,
        dials: 0,
        xfcc,
        tls,
        session: Session { shared, creds, params, hint: std::sync::Mutex::new(None) },
        renew: false,
        mailbox: Arc::new(Mailbox::new(RetryPolicy::default())),
        apps: BTreeMap::new(),
        projects: BTreeMap::new(),
        last_received: BTreeMap::new(),
    };
    if !delay.is_zero() {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
    let mut attempt: u32 = 0;
    loop {
        if attempt > 0 {
            let delay = match sim.session.take_hint() {
                // Deferred by the principal: its hint, and the backoff does not grow.
                Some(hint) => {
                    attempt = attempt.saturating_sub(1);
                    auth::admission::hinted_random(hint)
                }
                None => sim.shared.config.backoff.delay_random(attempt),
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
        let outcome = tokio::select! {
            () = cancel.cancelled() => Outcome::Stopped,
            outcome = sim.connect_and_serve(&cancel) => outcome,
        };
        match outcome {
            Outcome::Ended => attempt = 1,
            Outcome::Failed => attempt = attempt.saturating_add(1),
            Outcome::Stopped => return,
        }
    }
}

fn checksum_of<T: serde::Serialize>(obj: &T) -> Option<Vec<u8>> {
    let value = serde_json::to_value(obj).ok()?;
    spec_checksum(&value).ok().map(|c| c.to_vec())
}

fn request_update(kind: &str, meta: &ObjectMeta, checksum: Option<Vec<u8>>) -> RequestUpdate {
    RequestUpdate {
        name: meta.name.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        uid: meta.source_uid().or(meta.uid.as_deref()).unwrap_or_default().to_owned(),
        kind: kind.to_owned(),
        checksum,
    }
}

fn resync_event<T: serde::Serialize>(ty: EventType, payload: &T) -> Option<Event> {
    Event::request(ty, Target::ResourceResync, &new_uuid()).with_json(payload).ok()
}

async fn tick(interval: Option<&mut tokio::time::Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

fn instant_of(t: SystemTime) -> Instant {
    Instant::now() + t.duration_since(SystemTime::now()).unwrap_or_default()
}

/// Progress of the resync on the current stream.
#[derive(Default)]
struct Resync {
    /// `(resource_id, event_id)` of the agent's own request, until ACKed.
    own: Option<(String, String)>,
    own_acked: bool,
    done: bool,
}

impl Sim {
    fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    fn push(&mut self, ev: Option<Event>) {
        if let Some(ev) = ev {
            self.mailbox.push(ev);
        }
    }

    /// The principal replica this connect dials ([`LoadConfig::more_principals`]).
    fn next_principal(&mut self) -> String {
        let cfg = &self.shared.config;
        let n = cfg.more_principals.len() + 1;
        let pick = (self.index + self.dials) % n;
        self.dials += 1;
        if pick == 0 { cfg.principal_addr.clone() } else { cfg.more_principals[pick - 1].clone() }
    }

    async fn connect_and_serve(&mut self, cancel: &CancellationToken) -> Outcome {
        let addr = self.next_principal();
        let cfg = &self.shared.config;
        let dialled = match &self.conn {
            Some(shared) => shared.channel(cfg).await,
            None => agent::transport::connect(&addr, self.tls.as_ref(), cfg.keepalive).await,
        };
        let channel = match dialled {
            Ok(c) => c,
            Err(_) => {
                self.counters().dial_failed.fetch_add(1, Ordering::Relaxed);
                return Outcome::Failed;
            }
        };
        let mut auth_client = AuthenticationClient::new(channel.clone());
        let ready = match self.session.creds.refresh_due_at() {
            None => self.session.authenticate(&mut auth_client).await,
            Some(due) if self.renew || due <= SystemTime::now() => self.session.refresh(&mut auth_client).await,
            Some(_) => true,
        };
        self.renew = false;
        if !ready {
            return Outcome::Failed;
        }
        let mut client = EventStreamClient::new(channel)
            .max_decoding_message_size(protocol::pb::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(protocol::pb::MAX_MESSAGE_BYTES);
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(token) = self.session.creds.access_token().and_then(|t| AsciiMetadataValue::try_from(t).ok()) {
            request.metadata_mut().insert(agent::credentials::AUTHORIZATION, token);
        }
        if self.tls.is_none() {
            request.metadata_mut().insert(XFCC, self.xfcc.clone());
        }
        let inbound = match client.subscribe(request).await {
            Ok(r) => r.into_inner(),
            Err(status) => {
                self.counters().subscribe_refused.fetch_add(1, Ordering::Relaxed);
                if status.code() == tonic::Code::Unauthenticated {
                    // Expired, revoked or signed with another key: refresh now, authenticate
                    // again if the refresh is refused too (as the agent's `renew_session`).
                    self.renew = true;
                }
                return Outcome::Failed;
            }
        };
        self.counters().subscribed.fetch_add(1, Ordering::Relaxed);
        let slot = &self.shared.slots[self.index];
        slot.up.store(true, Ordering::Relaxed);
        self.shared.connected.fetch_add(1, Ordering::Relaxed);
        let outcome = self.serve(tx, inbound, &mut auth_client, cancel).await;
        let slot = &self.shared.slots[self.index];
        slot.up.store(false, Ordering::Relaxed);
        self.shared.connected.fetch_sub(1, Ordering::Relaxed);
        self.counters().streams_ended.fetch_add(1, Ordering::Relaxed);
        outcome
    }

    /// Starts the resync (as `agent::resync::on_connect`); returns the request to wait for.
    fn start_resync(&mut self) -> Resync {
        let own = match self.shared.config.mode {
            AgentMode::Managed => {
                let keys = self.send_request_updates();
                let checksum = resource_set_checksum(&keys).map(|c| c.to_vec());
                resync_event(EventType::RequestSyncedResourceList, &RequestSyncedResourceList::of_set(checksum))
            }
            AgentMode::Autonomous => resync_event(EventType::RequestResourceResync, &RequestResourceResync {}),
        };
        let ids = own.as_ref().map(|e| (e.resource_id.clone(), e.event_id.clone()));
        self.push(own);
        Resync { own: ids, ..Resync::default() }
    }

    /// A periodic resync request: the digest of everything held (as `agent::resync`).
    fn send_digest(&mut self) {
        let held: Vec<(ResourceKey, Option<Vec<u8>>)> = self
            .apps
            .values()
            .map(|a| (ResourceKey::from_meta(RESYNC_KIND_APPLICATION, &a.metadata), checksum_of(a)))
            .chain(
                self.projects
                    .values()
                    .map(|p| (ResourceKey::from_meta(RESYNC_KIND_APP_PROJECT, &p.metadata), checksum_of(p))),
            )
            .collect();
        let digest = spec_digest(held.iter().map(|(k, c)| (k, c.as_deref()))).map(|d| d.to_vec());
        let request = RequestSyncedResourceList { checksum: digest, digest: Some(DIGEST_SPEC.to_owned()) };
        self.counters().digests_sent.fetch_add(1, Ordering::Relaxed);
        let ev = resync_event(EventType::RequestSyncedResourceList, &request);
        self.push(ev);
    }

    /// A `request-update` for every principal-owned resource held; their keys.
    fn send_request_updates(&mut self) -> Vec<ResourceKey> {
        let mut keys = Vec::new();
        let mut events = Vec::new();
        for a in self.apps.values() {
            let req = request_update(RESYNC_KIND_APPLICATION, &a.metadata, checksum_of(a));
            events.push(resync_event(EventType::RequestUpdate, &req));
            keys.push(ResourceKey::from_meta(RESYNC_KIND_APPLICATION, &a.metadata));
        }
        for p in self.projects.values() {
            let req = request_update(RESYNC_KIND_APP_PROJECT, &p.metadata, checksum_of(p));
            events.push(resync_event(EventType::RequestUpdate, &req));
            keys.push(ResourceKey::from_meta(RESYNC_KIND_APP_PROJECT, &p.metadata));
        }
        for ev in events {
            self.push(ev);
        }
        keys
    }

    /// Records when this agent first applied an object carrying the marker (`found`: the
    /// AppProject's description or the Application's source path).
    fn note_marker(&self, found: Option<&str>) {
        let marker = self.shared.marker.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if found.is_some() && marker.as_deref() == found {
            let now = self.shared.since_epoch(Instant::now()) + 1;
            let _ =
                self.shared.slots[self.index].marked_at.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Applies one event from the principal (as `agent::inbound` would, to the in-memory spoke).
    fn apply(&mut self, ev: &Event) {
        let Ok(payload) = ev.payload() else { return };
        let mode = self.shared.config.mode;
        match payload {
            Payload::Application(app) => {
                let name = app.metadata.name.clone().unwrap_or_default();
                if ev.event_type == EventType::Delete {
                    self.apps.remove(&name);
                } else {
                    let path = app.spec.source.as_ref().and_then(|s| s.get("path")).and_then(serde_json::Value::as_str);
                    self.note_marker(path);
                    self.apps.insert(name, *app);
                }
                self.counters().objects_applied.fetch_add(1, Ordering::Relaxed);
            }
            Payload::AppProject(project) => {
                let name = project.metadata.name.clone().unwrap_or_default();
                if ev.event_type == EventType::Delete {
                    self.projects.remove(&name);
                } else {
                    self.note_marker(project.spec.extra.get("description").and_then(serde_json::Value::as_str));
                    self.projects.insert(name, *project);
                }
                self.counters().objects_applied.fetch_add(1, Ordering::Relaxed);
            }
            Payload::RequestResourceResync(_) if mode == AgentMode::Managed => {
                self.send_request_updates();
                self.counters().principal_resyncs.fetch_add(1, Ordering::Relaxed);
            }
            Payload::SyncedResource(res) if mode == AgentMode::Managed => {
                let held = if res.kind == RESYNC_KIND_APPLICATION {
                    self.apps.get(&res.name).map(|a| (a.metadata.clone(), checksum_of(a)))
                } else {
                    self.projects.get(&res.name).map(|p| (p.metadata.clone(), checksum_of(p)))
                };
                let req = match held {
                    Some((meta, checksum)) => request_update(&res.kind, &meta, checksum),
                    None => RequestUpdate {
                        name: res.name,
                        namespace: self.shared.config.agent_namespace.clone(),
                        kind: res.kind,
                        ..Default::default()
                    },
                };
                self.push(resync_event(EventType::RequestUpdate, &req));
            }
            Payload::RequestSyncedResourceList(req) if mode == AgentMode::Autonomous => {
                let keys: Vec<ResourceKey> =
                    self.apps.values().map(|a| ResourceKey::from_meta(RESYNC_KIND_APPLICATION, &a.metadata)).collect();
                if resource_set_checksum(&keys).map(|c| c.to_vec()) != req.checksum {
                    for k in &keys {
                        self.push(resync_event(EventType::ResponseSyncedResource, &SyncedResource::from(k)));
                    }
                }
                self.counters().principal_resyncs.fetch_add(1, Ordering::Relaxed);
            }
            Payload::RequestUpdate(req) if mode == AgentMode::Autonomous && !self.apps.contains_key(&req.name) => {
                let meta = ObjectMeta {
                    name: Some(req.name.clone()),
                    namespace: Some(self.shared.config.agent_namespace.clone()),
                    uid: Some(req.uid.clone()),
                    ..Default::default()
                };
                let stub = Application { metadata: meta, ..Default::default() };
                let ev = Event::for_object(EventType::Delete, Target::Application, &stub.metadata, &stub).ok();
                self.push(ev);
            }
            _ => {}
        }
    }

    /// A `status-update` for every Application held, each with a new `status.reconciledAt`
    /// (as Argo CD's controller stamps every reconciliation), so every one is a real hub write.
    fn send_status_updates(&mut self) {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let events: Vec<Option<Event>> = self
            .apps
            .values_mut()
            .map(|a| {
                let status = a.status.get_or_insert_with(Default::default);
                status.extra.insert("reconciledAt".into(), serde_json::Value::String(now.clone()));
                Event::for_object(EventType::StatusUpdate, Target::Application, &a.metadata, &*a).ok()
            })
            .collect();
        let n = events.len() as u64;
        for ev in events {
            self.push(ev);
        }
        self.counters().status_updates_sent.fetch_add(n, Ordering::Relaxed);
    }

    fn check_resync_done(&self, resync: &mut Resync) {
        if !resync.done && resync.own_acked {
            resync.done = true;
            let at = self.shared.since_epoch(Instant::now()) + 1;
            self.shared.slots[self.index].resynced_at.store(at, Ordering::Relaxed);
            self.counters().resyncs.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Runs one stream until it ends.
    async fn serve(
        &mut self,
        tx: mpsc::Sender<WireEvent>,
        mut inbound: tonic::Streaming<WireEvent>,
        auth_client: &mut AuthenticationClient<Channel>,
        cancel: &CancellationToken,
    ) -> Outcome {
        let mailbox = self.mailbox.clone();
        let attachment = mailbox.attach();
        let outcome = {
            let shared = self.shared.clone();
            let hooks = Hooks(&shared.counters);
            let options =
                SendOptions { heartbeat: shared.config.heartbeat, max_bytes: protocol::pb::MAX_MESSAGE_BYTES };
            let sending = link::send::send_loop(&mailbox, attachment, &tx, cancel, options, &hooks);
            let receiving = self.receive(&mut inbound, auth_client, cancel);
            tokio::select! {
                () = sending => Outcome::Ended,
                outcome = receiving => outcome,
            }
        };
        mailbox.detach(attachment);
        outcome
    }

    /// Applies what arrives on one stream until it ends, with the status updates and token
    /// refreshes due meanwhile.
    async fn receive(
        &mut self,
        inbound: &mut tonic::Streaming<WireEvent>,
        auth_client: &mut AuthenticationClient<Channel>,
        cancel: &CancellationToken,
    ) -> Outcome {
        let mut resync = self.start_resync();
        let cfg = &self.shared.config;
        let silence = cfg.heartbeat.map(|h| (h * 3).max(agent::config::MIN_SILENCE_LIMIT));
        let mut last_heard = Instant::now();
        let mut status = cfg.status_interval.map(|s| tokio::time::interval_at(tokio::time::Instant::now() + s, s));
        let mut periodic = cfg.periodic_resync.map(|every| {
            let first = every.mul_f64((self.index % 1000) as f64 / 1000.0);
            tokio::time::interval_at(tokio::time::Instant::now() + first, every)
        });
        let mut refresh_retry: Option<Instant> = None;
        loop {
            let refresh_at = refresh_retry.or_else(|| self.session.creds.refresh_due_at().map(instant_of));
            let sleep_until = |t: Option<Instant>| async move {
                match t {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            let silent_at = silence.map(|s| last_heard + s);
            tokio::select! {
                biased;
                next = link::recv::next(inbound, cancel, None) => match next {
                    Next::Message(msg) => {
                        last_heard = Instant::now();
                        self.on_message(msg, &mut resync);
                    }
                    Next::Stopped => return Outcome::Stopped,
                    Next::Ended | Next::Silent(_) => return Outcome::Ended,
                    Next::Failed(status) => {
                        self.renew = status.code() == tonic::Code::Unauthenticated;
                        return Outcome::Ended;
                    }
                },
                () = tick(status.as_mut()) => self.send_status_updates(),
                () = tick(periodic.as_mut()) => self.send_digest(),
                () = sleep_until(refresh_at) => {
                    refresh_retry = if self.session.refresh(auth_client).await { None } else { Some(Instant::now() + REFRESH_RETRY) };
                }
                () = sleep_until(silent_at) => return Outcome::Ended,
            }
        }
    }

    fn on_message(&mut self, msg: WireEvent, resync: &mut Resync) {
        self.counters().events_received.fetch_add(1, Ordering::Relaxed);
        match link::recv::receive(&self.mailbox, "principal", msg) {
            Inbound::Ack { resource_id, event_id } => {
                if resync.own.as_ref().is_some_and(|(r, e)| *r == resource_id && *e == event_id) {
                    resync.own_acked = true;
                    self.check_resync_done(resync);
                }
            }
            Inbound::Event(ev) => {
                if matches!(ev.target, Target::Application | Target::AppProject)
                    && self.last_received.insert(ev.resource_id.clone(), ev.event_id.clone()).as_deref()
                        == Some(ev.event_id.as_str())
                {
                    self.counters().duplicates_received.fetch_add(1, Ordering::Relaxed);
                }
                self.apply(&ev);
                link::recv::settle::<std::convert::Infallible>(&self.mailbox, &ev, &Ok(()));
                self.check_resync_done(resync);
            }
            Inbound::Undecodable => {}
        }
    }
}

/// What a simulated agent's send loop counts.
struct Hooks<'a>(&'a Counters);

impl SendHooks for Hooks<'_> {
    fn peer(&self) -> &str {
        "principal"
    }
    fn sent(&self, event: &Event) {
        if event.event_type == EventType::Processed {
            self.0.acks_sent.fetch_add(1, Ordering::Relaxed);
        } else if event.target == Target::Heartbeat {
            self.0.heartbeats_sent.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn needs_reauth(e: &ClientError) -> bool {
    e.needs_reauthentication()
}

/// Resident memory and CPU time of a process, from `/proc`.
pub mod procstat {
    use anyhow::Context as _;

    /// `VmRSS` of `pid` in KiB.
    ///
    /// # Errors
    /// `/proc/<pid>/status` cannot be read or has no `VmRSS`.
    pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/status")).context("cannot read /proc/<pid>/status")?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS in /proc/<pid>/status")
    }

    /// `utime + stime` of `pid` in clock ticks (see [`clock_ticks_per_second`]).
    ///
    /// # Errors
    /// `/proc/<pid>/stat` cannot be read or parsed.
    pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).context("cannot read /proc/<pid>/stat")?;
        // Fields after the command name (which may hold spaces) start at "state" (field 3).
        let rest = stat.rsplit_once(')').map(|(_, r)| r).context("malformed /proc/<pid>/stat")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let utime: u64 = fields.get(11).and_then(|v| v.parse().ok()).context("no utime")?;
        let stime: u64 = fields.get(12).and_then(|v| v.parse().ok()).context("no stime")?;
        Ok(utime + stime)
    }

    /// CPU time of `pid`'s live threads in nanoseconds (the sum of their `schedstat`): finer
    /// than [`cpu_ticks`] for windows of milliseconds; threads that exited are not counted.
    ///
    /// # Errors
    /// `/proc/<pid>/task` cannot be read.
    pub fn cpu_ns(pid: u32) -> anyhow::Result<u64> {
        let mut total = 0;
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).context("cannot read /proc/<pid>/task")? {
            let path = task?.path().join("schedstat");
            // A thread may exit between the listing and the read.
            if let Ok(stat) = std::fs::read_to_string(path) {
                total += stat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
        }
        Ok(total)
    }

    /// `getconf CLK_TCK` (100 on Linux unless configured otherwise).
    #[must_use]
    pub fn clock_ticks_per_second() -> u64 {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100)
    }

    /// Open file descriptors of `pid`.
    #[must_use]
    pub fn open_fds(pid: u32) -> usize {
        std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
    }
}
