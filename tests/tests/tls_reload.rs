//! Certificates reissued while the principal and its agents run, as an operator rotates them
//! (`argocd-agentctl pki issue ... --upsert` rewrites the Secrets): the principal serves its new
//! certificate to the next connection without a restart and without dropping the live stream; an
//! agent whose certificate was reissued and whose old one is then blocklisted (rotation after a
//! compromise) reconnects with the new one by itself. Upstream reads both once at start
//! (upstream #1057: every rotation is a restart and a reconnect storm).

use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use kube::api::{Patch, PatchParams, PostParams};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use serde_json::json;
use tests::apps::{apps, converge, path_is};
use tests::topology::{ARGOCD_NS, Mode, StartOptions, Topology};

const RELOAD: &str = "200ms";

/// The leaf certificate in a PEM file.
fn leaf_in(path: &std::path::Path) -> Result<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .with_context(|| format!("{}", path.display()))?
        .next()
        .context("no certificate")?
        .context("not PEM")
}

/// SHA-256 of a certificate file's DER, as `openssl x509 -fingerprint -sha256` prints it (what
/// `argocd-agentctl blocklist tls add` takes).
fn fingerprint(path: &std::path::Path) -> Result<String> {
    let out = Command::new("openssl").args(["x509", "-noout", "-fingerprint", "-sha256", "-in"]).arg(path).output()?;
    ensure!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout)?;
    Ok(text.trim().rsplit('=').next().context("fingerprint")?.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reissued_certificates_are_used_without_restarts_and_live_streams_stay() -> Result<()> {
    let agent = "rl1";
    let options = StartOptions {
        start_agents: false,
        principal_args: vec!["--tls-reload-interval".into(), RELOAD.into()],
        ..StartOptions::default()
    };
    let mut t = Topology::start_with_options(&[(agent, Mode::Managed)], options).await?;
    t.set_agent_args(&["--tls-reload-interval", RELOAD]);
    t.start_agent(agent).await?;
    let addr = t.principal_addr().context("principal address")?;
    let pki = t.pki_dir();
    let ca = leaf_in(&pki.join("ca.crt"))?;
    let hub = apps(&t.hub(), agent);
    let spoke = apps(&t.spoke(agent)?, ARGOCD_NS);
    hub.create(&PostParams::default(), &tests::fixtures::app_with_path("rot", agent, "v1")?).await?;
    converge(&t, &spoke, "rot", "the Application before any rotation", path_is("v1")).await?;
    ensure!(t.principal_connects(agent) == 1, "{}", t.logs());

    // The principal's certificate, reissued in its Secret: new connections get it, the agent's
    // stream stays up and keeps syncing.
    let old = tests::http::presented_certificate(addr, &ca).await?;
    ensure!(old == leaf_in(&pki.join("principal.crt"))?, "the principal presents the issued certificate");
    t.issue_principal_certificate(true)?;
    let new = leaf_in(&pki.join("principal.crt"))?;
    ensure!(new != old, "reissuing makes a new certificate");
    tests::wait_until_async(Duration::from_secs(30), "the principal to present its reissued certificate", || {
        let new = new.clone();
        let ca = ca.clone();
        async move { tests::http::presented_certificate(addr, &ca).await.is_ok_and(|c| c == new) }
    })
    .await
    .with_context(|| t.logs())?;
    let merge = |path: &str| Patch::Merge(json!({"spec": {"source": {"path": path}}}));
    hub.patch("rot", &PatchParams::default(), &merge("v2")).await?;
    converge(&t, &spoke, "rot", "a change after the principal's rotation", path_is("v2")).await?;
    ensure!(t.principal_connects(agent) == 1, "the agent's stream survived the rotation\n{}", t.logs());

    // The agent's certificate, reissued in its cluster's Secret, then the old one blocklisted (a
    // compromised key): the principal ends the stream, and the agent comes back with the new
    // certificate on its own. Without reloading it would present the blocked one forever.
    let old_agent = fingerprint(&pki.join(format!("{agent}.crt")))?;
    t.ctl(&["--agent-context", agent, "pki", "issue", "agent", agent, "--upsert", "--key-algorithm", "ecdsa-p256"])?;
    tests::wait_until_async(Duration::from_secs(30), "the agent to reload its certificate", || async {
        agent_reloaded(&t, agent)
    })
    .await
    .with_context(|| t.logs())?;
    t.ctl(&["blocklist", "tls", "add", &old_agent, "--reason", "rotated after a compromise"])?;
    tests::wait_until_async(Duration::from_secs(60), "the agent to reconnect with its new certificate", || async {
        t.principal_connects(agent) >= 2
    })
    .await
    .with_context(|| {
        let mut lines = Vec::new();
        for needle in ["blocklist", "revoked", "refused", "agent connected", "TLS"] {
            lines.extend(t.principal_log_lines(needle).into_iter().filter(|l| !l.contains("DEBUG")));
            lines.extend(t.agent_log_lines(agent, needle).into_iter().filter(|l| !l.contains("DEBUG")));
        }
        lines.join("\n")
    })?;
    hub.patch("rot", &PatchParams::default(), &merge("v3")).await?;
    converge(&t, &spoke, "rot", "a change after the agent's rotation", path_is("v3")).await?;
    Ok(())
}

/// Whether the agent's log says it reloaded its TLS material.
fn agent_reloaded(t: &Topology, agent: &str) -> bool {
    t.agent_log_lines(agent, "TLS material changed").iter().any(|l| l.contains("agent TLS"))
}
