//! Tracing spans of the agent (docs/operations/tracing.md): one per event from the principal,
//! a child of the principal's span through the event's `traceparent` and covering the spoke
//! write, and one per spoke watch event, whose context the events it queues for the principal
//! carry. Exported only when the binary installs an OpenTelemetry layer (`--otlp-address`).

use protocol::Event;
use protocol::argocd::ObjectMeta;
use protocol::otel;

use crate::config::AgentConfig;

/// `argocd.component.type` of every agent span.
const COMPONENT: &str = "agent";

/// The span of an event from the principal: upstream's `<target>.<type>`, parented on the
/// event's trace context.
pub(crate) fn received_span(config: &AgentConfig, ev: &Event) -> tracing::Span {
    let span = tracing::info_span!("inbound", otel.name = %otel::received_span_name(ev), otel.kind = "consumer",
        agent = %config.name, mode = %config.mode, event_type = %ev.event_type, target = %ev.target,
        resource_id = %ev.resource_id, event_id = %ev.event_id);
    otel::set_parent(&span, &ev.trace);
    otel::record_agent(&span, COMPONENT, &config.name, config.mode.as_str());
    otel::record_event(&span, ev);
    span
}

/// The span of a spoke watch event: upstream's `<Kind>.<create|update|delete>`. Events queued
/// while it is entered carry its trace context ([`crate::spoke::Spoke::send_object`]).
pub(crate) fn spoke_event_span(
    config: &AgentConfig,
    kind: &'static str,
    operation: &'static str,
    meta: &ObjectMeta,
) -> tracing::Span {
    let name = meta.name.as_deref().unwrap_or_default();
    let span = tracing::info_span!("spoke_event", otel.name = %format!("{kind}.{operation}"), otel.kind = "producer",
        agent = %config.name, mode = %config.mode, kind, operation, name);
    otel::record_agent(&span, COMPONENT, &config.name, config.mode.as_str());
    otel::record_resource(&span, kind, meta, operation);
    span
}
