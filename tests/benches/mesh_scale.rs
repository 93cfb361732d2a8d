//! One principal in mesh mode with many idle agents multiplexed onto a few HTTP/2 connections, as
//! the principal's Envoy sidecar delivers them (docs/mesh/envoy.md: 3,000 agents through one
//! Envoy arrived on 4 upstream connections), against one connection per agent.
//!
//! Setup (`tests::loadhub`, shared with `storm.rs`): a hub embedded API server, a JWT key made by
//! `argocd-agentctl jwt create-key --type ecdsa-p256` (tokens ES256; `BENCH_JWT_KEY_TYPE=rsa`
//! for upstream's RSA-4096, whose signing bounds one principal below 50,000 agents on 2 cores:
//! docs/performance.md), and the release `argocd-agent principal` spawned
//! with `--insecure-plaintext --auth xfcc:` on 127.0.0.1 (behind a sidecar; loopback is a trusted
//! hop).
//! Agents are simulated in this process by `tests::loadgen`: managed, empty spokes, each with its
//! own forwarded SPIFFE identity (`x-forwarded-client-cert` on every call), session, `Subscribe`
//! stream and reconnects, heartbeats and keepalive PINGs every 30 s; with
//! `LoadConfig::streams_per_connection` K agents share one HTTP/2 connection, as the streams of
//! an Envoy upstream pool.
//!
//! Levels, each on a fresh principal whose RSS and descriptors with 0 agents (after an idle
//! window) are that level's baseline:
//! 1. `BENCH_MESH_DIRECT_AGENTS` (9,000) agents, one connection each: the per-agent cost today,
//!    bounded by the open-files limit (20,000 here: one descriptor per agent in each process, and
//!    the principal's default connection cap is half of it, 9,968);
//! 2. the same number multiplexed, K per connection (the same-size comparison);
//! 3. `BENCH_MESH_AGENTS` (50,000) multiplexed, K per connection
//!    (`BENCH_MESH_STREAMS_PER_CONNECTION`, 1,000).
//!
//! 4. `BENCH_MESH_ENVOY_AGENTS` (3,000: past the 1,024 streams Envoy's default circuit breakers
//!    allow a cluster) through a real Envoy running `envoy/principal-sidecar.yaml` in front of the
//!    principal: each agent dials it over mTLS with its own client certificate (an X.509-SVID, as
//!    its own sidecar would), Envoy sets the XFCC and carries the streams to the principal on its
//!    upstream connections; beside it, the same number multiplexed by the load generator (the
//!    stand-in the larger sizes use), so the run shows how far the stand-in is from the sidecar.
//!
//! Agents connect at `BENCH_MESH_RAMP_RATE` (400) per second (`0`: all at once): every first
//! connect is an `Authenticate` that signs two tokens (~12 ms of a core with RSA-4096, a fraction
//! of that with ES256), and 50,000 at once queue past their own keepalive and session deadlines
//! and reconnect over and over (a storm, not an idle fleet); with RSA-4096 use 60/s. Multiplexed connections carry no HTTP/2 keepalive PINGs, as
//! Envoy's upstream connections in `envoy/principal-sidecar.yaml` carry none (the agents' PINGs
//! end at their sidecar); each agent's stream still has heartbeats and the silence limit.
//!
//! At each level: the time until every agent is connected and resynced, an idle window
//! (`BENCH_MESH_WINDOW`, 20 s) for the principal's CPU, then its RSS (`VmRSS`) and open
//! descriptors; per agent = (RSS − RSS with 0 agents) / agents. Then fan-out: one change to an
//! AppProject every agent matches, the time until the last agent has applied it, beside the hub
//! write's own time. Targets (printed, never asserted): < 40 KiB per idle agent and fan-out
//! < 5 s at 50,000 agents.
//!
//! Run: `cargo build --release -p cli && cargo bench -p tests --bench mesh_scale`;
//! `BENCH_MESH_PROGRAM=<argocd-agent binary>` runs another build's principal instead (a baseline:
//! alternate runs with and without it); `BENCH_PRINCIPAL_FLAGS` adds flags to its command line
//! (e.g. `--access-token-lifetime 30m`);
//! `BENCH_MESH_TIMEOUT` (1800 s) bounds each wait. `BENCH_QUICK=1`: 200 agents 50 per connection,
//! 100 with one connection each, 1 s windows, no ramp.

use std::time::{Duration, Instant};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use rustls_pki_types::CertificateDer;
use tests::envoy::{EnvoySidecar, SidecarKind, SidecarParams};
use tests::loadgen::{ClientTls, LoadConfig, LoadGen, procstat};
use tests::loadhub::{FANOUT_PROJECT, LoadHub, LoadPrincipal, fanout, fanout_project, progress, projects};
use tests::pki::Ca;

type Res<T> = anyhow::Result<T>;

/// Targets of the issue at `BENCH_MESH_AGENTS` agents.
const TARGET_KIB_PER_AGENT: f64 = 40.0;
const TARGET_FANOUT: Duration = Duration::from_secs(5);

/// Descriptors a process needs besides its agents' connections.
const FD_HEADROOM: usize = 256;

fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// ERROR lines in the principal's log.
fn errors(principal: &LoadPrincipal) -> usize {
    principal.process.stderr().lines().filter(|l| l.contains(" ERROR ")).count()
}

/// CPU of each of `pids` over a measurement window, as % of one core.
async fn cpu_window(pids: &[u32], window: Duration) -> Res<Vec<f64>> {
    let hz = procstat::clock_ticks_per_second() as f64;
    let before = pids.iter().map(|&p| procstat::cpu_ticks(p)).collect::<Res<Vec<_>>>()?;
    let t0 = Instant::now();
    tokio::time::sleep(window).await; // a measurement window, not synchronisation
    let secs = t0.elapsed().as_secs_f64();
    pids.iter().zip(before).map(|(&p, b)| Ok((procstat::cpu_ticks(p)? - b) as f64 / hz / secs * 100.0)).collect()
}

/// One level: a fresh principal, its 0-agent baseline, `agents` agents `per_connection` to a
/// connection, idle, fan-out.
struct Row {
    agents: usize,
    per_connection: usize,
    /// Through a real Envoy: its CPU over the idle window and its RSS growth, and the
    /// principal's connections from it.
    envoy: Option<EnvoyUse>,
    connect: Duration,
    rss0: u64,
    fds0: usize,
    cpu0: f64,
    rss: u64,
    fds: usize,
    cpu: f64,
    loadgen_cpu: f64,
    hub_write: Duration,
    first: Duration,
    last: Duration,
    heartbeats: u64,
    refreshed: u64,
    streams_ended: u64,
    errors: usize,
}

impl Row {
    fn kib_per_agent(&self) -> f64 {
        self.rss.saturating_sub(self.rss0) as f64 / self.agents as f64
    }

    /// The principal's descriptors for its agents (HTTP/2 connections).
    fn connections(&self) -> usize {
        self.fds.saturating_sub(self.fds0)
    }

    fn delivery(&self) -> String {
        if self.envoy.is_some() {
            "through Envoy (each agent's own mTLS connection to it)".to_owned()
        } else if self.per_connection == 1 {
            "one connection per agent".to_owned()
        } else {
            format!("multiplexed, {} per connection", self.per_connection)
        }
    }
}

/// How a level runs: the idle window, each wait's bound, and first connects per second (0: all
/// at once).
#[derive(Clone, Copy)]
struct Pace {
    window: Duration,
    timeout: Duration,
    ramp_rate: usize,
}

/// What the Envoy in front of the principal cost at one level.
struct EnvoyUse {
    rss0: u64,
    rss: u64,
    cpu: f64,
    upstream_connections: u64,
}

/// How a level's agents reach the principal.
#[derive(Clone, Copy)]
enum Delivery {
    /// `per_connection` agents on one HTTP/2 connection from the load generator (1: each its own).
    Direct { per_connection: usize },
    /// Each agent its own mTLS connection to a real Envoy in front of the principal.
    Envoy,
}

/// The principal sidecar's certificate and one client certificate per agent (its SPIFFE ID as
/// URI SAN, which Envoy forwards in the XFCC), written where Envoy reads them.
struct SidecarPki {
    dir: tempfile::TempDir,
    ca_der: CertificateDer<'static>,
    ca: Ca,
}

impl SidecarPki {
    fn new() -> Res<Self> {
        let ca = Ca::generate("mesh-scale-ca")?;
        let server = ca.server(
            "argocd-agent-principal",
            &["localhost", "127.0.0.1"],
            &["spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal"],
        )?;
        let dir = tempfile::Builder::new().prefix("mesh-scale-pki-").tempdir()?;
        std::fs::write(dir.path().join("ca.pem"), &ca.pem)?;
        std::fs::write(dir.path().join("principal.pem"), &server.cert)?;
        std::fs::write(dir.path().join("principal-key.pem"), &server.key)?;
        Ok(Self { ca_der: ca.der()?, ca, dir })
    }

    fn sidecar(&self, principal: SocketAddr) -> SidecarParams {
        let path = |name: &str| self.dir.path().join(name);
        SidecarParams::new(principal, path("principal.pem"), path("principal-key.pem"), path("ca.pem"))
    }

    /// Agent `n`'s TLS towards the sidecar, for each of `config`'s agents.
    fn agents(&self, config: &LoadConfig) -> Res<ClientTls> {
        let mut tls = BTreeMap::new();
        for n in config.first..config.first + config.agents {
            let issued = self.ca.client(&format!("agent-{n}"), &[&config.spiffe_id(n)])?;
            let client = issued.client_config(&self.ca_der)?;
            let agent =
                agent::transport::AgentTls::Rustls { config: Arc::new(client), server_name: "127.0.0.1".into() };
            tls.insert(n, agent);
        }
        Ok(ClientTls(Arc::new(move |n| tls.get(&n).cloned().context("no certificate for this agent"))))
    }
}

async fn level(hub: &LoadHub, agents: usize, delivery: Delivery, pace: Pace) -> Res<Row> {
    let per_connection = match delivery {
        Delivery::Direct { per_connection } => per_connection,
        Delivery::Envoy => 1,
    };
    use kube::api::{Patch, PatchParams};
    let Pace { window, timeout, ramp_rate } = pace;
    let label = match delivery {
        Delivery::Direct { .. } => format!("{agents} agents, {per_connection} per connection"),
        Delivery::Envoy => format!("{agents} agents through Envoy"),
    };
    // Another level may have left the fan-out's marker in the description: the fan-out below must
    // be a change.
    let before = Patch::Merge(serde_json::json!({"spec": {"description": format!("before {label} connect")}}));
    projects(hub)
        .patch(FANOUT_PROJECT, &PatchParams::default(), &before)
        .await
        .context("cannot reset the fan-out AppProject")?;
    // Another build's principal (a same-run baseline: alternate runs with and without it).
    // `BENCH_PRINCIPAL_FLAGS`: e.g. `--access-token-lifetime 30m` with an RSA key.
    let flags = tests::loadhub::principal_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let (principal, _) = match std::env::var_os("BENCH_MESH_PROGRAM") {
        Some(program) => {
            LoadPrincipal::start_program(std::path::Path::new(&program), hub, &hub.keys[0], 0, Instant::now(), &flags)?
        }
        None => LoadPrincipal::start_with(hub, &hub.keys[0], 0, Instant::now(), &flags)?,
    };
    let cpu0 = cpu_window(&[principal.pid()], window).await?[0];
    let rss0 = principal.rss()?;
    let fds0 = procstat::open_fds(principal.pid());

    let mut config = LoadConfig::new(principal.addr(), agents);
    config.streams_per_connection = per_connection;
    let mut sidecar = None;
    if let Delivery::Envoy = delivery {
        let pki = SidecarPki::new()?;
        let upstream: SocketAddr =
            principal.addr().trim_start_matches("http://").parse().context("the principal's address")?;
        let envoy = EnvoySidecar::start(SidecarKind::Principal, &pki.sidecar(upstream))?;
        let envoy_rss0 = procstat::rss_kib(envoy.pid())?;
        config.principal_addr = format!("https://{}", envoy.listen_addr());
        config.mtls = Some(pki.agents(&config)?);
        config.mtls_to_sidecar = true;
        sidecar = Some((envoy, envoy_rss0, pki));
    }
    if per_connection > 1 {
        // Envoy's upstream connections to the principal carry no keepalive PINGs.
        config.keepalive = None;
    }
    if ramp_rate > 0 {
        config.ramp = Duration::from_secs_f64(agents as f64 / ramp_rate as f64);
    }
    let started = Instant::now();
    let load = LoadGen::start(config);
    let connect = load
        .wait_all_resynced(started, timeout, progress(label.clone(), agents))
        .await
        .with_context(|| format!("{label}: not every agent connected; raise BENCH_MESH_TIMEOUT or lower the sizes"))?;
    eprintln!("  {label}: all resynced after {:.1} s", connect.as_secs_f64());
    let before = load.snapshot();
    // The principal, this process (the load generator) and, in front of the principal, Envoy.
    let mut pids = vec![principal.pid(), std::process::id()];
    pids.extend(sidecar.as_ref().map(|(e, _, _)| e.pid()));
    let cpus = cpu_window(&pids, window).await?;
    let (cpu, loadgen_cpu) = (cpus[0], cpus[1]);
    let after = load.snapshot();
    let rss = principal.rss()?;
    let fds = procstat::open_fds(principal.pid());
    let envoy = match &sidecar {
        Some((e, rss0, _)) => {
            let upstream_connections = e.stat("cluster.principal.upstream_cx_active")?.unwrap_or(0);
            Some(EnvoyUse { rss0: *rss0, rss: procstat::rss_kib(e.pid())?, cpu: cpus[2], upstream_connections })
        }
        None => None,
    };
    if after.connected != agents {
        bail!("{label}: only {} agents still connected after the idle window: {after:?}", after.connected);
    }
    let fan =
        fanout(hub, std::slice::from_ref(&load), agents, timeout).await.with_context(|| format!("{label}: fan-out"))?;
    let errors = errors(&principal);
    load.stop().await;
    drop(sidecar);
    drop(principal);
    Ok(Row {
        agents,
        per_connection,
        envoy,
        connect,
        rss0,
        fds0,
        cpu0,
        rss,
        fds,
        cpu,
        loadgen_cpu,
        hub_write: fan.hub_write,
        first: fan.first,
        last: fan.last,
        heartbeats: after.heartbeats_sent - before.heartbeats_sent,
        refreshed: after.refreshed - before.refreshed,
        streams_ended: after.streams_ended - before.streams_ended,
        errors,
    })
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn print_rows(rows: &[Row], window: Duration) {
    println!(
        "  | delivery | agents | principal connections (fds - baseline) | connect + resync | principal RSS, 0 agents -> agents | per agent | principal CPU idle (0 agents) | fan-out: hub write | first agent | last agent |"
    );
    for r in rows {
        println!(
            "  | {} | {} | {} | {:.1} s | {} -> {} | {:.1} KiB | {:.2}% ({:.2}%) | {} | {} | {} |",
            r.delivery(),
            r.agents,
            r.connections(),
            r.connect.as_secs_f64(),
            mib(r.rss0),
            mib(r.rss),
            r.kib_per_agent(),
            r.cpu,
            r.cpu0,
            ms(r.hub_write),
            ms(r.first),
            ms(r.last),
        );
    }
    for r in rows {
        println!(
            "  {} agents, {}: over the {:.0} s window {} heartbeats, {} token refreshes, {} streams ended; load generator CPU {:.1}%; principal log: {} ERROR lines",
            r.agents,
            r.delivery(),
            window.as_secs_f64(),
            r.heartbeats,
            r.refreshed,
            r.streams_ended,
            r.loadgen_cpu,
            r.errors
        );
    }
}

/// The Envoy level beside the load generator's stand-in at the same size.
fn print_envoy(envoy: &Row, stand_in: &Row) {
    let Some(e) = &envoy.envoy else { return };
    println!(
        "  through Envoy ({} agents): Envoy RSS {} -> {} ({:.1} KiB per agent), Envoy CPU idle {:.2}%, {} upstream connections to the principal",
        envoy.agents,
        mib(e.rss0),
        mib(e.rss),
        e.rss.saturating_sub(e.rss0) as f64 / envoy.agents as f64,
        e.cpu,
        e.upstream_connections,
    );
    println!(
        "  through Envoy / the load generator's multiplexing ({} per connection), {} agents: principal memory per agent {:.2}x ({:.1} / {:.1} KiB), connect + resync {:.2}x, fan-out last agent {:.2}x ({} / {}), principal idle CPU {:.2}% / {:.2}%",
        stand_in.per_connection,
        envoy.agents,
        envoy.kib_per_agent() / stand_in.kib_per_agent().max(1e-9),
        envoy.kib_per_agent(),
        stand_in.kib_per_agent(),
        envoy.connect.as_secs_f64() / stand_in.connect.as_secs_f64().max(1e-9),
        envoy.last.as_secs_f64() / stand_in.last.as_secs_f64().max(1e-9),
        ms(envoy.last),
        ms(stand_in.last),
        envoy.cpu,
        stand_in.cpu,
    );
}

fn print_ratios(direct: &Row, same: Option<&Row>, big: &Row) {
    if let Some(same) = same {
        println!(
            "  same size ({} agents): multiplexed / one connection per agent: memory per agent {:.2}x ({:.1} / {:.1} KiB), fan-out last agent {:.2}x, connect + resync {:.2}x, idle CPU {:.2}x",
            same.agents,
            same.kib_per_agent() / direct.kib_per_agent().max(1e-9),
            same.kib_per_agent(),
            direct.kib_per_agent(),
            same.last.as_secs_f64() / direct.last.as_secs_f64().max(1e-9),
            same.connect.as_secs_f64() / direct.connect.as_secs_f64().max(1e-9),
            same.cpu / direct.cpu.max(1e-9),
        );
    }
    println!(
        "  {} multiplexed agents against {} with one connection each: memory per agent {:.2}x, fan-out last agent {:.2}x for {:.1}x the agents",
        big.agents,
        direct.agents,
        big.kib_per_agent() / direct.kib_per_agent().max(1e-9),
        big.last.as_secs_f64() / direct.last.as_secs_f64().max(1e-9),
        big.agents as f64 / direct.agents as f64,
    );
    let verdict = |ok: bool| if ok { "met" } else { "missed" };
    println!(
        "  target: < {TARGET_KIB_PER_AGENT:.0} KiB per idle agent at {}: {:.1} KiB, {}",
        big.agents,
        big.kib_per_agent(),
        verdict(big.kib_per_agent() < TARGET_KIB_PER_AGENT)
    );
    println!(
        "  target: fan-out to all {} < {:.0} s: {:.2} s to the last agent (hub write {}), {}",
        big.agents,
        TARGET_FANOUT.as_secs_f64(),
        big.last.as_secs_f64(),
        ms(big.hub_write),
        verdict(big.last < TARGET_FANOUT)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let env = |name: &str, quick_default: usize, default: usize| {
        tests::bench::env(name, if quick { quick_default } else { default }).max(1)
    };
    let agents = env("BENCH_MESH_AGENTS", 200, 50_000);
    let per_connection = env("BENCH_MESH_STREAMS_PER_CONNECTION", 50, 1000);
    // One connection each: at most the principal's default connection cap (9,968 agents at
    // `ulimit -n` 20,000), checked below.
    let direct = env("BENCH_MESH_DIRECT_AGENTS", 100, 9_000);
    // 0: no Envoy level.
    let envoy_agents = tests::bench::env("BENCH_MESH_ENVOY_AGENTS", if quick { 100 } else { 3_000 });
    let window = Duration::from_secs(env("BENCH_MESH_WINDOW", 1, 20) as u64);
    let timeout = Duration::from_secs(env("BENCH_MESH_TIMEOUT", 120, 1800) as u64);
    let ramp_rate = tests::bench::env("BENCH_MESH_RAMP_RATE", if quick { 0 } else { 400 });
    let pace = Pace { window, timeout, ramp_rate };
    let limit = open_files_limit();
    println!(
        "mesh scale ({} cores, ulimit -n {}): principal --insecure-plaintext --auth xfcc:, managed agents each with its own XFCC, session and stream; heartbeats and keepalive 30 s",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        limit.map_or("unknown".to_owned(), |l| l.to_string())
    );
    if let Some(limit) = limit {
        let needed = direct.max(agents.div_ceil(per_connection)) + FD_HEADROOM;
        if needed > limit {
            bail!(
                "ulimit -n is {limit}: {direct} agents with a connection each (or {agents} agents {per_connection} per connection) need {needed} descriptors in this process and in the principal; lower BENCH_MESH_DIRECT_AGENTS or raise BENCH_MESH_STREAMS_PER_CONNECTION"
            );
        }
    }
    let cap = tests::loadhub::agent_connection_cap();
    if direct > cap {
        bail!(
            "BENCH_MESH_DIRECT_AGENTS={direct}: the principal holds at most {cap} agent connections with this open-file limit (half of it, less a reserve); lower it or raise ulimit -n"
        );
    }
    let hub = LoadHub::start_with_key_type("ecdsa-p256").await?;
    projects(&hub)
        .create(&kube::api::PostParams::default(), &fanout_project("created before the agents")?)
        .await
        .context("cannot create the fan-out AppProject")?;
    let mut plan = vec![(direct, Delivery::Direct { per_connection: 1 })];
    if per_connection > 1 && direct != agents {
        plan.push((direct, Delivery::Direct { per_connection }));
    }
    plan.push((agents, Delivery::Direct { per_connection }));
    let mut rows = Vec::new();
    for (n, delivery) in plan {
        let row = level(&hub, n, delivery, pace).await?;
        // Printed as soon as measured: a later level may fail.
        println!("level measured:");
        print_rows(std::slice::from_ref(&row), window);
        rows.push(row);
    }
    let ramp = if ramp_rate > 0 { format!("{ramp_rate} first connects/s") } else { "all at once".to_owned() };
    println!(
        "idle agents and fan-out, each level on a fresh principal (its own 0-agent baseline), agents connecting {ramp}:"
    );
    print_rows(&rows, window);
    let same = (rows.len() == 3).then(|| &rows[1]);
    print_ratios(&rows[0], same, &rows[rows.len() - 1]);

    // Through a real sidecar, beside the stand-in at the same size.
    if envoy_agents > 0 {
        println!("through a real Envoy (envoy/principal-sidecar.yaml) and the load generator's stand-in for it:");
        let mut pair = Vec::new();
        for delivery in [Delivery::Direct { per_connection }, Delivery::Envoy] {
            let row = level(&hub, envoy_agents, delivery, pace).await?;
            print_rows(std::slice::from_ref(&row), window);
            pair.push(row);
        }
        print_envoy(&pair[1], &pair[0]);
    }
    drop(hub);
    Ok(())
}
