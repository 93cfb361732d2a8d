//! The principal's event throughput with metrics and tracing on beside the same run with them
//! off.
//!
//! Two topologies run at once, each a spawned principal and one managed agent over mTLS with
//! embedded hub and spoke API servers (as `benches/sync.rs`):
//! - "on": principal and agent export spans over OTLP/gRPC to an in-process receiver
//!   (`--otlp-address`, `--otlp-sampling-ratio 0.01`), and both `/metrics` endpoints are scraped
//!   every second for the whole run;
//! - "off": no `--otlp-address`, and nobody scrapes. The metrics registry records in both (it
//!   cannot be turned off); `tests::topology` always binds the metrics listener on
//!   `127.0.0.1:0`, so here it is bound but idle. (In production `--metrics-port 0` without
//!   `--metrics-address` does not bind it at all.)
//!
//! Measured, alternating between the two in rounds so load from other processes falls on both:
//! end-to-end throughput (Applications created on the hub by 16 writers until all are on the
//! spoke), the principal's CPU time (utime + stime from `/proc/<pid>/stat`) per event over the
//! same batches, and the spans the receiver got.
//!
//! Run: `cargo build --release -p cli && cargo bench -p tests --bench observability` (sizes:
//! BENCH_OBS_APPS, BENCH_OBS_ROUNDS; BENCH_QUICK=1 for a smoke run; BENCH_OBS_CONTROL=1 for an
//! A/A run with both sides off, the noise floor; BENCH_OBS_OFF_FIRST=1 to start "off" first).
//! Figures are printed, never asserted.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use tests::bench::{AGENT, Side, cpu_time, env};
use tests::otlp::{Receiver, serve_receiver};
use tests::topology::{Mode, Topology};
use tokio_util::sync::CancellationToken;

type Res<T> = anyhow::Result<T>;

const SAMPLING_RATIO: &str = "0.01";

/// One side of the comparison and the principal CPU time spent in its throughput batches.
struct Run {
    side: Side,
    cpu: Duration,
}

impl Run {
    /// A topology whose principal and agent start with `args` (the same for both).
    async fn start(args: &[&str]) -> Res<Self> {
        let mut t = Topology::start_without_agents(&[(AGENT, Mode::Managed)]).await?;
        // Restart the principal with the flags (SIGKILL: a SIGTERM this early could beat its
        // signal handler). Both sides go through the same steps.
        t.kill_principal()?;
        t.set_principal_args(args);
        t.start_principal().await?;
        t.set_agent_args(args);
        t.start_agent(AGENT).await?;
        Ok(Self { side: Side::start(t).await?, cpu: Duration::ZERO })
    }

    async fn batch(&mut self, n: usize) -> Res<()> {
        let pid = self.side.topology.principal_pid().context("the principal is not running")?;
        let before = cpu_time(pid)?;
        self.side.throughput(n).await?;
        self.cpu += cpu_time(pid)?.saturating_sub(before);
        Ok(())
    }

    fn cpu_per_event(&self) -> Duration {
        self.cpu / u32::try_from(self.side.delivered.max(1)).unwrap_or(u32::MAX)
    }
}

/// Scrapes and their outcome.
#[derive(Debug, Default)]
struct Scrapes {
    ok: usize,
    failed: usize,
    bytes: usize,
}

/// GET `/metrics` on every address once a second until `cancel`.
fn scrape_every_second(addrs: Vec<SocketAddr>, cancel: CancellationToken) -> tokio::task::JoinHandle<Scrapes> {
    tokio::spawn(async move {
        let mut out = Scrapes::default();
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = every.tick() => {}
            }
            for addr in &addrs {
                match tests::http::get(*addr, "/metrics").await {
                    Ok((200, body)) => {
                        out.ok += 1;
                        out.bytes += body.len();
                    }
                    Ok(_) | Err(_) => out.failed += 1,
                }
            }
        }
        out
    })
}

/// Wait until the receiver has had nothing new for one export interval (the batch exporter
/// sends every 5 s), at most 20 s.
async fn spans_settled(receiver: &Receiver) -> usize {
    let quiet = Duration::from_secs(6);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (mut last, mut since) = (receiver.len(), tokio::time::Instant::now());
    while tokio::time::Instant::now() < deadline && since.elapsed() < quiet {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = receiver.len();
        if now != last {
            (last, since) = (now, tokio::time::Instant::now());
        }
    }
    last
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let apps = env("BENCH_OBS_APPS", if quick { 50 } else { 1000 });
    let rounds = env("BENCH_OBS_ROUNDS", if quick { 1 } else { 4 }).clamp(1, apps.max(1));

    let receiver = Receiver::default();
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let otlp = serve_receiver(receiver.clone(), cancel.child_token()).await?.to_string();

    // BENCH_OBS_CONTROL=1: an A/A run, "on" configured exactly as "off", for the noise floor.
    let control = std::env::var("BENCH_OBS_CONTROL").is_ok();
    let on_args = ["--otlp-address", otlp.as_str(), "--otlp-sampling-ratio", SAMPLING_RATIO];
    // BENCH_OBS_OFF_FIRST=1: start "off" first (the start order alone moves throughput; see
    // docs/benchmarks.md).
    let (mut on, mut off) = if std::env::var("BENCH_OBS_OFF_FIRST").is_ok() {
        let off = Run::start(&[]).await?;
        (Run::start(if control { &[] } else { &on_args }).await?, off)
    } else {
        (Run::start(if control { &[] } else { &on_args }).await?, Run::start(&[]).await?)
    };
    let t = &on.side.topology;
    let endpoints = if control {
        vec![]
    } else {
        vec![
            t.principal_metrics_addr().context("the principal's metrics address")?,
            t.agent_metrics_addr(AGENT).context("the agent's metrics address")?,
        ]
    };
    let scraping = cancel.child_token();
    let scraper = scrape_every_second(endpoints, scraping.clone());

    // One unmeasured batch each first: the first batch of a run is slower whichever side runs
    // it (an A/A run without this measured 0.83x).
    let warmup = (apps / rounds).clamp(1, 100);
    for run in [&mut on, &mut off] {
        run.side.throughput(warmup).await?;
        (run.side.busy, run.side.delivered) = (Duration::ZERO, 0);
    }
    let share = |round: usize| apps / rounds + usize::from(round < apps % rounds);
    for round in 0..rounds {
        let (first, second) = if round % 2 == 0 { (&mut on, &mut off) } else { (&mut off, &mut on) };
        first.batch(share(round)).await?;
        second.batch(share(round)).await?;
    }
    scraping.cancel();
    let scrapes = scraper.await?;
    let spans = spans_settled(&receiver).await;
    let received = receiver.spans();
    let traces: BTreeSet<&str> = received.iter().map(|s| s.trace_id.as_str()).collect();
    let mut by_name: BTreeMap<String, usize> = BTreeMap::new();
    for s in &received {
        *by_name.entry(format!("{} {}", s.service, s.name)).or_insert(0) += 1;
    }

    println!(
        "observability overhead ({} cores): principal + 1 managed agent over mTLS, {apps} Applications \
         by 16 hub writers per side, interleaved in {rounds} round(s)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if control {
        println!("  A/A control (BENCH_OBS_CONTROL): \"on\" is configured exactly as \"off\"");
    }
    println!(
        "  on:  --otlp-address (in-process receiver) --otlp-sampling-ratio {SAMPLING_RATIO} on principal and agent, \
         both /metrics scraped every second"
    );
    println!("  off: no OTLP, /metrics not scraped (the registry records in both)");
    println!("| measure | on | off | ratio on/off |");
    println!("|---|---|---|---|");
    println!(
        "| throughput | {:.0} events/s | {:.0} events/s | {:.2}x |",
        on.side.rate(),
        off.side.rate(),
        on.side.rate() / off.side.rate().max(1e-9)
    );
    println!(
        "| principal CPU per event | {} | {} | {:.2}x |",
        ms(on.cpu_per_event()),
        ms(off.cpu_per_event()),
        on.cpu_per_event().as_secs_f64() / off.cpu_per_event().as_secs_f64().max(1e-9)
    );
    println!(
        "| principal CPU in the batches | {} over {} | {} over {} | |",
        ms(on.cpu),
        ms(on.side.busy),
        ms(off.cpu),
        ms(off.side.busy)
    );
    let names: Vec<String> = by_name.iter().map(|(s, n)| format!("{s}: {n}")).collect();
    println!(
        "spans received (on): {spans} in {} traces ({}); {} Applications created there",
        traces.len(),
        if names.is_empty() { "none".to_string() } else { names.join(", ") },
        on.side.delivered + warmup + 1
    );
    println!(
        "scrapes (on): {} answered ({} bytes on average), {} failed",
        scrapes.ok,
        scrapes.bytes / scrapes.ok.max(1),
        scrapes.failed
    );
    drop((on, off));
    Ok(())
}
