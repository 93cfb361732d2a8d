//! Fan-out: one change to an AppProject every agent matches, delivered to every agent, repeated
//! on the same connected fleet; how the time and the principal's CPU grow with the agents.
//!
//! Setup as `mesh_scale.rs` (`tests::loadhub`): a hub embedded API server, an ES256 JWT key
//! (`BENCH_JWT_KEY_TYPE=rsa` for RSA-4096), the release `argocd-agent principal` spawned with
//! `--insecure-plaintext --auth xfcc:` on 127.0.0.1, and agents simulated in this process by
//! `tests::loadgen`, one HTTP/2 connection each (`BENCH_FANOUT_PER_CONNECTION` for more).
//!
//! Levels `BENCH_FANOUT_AGENTS` (`100,1000,5000`), each on a fresh principal: every agent
//! connected and resynced, then `BENCH_FANOUT_ROUNDS` (5) fan-outs, one at a time: the hub write,
//! the first and the last agent to apply it, and the CPU the principal and this process (the
//! agents) spent from the write until a window after the last agent (twice the last agent's time
//! plus 50 ms, so the ACKs are in), per agent. Printed: the median of the rounds with their
//! spread (min-max).
//!
//! Same-run baseline: `BENCH_FANOUT_BASELINE=<path of another argocd-agent binary>` (e.g. a
//! release build of the commit before a change, `git worktree add` + `cargo build --release`)
//! runs every level with that binary too, alternating which goes first, and prints this build /
//! baseline for each figure.
//!
//! Run: `cargo build --release -p cli && cargo bench -p tests --bench fanout`. `BENCH_QUICK=1`:
//! levels 20 and 100, 2 rounds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tests::loadgen::{LoadConfig, LoadGen, procstat};
use tests::loadhub::{FANOUT_PROJECT, LoadHub, LoadPrincipal, fanout, fanout_project, progress, projects};

type Res<T> = anyhow::Result<T>;

/// One fan-out.
#[derive(Clone, Copy, Debug)]
struct Round {
    hub_write: Duration,
    first: Duration,
    last: Duration,
    /// CPU of the principal, and of the agents (this process), over the round.
    principal_cpu: Duration,
    agents_cpu: Duration,
}

/// The rounds of one level with one binary.
struct Level {
    binary: &'static str,
    agents: usize,
    rounds: Vec<Round>,
}

/// Median and spread of one figure over the rounds.
struct Stat {
    median: Duration,
    min: Duration,
    max: Duration,
}

impl Stat {
    fn of(rounds: &[Round], figure: impl Fn(&Round) -> Duration) -> Self {
        let mut v: Vec<Duration> = rounds.iter().map(figure).collect();
        v.sort();
        let median = if v.is_empty() { Duration::ZERO } else { v[v.len() / 2] };
        Self { median, min: v.first().copied().unwrap_or_default(), max: v.last().copied().unwrap_or_default() }
    }

    fn ms(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        format!("{:.1} ms ({:.1}-{:.1})", ms(self.median), ms(self.min), ms(self.max))
    }

    fn us_per(&self, agents: usize) -> f64 {
        self.median.as_secs_f64() * 1e6 / agents as f64
    }
}

fn cpu(pid: u32) -> Res<Duration> {
    Ok(Duration::from_nanos(procstat::cpu_ns(pid)?))
}

#[derive(Clone, Copy)]
struct Plan {
    rounds: usize,
    per_connection: usize,
    timeout: Duration,
}

async fn level(hub: &LoadHub, (label, program): (&'static str, &Path), agents: usize, plan: Plan) -> Res<Level> {
    use kube::api::{Patch, PatchParams};
    let name = format!("{label}, {agents} agents");
    let reset = Patch::Merge(serde_json::json!({"spec": {"description": format!("before {name}")}}));
    projects(hub)
        .patch(FANOUT_PROJECT, &PatchParams::default(), &reset)
        .await
        .context("cannot reset the AppProject")?;
    let (principal, _) = LoadPrincipal::start_program(program, hub, &hub.keys[0], 0, Instant::now(), &[])?;
    let mut config = LoadConfig::new(principal.addr(), agents);
    config.streams_per_connection = plan.per_connection;
    // First connects at 2,000 a second: a fleet coming up, not a storm (`storm.rs` times that).
    config.ramp = Duration::from_secs_f64(agents as f64 / 2000.0);
    let started = Instant::now();
    let load = LoadGen::start(config);
    let connect = load.wait_all_resynced(started, plan.timeout, progress(name.clone(), agents)).await?;
    eprintln!("  {name}: all resynced after {:.1} s", connect.as_secs_f64());
    let (me, pid) = (std::process::id(), principal.pid());
    let mut rounds = Vec::new();
    for round in 0..plan.rounds {
        let (p0, a0) = (cpu(pid)?, cpu(me)?);
        let fan = fanout(hub, std::slice::from_ref(&load), agents * 1000 + round, plan.timeout)
            .await
            .with_context(|| format!("{name}: fan-out {round}"))?;
        // A measurement window for the ACKs' CPU, not synchronisation: every agent has applied it.
        tokio::time::sleep(fan.last + Duration::from_millis(50)).await;
        let (p1, a1) = (cpu(pid)?, cpu(me)?);
        rounds.push(Round {
            hub_write: fan.hub_write,
            first: fan.first,
            last: fan.last,
            principal_cpu: p1.saturating_sub(p0),
            agents_cpu: a1.saturating_sub(a0),
        });
    }
    let ended = load.snapshot().streams_ended;
    load.stop().await;
    anyhow::ensure!(ended == 0, "{name}: {ended} streams ended during the fan-outs; {}", principal.warnings());
    Ok(Level { binary: label, agents, rounds })
}

fn print(levels: &[Level]) {
    println!(
        "  | binary | agents | hub write | first agent | last agent | last / agent | principal CPU / agent | agents' CPU / agent |"
    );
    println!("  |---|---|---|---|---|---|---|---|");
    for l in levels {
        let last = Stat::of(&l.rounds, |r| r.last);
        let pcpu = Stat::of(&l.rounds, |r| r.principal_cpu);
        let acpu = Stat::of(&l.rounds, |r| r.agents_cpu);
        println!(
            "  | {} | {} | {} | {} | {} | {:.1} µs | {:.1} µs | {:.1} µs |",
            l.binary,
            l.agents,
            Stat::of(&l.rounds, |r| r.hub_write).ms(),
            Stat::of(&l.rounds, |r| r.first).ms(),
            last.ms(),
            last.us_per(l.agents),
            pcpu.us_per(l.agents),
            acpu.us_per(l.agents),
        );
    }
}

fn print_ratios(levels: &[Level]) {
    for ours in levels.iter().filter(|l| l.binary == THIS) {
        let Some(base) = levels.iter().find(|l| l.binary == BASELINE && l.agents == ours.agents) else { continue };
        let ratio = |f: fn(&Round) -> Duration| {
            Stat::of(&ours.rounds, f).median.as_secs_f64() / Stat::of(&base.rounds, f).median.as_secs_f64().max(1e-9)
        };
        println!(
            "  {} agents, this build / baseline (medians): last agent {:.2}x, principal CPU {:.2}x, agents' CPU {:.2}x",
            ours.agents,
            ratio(|r| r.last),
            ratio(|r| r.principal_cpu),
            ratio(|r| r.agents_cpu)
        );
    }
}

const THIS: &str = "this build";
const BASELINE: &str = "baseline";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let sizes = std::env::var("BENCH_FANOUT_AGENTS")
        .unwrap_or_else(|_| if quick { "20,100" } else { "100,1000,5000" }.to_owned());
    let sizes: Vec<usize> = sizes
        .split(',')
        .map(|s| s.trim().parse().with_context(|| format!("BENCH_FANOUT_AGENTS: {s:?} is not a number")))
        .collect::<Res<_>>()?;
    let plan = Plan {
        rounds: tests::bench::env("BENCH_FANOUT_ROUNDS", if quick { 2 } else { 5 }).max(1),
        per_connection: tests::bench::env("BENCH_FANOUT_PER_CONNECTION", 1).max(1),
        timeout: Duration::from_secs(tests::bench::env("BENCH_FANOUT_TIMEOUT", 600) as u64),
    };
    let this = tests::workspace_binary("argocd-agent")?;
    let baseline = std::env::var_os("BENCH_FANOUT_BASELINE").map(PathBuf::from);
    if let Some(b) = &baseline {
        anyhow::ensure!(b.is_file(), "BENCH_FANOUT_BASELINE={} is not a file", b.display());
    }
    println!(
        "fan-out ({} cores): one AppProject change to every agent, {} rounds per level, {} agent(s) per connection; medians (min-max)",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        plan.rounds,
        plan.per_connection
    );
    let hub = LoadHub::start_with_key_type("ecdsa-p256").await?;
    projects(&hub)
        .create(&kube::api::PostParams::default(), &fanout_project("created before the agents")?)
        .await
        .context("cannot create the fan-out AppProject")?;
    let mut levels = Vec::new();
    for (i, &agents) in sizes.iter().enumerate() {
        let mut binaries = vec![(THIS, this.as_path())];
        if let Some(b) = &baseline {
            binaries.push((BASELINE, b.as_path()));
            if i % 2 == 1 {
                binaries.reverse();
            }
        }
        for binary in binaries {
            let l = level(&hub, binary, agents, plan).await?;
            print(std::slice::from_ref(&l));
            levels.push(l);
        }
    }
    println!("all levels:");
    print(&levels);
    print_ratios(&levels);
    Ok(())
}
