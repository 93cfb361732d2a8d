//! The principal and agents on a real control plane: etcd + kube-apiserver built from
//! Kubernetes' Go modules, Argo CD v3.5.1's own CRDs (structural schemas: unknown fields are
//! pruned, Application has no status subresource), and the principal and agents running as
//! ServiceAccounts bound to the least-privilege RBAC of `install/rbac/` (a missing rule fails
//! here). Managed and autonomous lifecycles, operations, finalizers, AppProjects, non-owner
//! edits reverted, nothing looping, and a real hub with embedded spokes.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tests::apps::{apps, assert_quiet, converge as wait_app, gone, path_is, set_path};
use tests::realkube::ArgoCdRelease;
use tests::topology::{ARGOCD_NS, Clusters, Mode, StartOptions, Topology};
use tests::wait_until_async;

const CONVERGE: Duration = Duration::from_secs(60);

fn app(name: &str, ns: &str, path: &str) -> Result<DynamicObject> {
    tests::fixtures::app_with_path(name, ns, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_managed_lifecycle_operation_finalizers_and_reverts() -> Result<()> {
    const FINALIZER: &str = "resources-finalizer.argocd.argoproj.io";
    // On the newest line's CRDs (the other real-server tests run v3.5.1's).
    let options = StartOptions { clusters: Clusters::REAL, argocd: ArgoCdRelease::V3_6_1, ..StartOptions::default() };
    let t = Topology::start_with_options(&[("rm1", Mode::Managed)], options).await?;
    let hub = apps(&t.hub(), "rm1");
    let spoke = apps(&t.spoke("rm1")?, ARGOCD_NS);

    // A field the CRD does not know is pruned by the real server on create: it never travels.
    let mut web = app("web", "rm1", "v1")?;
    web.data["spec"]["notInTheSchema"] = json!("pruned");
    hub.create(&PostParams::default(), &web).await?;
    wait_app(&t, &spoke, "web", "create reaches the spoke", path_is("v1")).await?;
    let on_spoke = spoke.get("web").await?;
    ensure!(on_spoke.data["spec"].get("notInTheSchema").is_none(), "pruned field crossed: {:?}", on_spoke.data);

    set_path(&hub, "web", "v2").await?;
    wait_app(&t, &spoke, "web", "spec update reaches the spoke", path_is("v2")).await?;

    // An operation (a sync requested on the hub) reaches the spoke's Argo CD.
    hub.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"operation": {"sync": {"revision": "HEAD", "prune": true}, "initiatedBy": {"username": "admin"}}}),
        ),
    )
    .await?;
    wait_app(&t, &spoke, "web", "the operation reaches the spoke", |o| {
        o.is_some_and(|o| o["operation"]["sync"]["revision"] == "HEAD")
    })
    .await?;

    // Status, written by the spoke's Argo CD through the main resource (no status subresource).
    spoke
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "operation": null,
                "status": {"sync": {"status": "Synced", "revision": "abc123"}, "health": {"status": "Healthy"},
                           "operationState": {"phase": "Succeeded", "message": "done", "startedAt": "2026-11-25T00:00:00Z",
                                      "operation": {"sync": {"revision": "HEAD"}}}},
            })),
        )
        .await?;
    wait_app(&t, &hub, "web", "status comes back to the hub", |o| {
        o.is_some_and(|o| {
            o["status"]["health"]["status"] == "Healthy" && o["status"]["operationState"]["phase"] == "Succeeded"
        })
    })
    .await?;

    // The spoke does not own a managed Application: edits and deletes there are reverted.
    set_path(&spoke, "web", "edited-on-spoke").await?;
    wait_app(&t, &spoke, "web", "a spoke edit is reverted", path_is("v2")).await?;
    spoke.delete("web", &DeleteParams::default()).await?;
    wait_app(&t, &spoke, "web", "a spoke delete is reverted", |o| {
        o.is_some_and(|o| o["spec"]["source"]["path"] == "v2" && o["metadata"]["deletionTimestamp"].is_null())
    })
    .await?;

    assert_quiet(&t, &hub, &spoke, "web", true, "rm1").await?;

    // Cascade delete: the hub keeps its copy while the spoke's finalizer holds.
    let mut cascade = app("cascade", "rm1", "v1")?;
    cascade.metadata.finalizers = Some(vec![FINALIZER.into()]);
    hub.create(&PostParams::default(), &cascade).await?;
    wait_app(&t, &spoke, "cascade", "create with a finalizer reaches the spoke", path_is("v1")).await?;
    hub.delete("cascade", &DeleteParams::default()).await?;
    wait_app(&t, &spoke, "cascade", "deletion reaches the spoke", |o| {
        o.is_some_and(|o| !o["metadata"]["deletionTimestamp"].is_null())
    })
    .await?;
    ensure!(hub.get_opt("cascade").await?.is_some(), "the hub keeps its copy until the spoke is done");
    spoke.patch("cascade", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    wait_app(&t, &spoke, "cascade", "the spoke copy goes once its finalizer is removed", gone).await?;
    wait_app(&t, &hub, "cascade", "then the hub copy goes", gone).await?;

    hub.delete("web", &DeleteParams::default()).await?;
    wait_app(&t, &spoke, "web", "delete reaches the spoke", gone).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_hub_with_embedded_spokes_both_modes() -> Result<()> {
    let options =
        StartOptions { clusters: Clusters::REAL_HUB, argocd: ArgoCdRelease::V3_6_1, ..StartOptions::default() };
    let t = Topology::start_with_options(&[("xm", Mode::Managed), ("xa", Mode::Autonomous)], options).await?;
    let (hub_m, spoke_m) = (apps(&t.hub(), "xm"), apps(&t.spoke("xm")?, ARGOCD_NS));
    let (hub_a, spoke_a) = (apps(&t.hub(), "xa"), apps(&t.spoke("xa")?, ARGOCD_NS));
    hub_m.create(&PostParams::default(), &app("down", "xm", "v1")?).await?;
    spoke_a.create(&PostParams::default(), &app("up", ARGOCD_NS, "v1")?).await?;
    wait_app(&t, &spoke_m, "down", "a managed app reaches the embedded spoke", path_is("v1")).await?;
    wait_app(&t, &hub_a, "up", "an autonomous app reaches the real hub", path_is("v1")).await?;
    spoke_m
        .patch("down", &PatchParams::default(), &Patch::Merge(json!({"status": {"health": {"status": "Healthy"}}})))
        .await?;
    wait_app(&t, &hub_m, "down", "status reaches the real hub", |o| {
        o.is_some_and(|o| o["status"]["health"]["status"] == "Healthy")
    })
    .await?;
    hub_m.delete("down", &DeleteParams::default()).await?;
    spoke_a.delete("up", &DeleteParams::default()).await?;
    wait_app(&t, &spoke_m, "down", "a managed delete", gone).await?;
    wait_app(&t, &hub_a, "up", "an autonomous delete", gone).await?;
    Ok(())
}

/// The README's kubectl flow, on real API servers: the operator applies
/// `docs/examples/managed-app.yaml` to the hub and watches it arrive on the managed spoke
/// (`kubectl get applications --watch`); the spoke's Argo CD (played here with kubectl) reports
/// status, which `kubectl get` shows on the hub; an autonomous spoke's Application appears on the
/// hub; `kubectl delete` on the owner side removes both copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_kubectl_flow_of_the_quickstart() -> Result<()> {
    let t = Topology::start_on(
        &[("agent-managed", Mode::Managed), ("agent-autonomous", Mode::Autonomous)],
        Clusters::REAL,
        true,
    )
    .await?;
    let kubectl = tests::Kubectl::new(&t.kubeconfig())?;
    let example = tests::workspace_root().join("docs").join("examples").join("managed-app.yaml");
    let mut watch =
        kubectl.spawn_watch(["--context", "agent-managed", "get", "applications", "-n", ARGOCD_NS, "--watch"])?;
    kubectl.ok(["--context", "hub", "apply", "-f", &example.display().to_string()]).await?;
    watch.wait_for_line(CONVERGE, |l| l.starts_with("my-app")).await.with_context(|| t.logs())?;

    kubectl
        .ok([
            "--context",
            "agent-managed",
            "-n",
            ARGOCD_NS,
            "patch",
            "application",
            "my-app",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"sync":{"status":"Synced"},"health":{"status":"Healthy"}}}"#,
        ])
        .await?;
    let hub_status = || async {
        kubectl
            .ok([
                "--context",
                "hub",
                "get",
                "application",
                "my-app",
                "-n",
                "agent-managed",
                "-o",
                "jsonpath={.status.sync.status}/{.status.health.status}",
            ])
            .await
            .unwrap_or_default()
    };
    wait_until_async(CONVERGE, "kubectl to show the status on the hub", || async {
        hub_status().await == "Synced/Healthy"
    })
    .await
    .with_context(|| t.logs())?;

    let autonomous = kubectl.write_manifest(
        "autonomous.yaml",
        "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: local\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: https://example.com/local.git\n    path: local\n  destination:\n    server: https://kubernetes.default.svc\n    namespace: local\n",
    )?;
    kubectl.ok(["--context", "agent-autonomous", "apply", "-f", &autonomous.display().to_string()]).await?;
    wait_until_async(CONVERGE, "kubectl to show the autonomous app on the hub", || async {
        kubectl
            .run(["--context", "hub", "get", "application", "local", "-n", "agent-autonomous"])
            .await
            .is_ok_and(|o| o.success())
    })
    .await
    .with_context(|| t.logs())?;

    kubectl.ok(["--context", "hub", "delete", "-f", &example.display().to_string(), "--wait=false"]).await?;
    kubectl
        .ok(["--context", "agent-autonomous", "-n", ARGOCD_NS, "delete", "application", "local", "--wait=false"])
        .await?;
    let gone = |ctx: &'static str, ns: &'static str, name: &'static str| {
        let kubectl = &kubectl;
        async move {
            kubectl
                .run(["--context", ctx, "get", "application", name, "-n", ns, "--ignore-not-found", "-o", "name"])
                .await
                .is_ok_and(|o| o.success() && o.stdout.trim().is_empty())
        }
    };
    wait_until_async(CONVERGE, "both deletes to reach the other side", || async {
        gone("agent-managed", ARGOCD_NS, "my-app").await && gone("hub", "agent-autonomous", "local").await
    })
    .await
    .with_context(|| t.logs())?;
    Ok(())
}

/// `--namespace-create-enable` on a real hub: the autonomous agent's namespace does not exist
/// until it connects; the principal creates it with the grant of
/// `install/rbac/principal-namespace-create.yaml`, and the agent's Applications land there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_principal_creates_the_autonomous_agents_namespace() -> Result<()> {
    let options = StartOptions {
        clusters: Clusters::REAL,
        hub_agent_namespaces: false,
        principal_args: [
            "--namespace-create-enable",
            "--namespace-create-pattern",
            "^rn",
            "--namespace-create-labels",
            "team=agents,env=test",
        ]
        .map(String::from)
        .to_vec(),
        ..StartOptions::default()
    };
    let t = Topology::start_with_options(&[("rn1", Mode::Autonomous), ("zz1", Mode::Autonomous)], options).await?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(t.hub());
    wait_until_async(CONVERGE, "the principal to create the agent's namespace, labelled", || async {
        namespaces.get_opt("rn1").await.ok().flatten().is_some_and(|ns| {
            let labels = ns.metadata.labels.unwrap_or_default();
            labels.get("team").map(String::as_str) == Some("agents")
                && labels.get("env").map(String::as_str) == Some("test")
        })
    })
    .await
    .with_context(|| t.logs())?;
    // The other agent's name does not match --namespace-create-pattern: connected, no namespace.
    wait_until_async(CONVERGE, "the other agent to connect", || async { t.principal_connects("zz1") > 0 })
        .await
        .with_context(|| t.logs())?;
    anyhow::ensure!(
        namespaces.get_opt("zz1").await?.is_none(),
        "a namespace was created for zz1, which the pattern excludes"
    );
    let (hub, spoke) = (apps(&t.hub(), "rn1"), apps(&t.spoke("rn1")?, ARGOCD_NS));
    spoke.create(&PostParams::default(), &app("first", ARGOCD_NS, "v1")?).await?;
    wait_app(&t, &hub, "first", "the autonomous app reaches the created namespace", path_is("v1")).await?;
    Ok(())
}

/// The hub's kube-apiserver restarts (etcd keeps the state): its new watch cache starts at the
/// current resourceVersion, so the principal's watches, resumed from where they were, are told
/// `410 Gone` ("too old resource version") and must list again. Nothing is lost: changes made
/// right after the restart reach the spoke, and a hub edit of the spoke's status is not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_hub_apiserver_restart_410_and_relist() -> Result<()> {
    let mut t = Topology::start_on(&[("rg1", Mode::Managed)], Clusters::REAL, true).await?;
    let hub = apps(&t.hub(), "rg1");
    let spoke = apps(&t.spoke("rg1")?, ARGOCD_NS);
    hub.create(&PostParams::default(), &app("before", "rg1", "v1")?).await?;
    wait_app(&t, &spoke, "before", "initial sync", path_is("v1")).await?;
    // Move the hub's resourceVersion on, so the resumed watches are behind the new cache.
    for i in 0..20 {
        hub.create(&PostParams::default(), &app(&format!("filler-{i}"), "rg1", "v1")?).await?;
    }
    wait_app(&t, &spoke, "filler-19", "the fillers cross", path_is("v1")).await?;
    t.kill_hub()?;
    t.restart_hub().await?;
    set_path(&hub, "before", "v2").await?;
    hub.create(&PostParams::default(), &app("after", "rg1", "v1")?).await?;
    wait_app(&t, &spoke, "before", "an update right after the restart", path_is("v2")).await?;
    wait_app(&t, &spoke, "after", "a create right after the restart", path_is("v1")).await?;
    let gone = t.principal_log_lines("too old resource version");
    eprintln!("principal log lines with a 410 after the restart: {}", gone.len());
    for line in gone.iter().take(3) {
        eprintln!("  {line}");
    }
    ensure!(!gone.is_empty(), "the restart did not make any principal watch resume from an expired resourceVersion");
    Ok(())
}
