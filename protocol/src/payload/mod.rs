//! JSON payload types (upstream's `internal/event`; docs/compatibility.md) and [`Payload`], the typed view of
//! an event's data chosen by its target and type.
//!
//! Payload structs decode the way Go's `encoding/json` does into upstream's structs: missing
//! fields take their zero value, and `[]byte` fields are base64 strings (`null` for nil).

pub mod go_bytes;
pub mod loglines;
pub mod redis;
pub mod resource;
pub mod resync;
pub mod session;
pub mod status;

pub use redis::{
    AppCacheKey, AppCacheKind, Empty, RedisCommandBody, RedisGet, RedisGetResponse, RedisPushFromSubscribe,
    RedisRequest, RedisResponse, RedisResponseBody, RedisSubscribe, RedisSubscribeResponse, strip_app_namespace,
};
pub use resource::{
    ApiPath, ApiPathError, ApiResource, QUERY_PARAMS, ResourceRequest, ResourceResponse, is_status, status_body,
    status_reason,
};
pub use resync::{DIGEST_SPEC, RequestResourceResync, RequestSyncedResourceList, RequestUpdate, SyncedResource};
pub use session::{ContainerLogRequest, ContainerTerminalRequest};
pub use status::{ClusterCacheInfo, ErrorData};

use crate::argocd::{AppProject, Application, ConfigMap, Secret};
use crate::event::{Event, EventError, EventType, Target};

/// An event's data, typed by its target and type.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// An Application (create, spec-update, status-update, set-operation, ...).
    Application(Box<Application>),
    /// An AppProject.
    AppProject(Box<AppProject>),
    /// A repository secret.
    Repository(Box<Secret>),
    /// The GPG keys ConfigMap.
    GpgKey(Box<ConfigMap>),
    /// An ApplicationSet, kept as JSON (never sent to agents).
    ApplicationSet(serde_json::Value),
    /// `.error` on target `application`.
    AgentError(ErrorData),
    /// A resource-proxy request (type = HTTP method).
    ResourceRequest(ResourceRequest),
    /// A resource-proxy response.
    ResourceResponse(ResourceResponse),
    /// A container log request (type = HTTP method).
    ContainerLogRequest(ContainerLogRequest),
    /// A web terminal request.
    TerminalRequest(ContainerTerminalRequest),
    /// A redis-proxy request.
    RedisRequest(RedisRequest),
    /// A redis-proxy response.
    RedisResponse(RedisResponse),
    /// Resync: the resource-set checksum.
    RequestSyncedResourceList(RequestSyncedResourceList),
    /// Resync: one tracked resource.
    SyncedResource(SyncedResource),
    /// Resync: a request for one resource.
    RequestUpdate(RequestUpdate),
    /// Resync: a request for `request-update`s.
    RequestResourceResync(RequestResourceResync),
    /// Cluster cache statistics.
    ClusterCacheInfo(ClusterCacheInfo),
    /// Events that carry no data: heartbeats and ACKs.
    Empty,
    /// A target/type combination this build does not know; the data as it came. The receiver
    /// should answer it (ACK) and log it, not fail.
    Unrecognised(Option<serde_json::Value>),
}

impl Event {
    /// Decodes the data into the payload type that the target and type call for.
    ///
    /// # Errors
    ///
    /// [`EventError::MissingData`] when a payload is required but absent,
    /// [`EventError::PayloadMismatch`] when the JSON does not fit.
    pub fn payload(&self) -> Result<Payload, EventError> {
        use EventType as T;
        Ok(match (&self.target, &self.event_type) {
            (Target::Heartbeat | Target::EventProcessed, _) => Payload::Empty,
            (Target::Application, T::Error) => Payload::AgentError(self.data_as()?),
            (Target::Application, t) if is_object_event(t) => Payload::Application(Box::new(self.data_as()?)),
            (Target::AppProject, t) if is_object_event(t) => Payload::AppProject(Box::new(self.data_as()?)),
            (Target::Repository, t) if is_object_event(t) => Payload::Repository(Box::new(self.data_as()?)),
            (Target::GpgKey, t) if is_object_event(t) => Payload::GpgKey(Box::new(self.data_as()?)),
            (Target::ApplicationSet, t) if is_object_event(t) => Payload::ApplicationSet(self.data_as()?),
            (Target::Resource, T::Response) => Payload::ResourceResponse(self.data_as()?),
            (Target::Resource, t) if t.is_http_method() => Payload::ResourceRequest(self.data_as()?),
            (Target::ContainerLog, t) if t.is_http_method() => Payload::ContainerLogRequest(self.data_as()?),
            (Target::Terminal, T::TerminalRequest) => Payload::TerminalRequest(self.data_as()?),
            (Target::Redis, T::RedisRequest) => Payload::RedisRequest(self.data_as()?),
            (Target::Redis, T::RedisResponse) => Payload::RedisResponse(self.data_as()?),
            (Target::ResourceResync, T::RequestSyncedResourceList) => {
                Payload::RequestSyncedResourceList(self.data_as()?)
            }
            (Target::ResourceResync, T::ResponseSyncedResource) => Payload::SyncedResource(self.data_as()?),
            (Target::ResourceResync, T::RequestUpdate) => Payload::RequestUpdate(self.data_as()?),
            (Target::ResourceResync, T::RequestResourceResync) => {
                // `{}` upstream; tolerate no data at all.
                Payload::RequestResourceResync(match self.data {
                    None => RequestResourceResync {},
                    Some(_) => self.data_as()?,
                })
            }
            (Target::ClusterCacheInfoUpdate, T::ClusterCacheInfoUpdate) => Payload::ClusterCacheInfo(self.data_as()?),
            _ => Payload::Unrecognised(self.data.as_ref().map(|d| d.value().clone())),
        })
    }
}

/// The types that carry a whole Kubernetes object.
fn is_object_event(t: &EventType) -> bool {
    matches!(
        t,
        EventType::Create
            | EventType::Delete
            | EventType::Update
            | EventType::SpecUpdate
            | EventType::StatusUpdate
            | EventType::OperationUpdate
            | EventType::SetOperation
            | EventType::TerminateOperation
    )
}
