//! The consistency checker under chaos ([`tests::consistency`]): a managed and an autonomous
//! agent behind a flapping fault proxy, hundreds of Applications written on their owner sides,
//! the principal, the agents and the hub's API server SIGKILLed and restarted, then convergence,
//! order and delay checks; on embedded API servers and on real kube-apiservers; and through
//! principal replica failovers (`--agent-leases`).
//!
//! `CONSISTENCY_DURATION` (seconds of chaos; default 90 in the per-change suite, where every
//! process is still killed at least once, and 540, about 10 minutes in all, in the soak tier,
//! `TESTS_SOAK=1`: `scripts/soak`),
//! `CONSISTENCY_APPS` (default 200), `CONSISTENCY_AUTONOMOUS_APPS` (default a quarter),
//! `CONSISTENCY_CONVERGE` (seconds, default 120), `CONSISTENCY_SEED`. Quick local run:
//! `CONSISTENCY_DURATION=60 cargo nextest run -p tests --test consistency --no-capture`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use futures::StreamExt as _;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event, ListSemantic};
use tests::consistency::{
    Checker, Config, Group, Rng, Side, StopHandle, Writer, link_chaos, process_chaos, wait_converged,
};
use tests::faultproxy::FaultProxy;
use tests::replicas::{TEST_CONVERGE as CONVERGE, attach_to, owner, replicas_on, wait_owner};
use tests::topology::{ARGOCD_NS, Clusters, Mode, StartOptions, Topology, Transport};
use tests::wait_until_async;

/// Initial sync of the populated Applications, before any chaos.
const INITIAL_SYNC: Duration = Duration::from_secs(120);

/// Feed every event of the watch of `agent`'s Applications on one side to the checker. Errors
/// (e.g. while the hub's API server is down) are counted by the checker and the watch relists or
/// resumes; a watch that delivers nothing fails the run ([`tests::consistency::Report::blind_spots`]).
async fn watch_side(checker: Arc<Checker>, agent: &'static str, side: Side, api: Api<DynamicObject>) {
    checker.watch_started(agent, side);
    let config = watcher::Config::default().list_semantic(ListSemantic::MostRecent);
    let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(o) | Event::InitApply(o)) => {
                if let Some(name) = o.metadata.name.as_deref() {
                    checker.observe(side, name, Some(&o.data));
                }
            }
            Ok(Event::Delete(o)) => {
                if let Some(name) = o.metadata.name.as_deref() {
                    checker.observe(side, name, None);
                }
            }
            Ok(Event::Init | Event::InitDone) => {}
            Err(e) => checker.watch_error(agent, side, &e.to_string()),
        }
    }
    checker.watch_error(agent, side, "the watch stream ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistency_under_chaos() -> Result<()> {
    consistency_run(Config::from_env()?, Clusters::default()).await
}

/// The same on real kube-apiservers (hub and spokes), the principal and agents bound to the
/// shipped RBAC; the hub kills hit kube-apiserver (etcd keeps the state). 60 s of chaos in the
/// per-change suite (each process killed at least once), 600 s in the soak tier, unless
/// `CONSISTENCY_DURATION` says otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_consistency_under_chaos() -> Result<()> {
    let duration = tests::tier::size(Duration::from_secs(60), Duration::from_secs(600));
    consistency_run(Config::from_env_or(duration)?, Clusters::REAL).await
}

async fn consistency_run(cfg: Config, clusters: Clusters) -> Result<()> {
    let agents = agents_of(&cfg);
    let modes: Vec<(&str, Mode)> = agents.iter().map(|(n, m, _)| (*n, *m)).collect();
    let mut t = Topology::start_on(&modes, clusters, false).await?;
    let proxy = FaultProxy::start(t.principal_addr().context("the principal's address")?).await?;
    for (name, _) in &modes {
        t.start_agent_via(name, proxy.addr()).await?;
    }
    for (name, _) in &modes {
        let r = wait_until_async(INITIAL_SYNC, &format!("agent {name} to connect"), || async {
            t.principal_connects(name) >= 1
        })
        .await;
        r.with_context(|| t.logs())?;
    }
    let mut rng = Rng::new(cfg.seed);
    let w = Workload::start(&t, &agents, &mut rng).await?;

    // The chaos: link faults all along, process kills in turn.
    let link = tokio::spawn(link_chaos(proxy.control(), rng.fork(), w.stop.clone()));
    let names: Vec<String> = modes.iter().map(|(n, _)| (*n).to_string()).collect();
    let mut kills = Vec::new();
    let chaos = process_chaos(&mut t, &names, &mut rng, cfg.duration, &mut kills).await;
    w.stop_handle.stop();
    let link = link.await?;
    chaos.with_context(|| t.logs())?;
    let chaos = format!(
        "{} black holes, {} resets, {} latency spells; kills:\n  {}",
        link.blackholes,
        link.resets,
        link.latencies,
        kills.join("\n  ")
    );
    w.finish(&mut t, &cfg, &chaos, &[], &String::new).await
}

/// The agents of a run: a managed one, and an autonomous one unless `cfg` has none.
fn agents_of(cfg: &Config) -> Vec<(&'static str, Mode, usize)> {
    let mut agents = vec![("cm", Mode::Managed, cfg.apps)];
    if cfg.autonomous_apps > 0 {
        agents.push(("ca", Mode::Autonomous, cfg.autonomous_apps));
    }
    agents
}

/// The checker's watches and the owner-side writers of one run.
struct Workload {
    checker: Arc<Checker>,
    groups: Vec<Group>,
    watchers: Vec<tokio::task::JoinHandle<()>>,
    writers: Vec<tokio::task::JoinHandle<Result<()>>>,
    stop_handle: StopHandle,
    stop: tests::consistency::Stop,
}

impl Workload {
    /// Watches both sides, populates the Applications, waits for the baseline to converge, then
    /// starts the writers (about 30 writes a second in all).
    async fn start(t: &Topology, agents: &[(&'static str, Mode, usize)], rng: &mut Rng) -> Result<Self> {
        println!("consistency: {} Applications on {} agents", agents.iter().map(|a| a.2).sum::<usize>(), agents.len());
        let checker = Arc::new(Checker::new());
        let mut groups = Vec::new();
        for (name, mode, target) in agents {
            groups.push(Group::new(name, *mode, t.hub(), t.spoke(name)?, ARGOCD_NS, *target));
        }
        let mut watchers = Vec::new();
        for (g, &(name, _, _)) in groups.iter().zip(agents) {
            for side in [Side::Hub, Side::Spoke] {
                watchers.push(tokio::spawn(watch_side(checker.clone(), name, side, g.api(side).clone())));
            }
        }
        // Populate, and check the baseline works before any chaos.
        let (stop_handle, stop) = StopHandle::new();
        let started = Instant::now();
        for g in &groups {
            Writer::new(checker.clone(), g.clone(), rng.fork(), stop.clone()).populate().await?;
        }
        let initial = wait_converged(&groups, INITIAL_SYNC).await.with_context(|| t.logs())?;
        println!(
            "populated in {:.1} s, in sync {:.1} s later",
            started.elapsed().saturating_sub(initial).as_secs_f64(),
            initial.as_secs_f64()
        );
        let mut writers = Vec::new();
        for g in &groups {
            let pace = match g.mode {
                Mode::Managed => (Duration::from_millis(30), Duration::from_millis(150)),
                Mode::Autonomous => (Duration::from_millis(100), Duration::from_millis(400)),
            };
            let spec = Writer::new(checker.clone(), g.clone(), rng.fork(), stop.clone());
            writers.push(tokio::spawn(spec.run_spec(pace)));
            let status = Writer::new(checker.clone(), g.clone(), rng.fork(), stop.clone());
            writers.push(tokio::spawn(status.run_status(pace)));
        }
        Ok(Self { checker, groups, watchers, writers, stop_handle, stop })
    }

    /// Stops the writers, waits for convergence, and checks the owner sides against the record
    /// and every side's order; fails with the violations, the `chaos` summary and `logs`.
    /// `stopped`: processes of the topology stopped on purpose (a principal replaced by replicas).
    async fn finish(
        self,
        t: &mut Topology,
        cfg: &Config,
        chaos: &str,
        stopped: &[&str],
        logs: &dyn Fn() -> String,
    ) -> Result<()> {
        let Self { checker, groups, watchers, writers, stop_handle, .. } = self;
        stop_handle.stop();
        for w in writers {
            w.await??;
        }
        let down: Vec<String> = t.not_running().into_iter().filter(|p| !stopped.contains(&p.as_str())).collect();
        assert!(down.is_empty(), "not running after the chaos: {down:?}\n{}", t.logs());
        println!("chaos: {chaos}");

        // Convergence, then the owner sides against the record.
        let converged = wait_converged(&groups, cfg.converge).await;
        let mut problems = Vec::new();
        match &converged {
            Ok(d) => println!("converged {:.1} s after the chaos stopped", d.as_secs_f64()),
            Err(e) => problems.push(format!("no convergence: {e:#}")),
        }
        for g in &groups {
            let (hub, spoke) = g.states().await?;
            let owner = match g.mode {
                Mode::Managed => &hub,
                Mode::Autonomous => &spoke,
            };
            problems.extend(checker.check_owner(&g.agent, owner));
            if g.mode == Mode::Managed {
                problems.extend(checker.check_spoke_status(&g.agent, &spoke));
            }
        }
        for w in &watchers {
            w.abort();
        }

        let report = checker.report();
        println!("{report}");
        for kind in report.never_acked() {
            problems.push(format!("no {kind} write was ever acknowledged: the run did not exercise it"));
        }
        // The order and delay checks are only as good as what the watches saw.
        problems.extend(report.blind_spots().into_iter().map(|b| format!("the checker was blind: {b}")));
        let violations = checker.violations();
        if violations.is_empty() && problems.is_empty() {
            return Ok(());
        }
        let mut msg = String::new();
        for v in violations.iter().take(30) {
            msg.push_str(&format!("violation: {v}\n"));
        }
        for p in problems.iter().take(30) {
            msg.push_str(&format!("{p}\n"));
        }
        let apps: std::collections::BTreeSet<&str> = violations.iter().map(|v| v.app.as_str()).take(5).collect();
        for app in apps {
            msg.push_str(&checker.describe(app));
        }
        let verdict = format!(
            "{} violations, {} final-state problems (CONSISTENCY_SEED={}):\n{msg}",
            violations.len(),
            problems.len(),
            cfg.seed
        );
        // On stdout as well, ahead of the processes' logs: a truncated report keeps the verdict.
        println!("{verdict}");
        panic!("{verdict}\n{}\n{}", logs(), t.logs());
    }
}

/// The checker through principal replica failovers (`--agent-leases`, docs/ha.md): three
/// replicas behind a load balancer standing in for the Service, native mTLS, both agents owned by
/// one replica; while the owner sides write, the replica that owns the managed agent is
/// SIGKILLed, twice (two of the three replicas die). Every acknowledged write must converge,
/// nothing may go back, no delete may be undone. 45 s of writes (180 s in the soak tier) unless
/// `CONSISTENCY_DURATION` says otherwise; a quarter of `CONSISTENCY_APPS` Applications (the replicas' SIGKILLs are the
/// chaos here, not the link).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistency_through_replica_owner_kills() -> Result<()> {
    let cfg = Config::from_env_or(tests::tier::size(Duration::from_secs(45), Duration::from_secs(180)))?;
    let mut agents = agents_of(&cfg);
    for a in &mut agents {
        a.2 = (a.2 / 4).max(5);
    }
    let modes: Vec<(&str, Mode)> = agents.iter().map(|(n, m, _)| (*n, *m)).collect();
    let names = ["r0", "r1", "r2"];
    let (mut t, mut r) = replicas_on(&modes, Transport::Mtls, StartOptions::default(), &names).await?;
    let agent_names: Vec<&str> = modes.iter().map(|(n, _)| *n).collect();
    attach_to(&mut t, &r, &agent_names, 0).await?;
    let mut rng = Rng::new(cfg.seed);
    let w = Workload::start(&t, &agents, &mut rng).await?;

    let mut stop = w.stop.clone();
    let mut kills = Vec::new();
    for _ in 0..2 {
        // The owner-side writes go on between the kills.
        if !stop.pause(cfg.duration / 3).await {
            break;
        }
        let (victim, transitions) = owner(&t.hub(), "cm").await?.context("agent cm has no Lease")?;
        let index = names.iter().position(|n| *n == victim).context("cm is owned by no replica")?;
        let killed = Instant::now();
        r.replica_mut(index).kill()?;
        let what = format!("agent cm to move off the killed replica {victim}");
        let moved = wait_owner(&t.hub(), "cm", CONVERGE, &what, |h, n| h != victim && n > transitions).await;
        moved.with_context(|| format!("{}\n{}", r.logs(), t.logs()))?;
        let now = owner(&t.hub(), "cm").await?.map(|(h, _)| h).unwrap_or_default();
        kills.push(format!("SIGKILL {victim} (owner of cm): cm on {now} after {:?}", killed.elapsed()));
    }
    stop.pause(cfg.duration / 3).await;
    let chaos = format!("replica kills:\n  {}", kills.join("\n  "));
    let logs = || r.logs();
    // The topology's own principal only bootstrapped the hub for the replicas.
    w.finish(&mut t, &cfg, &chaos, &["principal"], &logs).await
}

/// The checker itself, without chaos: an old value written again behind its back (as a replayed
/// stale event would) is reported as going back, on the hub where it was written and on the
/// spoke it reaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_reports_an_old_value_written_again() -> Result<()> {
    use kube::api::{Patch, PatchParams};
    use tests::consistency::{Field, Outcome};
    const WAIT: Duration = Duration::from_secs(45);
    let t = Topology::start(&[("cx", Mode::Managed)]).await?;
    let checker = Arc::new(Checker::new());
    let g = Group::new("cx", Mode::Managed, t.hub(), t.spoke("cx")?, ARGOCD_NS, 1);
    let watchers: Vec<_> = [Side::Hub, Side::Spoke]
        .into_iter()
        .map(|side| tokio::spawn(watch_side(checker.clone(), "cx", side, g.api(side).clone())))
        .collect();
    let (_stop_handle, stop) = StopHandle::new();
    Writer::new(checker.clone(), g.clone(), Rng::new(1), stop).populate().await?;
    let app = checker.pick_live("cx", &mut Rng::new(1)).context("the populated app")?;
    let set_path = |path: &'static str| {
        let patch = Patch::Merge(serde_json::json!({"spec": {"source": {"path": path}}}));
        let (hub, app) = (g.hub.clone(), app.clone());
        async move { hub.patch(&app, &PatchParams::default(), &patch).await }
    };
    for value in ["w-old", "w-new"] {
        let id = checker.begin_write(&app, Field::Path, value)?;
        set_path(value).await?;
        checker.finish(&id, Outcome::Acked(Instant::now()));
    }
    let r = wait_until_async(WAIT, "both sides to see w-new", || async {
        [Side::Hub, Side::Spoke].iter().all(|s| checker.last_seen(&app, *s, Field::Path).as_deref() == Some("w-new"))
    })
    .await;
    r.with_context(|| t.logs())?;
    assert!(checker.violations().is_empty(), "{:?}", checker.violations());
    assert!(checker.report().blind_spots().is_empty(), "{}", checker.report());

    set_path("w-old").await?;
    let r = wait_until_async(WAIT, "the checker to report the old value on both sides", || async {
        let v = checker.violations();
        [Side::Hub, Side::Spoke].iter().all(|s| v.iter().any(|v| v.side == *s && v.what.contains("went back")))
    })
    .await;
    r.with_context(|| format!("{:?}\n{}", checker.violations(), checker.describe(&app)))?;
    for w in watchers {
        w.abort();
    }
    Ok(())
}

/// The checker itself: a run whose watches saw nothing fails, though the workload's writes were
/// acknowledged and both sides converged. The hub's watch looks at a namespace nobody writes to,
/// the spoke's at an address where every connection is closed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_fails_when_its_watches_see_nothing() -> Result<()> {
    use tests::fixtures::application_resource;
    const WAIT: Duration = Duration::from_secs(60);
    let t = Topology::start(&[("cn", Mode::Managed)]).await?;
    let checker = Arc::new(Checker::new());
    let g = Group::new("cn", Mode::Managed, t.hub(), t.spoke("cn")?, ARGOCD_NS, 3);

    let empty = Api::namespaced_with(t.hub(), "nobody-writes-here", &application_resource());
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
    let closed = listener.local_addr()?;
    let closer = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            drop(conn);
        }
    });
    let client = kube::Client::try_from(kube::Config::new(format!("http://{closed}").parse()?))?;
    let unreachable = Api::namespaced_with(client, ARGOCD_NS, &application_resource());
    let watchers = [
        tokio::spawn(watch_side(checker.clone(), "cn", Side::Hub, empty)),
        tokio::spawn(watch_side(checker.clone(), "cn", Side::Spoke, unreachable)),
    ];

    let (_stop_handle, stop) = StopHandle::new();
    Writer::new(checker.clone(), g.clone(), Rng::new(1), stop).populate().await?;
    wait_converged(std::slice::from_ref(&g), WAIT).await.with_context(|| t.logs())?;
    let r = wait_until_async(WAIT, "the spoke's watch to report an error", || async {
        checker.report().watches.get("cn spoke").is_some_and(|w| w.errors > 0)
    })
    .await;
    r.with_context(|| checker.report().to_string())?;
    for w in &watchers {
        w.abort();
    }
    closer.abort();

    let report = checker.report();
    let blind = report.blind_spots().join("\n");
    for expected in [
        "the watch cn hub delivered no event about its Applications",
        "the watch cn spoke delivered no event about its Applications (",
        "managed spec hub→spoke: none of 3 acked writes was seen by the owner side's watch",
        "managed spec hub→spoke: none of 3 acked writes was seen by the receiving side's watch",
    ] {
        assert!(blind.contains(expected), "blind spots lack {expected:?}:\n{blind}\n{report}");
    }
    let spoke = report.blind_spots().into_iter().find(|b| b.contains("watch cn spoke")).unwrap_or_default();
    assert!(spoke.contains(" errors, first: "), "the spoke watch's errors are not reported: {spoke:?}");
    Ok(())
}
