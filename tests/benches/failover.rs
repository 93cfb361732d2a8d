//! Failover at scale: principal replicas sharing one hub's agents (`--agent-leases`,
//! docs/ha.md), driven by the load generator (`tests::loadgen`), release binaries on an embedded
//! hub API server.
//!
//! - **replicas**: 3 principals with `--agent-leases`; `BENCH_FAILOVER_AGENTS` (10,000) managed
//!   agents spread over them as a Service spreads connections (agent `i` dials replica `i mod 3`,
//!   the next one after a failed connect or an ended stream). Once every agent is resynced, the
//!   replica holding the most agents is SIGKILLed; measured: until every one of its agents is
//!   attached to a survivor and resynced, and until a change made on the hub right after the
//!   kill has reached **every** agent (nothing lost across the failover). Then the Leases are
//!   counted: none may still name the killed replica's agents' old owner.
//! - **baseline, same run**: one principal without Leases and the same agents; SIGKILLed and
//!   restarted on its port (what a lone principal's failover is: a restart); until every agent
//!   is resynced again.
//!
//! Run: `cargo build --release -p cli && cargo bench -p tests --bench failover`
//! (`BENCH_FAILOVER_AGENTS`, `BENCH_FAILOVER_TIMEOUT` seconds (600); `BENCH_QUICK=1`: 60 agents).
//! Each agent holds one TCP connection in this process: `ulimit -n` must exceed the size.
//! Figures are printed, never asserted, except that the failover completes.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::api::{Api, ListParams};
use tests::loadgen::{LoadConfig, LoadGen};
use tests::loadhub::{LoadHub, LoadPrincipal, NS, fanout_project, progress, projects};

type Res<T> = anyhow::Result<T>;

const REPLICAS: usize = 3;
/// The replicas' Lease duration: the default.
const LEASE: &str = "15s";

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Waits until `done()`, polling; fails at `timeout` naming `what`.
async fn until(what: &str, timeout: Duration, mut done: impl AsyncFnMut() -> Res<bool>) -> Res<Duration> {
    let started = Instant::now();
    loop {
        if done().await? {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(started.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many agents' Leases name each holder.
async fn lease_holders(hub: &LoadHub) -> Res<std::collections::BTreeMap<String, usize>> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(hub.api.client(), NS);
    let list = leases.list(&ListParams::default().labels("argocd-agent.argoproj-labs.io/lease=agent")).await?;
    let mut holders = std::collections::BTreeMap::new();
    for lease in list.items {
        let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
        *holders.entry(holder).or_insert(0) += 1;
    }
    Ok(holders)
}

struct Failover {
    connect_all: Duration,
    victim_agents: usize,
    reattached: Duration,
    change_everywhere: Duration,
    takeovers_live: f64,
    takeovers_expired: f64,
    holders_after: std::collections::BTreeMap<String, usize>,
}

async fn replicas(hub: &LoadHub, agents: usize, timeout: Duration) -> Res<Failover> {
    let mut principals = Vec::new();
    for i in 0..REPLICAS {
        let name = format!("r{i}");
        let extra = ["--agent-leases", "--replica-name", &name, "--agent-lease-duration", LEASE];
        principals.push(LoadPrincipal::start_with(hub, &hub.keys[0], 0, Instant::now(), &extra)?.0);
    }
    let mut config = LoadConfig::new(principals[0].addr(), agents);
    config.more_principals = principals[1..].iter().map(LoadPrincipal::addr).collect();
    let started = Instant::now();
    let load = LoadGen::start(config);
    let connect_all = load.wait_all_resynced(started, timeout, progress("replicas, first connect", agents)).await?;
    let mut connected = Vec::new();
    for p in &principals {
        connected.push(p.metric_sum("argocd_principal_connected_agents", "").await? as usize);
    }
    eprintln!("  agents per replica: {connected:?}");
    let victim = (0..REPLICAS).max_by_key(|i| connected[*i]).context("no replica")?;
    let victim_agents = connected[victim];

    let marker = "changed right after a replica was killed";
    load.expect_marker(marker);
    let killed = Instant::now();
    principals[victim].process.sigkill()?;
    let patch = kube::api::Patch::Merge(serde_json::json!({"spec": {"description": marker}}));
    projects(hub).patch(tests::loadhub::FANOUT_PROJECT, &kube::api::PatchParams::default(), &patch).await?;
    let survivors: Vec<&LoadPrincipal> =
        principals.iter().enumerate().filter(|(i, _)| *i != victim).map(|(_, p)| p).collect();
    let reattached = until("every agent of the killed replica to resync on a survivor", timeout, async || {
        let mut on_survivors = 0;
        for p in &survivors {
            on_survivors += p.metric_sum("argocd_principal_connected_agents", "").await? as usize;
        }
        Ok(on_survivors >= agents && load.resynced_since(killed) >= victim_agents)
    })
    .await?;
    let (_, change_everywhere) = load.wait_all_marked(killed, timeout).await?;
    let (mut takeovers_live, mut takeovers_expired) = (0.0, 0.0);
    for p in &survivors {
        takeovers_live += p.metric_sum("argocd_principal_agent_lease_takeovers_total", "from=\"live\"").await?;
        takeovers_expired += p.metric_sum("argocd_principal_agent_lease_takeovers_total", "from=\"expired\"").await?;
    }
    let holders_after = lease_holders(hub).await?;
    load.stop().await;
    Ok(Failover {
        connect_all,
        victim_agents,
        reattached,
        change_everywhere,
        takeovers_live,
        takeovers_expired,
        holders_after,
    })
}

struct Restart {
    resynced: Duration,
    change_everywhere: Duration,
}

async fn lone(hub: &LoadHub, agents: usize, timeout: Duration) -> Res<Restart> {
    let (mut principal, _) = LoadPrincipal::start(hub, &hub.keys[0], 0, Instant::now())?;
    let started = Instant::now();
    let load = LoadGen::start(LoadConfig::new(principal.addr(), agents));
    load.wait_all_resynced(started, timeout, progress("lone principal, first connect", agents)).await?;
    let marker = "changed right after the lone principal was killed";
    load.expect_marker(marker);
    let killed = Instant::now();
    principal.process.sigkill()?;
    let port = principal.port;
    drop(principal);
    let patch = kube::api::Patch::Merge(serde_json::json!({"spec": {"description": marker}}));
    projects(hub).patch(tests::loadhub::FANOUT_PROJECT, &kube::api::PatchParams::default(), &patch).await?;
    let (restarted, _) = LoadPrincipal::start(hub, &hub.keys[0], port, killed)?;
    let resynced = load.wait_all_resynced(killed, timeout, progress("lone principal, after SIGKILL", agents)).await?;
    let (_, change_everywhere) = load.wait_all_marked(killed, timeout).await?;
    load.stop().await;
    drop(restarted);
    Ok(Restart { resynced, change_everywhere })
}

#[tokio::main]
async fn main() -> Res<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let agents = tests::bench::env("BENCH_FAILOVER_AGENTS", if quick { 60 } else { 10_000 });
    let timeout = Duration::from_secs(tests::bench::env("BENCH_FAILOVER_TIMEOUT", 600) as u64);
    let hub = LoadHub::start().await?;
    projects(&hub)
        .create(&kube::api::PostParams::default(), &fanout_project("before the agents")?)
        .await
        .context("cannot create the fan-out AppProject")?;

    eprintln!("failover: {agents} agents, {REPLICAS} replicas (--agent-lease-duration {LEASE})");
    let f = replicas(&hub, agents, timeout).await?;
    eprintln!("baseline: one principal, {agents} agents, SIGKILL and restart");
    let b = lone(&hub, agents, timeout).await?;

    println!("\n## Failover: {agents} agents, {REPLICAS} replicas vs one principal restarted (same run)\n");
    println!("| measure | {REPLICAS} replicas, one SIGKILLed | baseline: one principal, SIGKILLed and restarted |");
    println!("|---|---|---|");
    println!("| agents that had to move | {} (on the killed replica) | {agents} (all) |", f.victim_agents);
    println!(
        "| until all of them were attached and resynced | **{}** | {} (restart included) |",
        secs(f.reattached),
        secs(b.resynced)
    );
    println!(
        "| until a hub change made right after the kill reached every agent | {} | {} |",
        secs(f.change_everywhere),
        secs(b.change_everywhere)
    );
    println!("| first connect of all agents | {} | |", secs(f.connect_all));
    println!(
        "| Lease takeovers on the survivors | {} from a live replica, {} from an expired one | |",
        f.takeovers_live, f.takeovers_expired
    );
    println!("| agents' Leases by holder afterwards | {:?} | |", f.holders_after);
    println!(
        "\nTarget (issue): every agent of the killed replica re-attached and resynced under 30 s: {}",
        if f.reattached < Duration::from_secs(30) { "met" } else { "NOT met" }
    );
    Ok(())
}
