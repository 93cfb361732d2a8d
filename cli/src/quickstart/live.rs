//! Live resources in the quickstart: the principal's resource proxy, the managed agent's cluster
//! secret written by `argocd-agentctl agent create` (what the hub's Argo CD would use), a
//! kubeconfig made from it, and a ConfigMap on the managed spoke tracked as if Argo CD had
//! deployed it, so kubectl can read it through the principal.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use principal::cluster_secret::ClusterSecret;
use serde_json::json;

/// The namespace and name of the tracked demo object on the managed spoke.
pub(super) const DEMO_NS: &str = "guestbook";
pub(super) const DEMO_NAME: &str = "guestbook-ui";

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
    api.get(DEMO_NAME).await.context("reading the demo ConfigMap through the resource proxy")?;
    Ok(())
}
