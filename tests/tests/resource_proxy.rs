//! The resource proxy (upstream §5.1) across spawned binaries: real kubectl, configured from the
//! cluster secret `argocd-agentctl agent create` writes (exactly what the hub's Argo CD uses),
//! reaches an agent's cluster through the principal, under the agent's rules of what may be read
//! and changed; errors arrive as Kubernetes `Status` bodies kubectl prints.

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};
use tests::kubectl::Kubectl;
use tests::topology::{ARGOCD_NS, Clusters, Mode, StartOptions, Topology, ensure_namespace};
use tests::wait::{DEFAULT_TIMEOUT, wait_for_async};

const TRACKING: &str = "argocd.argoproj.io/tracking-id";

fn configmap(name: &str, annotations: Value, owner: Option<Value>) -> Result<ConfigMap> {
    let mut meta = json!({"name": name, "annotations": annotations});
    if let Some(owner) = owner {
        meta["ownerReferences"] = json!([owner]);
    }
    Ok(serde_json::from_value(json!({"metadata": meta, "data": {"k": "v"}}))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reaches_managed_resources_of_the_right_agent_through_the_proxy() -> Result<()> {
    let options = StartOptions { resource_proxy: true, ..StartOptions::default() };
    let mut t =
        Topology::start_with_options(&[("agent-a", Mode::Managed), ("agent-b", Mode::Managed)], options).await?;
    let proxy = t.resource_proxy_addr().context("the principal serves the resource proxy")?;
    let scratch = tempfile::tempdir()?;
    for agent in ["agent-a", "agent-b"] {
        t.ctl(&["agent", "create", agent, "--resource-proxy-server", &proxy.to_string()])?;
        // The Application the tracked objects below name.
        tests::live::application_on_agent(&t, agent, "gb").await?;
    }

    // On agent-a's cluster: a tracked ConfigMap, one Argo CD does not manage, one owned by the
    // tracked one (an owner chain), and an event.
    let spoke = t.spoke("agent-a")?;
    ensure_namespace(&spoke, "guestbook").await?;
    let cms: Api<ConfigMap> = Api::namespaced(spoke.clone(), "guestbook");
    let tracked = cms
        .create(
            &PostParams::default(),
            &configmap("tracked", json!({TRACKING: "gb:/ConfigMap:guestbook/tracked"}), None)?,
        )
        .await?;
    cms.create(&PostParams::default(), &configmap("plain", json!({}), None)?).await?;
    // Helm's standard label naming an Application agent-a does not have.
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(spoke.clone(), "guestbook")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "grafana-admin",
                "labels": {"app.kubernetes.io/instance": "grafana"}}, "stringData": {"password": "hunter2"}}))?,
        )
        .await?;
    let owner = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "tracked",
        "uid": tracked.metadata.uid.clone().context("uid")?});
    cms.create(&PostParams::default(), &configmap("owned", json!({}), Some(owner.clone()))?).await?;
    let events: Api<kube::api::DynamicObject> = Api::namespaced_with(
        spoke.clone(),
        "guestbook",
        &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Event>(&()),
    );
    events
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "tracked.1"}, "reason": "Synced", "message": "synced by argocd",
                "involvedObject": {"kind": "ConfigMap", "namespace": "guestbook", "name": "tracked"}}))?,
        )
        .await?;

    // On agent-b's cluster Argo CD tracks by a custom instance label (`argocd-cm`'s
    // `application.instanceLabelKey`): objects with it are managed, the default label is not.
    let spoke_b = t.spoke("agent-b")?;
    ensure_namespace(&spoke_b, "guestbook").await?;
    Api::<ConfigMap>::namespaced(spoke_b.clone(), ARGOCD_NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "argocd-cm"},
                "data": {"application.instanceLabelKey": "argocd.argoproj.io/instance"}}))?,
        )
        .await?;
    let cms_b: Api<ConfigMap> = Api::namespaced(spoke_b, "guestbook");
    for (name, label) in
        [("custom-label", "argocd.argoproj.io/instance"), ("default-label", "app.kubernetes.io/instance")]
    {
        let cm = json!({"metadata": {"name": name, "labels": {label: "gb"}}, "data": {"k": "v"}});
        cms_b.create(&PostParams::default(), &serde_json::from_value(cm)?).await?;
    }

    let a = Kubectl::new(&tests::live::cluster_kubeconfig(&t, "agent-a", scratch.path()).await?)?;
    let b = Kubectl::new(&tests::live::cluster_kubeconfig(&t, "agent-b", scratch.path()).await?)?;

    // Reads: managed objects and their dependents, events; discovery for kubectl itself.
    let got: Value =
        serde_json::from_str(&a.ok(["get", "configmap", "tracked", "-n", "guestbook", "-o", "json"]).await?)?;
    ensure!(got["metadata"]["annotations"][TRACKING] == "gb:/ConfigMap:guestbook/tracked", "{got}");
    a.ok(["get", "configmap", "owned", "-n", "guestbook", "-o", "name"]).await?;
    let listed = a.ok(["get", "events", "-n", "guestbook", "-o", "name"]).await?;
    ensure!(listed.contains("tracked.1"), "{listed}");
    let version = a.ok(["get", "--raw", "/version"]).await?;
    ensure!(version.contains("argocd-agent"), "{version}");
    let group = a.ok(["get", "--raw", "/apis/apiextensions.k8s.io"]).await?;
    ensure!(group.contains("APIGroup"), "group discovery (upstream #1001): {group}");

    // Refusals arrive as Status bodies kubectl prints.
    let refused = a.fails(["get", "configmap", "plain", "-n", "guestbook"]).await?;
    ensure!(refused.stderr.contains("Forbidden") && refused.stderr.contains("not managed"), "{refused}");
    let refused = a.fails(["get", "secret", "grafana-admin", "-n", "guestbook"]).await?;
    ensure!(
        refused.stderr.contains("Forbidden") && refused.stderr.contains("Application argocd/grafana"),
        "a label naming no Application of the agent: {refused}"
    );
    let refused = a.fails(["get", "configmaps", "-n", "guestbook"]).await?;
    ensure!(refused.stderr.contains("only events can be listed"), "{refused}");
    let missing = a.fails(["get", "configmap", "nope", "-n", "guestbook"]).await?;
    ensure!(missing.stderr.contains("NotFound") || missing.stderr.contains("not found"), "{missing}");
    let watch = a.fails(["get", "events", "-n", "guestbook", "--watch"]).await?;
    ensure!(watch.stderr.contains("watch is not served"), "{watch}");

    // Resource actions: PATCH and DELETE of managed objects, creates only of tracked or owned ones.
    a.ok(["patch", "configmap", "tracked", "-n", "guestbook", "--type", "merge", "-p", r#"{"data":{"k":"patched"}}"#])
        .await?;
    let now = cms.get("tracked").await?;
    ensure!(now.data.as_ref().and_then(|d| d.get("k")).map(String::as_str) == Some("patched"), "{now:?}");
    let refused = a.fails(["patch", "configmap", "plain", "-n", "guestbook", "-p", r#"{"data":{"k":"x"}}"#]).await?;
    ensure!(refused.stderr.contains("not managed"), "{refused}");
    let created = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "from-action",
        "namespace": "guestbook", "ownerReferences": [owner]}});
    a.ok([
        "create",
        "--validate=false",
        "-f",
        &a.write_manifest("created.json", &created.to_string())?.display().to_string(),
    ])
    .await?;
    ensure!(cms.get_opt("from-action").await?.is_some(), "the owned object was created");
    let stray =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stray", "namespace": "guestbook"}});
    let refused = a
        .fails([
            "create",
            "--validate=false",
            "-f",
            &a.write_manifest("stray.json", &stray.to_string())?.display().to_string(),
        ])
        .await?;
    ensure!(refused.stderr.contains("Forbidden"), "{refused}");
    ensure!(cms.get_opt("stray").await?.is_none(), "an untracked object was not created");
    a.ok(["delete", "configmap", "owned", "-n", "guestbook"]).await?;
    ensure!(cms.get_opt("owned").await?.is_none(), "deleted through the proxy");
    let refused = a.fails(["delete", "configmap", "plain", "-n", "guestbook"]).await?;
    ensure!(refused.stderr.contains("not managed"), "{refused}");

    // agent-b's credentials reach agent-b's cluster, never agent-a's.
    let other = b.fails(["get", "configmap", "tracked", "-n", "guestbook"]).await?;
    ensure!(other.stderr.contains("not found"), "agent-b has no such object: {other}");
    b.ok(["get", "configmap", "custom-label", "-n", "guestbook", "-o", "name"]).await?;
    let refused = b.fails(["get", "configmap", "default-label", "-n", "guestbook"]).await?;
    ensure!(refused.stderr.contains("not managed"), "agent-b tracks by its own instance label: {refused}");

    // A disconnected agent is answered at once, saying so.
    t.kill_agent("agent-b")?;
    wait_for_async(DEFAULT_TIMEOUT, "agent-b to be seen as disconnected", || async {
        let out = b.run(["get", "configmap", "x", "-n", "guestbook"]).await?;
        Ok(out.stderr.contains("not connected").then_some(()))
    })
    .await?;

    let (_, metrics) = tests::http::get(t.principal_metrics_addr().context("metrics")?, "/metrics").await?;
    ensure!(
        metrics.contains(
            r#"argocd_principal_resource_proxy_requests_total{agent_name="agent-a",verb="patch",code="200"}"#
        ),
        "{metrics}"
    );
    Ok(())
}

/// On real kube-apiservers, with the agent running under `install/rbac/agent.yaml` and
/// `agent-resource-proxy.yaml`: a Pod reached through its owner chain (Deployment, ReplicaSet),
/// a Deployment's `scale` subresource read and patched as a resource action does, a CRD read
/// (upstream #873), and a Secret the agent can read but Argo CD does not manage refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_resource_proxy_follows_owner_chains_and_subresources() -> Result<()> {
    let options = StartOptions { clusters: Clusters::REAL, resource_proxy: true, ..StartOptions::default() };
    let t = Topology::start_with_options(&[("rp1", Mode::Managed)], options).await?;
    let proxy = t.resource_proxy_addr().context("the principal serves the resource proxy")?;
    t.ctl(&["agent", "create", "rp1", "--resource-proxy-server", &proxy.to_string()])?;
    tests::live::application_on_agent(&t, "rp1", "gb").await?;
    let scratch = tempfile::tempdir()?;
    let kubectl = Kubectl::new(&tests::live::cluster_kubeconfig(&t, "rp1", scratch.path()).await?)?;

    // What Argo CD deployed and what Kubernetes' controllers would have made of it (a bare
    // control plane runs none, so the test writes the ReplicaSet and Pod itself).
    let spoke = t.spoke("rp1")?;
    ensure_namespace(&spoke, "guestbook").await?;
    let sas: Api<DynamicObject> = Api::namespaced_with(
        spoke.clone(),
        "guestbook",
        &ApiResource::erase::<k8s_openapi::api::core::v1::ServiceAccount>(&()),
    );
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        )?,
    )
    .await?;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(spoke.clone(), "guestbook");
    let pod_spec = json!({"containers": [{"name": "ui", "image": "guestbook-ui:0.1"}]});
    let deployment = deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "ui", "annotations": {TRACKING: "gb:apps/Deployment:guestbook/ui"}},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "ui"}},
                         "template": {"metadata": {"labels": {"app": "ui"}}, "spec": pod_spec}}}),
            )?,
        )
        .await?;
    let owner = |kind: &str, api_version: &str, name: &str, uid: Option<String>| -> Result<Value> {
        Ok(
            json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid.context("uid")?, "controller": true}]),
        )
    };
    let replicasets: Api<k8s_openapi::api::apps::v1::ReplicaSet> = Api::namespaced(spoke.clone(), "guestbook");
    let rs = replicasets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "ui-7d9c", "labels": {"app": "ui"},
                    "ownerReferences": owner("Deployment", "apps/v1", "ui", deployment.metadata.uid.clone())?},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "ui"}},
                         "template": {"metadata": {"labels": {"app": "ui"}}, "spec": pod_spec}}}))?,
        )
        .await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(spoke.clone(), "guestbook");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "ui-7d9c-x2x4", "labels": {"app": "ui"},
                "ownerReferences": owner("ReplicaSet", "apps/v1", "ui-7d9c", rs.metadata.uid.clone())?},
            "spec": pod_spec}))?,
    )
    .await?;

    let pod = kubectl.ok(["get", "pod", "ui-7d9c-x2x4", "-n", "guestbook", "-o", "name"]).await?;
    ensure!(pod.trim() == "pod/ui-7d9c-x2x4", "{pod}");
    let scale: Value = serde_json::from_str(
        &kubectl.ok(["get", "deployment", "ui", "-n", "guestbook", "--subresource=scale", "-o", "json"]).await?,
    )?;
    ensure!(scale["kind"] == "Scale" && scale["spec"]["replicas"] == 1, "{scale}");
    kubectl
        .ok([
            "patch",
            "deployment",
            "ui",
            "-n",
            "guestbook",
            "--subresource=scale",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"replicas":3}}"#,
        ])
        .await?;
    let now = deployments.get("ui").await?;
    ensure!(now.spec.replicas == Some(3), "scaled through the proxy");
    // A CRD is readable once an Application of the agent lists it (Argo CD applies CRDs
    // without tracking them, upstream #873), not before.
    let refused = kubectl.fails(["get", "crd", "applications.argoproj.io"]).await?;
    ensure!(refused.stderr.contains("Forbidden"), "{refused}");
    tests::apps::apps(&spoke, ARGOCD_NS)
        .patch(
            "gb",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"resources": [{"group": "apiextensions.k8s.io",
                "version": "v1", "kind": "CustomResourceDefinition", "name": "applications.argoproj.io"}]}})),
        )
        .await?;
    let crd = kubectl.ok(["get", "crd", "applications.argoproj.io", "-o", "name"]).await?;
    ensure!(crd.contains("applications.argoproj.io"), "{crd}");
    let secret = kubectl.fails(["get", "secret", "-n", ARGOCD_NS, "argocd-agent-client-tls"]).await?;
    ensure!(secret.stderr.contains("Forbidden"), "{secret}");
    Ok(())
}
