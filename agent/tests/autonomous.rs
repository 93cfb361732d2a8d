//! Autonomous mode end to end: the spoke owns Applications; the hub keeps copies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agent::AgentMode;
use common::*;
use serde_json::{Value, json};

fn path(v: &Value) -> Option<&str> {
    v.pointer("/spec/source/path").and_then(Value::as_str)
}

fn annotation<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.pointer("/metadata/annotations").and_then(|a| a.get(key)).and_then(Value::as_str)
}

/// Upstream's `last-updated` annotation, which its principal stamps on every write of a hub copy.
const LAST_UPDATED: &str = "argocd-agent.argoproj.io/last-updated";

#[tokio::test]
async fn autonomous_app_lifecycle_create_update_status_operation_delete() {
    let env = Env::new(AgentMode::Autonomous).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    let created = create(&spoke, app_json("guestbook", SPOKE_NS, "guestbook")).await;
    let spoke_uid = created.metadata.uid.clone().unwrap();

    let copy = wait_obj(&hub, "guestbook", "hub copy created", |_| true).await;
    assert_eq!(annotation(&copy, "argocd.argoproj.io/source-uid"), Some(spoke_uid.as_str()));
    assert_eq!(copy.pointer("/spec/project").and_then(Value::as_str), Some("agent-1-default"));
    // As upstream: the agent's cluster by name, no server, the spoke's namespace kept.
    assert_eq!(copy.pointer("/spec/destination"), Some(&json!({"name": AGENT, "namespace": "guestbook"})));
    assert!(annotation(&copy, LAST_UPDATED).is_some(), "the create is stamped: {copy}");

    merge(&spoke, "guestbook", json!({"spec": {"source": {"path": "v2"}}})).await;
    let updated = wait_obj(&hub, "guestbook", "spec update up", |v| path(v) == Some("v2")).await;
    assert!(annotation(&updated, LAST_UPDATED).is_some(), "the update is stamped: {updated}");

    merge(&spoke, "guestbook", json!({"status": {"health": {"status": "Healthy"}}})).await;
    wait_obj(&hub, "guestbook", "status up", |v| {
        v.pointer("/status/health/status").and_then(Value::as_str) == Some("Healthy")
    })
    .await;

    // A sync requested on the hub goes down as set-operation.
    merge(&hub, "guestbook", json!({"operation": {"sync": {"revision": "HEAD"}}})).await;
    wait_obj(&spoke, "guestbook", "operation on the spoke", |v| v.pointer("/operation/sync/revision").is_some()).await;

    let refresh = json!({"metadata": {"annotations": {"argocd.argoproj.io/refresh": "normal"}}});
    merge(&hub, "guestbook", refresh).await;
    wait_obj(&spoke, "guestbook", "refresh request on the spoke", |v| {
        annotation(v, "argocd.argoproj.io/refresh") == Some("normal")
    })
    .await;

    delete(&spoke, "guestbook").await;
    wait_gone(&hub, "guestbook", "hub copy deleted").await;
    env.shutdown().await;
}

#[tokio::test]
async fn autonomous_delete_with_finalizers_follows_the_spoke() {
    let env = Env::new(AgentMode::Autonomous).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    let mut app = app_json("fin", SPOKE_NS, "guestbook");
    app["metadata"]["finalizers"] = json!(["resources-finalizer.argocd.argoproj.io"]);
    create(&spoke, app).await;
    wait_obj(&hub, "fin", "hub copy with finalizer", |v| v.pointer("/metadata/finalizers/0").is_some()).await;

    delete(&spoke, "fin").await;
    wait_obj(&hub, "fin", "hub copy being deleted too", |v| v.pointer("/metadata/deletionTimestamp").is_some()).await;
    merge(&spoke, "fin", json!({"metadata": {"finalizers": null}})).await;
    wait_gone(&spoke, "fin", "spoke app gone").await;
    wait_gone(&hub, "fin", "hub copy gone").await;
    env.shutdown().await;
}

#[tokio::test]
async fn autonomous_non_owner_edit_and_delete_on_the_hub_are_reverted() {
    let env = Env::new(AgentMode::Autonomous).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    create(&spoke, app_json("owned", SPOKE_NS, "guestbook")).await;
    let first = wait_obj(&hub, "owned", "hub copy", |_| true).await;

    merge(&hub, "owned", json!({"spec": {"source": {"path": "hacked"}}})).await;
    wait_obj(&hub, "owned", "hub edit reverted", |v| path(v) == Some("guestbook")).await;

    delete(&hub, "owned").await;
    let uid = first.pointer("/metadata/uid").cloned();
    wait_obj(&hub, "owned", "hub delete reverted", |v| v.pointer("/metadata/uid").cloned() != uid).await;
    assert_eq!(path(&get(&spoke, "owned").await.unwrap()), Some("guestbook"));
    env.shutdown().await;
}

#[tokio::test]
async fn autonomous_agent_and_principal_restarts_converge() {
    let mut env = Env::new(AgentMode::Autonomous).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    for name in ["a", "b", "c"] {
        create(&spoke, app_json(name, SPOKE_NS, "guestbook")).await;
    }
    for name in ["a", "b", "c"] {
        wait_obj(&hub, name, "initial hub copy", |_| true).await;
    }

    env.stop_agent().await;
    merge(&spoke, "a", json!({"spec": {"source": {"path": "v2"}}})).await;
    delete(&spoke, "b").await;
    create(&spoke, app_json("d", SPOKE_NS, "guestbook")).await;
    env.start_agent().await;
    wait_obj(&hub, "a", "update while the agent was down", |v| path(v) == Some("v2")).await;
    wait_gone(&hub, "b", "delete while the agent was down").await;
    wait_obj(&hub, "d", "create while the agent was down", |_| true).await;

    env.stop_principal().await;
    merge(&spoke, "a", json!({"spec": {"source": {"path": "v3"}}})).await;
    delete(&spoke, "c").await;
    create(&spoke, app_json("e", SPOKE_NS, "guestbook")).await;
    env.start_principal().await;
    wait_obj(&hub, "a", "update while the principal was down", |v| path(v) == Some("v3")).await;
    wait_gone(&hub, "c", "delete while the principal was down").await;
    wait_obj(&hub, "e", "create while the principal was down", |_| true).await;
    env.shutdown().await;
}

#[tokio::test]
async fn autonomous_appprojects_flow_up_as_renamed_copies() {
    let env = Env::new(AgentMode::Autonomous).await;
    let spoke = projects(&env.spoke.client, SPOKE_NS);
    let hub = projects(&env.hub.client, PRINCIPAL_NS);
    let project = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "dev", "namespace": SPOKE_NS},
        "spec": {
            "description": "one",
            "destinations": [{"server": "https://kubernetes.default.svc", "namespace": "guestbook"}],
            "roles": [{"name": "admin", "policies": ["p, proj:dev:admin, applications, get, dev/*, allow"]}],
        },
    });
    let created = create(&spoke, project).await;
    let copy = wait_obj(&hub, "agent-1-dev", "renamed project copy on the hub", |_| true).await;
    assert_eq!(annotation(&copy, "argocd.argoproj.io/source-uid"), created.metadata.uid.as_deref());
    assert_eq!(copy.pointer("/spec/sourceNamespaces/0").and_then(Value::as_str), Some(AGENT));
    assert_eq!(copy.pointer("/spec/destinations/0/name").and_then(Value::as_str), Some(AGENT));
    assert!(annotation(&copy, LAST_UPDATED).is_some(), "the project copy is stamped: {copy}");
    assert_eq!(
        copy.pointer("/spec/roles/0/policies/0").and_then(Value::as_str),
        Some("p, proj:agent-1-dev:admin, applications, get, agent-1-dev/agent-1/*, allow")
    );
    merge(&spoke, "dev", json!({"spec": {"description": "two"}})).await;
    let updated =
        wait_obj(&hub, "agent-1-dev", "project update up", |v| v.pointer("/spec/description") == Some(&json!("two")))
            .await;
    assert!(annotation(&updated, LAST_UPDATED).is_some(), "the project update is stamped: {updated}");
    delete(&spoke, "dev").await;
    wait_gone(&hub, "agent-1-dev", "project delete up").await;
    env.shutdown().await;
}

#[tokio::test]
async fn autonomous_agent_namespace_is_created_on_the_hub_when_enabled() {
    let env = Env::with_hub_namespaces(AgentMode::Autonomous, &[PRINCIPAL_NS], true).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    create(&spoke, app_json("first", SPOKE_NS, "guestbook")).await;
    wait_obj(&hub, "first", "hub copy in the created namespace", |_| true).await;
    env.shutdown().await;
}

#[tokio::test]
async fn autonomous_ignore_sync_label_removes_the_hub_copy() {
    let env = Env::new(AgentMode::Autonomous).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    create(&spoke, app_json("skip", SPOKE_NS, "guestbook")).await;
    wait_obj(&hub, "skip", "hub copy", |_| true).await;
    merge(&spoke, "skip", json!({"metadata": {"labels": {"argocd-agent.argoproj-labs.io/ignore-sync": "true"}}})).await;
    wait_gone(&hub, "skip", "hub copy of an ignored app removed").await;
    assert!(get(&spoke, "skip").await.is_some());
    env.shutdown().await;
}

/// An event too large for the stream is given up at once on the agent (logged; the next resync
/// repairs) instead of failing the stream on every reconnect: other resources keep flowing, and
/// a later, smaller state of the same resource goes through.
#[tokio::test]
async fn autonomous_oversized_event_is_given_up_and_the_stream_keeps_working() {
    let mut env = Env::new(AgentMode::Autonomous).await;
    env.stop_agent().await;
    env.max_message_bytes = Some(16 * 1024);
    env.start_agent().await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    let mut big = app_json("big", SPOKE_NS, "guestbook");
    big["metadata"]["annotations"] = json!({"filler": "x".repeat(64 * 1024)});
    create(&spoke, big).await;
    create(&spoke, app_json("small", SPOKE_NS, "guestbook")).await;
    wait_obj(&hub, "small", "a normal event after the oversized one", |_| true).await;
    assert!(get(&hub, "big").await.is_none(), "the oversized create must not reach the hub");

    merge(&spoke, "big", json!({"metadata": {"annotations": {"filler": null}}})).await;
    wait_obj(&hub, "big", "the resource's next, smaller state", |_| true).await;
    env.shutdown().await;
}
