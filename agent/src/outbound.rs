//! The agent's single outbox (surviving reconnects) and the task that drains it onto the
//! current stream.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use protocol::Event;
use protocol::outbox::{Outbox, RetryPolicy};
use protocol::pb::eventstreamapi::Event as WireEvent;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

/// Locks a mutex, recovering the data if a panicking thread poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Events for the principal, delivered per resource with ACKs and retries.
#[derive(Debug)]
pub struct Mailbox {
    outbox: Mutex<Outbox<Event>>,
    notify: Notify,
}

impl Mailbox {
    /// An empty mailbox with `retry` timing.
    #[must_use]
    pub fn new(retry: RetryPolicy) -> Self {
        Self { outbox: Mutex::new(Outbox::new(retry)), notify: Notify::new() }
    }

    /// Queues an event and wakes the sender.
    pub fn push(&self, event: Event) {
        tracing::debug!(event_type = %event.event_type, target = %event.target, resource_id = %event.resource_id,
            event_id = %event.event_id, "queued for principal");
        let ids = (event.resource_id.clone(), event.event_id.clone());
        if lock(&self.outbox).push(event, Instant::now()) {
            self.notify.notify_one();
        } else {
            tracing::debug!(resource_id = %ids.0, event_id = %ids.1,
                "dropped: the principal was already sent a newer version of this resource");
        }
    }

    /// Settles the in-flight event an ACK refers to.
    pub fn ack(&self, resource_id: &str, event_id: &str) {
        let outcome = lock(&self.outbox).ack(resource_id, event_id);
        tracing::trace!(%resource_id, %event_id, ?outcome, "ack from principal");
        self.notify.notify_one();
    }

    /// Events queued or awaiting an ACK, and how long the oldest has waited (for metrics).
    pub fn backlog(&self) -> (usize, Option<std::time::Duration>) {
        let outbox = lock(&self.outbox);
        (outbox.queued() + outbox.inflight(), outbox.oldest_pending_age(Instant::now()))
    }

    /// The stream ended: in-flight events are due again on the next one.
    pub fn on_disconnect(&self) {
        lock(&self.outbox).on_disconnect();
    }

    fn take_ready(&self) -> (Vec<Event>, Option<Instant>) {
        let mut outbox = lock(&self.outbox);
        let now = Instant::now();
        let mut ready = Vec::new();
        while let Some(ev) = outbox.next_ready(now) {
            ready.push(ev);
        }
        for parked in outbox.take_parked() {
            tracing::warn!(resource_id = %parked.item.resource_id, event_id = %parked.item.event_id,
                attempts = parked.attempts, reason = ?parked.reason, "gave up delivering an event; resync will repair");
            crate::metrics::global().event_discarded(&parked.item);
        }
        (ready, outbox.next_deadline())
    }

    /// Drains the outbox onto `tx` until `cancel` fires or the stream closes; pushes a
    /// heartbeat every `heartbeat` if set.
    pub(crate) async fn send_loop(
        &self,
        tx: mpsc::Sender<WireEvent>,
        cancel: CancellationToken,
        heartbeat: Option<std::time::Duration>,
        max_bytes: usize,
    ) {
        let mut ticker = heartbeat.map(tokio::time::interval);
        loop {
            if cancel.is_cancelled() {
                return;
            }
            let (ready, deadline) = self.take_ready();
            for mut ev in ready {
                ev.stamp_sent_at(chrono::Utc::now());
                let wire = ev.to_wire();
                let len = prost::Message::encoded_len(&wire);
                if len > max_bytes {
                    // Sending it would fail the stream on every reconnect; give it up at once.
                    tracing::warn!(event_type = %ev.event_type, target = %ev.target, resource_id = %ev.resource_id,
                        event_id = %ev.event_id, bytes = len, limit = max_bytes,
                        "event too large to send; given up (the next resync repairs)");
                    let reason = format!("encodes to {len} bytes, above the message limit");
                    lock(&self.outbox).reject(&ev.resource_id, &ev.event_id, reason, Instant::now());
                    continue;
                }
                if tx.send(wire).await.is_err() {
                    return;
                }
                crate::metrics::global().event_sent();
            }
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            let tick = async {
                match ticker.as_mut() {
                    Some(t) => {
                        t.tick().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = cancel.cancelled() => return,
                () = tx.closed() => return,
                () = self.notify.notified() => {}
                () = sleep => {}
                () = tick => self.push(Event::heartbeat()),
            }
        }
    }
}
