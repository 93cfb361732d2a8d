//! Agent peers: each agent's mailbox (surviving reconnects), its one live stream, and the
//! registry of peers. (The auth crate's `AgentSession` is something else: an authenticated call.)
//!
//! Policies (docs/reliability.md):
//! * **one live stream per agent, the newest wins**: attaching a stream closes the agent's
//!   previous one (status `Aborted`), and only the current stream may take events from the
//!   outbox, so two streams never share an agent's events;
//! * **a stream lives no longer than its session**: it ends when the access token that opened
//!   it expires, unless the agent refreshed its session (same binding) before, which moves the
//!   end to the new token's expiry; see [`crate::service::eventstream`];
//! * **revocation** ([`Peers::revoke`]) closes the live stream now (status
//!   `Unauthenticated`) and refuses the access token it was opened with until that expires.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use link::{Attachment, Mailbox, lock};
use protocol::Event;
use protocol::outbox::RetryPolicy;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::config::AgentMode;
use crate::ident::StreamGrant;

/// The trailer that tells an agent to reconnect at once instead of after its backoff: the
/// principal replica closing the stream is going away or gave the agent up, and another
/// replica can take it now (`argocd-agent agent` honours it; other agents back off as usual).
pub const RECONNECT_TRAILER: &str = "x-argocd-agent-reconnect";

/// `status` with [`RECONNECT_TRAILER`]: `immediately`.
#[must_use]
pub fn reconnect_elsewhere(mut status: Status) -> Status {
    status.metadata_mut().insert(RECONNECT_TRAILER, tonic::metadata::MetadataValue::from_static("immediately"));
    status
}

/// One attached stream: how to end it, and the status the agent sees when it ends.
#[derive(Debug, Clone)]
pub(crate) struct StreamHandle {
    attachment: Attachment,
    cancel: CancellationToken,
    state: Arc<Mutex<Ends>>,
}

/// How a stream ends: by its session's deadline, or closed with a status. One small allocation
/// per stream (a `watch` channel for the deadline and a `Status` inline were ~700 bytes).
#[derive(Debug)]
struct Ends {
    /// `None` while open; `Some(reason)` once closed (`Some(None)`: a clean end).
    end: Option<Option<Box<Status>>>,
    /// When the stream's session expires (`None`: never); only ever moved later, by a refresh,
    /// so whoever waits for it needs no wake-up: at the old deadline it looks again.
    deadline: Option<SystemTime>,
}

impl StreamHandle {
    fn new(attachment: Attachment, deadline: Option<SystemTime>) -> Self {
        Self { attachment, cancel: CancellationToken::new(), state: Arc::new(Mutex::new(Ends { end: None, deadline })) }
    }

    /// When the stream's session expires (`None`: never). It only ever moves later.
    pub(crate) fn deadline(&self) -> Option<SystemTime> {
        lock(&self.state).deadline
    }

    /// Moves the deadline to `to` when that is later; returns whether it moved.
    fn extend(&self, to: SystemTime) -> bool {
        match &mut lock(&self.state).deadline {
            Some(current) if to > *current => {
                *current = to;
                true
            }
            _ => false,
        }
    }

    /// The stream's claim on its session's mailbox.
    pub(crate) fn attachment(&self) -> Attachment {
        self.attachment
    }

    /// The token that fires when the stream is closed.
    pub(crate) fn stop(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Ends the stream with `status` as its final status (`None`: a clean end). The first
    /// reason given wins.
    pub(crate) fn close(&self, status: Option<Status>) {
        {
            let mut state = lock(&self.state);
            if state.end.is_none() {
                state.end = Some(status.map(Box::new));
            }
        }
        self.cancel.cancel();
    }

    /// Whether the stream was closed.
    #[cfg(test)]
    pub(crate) fn is_closed(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves once the stream is closed.
    pub(crate) async fn closed(&self) {
        self.cancel.cancelled().await;
    }

    /// The status the stream ends with (`None`: a clean end, or still open).
    pub(crate) fn end_status(&self) -> Option<Status> {
        lock(&self.state).end.clone().flatten().map(|status| *status)
    }
}

/// The stream currently attached to a session.
#[derive(Debug)]
struct Attached {
    handle: StreamHandle,
    grant: StreamGrant,
}

/// One agent as the principal sees it: its mode, its outbox (surviving reconnects, so nothing
/// queued while the agent is away is lost) and its current stream, if any.
#[derive(Debug)]
pub struct AgentPeer {
    name: String,
    mode: Mutex<AgentMode>,
    mailbox: Mailbox,
    /// Lock order: `current` before the mailbox.
    current: Mutex<Option<Attached>>,
    /// What of the agent's events is being applied (see [`AgentPeer::applying`]).
    applying: Applying,
    /// When the agent's last periodic resync was answered (`--resync-min-interval`).
    last_periodic: Mutex<Option<std::time::Instant>>,
}

/// Which of an agent's events are being applied: each holds the gate shared and its resource
/// exclusively; a resync start holds the gate alone.
#[derive(Debug, Default)]
struct Applying {
    gate: tokio::sync::RwLock<()>,
    /// One lock per resource with an event applying or waiting, and how many of them there
    /// are; removed by the last, so an idle agent keeps none.
    /// A list, not a map: a few entries at most (an agent's events in flight), and an empty
    /// `Vec` is 24 bytes of every agent's session where a `HashMap` is 48.
    resources: Mutex<Vec<ResourceLock>>,
}

/// One resource's lock and how many events hold it or wait for it.
#[derive(Debug)]
struct ResourceLock {
    key: Box<str>,
    lock: Arc<tokio::sync::Mutex<()>>,
    holders: usize,
}

/// Held while one of the agent's events is applied ([`AgentPeer::applying`]).
#[must_use]
pub(crate) struct ApplyGuard<'a> {
    _resource: Option<ResourceHold<'a>>,
    _gate: tokio::sync::RwLockReadGuard<'a, ()>,
}

/// One resource's lock, held or waited for; the last to let go removes it from the map.
struct ResourceHold<'a> {
    owner: &'a Applying,
    key: Box<str>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for ResourceHold<'_> {
    fn drop(&mut self) {
        self.guard = None;
        let mut resources = lock(&self.owner.resources);
        let Some(at) = resources.iter().position(|r| r.key == self.key) else { return };
        resources[at].holders -= 1;
        if resources[at].holders == 0 {
            resources.swap_remove(at);
            if resources.is_empty() {
                // Give the list's memory back: most agents are idle most of the time.
                *resources = Vec::new();
            }
        }
    }
}

impl AgentPeer {
    fn new(name: &str, mode: AgentMode, retry: RetryPolicy) -> Self {
        Self {
            name: name.to_owned(),
            mode: Mutex::new(mode),
            mailbox: Mailbox::new(retry),
            current: Mutex::new(None),
            applying: Applying::default(),
            last_periodic: Mutex::new(None),
        }
    }

    /// Whether a periodic resync of this agent may run now, at least `min` after the last one
    /// that did; if so, now counts as the last.
    pub(crate) fn periodic_due(&self, min: std::time::Duration) -> bool {
        let now = std::time::Instant::now();
        let mut last = lock(&self.last_periodic);
        if last.is_some_and(|t| now.duration_since(t) < min) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// The agent's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The mode the agent announced on its latest connection.
    #[must_use]
    pub fn mode(&self) -> AgentMode {
        *lock(&self.mode)
    }

    /// Whether a stream is attached.
    #[must_use]
    pub fn is_connected(&self) -> bool {
        lock(&self.current).is_some()
    }

    /// Queues an event for the agent and wakes the sender.
    pub fn push(&self, event: Event) {
        tracing::debug!(agent = %self.name, event_type = %event.event_type, target = %event.target,
            resource_id = %event.resource_id, event_id = %event.event_id, "queued for agent");
        self.mailbox.push(event);
    }

    /// Waits until the agent's events may apply to `resource` (an event's lane key; `None`: no
    /// single resource, see [`crate::service::eventstream`]) and holds that until the guard
    /// drops. Events of one resource are applied one at a time, whichever stream (or `Push`
    /// call) carried them: a replaced stream's last event, still being applied while its
    /// successor opens, is not interleaved with the successor's event for the same resource.
    /// Events of different resources run at once; none runs while a resync starts
    /// ([`AgentPeer::applying_alone`]).
    pub(crate) async fn applying(&self, resource: Option<&str>) -> ApplyGuard<'_> {
        let gate = self.applying.gate.read().await;
        let resource = match resource {
            None => None,
            Some(key) => {
                let resource = {
                    let mut resources = lock(&self.applying.resources);
                    let at = match resources.iter().position(|r| *r.key == *key) {
                        Some(at) => at,
                        None => {
                            resources.push(ResourceLock { key: key.into(), lock: Arc::default(), holders: 0 });
                            resources.len() - 1
                        }
                    };
                    resources[at].holders += 1;
                    resources[at].lock.clone()
                };
                // Counted before the wait, so that a wait given up on is uncounted too.
                let mut hold = ResourceHold { owner: &self.applying, key: key.into(), guard: None };
                hold.guard = Some(resource.lock_owned().await);
                Some(hold)
            }
        };
        ApplyGuard { _resource: resource, _gate: gate }
    }

    /// Waits until none of the agent's events is being applied, and holds that until the guard
    /// drops: a resync starting on a new stream reads the hub after every write of the
    /// agent's earlier events (its previous stream's transport may have died mid-event).
    pub(crate) async fn applying_alone(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.applying.gate.write().await
    }

    /// The agent's mailbox: what is owed to it, and which stream may take it.
    pub(crate) fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }

    /// Events queued or awaiting an ACK, and how long the oldest has waited (for metrics).
    pub(crate) fn outbox_backlog(&self) -> (usize, Option<std::time::Duration>) {
        self.mailbox.backlog()
    }

    /// Attaches a new stream opened with `grant`, closing the previous one with `Aborted` (a
    /// second connection of the same agent replaces the first instead of interleaving with
    /// it, unlike upstream §3.7).
    pub(crate) fn attach(&self, mode: AgentMode, grant: StreamGrant) -> StreamHandle {
        let mut slot = lock(&self.current);
        *lock(&self.mode) = mode;
        // Whatever the old stream had in flight is due again on the new one.
        let handle = StreamHandle::new(self.mailbox.attach(), grant.expires_at);
        if let Some(old) = slot.replace(Attached { handle: handle.clone(), grant }) {
            tracing::warn!(agent = %self.name, "a new stream of this agent replaces its live one (one stream per agent, \
                the newest wins; if this repeats, two agents share this identity)");
            old.handle.close(Some(Status::aborted(format!(
                "replaced by a newer stream of agent {:?}: the principal keeps one stream per agent and the newest \
                 wins (if this repeats, two agents share this identity)",
                self.name
            ))));
        }
        handle
    }

    /// Detaches stream `handle` if it is still the current one; its in-flight events become
    /// due again on the next stream.
    pub(crate) fn detach(&self, handle: &StreamHandle) {
        let mut slot = lock(&self.current);
        if let Some(put_back) = self.mailbox.detach(handle.attachment) {
            *slot = None;
            drop(slot);
            tracing::info!(agent = %self.name, put_back, "agent stream ended");
        }
    }

    /// Extends the current stream's deadline to `expires_at` when it was opened with a token
    /// bound to `binding` (a refreshed session of the same transport identity).
    fn extend(&self, binding: &auth::Binding, expires_at: SystemTime) -> bool {
        let slot = lock(&self.current);
        slot.as_ref().filter(|a| a.grant.binding.as_ref() == Some(binding)).is_some_and(|a| a.handle.extend(expires_at))
    }

    /// Closes the current stream, if any, with `status`; returns the grant it was opened with.
    fn close_current(&self, status: Option<Status>) -> Option<StreamGrant> {
        let slot = lock(&self.current);
        slot.as_ref().map(|a| {
            a.handle.close(status);
            a.grant.clone()
        })
    }
}

/// Every agent session the principal knows, by agent name.
#[derive(Debug)]
pub struct Peers {
    retry: RetryPolicy,
    by_name: Mutex<HashMap<String, Arc<AgentPeer>>>,
    /// Revoked access tokens (`jti`), until they expire.
    revoked: Mutex<HashMap<String, SystemTime>>,
}

impl Peers {
    /// An empty registry whose outboxes use `retry`.
    #[must_use]
    pub fn new(retry: RetryPolicy) -> Self {
        Self { retry, by_name: Mutex::new(HashMap::new()), revoked: Mutex::new(HashMap::new()) }
    }

    /// The session of `agent`, if it ever connected.
    #[must_use]
    pub fn get(&self, agent: &str) -> Option<Arc<AgentPeer>> {
        lock(&self.by_name).get(agent).cloned()
    }

    /// The session of `agent`, created on first use.
    pub fn get_or_create(&self, agent: &str, mode: AgentMode) -> Arc<AgentPeer> {
        lock(&self.by_name)
            .entry(agent.to_owned())
            .or_insert_with(|| Arc::new(AgentPeer::new(agent, mode, self.retry.clone())))
            .clone()
    }

    /// The session of `agent` (created on first use) with a new stream opened with `grant`
    /// attached, as [`AgentPeer::attach`] does, in one step under the registry's lock: a peer
    /// [`Self::forget_idle`] drops is never the one a stream attaches to.
    pub(crate) fn attach(&self, agent: &str, mode: AgentMode, grant: StreamGrant) -> (Arc<AgentPeer>, StreamHandle) {
        let mut by_name = lock(&self.by_name);
        let peer = by_name
            .entry(agent.to_owned())
            .or_insert_with(|| Arc::new(AgentPeer::new(agent, mode, self.retry.clone())))
            .clone();
        let handle = peer.attach(mode, grant);
        drop(by_name);
        (peer, handle)
    }

    /// Ends every attached stream with `Unavailable` (on shutdown, so a graceful server stop
    /// does not wait for agents to hang up), telling agents to reconnect at once: behind a
    /// Service another replica takes them ([`RECONNECT_TRAILER`]).
    pub fn disconnect_all(&self) {
        for session in self.all() {
            session.close_current(Some(reconnect_elsewhere(Status::unavailable(
                "the principal is shutting down; reconnect (another replica, or this one once restarted)",
            ))));
        }
    }

    /// Closes `agent`'s live stream with `status`; returns whether one was live.
    pub(crate) fn close(&self, agent: &str, status: Status) -> bool {
        self.get(agent).is_some_and(|session| session.close_current(Some(status)).is_some())
    }

    /// Forgets `agent`'s peer (its mailbox) when no stream is attached and `keep` says this
    /// principal no longer acts for it: another replica owns it and resyncs it on its stream.
    /// Checked under the registry's lock, which [`Self::attach`] holds too, so a stream
    /// attached since keeps it.
    pub(crate) fn forget_idle(&self, agent: &str, keep: impl Fn(&str) -> bool) -> bool {
        let mut by_name = lock(&self.by_name);
        let idle = by_name.get(agent).is_some_and(|s| !s.is_connected());
        if idle && !keep(agent) {
            by_name.remove(agent);
            tracing::debug!(%agent, "forgot the agent's peer: another replica owns it");
            return true;
        }
        false
    }

    /// Revokes the live session of `agent`: its stream is closed now with `Unauthenticated`,
    /// and the access token it was opened with is refused on new streams until it expires, so
    /// the agent has to obtain a new one (`Authenticate` or `RefreshToken`). Returns whether a
    /// live stream was closed.
    ///
    /// Keeping the agent out for good (a blocklist) also needs `Authenticate` and
    /// `RefreshToken` to refuse it, in the auth crate; this is the principal's half.
    pub fn revoke(&self, agent: &str) -> bool {
        self.revoke_with(
            agent,
            Status::unauthenticated(format!(
                "the session of agent {agent:?} was revoked by the principal: authenticate again"
            )),
        )
    }

    /// As [`Self::revoke`], ending the stream with `status` (e.g. naming the blocklist entry).
    pub fn revoke_with(&self, agent: &str, status: Status) -> bool {
        let Some(session) = self.get(agent) else {
            return false;
        };
        let Some(grant) = session.close_current(Some(status)) else {
            return false;
        };
        tracing::warn!(%agent, token_id = ?grant.token_id, "session revoked: stream closed");
        if let (Some(id), Some(expires_at)) = (grant.token_id, grant.expires_at) {
            lock(&self.revoked).insert(id, expires_at);
        }
        true
    }

    /// The agent refreshed its session: its live stream, when opened with a token bound to
    /// the same `binding`, now ends at `expires_at` instead (see [`crate::Principal::session_hook`]).
    /// Returns whether a stream was extended.
    pub fn extend(&self, agent: &str, binding: &auth::Binding, expires_at: SystemTime) -> bool {
        self.get(agent).is_some_and(|session| session.extend(binding, expires_at))
    }

    /// Whether access token `token_id` was revoked (and has not expired since).
    #[must_use]
    pub fn is_revoked(&self, token_id: &str) -> bool {
        let mut revoked = lock(&self.revoked);
        let now = SystemTime::now();
        revoked.retain(|_, expires_at| *expires_at > now);
        revoked.contains_key(token_id)
    }

    /// Every session.
    #[must_use]
    pub fn all(&self) -> Vec<Arc<AgentPeer>> {
        lock(&self.by_name).values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn grant(id: &str, ttl: Duration) -> StreamGrant {
        StreamGrant { token_id: Some(id.to_owned()), expires_at: Some(SystemTime::now() + ttl), binding: None }
    }

    #[test]
    fn periodic_resyncs_closer_than_the_minimum_are_not_answered() {
        let peer = AgentPeer::new("a", AgentMode::Managed, RetryPolicy::default());
        assert!(peer.periodic_due(std::time::Duration::from_secs(3600)), "the first is answered");
        assert!(!peer.periodic_due(std::time::Duration::from_secs(3600)), "the next within the minimum is not");
        assert!(peer.periodic_due(std::time::Duration::ZERO), "with no minimum every one is");
    }

    /// Whether `fut` is still waiting after the runtime has had plenty of chances to run it.
    async fn still_waiting<F: std::future::Future + Unpin>(fut: &mut F) -> bool {
        for _ in 0..20 {
            if futures::poll!(&mut *fut).is_ready() {
                return false;
            }
            tokio::task::yield_now().await;
        }
        true
    }

    #[tokio::test]
    async fn one_resource_applies_one_event_at_a_time_and_others_go_by() {
        let peer = AgentPeer::new("a", AgentMode::Managed, RetryPolicy::default());
        let first = peer.applying(Some("argocd/app-1")).await;
        let mut same = Box::pin(peer.applying(Some("argocd/app-1")));
        assert!(still_waiting(&mut same).await, "the same resource waits for the event before it");
        let other = peer.applying(Some("argocd/app-2")).await;
        let mut resync = Box::pin(peer.applying_alone());
        assert!(still_waiting(&mut resync).await, "a resync waits for every event");
        drop(first);
        let same = same.await;
        drop((same, other));
        drop(resync.await);
        assert!(lock(&peer.applying.resources).is_empty(), "no lock is kept once nothing applies");
        assert_eq!(lock(&peer.applying.resources).capacity(), 0, "nor the table's memory");
    }

    #[tokio::test]
    async fn a_wait_given_up_on_leaves_no_lock_behind() {
        let peer = AgentPeer::new("a", AgentMode::Managed, RetryPolicy::default());
        let held = peer.applying(Some("argocd/app-1")).await;
        let mut waiting = Box::pin(peer.applying(Some("argocd/app-1")));
        assert!(still_waiting(&mut waiting).await);
        drop(waiting);
        drop(held);
        assert!(lock(&peer.applying.resources).is_empty());
        // Events without a resource take no lock, and nothing waits for them but a resync.
        let _a = peer.applying(None).await;
        let _b = peer.applying(None).await;
        assert!(lock(&peer.applying.resources).is_empty());
    }

    #[test]
    fn the_newest_stream_wins_and_the_replaced_one_takes_nothing() {
        let peers = Peers::new(RetryPolicy::default());
        let session = peers.get_or_create("agent-1", AgentMode::Managed);
        let old = session.attach(AgentMode::Managed, StreamGrant::default());
        let new = session.attach(AgentMode::Managed, StreamGrant::default());
        assert!(old.is_closed() && !new.is_closed());
        assert_eq!(old.end_status().map(|s| s.code()), Some(tonic::Code::Aborted));

        session.push(Event::heartbeat());
        assert!(
            session.mailbox().take_ready(old.attachment(), "t").is_none(),
            "a replaced stream must not take events"
        );
        let ready = session.mailbox().take_ready(new.attachment(), "t").expect("current stream");
        assert_eq!(ready.events.len(), 1);

        session.detach(&old);
        assert!(session.is_connected(), "detaching the replaced stream leaves the newest attached");
        session.detach(&new);
        assert!(!session.is_connected());
    }

    #[test]
    fn revoking_closes_the_stream_and_refuses_its_token_until_it_expires() {
        let peers = Peers::new(RetryPolicy::default());
        assert!(!peers.revoke("agent-1"), "unknown agent");
        let session = peers.get_or_create("agent-1", AgentMode::Managed);
        let handle = session.attach(AgentMode::Managed, grant("jti-1", Duration::from_secs(60)));
        assert!(peers.revoke("agent-1"));
        assert_eq!(handle.end_status().map(|s| s.code()), Some(tonic::Code::Unauthenticated));
        assert!(peers.is_revoked("jti-1") && !peers.is_revoked("jti-2"));

        // An already expired token is pruned: the auth layer refuses it anyway.
        session.detach(&handle);
        let expired = session.attach(AgentMode::Managed, grant("jti-3", Duration::ZERO));
        assert!(peers.revoke("agent-1"));
        assert!(expired.is_closed());
        assert!(!peers.is_revoked("jti-3"));
    }

    #[test]
    fn the_first_close_reason_wins() {
        let mailbox = Mailbox::new(RetryPolicy::default());
        let handle = StreamHandle::new(mailbox.attach(), None);
        handle.close(Some(Status::unauthenticated("expired")));
        handle.close(None);
        handle.close(Some(Status::aborted("replaced")));
        assert_eq!(handle.end_status().map(|s| s.code()), Some(tonic::Code::Unauthenticated));
        let clean = StreamHandle::new(mailbox.attach(), None);
        clean.close(None);
        clean.close(Some(Status::aborted("replaced")));
        assert!(clean.is_closed() && clean.end_status().is_none());
    }
}
