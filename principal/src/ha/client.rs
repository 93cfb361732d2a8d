//! The replica side (upstream `pkg/replication/client.go` and the apply half of
//! `principal/ha_integration.go`): while this principal is a replica it follows the peer's
//! `Replication` stream and applies what it gets to its own hub.
//!
//! One round, in order: open `Subscribe` (the active queues events for it from then on), fetch
//! `GetSnapshot` and apply it (upserts; Applications of an agent missing from the snapshot are
//! deleted only when the active confirms them deleted with `ConfirmMissingResources`), send the
//! first ACK (the snapshot's sequence number), then apply each event in sequence order through
//! the same code that applies agents' events on an active principal ([`crate::sync::inbound`]) and
//! ACK it. Events up to the last applied sequence number are skipped (already in a snapshot). A
//! gap in the sequence, an event that cannot be applied, or a cut-off by the active ends the
//! round: the next round starts from a fresh snapshot, so nothing is skipped silently. An event
//! that does not decode ([`protocol::replication::decode`]) is not skipped either: the replica
//! stops applying the stream, applies a fresh snapshot (which covers that sequence number: the
//! active numbers an event only once its hub has it) and resumes after the snapshot's sequence
//! number; a snapshot that does not cover it ends the round. A fresh snapshot is also applied
//! every [`HaConfig::reconcile_interval`] (changes made on the active hub directly, which no
//! agent event carries).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use link::Retryable as _;
use protocol::pb::replicationapi::replication_client::ReplicationClient;
use protocol::pb::replicationapi::{ConfirmMissingResourcesRequest, ReplicationAck, Resource, SnapshotRequest};
use protocol::replication::{Change, DecodeError, Decoded, decode};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::replication::{CUT_OFF, api_for, peer_claims};
use super::{Ha, HaConfig, State};
use crate::config::AgentMode;
use crate::sync::hub::Hub;

/// Dials the peer as configured.
pub(super) async fn connect(config: &HaConfig) -> Result<Channel, String> {
    if let Some(connector) = &config.connector {
        return connector().await;
    }
    let url = format!("http://{}", config.peer_address);
    tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|e| format!("--ha-peer-address {:?}: {e}", config.peer_address))?
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| format!("cannot reach the peer at {url}: {e}"))
}

/// The ACKs to send: the latest applied sequence number whenever it changes.
fn ack_stream(rx: watch::Receiver<Option<u64>>) -> impl futures::Stream<Item = ReplicationAck> + Send + 'static {
    futures::stream::unfold((rx, None::<u64>), |(mut rx, sent)| async move {
        loop {
            let latest = *rx.borrow_and_update();
            if let Some(seq) = latest
                && Some(seq) != sent
            {
                return Some((ReplicationAck { acked_sequence_num: seq }, (rx, Some(seq))));
            }
            if rx.changed().await.is_err() {
                return None;
            }
        }
    })
}

type Rpc = ReplicationClient<Channel>;

/// Which of this hub's objects a snapshot part covers: `kind` in `namespace`, of `agent` (empty:
/// principal-scoped).
#[derive(Clone, Copy)]
struct Scope<'a> {
    agent: &'a str,
    kind: &'a str,
    namespace: &'a str,
}

impl Ha {
    fn set_follower(&self, connected: bool, applied: Option<(u64, i64)>) {
        let mut f = self.follower.lock().unwrap_or_else(PoisonError::into_inner);
        f.connected = connected;
        if let Some((seq, at)) = applied {
            f.last_seq = seq;
            if at > 0 {
                f.last_event_unix = at;
            }
        }
    }

    /// While a replica: follows the peer, reconnecting with backoff (module docs); stops
    /// following as soon as this principal becomes active.
    pub(super) async fn follow(self: Arc<Self>, cancel: CancellationToken) {
        let (first, longest) = self.config.reconnect_backoff;
        let mut backoff = first;
        let can_follow = !self.config.peer_address.is_empty() || self.config.connector.is_some();
        loop {
            let mut state = self.subscribe();
            tokio::select! {
                () = cancel.cancelled() => return,
                replica = state.wait_for(|s| s.is_replica()) => if replica.is_err() { return },
            }
            if !can_follow {
                tracing::warn!("HA: a replica without --ha-peer-address has nothing to follow");
                tokio::select! {
                    () = cancel.cancelled() => return,
                    _ = state.wait_for(|s| !s.is_replica()) => continue,
                }
            }
            let round = tokio::select! {
                () = cancel.cancelled() => return,
                _ = state.wait_for(|s| !s.is_replica()) => Ok(()),
                round = self.replicate(&mut backoff) => round,
            };
            self.set_follower(false, None);
            let Err(reason) = round else { continue };
            tracing::warn!(peer = %self.config.peer_address, %reason, retry_in = ?backoff, "HA: replication interrupted");
            if self.state().is_replica() {
                self.transition(State::Disconnected);
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = state.wait_for(|s| !s.is_replica()) => {}
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = backoff.mul_f64(1.5).min(longest);
        }
    }

    /// One round of following the peer; returns why it ended.
    async fn replicate(&self, backoff: &mut Duration) -> Result<(), String> {
        let channel = connect(&self.config).await?;
        let mut rpc = ReplicationClient::new(channel)
            .max_decoding_message_size(protocol::pb::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(protocol::pb::MAX_MESSAGE_BYTES);
        let (acks, applied) = watch::channel(None::<u64>);
        let response = rpc.subscribe(ack_stream(applied)).await.map_err(|status| {
            if let Some((_, epoch, _)) = peer_claims(status.metadata()) {
                self.saw_peer_epoch(epoch);
            }
            format!("Subscribe refused: {status}")
        })?;
        if let Some((_, epoch, _)) = peer_claims(response.metadata()) {
            self.saw_peer_epoch(epoch);
        }
        let mut events = response.into_inner();
        let mut last = self.apply_snapshot(&mut rpc).await?;
        acks.send_replace(Some(last));
        self.synced.store(true, Ordering::Release);
        self.set_follower(true, Some((last, 0)));
        self.transition(State::Replicating);
        *backoff = self.config.reconnect_backoff.0;
        tracing::info!(peer = %self.config.peer_address, seq = last, "HA: replicating from the peer");
        let every = self.config.reconcile_interval;
        let mut reconcile = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                _ = reconcile.tick() => {
                    last = last.max(self.apply_snapshot(&mut rpc).await?);
                    acks.send_replace(Some(last));
                    self.set_follower(true, Some((last, 0)));
                }
                msg = events.message() => match msg {
                    Ok(Some(rep)) => {
                        let (seq, at) = (rep.sequence_num, rep.processed_at_unix);
                        if seq <= last {
                            continue;
                        }
                        if seq != last + 1 {
                            self.synced.store(false, Ordering::Release);
                            return Err(format!("sequence gap: expected {}, got {seq}; resyncing from a snapshot", last + 1));
                        }
                        let agent = rep.agent_name.clone();
                        let change = match decode(rep) {
                            Ok(Decoded::Apply(change)) => Some(change),
                            Ok(Decoded::Ignore(_)) => None,
                            Err(why) => {
                                last = self.snapshot_instead(&mut rpc, seq, &agent, &why).await?;
                                acks.send_replace(Some(last));
                                self.set_follower(true, Some((last, at)));
                                continue;
                            }
                        };
                        if let Some(change) = change
                            && let Err(e) = self.apply_event(*change, seq).await
                        {
                            self.synced.store(false, Ordering::Release);
                            return Err(format!("{e}; resyncing from a snapshot"));
                        }
                        last = seq;
                        acks.send_replace(Some(last));
                        self.set_follower(true, Some((last, at)));
                    }
                    Ok(None) => return Err("the peer ended the replication stream".to_owned()),
                    Err(status) => {
                        if status.message().starts_with(CUT_OFF) {
                            self.synced.store(false, Ordering::Release);
                        }
                        return Err(format!("replication stream failed: {status}"));
                    }
                },
            }
        }
    }

    /// Replicated event `seq` (of `agent`) does not decode: instead of skipping it, applies a
    /// fresh snapshot, which covers it; returns the snapshot's sequence number to resume after.
    ///
    /// # Errors
    /// The snapshot failed, or does not cover `seq` (the round ends; the next one resyncs).
    async fn snapshot_instead(&self, rpc: &mut Rpc, seq: u64, agent: &str, why: &DecodeError) -> Result<u64, String> {
        self.undecodable.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%agent, seq, error = %why,
            "HA: replicated event does not decode; applying a fresh snapshot before anything after it");
        self.synced.store(false, Ordering::Release);
        let covered = self.apply_snapshot(rpc).await?;
        if covered < seq {
            return Err(format!(
                "replicated event {seq} of agent {agent:?} does not decode ({why}) and the fresh snapshot covers \
                 only up to {covered}; resyncing from a snapshot"
            ));
        }
        self.synced.store(true, Ordering::Release);
        tracing::info!(seq = covered, "HA: snapshot applied in place of the undecodable event; resuming after it");
        Ok(covered)
    }

    /// Whether `resource` is an autonomous agent's Application (in the agent's namespace).
    fn is_autonomous_copy(&self, resource: &Resource) -> bool {
        resource.kind == "Application" && self.known_mode(&resource.namespace) == Some(AgentMode::Autonomous)
    }

    fn hub_or_err(&self) -> Result<&Arc<Hub>, String> {
        self.hub.as_ref().ok_or_else(|| "no hub to apply replicated state to".to_owned())
    }

    /// Makes sure namespace `ns` exists on this hub (once per namespace).
    async fn ensure_namespace(&self, hub: &Hub, ns: &str) -> Result<(), String> {
        if ns.is_empty() || self.namespaces.lock().unwrap_or_else(PoisonError::into_inner).contains(ns) {
            return Ok(());
        }
        protocol::kube_store::ensure_namespace(&hub.apps.client(), ns, &BTreeMap::new())
            .await
            .map_err(|e| format!("cannot create namespace {ns} on this hub: {e}"))?;
        self.namespaces.lock().unwrap_or_else(PoisonError::into_inner).insert(ns.to_owned());
        Ok(())
    }

    /// Fetches and applies a snapshot; returns its sequence number.
    async fn apply_snapshot(&self, rpc: &mut Rpc) -> Result<u64, String> {
        let hub = self.hub_or_err()?;
        let snap = rpc
            .get_snapshot(SnapshotRequest { since_sequence_num: self.applied_sequence() })
            .await
            .map_err(|s| format!("GetSnapshot: {s}"))?
            .into_inner();
        for resource in &snap.principal_resources {
            upsert(self, hub, resource).await?;
        }
        for agent in &snap.agents {
            if let Ok(mode) = agent.mode.parse::<AgentMode>() {
                self.learn_mode(&agent.name, mode);
            }
            self.ensure_namespace(hub, &agent.name).await?;
            for resource in &agent.resources {
                upsert(self, hub, resource).await?;
            }
            let scope = Scope { agent: &agent.name, kind: "Application", namespace: &agent.name };
            self.confirm_missing(rpc, hub, scope, &agent.resources, snap.last_sequence_num).await?;
        }
        // Principal-scoped: the principal namespace's AppProjects, and Applications in the
        // namespaces the snapshot has principal-scoped ones in (and the principal namespace).
        let ns = hub.config.namespace.as_str();
        let mut namespaces: Vec<&str> = snap
            .principal_resources
            .iter()
            .filter(|r| r.kind == "Application" && !snap.agents.iter().any(|a| a.name == r.namespace))
            .map(|r| r.namespace.as_str())
            .chain(std::iter::once(ns))
            .collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        for namespace in namespaces {
            let scope = Scope { agent: "", kind: "Application", namespace };
            self.confirm_missing(rpc, hub, scope, &snap.principal_resources, snap.last_sequence_num).await?;
        }
        let scope = Scope { agent: "", kind: "AppProject", namespace: ns };
        self.confirm_missing(rpc, hub, scope, &snap.principal_resources, snap.last_sequence_num).await?;
        tracing::info!(agents = snap.agents.len(), seq = snap.last_sequence_num, "HA: snapshot applied");
        Ok(snap.last_sequence_num)
    }

    /// Objects of `scope` on this hub that the snapshot lacks: deleted only when the active
    /// confirms them deleted; refreshed when it says they exist; kept otherwise.
    async fn confirm_missing(
        &self,
        rpc: &mut Rpc,
        hub: &Hub,
        scope: Scope<'_>,
        present: &[Resource],
        seq: u64,
    ) -> Result<(), String> {
        let Scope { agent, kind, namespace } = scope;
        let Some(api) = api_for(hub, kind, namespace) else { return Ok(()) };
        let local = api.list(&ListParams::default()).await.map_err(|e| format!("list {kind}s in {namespace}: {e}"))?;
        let missing: Vec<Resource> = local
            .items
            .iter()
            .filter_map(|obj| {
                let name = obj.metadata.name.clone()?;
                let kept = present.iter().any(|r| r.kind == kind && r.name == name && r.namespace == namespace);
                (!kept).then(|| Resource {
                    name,
                    namespace: namespace.to_owned(),
                    kind: kind.to_owned(),
                    uid: obj.metadata.uid.clone().unwrap_or_default(),
                    ..Resource::default()
                })
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let request = ConfirmMissingResourcesRequest {
            agent_name: agent.to_owned(),
            snapshot_sequence_num: seq,
            resources: missing,
        };
        let answer = match rpc.confirm_missing_resources(request).await {
            Ok(a) => a.into_inner(),
            Err(status) => {
                tracing::warn!(%kind, %namespace, %status, "HA: cannot confirm resources missing from the snapshot; keeping them");
                return Ok(());
            }
        };
        for result in answer.results {
            let Some(resource) = result.resource else { continue };
            match result.status.as_str() {
                "deleted" => {
                    if self.is_autonomous_copy(&resource) {
                        // Expected, not a hub-side deletion to revert.
                        hub.autonomous.owner_deleted((resource.namespace.clone(), resource.name.clone()));
                    }
                    let deleted = api.delete(&resource.name, &DeleteParams::default()).await;
                    if let Err(e) = deleted
                        && !matches!(&e, kube::Error::Api(s) if s.code == 404)
                    {
                        return Err(format!("delete {kind} {namespace}/{}: {e}", resource.name));
                    }
                    tracing::info!(%kind, %namespace, name = %resource.name, "HA: deleted, as on the active hub");
                }
                "exists" => upsert(self, hub, &resource).await?,
                other => {
                    tracing::warn!(%kind, %namespace, name = %resource.name, status = other, reason = %result.reason,
                    "HA: primary could not confirm missing resource; kept")
                }
            }
        }
        Ok(())
    }

    /// Applies one decoded replicated event (sequence number `seq`) to this hub (module docs).
    async fn apply_event(&self, change: Change, seq: u64) -> Result<(), String> {
        let hub = self.hub_or_err()?;
        let Change { agent, mode, event: ev } = change;
        let agent = agent.as_str();
        if !crate::config::is_dns_label(agent) {
            return Err(format!("replicated event {seq} names agent {agent:?}, which is not a DNS-1123 label"));
        }
        let mode = mode.or_else(|| self.known_mode(agent)).unwrap_or(match ev.event_type {
            protocol::EventType::StatusUpdate => AgentMode::Managed,
            _ => AgentMode::Autonomous,
        });
        self.learn_mode(agent, mode);
        self.ensure_namespace(hub, agent).await?;
        let peer = hub.peers.get_or_create(agent, mode);
        let mut delay = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            match crate::sync::inbound::process(hub, &peer, &ev).await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_retryable() && attempt < 5 => {
                    attempt += 1;
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => {
                    return Err(format!(
                        "cannot apply {} {} of agent {agent} (sequence {seq}): {e}",
                        ev.event_type, ev.target
                    ));
                }
            }
        }
    }
}

/// Creates or replaces a replicated Application or AppProject on this hub, as the active hub
/// has it (without its server-set metadata and owner references, which name the other hub's
/// objects). Other kinds (an upstream primary's ApplicationSets and cluster secrets) are not
/// replicated here.
async fn upsert(ha: &Ha, hub: &Hub, resource: &Resource) -> Result<(), String> {
    if resource.data.is_empty() {
        tracing::warn!(kind = %resource.kind, name = %resource.name, "HA: snapshot resource without data; skipped");
        return Ok(());
    }
    let Some(api) = api_for(hub, &resource.kind, &resource.namespace) else { return Ok(()) };
    let what = format!("{} {}/{}", resource.kind, resource.namespace, resource.name);
    let mut obj: DynamicObject =
        serde_json::from_slice(&resource.data).map_err(|e| format!("{what} from the snapshot does not decode: {e}"))?;
    let meta = &mut obj.metadata;
    meta.resource_version = None;
    meta.uid = None;
    meta.creation_timestamp = None;
    meta.managed_fields = None;
    meta.generation = None;
    meta.owner_references = None;
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    ha.ensure_namespace(hub, &resource.namespace).await?;
    if ha.is_autonomous_copy(resource) {
        // The agent's version, as the principal keeps it for an autonomous agent's hub copies:
        // without it, this hub's watcher would take the write for a hub edit and revert it.
        let app: protocol::argocd::Application = serde_json::from_slice(&resource.data)
            .map_err(|e| format!("{what} from the snapshot is not an Application: {e}"))?;
        hub.autonomous.set_source((resource.namespace.clone(), resource.name.clone()), app);
    }
    for _ in 0..3 {
        let result = match api.get_opt(&resource.name).await {
            Ok(Some(existing)) => {
                obj.metadata.resource_version = existing.metadata.resource_version;
                api.replace(&resource.name, &PostParams::default(), &obj).await.map(drop)
            }
            Ok(None) => {
                obj.metadata.resource_version = None;
                api.create(&PostParams::default(), &obj).await.map(drop)
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => return Ok(()),
            // Changed or created meanwhile: read it again.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(format!("cannot write {what} to this hub: {e}")),
        }
    }
    Err(format!("cannot write {what} to this hub: it keeps changing"))
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;

    use super::*;

    #[tokio::test]
    async fn acks_carry_the_latest_sequence_once() {
        let (tx, rx) = watch::channel(None);
        let mut acks = Box::pin(ack_stream(rx));
        tx.send_replace(Some(0));
        assert_eq!(acks.next().await.map(|a| a.acked_sequence_num), Some(0), "the first ACK, even of sequence 0");
        tx.send_replace(Some(3));
        tx.send_replace(Some(5));
        assert_eq!(acks.next().await.map(|a| a.acked_sequence_num), Some(5), "coalesced to the latest");
        tx.send_replace(Some(5));
        drop(tx);
        assert_eq!(acks.next().await.map(|a| a.acked_sequence_num), None, "no repeat; ends with the round");
    }
}
