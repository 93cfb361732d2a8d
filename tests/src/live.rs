//! Live resources through the principal's resource proxy: the client side of what Argo CD does.

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::{Value, json};

use crate::topology::{ARGOCD_NS, Topology};

/// A kubeconfig built from agent `agent`'s cluster secret on the hub, as Argo CD reads it:
/// `server`, and `config.tlsClientConfig` (base64 PEM), written into `dir`.
///
/// # Errors
/// No such secret, or it lacks a field.
pub async fn cluster_kubeconfig(t: &Topology, agent: &str, dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let secrets: Api<Secret> = Api::namespaced(t.hub(), ARGOCD_NS);
    let secret = secrets.get(&format!("cluster-{agent}")).await?;
    let data = secret.data.context("cluster secret without data")?;
    let text = |k: &str| -> Result<String> {
        Ok(String::from_utf8(data.get(k).with_context(|| format!("no {k}"))?.0.clone())?)
    };
    let server = text("server")?;
    let config: Value = serde_json::from_str(&text("config")?)?;
    let tls = &config["tlsClientConfig"];
    let field = |k: &str| tls[k].as_str().map(str::to_owned).with_context(|| format!("no tlsClientConfig.{k}"));
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": agent, "cluster": {"server": server, "certificate-authority-data": field("caData")?}}],
        "users": [{"name": agent, "user": {
            "client-certificate-data": field("certData")?,
            "client-key-data": field("keyData")?,
        }}],
        "contexts": [{"name": agent, "context": {"cluster": agent, "user": agent}}],
        "current-context": agent,
    });
    let path = dir.join(format!("{agent}.kubeconfig"));
    std::fs::write(&path, serde_json::to_string(&kubeconfig)?)?;
    Ok(path)
}
