//! `eventstreamapi.EventStream`: the agent's bidirectional stream of CloudEvents.
//!
//! Per stream: the caller arrives with a [`Permit`] from the authorization layer
//! ([`crate::access::authz`]: who it is, its mode, the access token's id and expiry); the agent's peer is
//! attached (closing any older stream of the same agent); the stream's body draws the peer's
//! mailbox as the connection pulls ([`link::send::events`]); the receive loop applies the
//! agent's events, at once across Applications and in order within one ([`super::lanes`]),
//! and ACKs each ([`link::recv`]).
//!
//! Policies (docs/reliability.md, "Delivery guarantees"):
//! * **Bad events.** A malformed, unknown or failing event is answered (ACKed) and logged; it
//!   never ends the stream and is never retried forever. Two cannot be answered and are only
//!   logged: a message without a usable `resourceid` (no sender can be tracking it) and an
//!   undecodable ACK (an ACK is never ACKed, so two peers cannot ping-pong).
//! * **Oversized messages.** A message from the agent above
//!   [`PrincipalConfig::max_message_bytes`](crate::PrincipalConfig::max_message_bytes) cannot
//!   be skipped (tonic fails the stream at decode time): the stream ends with `OutOfRange`
//!   and the agent sees that status. An event for the agent that would encode above the limit
//!   is never sent: it is given up on at once and logged, and the next resync repairs.
//! * **One stream per agent, the newest wins**: the older stream ends with `Aborted`.
//! * **Expiry and revocation.** A stream ends with `Unauthenticated` when the access token
//!   that opened it expires, or when [`crate::Principal::revoke`] revokes the session; the
//!   agent refreshes or re-authenticates and reconnects. Expired or revoked tokens are refused
//!   when a stream opens.

use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use futures::{Stream, StreamExt};
use link::recv::{Inbound, Next};
use link::send::{Outlet, SendHooks, SendOptions};
use protocol::outbox::Parked;
use protocol::pb::eventstreamapi::event_stream_server::EventStream;
use protocol::pb::eventstreamapi::{Event as WireEvent, PingRequest, PongReply, PushSummary};
use protocol::{Event, EventType, Payload, Target};
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::access::authz::{Authorizer, Permit, expired, revoked};
use crate::config::AgentMode;
use crate::peer::{AgentPeer, StreamHandle};
use crate::sync::hub::Hub;
use crate::sync::inbound;
use crate::sync::resync;
use crate::{clusterinfo, ha, proxy, redis};

/// What the principal sends on a `Subscribe` stream: the outbox's events, then the status the
/// stream was closed with.
pub type Outgoing = Pin<Box<dyn Stream<Item = Result<WireEvent, Status>> + Send + 'static>>;

/// The wings an agent's stream serves besides the hub: the proxies' requests it answers, and
/// cross-hub HA, which admits agents and replicates what they change. The composition root
/// ([`crate::Principal`]) hands them in; each wing owns its state.
#[derive(Clone, Debug)]
pub(crate) struct Wings {
    /// What the resource proxy's requests, logs and terminals wait for.
    pub(crate) proxy: Arc<proxy::Tables>,
    /// What the Redis proxy's requests and subscriptions wait for.
    pub(crate) redis: Arc<redis::Exchange>,
    /// Each agent's cluster info for the hub's Argo CD (connection state, cache counts).
    pub(crate) clusters: Arc<clusterinfo::ClusterInfos>,
    /// The cross-hub HA controller, once attached.
    pub(crate) ha: ha::Slot,
}

impl Wings {
    /// Hands `ev` to the proxy waiting for it if it is an answer (resource proxy, Redis proxy),
    /// at once: answers never wait behind the agent's events being applied, and never go
    /// through the hub-write router. `None`: not an answer.
    fn answer(&self, agent: &str, ev: &Event) -> Option<Result<(), crate::error::InboundError>> {
        let answer = (ev.target == Target::Resource && ev.event_type == EventType::Response)
            || (ev.target == Target::Redis && ev.event_type == EventType::RedisResponse);
        if !answer {
            return None;
        }
        Some(match ev.payload() {
            Ok(Payload::ResourceResponse(answer)) => {
                self.proxy.complete(agent, ev, answer);
                Ok(())
            }
            Ok(Payload::RedisResponse(answer)) => {
                self.redis.complete(agent, ev, answer);
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e.into()),
        })
    }

    /// Takes `ev` if it is the agent's cluster cache report (`cluster-cache-info-update`),
    /// for its cluster info; at once, as upstream never replicates it. `None`: not one.
    fn cluster_cache_info(&self, agent: &str, ev: &Event) -> Option<Result<(), crate::error::InboundError>> {
        if ev.target != Target::ClusterCacheInfoUpdate || ev.event_type != EventType::ClusterCacheInfoUpdate {
            return None;
        }
        Some(match ev.payload() {
            Ok(Payload::ClusterCacheInfo(info)) => {
                tracing::debug!(%agent, ?info, "cluster cache info");
                self.clusters.reported(agent, info);
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e.into()),
        })
    }

    /// `agent`'s stream ended and no other replaced it: the proxies fail what waits for it,
    /// and its cluster info says it is disconnected.
    fn agent_detached(&self, agent: &AgentPeer) {
        if !agent.is_connected() {
            self.redis.agent_gone(agent.name());
            self.proxy.agent_gone(agent.name());
            self.clusters.disconnected(agent.name(), chrono::Utc::now());
        }
    }
}

/// The `EventStream` service. It serves calls that carry a [`Permit`] (from
/// [`crate::access::authz::AuthorizeLayer`]) and refuses any other.
#[derive(Clone)]
pub struct EventStreamService {
    hub: Arc<Hub>,
    wings: Wings,
    authorizer: Arc<Authorizer>,
}

impl std::fmt::Debug for EventStreamService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStreamService").finish_non_exhaustive()
    }
}

impl EventStreamService {
    pub(crate) fn new(hub: Arc<Hub>, wings: Wings, authorizer: Arc<Authorizer>) -> Self {
        Self { hub, wings, authorizer }
    }

    /// The caller's permit, once cross-hub HA admits agents here.
    fn permit<T>(&self, request: &Request<T>) -> Result<Permit, Status> {
        // Cross-hub HA: only the active principal serves agents.
        ha::admit(&self.wings.ha)?;
        request
            .extensions()
            .get::<Permit>()
            .cloned()
            .ok_or_else(|| Status::unauthenticated("this call did not pass the principal's authorization layer"))
    }

    /// The caller's peer and permit.
    fn peer_for<T>(&self, request: &Request<T>) -> Result<(Arc<AgentPeer>, Permit), Status> {
        let permit = self.permit(request)?;
        let peer = self.hub.peers.get_or_create(&permit.agent, permit.mode);
        Ok((peer, permit))
    }
}

/// Handles one message from the agent by the ACK policy of [`link::recv`]; returns whether it
/// was processed.
async fn on_message(hub: &Hub, wings: &Wings, session: &AgentPeer, msg: WireEvent) -> bool {
    match received(wings, session, msg) {
        Received::Event(ev) => {
            apply(hub, wings, session, lane_key(&ev), ev).await;
            true
        }
        Received::Done(processed) => processed,
    }
}

/// A message from the agent after the cheap part of handling it.
enum Received {
    /// Settled already (an ACK, an answer to a proxy's request), or not (undecodable).
    Done(bool),
    /// An event to apply to the hub.
    Event(Box<Event>),
}

/// Decodes a message, settles ACKs and answers the proxies' requests; what is left is an event
/// to [`apply`].
fn received(wings: &Wings, session: &AgentPeer, msg: WireEvent) -> Received {
    crate::metrics::global().event_received();
    let ev = match link::recv::receive(session.mailbox(), session.name(), msg) {
        Inbound::Event(ev) => ev,
        Inbound::Ack { .. } => return Received::Done(true),
        Inbound::Undecodable => return Received::Done(false),
    };
    if let Some(result) = wings.answer(session.name(), &ev).or_else(|| wings.cluster_cache_info(session.name(), &ev)) {
        link::recv::settle(session.mailbox(), &ev, &result);
        return Received::Done(true);
    }
    Received::Event(ev)
}

/// The lane an event from the agent is applied in ([`lanes`](super::lanes)): an Application's
/// namespace and name for its create, update, status and delete; `None` (one at a time, in
/// order with everything else) for the rest: AppProjects, which Applications refer to, and
/// resync requests, which read what the events before them wrote.
fn lane_key(ev: &Event) -> Option<Box<str>> {
    if ev.target != Target::Application
        || !matches!(
            ev.event_type,
            EventType::Create | EventType::SpecUpdate | EventType::StatusUpdate | EventType::Delete
        )
    {
        return None;
    }
    let meta = ev.data.as_ref()?.value().get("metadata")?;
    let name = meta.get("name")?.as_str()?;
    let namespace = meta.get("namespace").and_then(serde_json::Value::as_str).unwrap_or_default();
    Some(format!("{namespace}/{name}").into_boxed_str())
}

/// Applies one event of the agent to the hub and answers it by the ACK policy of
/// [`link::recv`]; `key` is its [`lane_key`].
async fn apply(hub: &Hub, wings: &Wings, session: &AgentPeer, key: Option<Box<str>>, ev: Box<Event>) {
    let span = crate::otel::received_span(session, &ev);
    async {
        let _applying = session.applying(key.as_deref()).await;
        // `--event-processors`: a bounded number of events applied at once across agents (the
        // semaphore is never closed, so acquiring only waits).
        let _processing = match &hub.processors {
            Some(slots) => slots.acquire().await.ok(),
            None => None,
        };
        let started = std::time::Instant::now();
        // Among replicas, only the agent's owner writes the hub for it, and only while its
        // ownership lasts: a write still running when it runs out is abandoned ([`crate::lease`]).
        let result = match hub.write_deadline(session.name()) {
            Ok(None) => inbound::process(hub, session, &ev).await,
            Ok(Some(until)) => tokio::time::timeout_at(until, inbound::process(hub, session, &ev))
                .await
                .unwrap_or_else(|_| Err(hub.not_owner(session.name()))),
            Err(e) => Err(e),
        };
        if matches!(result, Err(crate::error::InboundError::NotOwner { .. })) {
            crate::metrics::global().write_fenced();
        }
        crate::metrics::global().event_processed(session.name(), &ev.target, &result, started.elapsed());
        // Cross-hub HA: on the replicas' hubs before the agent's ACK.
        if ha::replicated(&wings.ha, session, &ev, &result).await {
            link::recv::settle(session.mailbox(), &ev, &result);
        }
    }
    .instrument(span)
    .await;
}

/// An agent's mailbox, drawn by its stream, and what is reported about what it sends.
struct PeerOutlet(Arc<AgentPeer>);

impl SendHooks for PeerOutlet {
    fn peer(&self) -> &str {
        self.0.name()
    }
    fn sent(&self, _event: &Event) {
        crate::metrics::global().event_sent();
    }
    fn send_failed(&self) {
        crate::metrics::global().send_failed(self.0.name(), "transport-closing");
    }
    fn discarded(&self, parked: &Parked<Event>) {
        crate::metrics::global().event_discarded(self.0.name(), &parked.item);
    }
}

impl Outlet for PeerOutlet {
    fn mailbox(&self) -> &link::Mailbox {
        self.0.mailbox()
    }
}

/// Closes the stream with `Unauthenticated` when its session expires: the access token that
/// opened it, or the latest one a refresh of the same session issued.
/// Closes the stream when its session's deadline passes without a refresh, then waits forever:
/// it rides beside the stream's receive loop ([`run_stream`]), which sees the stream stopped and
/// ends. A task of its own per stream was ~0.4 KiB of every idle agent; the timer is boxed, so
/// it sizes nothing but the streams that have a deadline.
async fn expire(handle: &StreamHandle, session: &AgentPeer) -> std::convert::Infallible {
    if let Some(mut at) = handle.deadline() {
        loop {
            let remaining = at.duration_since(SystemTime::now()).unwrap_or_default();
            Box::pin(tokio::time::sleep(remaining)).await;
            // A refresh may have moved the deadline later meanwhile (never earlier).
            match handle.deadline() {
                Some(later) if later > at => at = later,
                _ => break,
            }
        }
        if !handle.stop().is_cancelled() {
            let agent = session.name();
            tracing::info!(%agent, "the agent's session expired without a refresh; stream closed");
            handle.close(Some(expired(agent, at)));
        }
    }
    std::future::pending().await
}

/// What the principal sends on the stream: the session's outbox, drawn as the connection takes
/// events (no task or channel per stream between them: for an idle agent those were ~2.5 KiB,
/// docs/performance.md), until the stream is closed or replaced; then the status it was closed
/// with. Events the stream took and had not handed over when it ended are in flight in the
/// outbox, and go again on the next stream. Events that would encode above `max_bytes` are
/// given up on.
fn outgoing(session: Arc<AgentPeer>, handle: StreamHandle, max_bytes: usize) -> Outgoing {
    let options = SendOptions { heartbeat: None, max_bytes };
    let events = link::send::events(PeerOutlet(session), handle.attachment(), handle.stop().clone(), options);
    let end = futures::stream::once(async move { handle.end_status().map(Err) }).filter_map(std::future::ready);
    Box::pin(events.map(Ok).chain(end))
}

/// The status relayed to the agent when reading its stream failed.
fn inbound_failure(agent: &str, status: Status, limit: usize) -> Status {
    if status.code() == Code::OutOfRange {
        tracing::warn!(%agent, %status, limit,
            "the agent sent a message above the maximum message size; its stream is closed");
        Status::out_of_range(format!(
            "the principal closed the stream: {} (an event this large can never be delivered; the agent must give it up)",
            status.message()
        ))
    } else {
        tracing::info!(%agent, %status, "agent stream failed");
        status
    }
}

/// First and longest pause between attempts to start a resync.
const RESYNC_RETRY_INITIAL: std::time::Duration = std::time::Duration::from_millis(500);
const RESYNC_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);

#[allow(clippy::manual_async_fn, reason = "an async fn keeps its arguments twice (rust-lang/rust#62958)")]
fn run_stream(
    hub: Arc<Hub>,
    wings: Wings,
    session: Arc<AgentPeer>,
    handle: StreamHandle,
    mut inbound: Streaming<WireEvent>,
) -> impl Future<Output = ()> + Send + 'static {
    // An `async` block, not an `async fn`: an `async fn` keeps a second copy of its arguments
    // in its future (rust-lang/rust#62958), ~300 bytes of every idle agent's stream task.
    async move {
        let body = async {
            // Among replicas: the newest stream takes the agent's Lease (the old owner lets go);
            // until it has, nothing from the agent is applied. A take that fails ends the
            // stream. Boxed: only replicas take Leases, and inline the take would size every
            // stream's task.
            if let Some(leases) = &hub.leases {
                Box::pin(take_lease(leases, &session, &handle)).await;
            }
            if !handle.stop().is_cancelled() {
                serve_stream(&hub, &wings, &session, &handle, &mut inbound).await;
            }
        };
        // The body first: once the expiry has closed the stream, the body sees it stopped,
        // finishes what it applies, and ends; the expiry never does.
        tokio::select! {
            biased;
            () = body => {}
            never = expire(&handle, &session) => match never {},
        }
        if let Some(status) = handle.end_status() {
            tracing::info!(agent = %session.name(), code = ?status.code(), reason = status.message(), "agent stream closed");
        }
        handle.close(None);
        session.detach(&handle);
        wings.agent_detached(&session);
        crate::metrics::global().agent_disconnected(session.name(), handle.end_status().as_ref());
        if hub.leases.is_some() {
            hub.peers.forget_idle(session.name(), |agent| hub.acts_for(agent));
        }
    }
}

/// Takes the agent's Lease for this stream, or closes the stream saying why it could not.
async fn take_lease(leases: &crate::lease::Ownership, session: &AgentPeer, handle: &StreamHandle) {
    let taken = tokio::select! {
        taken = leases.acquire(session.name()) => taken.map(drop),
        () = handle.closed() => Ok(()),
    };
    if let Err(e) = taken {
        tracing::warn!(agent = %session.name(), error = %e, "stream closed: cannot take the agent's Lease");
        handle.close(Some(Status::from(e)));
    }
}

/// Resyncs and applies the agent's events until the stream ends or is closed.
async fn serve_stream(
    hub: &Arc<Hub>,
    wings: &Wings,
    session: &Arc<AgentPeer>,
    handle: &StreamHandle,
    inbound: &mut Streaming<WireEvent>,
) {
    tracing::info!(agent = %session.name(), mode = %session.mode(), "agent connected");
    crate::metrics::global().agent_connected(session.name());
    wings.clusters.connected(session.name(), chrono::Utc::now());
    if hub.config.namespace_create_enable
        && session.mode() == AgentMode::Autonomous
        && hub.config.namespace_create_pattern.as_ref().is_none_or(|p| p.is_match(session.name()))
    {
        match Box::pin(crate::state::ensure_namespace(
            &hub.apps.client(),
            session.name(),
            &hub.config.namespace_create_labels,
        ))
        .await
        {
            Ok(true) => tracing::info!(agent = %session.name(), "created the agent's hub namespace"),
            Ok(false) => {}
            Err(e) => tracing::warn!(agent = %session.name(), error = %e, "cannot create the agent's hub namespace"),
        }
    }
    // The resync start reads the hub; under a reconnect storm or a hub restart those reads can
    // fail for a moment. Retried with backoff while the stream lives, beside the receive loop,
    // so a transient failure does not leave the agent unsynced until its next reconnect.
    tokio::spawn({
        let (hub, session, handle) = (hub.clone(), session.clone(), handle.clone());
        async move {
            let mut delay = RESYNC_RETRY_INITIAL;
            loop {
                match Box::pin(resync::on_connect(&hub, &session)).await {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(agent = %session.name(), error = %e, retry_in = ?delay,
                        "cannot start resync; retrying"),
                }
                tokio::select! {
                    () = handle.closed() => return,
                    () = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(RESYNC_RETRY_MAX);
            }
        }
    });
    // Boxed: inline, the largest event's future (hub writes) would size this task, which lives
    // as long as the stream, for every idle agent.
    let mut lanes = super::lanes::Lanes::new(hub.config.agent_event_concurrency, |key, ev| {
        Box::pin(apply(hub, wings, session, key, ev)) as futures::future::BoxFuture<'_, ()>
    });
    loop {
        tokio::select! {
            biased;
            Some(()) = lanes.finished() => {}
            // Once replaced, expired or revoked, nothing more from this stream is applied.
            next = link::recv::next(inbound, handle.stop(), None), if lanes.has_room() => match next {
                Next::Message(msg) => {
                    if let Received::Event(ev) = received(wings, session, msg) {
                        lanes.submit(lane_key(&ev), ev);
                    }
                }
                Next::Ended | Next::Stopped | Next::Silent(_) => break,
                Next::Failed(status) => {
                    handle.close(Some(inbound_failure(session.name(), status, hub.config.max_message_bytes)));
                    break;
                }
            },
        }
    }
    // What started is finished and answered; what was held back is not, and the agent sends
    // it again on its next stream.
    lanes.drain().await;
}

#[tonic::async_trait]
impl EventStream for EventStreamService {
    type SubscribeStream = Outgoing;

    async fn subscribe(
        &self,
        request: Request<Streaming<WireEvent>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let Permit { agent, mode, grant, .. } = self.permit(&request)?;
        // Among replicas, one that cannot take agents says so at once.
        if let Some(leases) = &self.hub.leases
            && let Some(why) = leases.not_serving()
        {
            return Err(Status::from(crate::lease::LeaseError::NotServing {
                replica: leases.replica().to_owned(),
                why,
            }));
        }
        // Attach now, so an older stream of this agent is closed before this one runs. Among
        // replicas, the stream takes the agent's Lease before it applies anything
        // ([`run_stream`]); events to the agent flow meanwhile.
        let (session, handle) = self.hub.peers.attach(&agent, mode, grant);
        let outgoing = outgoing(session.clone(), handle.clone(), self.hub.config.max_message_bytes);
        tokio::spawn(run_stream(self.hub.clone(), self.wings.clone(), session, handle, request.into_inner()));
        Ok(Response::new(outgoing))
    }

    async fn push(&self, request: Request<Streaming<WireEvent>>) -> Result<Response<PushSummary>, Status> {
        let (session, Permit { grant, .. }) = self.peer_for(&request)?;
        let mut inbound = request.into_inner();
        let expiry = async {
            match grant.expires_at {
                Some(at) => {
                    tokio::time::sleep(at.duration_since(SystemTime::now()).unwrap_or_default()).await;
                    at
                }
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expiry);
        let (mut received, mut processed) = (0i32, 0i32);
        loop {
            let msg = tokio::select! {
                at = &mut expiry => return Err(expired(session.name(), at)),
                msg = inbound.message() => msg?,
            };
            let Some(msg) = msg else { break };
            if self.authorizer.is_revoked(&grant) {
                return Err(revoked(session.name()));
            }
            received = received.saturating_add(1);
            if on_message(&self.hub, &self.wings, &session, msg).await {
                processed = processed.saturating_add(1);
            }
        }
        Ok(Response::new(PushSummary { result: "ok".into(), received, processed }))
    }

    /// Unimplemented, as upstream (§2.1); liveness rides on the stream's heartbeats.
    async fn ping(&self, _request: Request<PingRequest>) -> Result<Response<PongReply>, Status> {
        Err(Status::unimplemented("Ping is not implemented; send heartbeat events on the Subscribe stream"))
    }
}

#[cfg(test)]
mod idle_footprint {
    //! What every idle agent's stream holds, as sizes the compiler decides: a guard against
    //! regrowth (each of these once grew by hundreds of bytes per agent; docs/performance.md).

    use super::*;

    fn returned5<A, B, C, D, E, R>(_: fn(A, B, C, D, E) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    #[test]
    fn an_idle_streams_tasks_and_session_stay_small() {
        let sizes = [
            ("the stream's receive task, its expiry included", returned5(run_stream), 1024),
            ("an agent's session", std::mem::size_of::<AgentPeer>(), 768),
        ];
        for (what, size, bound) in sizes {
            eprintln!("{what}: {size} bytes");
            assert!(size <= bound, "{what} is {size} bytes, above {bound}: look for a large inline future or field");
        }
    }
}
