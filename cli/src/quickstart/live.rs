//! Live resources in the quickstart: the principal's resource proxy, the managed agent's cluster
//! secret written by `argocd-agentctl agent create` (what the hub's Argo CD would use), a
//! kubeconfig made from it, and a ConfigMap on the managed spoke tracked as if Argo CD had
//! deployed it, so kubectl can read it through the principal.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, AttachParams, LogParams, PostParams};
use principal::cluster_secret::ClusterSecret;
use serde_json::json;

/// The namespace and name of the tracked demo object on the managed spoke.
pub(super) const DEMO_NS: &str = "guestbook";
pub(super) const DEMO_NAME: &str = "guestbook-ui";
/// The tracked demo Pod on the managed spoke (run by its simulated node).
pub(super) const DEMO_POD: &str = "guestbook-ui-0";
/// How long the demo waits for the Pod to run and answer through the proxy.
const POD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Where the principal's log says the resource proxy listens.
pub(super) fn proxy_addr(principal_log: &Path) -> anyhow::Result<String> {
    let log = std::fs::read_to_string(principal_log).context("the principal's log")?;
    log.lines()
        .filter_map(|l| l.strip_prefix("resource proxy listening on "))
        .next_back()
        .map(|a| a.trim().to_owned())
        .context("the principal did not report its resource proxy")
}

/// The tracked demo ConfigMap on the managed spoke (created once).
pub(super) async fn demo_object(spoke: &kube::Client) -> anyhow::Result<()> {
    super::ensure_namespace(spoke, DEMO_NS).await?;
    let api: Api<ConfigMap> = Api::namespaced(spoke.clone(), DEMO_NS);
    if api.get_opt(DEMO_NAME).await?.is_none() {
        let cm = serde_json::from_value(json!({
            "metadata": {"name": DEMO_NAME, "annotations": {
                "argocd.argoproj.io/tracking-id": format!("guestbook:/ConfigMap:{DEMO_NS}/{DEMO_NAME}")}},
            "data": {"message": "read through the principal's resource proxy"},
        }))?;
        api.create(&PostParams::default(), &cm).await.context("cannot create the demo ConfigMap")?;
    }
    Ok(())
}

/// The tracked demo Pod on the managed spoke (created once): it prints a numbered line every
/// second, so `kubectl logs -f` through the principal has something to follow.
pub(super) async fn demo_pod(spoke: &kube::Client) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(spoke.clone(), DEMO_NS);
    if api.get_opt(DEMO_POD).await?.is_none() {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": DEMO_POD, "annotations": {
                "argocd.argoproj.io/tracking-id": format!("guestbook:/Pod:{DEMO_NS}/{DEMO_POD}")}},
            "spec": {"containers": [{
                "name": "guestbook-ui",
                "image": "guestbook-ui:simulated",
                "command": ["sh", "-c", "i=0; while true; do echo \"guestbook-ui: served request $i\"; i=$((i+1)); sleep 1; done"],
            }]},
        }))?;
        api.create(&PostParams::default(), &pod).await.context("cannot create the demo Pod")?;
    }
    Ok(())
}

/// Through the proxy with `kubeconfig`, as kubectl would: waits for the demo Pod's first log
/// line, and runs `echo` in it. Returns the line and what `echo` printed.
pub(super) async fn pod_through_proxy(kubeconfig: &Path) -> anyhow::Result<(String, String)> {
    let text = std::fs::read_to_string(kubeconfig).with_context(|| format!("cannot read {}", kubeconfig.display()))?;
    let client = principal::cluster_secret::proxy_client(&serde_json::from_str(&text)?).await?;
    let api: Api<Pod> = Api::namespaced(client, DEMO_NS);
    let deadline = tokio::time::Instant::now() + POD_TIMEOUT;
    let line = loop {
        let last = match api.logs(DEMO_POD, &LogParams { tail_lines: Some(1), ..LogParams::default() }).await {
            Ok(log) if !log.trim().is_empty() => break log.trim().to_owned(),
            Ok(_) => "no line yet".to_owned(),
            Err(e) => e.to_string(),
        };
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no log line of pod {DEMO_NS}/{DEMO_POD} through the resource proxy within {POD_TIMEOUT:?} (last: {last})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    };
    let params = AttachParams::default().stdin(false).stdout(true).stderr(false);
    let mut process = api
        .exec(DEMO_POD, ["echo", "hello from the managed spoke"], &params)
        .await
        .context("exec in the demo Pod through the resource proxy")?;
    let mut out = String::new();
    if let Some(mut stdout) = process.stdout() {
        tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut out).await.context("the exec's output")?;
    }
    process.join().await.context("the exec's end")?;
    Ok((line, out.trim().to_owned()))
}

/// A kubeconfig reaching `agent`'s cluster through the resource proxy with the credentials of
/// its cluster secret on the hub, written to `out`.
pub(super) async fn kubeconfig(
    hub: &kube::Client,
    namespace: &str,
    agent: &str,
    out: &Path,
) -> anyhow::Result<PathBuf> {
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), namespace);
    let name = principal::cluster_secret::secret_name(agent);
    let cs = ClusterSecret::from_secret(secrets.get(&name).await.with_context(|| format!("secret {name}"))?)?;
    std::fs::write(out, serde_json::to_string_pretty(&cs.kubeconfig()?)?)
        .with_context(|| format!("cannot write {}", out.display()))?;
    Ok(out.to_path_buf())
}

/// Reads the demo ConfigMap through the proxy with `kubeconfig`, as kubectl would.
pub(super) async fn read_through_proxy(kubeconfig: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(kubeconfig).with_context(|| format!("cannot read {}", kubeconfig.display()))?;
    let client = principal::cluster_secret::proxy_client(&serde_json::from_str(&text)?).await?;
    let api: Api<ConfigMap> = Api::namespaced(client, DEMO_NS);
    // A rerun on the same --dir finds the first run's statuses on the hub, so the demo may be
    // "in sync" before the managed agent's stream is up: a 502 (agent not connected) is retried
    // until the deadline.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match api.get(DEMO_NAME).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 502 && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).context("reading the demo ConfigMap through the resource proxy"),
        }
    }
}
