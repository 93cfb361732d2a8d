//! The per-peer outbox shell: events for one peer, delivered per resource with ACKs and
//! retries by [`protocol::outbox::Outbox`], and the one stream allowed to take them.
//!
//! Invariants (all under one lock, so they hold between any two calls):
//! * **one sender at a time.** A stream [`Mailbox::attach`]es before it sends; attaching
//!   replaces the previous attachment, whose [`Mailbox::take_ready`] answers `None` from then
//!   on, so a replaced stream never takes its successor's events;
//! * **nothing in flight survives a stream.** Attaching and detaching put every event in
//!   flight back in the queue, due at once on the next stream;
//! * **the mailbox outlives streams.** What is pushed while no stream is attached waits.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use protocol::Event;
use protocol::outbox::{AckOutcome, Outbox, Parked, RetryPolicy};
use tokio::sync::Notify;

use crate::lock;

/// A stream's claim on a mailbox: what it presents to take events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attachment(u64);

impl Attachment {
    /// Which attachment of its mailbox this is (1 for the first).
    #[must_use]
    pub fn generation(self) -> u64 {
        self.0
    }
}

#[derive(Debug)]
struct Inner {
    outbox: Outbox<Event>,
    /// The last attachment handed out.
    generation: u64,
    /// The attachment that may take events, if any.
    current: Option<u64>,
}

/// Events for one peer, and the stream currently taking them.
#[derive(Debug)]
pub struct Mailbox {
    inner: Mutex<Inner>,
    notify: Notify,
}

/// What [`Mailbox::take_ready`] hands a sender.
#[derive(Debug, Default)]
pub struct Ready {
    /// Events due now, in order.
    pub events: Vec<Event>,
    /// When to look again at the latest (a retransmission), if anything is in flight.
    pub next: Option<Instant>,
    /// Events given up on since the last call (too many attempts or rejected): logged by the
    /// mailbox, handed over for the caller's metrics.
    pub parked: Vec<Parked<Event>>,
}

impl Mailbox {
    /// An empty mailbox with `retry` timing and no stream attached.
    #[must_use]
    pub fn new(retry: RetryPolicy) -> Self {
        Self {
            inner: Mutex::new(Inner { outbox: Outbox::new(retry), generation: 0, current: None }),
            notify: Notify::new(),
        }
    }

    /// Queues an event and wakes the sender. An event is dropped (logged at debug) when the
    /// peer was already sent a newer version of its resource (e.g. a watch replaying history
    /// after a resync sent the current state).
    pub fn push(&self, event: Event) {
        // Not `tracing::enabled!` to spare cloning the ids: with per-layer filters it leaves
        // stale filter state behind, and the next span on this thread went unexported
        // (tokio-rs/tracing#2519). The outbox gives a dropped event back instead.
        let dropped = lock(&self.inner).outbox.push(event, Instant::now());
        match dropped {
            None => self.notify.notify_one(),
            Some(ev) => tracing::debug!(resource_id = %ev.resource_id, event_id = %ev.event_id,
                "dropped: the peer was already sent a newer version of this resource"),
        }
    }

    /// Settles the in-flight event an ACK refers to, and wakes the sender (the resource's next
    /// event may be due now).
    pub fn ack(&self, resource_id: &str, event_id: &str) -> AckOutcome {
        let outcome = lock(&self.inner).outbox.ack(resource_id, event_id);
        self.notify.notify_one();
        outcome
    }

    /// Gives up on in-flight event `event` at once (it can never be delivered); the resource's
    /// next event proceeds and the next resync repairs what it carried.
    pub fn reject(&self, event: &Event, reason: String) -> AckOutcome {
        let outcome = lock(&self.inner).outbox.reject(&event.resource_id, &event.event_id, reason, Instant::now());
        self.notify.notify_one();
        outcome
    }

    /// Withdraws whatever is queued or in flight for `resource_id` (a request nobody waits
    /// for any more); returns whether there was something.
    pub fn withdraw(&self, resource_id: &str) -> bool {
        lock(&self.inner).outbox.withdraw(resource_id)
    }

    /// Attaches a new stream: from now on only it takes events; whatever the previous one had
    /// in flight is due again at once.
    pub fn attach(&self) -> Attachment {
        let mut inner = lock(&self.inner);
        inner.generation = inner.generation.wrapping_add(1);
        inner.current = Some(inner.generation);
        inner.outbox.on_disconnect();
        let attachment = Attachment(inner.generation);
        drop(inner);
        self.notify.notify_one();
        attachment
    }

    /// Detaches `attachment` if it is still the current one; returns how many events in flight
    /// were put back (`None`: a newer stream had replaced it, and nothing changed).
    pub fn detach(&self, attachment: Attachment) -> Option<usize> {
        let mut inner = lock(&self.inner);
        if inner.current != Some(attachment.0) {
            return None;
        }
        inner.current = None;
        Some(inner.outbox.on_disconnect())
    }

    /// Whether a stream is attached.
    #[must_use]
    pub fn is_attached(&self) -> bool {
        lock(&self.inner).current.is_some()
    }

    /// Events due now for the stream holding `attachment`, and when to look again; `None` once
    /// that stream is no longer the attached one (it must stop sending). Events given up on are
    /// logged here as warnings naming `peer`.
    pub fn take_ready(&self, attachment: Attachment, peer: &str) -> Option<Ready> {
        let mut inner = lock(&self.inner);
        if inner.current != Some(attachment.0) {
            return None;
        }
        let now = Instant::now();
        let mut events = Vec::new();
        while let Some(ev) = inner.outbox.next_ready(now) {
            events.push(ev);
        }
        let parked = inner.outbox.take_parked();
        let next = inner.outbox.next_deadline();
        drop(inner);
        for p in &parked {
            tracing::warn!(%peer, resource_id = %p.item.resource_id, event_id = %p.item.event_id,
                attempts = p.attempts, reason = ?p.reason, "gave up delivering an event; resync will repair");
        }
        Some(Ready { events, next, parked })
    }

    /// Events queued or awaiting an ACK, and how long the oldest has waited (for metrics).
    #[must_use]
    pub fn backlog(&self) -> (usize, Option<Duration>) {
        let inner = lock(&self.inner);
        (inner.outbox.queued() + inner.outbox.inflight(), inner.outbox.oldest_pending_age(Instant::now()))
    }

    /// Resolves at the next push, ACK, reject or attach (or at once if one happened since the
    /// last wake-up and nobody consumed it).
    pub async fn changed(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use protocol::{EventType, Target};

    use super::*;

    fn event(resource: &str, id: &str) -> Event {
        Event::new(EventType::SpecUpdate, Target::Application, resource.to_owned(), id.to_owned())
    }

    fn ids(ready: &Ready) -> Vec<&str> {
        ready.events.iter().map(|e| e.event_id.as_str()).collect()
    }

    #[test]
    fn nothing_is_taken_without_an_attachment_and_it_waits_for_one() {
        let mailbox = Mailbox::new(RetryPolicy::default());
        mailbox.push(event("r1", "e1"));
        assert!(!mailbox.is_attached());
        let stale = Attachment(0);
        assert!(mailbox.take_ready(stale, "peer").is_none(), "no stream attached: nobody may take");
        let a = mailbox.attach();
        let ready = mailbox.take_ready(a, "peer").expect("attached");
        assert_eq!(ids(&ready), ["e1"]);
        assert!(ready.next.is_some(), "in flight: a retransmission is scheduled");
        assert_eq!(mailbox.backlog().0, 1);
    }

    #[test]
    fn a_replaced_stream_takes_nothing_and_its_in_flight_events_go_to_the_new_one() {
        let mailbox = Mailbox::new(RetryPolicy::default());
        let old = mailbox.attach();
        mailbox.push(event("r1", "e1"));
        assert_eq!(ids(&mailbox.take_ready(old, "peer").expect("current")), ["e1"]);
        let new = mailbox.attach();
        assert_eq!(new.generation(), old.generation() + 1);
        assert!(mailbox.take_ready(old, "peer").is_none(), "replaced: must stop");
        assert_eq!(ids(&mailbox.take_ready(new, "peer").expect("current")), ["e1"], "put back, due at once");
        assert_eq!(mailbox.detach(old), None, "detaching a replaced stream changes nothing");
        assert!(mailbox.is_attached());
        assert_eq!(mailbox.detach(new), Some(1));
        assert!(!mailbox.is_attached());
    }

    #[test]
    fn an_ack_settles_the_event_and_lets_the_resources_next_one_go() {
        let mailbox = Mailbox::new(RetryPolicy::default());
        let a = mailbox.attach();
        mailbox.push(event("r1", "e1"));
        assert_eq!(ids(&mailbox.take_ready(a, "peer").expect("current")), ["e1"]);
        mailbox.push(event("r1", "e2"));
        assert!(mailbox.take_ready(a, "peer").expect("current").events.is_empty(), "one in flight per resource");
        assert_eq!(mailbox.ack("r1", "e1"), AckOutcome::Matched);
        assert_eq!(ids(&mailbox.take_ready(a, "peer").expect("current")), ["e2"]);
        assert_eq!(mailbox.ack("r1", "nope"), AckOutcome::Stale);
    }

    #[test]
    fn a_rejected_event_is_parked_and_handed_over_once() {
        let mailbox = Mailbox::new(RetryPolicy::default());
        let a = mailbox.attach();
        let ev = event("r1", "e1");
        mailbox.push(ev.clone());
        mailbox.take_ready(a, "peer").expect("current");
        assert_eq!(mailbox.reject(&ev, "too large".into()), AckOutcome::Matched);
        let ready = mailbox.take_ready(a, "peer").expect("current");
        assert_eq!(ready.parked.len(), 1);
        assert_eq!(ready.parked[0].item.event_id, "e1");
        assert!(mailbox.take_ready(a, "peer").expect("current").parked.is_empty());
        assert_eq!(mailbox.backlog().0, 0);
    }

    #[tokio::test]
    async fn changes_wake_the_sender() {
        let mailbox = std::sync::Arc::new(Mailbox::new(RetryPolicy::default()));
        let waiter = tokio::spawn({
            let mailbox = mailbox.clone();
            async move { mailbox.changed().await }
        });
        mailbox.push(event("r1", "e1"));
        tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("woken").expect("joined");
    }
}
