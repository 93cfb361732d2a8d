//! What the end-to-end benchmarks (`benches/sync.rs`, `benches/observability.rs`) share: sizes
//! from the environment, percentiles, the benchmark Application, and [`Side`], one topology with
//! a watch on its spoke timing each Application's arrival.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kube::api::{Api, DynamicObject, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::fixtures::{application_resource, dynamic};
use crate::topology::{ARGOCD_NS, Topology};

type Res<T> = anyhow::Result<T>;

/// The agent every [`Side`] measures through (managed, one per topology).
pub const AGENT: &str = "bench";

/// When each (name, value) was first seen by a watch, for a field [`watch_values`] reads.
pub type Seen = Arc<Mutex<HashMap<(String, String), Instant>>>;

/// Watches `api` and records when each object first showed each value of `read` (the clock
/// of the benchmarks that time a change from one cluster to another).
#[must_use]
pub fn watch_values(
    api: Api<DynamicObject>,
    read: fn(&DynamicObject) -> Option<String>,
) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let task = tokio::spawn(async move {
        let mut w = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = w.next().await {
            if let Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = ev
                && let (Some(name), Some(value), Ok(mut m)) = (o.metadata.name.clone(), read(&o), s.lock())
            {
                m.entry((name, value)).or_insert_with(Instant::now);
            }
        }
    });
    (seen, task)
}

/// `name` from the environment as a number, else `default`.
#[must_use]
pub fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The `p` (0.0-1.0) percentile of `sorted`; zero when empty.
#[must_use]
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

/// The benchmark's Application `name` in namespace `ns`.
#[must_use]
pub fn app_json(name: &str, ns: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": ns, "labels": {"team": "bench"}},
        "spec": {
            "project": "default",
            "source": {"repoURL": "https://github.com/argoproj/argocd-example-apps.git", "path": "guestbook", "targetRevision": "HEAD"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": name},
            "syncPolicy": {"automated": {"prune": true, "selfHeal": true}},
        },
    })
}

/// One topology (with agent [`AGENT`]) and a watch on its spoke recording when each Application
/// arrives. Dropping it stops the watch and every process.
pub struct Side {
    pub topology: Topology,
    hub: Api<DynamicObject>,
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    watch: tokio::task::JoinHandle<()>,
    /// Applications created so far (names are unique per side).
    created: usize,
    /// Hub create to spoke arrival of each Application sent one at a time ([`Self::latency`]).
    pub latencies: Vec<Duration>,
    /// Time spent in throughput batches, and events delivered in them.
    pub busy: Duration,
    pub delivered: usize,
}

impl std::fmt::Debug for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side").field("topology", &self.topology).field("created", &self.created).finish_non_exhaustive()
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Side {
    /// Watch the spoke of [`AGENT`] and send one Application through (the agent connects in
    /// the background), so its first connection is not measured.
    ///
    /// # Errors
    /// No agent [`AGENT`], or the first Application does not arrive within 120 s.
    pub async fn start(topology: Topology) -> Res<Self> {
        let hub: Api<DynamicObject> = Api::namespaced_with(topology.hub(), AGENT, &application_resource());
        let spoke: Api<DynamicObject> =
            Api::namespaced_with(topology.spoke(AGENT)?, ARGOCD_NS, &application_resource());
        let (seen, watch) = spoke_arrivals(spoke);
        let mut side =
            Self { topology, hub, seen, watch, created: 0, latencies: vec![], busy: Duration::ZERO, delivered: 0 };
        let name = side.next_name();
        side.create(&name).await?;
        side.arrival(&name, Duration::from_secs(120)).await?;
        Ok(side)
    }

    fn next_name(&mut self) -> String {
        self.created += 1;
        format!("app-{}", self.created)
    }

    async fn create(&self, name: &str) -> Res<()> {
        self.hub.create(&PostParams::default(), &dynamic(app_json(name, AGENT))?).await?;
        Ok(())
    }

    async fn arrival(&self, name: &str, within: Duration) -> Res<Instant> {
        wait_arrived(&self.seen, name, Instant::now() + within)
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.topology.logs()))
    }

    /// `n` Applications one at a time: hub create to spoke arrival, into [`Self::latencies`].
    ///
    /// # Errors
    /// A create fails, or an Application does not arrive within 60 s.
    pub async fn latency(&mut self, n: usize) -> Res<()> {
        for _ in 0..n {
            let name = self.next_name();
            let sent = Instant::now();
            self.create(&name).await?;
            let arrived = self.arrival(&name, Duration::from_secs(60)).await?;
            self.latencies.push(arrived.saturating_duration_since(sent));
        }
        Ok(())
    }

    /// `n` Applications by 16 concurrent hub writers, until the last one is on the spoke.
    ///
    /// # Errors
    /// A create fails, or an Application does not arrive within 300 s.
    pub async fn throughput(&mut self, n: usize) -> Res<()> {
        let names: Vec<String> = (0..n).map(|_| self.next_name()).collect();
        let start = Instant::now();
        futures::stream::iter(&names)
            .map(|name| self.create(name))
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Res<Vec<()>>>()?;
        let mut last = start;
        for name in &names {
            last = last.max(self.arrival(name, Duration::from_secs(300)).await?);
        }
        self.busy += last.duration_since(start);
        self.delivered += n;
        Ok(())
    }

    /// Events per second over the throughput batches.
    #[must_use]
    pub fn rate(&self) -> f64 {
        self.delivered as f64 / self.busy.as_secs_f64().max(1e-9)
    }
}

/// Arrival time on the spoke of each Application by name.
fn spoke_arrivals(spoke: Api<DynamicObject>) -> (Arc<Mutex<HashMap<String, Instant>>>, tokio::task::JoinHandle<()>) {
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let s = seen.clone();
    let task = tokio::spawn(async move {
        let mut w = watcher(spoke, watcher::Config::default()).boxed();
        while let Some(ev) = w.next().await {
            if let Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = ev
                && let (Some(name), Ok(mut m)) = (o.metadata.name, s.lock())
            {
                m.entry(name).or_insert_with(Instant::now);
            }
        }
    });
    (seen, task)
}

async fn wait_arrived(seen: &Arc<Mutex<HashMap<String, Instant>>>, name: &str, deadline: Instant) -> Res<Instant> {
    loop {
        if let Some(t) = seen.lock().map_err(|_| anyhow::anyhow!("lock"))?.get(name).copied() {
            return Ok(t);
        }
        anyhow::ensure!(Instant::now() < deadline, "{name} did not reach the spoke in time");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// CPU time (user + system) the process `pid` has used so far, from `/proc/<pid>/stat`.
///
/// # Errors
/// No such process, or the file does not parse.
pub fn cpu_time(pid: u32) -> Res<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces, in parentheses): state is field 3,
    // utime field 14, stime field 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat: {stat}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Res<u64> {
        fields.get(i - 3).and_then(|f| f.parse().ok()).ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat: {stat}"))
    };
    let total = ticks(14)? + ticks(15)?;
    Ok(Duration::from_secs_f64(total as f64 / clock_ticks_per_second() as f64))
}

/// CPU time the whole machine has spent busy so far (every core: user, nice, system, irq,
/// softirq, steal; not idle or iowait), from `/proc/stat`.
///
/// # Errors
/// The file does not parse.
pub fn machine_busy() -> Res<Duration> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat
        .lines()
        .next()
        .filter(|l| l.starts_with("cpu "))
        .ok_or_else(|| anyhow::anyhow!("/proc/stat: no cpu line"))?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>()?;
    anyhow::ensure!(fields.len() >= 8, "/proc/stat: {line}");
    // user nice system idle iowait irq softirq steal
    let busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7];
    Ok(Duration::from_secs_f64(busy as f64 / clock_ticks_per_second() as f64))
}

/// `getconf CLK_TCK` (100 on Linux unless it says otherwise).
fn clock_ticks_per_second() -> u64 {
    static TCK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|&t| t > 0)
            .unwrap_or(100)
    })
}
