//! The wire protocol shared by principal and agent, compatible with upstream argocd-agent.
//!
//! * [`pb`]: generated gRPC code (authapi, eventstreamapi, versionapi, logstreamapi,
//!   terminalstreamapi, io.cloudevents.v1);
//! * [`event`]: the typed CloudEvent envelope and the event catalogue;
//! * [`payload`]: JSON payloads and the typed [`payload::Payload`] view of an event;
//! * [`argocd`]: Argo CD and Kubernetes objects that round-trip unknown fields;
//! * [`checksum`]: upstream-compatible resync checksums;
//! * [`outbox`]: the delivery engine (per-resource outbox, ACKs, coalescing, retries);
//! * [`fuzzing`]: the decoding entry point shared by the fuzz target and unit tests;
//! * [`replication`]: the events a cross-hub HA pair replicates, encoded and decoded;
//! * [`resp`]: RESP framing, commands and replies for the Redis proxy;
//! * [`trace`]: W3C trace context (`traceparent`/`tracestate`) parsing; [`otel`] (feature
//!   `otel`) joins it to `tracing` spans.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod argocd;
pub mod checksum;
pub mod event;
pub mod fuzzing;
pub mod glob;
pub mod grpc_codec;
#[cfg(feature = "kube")]
pub mod kube_store;
pub mod merge_patch;
pub mod metrics;
pub mod mode;
#[cfg(feature = "otel")]
pub mod otel;
pub mod outbox;
pub mod payload;
pub mod pb;
pub mod remotecommand;
pub mod replication;
pub mod resp;
pub mod selector;
pub mod trace;

pub use event::{Event, EventError, EventType, Target};
pub use outbox::Outbox;
pub use payload::Payload;

pub use mode::{AgentMode, InvalidAgentMode};
