//! The principal's answer to one periodic resync digest, in process: the digest of what one
//! managed agent should hold, computed from the indexes by agent (what the principal does) and
//! by a full scan of the hub's caches (what it did before), on the same synthetic hub, then on
//! a hub `BENCH_SCALE` times larger. Figures are printed as ratios to the same run's baselines,
//! never asserted.
//!
//! Hub: `BENCH_AGENTS` (1000) managed agents, each with `BENCH_APPS_PER_AGENT` (10)
//! Applications, its own AppProject and a repository secret of it; one AppProject and repository
//! matching every agent; the GPG keys ConfigMap. Both mappings (namespace, destination).
//!
//! Run: `cargo bench -p principal --bench periodic_resync` (`BENCH_QUICK=1`: 100 agents).

use std::time::{Duration, Instant};

use principal::sync::bench::{DigestBench, HubShape, agent};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The median time of `f` over `rounds` calls (after one untimed call), one call per agent of
/// `agents` in turn.
async fn median<F, Fut>(agents: &[String], rounds: usize, mut f: F) -> Duration
where
    F: FnMut(&str) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let agent = &agents[i % agents.len()];
        let started = Instant::now();
        f(agent).await;
        times.push(started.elapsed());
    }
    times.sort_unstable();
    times[times.len() / 2]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

struct Figures {
    full_scan: Duration,
    first: Duration,
    in_sync: Duration,
    one_changed: Duration,
}

async fn measure(shape: HubShape, rounds: usize) -> Figures {
    let built = Instant::now();
    let bench = DigestBench::new(shape).await;
    eprintln!(
        "  built a hub of {} agents x {} Applications in {:.1} s",
        shape.agents,
        shape.apps_per_agent,
        built.elapsed().as_secs_f64()
    );
    let agents: Vec<String> = (0..shape.agents).step_by((shape.agents / rounds).max(1)).map(agent).collect();
    // The indexes and the full scan agree (a sample).
    for a in agents.iter().take(10) {
        assert_eq!(bench.indexed_digest(a).await, bench.full_scan_digest(a), "{a}: the digests differ");
    }
    let full_scan = median(&agents, rounds, |a| {
        std::hint::black_box(bench.full_scan_digest(a));
        async {}
    })
    .await;
    // The first digest of an agent computes its entries (the sample above did some: others here).
    let fresh: Vec<String> = (0..shape.agents).skip(1).step_by((shape.agents / rounds).max(1)).map(agent).collect();
    let first = median(&fresh, rounds.min(fresh.len()), |a| {
        let bench = &bench;
        let a = a.to_owned();
        async move {
            std::hint::black_box(bench.indexed_digest(&a).await);
        }
    })
    .await;
    let in_sync = median(&fresh, rounds, |a| {
        let bench = &bench;
        let a = a.to_owned();
        async move {
            std::hint::black_box(bench.indexed_digest(&a).await);
        }
    })
    .await;
    // One of the agent's Applications changed since its last digest (the change itself untimed).
    let mut rv = 1;
    let mut one_changed = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let a = &fresh[i % fresh.len()];
        rv += 1;
        bench.change_app(a, 0, rv).await;
        let started = Instant::now();
        std::hint::black_box(bench.indexed_digest(a).await);
        one_changed.push(started.elapsed());
    }
    one_changed.sort_unstable();
    Figures { full_scan, first, in_sync, one_changed: one_changed[one_changed.len() / 2] }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let agents = env_usize("BENCH_AGENTS", if quick { 100 } else { 1000 });
    let apps = env_usize("BENCH_APPS_PER_AGENT", 10);
    let scale = env_usize("BENCH_SCALE", 10).max(1);
    let rounds = env_usize("BENCH_ROUNDS", if quick { 20 } else { 200 });
    for destination_mapping in [false, true] {
        let mapping = if destination_mapping { "destination" } else { "namespace" };
        println!(
            "periodic resync digest of one managed agent ({mapping} mapping, {apps} Applications per agent, median of {rounds}):"
        );
        println!(
            "  | hub | full scan (before) | indexed, first digest | indexed, in sync | indexed, one Application changed | full scan / in sync |"
        );
        let mut in_sync_1x = None;
        for n in [agents, agents * scale] {
            let f = measure(HubShape { agents: n, apps_per_agent: apps, destination_mapping }, rounds).await;
            println!(
                "  | {n} agents, {} Applications | {} | {} | {} | {} | {:.0}x |",
                n * apps,
                us(f.full_scan),
                us(f.first),
                us(f.in_sync),
                us(f.one_changed),
                f.full_scan.as_secs_f64() / f.in_sync.as_secs_f64().max(1e-9)
            );
            match in_sync_1x {
                None => in_sync_1x = Some(f.in_sync),
                Some(base) => println!(
                    "  in sync at {scale}x the hub / at 1x: {:.2} (1.00: independent of the hub's size)",
                    f.in_sync.as_secs_f64() / base.as_secs_f64().max(1e-9)
                ),
            }
        }
    }
}
