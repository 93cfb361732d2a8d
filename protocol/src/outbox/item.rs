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

/// Which part of an object an item carries, for ordering by the object's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VersionFamily {
    /// The object itself (create, spec update, ...).
    Spec,
    /// Its status.
    Status,
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
    /// For items that carry a state of a versioned object: which part, and the object's version
    /// (Kubernetes `resourceVersion`). An item older than one of the same resource and family
    /// already accepted is dropped, so an older state never follows a newer one. `None`: not
    /// ordered by version.
    fn version(&self) -> Option<(VersionFamily, u64)> {
        None
    }
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

    /// Object events have `eventid` = `<resourceid>_<resourceVersion>` ([`Event::for_object`]);
    /// a numeric resourceVersion orders them (requests, responses and non-numeric versions are
    /// not ordered). Status updates are their own family: they do not compete with the spec.
    /// A delete is never dropped, but moves the spec family's version to its own.
    fn version(&self) -> Option<(VersionFamily, u64)> {
        if self.event_id.len() <= self.resource_id.len() {
            return None;
        }
        let version = self.event_id.strip_prefix(self.resource_id.as_str())?.strip_prefix('_')?.parse().ok()?;
        let family =
            if self.event_type == EventType::StatusUpdate { VersionFamily::Status } else { VersionFamily::Spec };
        Some((family, version))
    }
}
