//! Status from a managed agent onto the hub Application: the principal writes it as one
//! conditional merge patch against its watch cache, and falls back to read-modify-write when
//! the hub has moved on (409). Either way the hub must end up with exactly the agent's status
//! and operation: removed fields removed, a concurrent writer's fields not left behind. The
//! principal reaches the hub through proxies, so the test decides whether its watch cache has
//! seen a concurrent writer's change, and asserts which path the write took.

mod common;

use anyhow::Context as _;
use common::{Harness, ProxyMode, RawStream, is_ack_of, open_insecure, read_until, wait_until};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use protocol::argocd::annotations::LAST_UPDATED;
use protocol::{Event, EventType, Payload, Target};
use serde_json::{Value, json};

const AGENT: &str = "agent-status";

/// Sends a `status-update` for Application `app` with `status` and `operation` (`None`:
/// absent), `rv` as its spoke resourceVersion, and waits for its ACK.
async fn send_status(s: &mut RawStream, rv: u32, status: Value, operation: Option<Value>) -> anyhow::Result<()> {
    let mut app = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "app", "namespace": "argocd", "uid": "spoke-uid", "resourceVersion": rv.to_string()},
        "spec": {"project": "default"},
        "status": status,
    });
    if let Some(op) = operation {
        app["operation"] = op;
    }
    let typed: protocol::argocd::Application = serde_json::from_value(app)?;
    let ev = Event::for_object(EventType::StatusUpdate, Target::Application, &typed.metadata, &typed)?;
    s.tx.send(ev.to_wire()).await?;
    read_acking(s, "the status update's ACK", |e| is_ack_of(e, &ev.resource_id)).await?;
    Ok(())
}

/// Reads events until `pred` holds for one, and ACKs what it read, as an agent does: the
/// principal sends an Application's next event only once the one before is ACKed.
async fn read_acking(s: &mut RawStream, what: &str, pred: impl FnMut(&Event) -> bool) -> anyhow::Result<Vec<Event>> {
    let seen = read_until(&mut s.inbound, what, pred).await?;
    for ev in seen.iter().filter(|e| !e.is_ack()) {
        s.tx.send(ev.processed_ack().to_wire()).await?;
    }
    Ok(seen)
}

/// Waits until the hub Application's `status` and `operation` are exactly these.
async fn hub_has(h: &Harness, status: &Value, operation: Option<&Value>) -> anyhow::Result<DynamicObject> {
    let apps = h.apps(AGENT);
    let last = std::sync::Arc::new(std::sync::Mutex::new(None::<DynamicObject>));
    let what = format!("the hub Application has status {status} and operation {operation:?}");
    let found = wait_until(&what, || {
        let (apps, last) = (apps.clone(), last.clone());
        async move {
            let app = apps.get("app").await?;
            let ok = app.data.get("status") == Some(status) && app.data.get("operation") == operation;
            *last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(app);
            Ok(ok)
        }
    })
    .await;
    let last = last.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    match (found, last) {
        (Ok(()), Some(app)) => Ok(app),
        (Err(e), last) => Err(e.context(format!("last seen: {:?}", last.map(|a| a.data)))),
        (Ok(()), None) => anyhow::bail!("no Application read"),
    }
}

#[tokio::test]
async fn status_updates_replace_the_hub_status_exactly_and_survive_a_concurrent_writer() -> anyhow::Result<()> {
    let h = Harness::start_behind_proxies(&[AGENT], |_| {}).await?;
    let hub_app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "app", "namespace": AGENT},
        "spec": {"project": "default", "destination": {"server": "https://kubernetes.default.svc"}},
    }))?;
    let mut s = open_insecure(&h.url, AGENT, "managed").await?;
    h.apps(AGENT).create(&PostParams::default(), &hub_app).await?;
    read_acking(&mut s, "the Application's create", |e| e.event_type == EventType::Create).await?;

    // A first status, then one that drops and changes nested fields and a list.
    let first = json!({"sync": {"status": "Synced", "revision": "a"},
        "health": {"status": "Progressing", "message": "rolling out"}, "resources": [{"name": "x"}, {"name": "y"}]});
    send_status(&mut s, 1, first.clone(), Some(json!({"sync": {"revision": "a"}}))).await?;
    hub_has(&h, &first, Some(&json!({"sync": {"revision": "a"}}))).await?;

    let second = json!({"sync": {"status": "OutOfSync", "revision": "a"},
        "health": {"status": "Healthy"}, "resources": [{"name": "x"}]});
    send_status(&mut s, 2, second.clone(), None).await?;
    let app = hub_has(&h, &second, None).await?;
    let annotations = app.metadata.annotations.unwrap_or_default();
    assert!(annotations.contains_key(LAST_UPDATED), "the status write stamps {LAST_UPDATED}: {annotations:?}");

    // Another writer changes the hub status while the principal's watch is held back, so its
    // cache still has the version before: the conditional patch is refused (409) and the
    // read-modify-write replaces the status whole.
    let proxies = h.proxies.as_ref().context("proxies")?;
    proxies.watches.set(ProxyMode::Hold);
    let patch = Patch::Merge(json!({"status": {"foreign": "left by another writer", "health": {"message": "x"}}}));
    h.apps(AGENT).patch("app", &PatchParams::default(), &patch).await?;
    let before = h.principal.status_write_paths();
    let third = json!({"sync": {"status": "Synced", "revision": "b"}, "health": {"status": "Healthy"}});
    send_status(&mut s, 3, third.clone(), None).await?;
    let after = h.principal.status_write_paths();
    assert_eq!(
        (
            after.patched - before.patched,
            after.patch_refused - before.patch_refused,
            after.read_modify_write - before.read_modify_write
        ),
        (0, 1, 1),
        "a stale cache: the patch is refused and the read-modify-write runs ({before:?} -> {after:?})"
    );
    hub_has(&h, &third, None).await?;
    proxies.watches.set(ProxyMode::Open);

    // Again with the writer's change seen by the principal's cache first (its spec change
    // reaches the agent only through the watch): the one-request patch itself must remove
    // the foreign fields.
    let patch = Patch::Merge(json!({"spec": {"source": {"path": "moved"}},
        "status": {"foreign": "left by another writer", "health": {"message": "x"}}}));
    h.apps(AGENT).patch("app", &PatchParams::default(), &patch).await?;
    read_acking(&mut s, "the writer's change, through the principal's watch", |e| {
        e.event_type == EventType::SpecUpdate
            && e.payload().is_ok_and(|p| {
                matches!(p, Payload::Application(a)
                if a.spec.source.as_ref().and_then(|src| src.get("path")) == Some(&json!("moved")))
            })
    })
    .await?;
    let with_foreign = json!({"sync": {"status": "Synced", "revision": "b"},
        "health": {"status": "Healthy", "message": "x"}, "foreign": "left by another writer"});
    hub_has(&h, &with_foreign, None).await?;
    let before = h.principal.status_write_paths();
    let fourth = json!({"sync": {"status": "Synced", "revision": "c"}, "health": {"status": "Degraded"}});
    send_status(&mut s, 4, fourth.clone(), Some(json!({"sync": {"revision": "c"}}))).await?;
    let after = h.principal.status_write_paths();
    assert_eq!(
        (
            after.patched - before.patched,
            after.patch_refused - before.patch_refused,
            after.read_modify_write - before.read_modify_write
        ),
        (1, 0, 0),
        "a current cache: one conditional patch ({before:?} -> {after:?})"
    );
    hub_has(&h, &fourth, Some(&json!({"sync": {"revision": "c"}}))).await?;
    h.stop().await
}
