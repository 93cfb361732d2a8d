//! What the outbox needs to know about an item, and how events answer it.

use crate::event::{Event, EventType, Target};

/// How the outbox treats an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeliveryClass {
    /// Sent in order per resource, one at a time, retried until ACKed. A newer pending item
    /// with the same [`Outgoing::coalesce_key`] replaces an older one.
    Tracked,
    /// Like `Tracked`, but supersedes everything pending for its resource.
    Delete,
    /// Fire-and-forget ACK: never tracked, never blocked behind the resource's data events;
    /// only the newest pending ACK per resource id is kept.
    Ack,
    /// Fire-and-forget heartbeat: only the newest pending one is kept.
    Heartbeat,
}

/// An item the outbox can deliver.
pub trait Outgoing: Clone {
    /// The per-resource delivery key (`resourceid`).
    fn resource_id(&self) -> &str;
    /// The version key ACKs are matched against (`eventid`).
    fn event_id(&self) -> &str;
    /// How to deliver it.
    fn delivery_class(&self) -> DeliveryClass;
    /// Pending items of one resource with equal keys coalesce to the newest.
    fn coalesce_key(&self) -> &str;
}

impl Outgoing for Event {
    fn resource_id(&self) -> &str {
        &self.resource_id
    }

    fn event_id(&self) -> &str {
        &self.event_id
    }

    /// ACKs (`eventProcessed`) and heartbeats are fire-and-forget, as upstream; `.delete`
    /// supersedes; everything else is tracked.
    fn delivery_class(&self) -> DeliveryClass {
        match (&self.target, &self.event_type) {
            (Target::EventProcessed, _) => DeliveryClass::Ack,
            (Target::Heartbeat, _) => DeliveryClass::Heartbeat,
            (_, EventType::Delete) => DeliveryClass::Delete,
            _ => DeliveryClass::Tracked,
        }
    }

    /// The event type: a newer spec-update replaces a pending spec-update, a newer
    /// status-update a pending status-update, and so on.
    fn coalesce_key(&self) -> &str {
        self.event_type.as_str()
    }
}
