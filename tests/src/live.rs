//! Live resources through the principal's resource proxy: the client side of what Argo CD does.

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use principal::cluster_secret::ClusterSecret;
use serde_json::json;

use crate::topology::{ARGOCD_NS, Topology};

/// A kubeconfig built from agent `agent`'s cluster secret on the hub, as Argo CD reads it:
/// `server`, `config.tlsClientConfig` (base64 PEM) and `config.bearerToken`, written into `dir`.
///
/// # Errors
/// No such secret, or it lacks a field.
pub async fn cluster_kubeconfig(t: &Topology, agent: &str, dir: &std::path::Path) -> Result<std::path::PathBuf> {
    cluster_kubeconfig_via(t, agent, dir, None).await
}

/// [`cluster_kubeconfig`], with the server's `host:port` replaced by `proxy` (a self-registered
/// secret names the address Argo CD reaches, not the test's loopback port); a bearer token in
/// the secret goes in too.
///
/// # Errors
/// No such secret, or it lacks a field.
pub async fn cluster_kubeconfig_via(
    t: &Topology,
    agent: &str,
    dir: &std::path::Path,
    proxy: Option<std::net::SocketAddr>,
) -> Result<std::path::PathBuf> {
    let mut cs = cluster_secret(t, agent).await?;
    if let Some(proxy) = proxy {
        let query = cs.server.split_once('?').map(|(_, q)| format!("?{q}")).unwrap_or_default();
        cs.server = format!("https://{proxy}{query}");
    }
    let path = dir.join(format!("{agent}.kubeconfig"));
    std::fs::write(&path, serde_json::to_string(&cs.kubeconfig()?)?)?;
    Ok(path)
}

/// A kube-rs client reaching `agent`'s cluster through the resource proxy with its cluster
/// secret's credentials, as the hub's Argo CD does.
///
/// # Errors
/// No such secret, or it is unusable.
pub async fn cluster_client(t: &Topology, agent: &str) -> Result<kube::Client> {
    Ok(cluster_secret(t, agent).await?.client().await?)
}

async fn cluster_secret(t: &Topology, agent: &str) -> Result<ClusterSecret> {
    let secrets: Api<Secret> = Api::namespaced(t.hub(), ARGOCD_NS);
    let name = principal::cluster_secret::secret_name(agent);
    Ok(ClusterSecret::from_secret(secrets.get(&name).await.with_context(|| format!("secret {name}"))?)?)
}

/// Issues a client certificate with CN `cn` from the hub's CA (`argocd-agent-ca`) and stores it
/// with the CA in Secret `name` of the principal's namespace (`tls.crt`, `tls.key`, `ca.crt`), as
/// `--self-registration-client-cert-secret` expects.
///
/// # Errors
/// The CA cannot be read or used, or the Secret cannot be written.
pub async fn issue_shared_client_cert(t: &Topology, name: &str, cn: &str) -> Result<()> {
    let (cert, key, ca_pem) = t.issue_client_cert(cn, &[]).await?;
    let secrets: Api<Secret> = Api::namespaced(t.hub(), ARGOCD_NS);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": cert, "tls.key": key, "ca.crt": ca_pem},
    }))?;
    secrets.create(&kube::api::PostParams::default(), &secret).await?;
    Ok(())
}
