//! `/metrics`, `/healthz` and `/readyz` of the spawned principal and agent: both expositions
//! pass `promtool check metrics`, per-agent series appear while an agent is connected and go
//! once it is gone, and the agent's health follows its connection to the principal.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use tests::bin_path::promtool_path;
use tests::http::get;
use tests::topology::{Mode, Topology};
use tests::{wait_for_async, wait_until_async};
use tokio::io::AsyncWriteExt as _;

const AGENT: &str = "agent-obs";
const WAIT: Duration = Duration::from_secs(60);

/// `/metrics` at `addr`, checked with `promtool check metrics`.
async fn scrape(addr: SocketAddr) -> Result<String> {
    let (status, text) = get(addr, "/metrics").await?;
    ensure!(status == 200, "GET /metrics: {status}\n{text}");
    let mut promtool = tokio::process::Command::new(promtool_path()?)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot run promtool")?;
    let mut stdin = promtool.stdin.take().context("promtool stdin")?;
    stdin.write_all(text.as_bytes()).await?;
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(30), promtool.wait_with_output()).await??;
    ensure!(
        out.status.success(),
        "promtool check metrics failed ({}):\n{}{}\n--- exposition\n{text}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text)
}

async fn addr_of(t: &Topology, what: &str, find: impl Fn(&Topology) -> Option<SocketAddr>) -> Result<SocketAddr> {
    wait_for_async(WAIT, what, || async { Ok(find(t)) }).await.with_context(|| t.logs())
}

async fn wait_status(t: &Topology, addr: SocketAddr, path: &str, want: u16, what: &str) -> Result<()> {
    wait_until_async(WAIT, what, || async { get(addr, path).await.is_ok_and(|(s, _)| s == want) })
        .await
        .with_context(|| t.logs())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_of_principal_and_agent() -> Result<()> {
    let mut t = Topology::start_without_agents(&[(AGENT, Mode::Managed)]).await?;
    // Remove an agent's series as soon as it is gone, so the test need not wait 15 minutes.
    // (SIGKILL: a SIGTERM this early could beat the principal's signal handler.)
    t.kill_principal()?;
    t.set_principal_args(&["--metrics-agent-retention", "0s"]);
    t.start_principal().await?;
    let p_health = addr_of(&t, "the principal's healthz address", Topology::principal_healthz_addr).await?;
    wait_status(&t, p_health, "/healthz", 200, "the principal's hub watchers to sync").await?;
    wait_status(&t, p_health, "/readyz", 200, "the principal to be ready").await?;

    t.start_agent(AGENT).await?;
    let a_health = addr_of(&t, "the agent's healthz address", |t| t.agent_healthz_addr(AGENT)).await?;
    let a_metrics = addr_of(&t, "the agent's metrics address", |t| t.agent_metrics_addr(AGENT)).await?;
    wait_status(&t, a_health, "/healthz", 200, "the agent to connect").await?;

    // Per-agent series appear for the connected agent (the resync queues events at once).
    let p_metrics = addr_of(&t, "the principal's metrics address", Topology::principal_metrics_addr).await?;
    let connected = format!("argocd_principal_agent_connected{{agent_name=\"{AGENT}\"}} 1");
    wait_until_async(WAIT, "the principal to export the agent's series", || async {
        scrape(p_metrics).await.is_ok_and(|m| m.contains(&connected))
    })
    .await
    .with_context(|| t.logs())?;
    let text = scrape(p_metrics).await?;
    for series in [
        "argocd_principal_connected_agents 1\n".to_owned(),
        format!("argocd_principal_agent_connections_total{{agent_name=\"{AGENT}\"}} 1\n"),
        format!("argocd_principal_agent_outbox_depth{{agent_name=\"{AGENT}\"}} "),
        format!("argocd_principal_agent_outbox_oldest_unacked_age_seconds{{agent_name=\"{AGENT}\"}} "),
        format!("argocd_principal_resyncs_total{{agent_name=\"{AGENT}\",result=\"started\"}} 1\n"),
        "argocd_principal_resync_duration_seconds_count{mode=\"managed\"} 1\n".to_owned(),
        "principal_events_received_total ".to_owned(),
        "argocd_agent_build_info{".to_owned(),
    ] {
        ensure!(text.contains(&series), "principal /metrics lacks {series:?}:\n{text}");
    }
    let text = scrape(a_metrics).await?;
    for series in [
        "argocd_agent_connection_status 1\n",
        "argocd_agent_connections_total 1\n",
        "argocd_agent_outbox_depth ",
        "argocd_agent_outbox_oldest_unacked_age_seconds ",
        "argocd_agent_resyncs_total{result=\"started\"} 1\n",
        "agent_events_sent_total ",
    ] {
        ensure!(text.contains(series), "agent /metrics lacks {series:?}:\n{text}");
    }

    // The agent's health follows its connection: 503 while the principal is down, 200 again
    // once it has reconnected.
    t.kill_principal()?;
    wait_status(&t, a_health, "/healthz", 503, "the agent's /healthz to turn 503").await?;
    wait_status(&t, a_health, "/readyz", 503, "the agent's /readyz to turn 503").await?;
    let text = scrape(a_metrics).await?;
    ensure!(text.contains("argocd_agent_connection_status 0\n"), "{text}");
    ensure!(text.contains("argocd_agent_reconnects_total{cause="), "no reconnect cause:\n{text}");
    t.start_principal().await?;
    wait_status(&t, a_health, "/healthz", 200, "the agent to reconnect").await?;
    ensure!(scrape(a_metrics).await?.contains("argocd_agent_connections_total 2\n"));

    // The agent goes away for good: every series naming it leaves the principal's exposition.
    let p_metrics = addr_of(&t, "the restarted principal's metrics address", Topology::principal_metrics_addr).await?;
    wait_until_async(WAIT, "the restarted principal to export the agent", || async {
        scrape(p_metrics).await.is_ok_and(|m| m.contains(&connected))
    })
    .await
    .with_context(|| t.logs())?;
    t.kill_agent(AGENT)?;
    let named = format!("agent_name=\"{AGENT}\"");
    wait_until_async(WAIT, "the agent's series to be removed", || async {
        scrape(p_metrics).await.is_ok_and(|m| !m.contains(&named))
    })
    .await
    .with_context(|| t.logs())?;
    let text = scrape(p_metrics).await?;
    ensure!(text.contains("argocd_principal_connected_agents 0\n"), "{text}");
    Ok(())
}
