//! Cross-hub disaster recovery, wire-compatible with upstream's active/passive HA (`--ha-*`,
//! `principal/ha_integration.go`, `pkg/ha`, `pkg/replication`): two principals on two hubs,
//! one `active` serving agents, the other a replica following it over the `Replication`
//! service on the active's main gRPC port, and an operator moving the active role with
//! `argocd-agentctl ha promote|demote` through `HAAdmin` ([`admin`]).
//!
//! What is stronger here than upstream (docs/ha.md, "Cross-hub disaster recovery"):
//! * **Replicate before acknowledging.** An agent's event is applied to the active hub, then
//!   forwarded to every replica and the agent's ACK waits until each replica that is in sync
//!   has applied it to its own hub and acknowledged its sequence number ([`replication`]), at
//!   most [`HaConfig::replicate_timeout`]. A replica that does not make it in time is cut off
//!   (its stream ends, it resyncs from a snapshot) and the ACK goes out: the active hub keeps
//!   serving alone rather than stop.
//! * **Bounded, no drop.** Each replica has a queue of [`HaConfig::queue_capacity`] events. A
//!   full queue of an in-sync replica blocks the forwarding (so the agents' ACKs) up to the
//!   same timeout; of a replica still syncing, it cuts the replica off at once. No event is
//!   skipped silently: a replica either has every sequence number or resyncs.
//! * **Fenced promotion.** Each hub records an epoch in ConfigMap [`STATE_CONFIG_MAP`].
//!   Promote bumps it; promote without `--force` refuses while the peer still answers as
//!   active or while this replica never completed a snapshot (or was cut off since); an active
//!   principal probes its peer and steps down when the peer is active with a higher epoch (on
//!   a tie, the smaller principal UID wins); a principal starts active only when its recorded
//!   role and the peer allow it. A non-active principal refuses agents with `Unavailable`.
//! * **Replication denied by default.** A snapshot holds every agent's Applications, and the
//!   `--auth mtls:` method that identifies the peer accepts agents' certificates too: only the
//!   identities listed in `--ha-allowed-replication-clients` may replicate (upstream: any, when
//!   the list is empty); `*` is the explicit opt-out ([`replication::authorize`]).

pub mod admin;
mod client;
pub mod replication;
pub mod state;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use auth::MtlsAuthenticator;
use protocol::pb::haadminapi::HaStatusResponse;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::config::AgentMode;
use crate::peer::AgentPeer;
use crate::sync::hub::Hub;
pub use state::{Role, State, TransitionError};

/// The ConfigMap (principal namespace) holding this hub's HA epoch and last role.
pub const STATE_CONFIG_MAP: &str = "argocd-agent-ha-state";

/// Response metadata of every `Replication` call: the answering principal's HA state, epoch and
/// principal UID (upstream peers ignore it; an upstream peer sends none).
pub const STATE_HEADER: &str = "x-argocd-agent-ha-state";
/// See [`STATE_HEADER`].
pub const EPOCH_HEADER: &str = "x-argocd-agent-ha-epoch";
/// See [`STATE_HEADER`].
pub const UID_HEADER: &str = "x-argocd-agent-ha-uid";

/// How a replica dials its peer's main gRPC port (TLS with its own certificate, or plaintext).
pub type Connector =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<tonic::transport::Channel, String>> + Send>> + Send + Sync>;

/// Settings of a cross-hub HA principal (`--ha-*`).
#[derive(Clone)]
pub struct HaConfig {
    /// `--ha-preferred-role`: the role at first start (a recorded later role wins).
    pub preferred_role: Role,
    /// `--ha-peer-address`: the peer's main gRPC `host:port` (empty: none).
    pub peer_address: String,
    /// `--ha-allowed-replication-clients`: identities (from `--auth mtls:`) allowed to
    /// replicate from this principal. Empty (the default): none, every replication call is
    /// refused; [`replication::ANY_REPLICATION_CLIENT`] (`*`): any identity the mTLS method
    /// accepts, agents' included (upstream's behaviour with an empty list).
    pub allowed_replication_clients: Vec<String>,
    /// The `--auth mtls:` method identifying replication clients. `None` (library use on a
    /// trusted plaintext listener, as the tests do): every caller's identity is `""`, so only
    /// `*` in [`Self::allowed_replication_clients`] lets it through.
    pub replication_auth: Option<MtlsAuthenticator>,
    /// `--ha-replication-initial-ack-timeout`: how long the active waits for a new replica's
    /// first ACK (after its snapshot).
    pub initial_ack_timeout: Duration,
    /// How long an agent's ACK waits for the in-sync replicas.
    pub replicate_timeout: Duration,
    /// Events queued per replica at most.
    pub queue_capacity: usize,
    /// Replica streams served at once at most (upstream: 10).
    pub max_replicas: usize,
    /// How often an active principal asks its peer whether it is active too.
    pub probe_interval: Duration,
    /// How long one probe of the peer may take.
    pub probe_timeout: Duration,
    /// First and longest pause between a replica's connection attempts.
    pub reconnect_backoff: (Duration, Duration),
    /// How often a replica fetches a fresh snapshot (changes made on the active hub directly).
    pub reconcile_interval: Duration,
    /// How a replica dials the peer; `None`: plaintext h2c to `peer_address`.
    pub connector: Option<Connector>,
}

impl Default for HaConfig {
    fn default() -> Self {
        Self {
            preferred_role: Role::Primary,
            peer_address: String::new(),
            allowed_replication_clients: Vec::new(),
            replication_auth: None,
            initial_ack_timeout: Duration::from_secs(300),
            replicate_timeout: Duration::from_secs(10),
            queue_capacity: 1024,
            max_replicas: 10,
            probe_interval: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(3),
            reconnect_backoff: (Duration::from_secs(1), Duration::from_secs(30)),
            reconcile_interval: Duration::from_secs(60),
            connector: None,
        }
    }
}

impl std::fmt::Debug for HaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaConfig")
            .field("preferred_role", &self.preferred_role)
            .field("peer_address", &self.peer_address)
            .field("allowed_replication_clients", &self.allowed_replication_clients)
            .finish_non_exhaustive()
    }
}

/// What the replica side reports.
#[derive(Debug, Default)]
struct Follower {
    /// The replication stream is live.
    connected: bool,
    /// The last sequence number applied, and when the active processed it (unix seconds).
    last_seq: u64,
    last_event_unix: i64,
}

/// The HA controller of one principal: state, epoch, the replication forwarder (active) and
/// client (replica).
pub struct Ha {
    config: HaConfig,
    hub: Option<Arc<Hub>>,
    state: watch::Sender<State>,
    epoch: AtomicU64,
    /// The highest epoch the peer claimed (a promotion goes above it).
    peer_epoch: AtomicU64,
    /// This replica completed a snapshot and was not cut off since (may promote without force).
    synced: AtomicBool,
    follower: Mutex<Follower>,
    forwarder: replication::Forwarder,
    /// Serializes promote, demote and stepping down.
    transitions: tokio::sync::Mutex<()>,
    /// Agent modes the replica learnt from snapshots and events.
    modes: Mutex<HashMap<String, AgentMode>>,
    /// Agent namespaces the replica made sure exist on its hub.
    namespaces: Mutex<HashSet<String>>,
    /// Promotions, and demotions or step-downs, since start.
    failovers: AtomicU64,
    failbacks: AtomicU64,
    /// Replication calls refused: the caller not authenticated, or its identity not allowed.
    refused_unauthenticated: AtomicU64,
    refused_not_allowed: AtomicU64,
    /// Replicated events this replica could not decode (each answered by a fresh snapshot).
    undecodable: AtomicU64,
}

impl std::fmt::Debug for Ha {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ha")
            .field("state", &*self.state.borrow())
            .field("epoch", &self.epoch.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Where a principal's HA controller is found once attached ([`Ha::attach`]): the event
/// stream, the replication layer and the principal's readiness look there. Weak: the controller
/// holds the hub; the caller of [`crate::Principal::enable_ha`] holds the controller.
pub(crate) type Slot = Arc<OnceLock<Weak<Ha>>>;

/// The HA controller in `slot`, if one is attached and alive.
pub(crate) fn of(slot: &Slot) -> Option<Arc<Ha>> {
    slot.get().and_then(Weak::upgrade)
}

/// The event stream's admission: agents only on an active principal.
///
/// # Errors
/// `Unavailable` naming the state, when not active.
pub(crate) fn admit(slot: &Slot) -> Result<(), Status> {
    match of(slot) {
        // No reconnect trailer: an agent sent here again by its load balancer backs off.
        Some(ha) => ha
            .readiness()
            .map_err(|why| Status::unavailable(format!("{why}; connect to the active principal of the HA pair"))),
        None => Ok(()),
    }
}

/// The event stream's hook after an agent's event was applied: with HA, a successfully applied
/// change is replicated to the in-sync replicas before the agent gets its ACK. Returns whether
/// the event may be ACKed (not when this principal stopped being active meanwhile: the agent
/// resends it to the active one).
pub(crate) async fn replicated<E>(
    slot: &Slot,
    session: &AgentPeer,
    ev: &protocol::Event,
    result: &Result<(), E>,
) -> bool {
    let Some(ha) = of(slot) else { return true };
    if result.is_err() || !replication::replicable(ev) {
        return true;
    }
    if !ha.is_active() {
        tracing::warn!(agent = %session.name(), "HA: not active any more; event not acknowledged (the agent resends it)");
        return false;
    }
    ha.forwarder.forward(&ha.config, session.name(), session.mode(), ev).await;
    let active = ha.is_active();
    if !active {
        tracing::warn!(agent = %session.name(), "HA: demoted while replicating; event not acknowledged");
    }
    active
}

impl Ha {
    /// The controller of the principal on `hub`, put in `slot` so the event stream finds it.
    pub(crate) fn attach(hub: &Arc<Hub>, slot: &Slot, config: HaConfig) -> Arc<Self> {
        let ha = Arc::new(Self::new(config, Some(hub.clone())));
        // Weak: the controller holds the hub; the caller holds the controller.
        if slot.set(Arc::downgrade(&ha)).is_err() {
            tracing::warn!("this principal already has an HA controller; the new one is not attached");
        }
        ha
    }

    /// A controller without a hub, for tests of the admin API alone: it starts as its
    /// preferred role says (`replica`: `syncing`), replicates nothing, records nothing.
    #[must_use]
    pub fn standalone(config: HaConfig) -> Arc<Self> {
        let ha = Arc::new(Self::new(config, None));
        let start = match ha.config.preferred_role {
            Role::Primary => State::Active,
            Role::Replica => State::Syncing,
        };
        ha.state.send_replace(start);
        ha
    }

    fn new(config: HaConfig, hub: Option<Arc<Hub>>) -> Self {
        Self {
            config,
            hub,
            state: watch::Sender::new(State::Recovering),
            epoch: AtomicU64::new(0),
            peer_epoch: AtomicU64::new(0),
            synced: AtomicBool::new(false),
            follower: Mutex::new(Follower::default()),
            forwarder: replication::Forwarder::default(),
            transitions: tokio::sync::Mutex::new(()),
            modes: Mutex::new(HashMap::new()),
            namespaces: Mutex::new(HashSet::new()),
            failovers: AtomicU64::new(0),
            failbacks: AtomicU64::new(0),
            refused_unauthenticated: AtomicU64::new(0),
            refused_not_allowed: AtomicU64::new(0),
            undecodable: AtomicU64::new(0),
        }
    }

    /// The current state.
    #[must_use]
    pub fn state(&self) -> State {
        *self.state.borrow()
    }

    /// Watches the state.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<State> {
        self.state.subscribe()
    }

    /// This hub's epoch: bumped by every promotion.
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether agents are served.
    #[must_use]
    pub fn is_active(&self) -> bool {
        self.state().accepts_agents()
    }

    /// `/healthz`'s answer: ready only when active, as upstream's `HAHealthzHandler`.
    ///
    /// # Errors
    /// `HA state: <state> - not accepting traffic`.
    pub fn readiness(&self) -> Result<(), String> {
        let state = self.state();
        if state.accepts_agents() { Ok(()) } else { Err(format!("HA state: {state} - not accepting traffic")) }
    }

    /// The last sequence number assigned by this principal's forwarder (active side).
    #[must_use]
    pub fn forwarded_sequence(&self) -> u64 {
        self.forwarder.current()
    }

    /// The last sequence number this replica applied.
    #[must_use]
    pub fn applied_sequence(&self) -> u64 {
        self.follower.lock().unwrap_or_else(PoisonError::into_inner).last_seq
    }

    /// Replica streams served now, and how many of them are in sync.
    #[must_use]
    pub fn replicas(&self) -> (usize, usize) {
        self.forwarder.counts()
    }

    fn principal_uid(&self) -> &str {
        self.hub.as_ref().map_or("", |h| h.principal_uid.as_str())
    }

    /// `HAAdmin.Status`.
    #[must_use]
    pub fn status(&self) -> HaStatusResponse {
        let state = self.state();
        let follower = self.follower.lock().unwrap_or_else(PoisonError::into_inner);
        let connected_agents =
            self.hub.as_ref().map_or(0, |h| h.peers.all().iter().filter(|p| p.is_connected()).count());
        HaStatusResponse {
            state: state.as_str().to_owned(),
            preferred_role: self.config.preferred_role.as_str().to_owned(),
            peer_address: self.config.peer_address.clone(),
            // Upstream: state == replicating. Here: the replication stream is actually live.
            peer_reachable: follower.connected,
            // Upstream never fills it; a live replication stream means the peer is active.
            peer_state: if follower.connected { State::Active.as_str().to_owned() } else { String::new() },
            connected_replicas: i32::try_from(self.forwarder.counts().0).unwrap_or(i32::MAX),
            last_event_timestamp: follower.last_event_unix,
            last_sequence_num: follower.last_seq,
            connected_agents: i32::try_from(connected_agents).unwrap_or(i32::MAX),
        }
    }

    /// Moves to `to` if the table allows it; returns whether it moved.
    fn transition(&self, to: State) -> bool {
        let mut moved = None;
        self.state.send_if_modified(|s| {
            if *s != to && s.can_become(to) {
                moved = Some(*s);
                *s = to;
                true
            } else {
                false
            }
        });
        if let Some(from) = moved {
            tracing::info!(from = %from, to = %to, epoch = self.epoch(), "HA state changed");
        }
        moved.is_some()
    }

    /// `HAAdmin.Promote`: this principal becomes active (see the module docs for the fence).
    ///
    /// # Errors
    /// Why it may not, or the epoch could not be recorded.
    pub async fn promote(&self, force: bool) -> Result<State, TransitionError> {
        let _one = self.transitions.lock().await;
        let state = self.state();
        // The peer is asked only when it matters (not when already active or still streaming).
        let peer_active = match state {
            State::Active => None,
            State::Replicating if !force => None,
            _ if force => None,
            _ => self.probe_peer().await.map(|(epoch, _)| epoch),
        };
        let synced = self.synced.load(Ordering::Acquire);
        state::check_promote(state, force, synced, &self.config.peer_address, peer_active)?;
        let epoch = self.epoch().max(self.peer_epoch.load(Ordering::Acquire)) + 1;
        self.record(epoch, "active").await?;
        self.epoch.store(epoch, Ordering::Release);
        self.transition(State::Active);
        self.failovers.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(epoch, force, "HA: promoted to active");
        Ok(self.state())
    }

    /// `HAAdmin.Demote`: this principal stops serving agents and follows its peer.
    ///
    /// # Errors
    /// Not active, or the role could not be recorded.
    pub async fn demote(&self) -> Result<State, TransitionError> {
        let _one = self.transitions.lock().await;
        let state = self.state();
        if state != State::Active {
            return Err(TransitionError::NotActive(state));
        }
        self.record(self.epoch(), "replica").await?;
        self.step_down("demoted by the operator");
        Ok(self.state())
    }

    /// Active → replicating: agents' streams are closed (`Unavailable`, reconnect elsewhere),
    /// replicas are cut off, the replica client starts.
    fn step_down(&self, why: &str) {
        self.synced.store(false, Ordering::Release);
        self.transition(State::Replicating);
        self.failbacks.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(reason = why, epoch = self.epoch(), "HA: no longer active; closing agent streams");
        self.forwarder.cut_all("the principal is no longer active");
        if let Some(hub) = &self.hub {
            for peer in hub.peers.all() {
                hub.peers.close(
                    peer.name(),
                    crate::peer::reconnect_elsewhere(Status::unavailable(format!(
                        "HA: this principal is no longer active ({why}); connect to the active principal"
                    ))),
                );
            }
        }
    }

    /// Records `epoch` and `role` in [`STATE_CONFIG_MAP`] (nothing without a hub).
    async fn record(&self, epoch: u64, role: &str) -> Result<(), TransitionError> {
        let Some(hub) = &self.hub else { return Ok(()) };
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(hub.config_maps.client(), &hub.config.namespace);
        let data = BTreeMap::from([("epoch".to_owned(), epoch.to_string()), ("role".to_owned(), role.to_owned())]);
        let fail = |e: kube::Error| TransitionError::Persist {
            config_map: STATE_CONFIG_MAP.to_owned(),
            reason: e.to_string(),
        };
        let patch = kube::api::Patch::Merge(serde_json::json!({ "data": data }));
        for _ in 0..2 {
            match api.patch(STATE_CONFIG_MAP, &kube::api::PatchParams::default(), &patch).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(fail(e)),
            }
            let cm = k8s_openapi::api::core::v1::ConfigMap {
                metadata: kube::api::ObjectMeta { name: Some(STATE_CONFIG_MAP.to_owned()), ..Default::default() },
                data: Some(data.clone()),
                ..Default::default()
            };
            match api.create(&kube::api::PostParams::default(), &cm).await {
                Ok(_) => return Ok(()),
                // Created meanwhile: patch it.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(fail(e)),
            }
        }
        Err(TransitionError::Persist {
            config_map: STATE_CONFIG_MAP.to_owned(),
            reason: "it keeps changing".to_owned(),
        })
    }

    /// The recorded epoch and role.
    async fn recorded(&self) -> Result<(u64, Option<String>), String> {
        let Some(hub) = &self.hub else { return Ok((0, None)) };
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(hub.config_maps.client(), &hub.config.namespace);
        let cm = api.get_opt(STATE_CONFIG_MAP).await.map_err(|e| e.to_string())?;
        let data = cm.and_then(|c| c.data).unwrap_or_default();
        let epoch = match data.get("epoch") {
            Some(e) => e.parse().map_err(|_| format!("ConfigMap {STATE_CONFIG_MAP}: epoch {e:?} is not a number"))?,
            None => 0,
        };
        Ok((epoch, data.get("role").cloned()))
    }

    /// Asks the peer (replication `Status`) whether it is active: its epoch and UID when it
    /// says so, `None` when it is not, cannot be reached, or does not say (an upstream peer).
    async fn probe_peer(&self) -> Option<(u64, String)> {
        if self.config.peer_address.is_empty() {
            return None;
        }
        let probe = async {
            let channel = client::connect(&self.config).await.ok()?;
            let mut rpc = protocol::pb::replicationapi::replication_client::ReplicationClient::new(channel);
            let answer = match rpc.status(protocol::pb::replicationapi::StatusRequest {}).await {
                Ok(answer) => answer,
                Err(status) => {
                    if matches!(status.code(), tonic::Code::PermissionDenied | tonic::Code::Unauthenticated) {
                        // Fencing is blind until the peer lets this principal in: say so.
                        tracing::warn!(peer = %self.config.peer_address, %status,
                            "HA: the peer refuses this principal's replication calls; list this principal's identity \
                             in the peer's --ha-allowed-replication-clients");
                    }
                    return None;
                }
            };
            replication::peer_claims(answer.metadata())
        };
        let (state, epoch, uid) = tokio::time::timeout(self.config.probe_timeout, probe).await.ok().flatten()?;
        self.saw_peer_epoch(epoch);
        (state == State::Active.as_str()).then_some((epoch, uid))
    }

    /// Runs the controller until `cancel` fires: decides the starting state, then serves as
    /// the state says (the replica client while following; the peer probe while active).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let start = match self.starting_state().await {
            Ok(start) => start,
            Err(e) => {
                tracing::error!(error = %e, "HA: cannot read the recorded HA state; starting as a replica");
                State::Syncing
            }
        };
        self.transition(start);
        tokio::join!(self.clone().follow(cancel.clone()), self.clone().watch_peer(cancel));
        // Replica streams end with the controller, so a graceful shutdown does not wait on them.
        self.forwarder.cut_all("the principal is shutting down");
    }

    /// The recorded role, else the preferred one; active only if the peer is not active with a
    /// better claim.
    async fn starting_state(&self) -> Result<State, String> {
        let (epoch, role) = self.recorded().await?;
        self.epoch.store(epoch, Ordering::Release);
        let wants_active = match role.as_deref() {
            Some("active") => true,
            Some("replica") => false,
            _ => self.config.preferred_role == Role::Primary,
        };
        if !wants_active {
            tracing::info!(epoch, recorded = ?role, preferred = %self.config.preferred_role, "HA: starting as a replica");
            return Ok(State::Syncing);
        }
        if let Some((peer_epoch, peer_uid)) = self.probe_peer().await
            && state::yields_to(epoch, self.principal_uid(), peer_epoch, &peer_uid)
        {
            tracing::warn!(epoch, peer_epoch, peer = %self.config.peer_address,
                "HA: the peer is active with a better claim; starting as a replica");
            return Ok(State::Syncing);
        }
        if epoch == 0 {
            self.record(1, "active").await.map_err(|e| e.to_string())?;
            self.epoch.store(1, Ordering::Release);
        }
        tracing::info!(epoch = self.epoch(), "HA: starting active");
        Ok(State::Active)
    }

    /// While active: probes the peer every [`HaConfig::probe_interval`] and steps down for an
    /// active peer with a better claim (the end of a split brain).
    async fn watch_peer(self: Arc<Self>, cancel: CancellationToken) {
        if self.config.peer_address.is_empty() {
            return;
        }
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.config.probe_interval) => {}
            }
            if !self.is_active() {
                continue;
            }
            if let Some((peer_epoch, peer_uid)) = self.probe_peer().await
                && state::yields_to(self.epoch(), self.principal_uid(), peer_epoch, &peer_uid)
            {
                let _one = self.transitions.lock().await;
                if self.is_active() {
                    if let Err(e) = self.record(self.epoch(), "replica").await {
                        tracing::error!(error = %e, "HA: cannot record stepping down");
                    }
                    self.step_down(&format!("the peer is active with epoch {peer_epoch}"));
                }
            }
        }
    }

    /// Counts a refused replication call by its status code.
    fn replication_refused(&self, code: tonic::Code) {
        let counter = if code == tonic::Code::PermissionDenied {
            &self.refused_not_allowed
        } else {
            &self.refused_unauthenticated
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn saw_peer_epoch(&self, epoch: u64) {
        self.peer_epoch.fetch_max(epoch, Ordering::AcqRel);
    }

    /// The Prometheus exposition of this controller: upstream's `argocd_agent_ha_*` and
    /// `argocd_agent_replication_*` names where they exist, ours for the epoch and cut-offs.
    #[must_use]
    pub fn metrics_text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let state = self.state();
        let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let states: Vec<_> =
            State::ALL.iter().map(|s| (format!("{{state=\"{s}\"}}"), if *s == state { 1.0 } else { 0.0 })).collect();
        family("argocd_agent_ha_state", "gauge", "The principal's HA state (1 for the current one).", &states);
        #[allow(clippy::cast_precision_loss)]
        let n = |v: u64| v as f64;
        let one = |v: f64| vec![(String::new(), v)];
        family(
            "argocd_agent_ha_epoch",
            "gauge",
            "This hub's HA epoch (bumped by every promotion).",
            &one(n(self.epoch())),
        );
        family(
            "argocd_agent_ha_failovers_total",
            "counter",
            "Promotions to active.",
            &one(n(self.failovers.load(Ordering::Relaxed))),
        );
        family(
            "argocd_agent_ha_failbacks_total",
            "counter",
            "Demotions and step-downs from active.",
            &one(n(self.failbacks.load(Ordering::Relaxed))),
        );
        let (streams, in_sync) = self.forwarder.counts();
        family(
            "argocd_agent_replication_replicas_connected",
            "gauge",
            "Replica streams served.",
            &one(n(streams as u64)),
        );
        family(
            "argocd_agent_replication_replicas_in_sync",
            "gauge",
            "Replica streams in sync (the agents' ACKs wait for them).",
            &one(n(in_sync as u64)),
        );
        family(
            "argocd_agent_replication_last_sequence_number",
            "gauge",
            "The last sequence number forwarded.",
            &one(n(self.forwarder.current())),
        );
        family(
            "argocd_agent_replication_replicas_cut_off_total",
            "counter",
            "Replica streams ended because the replica fell behind.",
            &one(n(self.forwarder.cut_offs())),
        );
        family(
            "argocd_agent_replication_requests_refused_total",
            "counter",
            "Replication calls refused: caller not authenticated by --auth mtls, or identity not in \
             --ha-allowed-replication-clients.",
            &[
                ("{reason=\"unauthenticated\"}".to_owned(), n(self.refused_unauthenticated.load(Ordering::Relaxed))),
                ("{reason=\"not_allowed\"}".to_owned(), n(self.refused_not_allowed.load(Ordering::Relaxed))),
            ],
        );
        family(
            "argocd_agent_replication_client_undecodable_events_total",
            "counter",
            "Replicated events this replica could not decode (each answered by a fresh snapshot).",
            &one(n(self.undecodable.load(Ordering::Relaxed))),
        );
        let follower = self.follower.lock().unwrap_or_else(PoisonError::into_inner);
        family(
            "argocd_agent_replication_client_connected",
            "gauge",
            "Whether this replica's stream from the active peer is live.",
            &one(if follower.connected { 1.0 } else { 0.0 }),
        );
        family(
            "argocd_agent_replication_client_last_sequence_number",
            "gauge",
            "The last sequence number this replica applied.",
            &one(n(follower.last_seq)),
        );
        out
    }

    /// Remembers an agent's mode (replica side).
    fn learn_mode(&self, agent: &str, mode: AgentMode) {
        self.modes.lock().unwrap_or_else(PoisonError::into_inner).insert(agent.to_owned(), mode);
    }

    fn known_mode(&self, agent: &str) -> Option<AgentMode> {
        self.modes.lock().unwrap_or_else(PoisonError::into_inner).get(agent).copied()
    }
}
