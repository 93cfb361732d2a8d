//! One Application change, one trace: the spawned principal and agent export their spans over
//! OTLP/gRPC (`--otlp-address`) to an in-process receiver, and the principal's span for the hub
//! change and the agent's span for the spoke write share a trace id, the agent's span a child
//! of the principal's through the event's `traceparent` (docs/operations/tracing.md).

use std::time::Duration;

use anyhow::{Context as _, Result};
use kube::api::PostParams;
use tests::fixtures::{application_without_finalizers, applications, dynamic};
use tests::otlp::{Receiver, Span, serve_receiver};
use tests::topology::{ARGOCD_NS, Mode, Topology};
use tests::{wait_for_async, wait_until_async};
use tokio_util::sync::CancellationToken;

const AGENT: &str = "agent-trace";
const APP: &str = "traced";
const WAIT: Duration = Duration::from_secs(60);

/// The principal's span of the hub change and the agent's span of the spoke write, when both
/// have arrived in one trace, the agent's a child of the principal's.
fn one_trace(spans: &[Span]) -> Option<(Span, Span)> {
    let principal = spans.iter().filter(|s| {
        s.service == "argocd-agent-principal"
            && s.name == "Application.create"
            && s.attributes.get("k8s.resource.name").map(String::as_str) == Some(APP)
    });
    for p in principal {
        let agent = spans.iter().find(|s| {
            s.service == "argocd-agent-agent"
                && s.name == "application.create"
                && s.trace_id == p.trace_id
                && s.parent_span_id == p.span_id
        });
        if let Some(a) = agent {
            return Some((p.clone(), a.clone()));
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_application_change_is_one_trace_across_principal_and_agent() -> Result<()> {
    let receiver = Receiver::default();
    let cancel = CancellationToken::new();
    let _stop_receiver = cancel.clone().drop_guard();
    let addr = serve_receiver(receiver.clone(), cancel).await?.to_string();

    let mut t = Topology::start_without_agents(&[(AGENT, Mode::Managed)]).await?;
    // Restart the principal with tracing on (SIGKILL: a SIGTERM this early could beat its
    // signal handler).
    t.kill_principal()?;
    t.set_principal_args(&["--otlp-address", &addr, "--otlp-sampling-ratio", "1.0"]);
    t.start_principal().await?;
    t.set_agent_args(&["--otlp-address", &addr]);
    t.start_agent(AGENT).await?;
    // Only a connected agent gets the hub change as an event (otherwise it comes with the
    // resync, in a trace of its own).
    wait_until_async(WAIT, "the agent to connect", || async { t.principal_connects(AGENT) >= 1 })
        .await
        .with_context(|| t.logs())?;

    let hub = applications(t.hub(), AGENT);
    hub.create(&PostParams::default(), &dynamic(application_without_finalizers(APP, AGENT, "HEAD"))?).await?;
    let spoke = applications(t.spoke(AGENT)?, ARGOCD_NS);
    wait_until_async(WAIT, "the Application to reach the spoke", || async {
        spoke.get_opt(APP).await.is_ok_and(|o| o.is_some())
    })
    .await
    .with_context(|| t.logs())?;

    let (p, a) = wait_for_async(WAIT, "one trace with the principal's and the agent's spans", || async {
        Ok(one_trace(&receiver.spans()))
    })
    .await
    .with_context(|| {
        let seen: Vec<String> = receiver
            .spans()
            .iter()
            .map(|s| {
                format!("{} {} trace={} span={} parent={}", s.service, s.name, s.trace_id, s.span_id, s.parent_span_id)
            })
            .collect();
        format!("spans received:\n{}\n{}", seen.join("\n"), t.logs())
    })?;

    // Upstream's attribute names on both sides.
    assert_eq!(p.attributes.get("argocd.component.type").map(String::as_str), Some("principal"), "{p:?}");
    assert_eq!(p.attributes.get("k8s.resource.kind").map(String::as_str), Some("Application"), "{p:?}");
    assert_eq!(p.attributes.get("k8s.resource.namespace").map(String::as_str), Some(AGENT), "{p:?}");
    assert_eq!(p.attributes.get("argocd.operation.type").map(String::as_str), Some("create"), "{p:?}");
    assert_eq!(a.attributes.get("argocd.component.type").map(String::as_str), Some("agent"), "{a:?}");
    assert_eq!(a.attributes.get("argocd.agent.name").map(String::as_str), Some(AGENT), "{a:?}");
    assert_eq!(a.attributes.get("argocd.agent.mode").map(String::as_str), Some("managed"), "{a:?}");
    assert_eq!(a.attributes.get("argocd.event.target").map(String::as_str), Some("application"), "{a:?}");
    assert_eq!(
        a.attributes.get("argocd.event.type").map(String::as_str),
        Some("io.argoproj.argocd-agent.event.create"),
        "{a:?}"
    );
    assert_eq!(a.attributes.get("k8s.resource.name").map(String::as_str), Some(APP), "{a:?}");

    // Status flows back in a trace of its own: the agent's spoke watch span, then the
    // principal's span for the status-update it sent.
    wait_until_async(WAIT, "a trace from the spoke watcher to the principal", || async {
        let spans = receiver.spans();
        spans.iter().any(|p| {
            p.service == "argocd-agent-principal"
                && p.name == "application.status-update"
                && spans.iter().any(|a| {
                    a.service == "argocd-agent-agent"
                        && a.name.starts_with("Application.")
                        && a.span_id == p.parent_span_id
                        && a.trace_id == p.trace_id
                })
        })
    })
    .await
    .with_context(|| t.logs())?;

    // SIGTERM: the exporter is flushed and the principal still exits cleanly and promptly.
    t.stop_principal(Duration::from_secs(20))?;
    Ok(())
}
