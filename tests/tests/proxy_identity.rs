//! Who may call the resource proxy (docs/security.md, "Threats and bounds"): one CA issues both
//! the agents' gRPC client certificates and the cluster secrets' resource-proxy client
//! certificates, so the proxy tells them apart by the mark only the CA can put on the latter.
//! An agent's own certificate (readable on its spoke) is refused with a reason naming the mark;
//! the cluster secret's certificate `argocd-agentctl agent create` issued keeps working, with
//! real kubectl, as the hub's Argo CD uses it.

use anyhow::{Context as _, Result, ensure};
use tests::kubectl::Kubectl;
use tests::topology::{Mode, StartOptions, Topology};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_own_certificate_does_not_open_the_resource_proxy() -> Result<()> {
    let options = StartOptions { resource_proxy: true, ..StartOptions::default() };
    let t = Topology::start_with_options(&[("agent-a", Mode::Managed)], options).await?;
    let proxy = t.resource_proxy_addr().context("the principal serves the resource proxy")?;
    t.ctl(&["agent", "create", "agent-a", "--resource-proxy-server", &proxy.to_string()])?;
    let scratch = tempfile::tempdir()?;

    // The cluster secret's certificate: marked, admitted (the version answer needs no agent).
    let argocd = Kubectl::new(&tests::live::cluster_kubeconfig(&t, "agent-a", scratch.path()).await?)?;
    let version = argocd.ok(["get", "--raw", "/version"]).await?;
    ensure!(version.contains("argocd-agent"), "{version}");

    // The agent's own gRPC client certificate, from the same CA: refused, naming the mark.
    let pki = t.pki_dir();
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).with_context(|| format!("{f} in {}", pki.display()));
    let (cert, key) = (read("agent-a.crt")?, read("agent-a.key")?);
    let as_agent =
        Kubectl::new(&tests::live::cluster_kubeconfig_as(&t, "agent-a", scratch.path(), &cert, &key).await?)?;
    for path in ["/version", "/api/v1/namespaces/default/configmaps/x"] {
        let refused = as_agent.fails(["get", "--raw", path]).await?;
        ensure!(
            refused.stderr.contains("Unauthorized") || refused.stderr.contains("not a resource-proxy client"),
            "{path}: {refused}"
        );
    }
    let refused = as_agent.fails(["get", "configmap", "x", "-n", "default", "-v=8"]).await?;
    ensure!(refused.stderr.contains("argocd-agent-resource-proxy-client"), "the refusal names the mark: {refused}");
    Ok(())
}
