//! The outbox state machine.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use super::item::{DeliveryClass, Outgoing};
use super::policy::{JitterSource, RetryPolicy, SeededJitter};

/// Why an event was taken out of delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParkReason {
    /// It was transmitted [`RetryPolicy::max_attempts`] times without an ACK.
    MaxAttempts,
    /// The caller rejected it ([`Outbox::reject`]), e.g. because the peer reported a
    /// non-retryable failure.
    Rejected(String),
}

/// An event the outbox gave up on, to be logged and counted by the caller.
#[derive(Debug, Clone, PartialEq)]
pub struct Parked<T> {
    /// The event.
    pub item: T,
    /// How often it was transmitted.
    pub attempts: u32,
    /// Why it was parked.
    pub reason: ParkReason,
    /// When.
    pub parked_at: Instant,
}

/// What an acknowledgement matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// It matched the event in flight (or one already transmitted and put back by a
    /// disconnect), which is now settled.
    Matched,
    /// The resource is known but the event id is not the one awaiting an ACK: ignored.
    Stale,
    /// Nothing is queued or in flight for the resource: ignored.
    UnknownResource,
}

/// A read-only view of the event in flight for a resource.
#[derive(Debug, Clone, Copy)]
pub struct InFlightView<'a, T> {
    /// The event.
    pub item: &'a T,
    /// Transmissions so far.
    pub attempts: u32,
    /// When it will be retransmitted (or parked) without an ACK.
    pub deadline: Instant,
}

#[derive(Debug)]
struct Entry<T> {
    item: T,
    /// When the oldest change this entry stands for was pushed (kept across coalescing).
    queued_at: Instant,
    /// Transmissions so far.
    attempts: u32,
}

type TimerKey = (Instant, u64);

#[derive(Debug)]
struct InFlight<T> {
    entry: Entry<T>,
    timer: TimerKey,
}

#[derive(Debug)]
struct Slot<T> {
    pending: VecDeque<Entry<T>>,
    inflight: Option<InFlight<T>>,
    /// Listed in `Outbox::ready`.
    in_ready: bool,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Self { pending: VecDeque::new(), inflight: None, in_ready: false }
    }
}

impl<T: Outgoing> Slot<T> {
    /// A newer pending event makes retransmitting `item` pointless: a delete is waiting, or an
    /// event with the same coalescing key.
    fn supersedes(&self, item: &T) -> bool {
        self.pending.front().is_some_and(|e| e.item.delivery_class() == DeliveryClass::Delete)
            || self.pending.iter().any(|e| e.item.coalesce_key() == item.coalesce_key())
    }
}

/// Retry timers and the jitter stream, kept apart from the slots so both can be borrowed.
#[derive(Debug)]
struct Timing {
    policy: RetryPolicy,
    jitter: Box<dyn JitterSource>,
    timers: BTreeMap<TimerKey, String>,
    next_seq: u64,
}

impl Timing {
    fn arm(&mut self, resource_id: &str, attempts: u32, now: Instant) -> TimerKey {
        let delay = self.policy.delay(attempts, self.jitter.next_unit());
        let deadline =
            now.checked_add(delay).or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600))).unwrap_or(now);
        let key = (deadline, self.next_seq);
        self.next_seq = self.next_seq.wrapping_add(1);
        self.timers.insert(key, resource_id.to_owned());
        key
    }
}

/// Per-resource outbox with ACK tracking, coalescing and retry timing: an I/O-free state
/// machine shared by principal and agent. See the [module documentation](super) for the
/// delivery rules and the poison policy.
#[derive(Debug)]
pub struct Outbox<T> {
    timing: Timing,
    slots: HashMap<String, Slot<T>>,
    /// Resources with pending events and nothing in flight, in the order they became ready.
    /// May hold ids whose slot has since emptied; those are skipped.
    ready: VecDeque<String>,
    acks: VecDeque<String>,
    ack_items: HashMap<String, T>,
    /// Boxed: inline, an event's size in every peer's outbox, nearly always empty.
    heartbeat: Option<Box<T>>,
    parked: HashMap<String, Parked<T>>,
    queued: usize,
    inflight: usize,
    /// The newest object version accepted per resource and family ([`Outgoing::version`]),
    /// kept after delivery: an older state must not follow one already delivered. One entry per
    /// resource ever sent (a few dozen bytes each).
    versions: HashMap<String, [Option<u64>; 2]>,
    /// Items dropped because a newer version of their resource was already accepted.
    stale: u64,
}

impl<T: Outgoing> Outbox<T> {
    /// An outbox whose jitter is seeded from the process's random hash keys.
    #[must_use]
    pub fn new(policy: RetryPolicy) -> Self {
        let seed = RandomState::new().hash_one(0x5eed_u64);
        Self::with_jitter(policy, Box::new(SeededJitter::new(seed)))
    }

    /// An outbox with an injected jitter source (deterministic tests).
    #[must_use]
    pub fn with_jitter(policy: RetryPolicy, jitter: Box<dyn JitterSource>) -> Self {
        Self {
            timing: Timing { policy, jitter, timers: BTreeMap::new(), next_seq: 0 },
            slots: HashMap::new(),
            ready: VecDeque::new(),
            acks: VecDeque::new(),
            ack_items: HashMap::new(),
            heartbeat: None,
            parked: HashMap::new(),
            queued: 0,
            inflight: 0,
            versions: HashMap::new(),
            stale: 0,
        }
    }

    /// How many items were dropped because a newer version of their resource had already been
    /// accepted ([`Outgoing::version`]).
    #[must_use]
    pub fn stale_dropped(&self) -> u64 {
        self.stale
    }

    /// The retry policy.
    #[must_use]
    pub fn policy(&self) -> &RetryPolicy {
        &self.timing.policy
    }

    /// Queues an item. Never drops a delete; coalesces as the module docs describe.
    ///
    /// Gives the item back when it was dropped as stale: it carries an older version of its
    /// resource than one already accepted (e.g. a watch replaying history after a resync already
    /// sent the newer state), which must not overwrite the newer state on the other side.
    pub fn push(&mut self, item: T, now: Instant) -> Option<T> {
        let class = item.delivery_class();
        match (class, item.version()) {
            (DeliveryClass::Delete, Some((family, version))) => {
                // Never dropped; states older than the delete may not follow it (a watch
                // replaying history), newer ones may (the object is shared again, re-created).
                let newest = &mut self.versions.entry(item.resource_id().to_owned()).or_default()[family as usize];
                *newest = Some(newest.map_or(version, |n| n.max(version)));
            }
            (DeliveryClass::Tracked, Some((family, version))) => {
                let newest = &mut self.versions.entry(item.resource_id().to_owned()).or_default()[family as usize];
                if newest.is_some_and(|n| version < n) {
                    self.stale += 1;
                    return Some(item);
                }
                *newest = Some(version);
            }
            _ => {}
        }
        match class {
            DeliveryClass::Ack => {
                let rid = item.resource_id().to_owned();
                if self.ack_items.insert(rid.clone(), item).is_none() {
                    self.acks.push_back(rid);
                }
            }
            DeliveryClass::Heartbeat => self.heartbeat = Some(Box::new(item)),
            DeliveryClass::Tracked | DeliveryClass::Delete => {
                let rid = item.resource_id().to_owned();
                let slot = self.slots.entry(rid.clone()).or_default();
                let mut queued_at = now;
                let before = slot.pending.len();
                if class == DeliveryClass::Delete {
                    for e in slot.pending.drain(..) {
                        queued_at = queued_at.min(e.queued_at);
                    }
                } else {
                    let key = item.coalesce_key();
                    slot.pending.retain(|e| {
                        let replaced = e.item.delivery_class() != DeliveryClass::Delete && e.item.coalesce_key() == key;
                        if replaced {
                            queued_at = queued_at.min(e.queued_at);
                        }
                        !replaced
                    });
                }
                self.queued -= before - slot.pending.len();
                slot.pending.push_back(Entry { item, queued_at, attempts: 0 });
                self.queued += 1;
                if slot.inflight.is_none() && !slot.in_ready {
                    slot.in_ready = true;
                    self.ready.push_back(rid);
                }
            }
        }
        None
    }

    /// The next item to transmit at `now`, if any; a tracked item is marked in flight until
    /// ACKed or its retry deadline passes. Order: due retransmissions, then ACKs and the
    /// heartbeat, then resources in the order they became ready.
    pub fn next_ready(&mut self, now: Instant) -> Option<T> {
        let next = self.take_next(now);
        self.release_if_drained();
        next
    }

    fn take_next(&mut self, now: Instant) -> Option<T> {
        while let Some((&key, _)) = self.timing.timers.first_key_value() {
            if key.0 > now {
                break;
            }
            let Some((key, rid)) = self.timing.timers.pop_first() else {
                break;
            };
            if let Some(item) = self.on_timer(key, &rid, now) {
                return Some(item);
            }
        }
        while let Some(rid) = self.acks.pop_front() {
            if let Some(item) = self.ack_items.remove(&rid) {
                return Some(item);
            }
        }
        if let Some(item) = self.heartbeat.take() {
            return Some(*item);
        }
        while let Some(rid) = self.ready.pop_front() {
            if let Some(item) = self.start_next(&rid, now) {
                return Some(item);
            }
        }
        None
    }

    /// Settles the in-flight event of `resource_id` if its event id is `event_id`. An ACK for
    /// any other event id is stale and ignored.
    pub fn ack(&mut self, resource_id: &str, event_id: &str) -> AckOutcome {
        let Some(slot) = self.slots.get_mut(resource_id) else {
            return AckOutcome::UnknownResource;
        };
        if slot.inflight.as_ref().is_some_and(|f| f.entry.item.event_id() == event_id) {
            if let Some(f) = slot.inflight.take() {
                self.timing.timers.remove(&f.timer);
                self.inflight -= 1;
            }
        } else if let Some(pos) = slot.pending.iter().position(|e| e.attempts > 0 && e.item.event_id() == event_id) {
            // Transmitted, put back by a disconnect, and then acknowledged after all.
            slot.pending.remove(pos);
            self.queued -= 1;
        } else {
            return AckOutcome::Stale;
        }
        self.settle(resource_id);
        self.release_if_drained();
        AckOutcome::Matched
    }

    /// The in-flight transmission of `event_id` failed or the peer asked for a retry: it
    /// counts as an attempt and is retried after the backoff delay from `now`, or parked if
    /// the attempt limit is reached.
    pub fn nack(&mut self, resource_id: &str, event_id: &str, now: Instant) -> AckOutcome {
        let limit = self.timing.policy.attempt_limit();
        let Some(slot) = self.slots.get_mut(resource_id) else {
            return AckOutcome::UnknownResource;
        };
        let Some(f) = slot.inflight.as_mut().filter(|f| f.entry.item.event_id() == event_id) else {
            return AckOutcome::Stale;
        };
        self.timing.timers.remove(&f.timer);
        if f.entry.attempts >= limit {
            self.park_inflight(resource_id, ParkReason::MaxAttempts, now);
        } else {
            f.timer = self.timing.arm(resource_id, f.entry.attempts, now);
        }
        AckOutcome::Matched
    }

    /// Parks the in-flight event `event_id` at once (the peer reported a failure that will
    /// not go away); the resource's next event proceeds.
    pub fn reject(&mut self, resource_id: &str, event_id: &str, reason: impl Into<String>, now: Instant) -> AckOutcome {
        let Some(slot) = self.slots.get(resource_id) else {
            return AckOutcome::UnknownResource;
        };
        match slot.inflight.as_ref() {
            Some(f) if f.entry.item.event_id() == event_id => {
                self.timing.timers.remove(&f.timer);
            }
            _ => return AckOutcome::Stale,
        }
        self.park_inflight(resource_id, ParkReason::Rejected(reason.into()), now);
        AckOutcome::Matched
    }

    /// Withdraws everything queued or in flight for `resource_id` (a request whose caller has
    /// gone: it must not be sent, nor sent again). An ACK arriving later is stale. Returns
    /// whether anything was withdrawn.
    pub fn withdraw(&mut self, resource_id: &str) -> bool {
        let Some(slot) = self.slots.remove(resource_id) else {
            return false;
        };
        if let Some(f) = slot.inflight {
            self.timing.timers.remove(&f.timer);
            self.inflight -= 1;
        }
        self.queued -= slot.pending.len();
        self.release_if_drained();
        true
    }

    /// The stream is gone: every event in flight becomes pending again, at the head of its
    /// resource's queue, due at once on the next stream (unless a newer pending event has
    /// superseded it). ACKs and the heartbeat stay queued. Returns how many were put back.
    pub fn on_disconnect(&mut self) -> usize {
        let timers = std::mem::take(&mut self.timing.timers);
        let mut requeued = 0;
        for rid in timers.into_values() {
            let Some(slot) = self.slots.get_mut(&rid) else {
                continue;
            };
            let Some(f) = slot.inflight.take() else {
                continue;
            };
            self.inflight -= 1;
            if !slot.supersedes(&f.entry.item) {
                slot.pending.push_front(f.entry);
                self.queued += 1;
                requeued += 1;
            }
            self.settle(&rid);
        }
        self.release_if_drained();
        requeued
    }

    /// Events given up on since the last call, oldest first.
    pub fn take_parked(&mut self) -> Vec<Parked<T>> {
        let mut out: Vec<Parked<T>> = self.parked.drain().map(|(_, p)| p).collect();
        out.sort_by_key(|p| p.parked_at);
        self.release_if_drained();
        out
    }

    /// The earliest retry deadline of the events in flight: the caller should call
    /// [`next_ready`](Self::next_ready) again by then. `None` when nothing is in flight.
    #[must_use]
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timing.timers.first_key_value().map(|(k, _)| k.0)
    }

    /// Whether `next_ready` may have something without waiting for a deadline.
    #[must_use]
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty() || !self.acks.is_empty() || self.heartbeat.is_some()
    }

    /// Undelivered items: queued, in flight, ACKs and the heartbeat (not parked ones).
    #[must_use]
    pub fn len(&self) -> usize {
        self.queued + self.inflight + self.ack_items.len() + usize::from(self.heartbeat.is_some())
    }

    /// Whether nothing is undelivered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tracked events awaiting an ACK.
    #[must_use]
    pub fn inflight(&self) -> usize {
        self.inflight
    }

    /// Tracked events waiting for their turn.
    #[must_use]
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Parked events not yet taken.
    #[must_use]
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Resources with queued or in-flight events.
    #[must_use]
    pub fn resources(&self) -> usize {
        self.slots.len()
    }

    /// How long the oldest undelivered tracked change has been waiting (`O(resources)`).
    #[must_use]
    pub fn oldest_pending_age(&self, now: Instant) -> Option<Duration> {
        self.slots
            .values()
            .flat_map(|s| s.pending.iter().chain(s.inflight.as_ref().map(|f| &f.entry)).map(|e| e.queued_at))
            .min()
            .map(|t| now.saturating_duration_since(t))
    }

    /// The event in flight for `resource_id`.
    #[must_use]
    pub fn in_flight(&self, resource_id: &str) -> Option<InFlightView<'_, T>> {
        let f = self.slots.get(resource_id)?.inflight.as_ref()?;
        Some(InFlightView { item: &f.entry.item, attempts: f.entry.attempts, deadline: f.timer.0 })
    }

    /// Pending (not in flight) events of `resource_id`, in delivery order.
    pub fn pending_for(&self, resource_id: &str) -> impl Iterator<Item = &T> {
        self.slots.get(resource_id).into_iter().flat_map(|s| s.pending.iter().map(|e| &e.item))
    }

    // === internals ===

    fn on_timer(&mut self, key: TimerKey, rid: &str, now: Instant) -> Option<T> {
        let limit = self.timing.policy.attempt_limit();
        let slot = self.slots.get_mut(rid)?;
        let f = slot.inflight.as_ref().filter(|f| f.timer == key)?;
        if slot.supersedes(&f.entry.item) {
            slot.inflight = None;
            self.inflight -= 1;
            self.settle(rid);
            return None;
        }
        if f.entry.attempts >= limit {
            self.park_inflight(rid, ParkReason::MaxAttempts, now);
            return None;
        }
        let f = slot.inflight.as_mut()?;
        f.entry.attempts += 1;
        f.timer = self.timing.arm(rid, f.entry.attempts, now);
        Some(f.entry.item.clone())
    }

    fn start_next(&mut self, rid: &str, now: Instant) -> Option<T> {
        let limit = self.timing.policy.attempt_limit();
        let slot = self.slots.get_mut(rid)?;
        slot.in_ready = false;
        if slot.inflight.is_some() {
            return None;
        }
        while let Some(mut entry) = slot.pending.pop_front() {
            self.queued -= 1;
            if entry.attempts >= limit {
                // Exhausted across disconnects (e.g. an event that kills the stream each time).
                self.parked.insert(
                    rid.to_owned(),
                    Parked {
                        item: entry.item,
                        attempts: entry.attempts,
                        reason: ParkReason::MaxAttempts,
                        parked_at: now,
                    },
                );
                continue;
            }
            entry.attempts += 1;
            let timer = self.timing.arm(rid, entry.attempts, now);
            let item = entry.item.clone();
            slot.inflight = Some(InFlight { entry, timer });
            self.inflight += 1;
            return Some(item);
        }
        self.slots.remove(rid);
        None
    }

    /// Moves the in-flight event of `rid` to the parked set (its timer already removed).
    fn park_inflight(&mut self, rid: &str, reason: ParkReason, now: Instant) {
        let Some(f) = self.slots.get_mut(rid).and_then(|s| s.inflight.take()) else {
            return;
        };
        self.inflight -= 1;
        self.parked
            .insert(rid.to_owned(), Parked { item: f.entry.item, attempts: f.entry.attempts, reason, parked_at: now });
        self.settle(rid);
        self.release_if_drained();
    }

    /// Gives back the memory of every collection that has emptied. A burst (a resync, a
    /// fan-out) grows them; kept at that size, they were several KiB of every idle peer's
    /// memory (docs/performance.md), and an emptied `BTreeMap` keeps a node. The next burst
    /// grows them again, on demand. `versions` is kept: it is state, not a buffer.
    fn release_if_drained(&mut self) {
        fn release_map<K, V>(map: &mut HashMap<K, V>) {
            if map.is_empty() && map.capacity() > 0 {
                *map = HashMap::new();
            }
        }
        fn release_queue<V>(queue: &mut VecDeque<V>) {
            if queue.is_empty() && queue.capacity() > 0 {
                *queue = VecDeque::new();
            }
        }
        release_map(&mut self.slots);
        release_map(&mut self.ack_items);
        release_map(&mut self.parked);
        release_queue(&mut self.ready);
        release_queue(&mut self.acks);
        if self.timing.timers.is_empty() {
            self.timing.timers = BTreeMap::new();
        }
    }

    /// Entries' room kept by emptied collections (tests: [`Self::release_if_drained`] leaves none).
    #[cfg(test)]
    pub(crate) fn spare_capacity(&self) -> usize {
        let spare = |len: usize, cap: usize| if len == 0 { cap } else { 0 };
        spare(self.slots.len(), self.slots.capacity())
            + spare(self.ack_items.len(), self.ack_items.capacity())
            + spare(self.parked.len(), self.parked.capacity())
            + spare(self.ready.len(), self.ready.capacity())
            + spare(self.acks.len(), self.acks.capacity())
    }

    /// After a slot changed: list it as ready if it can send, drop it if it is empty.
    fn settle(&mut self, rid: &str) {
        let Some(slot) = self.slots.get_mut(rid) else {
            return;
        };
        if slot.inflight.is_some() {
            return;
        }
        if slot.pending.is_empty() {
            self.slots.remove(rid);
        } else if !slot.in_ready {
            slot.in_ready = true;
            self.ready.push_back(rid.to_owned());
        }
    }
}
