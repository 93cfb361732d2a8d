//! The delivery engine: one outbox per stream endpoint (the principal keeps one per agent, the
//! agent one in total), surviving reconnects. It is a pure state machine: no tasks, no
//! clock, no I/O. The caller passes `now` in, transmits what [`Outbox::next_ready`] returns,
//! feeds ACKs to [`Outbox::ack`], calls [`Outbox::on_disconnect`] when the stream ends, and
//! sleeps until [`Outbox::next_deadline`] or the next push.
//!
//! # Delivery rules
//!
//! * **Per resource, stop and wait.** Events are keyed by `resourceid`. At most one event per
//!   resource is in flight; the next one goes out only when it is ACKed, parked, or superseded.
//!   There is no order across resources.
//! * **ACKs match resource id and event id.** An ACK whose `eventid` is not the one in flight
//!   is stale and ignored ([`AckOutcome::Stale`]).
//! * **Coalescing.** Pushing an event removes any pending (not yet sent) event of the same
//!   resource with the same coalescing key (the event type) and appends the new one, so
//!   the newest spec-update and the newest status-update win and the newest event is always
//!   delivered last.
//! * **Deletes are never dropped.** A delete clears everything pending for its resource and
//!   waits at the head of the queue; only a newer delete replaces it. A create pushed after a
//!   pending delete is delivered after the delete.
//! * **Retry.** An event not ACKed by its deadline is retransmitted, with exponential backoff
//!   and jitter ([`RetryPolicy`]). If a newer pending event supersedes it (same key, or a
//!   delete), it is dropped at the deadline instead and the newer one goes out.
//! * **Disconnect loses nothing.** Events in flight go back to the head of their queue and
//!   are due at once on the next stream (unless superseded).
//! * **ACKs and heartbeats** are fire-and-forget, never wait behind a resource's data events
//!   (unlike upstream, §10.16), and coalesce: the newest ACK per resource id, one heartbeat.
//! * **Memory** is bounded by the number of distinct resources, never by a queue length that
//!   drops: per resource at most one event in flight, one pending event per event type, one
//!   pending ACK and one parked event.
//!
//! # Poison policy
//!
//! An event transmitted [`RetryPolicy::max_attempts`] times (default
//! [`policy::DEFAULT_MAX_ATTEMPTS`], counted across reconnects, so an event that kills the
//! stream every time is caught too) without an ACK, or rejected explicitly with
//! [`Outbox::reject`], is **parked**: taken out of delivery, so the resource's next event
//! proceeds, and reported through [`Outbox::take_parked`] for the caller to log and count.
//! Parked events are not retried; the resync after the next (re)connect repairs the state
//! they carried. A parked report is replaced by a newer one for the same resource.

pub mod engine;
pub mod item;
pub mod policy;

pub use engine::{AckOutcome, InFlightView, Outbox, ParkReason, Parked};
pub use item::{DeliveryClass, Outgoing, VersionFamily};
pub use policy::{JitterSource, NoJitter, RetryPolicy, SeededJitter};

#[cfg(test)]
mod tests;
