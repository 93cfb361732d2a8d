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

/// [`cluster_kubeconfig`], presenting another client certificate (`cert_pem`, `key_pem`) than
/// the cluster secret's: what an attacker holding some other certificate of the CA would try.
///
/// # Errors
/// No such secret, or it lacks a field.
pub async fn cluster_kubeconfig_as(
    t: &Topology,
    agent: &str,
    dir: &std::path::Path,
    cert_pem: &str,
    key_pem: &str,
) -> Result<std::path::PathBuf> {
    let mut cs = cluster_secret(t, agent).await?;
    let ca = cs.config.tls_client_config.ca_pem().context("the cluster secret names no CA")?;
    cs.config.tls_client_config.set(cert_pem, key_pem, &ca);
    let path = dir.join(format!("{agent}-as-other.kubeconfig"));
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

/// Issues a resource-proxy client certificate with CN `cn` from the hub's CA
/// (`argocd-agent-ca`), marked as `argocd-agentctl pki issue shared-client` marks it, and stores
/// it with the CA in Secret `name` of the principal's namespace (`tls.crt`, `tls.key`,
/// `ca.crt`), as `--self-registration-client-cert-secret` expects.
///
/// # Errors
/// The CA cannot be read or used, or the Secret cannot be written.
pub async fn issue_shared_client_cert(t: &Topology, name: &str, cn: &str) -> Result<()> {
    let ca = t.hub_ca().await?;
    let issued = ca.proxy_client(cn)?;
    let (cert, key, ca_pem) = (issued.cert, issued.key, ca.pem);
    let secrets: Api<Secret> = Api::namespaced(t.hub(), ARGOCD_NS);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": cert, "tls.key": key, "ca.crt": ca_pem},
    }))?;
    secrets.create(&kube::api::PostParams::default(), &secret).await?;
    Ok(())
}

/// Creates Application `name` on the hub for managed agent `agent` (in its hub namespace,
/// deploying in-cluster) and waits until the agent holds its copy: the resource proxy serves
/// only what an Application of the agent manages, and Argo CD names it `name` in tracking ids.
///
/// # Errors
/// The Application cannot be created, or it does not reach the agent's cluster in time.
pub async fn application_on_agent(t: &Topology, agent: &str, name: &str) -> Result<()> {
    let hub = crate::apps::apps(&t.hub(), agent);
    hub.create(&kube::api::PostParams::default(), &crate::fixtures::app_with_path(name, agent, "live")?).await?;
    let spoke = crate::apps::apps(&t.spoke(agent)?, ARGOCD_NS);
    crate::wait::wait_until_async(crate::wait::DEFAULT_TIMEOUT, &format!("Application {name} on {agent}"), || {
        let spoke = spoke.clone();
        async move { spoke.get_opt(name).await.is_ok_and(|a| a.is_some()) }
    })
    .await
}
