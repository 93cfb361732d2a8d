//! Many agents against one principal: idle cost per agent, and a reconnect storm after the
//! principal is SIGKILLed.
//!
//! Setup: a hub embedded API server and the release `argocd-agent principal` spawned with
//! `--insecure-plaintext --auth xfcc:` on 127.0.0.1 (as behind a mesh sidecar; loopback is a
//! trusted hop); the JWT key made by `argocd-agentctl jwt create-key` (RSA-4096, in the hub
//! secret, so it survives a principal restart). The agents are simulated in this process by
//! `tests::loadgen` (managed, empty spokes, each with its own forwarded SPIFFE identity,
//! session, HTTP/2 connection and stream; heartbeats every 30 s, keepalive PINGs every 30 s).
//!
//! - idle: the principal with 0 agents, then `BENCH_IDLE_AGENTS` agents connected in turn
//!   (cumulative: the next level adds agents to those already connected); at each level, once
//!   every agent is connected and resynced, the principal's RSS (`VmRSS`) and CPU
//!   (`utime + stime` over `BENCH_IDLE_WINDOW`) with heartbeats on. Per agent = (RSS at N - RSS
//!   at 0) / N.
//!   After each level, fan-out: one change to an AppProject every agent matches; the time until
//!   the last agent has applied it, beside the hub write's own time.
//! - storm: a fresh principal, `BENCH_STORM_AGENTS` agents connected (time to connect them the
//!   first time = the baseline), RSS and idle CPU; then SIGKILL and a restart on the same port:
//!   the time until every agent has reopened its stream (authenticating again where its
//!   session is refused) and completed a resync on it, and the RSS after.
//!
//! - latency: a fresh principal, `BENCH_LATENCY_AGENTS` managed agents (1000), each with one
//!   Application on the hub; one change to each agent's Application at `BENCH_LATENCY_RATE`
//!   (50) changes/s; p50/p99 from the start of each hub write until its agent applied it,
//!   beside the hub write's acknowledgement and a hub watch in this process (the floor).
//! - status throughput (last): `BENCH_STATUS_AGENTS` managed agents with one hub Application
//!   each send a status update every `BENCH_STATUS_INTERVAL_MS` (a list, `500,200`: 2,000/s
//!   and 5,000/s offered by 1,000 agents, around and well above the hub API server's own rate,
//!   one run each); hub writes/s while the
//!   principal writes them, beside the hub API server's own rate with 64 requests in flight
//!   (the principal's own bound on hub requests) merge-patching
//!   the same Applications (same run).
//!
//! - periodic resync: a fresh principal, `BENCH_PERIODIC_AGENTS` (1000) managed agents holding
//!   one AppProject; principal CPU over an idle window without periodic resync (baseline), then
//!   with a digest from every agent every `BENCH_PERIODIC_INTERVAL` (10) seconds, and how the
//!   principal answered them (`in_sync`: nothing sent; `repaired`: a resync ran).
//!
//! Run: `cargo build --release -p cli && cargo bench -p tests --bench storm` (phases:
//! BENCH_STORM_PHASES=idle,storm,latency,status,periodic; sizes:
//! BENCH_STATUS_AGENTS=1000, BENCH_STATUS_INTERVAL_MS=500,200, BENCH_STORM_AGENTS=5000, BENCH_LATENCY_AGENTS=1000, BENCH_LATENCY_RATE=50, BENCH_IDLE_AGENTS=1000,5000,9000 (the principal's default connection cap is half of `ulimit -n`: 9,968 at 20,000), BENCH_IDLE_WINDOW=60 seconds,
//! BENCH_STORM_TIMEOUT=900 seconds; BENCH_QUICK=1: 50 agents, 1 s windows; BENCH_PRINCIPAL_FLAGS:
//! extra flags for the idle and storm phases' principals). Each agent holds
//! one TCP connection in this process and one in the principal: `ulimit -n` must exceed the
//! largest size. Figures are printed, never asserted.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tests::loadgen::{LoadConfig, LoadGen, Snapshot, procstat};
use tests::loadhub::{
    FANOUT_PROJECT, Fanout, LoadHub as Hub, LoadPrincipal as Principal, create_namespace, fanout, fanout_project,
    progress, projects,
};

type Res<T> = anyhow::Result<T>;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn env_list(name: &str, default: &str) -> Vec<usize> {
    let text = std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let mut sizes: Vec<usize> = text.split(',').filter_map(|s| s.trim().parse().ok()).filter(|n| *n > 0).collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// CPU use of the principal and of this process over a window.
struct Window {
    principal_pct: f64,
    loadgen_pct: f64,
    during: Snapshot,
    secs: f64,
}

async fn idle_window(principal: &Principal, loads: &[LoadGen], window: Duration) -> Res<Window> {
    let hz = procstat::clock_ticks_per_second() as f64;
    let me = std::process::id();
    let sum = |loads: &[LoadGen]| {
        loads.iter().map(LoadGen::snapshot).fold(Snapshot::default(), |a, s| Snapshot {
            connected: a.connected + s.connected,
            authenticated: a.authenticated + s.authenticated,
            refreshed: a.refreshed + s.refreshed,
            heartbeats_sent: a.heartbeats_sent + s.heartbeats_sent,
            streams_ended: a.streams_ended + s.streams_ended,
            events_received: a.events_received + s.events_received,
            ..a
        })
    };
    let (p0, l0, s0, t0) =
        (procstat::cpu_ticks(principal.pid())?, procstat::cpu_ticks(me)?, sum(loads), Instant::now());
    tokio::time::sleep(window).await; // a measurement window, not synchronisation
    let (p1, l1, s1) = (procstat::cpu_ticks(principal.pid())?, procstat::cpu_ticks(me)?, sum(loads));
    let secs = t0.elapsed().as_secs_f64();
    let during = Snapshot {
        connected: s1.connected,
        authenticated: s1.authenticated - s0.authenticated,
        refreshed: s1.refreshed - s0.refreshed,
        heartbeats_sent: s1.heartbeats_sent - s0.heartbeats_sent,
        streams_ended: s1.streams_ended - s0.streams_ended,
        events_received: s1.events_received - s0.events_received,
        ..Snapshot::default()
    };
    Ok(Window {
        principal_pct: (p1 - p0) as f64 / hz / secs * 100.0,
        loadgen_pct: (l1 - l0) as f64 / hz / secs * 100.0,
        during,
        secs,
    })
}

fn config(addr: String, agents: usize, first: usize) -> LoadConfig {
    let mut c = LoadConfig::new(addr, agents);
    c.first = first;
    c
}

struct IdleRow {
    agents: usize,
    added_in: Duration,
    rss: u64,
    window: Window,
    fds: usize,
    fanout: Fanout,
}

async fn idle(
    hub: &Hub,
    sizes: &[usize],
    window: Duration,
    timeout: Duration,
) -> Res<(u64, usize, Window, Vec<IdleRow>)> {
    let flags = tests::loadhub::principal_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let (principal, _) = Principal::start_with(hub, &hub.keys[0], 0, Instant::now(), &flags)?;
    projects(hub)
        .create(&kube::api::PostParams::default(), &fanout_project("created before the agents")?)
        .await
        .context("cannot create the fan-out AppProject")?;
    let base_window = idle_window(&principal, &[], window).await?;
    let rss0 = principal.rss()?;
    let fds0 = procstat::open_fds(principal.pid());
    let mut loads: Vec<LoadGen> = Vec::new();
    let mut rows = Vec::new();
    let mut total = 0;
    for &n in sizes {
        let added = n - total;
        let started = Instant::now();
        let load = LoadGen::start(config(principal.addr(), added, total + 1));
        let added_in = load.wait_all_resynced(started, timeout, progress("idle", added)).await?;
        loads.push(load);
        total = n;
        let w = idle_window(&principal, &loads, window).await?;
        let rss = principal.rss()?;
        let connected: usize = loads.iter().map(|l| l.snapshot().connected).sum();
        if connected != total {
            bail!("only {connected} of {total} agents still connected after the idle window");
        }
        let asked: u64 = loads.iter().map(|l| l.snapshot().principal_resyncs).sum();
        println!(
            "  idle level {n}: {asked} resync requests from the principal so far (one per stream expected); principal log: {}",
            principal.warnings()
        );
        eprintln!("  idle: {n} agents, RSS {}", mib(rss));
        let fds = procstat::open_fds(principal.pid());
        let fanout = fanout(hub, &loads, n, timeout).await?;
        rows.push(IdleRow { agents: n, added_in, rss, window: w, fds, fanout });
    }
    for load in loads {
        load.stop().await;
    }
    drop(principal);
    Ok((rss0, fds0, base_window, rows))
}

struct Storm {
    agents: usize,
    rekey: bool,
    rss0: u64,
    first_connect: Duration,
    rss_before: u64,
    window: Window,
    restart_listening: Duration,
    resynced: Duration,
    rss_after: u64,
    rss_after_idle: u64,
    counters: (Snapshot, Snapshot),
    /// `Authenticate` failures by cause: during the first connect, and during the storm.
    auth_failures: (std::collections::BTreeMap<String, u64>, std::collections::BTreeMap<String, u64>),
    principal_connects: usize,
    principal_warnings: String,
}

/// `rekey`: the restarted principal signs with another key, so every session is refused and
/// every agent authenticates again.
async fn storm(hub: &Hub, agents: usize, rekey: bool, window: Duration, timeout: Duration) -> Res<Storm> {
    let flags = tests::loadhub::principal_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let (mut principal, _) = Principal::start_with(hub, &hub.keys[0], 0, Instant::now(), &flags)?;
    let rss0 = principal.rss()?;
    let started = Instant::now();
    let load = LoadGen::start(config(principal.addr(), agents, 1));
    let first_connect = load.wait_all_resynced(started, timeout, progress("storm, first connect", agents)).await?;
    let first_failures = load.auth_failures();
    let w = idle_window(&principal, std::slice::from_ref(&load), window).await?;
    let rss_before = principal.rss()?;
    let before = load.snapshot();

    let killed = Instant::now();
    principal.process.sigkill()?;
    let port = principal.port;
    drop(principal);
    let (principal, restart_listening) =
        Principal::start_with(hub, &hub.keys[usize::from(rekey)], port, killed, &flags)?;
    let resynced = load.wait_all_resynced(killed, timeout, progress("storm, after SIGKILL", agents)).await?;
    let rss_after = principal.rss()?;
    let after = load.snapshot();
    let mut storm_failures = load.auth_failures();
    for (cause, n) in &first_failures {
        if let Some(total) = storm_failures.get_mut(cause) {
            *total -= n;
        }
    }
    storm_failures.retain(|_, n| *n > 0);
    let _ = idle_window(&principal, std::slice::from_ref(&load), window).await?;
    let rss_after_idle = principal.rss()?;
    let principal_connects = principal.connects();
    let principal_warnings = principal.warnings();
    load.stop().await;
    drop(principal);
    Ok(Storm {
        agents,
        rekey,
        rss0,
        first_connect,
        rss_before,
        window: w,
        restart_listening,
        resynced,
        rss_after,
        rss_after_idle,
        counters: (before, after),
        auth_failures: (first_failures, storm_failures),
        principal_connects,
        principal_warnings,
    })
}

struct Throughput {
    agents: usize,
    interval: Duration,
    /// The hub API server's own rate: `BASELINE_IN_FLIGHT` requests in flight merge-patching the
    /// same Applications.
    baseline: f64,
    /// Hub writes/s while the agents send status and the principal writes it.
    principal: f64,
    sent: u64,
    secs: f64,
}

/// The hub's current resourceVersion: one counter for every write (the embedded API server has a
/// single global one), so writes over a window are the difference.
async fn hub_rv(hub: &Hub) -> Res<u64> {
    let api: kube::api::Api<k8s_openapi::api::core::v1::Namespace> = kube::api::Api::all(hub.api.client());
    let list = api.list_metadata(&kube::api::ListParams::default().limit(1)).await?;
    list.metadata.resource_version.as_deref().and_then(|v| v.parse().ok()).context("list without a resourceVersion")
}

fn apps_in(hub: &Hub, ns: &str) -> kube::api::Api<kube::api::DynamicObject> {
    tests::fixtures::applications(hub.api.client(), ns)
}

/// Creates each of `namespaces` with an Application `name` (source path `path`) in it, 16 at a
/// time; a namespace that exists already is taken to hold its Application from an earlier run.
async fn give_each_an_application(
    hub: &Hub,
    namespaces: impl Iterator<Item = String>,
    name: &str,
    path: &str,
) -> Res<()> {
    use futures::{StreamExt as _, TryStreamExt as _};
    let exists = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.is_already_exists());
    futures::stream::iter(namespaces)
        .map(|ns| async move {
            match create_namespace(hub.api.client(), &ns).await {
                Err(e) if e.downcast_ref::<kube::Error>().is_some_and(exists) => return anyhow::Ok(()),
                r => r?,
            }
            let app = tests::fixtures::app_with_path(name, &ns, path)?;
            apps_in(hub, &ns).create(&kube::api::PostParams::default(), &app).await?;
            anyhow::Ok(())
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .with_context(|| format!("cannot create the agents' namespaces and their {name} Applications"))?;
    Ok(())
}

/// Status throughput: `agents` managed agents, each with one Application on the hub, send a
/// status update every `interval`; the principal writes each onto the hub. Beside it, in the
/// same run and on the same Applications, the hub API server's own write rate with
/// `BASELINE_IN_FLIGHT` requests in flight.
async fn status_throughput(
    hub: &Hub,
    agents: usize,
    interval: Duration,
    window: Duration,
    timeout: Duration,
) -> Res<Throughput> {
    use kube::api::{Patch, PatchParams};
    let ns = |i: usize| format!("agent-{i}");
    // Made by the first run of this phase; later runs (other intervals) reuse them.
    give_each_an_application(hub, (1..=agents).map(ns), "status", "v1").await?;

    // Baseline: merge patches of these Applications' status, as many in flight as the principal
    // allows itself against the hub, for one window.
    let rv0 = hub_rv(hub).await?;
    let started = Instant::now();
    let deadline = started + window;
    let workers = (0..BASELINE_IN_FLIGHT).map(|w| async move {
        let mut k = w;
        while Instant::now() < deadline {
            let i = k % agents + 1;
            let patch = Patch::Merge(serde_json::json!({"status": {"reconciledAt": format!("baseline-{k}")}}));
            apps_in(hub, &ns(i)).patch("status", &PatchParams::default(), &patch).await?;
            k += BASELINE_IN_FLIGHT;
        }
        anyhow::Ok(())
    });
    for r in futures::future::join_all(workers).await {
        r?;
    }
    let baseline = (hub_rv(hub).await? - rv0) as f64 / started.elapsed().as_secs_f64();

    let (principal, _) = Principal::start(hub, &hub.keys[0], 0, Instant::now())?;
    let mut config = config(principal.addr(), agents, 1);
    config.status_interval = Some(interval);
    let started = Instant::now();
    let load = LoadGen::start(config);
    load.wait_all_resynced(started, timeout, progress("status throughput", agents)).await?;
    tests::wait_until_async(timeout, "every agent to hold its Application", || async {
        load.snapshot().objects_applied >= agents as u64
    })
    .await?;
    let (rv0, sent0, t0) = (hub_rv(hub).await?, load.snapshot().status_updates_sent, Instant::now());
    tokio::time::sleep(window).await; // a measurement window, not synchronisation
    let (rv1, sent1) = (hub_rv(hub).await?, load.snapshot().status_updates_sent);
    let secs = t0.elapsed().as_secs_f64();
    load.stop().await;
    drop(principal);
    Ok(Throughput { agents, interval, baseline, principal: (rv1 - rv0) as f64 / secs, sent: sent1 - sent0, secs })
}

/// Requests in flight in the status-throughput baseline: the principal's own bound on hub
/// requests (`HUB_MAX_IN_FLIGHT` in `cli/src/principal_cmd.rs`).
const BASELINE_IN_FLIGHT: usize = 64;

/// Agents of the latency phase are `agent-<LATENCY_FIRST>`.., apart from the other phases'.
const LATENCY_FIRST: usize = 100_001;

/// p50 and p99 of a set of durations.
fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort_unstable();
    (tests::bench::percentile(&v, 0.50), tests::bench::percentile(&v, 0.99))
}

struct Latency {
    agents: usize,
    rate: f64,
    /// Until the hub API server acknowledged each write.
    hub_write: (Duration, Duration),
    /// Until a watch on the hub (this process, as the principal watches) saw each write: the
    /// floor under any hub-to-spoke path.
    hub_watch: (Duration, Duration),
    /// Until the agent applied each write.
    spoke: (Duration, Duration),
}

/// Hub to spoke latency: `agents` managed agents connected, each with one Application on the
/// hub; one change to each agent's Application, `rate` changes per second, each timed from the
/// start of its hub write to the moment its agent applied it, beside the hub write and a hub
/// watch in this process.
async fn latency(hub: &Hub, agents: usize, rate: f64, timeout: Duration) -> Res<Latency> {
    use futures::{StreamExt as _, TryStreamExt as _};
    use kube::api::{Patch, PatchParams, WatchEvent, WatchParams};
    let ns = |i: usize| format!("agent-{}", LATENCY_FIRST + i);
    let (principal, _) = Principal::start(hub, &hub.keys[0], 0, Instant::now())?;
    let started = Instant::now();
    let load = LoadGen::start(config(principal.addr(), agents, LATENCY_FIRST));
    load.expect_marker("latency warm-up");
    give_each_an_application(hub, (0..agents).map(ns), "latency", "latency warm-up").await?;
    load.wait_all_resynced(started, timeout, progress("latency", agents)).await?;
    load.wait_all_marked(started, timeout).await.context("the warm-up Applications")?;

    let marker = "latency";
    load.expect_marker(marker);
    let all = kube::api::Api::<kube::api::DynamicObject>::all_with(
        hub.api.client(),
        &tests::fixtures::application_resource(),
    );
    let rv = hub_rv(hub).await?.to_string();
    let mut events = all.watch(&WatchParams::default().timeout(290), &rv).await?.boxed();
    let watched = tokio::spawn(async move {
        let mut seen = std::collections::HashMap::new();
        while seen.len() < agents {
            let Some(event) = events.try_next().await? else { bail!("the hub watch ended") };
            if let WatchEvent::Modified(obj) = event
                && obj.data.pointer("/spec/source/path").and_then(serde_json::Value::as_str) == Some(marker)
            {
                seen.entry(obj.metadata.namespace.clone().unwrap_or_default()).or_insert_with(Instant::now);
            }
        }
        anyhow::Ok(seen)
    });
    let t0 = Instant::now();
    let writes = futures::stream::iter(0..agents)
        .map(|i| async move {
            tokio::time::sleep_until((t0 + Duration::from_secs_f64(i as f64 / rate)).into()).await;
            let sent = Instant::now();
            let patch = Patch::Merge(serde_json::json!({"spec": {"source": {"path": marker}}}));
            apps_in(hub, &ns(i)).patch("latency", &PatchParams::default(), &patch).await?;
            anyhow::Ok((sent, sent.elapsed()))
        })
        .buffered(agents.max(1))
        .try_collect::<Vec<_>>()
        .await
        .context("cannot change the latency Applications")?;
    load.wait_all_marked(t0, timeout).await?;
    let seen = tokio::time::timeout(timeout, watched).await.context("the hub watch")???;
    let applied = load.marked_at();
    let mut watch = Vec::new();
    let mut spoke = Vec::new();
    for (i, ((sent, _), at)) in writes.iter().zip(&applied).enumerate() {
        let seen_at = seen.get(&ns(i)).with_context(|| format!("the hub watch missed {}", ns(i)))?;
        watch.push(seen_at.saturating_duration_since(*sent));
        spoke.push(at.context("an agent without its change")?.saturating_duration_since(*sent));
    }
    load.stop().await;
    drop(principal);
    Ok(Latency {
        agents,
        rate,
        hub_write: percentiles(writes.iter().map(|(_, d)| *d).collect()),
        hub_watch: percentiles(watch),
        spoke: percentiles(spoke),
    })
}

async fn latency_report(hub: &Hub, agents: usize, rate: f64, timeout: Duration) -> Res<()> {
    let l = latency(hub, agents, rate, timeout).await?;
    let ms = |(p50, p99): (Duration, Duration)| {
        format!("{:.1} ms | {:.1} ms", p50.as_secs_f64() * 1e3, p99.as_secs_f64() * 1e3)
    };
    println!(
        "hub to spoke latency ({} managed agents connected, one Application change per agent, {:.0} changes/s):",
        l.agents, l.rate
    );
    println!("  | measured from the start of the hub write to | p50 | p99 |");
    println!("  | hub API server acknowledged the write | {} |", ms(l.hub_write));
    println!("  | a hub watch saw it (baseline: the principal's own input) | {} |", ms(l.hub_watch));
    println!("  | the agent applied it (through the principal) | {} |", ms(l.spoke));
    println!("  p99 spoke / p99 hub watch: {:.2}x", l.spoke.1.as_secs_f64() / l.hub_watch.1.as_secs_f64().max(1e-9));
    Ok(())
}

/// The hub API server and two JWT signing keys made by `argocd-agentctl jwt create-key`.
/// Periodic resync: a fresh principal (`--resync-min-interval 0`) and `agents` managed agents,
/// each holding the fan-out AppProject; an idle window with no periodic resync (the baseline),
/// then the same agents reconnected sending a digest every `every`: the principal's CPU both
/// ways, and how it answered the digests.
async fn periodic_report(hub: &Hub, agents: usize, every: Duration, window: Duration, timeout: Duration) -> Res<()> {
    if projects(hub).get_opt(FANOUT_PROJECT).await?.is_none() {
        projects(hub).create(&kube::api::PostParams::default(), &fanout_project("periodic resync")?).await?;
    }
    let (principal, _) = Principal::start_with(hub, &hub.keys[0], 0, Instant::now(), &["--resync-min-interval", "0"])?;
    let started = Instant::now();
    let plain = LoadGen::start(config(principal.addr(), agents, 1));
    plain.wait_all_resynced(started, timeout, progress("periodic: baseline", agents)).await?;
    let base = idle_window(&principal, std::slice::from_ref(&plain), window).await?;
    plain.stop().await;

    let mut with = config(principal.addr(), agents, 1);
    with.periodic_resync = Some(every);
    let started = Instant::now();
    let load = LoadGen::start(with);
    load.wait_all_resynced(started, timeout, progress("periodic: with digests", agents)).await?;
    let (in_sync0, repaired0) = (principal.resyncs("in_sync").await?, principal.resyncs("repaired").await?);
    let sent0 = load.snapshot().digests_sent;
    let w = idle_window(&principal, std::slice::from_ref(&load), window).await?;
    let sent = load.snapshot().digests_sent - sent0;
    let in_sync = principal.resyncs("in_sync").await? - in_sync0;
    let repaired = principal.resyncs("repaired").await? - repaired0;
    load.stop().await;
    drop(principal);
    println!("periodic resync ({agents} managed agents, each holding one AppProject, a digest every {every:?}):");
    println!("  | | principal CPU | digests sent | answered in_sync | repaired |");
    println!("  | baseline, no periodic resync | {:.2}% | 0 | 0 | 0 |", base.principal_pct);
    println!("  | a digest every {every:?} | {:.2}% | {sent} | {in_sync} | {repaired} |", w.principal_pct);
    let per_digest =
        if sent > 0 { (w.principal_pct - base.principal_pct) / 100.0 * w.secs / sent as f64 * 1e6 } else { 0.0 };
    println!(
        "  cost of the periodic resync: {:+.2}% of one core ({:.0} digests/s; {per_digest:.1} microseconds of principal CPU each)",
        w.principal_pct - base.principal_pct,
        sent as f64 / w.secs,
    );
    // The floor of any message from an agent: a heartbeat is received, applied (nothing) and ACKed
    // as a digest is. The baseline window's CPU over its heartbeats (PINGs and timers included).
    let heartbeats = base.during.heartbeats_sent;
    if heartbeats > 0 {
        let per_heartbeat = base.principal_pct / 100.0 * base.secs / heartbeats as f64 * 1e6;
        println!(
            "  same-run baseline: {per_heartbeat:.1} microseconds of principal CPU per heartbeat ({heartbeats} in the baseline window); a digest costs {:.2}x a heartbeat",
            per_digest / per_heartbeat.max(1e-9)
        );
    }
    Ok(())
}

fn print_window(label: &str, w: &Window) {
    println!(
        "  {label}: principal CPU {:.2}% of one core, load generator {:.1}%, over {:.0} s: {} heartbeats, {} token refreshes, {} authentications, {} streams ended",
        w.principal_pct,
        w.loadgen_pct,
        w.secs,
        w.during.heartbeats_sent,
        w.during.refreshed,
        w.during.authenticated,
        w.during.streams_ended
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let storm_n = env_usize("BENCH_STORM_AGENTS", if quick { 50 } else { 5000 });
    let idle_sizes = env_list("BENCH_IDLE_AGENTS", if quick { "50" } else { "1000,5000,9000" });
    let window = Duration::from_secs(env_usize("BENCH_IDLE_WINDOW", if quick { 1 } else { 60 }) as u64);
    let timeout = Duration::from_secs(env_usize("BENCH_STORM_TIMEOUT", if quick { 120 } else { 900 }) as u64);
    let status_n = env_usize("BENCH_STATUS_AGENTS", if quick { 50 } else { 1000 });
    let status_intervals = env_list("BENCH_STATUS_INTERVAL_MS", "500,200");
    let latency_n = env_usize("BENCH_LATENCY_AGENTS", if quick { 50 } else { 1000 });
    let latency_rate = env_usize("BENCH_LATENCY_RATE", 50).max(1) as f64;
    let largest = idle_sizes.iter().copied().max().unwrap_or(0).max(storm_n).max(latency_n).max(status_n);
    let limit = open_files_limit();
    println!(
        "storm/idle benchmarks ({} cores, ulimit -n {}, managed agents over h2c with --auth xfcc:, heartbeats and keepalive 30 s)",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        limit.map_or("unknown".to_owned(), |l| l.to_string())
    );
    if let Some(limit) = limit
        && limit < largest as u64 + 256
    {
        bail!(
            "ulimit -n is {limit}: {largest} agents need one descriptor each plus ~256; raise it (ulimit -n) or lower the sizes"
        );
    }
    let cap = tests::loadhub::agent_connection_cap();
    if largest > cap {
        bail!(
            "{largest} agents with a connection each: the principal holds at most {cap} agent connections with ulimit -n {} (half the open-file limit, less a reserve); lower the sizes (BENCH_IDLE_AGENTS, BENCH_STORM_AGENTS, ...) or raise ulimit -n",
            limit.map_or("unknown".to_owned(), |l| l.to_string())
        );
    }
    let phases =
        std::env::var("BENCH_STORM_PHASES").unwrap_or_else(|_| "idle,storm,latency,status,periodic".to_owned());
    let phase = |name: &str| phases.split(',').any(|p| p.trim() == name);
    let hub = Hub::start().await?;

    if phase("idle") {
        idle_report(&hub, &idle_sizes, window, timeout).await?;
    }
    if phase("storm") {
        storm_report(&hub, storm_n, window, timeout).await?;
    }
    if phase("latency") {
        latency_report(&hub, latency_n, latency_rate, timeout).await?;
    }
    if phase("status") {
        status_report(&hub, status_n, &status_intervals, window, timeout).await?;
    }
    if phase("periodic") {
        let n = env_usize("BENCH_PERIODIC_AGENTS", if quick { 50 } else { 1000 });
        let every = Duration::from_secs(env_usize("BENCH_PERIODIC_INTERVAL", if quick { 1 } else { 10 }) as u64);
        periodic_report(&hub, n, every, window, timeout).await?;
    }
    drop(hub);
    Ok(())
}

async fn idle_report(hub: &Hub, idle_sizes: &[usize], window: Duration, timeout: Duration) -> Res<()> {
    let (rss0, fds0, base, rows) = idle(hub, idle_sizes, window, timeout).await?;
    println!("idle agents (cumulative; principal with 0 agents = baseline):");
    println!("  0 agents: principal RSS {}, {fds0} open fds", mib(rss0));
    print_window("0 agents", &base);
    println!("  | agents | connect + resync (added agents) | principal RSS | per agent | principal CPU | fds |");
    for r in &rows {
        println!(
            "  | {} | {:.1} s | {} | {:.1} KiB | {:.2}% | {} |",
            r.agents,
            r.added_in.as_secs_f64(),
            mib(r.rss),
            (r.rss.saturating_sub(rss0)) as f64 / r.agents as f64,
            r.window.principal_pct,
            r.fds
        );
    }
    for r in &rows {
        print_window(&format!("{} agents", r.agents), &r.window);
    }
    println!("fan-out: one AppProject change on the hub that every connected agent applies (after each idle level):");
    println!(
        "  | agents | hub write acknowledged (baseline) | first agent applied | last agent applied | last / hub write |"
    );
    for r in &rows {
        let f = &r.fanout;
        println!(
            "  | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.0}x |",
            r.agents,
            f.hub_write.as_secs_f64() * 1e3,
            f.first.as_secs_f64() * 1e3,
            f.last.as_secs_f64() * 1e3,
            f.last.as_secs_f64() / f.hub_write.as_secs_f64().max(1e-9)
        );
    }

    Ok(())
}

async fn storm_report(hub: &Hub, storm_n: usize, window: Duration, timeout: Duration) -> Res<()> {
    for rekey in [false, true] {
        let s = storm(hub, storm_n, rekey, window, timeout).await?;
        let (before, after) = s.counters;
        println!(
            "reconnect storm ({} agents, restarted principal signs with {}):",
            s.agents,
            if s.rekey { "another key: every session refused" } else { "the same key" }
        );
        println!("  principal RSS at start {}", mib(s.rss0));
        println!(
            "  baseline: first connect of all agents (authenticate + stream + resync) {:.2} s",
            s.first_connect.as_secs_f64()
        );
        println!(
            "  first connect: {} authentications, {} failed Authenticate calls: {:?}",
            before.authenticated, before.auth_failed, s.auth_failures.0
        );
        println!("  principal RSS before SIGKILL {}", mib(s.rss_before));
        print_window("idle before SIGKILL", &s.window);
        println!("  restarted principal listening {:.2} s after SIGKILL", s.restart_listening.as_secs_f64());
        println!(
            "  all {} agents reconnected and resynced {:.2} s after SIGKILL ({:.2}x the first connect), {:.2} s after the restart listened",
            s.agents,
            s.resynced.as_secs_f64(),
            s.resynced.as_secs_f64() / s.first_connect.as_secs_f64().max(1e-9),
            (s.resynced.saturating_sub(s.restart_listening)).as_secs_f64()
        );
        println!(
            "  principal RSS after the storm {}, after another idle window {}",
            mib(s.rss_after),
            mib(s.rss_after_idle)
        );
        println!(
            "  during the storm: {} authentications, {} token refreshes, {} failed dials, {} refused streams, {} streams opened, {} resync requests from the principal; the new principal logged {} connects",
            after.authenticated - before.authenticated,
            after.refreshed - before.refreshed,
            after.dial_failed - before.dial_failed,
            after.subscribe_refused - before.subscribe_refused,
            after.subscribed - before.subscribed,
            after.principal_resyncs - before.principal_resyncs,
            s.principal_connects
        );
        println!(
            "  failed Authenticate calls during the storm: {}: {:?}",
            after.auth_failed - before.auth_failed,
            s.auth_failures.1
        );
        println!("  principal log: {}", s.principal_warnings);
    }
    Ok(())
}

/// Last of the phases: it gives agent-1..N an Application each on the hub, which the phases
/// above do not expect.
async fn status_report(
    hub: &Hub,
    status_n: usize,
    status_intervals: &[usize],
    window: Duration,
    timeout: Duration,
) -> Res<()> {
    for &ms in status_intervals {
        let interval = Duration::from_millis(ms as u64);
        let t = status_throughput(hub, status_n, interval, window.max(Duration::from_secs(2)), timeout).await?;
        print_throughput(&t);
    }
    Ok(())
}

fn print_throughput(t: &Throughput) {
    println!(
        "status throughput ({} managed agents, one Application each, a status update every {} ms per agent):",
        t.agents,
        t.interval.as_millis()
    );
    println!(
        "  baseline: hub API server alone, {BASELINE_IN_FLIGHT} merge patches of the same Applications in flight: {:.0} writes/s",
        t.baseline
    );
    let offered = t.sent as f64 / t.secs;
    println!(
        "  principal: {:.0} hub writes/s from {} status updates sent over {:.0} s ({offered:.0}/s offered): {:.2}x the baseline{}",
        t.principal,
        t.sent,
        t.secs,
        t.principal / t.baseline.max(1e-9),
        if offered < t.baseline { " (bounded by the offered rate, which is below the baseline)" } else { "" }
    );
}
