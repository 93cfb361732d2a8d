//! Live resources through the resource proxy beside the same reads made directly against the
//! agent's API server, in the same run.
//!
//! One topology: a spawned principal serving the resource proxy and one managed agent, embedded
//! hub and spoke API servers, mTLS everywhere. The client is kube-rs with the cluster secret's
//! credentials (what the hub's Argo CD uses) for "proxy", and the spoke's admin kubeconfig for
//! "direct". Each round reads one tracked ConfigMap N times, sequentially (latency) and from 8
//! tasks at once (throughput), alternating "direct" and "proxy" so load from other processes
//! falls on both. A proxied read is: TLS to the proxy, an event to the agent over its stream,
//! the agent's managed check (one GET) and its read (the GET the answer carries), the answer back.
//!
//! A second phase streams one pod's log (the spoke's simulated node runs the pod), whole,
//! through the proxy (`pods/log`: a `containerlog` event, the agent's `StreamLogs` call) and
//! directly, alternating, and prints MB/s of each and their ratio.
//!
//! Run: `cargo build --release -p cli && cargo bench -p tests --bench live` (sizes: BENCH_LIVE_N,
//! BENCH_LIVE_ROUNDS,
//! BENCH_LIVE_LOG_LINES; BENCH_QUICK=1 for a smoke run). Figures are printed, never asserted.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::AsyncBufReadExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::LogParams;
use kube::api::{Api, PostParams};
use serde_json::json;
use tests::bench::{AGENT, env, percentile};
use tests::topology::{Mode, StartOptions, Topology, ensure_namespace};

type Res<T> = anyhow::Result<T>;

const CONCURRENCY: usize = 8;

/// Per-request latencies of `n` sequential reads, and the wall time of `n` reads from
/// [`CONCURRENCY`] tasks.
async fn measure(api: &Api<ConfigMap>, n: usize) -> Res<(Vec<Duration>, Duration)> {
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        api.get("ui").await?;
        lat.push(t.elapsed());
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..CONCURRENCY {
        let api = api.clone();
        let share = n / CONCURRENCY + usize::from(w < n % CONCURRENCY);
        tasks.spawn(async move {
            for _ in 0..share {
                api.get("ui").await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok((lat, started.elapsed()))
}

/// A log line of the bench pod: 100 bytes with its newline.
const LOG_LINE: &str =
    "0123456789abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmno";

/// Reads pod `log`'s whole log through `pods`; returns its size and the time it took.
async fn read_log(pods: &Api<Pod>) -> Res<(usize, Duration)> {
    let started = Instant::now();
    let mut stream = Box::pin(pods.log_stream("log", &LogParams::default()).await?);
    let mut bytes = 0;
    loop {
        let n = stream.fill_buf().await?.len();
        if n == 0 {
            break;
        }
        bytes += n;
        stream.consume_unpin(n);
    }
    Ok((bytes, started.elapsed()))
}

/// Pod-log streaming, direct and through the proxy, alternating; prints MB/s and the ratio.
async fn logs(t: &Topology, spoke: kube::Client, lines: usize, rounds: usize) -> Res<()> {
    let direct: Api<Pod> = Api::namespaced(spoke, "guestbook");
    let script = format!("yes {LOG_LINE} | head -n {lines}; sleep 3600");
    direct
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "log",
                "annotations": {"argocd.argoproj.io/tracking-id": "gb:/Pod:guestbook/log"}},
                "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}]}}))?,
        )
        .await?;
    let size = lines * (LOG_LINE.len() + 1);
    tests::wait::wait_until_async(tests::DEFAULT_TIMEOUT, "the pod printed its log", || {
        let direct = direct.clone();
        async move { read_log(&direct).await.is_ok_and(|(n, _)| n == size) }
    })
    .await?;
    let proxied: Api<Pod> = Api::namespaced(tests::live::cluster_client(t, AGENT).await?, "guestbook");
    println!(
        "pod logs: {rounds} rounds x one log of {:.1} MB, direct and through the proxy, alternating",
        size as f64 / 1e6
    );
    let (mut d, mut p) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        let (n, took) = read_log(&direct).await?;
        anyhow::ensure!(n == size, "direct: {n} bytes of {size}");
        d += took;
        let (n, took) = read_log(&proxied).await?;
        anyhow::ensure!(n == size, "proxy: {n} bytes of {size}");
        p += took;
    }
    let mb = (size * rounds) as f64 / 1e6;
    let (drate, prate) = (mb / d.as_secs_f64().max(1e-9), mb / p.as_secs_f64().max(1e-9));
    println!(" direct: {drate:>8.1} MB/s");
    println!("  proxy: {prate:>8.1} MB/s");
    println!("  proxy / direct: log throughput x{:.2}", prate / drate.max(1e-9));
    Ok(())
}

#[derive(Default)]
struct Totals {
    lat: Vec<Duration>,
    wall: Duration,
    reads: usize,
}

impl Totals {
    fn add(&mut self, (lat, wall): (Vec<Duration>, Duration), n: usize) {
        self.lat.extend(lat);
        self.wall += wall;
        self.reads += n;
    }

    fn line(&mut self, name: &str) -> (Duration, f64) {
        self.lat.sort();
        let p50 = percentile(&self.lat, 0.50);
        let rate = self.reads as f64 / self.wall.as_secs_f64().max(1e-9);
        println!(
            "{name:>7}: p50 {:>8.2?}  p99 {:>8.2?}  max {:>8.2?}  ({} sequential reads)  {rate:>7.0} reads/s from {CONCURRENCY} tasks",
            p50,
            percentile(&self.lat, 0.99),
            self.lat.last().copied().unwrap_or_default(),
            self.lat.len(),
        );
        (p50, rate)
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let n = env("BENCH_LIVE_N", if quick { 20 } else { 400 });
    let rounds = env("BENCH_LIVE_ROUNDS", if quick { 1 } else { 5 });
    // The simulated node keeps 4 MiB of a container's log (apiserver::node::logs::MAX_LOG_BYTES):
    // the full log (3.5 MB) fits.
    let log_lines = env("BENCH_LIVE_LOG_LINES", if quick { 20_000 } else { 35_000 });
    anyhow::ensure!(
        log_lines * (LOG_LINE.len() + 1) <= 4 * 1024 * 1024,
        "BENCH_LIVE_LOG_LINES={log_lines}: the log would exceed what the simulated node keeps"
    );
    let options = StartOptions { resource_proxy: true, simulate_pods: true, ..StartOptions::default() };
    let t = Topology::start_with_options(&[(AGENT, Mode::Managed)], options).await?;
    let proxy_addr = t.resource_proxy_addr().context("the resource proxy")?;
    t.ctl(&["agent", "create", AGENT, "--resource-proxy-server", &proxy_addr.to_string()])?;
    // The objects below are tracked by Application `gb`: the agent serves only what an
    // Application of its own manages.
    tests::live::application_on_agent(&t, AGENT, "gb").await?;
    let spoke = t.spoke(AGENT)?;
    ensure_namespace(&spoke, "guestbook").await?;
    let direct: Api<ConfigMap> = Api::namespaced(spoke.clone(), "guestbook");
    direct
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "ui",
                "annotations": {"argocd.argoproj.io/tracking-id": "gb:/ConfigMap:guestbook/ui"}},
                "data": {"k": "v".repeat(512)}}))?,
        )
        .await?;
    let proxied: Api<ConfigMap> = Api::namespaced(tests::live::cluster_client(&t, AGENT).await?, "guestbook");
    // Warm both (TLS sessions, the agent's first discovery).
    measure(&direct, 5).await?;
    measure(&proxied, 5).await?;

    println!("live resources: {rounds} rounds x {n} reads of one ConfigMap, direct and through the proxy, alternating");
    let (mut d, mut p) = (Totals::default(), Totals::default());
    for _ in 0..rounds {
        d.add(measure(&direct, n).await?, n);
        p.add(measure(&proxied, n).await?, n);
    }
    let (dp50, drate) = d.line("direct");
    let (pp50, prate) = p.line("proxy");
    println!(
        "  proxy / direct: p50 latency x{:.2}, throughput x{:.2}",
        pp50.as_secs_f64() / dp50.as_secs_f64().max(1e-9),
        prate / drate.max(1e-9)
    );
    logs(&t, spoke, log_lines, rounds).await?;
    Ok(())
}
