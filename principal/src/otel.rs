//! Tracing spans of the principal (docs/operations/tracing.md): one per hub watch event that
//! concerns agents, and one per event received from an agent, joined to the agent's trace
//! through the event's `traceparent`. Exported only when the binary installs an
//! OpenTelemetry layer (`--otlp-address`); otherwise these are ordinary `tracing` spans whose
//! fields show up in the logs.

use protocol::Event;
use protocol::argocd::ObjectMeta;
use protocol::otel;

use crate::peer::AgentPeer;

/// `argocd.component.type` of every principal span.
const COMPONENT: &str = "principal";

/// The span of a hub watch event: upstream's `<Kind>.<create|update|delete>`, with the
/// resource and, for an object in an agent's namespace, that agent. Events built while it is
/// entered carry its trace context ([`crate::sync::hub::Hub::object_event`]).
pub(crate) fn hub_event_span(kind: &'static str, operation: &'static str, meta: &ObjectMeta) -> tracing::Span {
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    let span = tracing::info_span!("hub_event", otel.name = %format!("{kind}.{operation}"), otel.kind = "producer",
        kind, operation, namespace, name);
    otel::record_resource(&span, kind, meta, operation);
    otel::set_attribute(&span, otel::ATTR_COMPONENT, COMPONENT);
    span
}

/// The span of an event received from `session`'s agent: upstream's `<target>.<type>`, a
/// child of the agent's span when the event carries a valid `traceparent`.
pub(crate) fn received_span(session: &AgentPeer, ev: &Event) -> tracing::Span {
    let span = tracing::info_span!("inbound", otel.name = %otel::received_span_name(ev), otel.kind = "consumer",
        agent = %session.name(), mode = %session.mode(), event_type = %ev.event_type, target = %ev.target,
        resource_id = %ev.resource_id, event_id = %ev.event_id);
    otel::set_parent(&span, &ev.trace);
    otel::record_agent(&span, COMPONENT, session.name(), session.mode().as_str());
    otel::record_event(&span, ev);
    span
}
