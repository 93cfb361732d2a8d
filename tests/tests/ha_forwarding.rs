//! Whatever replica the hub's Argo CD reaches (issue 33, item 5): with principal replicas
//! (`--agent-leases`), a resource-proxy request for an agent another replica owns is forwarded
//! to the owner over mutual TLS with the replica client certificate (`argocd-agentctl pki issue
//! replica`, subject OU `argocd-agent-principal-replica`), instead of a 502 naming the owner.
//! And nothing an agent or a proxy caller holds passes as a replica: the header that names the
//! agent of a forwarded request is refused from any other certificate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use principal::cluster_secret::ClusterSecret;
use serde_json::json;
use tests::kubectl::Kubectl;
use tests::replicas::{Replicas, TEST_LEASE, attach_to, bootstrap_args};
use tests::topology::{ARGOCD_NS, MeshOptions, Mode, StartOptions, Topology, Transport, ensure_namespace};

const TRACKING: &str = "argocd.argoproj.io/tracking-id";
const FORWARDED: &str = "x-argocd-agent-forwarded-agent";

/// Three replicas with resource proxies on loopback that forward to each other, agent-a owned
/// by replica 0, its cluster secret, and a tracked ConfigMap on its cluster.
async fn three_replicas() -> Result<(Topology, Replicas)> {
    let options = StartOptions {
        resource_proxy: true,
        start_agents: false,
        principal_args: bootstrap_args(),
        ..StartOptions::default()
    };
    let mut t =
        Topology::start_with_transport(&[("agent-a", Mode::Managed)], Transport::Mtls, MeshOptions::default(), options)
            .await?;
    t.stop_principal(Duration::from_secs(30))?;
    // The replicas' client certificate for forwarding, as an operator issues it.
    t.ctl(&["pki", "issue", "replica", "--key-algorithm", "ecdsa-p256"])?;
    t.set_principal_args(&[
        "--resource-proxy-listen-address",
        "127.0.0.1:0",
        "--replica-proxy-host",
        "127.0.0.1",
        // The resource proxy's certificate carries 127.0.0.1 (the test topology issues it so).
        "--replica-proxy-server-name",
        "127.0.0.1",
    ]);
    let r = Replicas::start(
        &t,
        &[("r0", Default::default()), ("r1", Default::default()), ("r2", Default::default())],
        TEST_LEASE,
    )
    .await?;
    attach_to(&mut t, &r, &["agent-a"], 0).await?;
    let owner_proxy = r.replica(0).resource_proxy_addr().context("replica r0 serves the resource proxy")?;
    t.ctl(&["agent", "create", "agent-a", "--resource-proxy-server", &owner_proxy.to_string()])?;
    tests::live::application_on_agent(&t, "agent-a", "gb").await?;
    let spoke = t.spoke("agent-a")?;
    ensure_namespace(&spoke, "guestbook").await?;
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "tracked", "annotations": {TRACKING: "gb:/ConfigMap:guestbook/tracked"}},
        "data": {"k": "v"},
    }))?;
    Api::<ConfigMap>::namespaced(spoke, "guestbook").create(&PostParams::default(), &cm).await?;
    Ok((t, r))
}

async fn cluster_secret(t: &Topology, agent: &str) -> Result<ClusterSecret> {
    let secrets: Api<Secret> = Api::namespaced(t.hub(), ARGOCD_NS);
    let name = principal::cluster_secret::secret_name(agent);
    Ok(ClusterSecret::from_secret(secrets.get(&name).await.with_context(|| format!("secret {name}"))?)?)
}

/// One HTTP/1.1 GET over TLS to `addr` presenting `cert_pem`/`key_pem`, with `headers`: the
/// status code and the raw answer.
async fn raw_get(
    addr: SocketAddr,
    ca_pem: &str,
    (cert_pem, key_pem): (&str, &str),
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String)> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1")?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    tls.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status line: {text:?}"))?;
    Ok((code, text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_serves_a_resource_proxy_get_for_an_agent_one_of_them_owns() -> Result<()> {
    let (t, r) = three_replicas().await?;
    let scratch = tempfile::tempdir()?;
    for index in 0..3 {
        let replica = r.replica(index);
        let proxy = replica.resource_proxy_addr().with_context(|| format!("replica {} proxy", replica.name()))?;
        let dir = scratch.path().join(replica.name());
        std::fs::create_dir_all(&dir)?;
        // What the hub's Argo CD does through whichever replica the Service picks.
        let kubectl = Kubectl::new(&tests::live::cluster_kubeconfig_via(&t, "agent-a", &dir, Some(proxy)).await?)?;
        let got = kubectl
            .ok(["get", "configmap", "tracked", "-n", "guestbook", "-o", "jsonpath={.data.k}"])
            .await
            .with_context(|| format!("through replica {}\n{}", replica.name(), r.logs()))?;
        ensure!(got == "v", "through replica {}: {got:?}", replica.name());
        let refused = kubectl.fails(["get", "configmap", "nope", "-n", "guestbook"]).await?;
        ensure!(
            refused.stderr.contains("NotFound") || refused.stderr.contains("not found"),
            "the owner's agent answers through replica {}: {refused}",
            replica.name()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neither_an_agents_nor_a_proxy_callers_certificate_passes_as_a_replica() -> Result<()> {
    let (t, r) = three_replicas().await?;
    let cs = cluster_secret(&t, "agent-a").await?;
    let tls = &cs.config.tls_client_config;
    let ca = tls.ca_pem().context("the cluster secret's CA")?;
    let (proxy_cert, proxy_key) =
        (tls.cert_pem().context("cluster secret cert")?, tls.key_pem().context("cluster secret key")?);
    let pki = t.pki_dir();
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).with_context(|| format!("{f} in {}", pki.display()));
    let (agent_cert, agent_key) = (read("agent-a.crt")?, read("agent-a.key")?);
    let path = "/api/v1/namespaces/guestbook/configmaps/tracked";
    for index in [0, 1] {
        let addr = r.replica(index).resource_proxy_addr().context("proxy address")?;
        for (who, identity) in [
            ("agent", (agent_cert.as_str(), agent_key.as_str())),
            ("proxy caller", (proxy_cert.as_str(), proxy_key.as_str())),
        ] {
            let (code, text) = raw_get(addr, &ca, identity, path, &[(FORWARDED, "agent-a")]).await?;
            ensure!(
                code == 401 && text.contains(FORWARDED) && text.contains("argocd-agent-principal-replica"),
                "a {who}'s certificate naming the agent of a forwarded request at replica {index}: {code} {text}"
            );
        }
        // The proxy caller's certificate without the header still works, forwarded or not.
        let (code, text) = raw_get(addr, &ca, (&proxy_cert, &proxy_key), path, &[]).await?;
        ensure!(
            code == 200 && text.contains("tracked"),
            "the cluster secret's certificate at replica {index}: {code} {text}"
        );
    }
    Ok(())
}
