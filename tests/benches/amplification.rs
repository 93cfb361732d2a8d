//! Retransmission amplification: events delivered per event produced, both directions, with 20
//! agents at 50 updates/s each (upstream argocd-agent issue #1051 saw 104 events arrive as 451).
//!
//! Setup (as the storm bench): a hub embedded API server, the release `argocd-agent principal`
//! spawned with `--insecure-plaintext --auth xfcc:` on 127.0.0.1, and `BENCH_AMP_AGENTS` (20)
//! managed agents simulated in this process by `tests::loadgen`, each holding `BENCH_AMP_APPS`
//! (5) hub Applications (namespace `agent-N`). Every scenario starts the agents afresh (connect,
//! resync, the Applications created on them), measures, and stops them.
//!
//! - **up** (spoke to hub): every agent sends a status update for each of its Applications
//!   every `apps / rate` seconds (`rate` per agent per second). Over a window of steady load:
//!   produced = status updates the agents created; delivered = status-update events the
//!   principal processed (`principal_event_processing_time_count{resource_type="application"}`,
//!   every copy counts); first transmissions = the principal's hub writes (the hub's global
//!   resourceVersion: each distinct status is one write, a copy of one already written changes
//!   nothing and writes nothing); retransmitted = delivered - first transmissions; coalesced
//!   away = produced - first transmissions (the agents' outboxes keep the newest pending status
//!   per Application). Counted on a running load: the window opens half a period after a round
//!   of updates and lasts whole periods, so the edges fall between rounds; at a high rate they
//!   can still be off by what was in flight then (at most one event per Application).
//! - **down** (hub to spoke): `rate` Application changes per agent per second through the hub
//!   API (`spec.source.path`, round-robin over the agent's Applications), for the window; then
//!   one last change per agent whose path is a marker, the time until every agent applied it
//!   (the principal's watch has passed every change of the window), and until the principal's
//!   outboxes are empty (every event ACKed). produced = hub changes (one spec-update each for
//!   the principal to send); delivered = Applications the agents applied (every copy counts);
//!   retransmitted = copies received with the `eventid` of the last event of their resource
//!   (`Snapshot::duplicates_received`); coalesced away = produced - first transmissions.
//!
//! Each at `BENCH_AMP_RATE` (50) and, as the same-run baseline, at `BENCH_AMP_LIGHT_RATE` (1)
//! updates/s per agent; on a direct link and through `tests::faultproxy` adding
//! `BENCH_AMP_LATENCY_MS` (50) ms each way (0: skip), where upstream's ACK timeouts amplified.
//! The retransmission timeout is the outbox's: 5 s, +up to 100 % jitter. Printed beside each
//! row: the longest an event waited unACKed in the principal's outboxes (down) and the
//! principal's processing time of status updates (up), against that timeout.
//!
//! Run: `cargo build --release -p cli && cargo bench -p tests --bench amplification`
//! (`BENCH_AMP_WINDOW` seconds, 30; `BENCH_QUICK=1`: 2 agents, 3 s windows, a light rate of 5/s
//! so a round of status updates comes every second). Figures are
//! printed, never asserted.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use kube::api::{Patch, PatchParams};
use tests::faultproxy::{Direction, FaultProxy};
use tests::loadgen::{LoadConfig, LoadGen, Snapshot};
use tests::{ApiServerProcess, ChildProcess, wait_for, wait_until_async, workspace_binary};
use tokio_util::sync::CancellationToken;

type Res<T> = anyhow::Result<T>;

const NS: &str = "argocd";

/// Hub writes in flight while the bench changes Applications.
const WRITERS: usize = 64;

/// How often the principal's outbox gauges are read during a window.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The outbox's first retransmission timeout (`protocol::outbox::policy::DEFAULT_INITIAL_DELAY`).
const RETRANSMIT_AFTER: Duration = protocol::outbox::policy::DEFAULT_INITIAL_DELAY;

fn env_num(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Debug, Clone, Copy)]
struct Settings {
    agents: usize,
    apps: usize,
    rate: f64,
    light_rate: f64,
    window: Duration,
    latency: Duration,
    timeout: Duration,
}

/// The hub API server and the JWT signing key.
struct Hub {
    api: ApiServerProcess,
    key: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn create_namespace(client: kube::Client, name: &str) -> Res<()> {
    let namespaces: kube::api::Api<k8s_openapi::api::core::v1::Namespace> = kube::api::Api::all(client);
    let mut ns = k8s_openapi::api::core::v1::Namespace::default();
    ns.metadata.name = Some(name.to_owned());
    namespaces.create(&kube::api::PostParams::default(), &ns).await.with_context(|| format!("namespace {name}"))?;
    Ok(())
}

async fn hub() -> Res<Hub> {
    let api = ApiServerProcess::start().await?;
    create_namespace(api.client(), NS).await?;
    let dir = tempfile::Builder::new().prefix("amplification-jwt-").tempdir()?;
    let out = Command::new(workspace_binary("argocd-agentctl")?)
        .arg("--kubeconfig")
        .arg(api.kubeconfig_path())
        .args(["jwt", "create-key", "--out-dir"])
        .arg(dir.path())
        .output()
        .context("cannot run argocd-agentctl")?;
    if !out.status.success() {
        bail!("argocd-agentctl jwt create-key: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(Hub { api, key: dir.path().join("jwt.key"), _dir: dir })
}

/// The hub's current resourceVersion: the embedded API server has one counter for every write,
/// so writes over a window are the difference.
async fn hub_rv(hub: &Hub) -> Res<u64> {
    let api: kube::api::Api<k8s_openapi::api::core::v1::Namespace> = kube::api::Api::all(hub.api.client());
    let list = api.list_metadata(&kube::api::ListParams::default().limit(1)).await?;
    list.metadata.resource_version.as_deref().and_then(|v| v.parse().ok()).context("list without a resourceVersion")
}

fn agent_ns(n: usize) -> String {
    format!("agent-{n}")
}

fn app_name(j: usize) -> String {
    format!("amp-{j}")
}

fn apps_in(hub: &Hub, ns: &str) -> kube::api::Api<kube::api::DynamicObject> {
    tests::fixtures::applications(hub.api.client(), ns)
}

async fn set_path(hub: &Hub, agent: usize, app: usize, path: &str) -> Res<()> {
    let patch = Patch::Merge(serde_json::json!({"spec": {"source": {"path": path}}}));
    apps_in(hub, &agent_ns(agent)).patch(&app_name(app), &PatchParams::default(), &patch).await?;
    Ok(())
}

/// Every agent's namespace with its Applications.
async fn create_apps(hub: &Hub, s: &Settings) -> Res<()> {
    for n in 1..=s.agents {
        create_namespace(hub.api.client(), &agent_ns(n)).await?;
        for j in 0..s.apps {
            let app = tests::fixtures::app_with_path(&app_name(j), &agent_ns(n), "v0")?;
            apps_in(hub, &agent_ns(n)).create(&kube::api::PostParams::default(), &app).await?;
        }
    }
    Ok(())
}

/// The spawned release principal.
struct Principal {
    process: ChildProcess,
    addr: SocketAddr,
    metrics: SocketAddr,
}

impl Principal {
    fn start(hub: &Hub) -> Res<Self> {
        let mut cmd = Command::new(workspace_binary("argocd-agent")?);
        cmd.args(["principal", "--allowed-namespaces", "*", "--namespace", NS, "--auth", "xfcc:"])
            .args(["--insecure-plaintext", "--listen-host", "127.0.0.1", "--listen-port", "0"])
            .args(["--log-level", "info", "--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"])
            .arg("--kubeconfig")
            .arg(hub.api.kubeconfig_path())
            .arg("--jwt-key")
            .arg(&hub.key)
            .env("NO_COLOR", "1");
        let mut process = ChildProcess::spawn("principal", cmd)?;
        let (addr, metrics) = wait_for(Duration::from_secs(60), "the principal to listen", || {
            process.ensure_running()?;
            let out = process.stdout();
            let find = |prefix: &str| out.lines().find_map(|l| l.strip_prefix(prefix).map(|a| a.trim().to_owned()));
            Ok(find("principal listening on ").zip(find("principal metrics listening on ")))
        })?;
        Ok(Self { process, addr: addr.parse().context("principal address")?, metrics: metrics.parse()? })
    }

    async fn scrape(&self) -> Res<Scrape> {
        let (code, text) = tests::http::get(self.metrics, "/metrics").await?;
        if code != 200 {
            bail!("GET /metrics: HTTP {code}");
        }
        Ok(Scrape::parse(&text))
    }

    /// WARN lines in its log since the start, and how many ERROR lines.
    fn log_warnings(&self) -> (Vec<String>, usize) {
        let log = self.process.stderr();
        let warns = log.lines().filter(|l| l.contains(" WARN ")).map(str::to_owned).collect();
        (warns, log.lines().filter(|l| l.contains(" ERROR ")).count())
    }
}

/// What the bench reads from the principal's `/metrics`.
#[derive(Debug, Default, Clone, Copy)]
struct Scrape {
    /// `principal_events_received_total`: every message from agents (ACKs and heartbeats too).
    received: f64,
    /// `principal_events_sent_total`: every message to agents (ACKs too).
    sent: f64,
    /// Events from agents processed, all targets (each is ACKed once).
    processed: f64,
    /// Of those, Application events (status updates).
    processed_apps: f64,
    /// Of those, processed in more than [`RETRANSMIT_AFTER`].
    processed_apps_slow: f64,
    /// Total processing time of Application events, in seconds.
    processed_apps_secs: f64,
    /// Outbox depth summed over agents.
    depth: f64,
    /// The oldest unACKed event's age over agents, in seconds.
    oldest: f64,
}

fn value(line: &str) -> f64 {
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

impl Scrape {
    fn parse(text: &str) -> Self {
        let mut s = Self::default();
        let le = format!("le=\"{}\"", RETRANSMIT_AFTER.as_secs_f64());
        let mut fast_apps = 0.0;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let apps = line.contains("resource_type=\"application\"");
            if line.starts_with("principal_events_received_total ") {
                s.received = value(line);
            } else if line.starts_with("principal_events_sent_total ") {
                s.sent = value(line);
            } else if line.starts_with("principal_event_processing_time_count{") {
                s.processed += value(line);
                if apps {
                    s.processed_apps += value(line);
                }
            } else if line.starts_with("principal_event_processing_time_sum{") && apps {
                s.processed_apps_secs += value(line);
            } else if line.starts_with("principal_event_processing_time_bucket{") && apps && line.contains(&le) {
                fast_apps += value(line);
            } else if line.starts_with("argocd_principal_agent_outbox_depth{") {
                s.depth += value(line);
            } else if line.starts_with("argocd_principal_agent_outbox_oldest_unacked_age_seconds{") {
                s.oldest = s.oldest.max(value(line));
            }
        }
        s.processed_apps_slow = s.processed_apps - fast_apps;
        s
    }
}

/// Samples the principal's outbox gauges until `stop`; the largest oldest-unACKed age seen.
async fn sample_oldest(metrics: SocketAddr, stop: CancellationToken) -> f64 {
    let mut oldest: f64 = 0.0;
    loop {
        if let Ok((200, text)) = tests::http::get(metrics, "/metrics").await {
            oldest = oldest.max(Scrape::parse(&text).oldest);
        }
        tokio::select! {
            () = stop.cancelled() => return oldest,
            () = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
}

/// One measured scenario.
#[derive(Debug, Clone)]
struct Row {
    link: String,
    up: bool,
    rate: f64,
    secs: f64,
    produced: f64,
    /// First transmissions delivered (distinct events).
    first: f64,
    /// Every copy delivered.
    delivered: f64,
    /// Messages the sending side wrote, retransmissions included, ACKs and heartbeats excluded
    /// (up: every other message from the agents, resync requests too): a cross-check of
    /// `delivered`.
    sent: f64,
    /// The longest an event waited for its ACK: down, the principal's outbox gauge (sampled);
    /// up, the principal's mean processing time (its part of the ACK's round trip).
    wait: String,
    /// Events the other direction carried meanwhile, and reconnects.
    notes: String,
}

impl Row {
    fn coalesced(&self) -> f64 {
        self.produced - self.first
    }
    fn retransmitted(&self) -> f64 {
        self.delivered - self.first
    }
}

/// Starts `agents` managed agents on `addr` and waits until each is resynced and holds its
/// Applications.
async fn agents(addr: &str, s: &Settings, status_every: Option<Duration>) -> Res<LoadGen> {
    let mut config = LoadConfig::new(addr, s.agents);
    config.status_interval = status_every;
    let started = Instant::now();
    let load = LoadGen::start(config);
    load.wait_all_resynced(started, s.timeout, |_, _| {}).await?;
    let want = (s.agents * s.apps) as u64;
    wait_until_async(s.timeout, "every agent to hold its Applications and be asked to resync", || async {
        let now = load.snapshot();
        now.objects_applied >= want && now.principal_resyncs >= s.agents as u64
    })
    .await?;
    Ok(load)
}

/// Spoke to hub: status updates at `rate` per agent per second for one window.
async fn up(hub: &Hub, principal: &Principal, addr: &str, link: &str, rate: f64, s: &Settings) -> Res<Row> {
    let every = Duration::from_secs_f64(s.apps as f64 / rate);
    let load = agents(addr, s, Some(every)).await?;
    // The window opens half a period after a round of status updates and lasts whole periods,
    // so at a light rate both edges fall where nothing is in flight.
    let before = load.snapshot().status_updates_sent;
    wait_until_async(s.timeout, "a round of status updates", || async { load.snapshot().status_updates_sent > before })
        .await?;
    tokio::time::sleep(every / 2).await; // placing the measurement window, not synchronisation
    let window = every.mul_f64((s.window.as_secs_f64() / every.as_secs_f64()).ceil().max(1.0));
    let (a0, p0, rv0, t0) = (load.snapshot(), principal.scrape().await?, hub_rv(hub).await?, Instant::now());
    tokio::time::sleep(window).await; // a measurement window, not synchronisation
    let (a1, p1, rv1) = (load.snapshot(), principal.scrape().await?, hub_rv(hub).await?);
    let secs = t0.elapsed().as_secs_f64();
    load.stop().await;
    let delivered = p1.processed_apps - p0.processed_apps;
    let d = |f: fn(&Snapshot) -> u64| (f(&a1) - f(&a0)) as f64;
    let slow = p1.processed_apps_slow - p0.processed_apps_slow;
    let mean_ms = (p1.processed_apps_secs - p0.processed_apps_secs) / delivered.max(1.0) * 1e3;
    Ok(Row {
        link: link.to_owned(),
        up: true,
        rate,
        secs,
        produced: d(|a| a.status_updates_sent),
        first: (rv1 - rv0) as f64,
        delivered,
        sent: (p1.received - p0.received) - d(|a| a.acks_sent) - d(|a| a.heartbeats_sent),
        wait: format!("principal processing mean {mean_ms:.1} ms, {slow} over {RETRANSMIT_AFTER:?}"),
        notes: format!(
            "{} Applications sent down meanwhile, {} streams ended; counted on a running load: the window's edges may shift first transmissions and delivered by up to {} each",
            d(|a| a.objects_applied),
            d(|a| a.streams_ended),
            s.agents * s.apps
        ),
    })
}

/// Hub to spoke: `rate` Application changes per agent per second for one window, then a marker
/// change per agent; waits until every event is applied and ACKed.
async fn down(hub: &Hub, principal: &Principal, addr: &str, link: &str, rate: f64, s: &Settings) -> Res<Row> {
    let load = agents(addr, s, None).await?;
    let (a0, p0) = (load.snapshot(), principal.scrape().await?);
    let stop = CancellationToken::new();
    let sampler = tokio::spawn(sample_oldest(principal.metrics, stop.clone()));
    let total_rate = rate * s.agents as f64;
    let writes = (total_rate * s.window.as_secs_f64()).round() as usize;
    let tag = format!("{link}-{rate}").replace(' ', "-");
    let t0 = Instant::now();
    let done = futures::stream::iter(0..writes)
        .map(|k| {
            let tag = &tag;
            async move {
                tokio::time::sleep_until((t0 + Duration::from_secs_f64(k as f64 / total_rate)).into()).await;
                let (agent, app) = (k % s.agents + 1, (k / s.agents) % s.apps);
                set_path(hub, agent, app, &format!("{tag}-{k}")).await
            }
        })
        .buffer_unordered(WRITERS)
        .try_fold(0usize, |n, ()| async move { Ok(n + 1) })
        .await
        .context("cannot change the Applications")?;
    let secs = t0.elapsed().as_secs_f64();
    // The marker change: once every agent has applied it, the principal's watch has passed every
    // change above; once its outboxes are empty, every event is ACKed.
    let marker = format!("{tag}-drained");
    load.expect_marker(&marker);
    let drain = Instant::now();
    for n in 1..=s.agents {
        set_path(hub, n, 0, &marker).await?;
    }
    load.wait_all_marked(drain, s.timeout).await.context("the marker changes")?;
    let mut p1 = principal.scrape().await?;
    let deadline = Instant::now() + s.timeout;
    while p1.depth > 0.0 {
        if Instant::now() >= deadline {
            bail!("the principal's outboxes still hold {} events after {:?}", p1.depth, s.timeout);
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
        p1 = principal.scrape().await?;
    }
    let drained = drain.elapsed();
    stop.cancel();
    let oldest = sampler.await?;
    let a1 = load.snapshot();
    load.stop().await;
    let d = |f: fn(&Snapshot) -> u64| (f(&a1) - f(&a0)) as f64;
    let delivered = d(|a| a.objects_applied);
    Ok(Row {
        link: link.to_owned(),
        up: false,
        rate,
        secs,
        produced: (done + s.agents) as f64,
        first: delivered - d(|a| a.duplicates_received),
        delivered,
        sent: (p1.sent - p0.sent) - (p1.processed - p0.processed),
        wait: format!("oldest unACKed in the principal's outboxes {oldest:.2} s at most (sampled)"),
        notes: format!(
            "{:.0} changes/s achieved, drained {:.2} s after the window, {} status updates sent up meanwhile, {} streams ended",
            done as f64 / secs,
            drained.as_secs_f64(),
            d(|a| a.status_updates_sent),
            d(|a| a.streams_ended)
        ),
    })
}

fn print_rows(rows: &[Row], s: &Settings) {
    println!(
        "retransmission amplification ({} managed agents, {} Applications each, {:.0} s windows; target delivered / produced <= 1.01):",
        s.agents,
        s.apps,
        s.window.as_secs_f64()
    );
    println!(
        "  | link | direction | updates/s per agent | produced | coalesced away | first transmissions | retransmitted | delivered | delivered / produced | delivered / first transmissions |"
    );
    println!("  |---|---|---|---|---|---|---|---|---|---|");
    let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.3}", a / b) } else { "-".to_owned() };
    for r in rows {
        println!(
            "  | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | **{}** | {} |",
            r.link,
            if r.up { "up (status)" } else { "down (spec)" },
            r.rate,
            r.produced,
            r.coalesced(),
            r.first,
            r.retransmitted(),
            r.delivered,
            ratio(r.delivered, r.produced),
            ratio(r.delivered, r.first)
        );
    }
    for r in rows {
        println!(
            "  {} {} at {}/s per agent over {:.1} s: sent {:.0} (delivered {:.0}); {}; {}",
            r.link,
            if r.up { "up" } else { "down" },
            r.rate,
            r.secs,
            r.sent,
            r.delivered,
            r.wait,
            r.notes
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let s = Settings {
        agents: env_num("BENCH_AMP_AGENTS", if quick { 2.0 } else { 20.0 }).max(1.0) as usize,
        apps: env_num("BENCH_AMP_APPS", 5.0).max(1.0) as usize,
        rate: env_num("BENCH_AMP_RATE", 50.0).max(0.01),
        light_rate: env_num("BENCH_AMP_LIGHT_RATE", if quick { 5.0 } else { 1.0 }).max(0.01),
        window: Duration::from_secs_f64(env_num("BENCH_AMP_WINDOW", if quick { 3.0 } else { 30.0 }).max(0.5)),
        latency: Duration::from_millis(env_num("BENCH_AMP_LATENCY_MS", 50.0).max(0.0) as u64),
        timeout: Duration::from_secs(120),
    };
    println!(
        "amplification benchmark ({} cores; release principal, --auth xfcc: over h2c, agents simulated by tests::loadgen)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let hub = hub().await?;
    create_apps(&hub, &s).await?;
    let principal = Principal::start(&hub)?;
    let direct = format!("http://{}", principal.addr);
    let proxy = if s.latency.is_zero() { None } else { Some(FaultProxy::start(principal.addr).await?) };
    let mut links = vec![("direct".to_owned(), direct)];
    if let Some(p) = &proxy {
        p.set_latency(Direction::Both, s.latency);
        links.push((format!("+{} ms each way", s.latency.as_millis()), format!("http://{}", p.addr())));
    }
    let mut rows = Vec::new();
    for (link, addr) in &links {
        for rate in [s.light_rate, s.rate] {
            rows.push(up(&hub, &principal, addr, link, rate, &s).await?);
            eprintln!("  done: {link} up at {rate}/s");
            rows.push(down(&hub, &principal, addr, link, rate, &s).await?);
            eprintln!("  done: {link} down at {rate}/s");
        }
    }
    print_rows(&rows, &s);
    let (warns, errors) = principal.log_warnings();
    println!("  principal log: {} WARN lines, {errors} ERROR lines", warns.len());
    for line in warns.iter().take(5) {
        println!("    {line}");
    }
    drop(proxy);
    drop(principal);
    drop(hub);
    Ok(())
}
