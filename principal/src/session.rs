//! Per-agent sessions: one outbox per agent that outlives its streams, and the registry of
//! sessions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use protocol::Event;
use protocol::outbox::{Outbox, RetryPolicy};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::AgentMode;

/// Locks a mutex, recovering the data if a panicking thread poisoned it (the guarded state is
/// always left consistent between statements).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One agent as the principal sees it: its mode, its outbox (surviving reconnects, so nothing
/// queued while the agent is away is lost) and its current stream, if any.
#[derive(Debug)]
pub struct AgentSession {
    name: String,
    mode: Mutex<AgentMode>,
    outbox: Mutex<Outbox<Event>>,
    notify: Notify,
    generation: AtomicU64,
    current: Mutex<Option<(u64, CancellationToken)>>,
}

impl AgentSession {
    fn new(name: &str, mode: AgentMode, retry: RetryPolicy) -> Self {
        Self {
            name: name.to_owned(),
            mode: Mutex::new(mode),
            outbox: Mutex::new(Outbox::new(retry)),
            notify: Notify::new(),
            generation: AtomicU64::new(0),
            current: Mutex::new(None),
        }
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
        lock(&self.outbox).push(event, Instant::now());
        self.notify.notify_one();
    }

    /// Settles the in-flight event an ACK refers to.
    pub fn ack(&self, resource_id: &str, event_id: &str) {
        let outcome = lock(&self.outbox).ack(resource_id, event_id);
        tracing::trace!(agent = %self.name, %resource_id, %event_id, ?outcome, "ack from agent");
        self.notify.notify_one();
    }

    /// Events due now, and when to look again at the latest.
    pub(crate) fn take_ready(&self) -> (Vec<Event>, Option<Instant>) {
        let mut outbox = lock(&self.outbox);
        let now = Instant::now();
        let mut ready = Vec::new();
        while let Some(ev) = outbox.next_ready(now) {
            ready.push(ev);
        }
        for parked in outbox.take_parked() {
            tracing::warn!(agent = %self.name, resource_id = %parked.item.resource_id, event_id = %parked.item.event_id,
                attempts = parked.attempts, reason = ?parked.reason, "gave up delivering an event; resync will repair");
        }
        (ready, outbox.next_deadline())
    }

    /// Waits until something is pushed or ACKed.
    pub(crate) async fn changed(&self) {
        self.notify.notified().await;
    }

    /// Attaches a new stream, cancelling the previous one (a second connection of the same
    /// agent replaces the first instead of interleaving with it, unlike upstream §3.7).
    pub(crate) fn attach(&self, mode: AgentMode) -> (u64, CancellationToken) {
        *lock(&self.mode) = mode;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let token = CancellationToken::new();
        if let Some((_, old)) = lock(&self.current).replace((generation, token.clone())) {
            old.cancel();
        }
        // Whatever the old stream had in flight is due again on the new one.
        lock(&self.outbox).on_disconnect();
        (generation, token)
    }

    /// Detaches stream `generation` if it is still the current one; its in-flight events
    /// become due again on the next stream.
    pub(crate) fn detach(&self, generation: u64) {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
            drop(current);
            let put_back = lock(&self.outbox).on_disconnect();
            tracing::info!(agent = %self.name, put_back, "agent stream ended");
        }
    }
}

/// Every agent session the principal knows, by agent name.
#[derive(Debug)]
pub struct Sessions {
    retry: RetryPolicy,
    by_name: Mutex<HashMap<String, Arc<AgentSession>>>,
}

impl Sessions {
    /// An empty registry whose outboxes use `retry`.
    #[must_use]
    pub fn new(retry: RetryPolicy) -> Self {
        Self { retry, by_name: Mutex::new(HashMap::new()) }
    }

    /// The session of `agent`, if it ever connected.
    #[must_use]
    pub fn get(&self, agent: &str) -> Option<Arc<AgentSession>> {
        lock(&self.by_name).get(agent).cloned()
    }

    /// The session of `agent`, created on first use.
    pub fn get_or_create(&self, agent: &str, mode: AgentMode) -> Arc<AgentSession> {
        lock(&self.by_name)
            .entry(agent.to_owned())
            .or_insert_with(|| Arc::new(AgentSession::new(agent, mode, self.retry.clone())))
            .clone()
    }

    /// Ends every attached stream (on shutdown, so a graceful server stop does not wait
    /// for agents to hang up); agents reconnect with backoff.
    pub fn disconnect_all(&self) {
        for session in self.all() {
            if let Some((_, token)) = lock(&session.current).as_ref() {
                token.cancel();
            }
        }
    }

    /// Every session.
    #[must_use]
    pub fn all(&self) -> Vec<Arc<AgentSession>> {
        lock(&self.by_name).values().cloned().collect()
    }
}
