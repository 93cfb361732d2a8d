//! Upstream v0.10's SPIRE, as upstream does it, against ours (issue #32, item 9): the Go peer
//! plays upstream's SPIRE principal (`--spire-auth-method mtls`, `--auth` empty, so
//! `mtls:uri:spiffe://[^/]+/(.+)`: method `mtls`, the agent is capture group 1 of the verified
//! client certificate's URI SAN) and our agent runs with upstream's flags
//! (`--spire-agent-socket <Workload API> --spire-auth-method mtls`), its X.509-SVID from a fake
//! SPIFFE Workload API (`mesh::workload::testing`). Before, our agent refused the flags; with
//! `--creds spiffe:x509` it sent method `spiffe-x509`, which upstream's principal does not know.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;

use anyhow::{Context as _, ensure};
use base64::Engine as _;
use mesh::workload::testing::{FakeWorkloadApi, TestCa, X509Material};
use tests::gopeer::{GoPeer, OUR_VERSION};
use tests::topology::{Mode, Topology};

const TD: &str = "cluster.local";
const PRINCIPAL_ID: &str = "spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal";
/// Upstream's default when SPIRE is on with `--spire-auth-method mtls` and `--auth` is empty.
const UPSTREAM_MTLS_REGEX: &str = "spiffe://[^/]+/(.+)";

fn pem(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = body.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap_or_default()).collect();
    format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", lines.join("\n"))
}

/// Upstream's SPIRE principal: its X.509-SVID as server certificate, client certificates
/// verified against the trust bundle, agents by URI SAN regex.
async fn upstream_spire_principal(ca: &TestCa, dir: &Path) -> anyhow::Result<(GoPeer, std::net::SocketAddr)> {
    let svid = ca.issue(PRINCIPAL_ID)?;
    let (bundle, cert, key) = (dir.join("bundle.crt"), dir.join("principal.crt"), dir.join("principal.key"));
    std::fs::write(&bundle, pem("CERTIFICATE", ca.der()))?;
    std::fs::write(&cert, pem("CERTIFICATE", &svid.cert_der))?;
    std::fs::write(&key, pem("PRIVATE KEY", &svid.key_der))?;
    let args: Vec<&std::ffi::OsStr> = vec![
        "principal".as_ref(),
        "--ca".as_ref(),
        bundle.as_os_str(),
        "--cert".as_ref(),
        cert.as_os_str(),
        "--key".as_ref(),
        key.as_os_str(),
        "--version".as_ref(),
        OUR_VERSION.as_ref(),
        "--auth-uri-regex".as_ref(),
        UPSTREAM_MTLS_REGEX.as_ref(),
    ];
    let mut peer = GoPeer::spawn("spire-principal", &args)?;
    let listening = peer.wait("listening", |r| r["kind"] == "listening").await?;
    let addr = listening["addr"].as_str().context("listening without addr")?.parse()?;
    Ok((peer, addr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_spire_principal_takes_our_agent_with_upstreams_spire_flags() -> anyhow::Result<()> {
    let name = "agent-spx";
    let ca = TestCa::new(TD)?;
    // The agent's SVID: upstream's regex takes the whole path as the agent's name.
    let agent_api =
        FakeWorkloadApi::start(Some(X509Material::new(&ca, &format!("spiffe://{TD}/{name}"))?), None).await?;
    let dir = tempfile::tempdir()?;
    let (mut go, addr) = upstream_spire_principal(&ca, dir.path()).await?;

    let mut topo = Topology::start_without_agents(&[(name, Mode::Managed)]).await?;
    let endpoint = agent_api.endpoint();
    topo.set_agent_args(&["--spire-agent-socket", &endpoint, "--spire-auth-method", "mtls", "--agent-name", name]);
    topo.start_agent_via(name, addr).await?;
    let auth =
        go.wait("our agent to authenticate", |r| r["kind"] == "authenticate").await.with_context(|| topo.logs())?;
    ensure!(auth["agent"] == name && auth["method"] == "mtls", "upstream's SPIRE principal saw {auth}");
    go.wait("our agent to subscribe", |r| r["kind"] == "subscribed").await.with_context(|| topo.logs())?;
    Ok(())
}
