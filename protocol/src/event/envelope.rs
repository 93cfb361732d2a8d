//! The typed event: a CloudEvent with argocd-agent's extensions pulled out into fields.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::argocd::ObjectMeta;

use super::attributes::{AttributeValue, CONTENT_TYPE_JSON, TraceContext};
use super::data::JsonData;
use super::{EventError, EventType, Target};

/// One argocd-agent event, as principal and agent handle it.
///
/// The CloudEvent attributes that argocd-agent gives meaning to are typed fields; every other
/// attribute is kept in [`extensions`](Self::extensions) and sent on again unchanged. Convert
/// from and to the wire with [`Event::from_proto`] / [`Event::to_proto`] (module `convert`).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// CloudEvent `id`. Upstream never sets it (empty on events from Go peers); our
    /// constructors fill in a random UUID. Correlation uses `resource_id`/`event_id`.
    pub id: String,
    /// CloudEvent `source`. Upstream's principal sends `""`, its agent
    /// `"agent://agent-managed"`; never use it for identity.
    pub source: String,
    /// CloudEvent `type`.
    pub event_type: EventType,
    /// CloudEvent `dataschema`: the event target receivers route on.
    pub target: Target,
    /// CloudEvent `subject`: `<namespace>/<name>` for object events.
    pub subject: Option<String>,
    /// CloudEvent `time`.
    pub time: Option<DateTime<Utc>>,
    /// CloudEvent `datacontenttype` (`application/json` when there is data).
    pub data_content_type: Option<String>,
    /// Extension `resourceid`: the per-resource delivery key (never empty after decoding).
    pub resource_id: String,
    /// Extension `eventid`: identifies this version of the resource; ACKs match on it.
    pub event_id: String,
    /// Extension `sentat`: when the event was (first) transmitted.
    pub sent_at: Option<DateTime<Utc>>,
    /// Extension `principaluid`: the principal's identity.
    pub principal_uid: Option<String>,
    /// Extensions `traceparent` / `tracestate`.
    pub trace: TraceContext,
    /// Every other attribute, by name, kept verbatim.
    pub extensions: BTreeMap<String, AttributeValue>,
    /// The JSON payload, if any; copies of the event share it (and its encoding).
    pub data: Option<JsonData>,
}

impl Event {
    /// A new event without data: random CloudEvent id, empty source.
    #[must_use]
    pub fn new(
        event_type: EventType,
        target: Target,
        resource_id: impl Into<String>,
        event_id: impl Into<String>,
    ) -> Self {
        Self {
            id: new_uuid(),
            source: String::new(),
            event_type,
            target,
            subject: None,
            time: None,
            data_content_type: None,
            resource_id: resource_id.into(),
            event_id: event_id.into(),
            sent_at: None,
            principal_uid: None,
            trace: TraceContext::default(),
            extensions: BTreeMap::new(),
            data: None,
        }
    }

    /// An event about a Kubernetes object: `resourceid` = `<name>_<uid>`, `eventid` =
    /// `<name>_<uid>_<resourceVersion>`, `subject` = `<namespace>/<name>`, and the object as
    /// JSON data.
    ///
    /// # Errors
    ///
    /// [`EventError::Serialize`] if the object cannot be serialised.
    pub fn for_object<T: Serialize>(
        event_type: EventType,
        target: Target,
        meta: &ObjectMeta,
        object: &T,
    ) -> Result<Self, EventError> {
        let mut ev = Self::new(event_type, target, meta.resource_id(), meta.event_id());
        ev.subject = Some(format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        ));
        ev.with_json(object)
    }

    /// A request (resource, log, redis, terminal, resync): `resourceid` and `eventid` are both
    /// the request UUID.
    #[must_use]
    pub fn request(event_type: EventType, target: Target, request_uuid: &str) -> Self {
        Self::new(event_type, target, request_uuid, request_uuid)
    }

    /// A response to a request: a fresh `resourceid`, `eventid` = the request's UUID.
    #[must_use]
    pub fn response(event_type: EventType, target: Target, request_uuid: &str) -> Self {
        Self::new(event_type, target, new_uuid(), request_uuid)
    }

    /// The agent's heartbeat: `.ping` on target `heartbeat`, no data.
    #[must_use]
    pub fn heartbeat() -> Self {
        let id = new_uuid();
        Self::new(EventType::Ping, Target::Heartbeat, id.clone(), id)
    }

    /// The `.processed` ACK for this event: target `eventProcessed`, no data, and every
    /// extension of this event copied (as upstream's `ProcessedEvent` does).
    #[must_use]
    pub fn processed_ack(&self) -> Self {
        Self {
            id: new_uuid(),
            source: self.source.clone(),
            event_type: EventType::Processed,
            target: Target::EventProcessed,
            subject: None,
            time: None,
            data_content_type: None,
            resource_id: self.resource_id.clone(),
            event_id: self.event_id.clone(),
            sent_at: self.sent_at,
            principal_uid: self.principal_uid.clone(),
            trace: self.trace.clone(),
            extensions: self.extensions.clone(),
            data: None,
        }
    }

    /// Sets `source`.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    /// Sets `principaluid`.
    #[must_use]
    pub fn with_principal_uid(mut self, uid: impl Into<String>) -> Self {
        self.principal_uid = Some(uid.into());
        self
    }

    /// Serialises `data` as the JSON payload and sets `datacontenttype: application/json`.
    ///
    /// # Errors
    ///
    /// [`EventError::Serialize`] if `data` cannot be serialised.
    pub fn with_json<T: Serialize + ?Sized>(mut self, data: &T) -> Result<Self, EventError> {
        self.data = Some(JsonData::new(serde_json::to_value(data).map_err(EventError::Serialize)?));
        self.data_content_type = Some(CONTENT_TYPE_JSON.to_owned());
        Ok(self)
    }

    /// Stamps `sentat` with `now` unless it is already set (upstream stamps on first
    /// transmission).
    pub fn stamp_sent_at(&mut self, now: DateTime<Utc>) {
        self.sent_at.get_or_insert(now);
    }

    /// Whether this is an ACK (`eventProcessed` target).
    #[must_use]
    pub fn is_ack(&self) -> bool {
        self.target == Target::EventProcessed
    }

    /// Deserialises the JSON payload into `T`.
    ///
    /// # Errors
    ///
    /// [`EventError::MissingData`] without data, [`EventError::PayloadMismatch`] when the JSON
    /// does not fit `T`.
    pub fn data_as<T: DeserializeOwned>(&self) -> Result<T, EventError> {
        let data = self.data.as_ref().ok_or_else(|| EventError::MissingData {
            event_type: self.event_type.clone(),
            target: self.target.clone(),
        })?;
        T::deserialize(data.value()).map_err(|source| EventError::PayloadMismatch {
            event_type: self.event_type.clone(),
            target: self.target.clone(),
            source,
        })
    }
}

/// A random (v4) UUID in its hyphenated lower-case form, as Go's `uuid.NewString()`.
#[must_use]
pub fn new_uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}
