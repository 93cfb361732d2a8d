//! The active side of `replicationapi.Replication` (upstream
//! `principal/apis/replication/server.go`, `pkg/replication/forwarder.go`), served on the
//! principal's main gRPC port beside the agents ([`ReplicationLayer`]), and the forwarder that
//! hands agents' events to the replica streams.
//!
//! Per replica stream: a queue of [`HaConfig::queue_capacity`] events; nothing is sent before
//! the replica's first ACK (it fetches its snapshot meanwhile), then the queue in sequence
//! order. The replica is **in sync** from its first ACK until its stream ends or it is cut off.
//! [`Forwarder::forward`] (the agent's ACK waits on it):
//! 1. assigns the next sequence number and queues the event on every replica, in order (one
//!    forward at a time): for an in-sync replica it waits for room until the deadline
//!    (backpressure: every agent's ACK waits meanwhile); a replica still syncing whose queue
//!    is full is cut off at once (it resyncs from a snapshot);
//! 2. waits until every in-sync replica acknowledged the sequence number (applied to its
//!    hub), until the same deadline ([`HaConfig::replicate_timeout`] after the call);
//! 3. cuts off any in-sync replica that missed the deadline: its stream ends with
//!    `DeadlineExceeded` or `ResourceExhausted` saying so, and it is no longer waited for.
//!
//! Authorization (upstream `principal/auth.go`, `authenticateReplication`, made deny by
//! default): the replication paths bypass the agents' token check; the caller's verified client
//! certificate must pass the `--auth mtls:` method (capture group 1 is its identity), and the
//! identity must be in `--ha-allowed-replication-clients`. A snapshot holds every agent's
//! Applications, so an agent's certificate (which the mTLS method accepts too) must not read
//! it: upstream lets any identity through when the list is empty; here an empty list lets no one
//! through, and only `*` ([`ANY_REPLICATION_CLIENT`]) restores upstream's "any identity". Each
//! refusal is logged and counted (`argocd_agent_replication_requests_refused_total`). Without
//! HA: `Unimplemented`.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures::Stream;
use kube::api::{DynamicObject, ListParams};
use protocol::Event;
use protocol::pb::replicationapi::replication_server::{Replication, ReplicationServer};
use protocol::pb::replicationapi::{
    AgentState, ConfirmMissingResourceResult, ConfirmMissingResourcesRequest, ConfirmMissingResourcesResponse,
    ReplicatedEvent, ReplicationAck, ReplicationSnapshot, ReplicationStatus, Resource, SnapshotRequest, StatusRequest,
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::{EPOCH_HEADER, Ha, HaConfig, STATE_HEADER, State, UID_HEADER};
use crate::config::AgentMode;
use crate::sync::hub::Hub;

/// The prefix of every replication method path.
pub const PATH_PREFIX: &str = "/replicationapi.Replication/";

pub use protocol::replication::{MODE_EXTENSION, replicable};

/// The `--ha-allowed-replication-clients` entry that allows any identity the `--auth mtls:`
/// method accepts (upstream's behaviour with an empty list), agents' certificates included.
pub const ANY_REPLICATION_CLIENT: &str = "*";

/// Marks a stream the active ended because the replica fell behind: the replica must not
/// count itself in sync until its next snapshot.
pub const CUT_OFF: &str = "replica cut off";

/// One replica stream as the forwarder sees it.
struct ReplicaLink {
    id: String,
    cut_offs: Arc<AtomicU64>,
    queue: mpsc::Sender<ReplicatedEvent>,
    acked: watch::Sender<u64>,
    in_sync: AtomicBool,
    cut: CancellationToken,
    why: Mutex<Option<Status>>,
}

impl ReplicaLink {
    fn cut_off(&self, status: Status) {
        let mut why = self.why.lock().unwrap_or_else(PoisonError::into_inner);
        if why.is_none() {
            if status.message().starts_with(CUT_OFF) {
                self.cut_offs.fetch_add(1, Ordering::Relaxed);
            }
            tracing::warn!(replica = %self.id, reason = status.message(), "HA: replica cut off; it resyncs from a snapshot");
            *why = Some(status);
        }
        self.in_sync.store(false, Ordering::Release);
        self.cut.cancel();
    }
}

/// Hands agents' events to the replica streams (see the module docs).
#[derive(Default)]
pub(crate) struct Forwarder {
    seq: AtomicU64,
    cut_offs: Arc<AtomicU64>,
    last_event_unix: AtomicI64,
    order: tokio::sync::Mutex<()>,
    replicas: Mutex<Vec<Arc<ReplicaLink>>>,
}

impl Forwarder {
    /// The last sequence number assigned.
    pub(crate) fn current(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    fn links(&self) -> Vec<Arc<ReplicaLink>> {
        self.replicas.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Replica streams cut off because they fell behind, since start.
    pub(crate) fn cut_offs(&self) -> u64 {
        self.cut_offs.load(Ordering::Relaxed)
    }

    /// Replica streams, and how many are in sync.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let links = self.links();
        let in_sync = links.iter().filter(|l| l.in_sync.load(Ordering::Acquire)).count();
        (links.len(), in_sync)
    }

    fn pending(&self) -> usize {
        self.links().iter().map(|l| l.queue.max_capacity() - l.queue.capacity()).sum()
    }

    /// Ends every replica stream (this principal stopped being active).
    pub(crate) fn cut_all(&self, why: &str) {
        for link in self.links() {
            link.cut_off(Status::unavailable(format!("{why}; replication stopped")));
        }
    }

    fn remove(&self, id: &str) {
        self.replicas.lock().unwrap_or_else(PoisonError::into_inner).retain(|l| l.id != id);
    }

    /// Forwards `agent`'s applied event and waits for the in-sync replicas (module docs).
    /// Returns how many replicas acknowledged it.
    pub(crate) async fn forward(&self, config: &HaConfig, agent: &str, mode: AgentMode, ev: &Event) -> usize {
        let deadline = tokio::time::Instant::now() + config.replicate_timeout;
        let now = chrono::Utc::now().timestamp();
        let mut waiting = Vec::new();
        let seq = {
            let _order = self.order.lock().await;
            let seq = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
            self.last_event_unix.store(now, Ordering::Release);
            let msg = protocol::replication::encode(agent, mode, ev, seq, now);
            for link in self.links() {
                if link.cut.is_cancelled() {
                    continue;
                }
                if link.in_sync.load(Ordering::Acquire) {
                    tokio::select! {
                        sent = link.queue.send(msg.clone()) => if sent.is_ok() { waiting.push(link) },
                        () = tokio::time::sleep_until(deadline) => link.cut_off(Status::resource_exhausted(format!(
                            "{CUT_OFF}: its queue stayed full for {:?}", config.replicate_timeout))),
                        () = link.cut.cancelled() => {}
                    }
                } else if let Err(mpsc::error::TrySendError::Full(_)) = link.queue.try_send(msg.clone()) {
                    link.cut_off(Status::resource_exhausted(format!(
                        "{CUT_OFF}: {} events arrived before its first ACK",
                        config.queue_capacity
                    )));
                }
            }
            seq
        };
        let mut acknowledged = 0;
        for link in waiting {
            let mut acked = link.acked.subscribe();
            tokio::select! {
                done = acked.wait_for(|a| *a >= seq) => if done.is_ok() { acknowledged += 1 },
                () = tokio::time::sleep_until(deadline) => link.cut_off(Status::deadline_exceeded(format!(
                    "{CUT_OFF}: sequence {seq} not acknowledged within {:?}", config.replicate_timeout))),
                () = link.cut.cancelled() => {}
            }
        }
        acknowledged
    }
}

/// The `Replication` service of one HA principal.
#[derive(Clone)]
pub struct ReplicationService {
    ha: Arc<Ha>,
}

impl std::fmt::Debug for ReplicationService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationService").finish_non_exhaustive()
    }
}

impl ReplicationService {
    fn hub(&self) -> Result<&Arc<Hub>, Status> {
        self.ha.hub.as_ref().ok_or_else(|| Status::internal("state provider not configured"))
    }

    fn require_active(&self) -> Result<(), Status> {
        let state = self.ha.state();
        if state == State::Active {
            Ok(())
        } else {
            Err(self.stamp(Status::unavailable(format!("HA state: {state} - not the active principal"))))
        }
    }

    fn claims(&self) -> MetadataMap {
        let mut md = MetadataMap::new();
        let pairs = [
            (STATE_HEADER, self.ha.state().as_str().to_owned()),
            (EPOCH_HEADER, self.ha.epoch().to_string()),
            (UID_HEADER, self.ha.principal_uid().to_owned()),
        ];
        for (key, value) in pairs {
            if let Ok(v) = value.parse() {
                md.insert(key, v);
            }
        }
        md
    }

    fn stamp(&self, status: Status) -> Status {
        Status::with_metadata(status.code(), status.message(), self.claims())
    }

    fn answer<T>(&self, body: T) -> Response<T> {
        let mut response = Response::new(body);
        *response.metadata_mut() = self.claims();
        response
    }
}

/// What a peer's `Replication` answer claims: state, epoch, principal UID (from our metadata;
/// `None` for a peer that sends none).
#[must_use]
pub fn peer_claims(md: &MetadataMap) -> Option<(String, u64, String)> {
    let get = |k: &str| md.get(k).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let state = get(STATE_HEADER)?;
    let epoch = get(EPOCH_HEADER)?.parse().ok()?;
    Some((state, epoch, get(UID_HEADER).unwrap_or_default()))
}

type EventStream = Pin<Box<dyn Stream<Item = Result<ReplicatedEvent, Status>> + Send>>;

/// Removes a replica from the forwarder when its stream is dropped.
struct Registered {
    ha: Arc<Ha>,
    link: Arc<ReplicaLink>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.link.cut.cancel();
        self.ha.forwarder.remove(&self.link.id);
        tracing::info!(replica = %self.link.id, "HA: replica stream ended");
    }
}

#[tonic::async_trait]
impl Replication for ReplicationService {
    type SubscribeStream = EventStream;

    async fn subscribe(
        &self,
        request: Request<Streaming<ReplicationAck>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        self.require_active()?;
        let config = &self.ha.config;
        let (tx, rx) = mpsc::channel(config.queue_capacity.max(1));
        let link = Arc::new(ReplicaLink {
            id: uuid::Uuid::new_v4().to_string()[..8].to_owned(),
            cut_offs: self.ha.forwarder.cut_offs.clone(),
            queue: tx,
            acked: watch::Sender::new(0),
            in_sync: AtomicBool::new(false),
            cut: CancellationToken::new(),
            why: Mutex::new(None),
        });
        {
            let mut replicas = self.ha.forwarder.replicas.lock().unwrap_or_else(PoisonError::into_inner);
            if replicas.len() >= config.max_replicas {
                return Err(self.stamp(Status::resource_exhausted("max replica connections reached")));
            }
            replicas.push(link.clone());
        }
        tracing::info!(replica = %link.id, "HA: replica subscribed");
        let registered = Registered { ha: self.ha.clone(), link: link.clone() };
        let mut acks = request.into_inner();
        let initial = config.initial_ack_timeout;
        tokio::spawn({
            let link = link.clone();
            async move {
                let first = tokio::select! {
                    () = link.cut.cancelled() => return,
                    first = tokio::time::timeout(initial, acks.message()) => first,
                };
                match first {
                    Err(_) => {
                        return link.cut_off(Status::deadline_exceeded(format!(
                            "waiting for initial ACK: timed out after {initial:?}"
                        )));
                    }
                    Ok(Err(e)) => return link.cut_off(Status::internal(format!("waiting for initial ACK: {e}"))),
                    Ok(Ok(None)) => return link.cut.cancel(),
                    Ok(Ok(Some(ack))) => {
                        // In sync first, then the wake-up the stream waits for.
                        link.in_sync.store(true, Ordering::Release);
                        link.acked.send_modify(|a| *a = (*a).max(ack.acked_sequence_num));
                        tracing::info!(replica = %link.id, seq = ack.acked_sequence_num, "HA: replica in sync");
                    }
                }
                loop {
                    tokio::select! {
                        () = link.cut.cancelled() => return,
                        ack = acks.message() => match ack {
                            Ok(Some(ack)) => link.acked.send_modify(|a| *a = (*a).max(ack.acked_sequence_num)),
                            Ok(None) | Err(_) => return link.cut.cancel(),
                        },
                    }
                }
            }
        });
        let stream = futures::stream::unfold(Some((registered, rx)), |state| async move {
            let (registered, mut rx) = state?;
            let link = registered.link.clone();
            // Nothing before the first ACK: the replica is fetching its snapshot.
            let mut acked = link.acked.subscribe();
            while !link.in_sync.load(Ordering::Acquire) && !link.cut.is_cancelled() {
                tokio::select! {
                    () = link.cut.cancelled() => break,
                    changed = acked.changed() => if changed.is_err() { break },
                }
            }
            let item = tokio::select! {
                biased;
                () = link.cut.cancelled() => None,
                item = rx.recv() => item,
            };
            match item {
                Some(msg) => Some((Ok(msg), Some((registered, rx)))),
                None => {
                    let why = link.why.lock().unwrap_or_else(PoisonError::into_inner).take();
                    why.map(|status| (Err(status), None))
                }
            }
        });
        Ok(self.answer(Box::pin(stream) as EventStream))
    }

    async fn get_snapshot(&self, _request: Request<SnapshotRequest>) -> Result<Response<ReplicationSnapshot>, Status> {
        self.require_active()?;
        let hub = self.hub()?;
        // Every event up to this sequence number was applied to the hub before it was numbered,
        // so the hub read below includes it.
        let last_sequence_num = self.ha.forwarder.current();
        let snapshot = build_snapshot(hub, last_sequence_num).await.map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(self.answer(snapshot))
    }

    async fn status(&self, _request: Request<StatusRequest>) -> Result<Response<ReplicationStatus>, Status> {
        let f = &self.ha.forwarder;
        Ok(self.answer(ReplicationStatus {
            current_sequence_num: f.current(),
            pending_events: i32::try_from(f.pending()).unwrap_or(i32::MAX),
            last_event_unix: f.last_event_unix.load(Ordering::Acquire),
            connected_replicas: i32::try_from(f.counts().0).unwrap_or(i32::MAX),
        }))
    }

    async fn confirm_missing_resources(
        &self,
        request: Request<ConfirmMissingResourcesRequest>,
    ) -> Result<Response<ConfirmMissingResourcesResponse>, Status> {
        self.require_active()?;
        let hub = self.hub()?;
        let mut results = Vec::new();
        for resource in request.into_inner().resources {
            results.push(confirm(hub, resource).await);
        }
        Ok(self.answer(ConfirmMissingResourcesResponse { results }))
    }
}

/// The hub's API for `kind` in `namespace`, if replicated.
pub(super) fn api_for(hub: &Hub, kind: &str, namespace: &str) -> Option<kube::Api<DynamicObject>> {
    match kind {
        "Application" => Some(hub.apps.api(Some(namespace))),
        "AppProject" => Some(hub.projects.api(Some(namespace))),
        _ => None,
    }
}

/// Looks a resource up on the hub now: `exists` (with its data), `deleted`, or `unknown`.
async fn confirm(hub: &Hub, resource: Resource) -> ConfirmMissingResourceResult {
    let unknown = |resource, reason: String| ConfirmMissingResourceResult {
        resource: Some(resource),
        status: "unknown".to_owned(),
        reason,
    };
    let Some(api) = api_for(hub, &resource.kind, &resource.namespace) else {
        return unknown(resource, "resource could not be serialized".to_owned());
    };
    match api.get_opt(&resource.name).await {
        Ok(Some(obj)) => match to_resource(&resource.kind, &obj) {
            Some(found) => ConfirmMissingResourceResult {
                resource: Some(found),
                status: "exists".to_owned(),
                reason: String::new(),
            },
            None => unknown(resource, "resource could not be serialized".to_owned()),
        },
        Ok(None) => ConfirmMissingResourceResult {
            resource: Some(resource),
            status: "deleted".to_owned(),
            reason: String::new(),
        },
        Err(e) => unknown(resource, e.to_string()),
    }
}

fn to_resource(kind: &str, obj: &DynamicObject) -> Option<Resource> {
    Some(Resource {
        name: obj.metadata.name.clone()?,
        namespace: obj.metadata.namespace.clone().unwrap_or_default(),
        kind: kind.to_owned(),
        uid: obj.metadata.uid.clone().unwrap_or_default(),
        spec_checksum: Vec::new(),
        data: serde_json::to_vec(obj).ok()?,
    })
}

/// Every Application of the hub (under the agent whose namespace it is in, else principal
/// scoped) and every AppProject of the principal namespace.
async fn build_snapshot(hub: &Hub, last_sequence_num: u64) -> Result<ReplicationSnapshot, kube::Error> {
    let apps = hub.apps.api(None).list(&ListParams::default()).await?;
    let projects = hub.projects.api(Some(&hub.config.namespace)).list(&ListParams::default()).await?;
    let mut agents: Vec<AgentState> = hub
        .peers
        .all()
        .iter()
        .map(|p| AgentState {
            name: p.name().to_owned(),
            mode: p.mode().to_string(),
            connected: p.is_connected(),
            resources: Vec::new(),
        })
        .collect();
    agents.sort_by(|a, b| a.name.cmp(&b.name));
    let mut principal_resources = Vec::new();
    for app in &apps.items {
        let Some(resource) = to_resource("Application", app) else { continue };
        match agents.iter_mut().find(|a| a.name == resource.namespace) {
            Some(agent) => agent.resources.push(resource),
            None => principal_resources.push(resource),
        }
    }
    principal_resources.extend(projects.items.iter().filter_map(|p| to_resource("AppProject", p)));
    Ok(ReplicationSnapshot { agents, last_sequence_num, principal_resources })
}

/// Serves `Replication` on the agents' port: its paths go to the HA principal's service (with
/// the replication authorization) before the agents' token check; other paths go on.
#[derive(Clone)]
pub struct ReplicationLayer {
    ha: super::Slot,
}

impl ReplicationLayer {
    pub(crate) fn new(ha: super::Slot) -> Self {
        Self { ha }
    }
}

impl std::fmt::Debug for ReplicationLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationLayer").finish_non_exhaustive()
    }
}

impl<S> tower::Layer<S> for ReplicationLayer {
    type Service = Divert<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Divert { inner, ha: self.ha.clone() }
    }
}

/// See [`ReplicationLayer`].
#[derive(Clone)]
pub struct Divert<S> {
    inner: S,
    ha: super::Slot,
}

impl<S> std::fmt::Debug for Divert<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Divert").finish_non_exhaustive()
    }
}

type Body = tonic::body::Body;
type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<Body>> for Divert<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if !req.uri().path().starts_with(PATH_PREFIX) {
            return Box::pin(self.inner.call(req));
        }
        let Some(ha) = super::of(&self.ha) else {
            return Box::pin(async { Ok(Status::unimplemented("replication not enabled").into_http()) });
        };
        let transport = auth::TransportIdentity::from_extensions(req.extensions());
        if let Err(status) = authorize(&ha.config, &transport) {
            ha.replication_refused(status.code());
            tracing::warn!(path = req.uri().path(), remote = ?transport.remote_addr(), code = ?status.code(),
                reason = status.message(), "replication call refused");
            return Box::pin(async { Ok(status.into_http()) });
        }
        let mut server = ReplicationServer::new(ReplicationService { ha })
            .max_decoding_message_size(protocol::pb::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(protocol::pb::MAX_MESSAGE_BYTES);
        Box::pin(async move {
            match tower::Service::call(&mut server, req).await {
                Ok(response) => Ok(response),
                Err(never) => match never {},
            }
        })
    }
}

/// The replication authorization (module docs): the caller's identity when it may replicate.
///
/// # Errors
/// `Unauthenticated` (upstream's messages) when the mTLS method does not accept the caller;
/// `PermissionDenied` naming the identity and `--ha-allowed-replication-clients` when the
/// identity is not allowed (always, while the list is empty).
pub fn authorize(config: &HaConfig, transport: &auth::TransportIdentity) -> Result<String, Status> {
    let identity = match &config.replication_auth {
        None => String::new(),
        Some(mtls) => {
            if !transport.is_tls() {
                return Err(Status::unauthenticated(
                    "replication auth failed: replication requires mTLS; the connection is not TLS",
                ));
            }
            let leaf = transport
                .leaf_certificate()
                .ok_or_else(|| Status::unauthenticated("replication auth failed: no verified client certificate"))?;
            mtls.agent_name(leaf.as_ref())
                .map_err(|e| Status::unauthenticated(format!("replication auth failed: {e}")))?
                .as_str()
                .to_owned()
        }
    };
    let allowed = &config.allowed_replication_clients;
    if allowed.iter().any(|a| a == ANY_REPLICATION_CLIENT || *a == identity) {
        return Ok(identity);
    }
    Err(Status::permission_denied(if allowed.is_empty() {
        format!(
            "identity {identity:?} not in allowed replication clients: --ha-allowed-replication-clients is empty, \
             so no client may replicate; set it to the peer principal's identity"
        )
    } else {
        format!(
            "identity {identity:?} not in allowed replication clients (--ha-allowed-replication-clients {}); \
             add it there only if it is the peer principal's",
            allowed.join(",")
        )
    }))
}

#[cfg(test)]
mod tests {
    use protocol::{EventType, Target};

    use super::*;

    fn ev(target: Target, ty: EventType) -> Event {
        Event::new(ty, target, "r".to_owned(), "e".to_owned())
    }

    const AGENT: &str = include_str!("testdata/agent.pem"); // CN=agent-a
    const ADMIN: &str = include_str!("testdata/admin.pem"); // CN=ha-admin,O=HA-Admins

    fn mtls(allowed: &[&str]) -> HaConfig {
        let spec = auth::AuthMethodSpec::parse("mtls:subject:CN=([^,]+)").expect("spec");
        let auth::AuthMethodSpec::Mtls { source, regex, .. } = spec else { panic!("mtls") };
        HaConfig {
            replication_auth: Some(auth::MtlsAuthenticator::new(source, regex)),
            allowed_replication_clients: allowed.iter().map(|a| (*a).to_owned()).collect(),
            ..HaConfig::default()
        }
    }

    fn tls(pem: &str) -> auth::TransportIdentity {
        use rustls::pki_types::pem::PemObject as _;
        let cert = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("test certificate");
        auth::TransportIdentity::tls(None, Some(Arc::new(vec![cert])))
    }

    #[test]
    fn replication_is_denied_by_default_and_allowed_by_exact_identity_or_star() {
        // The default: an agent's certificate (accepted by --auth) may not replicate.
        let denied = authorize(&mtls(&[]), &tls(AGENT)).unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            denied.message(),
            "identity \"agent-a\" not in allowed replication clients: --ha-allowed-replication-clients is empty, so \
             no client may replicate; set it to the peer principal's identity"
        );
        // Listed: that identity only, exactly.
        let listed = mtls(&["ha-admin"]);
        assert_eq!(authorize(&listed, &tls(ADMIN)).expect("listed"), "ha-admin");
        let other = authorize(&listed, &tls(AGENT)).unwrap_err();
        assert_eq!(other.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            other.message(),
            "identity \"agent-a\" not in allowed replication clients (--ha-allowed-replication-clients ha-admin); \
             add it there only if it is the peer principal's"
        );
        assert!(authorize(&mtls(&["agent"]), &tls(AGENT)).is_err(), "no prefix match");
        // The explicit opt-out: any identity the mTLS method accepts (upstream's empty list).
        assert_eq!(authorize(&mtls(&[ANY_REPLICATION_CLIENT]), &tls(AGENT)).expect("any"), "agent-a");
        // Library use without an mTLS method (a trusted plaintext listener): only with '*'.
        let plain = auth::TransportIdentity::plaintext(None);
        assert_eq!(authorize(&HaConfig::default(), &plain).unwrap_err().code(), tonic::Code::PermissionDenied);
        let any = HaConfig { allowed_replication_clients: vec!["*".into()], ..HaConfig::default() };
        assert_eq!(authorize(&any, &plain).expect("any"), "");
    }

    #[test]
    fn replication_over_mtls_needs_a_certificate() {
        // Even with '*': the caller must present a certificate the mTLS method accepts.
        let config = mtls(&[ANY_REPLICATION_CLIENT]);
        let plain = authorize(&config, &auth::TransportIdentity::plaintext(None)).unwrap_err();
        assert_eq!(plain.code(), tonic::Code::Unauthenticated);
        let no_cert = authorize(&config, &auth::TransportIdentity::tls(None, None)).unwrap_err();
        assert_eq!(no_cert.code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn claims_round_trip_and_upstream_peers_claim_nothing() {
        let mut md = MetadataMap::new();
        assert_eq!(peer_claims(&md), None);
        md.insert(STATE_HEADER, "active".parse().expect("value"));
        md.insert(EPOCH_HEADER, "7".parse().expect("value"));
        md.insert(UID_HEADER, "u".parse().expect("value"));
        assert_eq!(peer_claims(&md), Some(("active".into(), 7, "u".into())));
        md.insert(EPOCH_HEADER, "x".parse().expect("value"));
        assert_eq!(peer_claims(&md), None, "a malformed epoch is no claim");
    }

    #[tokio::test]
    async fn a_forward_waits_for_the_in_sync_replica_and_cuts_a_slow_one() {
        let config = HaConfig {
            replicate_timeout: std::time::Duration::from_millis(200),
            queue_capacity: 2,
            ..HaConfig::default()
        };
        let forwarder = Forwarder::default();
        let (tx, mut rx) = mpsc::channel(2);
        let link = Arc::new(ReplicaLink {
            id: "r".into(),
            cut_offs: forwarder.cut_offs.clone(),
            queue: tx,
            acked: watch::Sender::new(0),
            in_sync: AtomicBool::new(true),
            cut: CancellationToken::new(),
            why: Mutex::new(None),
        });
        forwarder.replicas.lock().expect("lock").push(link.clone());
        let event = ev(Target::Application, EventType::Create);
        // A replica that applies and ACKs: the forward returns once it did.
        let acker = tokio::spawn({
            let link = link.clone();
            async move {
                let msg = rx.recv().await.expect("event");
                assert_eq!(msg.sequence_num, 1);
                let ce = msg.event.expect("cloudevent");
                assert!(ce.attributes.contains_key(MODE_EXTENSION));
                link.acked.send_replace(msg.sequence_num);
                rx
            }
        });
        assert_eq!(forwarder.forward(&config, "agent-a", AgentMode::Autonomous, &event).await, 1);
        let _rx = acker.await.expect("acker");
        // A replica that never ACKs is cut off at the deadline; the forward returns anyway.
        assert_eq!(forwarder.forward(&config, "agent-a", AgentMode::Autonomous, &event).await, 0);
        assert!(link.cut.is_cancelled());
        let why = link.why.lock().expect("lock").clone().expect("status");
        assert_eq!(why.code(), tonic::Code::DeadlineExceeded);
        assert!(why.message().starts_with(CUT_OFF), "{why:?}");
        assert_eq!(forwarder.current(), 2, "sequence numbers keep counting");
        assert_eq!(forwarder.cut_offs(), 1);
        // Without replicas in sync, a forward does not wait.
        assert_eq!(forwarder.forward(&config, "agent-a", AgentMode::Autonomous, &event).await, 0);
    }
}
