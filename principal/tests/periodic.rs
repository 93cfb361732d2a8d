//! The principal's half of the periodic resync: a managed agent's digest that agrees with the
//! hub is answered with nothing (`in_sync`); one that differs makes the principal list the hub's
//! resources and ask for the agent's (`repaired`), in upstream's own resync events.

mod common;

use std::time::Duration;

use common::{Harness, RawStream, next_event, open_insecure};
use kube::api::PostParams;
use protocol::checksum::{RESYNC_KIND_APPLICATION, ResourceKey, spec_checksum, spec_digest};
use protocol::payload::{DIGEST_SPEC, RequestSyncedResourceList};
use protocol::{Event, EventType, Payload, Target};
use serde_json::json;

const AGENT: &str = "agent-periodic";

/// Reads events, ACKing each, until `pred` holds for one; returns all read.
async fn read_acking(
    s: &mut RawStream,
    what: &str,
    mut pred: impl FnMut(&Event) -> bool,
) -> anyhow::Result<Vec<Event>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    loop {
        let ev = next_event(&mut s.inbound, deadline).await.map_err(|e| anyhow::anyhow!("waiting for {what}: {e}"))?;
        if !ev.is_ack() {
            s.tx.send(ev.processed_ack().to_wire()).await?;
        }
        let done = pred(&ev);
        seen.push(ev);
        if done {
            return Ok(seen);
        }
    }
}

async fn send_digest(s: &RawStream, digest: Option<Vec<u8>>) -> anyhow::Result<()> {
    let request = RequestSyncedResourceList { checksum: digest, digest: Some(DIGEST_SPEC.to_owned()) };
    let ev =
        Event::request(EventType::RequestSyncedResourceList, Target::ResourceResync, "periodic").with_json(&request)?;
    s.tx.send(ev.to_wire()).await?;
    Ok(())
}

fn count(result: &str) -> f64 {
    let text = principal::metrics::global().render(None);
    let series = format!("argocd_principal_resyncs_total{{agent_name=\"{AGENT}\",result=\"{result}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&series)?.trim().parse().ok()).unwrap_or(0.0)
}

#[tokio::test]
async fn an_agreeing_digest_gets_nothing_and_a_differing_one_the_resync() -> anyhow::Result<()> {
    let h = Harness::start(&[AGENT], |c| c.resync_min_interval = Duration::ZERO).await?;
    let app = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "web", "namespace": AGENT},
        "spec": {"project": "default", "source": {"repoURL": "https://example.com/r.git", "path": "p"},
                 "destination": {"server": "https://kubernetes.default.svc", "namespace": "web"}},
    });
    let mut s = open_insecure(&h.url, AGENT, "managed").await?;
    // On connect the principal asks for the agent's resources; then the Application arrives.
    read_acking(&mut s, "the on-connect resync", |e| e.event_type == EventType::RequestResourceResync).await?;
    h.apps(AGENT).create(&PostParams::default(), &serde_json::from_value(app)?).await?;
    let mut created = None;
    read_acking(&mut s, "the Application", |e| {
        if e.event_type == EventType::Create && e.target == Target::Application {
            created = e.data.as_deref().cloned();
        }
        created.is_some()
    })
    .await?;
    let held = created.ok_or_else(|| anyhow::anyhow!("no Application"))?;

    // The digest the agent computes of the copy it holds, which the principal agrees with.
    let typed: protocol::argocd::Application = serde_json::from_value(held.clone())?;
    let key = ResourceKey::from_meta(RESYNC_KIND_APPLICATION, &typed.metadata);
    let spec = spec_checksum(&held)?;
    let agreeing = spec_digest([(&key, Some(&spec[..]))]).map(|d| d.to_vec());
    send_digest(&s, agreeing).await?;
    // One that differs: another spec.
    let other = spec_digest([(&key, Some(&[0_u8; 32][..]))]).map(|d| d.to_vec());
    send_digest(&s, other).await?;

    let seen = read_acking(&mut s, "the resync a differing digest starts", |e| {
        e.event_type == EventType::RequestResourceResync
    })
    .await?;
    let listed: Vec<_> = seen
        .iter()
        .filter(|e| e.event_type == EventType::ResponseSyncedResource)
        .filter_map(|e| match e.payload() {
            Ok(Payload::SyncedResource(r)) => Some(r.name),
            _ => None,
        })
        .collect();
    assert_eq!(listed, vec!["web".to_owned()], "the hub's resources, listed once: {seen:?}");
    assert_eq!((count("in_sync"), count("repaired")), (1.0, 1.0), "the first digest agreed, the second did not");
    h.stop().await
}
