//! Connecting an event's W3C trace context ([`crate::trace`]) to `tracing` spans exported by
//! `tracing-opentelemetry` (feature `otel`; only the OpenTelemetry API, never the SDK).
//!
//! Without an OpenTelemetry layer installed (no `--otlp-address`) every function here does
//! nothing: spans have no OpenTelemetry context, nothing is injected, and an incoming
//! `traceparent` is left as it is on the event.
//!
//! Span attributes use upstream's names (`internal/tracing/attributes.go`, upstream §8.2).

use std::str::FromStr as _;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::event::{Event, TYPE_PREFIX, TraceContext};
use crate::trace::{FLAG_SAMPLED, TraceParent};

/// Attribute `argocd.agent.name`.
pub const ATTR_AGENT_NAME: &str = "argocd.agent.name";
/// Attribute `argocd.agent.mode`.
pub const ATTR_AGENT_MODE: &str = "argocd.agent.mode";
/// Attribute `argocd.component.type` (`principal` or `agent`).
pub const ATTR_COMPONENT: &str = "argocd.component.type";
/// Attribute `argocd.event.id`.
pub const ATTR_EVENT_ID: &str = "argocd.event.id";
/// Attribute `argocd.event.target`.
pub const ATTR_EVENT_TARGET: &str = "argocd.event.target";
/// Attribute `argocd.event.type`.
pub const ATTR_EVENT_TYPE: &str = "argocd.event.type";
/// Attribute `argocd.operation.type` (`create`, `update`, `delete`).
pub const ATTR_OPERATION: &str = "argocd.operation.type";
/// Attribute `k8s.resource.kind`.
pub const ATTR_RESOURCE_KIND: &str = "k8s.resource.kind";
/// Attribute `k8s.resource.name`.
pub const ATTR_RESOURCE_NAME: &str = "k8s.resource.name";
/// Attribute `k8s.resource.namespace`.
pub const ATTR_RESOURCE_NAMESPACE: &str = "k8s.resource.namespace";
/// Attribute `k8s.resource.uid`.
pub const ATTR_RESOURCE_UID: &str = "k8s.resource.uid";

/// The OpenTelemetry context of a remote parent, from an event's trace context; `None` when
/// there is no valid `traceparent`. An invalid `tracestate` is dropped.
#[must_use]
pub fn remote_context(trace: &TraceContext) -> Option<opentelemetry::Context> {
    let parent = trace.parent()?;
    let state = trace.state().and_then(|s| TraceState::from_str(s).ok()).unwrap_or_default();
    let span_context = SpanContext::new(
        TraceId::from_bytes(parent.trace_id),
        SpanId::from_bytes(parent.parent_id),
        TraceFlags::new(parent.flags & FLAG_SAMPLED),
        true,
        state,
    );
    Some(opentelemetry::Context::new().with_remote_span_context(span_context))
}

/// Makes the event's sender span the parent of `span` (a span not yet entered). Does nothing
/// without a valid `traceparent` or without an OpenTelemetry layer.
pub fn set_parent(span: &tracing::Span, trace: &TraceContext) {
    if let Some(cx) = remote_context(trace) {
        // Fails only without the layer or for a span already started: then there is no
        // trace to join, which is the documented behaviour.
        let _ = span.set_parent(cx);
    }
}

/// The trace context naming `span` as the parent, `None` when `span` has no valid
/// OpenTelemetry context (no layer, or a disabled span).
#[must_use]
pub fn context_of(span: &tracing::Span) -> Option<TraceContext> {
    let cx = span.context();
    let otel_span = cx.span();
    let sc = otel_span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let parent = TraceParent {
        trace_id: sc.trace_id().to_bytes(),
        parent_id: sc.span_id().to_bytes(),
        flags: sc.trace_flags().to_u8() & FLAG_SAMPLED,
    };
    let state = sc.trace_state().header();
    Some(TraceContext::from_parent(&parent, Some(&state)))
}

/// Writes `span`'s context into the event's `traceparent`/`tracestate`, so the receiver's
/// span joins the trace. Leaves the event as it is when `span` has no context.
pub fn inject(span: &tracing::Span, event: &mut Event) {
    if let Some(trace) = context_of(span) {
        event.trace = trace;
    }
}

/// Writes the current span's context into the event (see [`inject`]).
pub fn inject_current(event: &mut Event) {
    inject(&tracing::Span::current(), event);
}

/// The event type without upstream's prefix: `create`, `status-update`, or the raw type of an
/// unknown or HTTP-method event.
#[must_use]
pub fn short_type(event: &Event) -> &str {
    let t = event.event_type.as_str();
    t.strip_prefix(TYPE_PREFIX).and_then(|s| s.strip_prefix('.')).unwrap_or(t)
}

/// Upstream's name for the span that processes a received event: `<target>.<type>`, e.g.
/// `application.create`.
#[must_use]
pub fn received_span_name(event: &Event) -> String {
    format!("{}.{}", event.target, short_type(event))
}

/// Sets the `argocd.event.*` and `k8s.resource.{name,namespace}` attributes of `event` on
/// `span` (`k8s.resource.*` from the event's `subject`).
pub fn record_event(span: &tracing::Span, event: &Event) {
    span.set_attribute(ATTR_EVENT_ID, event.event_id.clone());
    span.set_attribute(ATTR_EVENT_TARGET, event.target.to_string());
    span.set_attribute(ATTR_EVENT_TYPE, event.event_type.to_string());
    if let Some((namespace, name)) = event.subject.as_deref().and_then(|s| s.split_once('/')) {
        span.set_attribute(ATTR_RESOURCE_NAMESPACE, namespace.to_owned());
        span.set_attribute(ATTR_RESOURCE_NAME, name.to_owned());
    }
}

/// Sets one attribute on `span` (without an OpenTelemetry layer: nothing).
pub fn set_attribute(span: &tracing::Span, key: &'static str, value: impl Into<opentelemetry::Value>) {
    span.set_attribute(key, value);
}

/// Sets `argocd.component.type`, `argocd.agent.name` and `argocd.agent.mode` on `span`.
pub fn record_agent(span: &tracing::Span, component: &'static str, agent: &str, mode: &str) {
    span.set_attribute(ATTR_COMPONENT, component);
    span.set_attribute(ATTR_AGENT_NAME, agent.to_owned());
    span.set_attribute(ATTR_AGENT_MODE, mode.to_owned());
}

/// Sets `k8s.resource.{kind,name,namespace,uid}` and `argocd.operation.type` on `span`.
pub fn record_resource(
    span: &tracing::Span,
    kind: &'static str,
    meta: &crate::argocd::ObjectMeta,
    operation: &'static str,
) {
    span.set_attribute(ATTR_RESOURCE_KIND, kind);
    span.set_attribute(ATTR_RESOURCE_NAME, meta.name.clone().unwrap_or_default());
    span.set_attribute(ATTR_RESOURCE_NAMESPACE, meta.namespace.clone().unwrap_or_default());
    if let Some(uid) = &meta.uid {
        span.set_attribute(ATTR_RESOURCE_UID, uid.clone());
    }
    span.set_attribute(ATTR_OPERATION, operation);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventType, Target};

    #[test]
    fn remote_context_follows_the_traceparent() {
        let trace = TraceContext {
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            tracestate: Some("rojo=00f067aa0ba902b7".into()),
        };
        let cx = remote_context(&trace).unwrap();
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(sc.trace_state().header(), "rojo=00f067aa0ba902b7");
        assert!(remote_context(&TraceContext { traceparent: Some("nonsense".into()), tracestate: None }).is_none());
        assert!(remote_context(&TraceContext::default()).is_none());
    }

    #[test]
    fn without_a_layer_nothing_is_injected() {
        let mut ev = Event::new(EventType::Create, Target::Application, "r", "e");
        ev.trace.traceparent = Some("kept".into());
        inject(&tracing::info_span!("x"), &mut ev);
        assert_eq!(ev.trace.traceparent.as_deref(), Some("kept"));
        assert_eq!(received_span_name(&ev), "application.create");
        let get = Event::new(EventType::parse("GET"), Target::Resource, "r", "e");
        assert_eq!(received_span_name(&get), "resource.GET");
    }
}
