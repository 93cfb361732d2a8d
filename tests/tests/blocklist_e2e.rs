//! The blocklist end to end, with spawned binaries over mTLS: an entry added with
//! `argocd-agentctl blocklist` disconnects the live agent within seconds, its `Authenticate` is
//! refused (naming the entry) for as long as the entry is listed, and removing the entry lets it
//! reconnect and sync again. Both forms: upstream's certificate fingerprint and our agent name.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, PostParams};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use tests::fixtures::{application_without_finalizers, applications, dynamic};
use tests::http::get;
use tests::topology::{ARGOCD_NS, Mode, Topology};
use tests::{wait_for_async, wait_until_async, workspace_binary};

const AGENT: &str = "blocked-1";
/// How long anything but the disconnection may take on a busy machine.
const WAIT: Duration = Duration::from_secs(60);
/// How long an unblocked agent may take to reconnect: its `Authenticate` retries and its stream
/// reconnects back off (up to 30 s each) while it is refused.
const RECONNECT: Duration = Duration::from_secs(120);
/// How soon a blocklisted live agent must be disconnected: the principal applies the list on
/// the ConfigMap's watch event.
const DISCONNECT_WITHIN: Duration = Duration::from_secs(15);
const CONFIG_MAP: &str = "argocd-agent-tls-blocklist";
const REFUSALS: &str = "method=\"mtls\",reason=\"refused_by_principal\"";

/// The agent's `/healthz` status: 200 while connected to the principal, 503 otherwise.
async fn health(addr: SocketAddr) -> Option<u16> {
    get(addr, "/healthz").await.ok().map(|(status, _)| status)
}

async fn wait_health(t: &Topology, addr: SocketAddr, want: u16, within: Duration, what: &str) -> Result<()> {
    wait_until_async(within, what, || async { health(addr).await == Some(want) }).await.with_context(|| t.logs())
}

/// Authentications the principal refused because of the blocklist (its SessionHook).
async fn refusals(t: &Topology) -> Result<u64> {
    let addr = t.principal_metrics_addr().context("the principal's metrics address")?;
    let (status, text) = get(addr, "/metrics").await?;
    ensure!(status == 200, "GET /metrics: {status}");
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(tests::http::sample(&text, "argocd_principal_auth_failures_total", REFUSALS).map_or(0, |v| v as u64))
}

/// The tail of the agent's log (its section of [`Topology::logs`], the last one).
fn agent_log(t: &Topology) -> String {
    let logs = t.logs();
    let header = format!("--- agent {AGENT}\n");
    logs.split_once(&header).map(|(_, rest)| rest.to_owned()).unwrap_or_default()
}

/// `argocd-agentctl` against the hub, as an operator runs it.
fn ctl(t: &Topology, args: &[&str]) -> Result<String> {
    let out = Command::new(workspace_binary("argocd-agentctl")?)
        .arg("--kubeconfig")
        .arg(t.kubeconfig())
        .args(["--principal-context", "hub"])
        .args(args)
        .output()
        .context("cannot run argocd-agentctl")?;
    if !out.status.success() {
        bail!("argocd-agentctl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The upper-case hex SHA-256 of the agent's client certificate, from its secret on the spoke.
async fn client_cert_fingerprint(t: &Topology) -> Result<String> {
    let secrets: Api<Secret> = Api::namespaced(t.spoke(AGENT)?, ARGOCD_NS);
    let secret = secrets.get("argocd-agent-client-tls").await?;
    let pem = secret.data.as_ref().and_then(|d| d.get("tls.crt")).context("no tls.crt in the client secret")?;
    let leaf = CertificateDer::pem_slice_iter(&pem.0).next().context("no certificate in tls.crt")??;
    auth::Binding::certificate(&leaf).fingerprint().context("a certificate binding has a fingerprint")
}

fn app(name: &str) -> Result<DynamicObject> {
    dynamic(application_without_finalizers(name, AGENT, "HEAD"))
}

async fn wait_on_spoke(t: &Topology, spoke: &Api<DynamicObject>, name: &str) -> Result<()> {
    wait_until_async(WAIT, &format!("Application {name} to reach the spoke"), || async {
        spoke.get_opt(name).await.ok().flatten().is_some()
    })
    .await
    .with_context(|| t.logs())
}

/// Blocks with `block`, checks the agent is disconnected and kept out, unblocks with
/// `unblock` and checks it comes back.
async fn block_and_unblock(
    t: &Topology,
    health_addr: SocketAddr,
    block: &[&str],
    refusal: &str,
    unblock: &[&str],
) -> Result<()> {
    let refused_before = refusals(t).await?;
    let connects_before = t.principal_connects(AGENT);
    let blocked_at = Instant::now();
    let out = ctl(t, block)?;
    ensure!(out.contains("Added to blocklist"), "{out}");
    wait_health(t, health_addr, 503, DISCONNECT_WITHIN, "the blocklisted agent to be disconnected").await?;
    eprintln!("blocklisted agent disconnected {:?} after the entry was added", blocked_at.elapsed());

    // Its Authenticate is refused, naming the entry and the ConfigMap, and keeps being refused.
    wait_until_async(WAIT, "the agent to log the principal's refusal", || async {
        let log = agent_log(t);
        log.contains("authentication failed")
            && log.contains("is blocklisted")
            && log.contains(refusal)
            && log.contains(CONFIG_MAP)
    })
    .await
    .with_context(|| t.logs())?;
    wait_until_async(WAIT, "the principal to refuse two authentications", || async {
        refusals(t).await.is_ok_and(|n| n >= refused_before + 2)
    })
    .await
    .with_context(|| t.logs())?;
    ensure!(health(health_addr).await == Some(503), "the blocklisted agent reconnected:\n{}", t.logs());
    ensure!(
        t.principal_connects(AGENT) == connects_before,
        "the principal accepted a stream of the blocklisted agent:\n{}",
        t.logs()
    );

    let out = ctl(t, unblock)?;
    ensure!(out.contains("Removed from blocklist"), "{out}");
    let unblocked_at = Instant::now();
    wait_health(t, health_addr, 200, RECONNECT, "the agent to reconnect once unblocked").await?;
    eprintln!("agent reconnected {:?} after the entry was removed", unblocked_at.elapsed());
    Ok(())
}

/// A topology with the agent connected and syncing: an Application created on the hub reaches
/// the spoke.
async fn connected() -> Result<(Topology, SocketAddr, Api<DynamicObject>, Api<DynamicObject>)> {
    let t = Topology::start(&[(AGENT, Mode::Managed)]).await?;
    let health_addr = wait_for_async(WAIT, "the agent's healthz address", || async { Ok(t.agent_healthz_addr(AGENT)) })
        .await
        .with_context(|| t.logs())?;
    wait_health(&t, health_addr, 200, WAIT, "the agent to connect").await?;
    let hub = applications(t.hub(), AGENT);
    let spoke = applications(t.spoke(AGENT)?, ARGOCD_NS);
    hub.create(&PostParams::default(), &app("before")?).await?;
    wait_on_spoke(&t, &spoke, "before").await?;
    Ok((t, health_addr, hub, spoke))
}

/// Upstream's form: the client certificate's fingerprint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocklist_entry_disconnects_a_live_agent_and_prevents_its_reconnection() -> Result<()> {
    let (t, health_addr, hub, spoke) = connected().await?;
    // Given as `openssl x509 -fingerprint -sha256` prints it (here lower-cased).
    let fingerprint = client_cert_fingerprint(&t).await?;
    let openssl_form = fingerprint
        .as_bytes()
        .chunks(2)
        .map(|c| String::from_utf8_lossy(c).to_lowercase())
        .collect::<Vec<_>>()
        .join(":");
    block_and_unblock(
        &t,
        health_addr,
        &["blocklist", "tls", "add", &openssl_form, "--reason", "e2e: key leaked"],
        &fingerprint,
        &["blocklist", "tls", "remove", &fingerprint],
    )
    .await?;
    // Synced again: an Application created on the hub after the reconnect reaches the spoke.
    hub.create(&PostParams::default(), &app("after")?).await?;
    wait_on_spoke(&t, &spoke, "after").await?;
    ensure!(ctl(&t, &["blocklist", "list"])?.contains("No entries"), "the blocklist is empty again");
    Ok(())
}

/// Ours: by agent name, whatever its certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_name_entry_disconnects_and_keeps_out_the_agent() -> Result<()> {
    let (t, health_addr, hub, spoke) = connected().await?;
    let key = format!("agent.{AGENT}");
    block_and_unblock(
        &t,
        health_addr,
        &["blocklist", "agent", "add", AGENT, "--reason", "e2e: decommissioned"],
        &key,
        &["blocklist", "agent", "remove", AGENT],
    )
    .await?;
    hub.create(&PostParams::default(), &app("after")?).await?;
    wait_on_spoke(&t, &spoke, "after").await?;
    Ok(())
}
