//! Managed mode end to end: hub and spoke API servers, a real principal, a real agent.

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

#[tokio::test]
async fn managed_app_lifecycle_create_update_status_operation_delete() {
    let env = Env::new(AgentMode::Managed).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    let created = create(&hub, app_json("guestbook", AGENT, "guestbook")).await;
    let hub_uid = created.metadata.uid.clone().unwrap();

    let copy = wait_obj(&spoke, "guestbook", "app created on the spoke", |_| true).await;
    assert_eq!(annotation(&copy, "argocd.argoproj.io/source-uid"), Some(hub_uid.as_str()));
    assert!(annotation(&copy, "argocd.argoproj.io/principal-uid").is_some());
    assert_eq!(copy.pointer("/spec/destination/name").and_then(Value::as_str), Some("in-cluster"));
    assert_eq!(path(&copy), Some("guestbook"));

    merge(&hub, "guestbook", json!({"spec": {"source": {"path": "helm-guestbook"}}})).await;
    wait_obj(&spoke, "guestbook", "spec update on the spoke", |v| path(v) == Some("helm-guestbook")).await;

    merge(&spoke, "guestbook", json!({"status": {"health": {"status": "Healthy"}, "sync": {"status": "Synced"}}}))
        .await;
    let h = wait_obj(&hub, "guestbook", "status on the hub", |v| {
        v.pointer("/status/health/status").and_then(Value::as_str) == Some("Healthy")
    })
    .await;
    assert!(annotation(&h, "argocd-agent.argoproj.io/last-updated").is_some(), "upstream's key: {h}");
    assert_eq!(path(&h), Some("helm-guestbook"), "status write must not touch the spec");

    merge(&hub, "guestbook", json!({"operation": {"sync": {"revision": "HEAD"}}})).await;
    wait_obj(&spoke, "guestbook", "operation on the spoke", |v| v.pointer("/operation/sync/revision").is_some()).await;

    let refresh = json!({"metadata": {"annotations": {"argocd.argoproj.io/refresh": "hard"}}});
    merge(&hub, "guestbook", refresh).await;
    wait_obj(&spoke, "guestbook", "refresh request on the spoke", |v| {
        annotation(v, "argocd.argoproj.io/refresh") == Some("hard")
    })
    .await;

    delete(&hub, "guestbook").await;
    wait_gone(&spoke, "guestbook", "app deleted on the spoke").await;
    env.shutdown().await;
}

#[tokio::test]
async fn managed_delete_with_finalizers_waits_for_the_spoke() {
    let env = Env::new(AgentMode::Managed).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    let mut app = app_json("fin", AGENT, "guestbook");
    app["metadata"]["finalizers"] = json!(["resources-finalizer.argocd.argoproj.io"]);
    create(&hub, app).await;
    wait_obj(&spoke, "fin", "app with finalizer on the spoke", |v| v.pointer("/metadata/finalizers/0").is_some()).await;

    delete(&hub, "fin").await;
    wait_obj(&spoke, "fin", "spoke copy being deleted", |v| v.pointer("/metadata/deletionTimestamp").is_some()).await;
    assert!(get(&hub, "fin").await.is_some(), "hub waits while the spoke still has finalizers");

    // The spoke's Argo CD finishes pruning and removes its finalizer.
    merge(&spoke, "fin", json!({"metadata": {"finalizers": null}})).await;
    wait_gone(&spoke, "fin", "spoke copy gone").await;
    wait_gone(&hub, "fin", "hub app gone after the agent's delete").await;
    env.shutdown().await;
}

#[tokio::test]
async fn managed_delete_without_finalizers() {
    let env = Env::new(AgentMode::Managed).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    create(&hub, app_json("plain", AGENT, "guestbook")).await;
    wait_obj(&spoke, "plain", "app on the spoke", |_| true).await;
    delete(&hub, "plain").await;
    wait_gone(&spoke, "plain", "spoke copy gone").await;
    env.shutdown().await;
}

#[tokio::test]
async fn managed_appprojects_flow_down_as_agent_specific_copies() {
    let env = Env::new(AgentMode::Managed).await;
    let hub = projects(&env.hub.client, PRINCIPAL_NS);
    let spoke = projects(&env.spoke.client, SPOKE_NS);
    let project = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "team-a", "namespace": PRINCIPAL_NS},
        "spec": {
            "description": "one",
            "sourceRepos": ["*"],
            "destinations": [{"name": "agent-*", "namespace": "*", "server": "*"}, {"name": "other", "namespace": "*"}],
            "sourceNamespaces": ["agent-*"],
            "roles": [{"name": "admin"}],
        },
    });
    let created = create(&hub, project).await;
    let copy = wait_obj(&spoke, "team-a", "project on the spoke", |_| true).await;
    assert_eq!(annotation(&copy, "argocd.argoproj.io/source-uid"), created.metadata.uid.as_deref());
    assert_eq!(copy.pointer("/spec/destinations").and_then(Value::as_array).map(Vec::len), Some(1));
    assert_eq!(
        copy.pointer("/spec/destinations/0/server").and_then(Value::as_str),
        Some("https://kubernetes.default.svc")
    );
    assert!(copy.pointer("/spec/sourceNamespaces").is_none());
    assert!(copy.pointer("/spec/roles").is_none());

    merge(&hub, "team-a", json!({"spec": {"description": "two"}})).await;
    wait_obj(&spoke, "team-a", "project update", |v| v.pointer("/spec/description") == Some(&json!("two"))).await;

    // No longer matching the agent: deleted there.
    merge(&hub, "team-a", json!({"spec": {"sourceNamespaces": ["nobody"]}})).await;
    wait_gone(&spoke, "team-a", "project removed once it stops matching").await;
    merge(&hub, "team-a", json!({"spec": {"sourceNamespaces": ["agent-*"]}})).await;
    wait_obj(&spoke, "team-a", "project back once it matches again", |_| true).await;

    delete(&hub, "team-a").await;
    wait_gone(&spoke, "team-a", "project deleted on the spoke").await;
    env.shutdown().await;
}

#[tokio::test]
async fn managed_non_owner_edit_and_delete_on_the_spoke_are_reverted() {
    let env = Env::new(AgentMode::Managed).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    create(&hub, app_json("owned", AGENT, "guestbook")).await;
    let first = wait_obj(&spoke, "owned", "app on the spoke", |_| true).await;

    merge(&spoke, "owned", json!({"spec": {"source": {"path": "hacked"}}})).await;
    wait_obj(&spoke, "owned", "local edit reverted", |v| path(v) == Some("guestbook")).await;

    delete(&spoke, "owned").await;
    let uid = first.pointer("/metadata/uid").cloned();
    wait_obj(&spoke, "owned", "local delete reverted", |v| v.pointer("/metadata/uid").cloned() != uid).await;
    assert_eq!(path(&get(&hub, "owned").await.unwrap()), Some("guestbook"));
    env.shutdown().await;
}

#[tokio::test]
async fn managed_agent_down_while_hub_and_spoke_change_converges_on_restart() {
    let mut env = Env::new(AgentMode::Managed).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    for name in ["a", "b", "c"] {
        create(&hub, app_json(name, AGENT, "guestbook")).await;
    }
    for name in ["a", "b", "c"] {
        wait_obj(&spoke, name, "initial app on the spoke", |_| true).await;
    }
    env.stop_agent().await;

    merge(&hub, "a", json!({"spec": {"source": {"path": "v2"}}})).await;
    delete(&hub, "b").await;
    create(&hub, app_json("d", AGENT, "guestbook")).await;
    // Drift made on the spoke while the agent was away.
    merge(&spoke, "c", json!({"spec": {"source": {"path": "drifted"}}})).await;

    env.start_agent().await;
    wait_obj(&spoke, "a", "hub update while away", |v| path(v) == Some("v2")).await;
    wait_gone(&spoke, "b", "hub delete while away").await;
    wait_obj(&spoke, "d", "hub create while away", |_| true).await;
    wait_obj(&spoke, "c", "spoke drift while away repaired", |v| path(v) == Some("guestbook")).await;
    env.shutdown().await;
}

#[tokio::test]
async fn managed_principal_restart_converges_through_resync() {
    let mut env = Env::new(AgentMode::Managed).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    for name in ["a", "b", "c"] {
        create(&hub, app_json(name, AGENT, "guestbook")).await;
    }
    for name in ["a", "b", "c"] {
        wait_obj(&spoke, name, "initial app on the spoke", |_| true).await;
    }
    env.stop_principal().await;

    merge(&hub, "a", json!({"spec": {"source": {"path": "v2"}}})).await;
    delete(&hub, "b").await;
    create(&hub, app_json("d", AGENT, "guestbook")).await;
    merge(&spoke, "c", json!({"status": {"health": {"status": "Degraded"}}})).await;
    delete(&spoke, "c").await; // a local delete while the principal is away is reverted locally

    env.start_principal().await;
    wait_obj(&spoke, "a", "update made while the principal was down", |v| path(v) == Some("v2")).await;
    wait_gone(&spoke, "b", "delete made while the principal was down").await;
    wait_obj(&spoke, "d", "create made while the principal was down", |_| true).await;
    wait_obj(&spoke, "c", "spoke copy recreated", |_| true).await;
    merge(&spoke, "a", json!({"status": {"health": {"status": "Healthy"}}})).await;
    wait_obj(&hub, "a", "status flows up after the restart", |v| {
        v.pointer("/status/health/status").and_then(Value::as_str) == Some("Healthy")
    })
    .await;
    env.shutdown().await;
}

#[tokio::test]
async fn managed_terminate_operation_flows_down() {
    let env = Env::new(AgentMode::Managed).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    create(&hub, app_json("term", AGENT, "guestbook")).await;
    wait_obj(&spoke, "term", "app on the spoke", |_| true).await;
    merge(&spoke, "term", json!({"status": {"operationState": {"phase": "Running"}}})).await;
    wait_obj(&hub, "term", "running operation reported", |v| {
        v.pointer("/status/operationState/phase").and_then(Value::as_str) == Some("Running")
    })
    .await;
    merge(&hub, "term", json!({"status": {"operationState": {"phase": "Terminating"}}})).await;
    wait_obj(&spoke, "term", "termination requested on the spoke", |v| {
        v.pointer("/status/operationState/phase").and_then(Value::as_str) == Some("Terminating")
    })
    .await;
    env.shutdown().await;
}

#[tokio::test]
async fn managed_appproject_edit_and_delete_on_the_spoke_are_reverted() {
    let env = Env::new(AgentMode::Managed).await;
    let hub = projects(&env.hub.client, PRINCIPAL_NS);
    let spoke = projects(&env.spoke.client, SPOKE_NS);
    let project = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "team-b", "namespace": PRINCIPAL_NS},
        "spec": {"description": "hub", "destinations": [{"name": "*", "namespace": "*"}], "sourceNamespaces": ["*"]},
    });
    create(&hub, project).await;
    let first = wait_obj(&spoke, "team-b", "project on the spoke", |_| true).await;
    merge(&spoke, "team-b", json!({"spec": {"description": "local"}})).await;
    wait_obj(&spoke, "team-b", "local project edit reverted", |v| {
        v.pointer("/spec/description") == Some(&json!("hub"))
    })
    .await;
    delete(&spoke, "team-b").await;
    let uid = first.pointer("/metadata/uid").cloned();
    wait_obj(&spoke, "team-b", "local project delete reverted", |v| v.pointer("/metadata/uid").cloned() != uid).await;
    env.shutdown().await;
}

#[tokio::test]
async fn managed_ignore_sync_label_removes_the_app_from_the_agent() {
    let env = Env::new(AgentMode::Managed).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    create(&hub, app_json("skip", AGENT, "guestbook")).await;
    wait_obj(&spoke, "skip", "app on the spoke", |_| true).await;
    merge(&hub, "skip", json!({"metadata": {"labels": {"argocd-agent.argoproj-labs.io/ignore-sync": "true"}}})).await;
    wait_gone(&spoke, "skip", "ignored app removed from the spoke").await;
    assert!(get(&hub, "skip").await.is_some());
    env.shutdown().await;
}

#[tokio::test]
async fn managed_hub_delete_with_finalizers_while_principal_down_completes_after_restart() {
    let mut env = Env::new(AgentMode::Managed).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    let mut app = app_json("fin", AGENT, "guestbook");
    app["metadata"]["finalizers"] = json!(["resources-finalizer.argocd.argoproj.io"]);
    create(&hub, app).await;
    wait_obj(&spoke, "fin", "app on the spoke", |_| true).await;
    env.stop_principal().await;
    delete(&hub, "fin").await;
    env.start_principal().await;
    wait_obj(&spoke, "fin", "spoke copy being deleted", |v| v.pointer("/metadata/deletionTimestamp").is_some()).await;
    merge(&spoke, "fin", json!({"metadata": {"finalizers": null}})).await;
    wait_gone(&hub, "fin", "hub deletion completed").await;
    env.shutdown().await;
}

#[tokio::test]
async fn managed_create_is_one_spoke_request_and_an_update_reads_once() {
    let env = Env::new(AgentMode::Managed).await;
    let (hub, spoke) = (env.hub_apps(), env.spoke_apps());
    // Once one Application has crossed, the agent's first resync is behind it: a resync resends
    // what the hub has, and a resent Application is rightly read (the agent has a copy of it).
    create(&hub, app_json("first", AGENT, "guestbook")).await;
    wait_obj(&spoke, "first", "the first app on the spoke", |_| true).await;
    env.spoke.requests.lock().unwrap().clear();
    let names = ["one", "two", "three"];
    for name in names {
        create(&hub, app_json(name, AGENT, "guestbook")).await;
    }
    for name in names {
        wait_obj(&spoke, name, "app created on the spoke", |_| true).await;
    }
    let collection = format!("/apis/argoproj.io/v1alpha1/namespaces/{SPOKE_NS}/applications");
    let object = format!("{collection}/one");
    assert_eq!(env.spoke.requests_to(&http::Method::POST, &collection), names.len(), "one create each");
    for name in names {
        let path = format!("{collection}/{name}");
        assert_eq!(env.spoke.requests_to(&http::Method::GET, &path), 0, "{name} was read before it was created");
    }

    merge(&hub, "one", json!({"spec": {"source": {"path": "helm-guestbook"}}})).await;
    wait_obj(&spoke, "one", "spec update on the spoke", |v| path(v) == Some("helm-guestbook")).await;
    assert_eq!(env.spoke.requests_to(&http::Method::GET, &object), 1, "an update reads the copy once");
    assert_eq!(env.spoke.requests_to(&http::Method::PUT, &object), 1, "and writes it once");
    env.shutdown().await;
}
