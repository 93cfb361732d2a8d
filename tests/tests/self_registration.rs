//! Self-registration (upstream §3.9, its e2e `Test_SelfRegistrationCreatesSecret`,
//! `Test_ManualSecretWithSelfRegistrationEnabled`, `Test_SelfRegisteredSecret_ResourceProxy`):
//! on a real kube-apiserver hub with the principal under its least-privilege RBAC plus
//! `principal-self-registration.yaml`, an agent that authenticates gets a cluster secret shaped as
//! upstream writes it; an operator's secret is left alone; the secret's bearer token takes kubectl
//! (with the shared client certificate, whose CN names no agent) to that agent's cluster through
//! the resource proxy; a broken token is renewed when the agent next authenticates.

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tests::kubectl::Kubectl;
use tests::topology::{ARGOCD_NS, Clusters, Mode, StartOptions, Topology, ensure_namespace};
use tests::wait::{DEFAULT_TIMEOUT, wait_for_async};

const SHARED: &str = "argocd-agent-self-registration-client";

fn text(secret: &Secret, key: &str) -> Option<String> {
    secret.data.as_ref()?.get(key).map(|b| String::from_utf8_lossy(&b.0).into_owned())
}

fn config(secret: &Secret) -> Result<Value> {
    Ok(serde_json::from_str(&text(secret, "config").context("config")?)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_register_themselves_and_argocd_reaches_them_with_the_token() -> Result<()> {
    let options = StartOptions {
        clusters: Clusters::REAL_HUB,
        start_agents: false,
        resource_proxy: true,
        principal_args: ["--enable-self-cluster-registration", "--self-registration-client-cert-secret", SHARED]
            .map(String::from)
            .to_vec(),
        ..StartOptions::default()
    };
    let mut t = Topology::start_with_options(&[("sr-a", Mode::Managed), ("sr-m", Mode::Managed)], options).await?;
    tests::live::issue_shared_client_cert(&t, SHARED, "argocd-server").await?;
    // sr-m's secret is the operator's (agentctl agent create): never touched by the principal.
    t.ctl(&["agent", "create", "sr-m", "--resource-proxy-server", "proxy.example:9090"])?;
    let secrets: Api<Secret> = Api::namespaced(t.hub(), ARGOCD_NS);
    let manual_before = secrets.get("cluster-sr-m").await?;
    t.start_agent("sr-a").await?;
    t.start_agent("sr-m").await?;

    let registered = wait_for_async(DEFAULT_TIMEOUT, "sr-a's self-registered cluster secret", || async {
        Ok(secrets.get_opt("cluster-sr-a").await?)
    })
    .await
    .with_context(|| t.logs())?;
    let labels = registered.metadata.labels.clone().unwrap_or_default();
    for (k, v) in [
        ("argocd.argoproj.io/secret-type", "cluster"),
        ("argocd-agent.argoproj-labs.io/agent-name", "sr-a"),
        ("argocd-agent.argoproj-labs.io/self-registered-cluster", "true"),
    ] {
        ensure!(labels.get(k).map(String::as_str) == Some(v), "label {k}: {labels:?}");
    }
    let annotations = registered.metadata.annotations.clone().unwrap_or_default();
    ensure!(
        annotations.get("argocd.argoproj.io/skip-reconcile").map(String::as_str) == Some("true"),
        "{annotations:?}"
    );
    ensure!(
        text(&registered, "server").as_deref() == Some("https://argocd-agent-resource-proxy:9090?agentName=sr-a"),
        "server: {:?}",
        text(&registered, "server")
    );
    ensure!(text(&registered, "name").as_deref() == Some("sr-a"));
    let cfg = config(&registered)?;
    let shared = secrets.get(SHARED).await?;
    let b64 = |s: Option<String>| s.map(|s| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, s));
    ensure!(cfg["bearerToken"].as_str().is_some_and(|t| t.split('.').count() == 3), "a JWT: {cfg}");
    ensure!(cfg["tlsClientConfig"]["certData"].as_str().map(str::to_owned) == b64(text(&shared, "tls.crt")), "{cfg}");
    ensure!(cfg["tlsClientConfig"]["caData"].as_str().map(str::to_owned) == b64(text(&shared, "ca.crt")), "{cfg}");

    // The operator's secret: unchanged once sr-m has authenticated.
    wait_for_async(DEFAULT_TIMEOUT, "sr-m to connect", || async {
        Ok((t.principal_connects("sr-m") > 0).then_some(()))
    })
    .await
    .with_context(|| t.logs())?;
    let manual_after = secrets.get("cluster-sr-m").await?;
    ensure!(
        manual_after.metadata.resource_version == manual_before.metadata.resource_version,
        "the operator's secret was rewritten"
    );

    // The bearer token routes to sr-a; the client certificate alone names no agent.
    tests::live::application_on_agent(&t, "sr-a", "gb").await?;
    let spoke = t.spoke("sr-a")?;
    ensure_namespace(&spoke, "guestbook").await?;
    let cms: Api<ConfigMap> = Api::namespaced(spoke, "guestbook");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "ui",
            "annotations": {"argocd.argoproj.io/tracking-id": "gb:/ConfigMap:guestbook/ui"}}}))?,
    )
    .await?;
    let proxy = t.resource_proxy_addr().context("resource proxy")?;
    let scratch = tempfile::tempdir()?;
    let kubectl = Kubectl::new(&tests::live::cluster_kubeconfig_via(&t, "sr-a", scratch.path(), Some(proxy)).await?)?;
    kubectl.ok(["get", "configmap", "ui", "-n", "guestbook", "-o", "name"]).await?;

    // A broken token is refused (401), and renewed when the agent next authenticates.
    let mut broken = config(&registered)?;
    broken["bearerToken"] = json!("not-a-token");
    let patch = json!({"stringData": {"config": broken.to_string()}});
    secrets.patch("cluster-sr-a", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let kubectl = Kubectl::new(&tests::live::cluster_kubeconfig_via(&t, "sr-a", scratch.path(), Some(proxy)).await?)?;
    let refused = kubectl.fails(["get", "configmap", "ui", "-n", "guestbook"]).await?;
    ensure!(refused.stderr.contains("must be logged in"), "401: {refused}");
    t.kill_agent("sr-a")?;
    t.start_agent("sr-a").await?;
    let renewed = wait_for_async(DEFAULT_TIMEOUT, "the token renewed", || async {
        let s = secrets.get("cluster-sr-a").await?;
        Ok(config(&s)?["bearerToken"].as_str().filter(|t| *t != "not-a-token").map(str::to_owned))
    })
    .await?;
    ensure!(renewed.split('.').count() == 3, "{renewed}");
    let kubectl = Kubectl::new(&tests::live::cluster_kubeconfig_via(&t, "sr-a", scratch.path(), Some(proxy)).await?)?;
    kubectl.ok(["get", "configmap", "ui", "-n", "guestbook", "-o", "name"]).await?;
    Ok(())
}
