//! Agent ownership across principal replicas (`--agent-leases`, docs/ha.md).
//!
//! Any replica accepts any agent. Each agent is owned by one replica at a time through a
//! coordination.k8s.io/v1 Lease in the principal namespace, `argocd-agent-owner-<agent>`, whose
//! `holderIdentity` is the owning replica. Hub writes for an agent come only from its owner.
//!
//! * **The newest stream wins, across replicas as within one.** A replica that accepts a stream
//!   takes the agent's Lease (`leaseTransitions` + 1) whoever held it; the replica that held it
//!   sees the change through its watch of the Leases and closes its stream of that agent
//!   (`Aborted`, naming the new owner), then forgets the agent's mailbox: the resync on the new
//!   stream repairs whatever it had not delivered.
//! * **Liveness is per replica, not per agent.** Each replica renews one Lease of its own,
//!   `argocd-agent-replica-<replica>`, every third of `--agent-lease-duration`. An agent's Lease
//!   is live while the Lease of the replica it names is; renewing one Lease per agent would cost
//!   the hub a write per agent every few seconds (2,000 writes/s at 10,000 agents). An agent's
//!   Lease is written only when its owner changes; its `renewTime` is the time it was taken.
//! * **Fencing.** A replica may write for an agent only while it holds the agent's Lease and its
//!   own Lease is valid: renewed less than two thirds of the duration ago, counted from when the
//!   renewal was *sent*. Every hub write for an agent is started inside that window and
//!   abandoned when it closes ([`Ownership::write_deadline`]). A replica cut off from the hub API
//!   therefore stops writing a third of the duration before any other replica can see its Lease
//!   expire; it then closes every agent stream it holds (`Unavailable`), so the agents
//!   reconnect to a replica that can reach the hub, and it refuses new streams and reports not
//!   ready until a renewal succeeds again.
//! * **Shutdown** closes every stream at once, telling agents to reconnect immediately (another
//!   replica takes them), and deletes the replica's own Lease, so its agents' Leases are seen
//!   as free at once rather than after the duration.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use link::lock;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Status;

pub use crate::config::LeaseConfig;
use crate::peer::Peers;

/// The label on every Lease the principal writes: `agent` or `replica`.
pub const LEASE_LABEL: &str = "argocd-agent.argoproj-labs.io/lease";
/// The annotation naming the agent an owner Lease is for (its name may be hashed).
pub const AGENT_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/agent";
/// The annotation on a replica's own Lease naming the `host:port` at which the other replicas
/// reach its resource proxy (`--replica-proxy-address`), to forward requests for its agents.
pub const PROXY_ADDRESS_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/resource-proxy-address";
/// `--agent-lease-duration` unless given.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(15);
/// Prefix of an agent's owner Lease.
const AGENT_PREFIX: &str = "argocd-agent-owner-";
/// Prefix of a replica's own Lease.
const REPLICA_PREFIX: &str = "argocd-agent-replica-";
/// Attempts to take an agent's Lease when others write it at the same time.
const ACQUIRE_ATTEMPTS: usize = 5;

/// The name of `agent`'s owner Lease: the agent's name when it makes a valid object name, else
/// a hash of it (the annotation keeps the name).
#[must_use]
pub fn agent_lease_name(agent: &str) -> String {
    let name = format!("{AGENT_PREFIX}{agent}");
    if is_dns_subdomain(&name) { name } else { format!("{AGENT_PREFIX}{:016x}", fnv1a(agent.as_bytes())) }
}

/// The name of `replica`'s own Lease.
#[must_use]
pub fn replica_lease_name(replica: &str) -> String {
    format!("{REPLICA_PREFIX}{replica}")
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// FNV-1a, 64 bits: a stable short name for agent names that are not valid object names.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Why a stream could not be given its agent.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The replica's own Lease is not valid: it cannot reach the hub API, or is shutting down.
    #[error("replica {replica:?} cannot take agents now: {why}; reconnect (another replica can take the agent)")]
    NotServing {
        /// This replica.
        replica: String,
        /// Why.
        why: &'static str,
    },
    /// Reading or writing the agent's Lease failed.
    #[error("cannot take the Lease {lease:?} of agent {agent:?} in the hub: {source}")]
    Hub {
        /// The agent.
        agent: String,
        /// The Lease.
        lease: String,
        /// What the hub said.
        #[source]
        source: kube::Error,
    },
    /// Others kept writing the Lease.
    #[error(
        "cannot take the Lease {lease:?} of agent {agent:?}: it changed on every one of {ACQUIRE_ATTEMPTS} attempts"
    )]
    Contended {
        /// The agent.
        agent: String,
        /// The Lease.
        lease: String,
    },
    /// Taking the Lease took longer than a renewal may.
    #[error("taking the Lease of agent {agent:?} timed out after {after:?}: the hub API is slow or unreachable")]
    Timeout {
        /// The agent.
        agent: String,
        /// The bound.
        after: Duration,
    },
}

impl From<LeaseError> for Status {
    fn from(e: LeaseError) -> Self {
        crate::peer::reconnect_elsewhere(Status::unavailable(e.to_string()))
    }
}

/// What the replica last saw of another replica's Lease.
#[derive(Debug)]
struct Seen {
    renew_time: Option<String>,
    duration: Duration,
    /// When this replica saw `renew_time` change (client-go's rule: expiry is judged on the
    /// observer's clock, not on the time written by the holder).
    at: Instant,
    /// Where its resource proxy is reached ([`PROXY_ADDRESS_ANNOTATION`]).
    proxy_address: Option<String>,
}

/// What a replica keeps of an agent's Lease to write it again without reading it.
#[derive(Debug, Default)]
struct SeenLease {
    resource_version: String,
    holder: String,
    transitions: i32,
}

impl SeenLease {
    /// The Lease `name` of `agent` as seen (no resourceVersion when never seen: a create).
    fn lease(&self, name: &str, namespace: &str, agent: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some([(LEASE_LABEL.to_owned(), "agent".to_owned())].into()),
                annotations: Some([(AGENT_ANNOTATION.to_owned(), agent.to_owned())].into()),
                resource_version: (!self.resource_version.is_empty()).then(|| self.resource_version.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: (!self.holder.is_empty()).then(|| self.holder.clone()),
                lease_transitions: Some(self.transitions),
                ..LeaseSpec::default()
            }),
        }
    }
}

/// Whether resourceVersion `a` is newer than `b`: both are etcd revisions in practice (numbers);
/// anything else counts as newer, so the watch's latest wins.
fn rv_newer(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a > b,
        _ => true,
    }
}

/// The agents this replica owns, and whether it may act for them.
#[derive(Debug)]
pub(crate) struct Ownership {
    config: LeaseConfig,
    namespace: String,
    api: Api<Lease>,
    /// Until when the last successful renewal of this replica's Lease lets it act.
    valid_until: Mutex<Option<Instant>>,
    /// Agents whose Lease this replica holds, with the `leaseTransitions` it wrote (a watch
    /// event with an older count is stale).
    held: Mutex<HashMap<String, i32>>,
    /// Other replicas' Leases as last seen.
    replicas: Mutex<HashMap<String, Seen>>,
    /// Every agent's Lease as last seen (written or watched): the base of the next take.
    seen_agents: Mutex<HashMap<String, SeenLease>>,
    /// Set on shutdown: no new streams.
    draining: std::sync::atomic::AtomicBool,
    /// Whether the watch of the Leases has listed them all once: an agent missing from
    /// `seen_agents` then has no Lease yet.
    leases_listed: std::sync::atomic::AtomicBool,
    /// Where the other replicas reach this replica's resource proxy, published on its Lease.
    proxy_address: Mutex<Option<String>>,
}

impl Ownership {
    pub(crate) fn new(config: LeaseConfig, client: kube::Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            valid_until: Mutex::new(None),
            held: Mutex::new(HashMap::new()),
            replicas: Mutex::new(HashMap::new()),
            seen_agents: Mutex::new(HashMap::new()),
            draining: std::sync::atomic::AtomicBool::new(false),
            leases_listed: std::sync::atomic::AtomicBool::new(false),
            proxy_address: Mutex::new(config.proxy_address.clone()),
            config,
        }
    }

    /// Publishes `address` (`host:port`) as where the other replicas reach this replica's
    /// resource proxy; its next renewal writes it on its Lease.
    pub(crate) fn publish_proxy_address(&self, address: String) {
        *lock(&self.proxy_address) = Some(address);
    }

    /// This replica's name.
    pub(crate) fn replica(&self) -> &str {
        &self.config.replica
    }

    /// Whether this replica's own Lease is valid now.
    pub(crate) fn is_valid(&self) -> bool {
        lock(&self.valid_until).is_some_and(|until| Instant::now() < until)
    }

    /// Whether the replica is shutting down.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops taking agents (shutdown).
    pub(crate) fn drain(&self) {
        self.draining.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Why the replica does not serve agents now, if it does not.
    pub(crate) fn not_serving(&self) -> Option<&'static str> {
        if self.is_draining() {
            Some("the replica is shutting down")
        } else if !self.is_valid() {
            Some("its own Lease is not renewed (the hub API is unreachable or slow)")
        } else {
            None
        }
    }

    /// The agents this replica holds.
    pub(crate) fn held(&self) -> usize {
        lock(&self.held).len()
    }

    /// Until when this replica may write for `agent`: `None` when it does not own the agent or
    /// its own Lease lapsed.
    pub(crate) fn write_deadline(&self, agent: &str) -> Option<Instant> {
        let until = (*lock(&self.valid_until))?;
        (Instant::now() < until && lock(&self.held).contains_key(agent)).then_some(until)
    }

    /// `(this replica, the live replica that owns agent)` when another replica does, as the
    /// Leases were last seen.
    pub(crate) fn owner_elsewhere(&self, agent: &str) -> Option<(String, String)> {
        let holder = lock(&self.seen_agents).get(agent).map(|seen| seen.holder.clone())?;
        (!holder.is_empty() && holder != self.config.replica && !self.replica_expired(&holder))
            .then(|| (self.config.replica.clone(), holder))
    }

    /// `(the live replica that owns agent, the address of its resource proxy)` when another
    /// replica owns it; the address is `None` when that replica published none.
    pub(crate) fn owner_proxy(&self, agent: &str) -> Option<(String, Option<String>)> {
        let (_, owner) = self.owner_elsewhere(agent)?;
        let address = lock(&self.replicas).get(&owner).and_then(|seen| seen.proxy_address.clone());
        Some((owner, address))
    }

    /// Whether `replica`'s Lease, as last seen, has expired (or was deleted).
    fn replica_expired(&self, replica: &str) -> bool {
        if replica == self.config.replica {
            return !self.is_valid();
        }
        lock(&self.replicas).get(replica).is_none_or(|seen| seen.at.elapsed() > seen.duration)
    }

    /// Takes `agent`'s Lease for this replica (the newest stream wins). Returns the replica it
    /// was taken from, if another held it.
    pub(crate) async fn acquire(&self, agent: &str) -> Result<Option<String>, LeaseError> {
        if let Some(why) = self.not_serving() {
            return Err(LeaseError::NotServing { replica: self.config.replica.clone(), why });
        }
        // A reconnect storm queues thousands of takes behind the hub client's bound on
        // requests in flight: wait as long as a Lease lasts, not a renewal.
        let after = self.config.duration;
        tokio::time::timeout(after, self.take(agent))
            .await
            .unwrap_or_else(|_| Err(LeaseError::Timeout { agent: agent.to_owned(), after }))
    }

    async fn take(&self, agent: &str) -> Result<Option<String>, LeaseError> {
        let name = agent_lease_name(agent);
        let hub_err = |source| LeaseError::Hub { agent: agent.to_owned(), lease: name.clone(), source };
        // First from the watch's copy: one conditional write instead of a read and a write (a
        // failover moves thousands of agents at once). A stale copy is refused (409) and read.
        let mut current = lock(&self.seen_agents).get(agent).map(|seen| seen.lease(&name, &self.namespace, agent));
        let mut fresh = false;
        for attempt in 0..ACQUIRE_ATTEMPTS {
            // Not in the watch's full list: create it without reading (409 if it appeared).
            let listed = attempt == 0 && self.leases_listed.load(std::sync::atomic::Ordering::Acquire);
            if current.is_none() && !fresh && !listed {
                current = self.api.get_opt(&name).await.map_err(hub_err)?;
                fresh = true;
            }
            let (lease, previous) = self.claim(current.take(), &name, agent);
            if fresh && previous.as_deref() == Some(self.config.replica.as_str()) {
                // Read just now and already ours: nothing to write.
                let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0);
                lock(&self.held).insert(agent.to_owned(), transitions);
                return Ok(None);
            }
            let written = if lease.metadata.resource_version.is_some() {
                // `replace` carries the resourceVersion read: a concurrent taker makes it 409.
                self.api.replace(&name, &PostParams::default(), &lease).await
            } else {
                self.api.create(&PostParams::default(), &lease).await
            };
            match written {
                Ok(lease) => {
                    let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0);
                    lock(&self.held).insert(agent.to_owned(), transitions);
                    self.saw_agent_lease(agent, &lease);
                    let previous = previous.filter(|p| *p != self.config.replica);
                    if let Some(from) = &previous {
                        let live = !self.replica_expired(from);
                        crate::metrics::global().lease_taken_over(live);
                        tracing::info!(%agent, from = %from, from_live = live, transitions,
                            "took over the agent's Lease (the newest stream wins)");
                    }
                    return Ok(previous);
                }
                // Stale (409), or deleted since it was seen (404): read it and try again.
                Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => fresh = false,
                Err(e) => return Err(hub_err(e)),
            }
        }
        Err(LeaseError::Contended { agent: agent.to_owned(), lease: name })
    }

    /// `current` (the agent's Lease as read, `None`: there is none) with this replica as its
    /// holder, and the holder it had.
    fn claim(&self, current: Option<Lease>, name: &str, agent: &str) -> (Lease, Option<String>) {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let seconds = i32::try_from(self.config.duration.as_secs()).unwrap_or(i32::MAX);
        let me = self.config.replica.clone();
        let mut lease = current.unwrap_or_else(|| SeenLease::default().lease(name, &self.namespace, agent));
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let previous = spec.holder_identity.clone().filter(|h| !h.is_empty());
        if previous.as_deref() != Some(me.as_str()) {
            spec.acquire_time = Some(now.clone());
            if lease.metadata.resource_version.is_some() {
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            }
        }
        spec.holder_identity = Some(me);
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(seconds);
        (lease, previous)
    }

    /// Keeps what a write or the watch showed of `agent`'s Lease.
    fn saw_agent_lease(&self, agent: &str, lease: &Lease) {
        let Some(rv) = lease.metadata.resource_version.clone() else { return };
        let spec = lease.spec.as_ref();
        let seen = SeenLease {
            resource_version: rv,
            holder: spec.and_then(|s| s.holder_identity.clone()).unwrap_or_default(),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
        };
        let mut all = lock(&self.seen_agents);
        // The watch may deliver an older version after our own write: keep the newest.
        let newer = all.get(agent).is_none_or(|old| rv_newer(&seen.resource_version, &old.resource_version));
        if newer {
            all.insert(agent.to_owned(), seen);
        }
    }

    /// Renews this replica's Lease once; on success the replica may act until a third of the
    /// duration before the Lease would expire, counted from `sent`.
    async fn renew(&self) -> Result<(), kube::Error> {
        let sent = Instant::now();
        let name = replica_lease_name(&self.config.replica);
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let seconds = i32::try_from(self.config.duration.as_secs()).unwrap_or(i32::MAX);
        let address = lock(&self.proxy_address).clone();
        let patch = serde_json::json!({
            "metadata": {"labels": {LEASE_LABEL: "replica"}, "annotations": {PROXY_ADDRESS_ANNOTATION: address.clone()}},
            "spec": {"holderIdentity": self.config.replica, "renewTime": now, "leaseDurationSeconds": seconds},
        });
        match self.api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(self.namespace.clone()),
                        labels: Some([(LEASE_LABEL.to_owned(), "replica".to_owned())].into()),
                        annotations: address.map(|a| [(PROXY_ADDRESS_ANNOTATION.to_owned(), a)].into()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.config.replica.clone()),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_duration_seconds: Some(seconds),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await?;
            }
            Err(e) => return Err(e),
        }
        let until = sent + self.config.valid_for();
        let was_valid = self.is_valid();
        *lock(&self.valid_until) = Some(until);
        if !was_valid {
            tracing::info!(replica = %self.config.replica, "the replica's Lease is valid: taking agents");
        }
        Ok(())
    }

    /// Another replica's Lease was seen.
    fn saw_replica(&self, replica: &str, lease: &Lease) {
        let spec = lease.spec.as_ref();
        let proxy_address = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PROXY_ADDRESS_ANNOTATION))
            .filter(|a| !a.is_empty())
            .cloned();
        let renew_time = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0.to_string());
        let secs = spec.and_then(|s| s.lease_duration_seconds).and_then(|s| u64::try_from(s).ok());
        let duration = secs.map_or(self.config.duration, Duration::from_secs);
        let mut replicas = lock(&self.replicas);
        let seen = replicas.entry(replica.to_owned()).or_insert(Seen {
            renew_time: None,
            duration,
            at: Instant::now(),
            proxy_address: None,
        });
        if seen.renew_time != renew_time {
            *seen = Seen { renew_time, duration, at: Instant::now(), proxy_address: None };
        }
        seen.proxy_address = proxy_address;
    }

    /// An agent's Lease was seen: if another replica took an agent this one holds, the agent
    /// is no longer this replica's. Returns the new holder when that happened.
    fn saw_agent(&self, agent: &str, spec: Option<&LeaseSpec>) -> Option<String> {
        let holder = spec.and_then(|s| s.holder_identity.clone()).unwrap_or_default();
        let transitions = spec.and_then(|s| s.lease_transitions).unwrap_or(0);
        let mut held = lock(&self.held);
        let ours = *held.get(agent)?;
        if holder == self.config.replica || transitions < ours {
            return None;
        }
        held.remove(agent);
        Some(holder)
    }

    /// This replica no longer holds `agent` (its Lease was deleted).
    fn drop_agent(&self, agent: &str) -> bool {
        lock(&self.held).remove(agent).is_some()
    }

    /// Every agent held, now given up (the replica's own Lease lapsed).
    fn give_up_all(&self) -> Vec<String> {
        lock(&self.held).drain().map(|(agent, _)| agent).collect()
    }
}

/// The agent a Lease is for, or the replica it is, from its label and annotation.
enum LeaseOf {
    Agent(String),
    Replica(String),
}

fn classify(lease: &Lease) -> Option<LeaseOf> {
    let kind = lease.metadata.labels.as_ref()?.get(LEASE_LABEL)?;
    let name = lease.metadata.name.as_deref()?;
    match kind.as_str() {
        "agent" => lease.metadata.annotations.as_ref()?.get(AGENT_ANNOTATION).cloned().map(LeaseOf::Agent),
        "replica" => name.strip_prefix(REPLICA_PREFIX).map(|r| LeaseOf::Replica(r.to_owned())),
        _ => None,
    }
}

/// The watch of the principal's Leases, as an index for [`link::watch`].
struct Leases<'a>(&'a Peers, &'a Ownership);

impl link::Index for Leases<'_> {
    type Object = Lease;
    type Item = Lease;
    type Key = String;

    fn what(&self) -> &str {
        "hub Lease"
    }
    fn decode(&self, obj: &Lease) -> Option<Lease> {
        classify(obj).is_some().then(|| obj.clone())
    }
    fn key(item: &Lease) -> String {
        item.metadata.name.clone().unwrap_or_default()
    }
    async fn apply(&self, lease: Lease) {
        match classify(&lease) {
            Some(LeaseOf::Replica(replica)) => self.1.saw_replica(&replica, &lease),
            Some(LeaseOf::Agent(agent)) => {
                self.1.saw_agent_lease(&agent, &lease);
                if let Some(holder) = self.1.saw_agent(&agent, lease.spec.as_ref()) {
                    tracing::info!(%agent, new_owner = %holder, "another replica took the agent; closing its stream here");
                    let why = format!("agent {agent:?} moved to principal replica {holder:?} (the newest stream wins)");
                    lost(self.0, self.1, &agent, Status::aborted(why));
                }
            }
            None => {}
        }
    }
    async fn delete(&self, lease: Lease) {
        match classify(&lease) {
            Some(LeaseOf::Replica(replica)) => {
                lock(&self.1.replicas).remove(&replica);
            }
            Some(LeaseOf::Agent(agent)) => {
                lock(&self.1.seen_agents).remove(&agent);
                if self.1.drop_agent(&agent) {
                    lost(
                        self.0,
                        self.1,
                        &agent,
                        Status::aborted(format!("the owner Lease of agent {agent:?} was deleted")),
                    );
                }
            }
            None => {}
        }
    }
    fn synced(&self) {
        self.1.leases_listed.store(true, std::sync::atomic::Ordering::Release);
    }
    fn known(&self) -> Vec<Lease> {
        // A re-list that misses a Lease this replica holds is judged by the next takeover;
        // nothing to infer here.
        Vec::new()
    }
}

/// Ends this replica's stream of `agent` and forgets its mailbox (the next owner resyncs).
fn lost(peers: &Peers, own: &Ownership, agent: &str, status: Status) {
    crate::metrics::global().lease_lost();
    if !peers.close(agent, crate::peer::reconnect_elsewhere(status)) {
        peers.forget_idle(agent, |a| own.write_deadline(a).is_some());
    }
}

/// Renews this replica's Lease, follows the others', and gives up every agent when its own
/// Lease lapses, until `cancel` fires; then deletes its own Lease.
pub(crate) async fn run(own: &Ownership, peers: &Peers, cancel: CancellationToken) {
    let config = watcher::Config::default().labels(LEASE_LABEL);
    let index = Leases(peers, own);
    let watch = link::watch::run(&index, own.api.clone(), config, &cancel);
    let renewals = async {
        let every = own.config.renew_every();
        let mut failures = 0u32;
        loop {
            match tokio::time::timeout(every, own.renew()).await {
                Ok(Ok(())) => failures = 0,
                Ok(Err(e)) => {
                    failures += 1;
                    tracing::warn!(replica = %own.replica(), error = %e, failures, "cannot renew the replica's Lease");
                }
                Err(_) => {
                    failures += 1;
                    tracing::warn!(replica = %own.replica(), after = ?every, failures,
                        "renewing the replica's Lease timed out");
                }
            }
            let until = *lock(&own.valid_until);
            let next = Instant::now() + if failures == 0 { every } else { every / 4 };
            // Wake at the lapse if it comes before the next renewal.
            let wake = until.map_or(next, |u| u.min(next));
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(wake) => {}
            }
            if until.is_some_and(|u| Instant::now() >= u) && !own.is_valid() {
                let agents = own.give_up_all();
                if !agents.is_empty() {
                    tracing::warn!(replica = %own.replica(), agents = agents.len(),
                        "the replica's Lease lapsed: no more hub writes for its agents; closing their streams");
                }
                for agent in agents {
                    let why = format!(
                        "principal replica {:?} cannot renew its Lease (the hub API is unreachable): reconnect to another",
                        own.replica()
                    );
                    lost(peers, own, &agent, Status::unavailable(why));
                }
            }
        }
    };
    tokio::join!(watch, renewals);
    // Shutdown: the replica's Lease goes, so its agents' Leases are free at once.
    let name = replica_lease_name(own.replica());
    match tokio::time::timeout(own.config.renew_every(), own.api.delete(&name, &DeleteParams::default())).await {
        Ok(Ok(_)) => tracing::info!(replica = %own.replica(), "deleted the replica's Lease"),
        Ok(Err(e)) => tracing::warn!(replica = %own.replica(), error = %e, "cannot delete the replica's Lease"),
        Err(_) => tracing::warn!(replica = %own.replica(), "deleting the replica's Lease timed out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_valid_object_names() {
        assert_eq!(agent_lease_name("agent-1"), "argocd-agent-owner-agent-1");
        let hashed = agent_lease_name("Agent_One");
        assert!(hashed.starts_with(AGENT_PREFIX) && is_dns_subdomain(&hashed), "{hashed}");
        assert_ne!(hashed, agent_lease_name("Agent_Two"));
        assert_eq!(hashed, agent_lease_name("Agent_One"), "stable");
        assert!(is_dns_subdomain(&agent_lease_name(&"a".repeat(300))));
        assert_eq!(replica_lease_name("principal-0"), "argocd-agent-replica-principal-0");
    }

    #[tokio::test]
    async fn a_takeover_by_another_replica_is_seen_and_a_stale_one_is_not() {
        let own = Ownership::new(
            LeaseConfig::new("r1", Duration::from_secs(15)),
            link::testing::offline_client("argocd"),
            "argocd",
        );
        lock(&own.held).insert("a".into(), 3);
        let spec = |holder: &str, transitions| LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        };
        assert_eq!(own.saw_agent("a", Some(&spec("r2", 2))), None, "older than our take: stale");
        assert_eq!(own.saw_agent("a", Some(&spec("r1", 3))), None, "our own write");
        assert_eq!(own.saw_agent("b", Some(&spec("r2", 9))), None, "not ours");
        assert_eq!(own.saw_agent("a", Some(&spec("r2", 4))), Some("r2".into()));
        assert_eq!(own.held(), 0);
        assert_eq!(own.write_deadline("a"), None);
    }

    #[tokio::test]
    async fn a_claim_counts_a_transition_only_when_the_holder_changes() {
        let own = Ownership::new(
            LeaseConfig::new("r1", Duration::from_secs(15)),
            link::testing::offline_client("argocd"),
            "argocd",
        );
        let seen =
            |holder: &str, transitions| SeenLease { resource_version: "7".into(), holder: holder.into(), transitions };
        let spec = |l: &Lease| l.spec.clone().unwrap_or_default();
        let (created, previous) = own.claim(None, "argocd-agent-owner-a", "a");
        assert_eq!((spec(&created).lease_transitions, previous), (Some(0), None), "a new Lease");
        assert!(created.metadata.resource_version.is_none(), "created, not replaced");
        let (taken, previous) = own.claim(Some(seen("r2", 4).lease("n", "argocd", "a")), "n", "a");
        assert_eq!(spec(&taken).holder_identity.as_deref(), Some("r1"));
        assert_eq!((spec(&taken).lease_transitions, previous.as_deref()), (Some(5), Some("r2")));
        assert_eq!(taken.metadata.resource_version.as_deref(), Some("7"), "conditional on what was seen");
        assert_eq!(taken.metadata.annotations.unwrap_or_default().get(AGENT_ANNOTATION).map(String::as_str), Some("a"));
        let (kept, previous) = own.claim(Some(seen("r1", 5).lease("n", "argocd", "a")), "n", "a");
        assert_eq!((spec(&kept).lease_transitions, previous.as_deref()), (Some(5), Some("r1")));
        assert!(rv_newer("10", "9") && !rv_newer("9", "10"));
    }

    #[tokio::test]
    async fn writes_need_the_agent_and_a_valid_replica_lease() {
        let own = Ownership::new(
            LeaseConfig::new("r1", Duration::from_secs(15)),
            link::testing::offline_client("argocd"),
            "argocd",
        );
        lock(&own.held).insert("a".into(), 0);
        assert_eq!(own.write_deadline("a"), None, "never renewed");
        assert!(own.not_serving().is_some());
        let until = Instant::now() + Duration::from_secs(10);
        *lock(&own.valid_until) = Some(until);
        assert_eq!(own.write_deadline("a"), Some(until));
        assert_eq!(own.write_deadline("b"), None, "not held");
        *lock(&own.valid_until) = Some(Instant::now() - Duration::from_millis(1));
        assert_eq!(own.write_deadline("a"), None, "lapsed");
        assert!(own.replica_expired("r1"));
        assert!(own.replica_expired("r2"), "never seen");
        let mut r2 = Lease {
            spec: Some(LeaseSpec { lease_duration_seconds: Some(15), ..LeaseSpec::default() }),
            ..Lease::default()
        };
        own.saw_replica("r2", &r2);
        assert!(!own.replica_expired("r2"));
        lock(&own.seen_agents)
            .insert("b".into(), SeenLease { resource_version: "3".into(), holder: "r2".into(), transitions: 0 });
        assert_eq!(own.owner_elsewhere("b"), Some(("r1".into(), "r2".into())), "a live owner elsewhere");
        assert_eq!(own.owner_proxy("b"), Some(("r2".into(), None)), "no address published");
        r2.metadata.annotations = Some([(PROXY_ADDRESS_ANNOTATION.to_owned(), "10.0.0.2:8443".to_owned())].into());
        own.saw_replica("r2", &r2);
        assert_eq!(own.owner_proxy("b"), Some(("r2".into(), Some("10.0.0.2:8443".into()))));
        assert_eq!(own.owner_elsewhere("c"), None, "no Lease");
        lock(&own.replicas).clear();
        assert_eq!(own.owner_elsewhere("b"), None, "its owner's Lease is gone");
    }
}
