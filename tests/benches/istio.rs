//! The principal and one managed agent behind Istio-programmed sidecars (`tests::istio::IstioMesh`:
//! istiod, its certificates, its XDS, our `istio/principal` manifests) beside the same principal
//! and agent talking native mTLS directly (`tests::topology::Topology`), in the same run. Both
//! have a real kube-apiserver hub and an embedded spoke, so only the path between the agent and
//! the principal differs:
//!
//! ```text
//! Istio:  agent ─h2c─► sidecar ══ Istio mTLS ══► sidecar ─h2c─► principal (--auth xfcc:)
//! direct: agent ═════════════ mTLS ═════════════════════════════► principal (--auth mtls:subject)
//! ```
//!
//! The workload is Application updates both ways on a pool of Applications:
//!
//! - down: a spec update written on the hub (`spec.source.targetRevision`), timed until the
//!   spoke's watch shows it;
//! - up: a status update written on the spoke (`status.sync.revision`, as Argo CD there would),
//!   timed until the hub's watch shows it;
//! - latency, one at a time: p50/p99 of down, up and the round trip (down then up);
//! - throughput: `BENCH_ISTIO_THROUGHPUT` updates by 16 concurrent writers, until the last is on
//!   the other side, down and up separately.
//!
//! Both topologies run at once and the measures alternate between them in rounds, so load from
//! other processes falls on both.
//!
//! Run: `cargo build --release -p cli && cargo bench -p tests --bench istio` (sizes:
//! BENCH_ISTIO_LATENCY, BENCH_ISTIO_THROUGHPUT, BENCH_ISTIO_ROUNDS; `BENCH_QUICK=1` for a smoke
//! run: 5 and 10 updates, under a minute in a debug build, nearly all of it setup). The default
//! run (400 one at a time, 2,000 each way in batches of 500) measures for about 40 s after a
//! 20 s setup. Needs `scripts/install-test-deps` (istiod, pilot-agent, Envoy, kube-apiserver).
//! Figures are printed, never asserted.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tests::bench::{AGENT, Seen, app_json, env, percentile, watch_values};
use tests::fixtures::{application_resource, dynamic};
use tests::istio::IstioMesh;
use tests::topology::{ARGOCD_NS, ClusterKind, Clusters, Mode, Topology};

type Res<T> = anyhow::Result<T>;

/// Updates in flight in a throughput batch.
const WRITERS: usize = 16;

fn target_revision(o: &DynamicObject) -> Option<String> {
    o.data["spec"]["source"]["targetRevision"].as_str().map(str::to_string)
}

fn status_revision(o: &DynamicObject) -> Option<String> {
    o.data["status"]["sync"]["revision"].as_str().map(str::to_string)
}

fn spec_patch(value: &str) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"spec": {"source": {"targetRevision": value}}}))
}

fn status_patch(value: &str) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"status": {"sync": {"status": "Synced", "revision": value}}}))
}

/// The topology under one side of the comparison.
enum Net {
    Istio(Box<IstioMesh>),
    Direct(Box<Topology>),
}

impl Net {
    fn hub(&self) -> kube::Client {
        match self {
            Self::Istio(m) => m.hub(),
            Self::Direct(t) => t.hub(),
        }
    }

    fn spoke(&self) -> Res<kube::Client> {
        match self {
            Self::Istio(m) => m.spoke(AGENT),
            Self::Direct(t) => t.spoke(AGENT),
        }
    }

    fn logs(&self) -> String {
        match self {
            Self::Istio(m) => m.logs(),
            Self::Direct(t) => t.logs(),
        }
    }
}

/// One side: its topology, a pool of Applications, watches on both ends, and its figures.
struct Side {
    net: Net,
    hub: Api<DynamicObject>,
    spoke: Api<DynamicObject>,
    /// (name, spec.source.targetRevision) on the spoke.
    down_seen: Seen,
    /// (name, status.sync.revision) on the hub.
    up_seen: Seen,
    watches: Vec<tokio::task::JoinHandle<()>>,
    pool: Vec<String>,
    /// Updates written so far (values are unique per side).
    written: usize,
    down: Vec<Duration>,
    up: Vec<Duration>,
    round_trip: Vec<Duration>,
    down_busy: Duration,
    down_n: usize,
    up_busy: Duration,
    up_n: usize,
}

impl Drop for Side {
    fn drop(&mut self) {
        for w in &self.watches {
            w.abort();
        }
    }
}

impl Side {
    /// Watch both ends and create `pool` Applications on the hub (16 at a time), waiting until
    /// all are on the spoke: the agent's first connection and the creates are not measured.
    async fn start(net: Net, pool: usize) -> Res<Self> {
        let hub = Api::namespaced_with(net.hub(), AGENT, &application_resource());
        let spoke = Api::namespaced_with(net.spoke()?, ARGOCD_NS, &application_resource());
        let (down_seen, down_watch) = watch_values(spoke.clone(), target_revision);
        let (up_seen, up_watch) = watch_values(hub.clone(), status_revision);
        let pool: Vec<String> = (0..pool.max(1)).map(|i| format!("app-{i}")).collect();
        let side = Self {
            net,
            hub,
            spoke,
            down_seen,
            up_seen,
            watches: vec![down_watch, up_watch],
            pool,
            written: 0,
            down: vec![],
            up: vec![],
            round_trip: vec![],
            down_busy: Duration::ZERO,
            down_n: 0,
            up_busy: Duration::ZERO,
            up_n: 0,
        };
        let hub = &side.hub;
        futures::stream::iter(&side.pool)
            .map(|name| async move {
                let mut app = app_json(name, AGENT);
                app["spec"]["source"]["targetRevision"] = json!("created");
                hub.create(&PostParams::default(), &dynamic(app)?).await?;
                Res::Ok(())
            })
            .buffer_unordered(WRITERS)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Res<Vec<()>>>()?;
        for name in &side.pool {
            side.wait(&side.down_seen, name, "created", Duration::from_secs(300)).await?;
        }
        Ok(side)
    }

    fn next_value(&mut self) -> String {
        self.written += 1;
        format!("v{}", self.written)
    }

    async fn wait(&self, seen: &Seen, name: &str, value: &str, within: Duration) -> Res<Instant> {
        let key = (name.to_string(), value.to_string());
        let deadline = Instant::now() + within;
        loop {
            if let Some(t) = seen.lock().map_err(|_| anyhow::anyhow!("lock"))?.get(&key).copied() {
                return Ok(t);
            }
            if Instant::now() >= deadline {
                anyhow::bail!("{name}={value} did not arrive in time\n{}", self.net.logs());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// `n` updates one at a time: spec down, then status up, into the latencies.
    async fn latency(&mut self, n: usize) -> Res<()> {
        for i in 0..n {
            let name = self.pool[i % self.pool.len()].clone();
            let value = self.next_value();
            let sent = Instant::now();
            self.hub.patch(&name, &PatchParams::default(), &spec_patch(&value)).await?;
            let down = self.wait(&self.down_seen, &name, &value, Duration::from_secs(60)).await?;
            let status_sent = Instant::now();
            self.spoke.patch(&name, &PatchParams::default(), &status_patch(&value)).await?;
            let up = self.wait(&self.up_seen, &name, &value, Duration::from_secs(60)).await?;
            self.down.push(down.saturating_duration_since(sent));
            self.up.push(up.saturating_duration_since(status_sent));
            self.round_trip.push(up.saturating_duration_since(sent));
        }
        Ok(())
    }

    /// `n` updates on distinct Applications of the pool by [`WRITERS`] concurrent writers on
    /// `api`, until the last one is seen in `seen`; the time it took.
    async fn batch(&mut self, n: usize, down: bool) -> Res<Duration> {
        let names = self.pool[..n.min(self.pool.len())].to_vec();
        let updates: Vec<(String, String)> = names.into_iter().map(|p| (p, self.next_value())).collect();
        let (api, seen) = if down { (&self.hub, &self.down_seen) } else { (&self.spoke, &self.up_seen) };
        let start = Instant::now();
        futures::stream::iter(&updates)
            .map(|(name, value)| async move {
                let patch = if down { spec_patch(value) } else { status_patch(value) };
                api.patch(name, &PatchParams::default(), &patch).await
            })
            .buffer_unordered(WRITERS)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let mut last = start;
        for (name, value) in &updates {
            last = last.max(self.wait(seen, name, value, Duration::from_secs(300)).await?);
        }
        Ok(last.duration_since(start))
    }

    /// `n` spec updates down, then `n` status updates up, each batch timed to its last arrival.
    async fn throughput(&mut self, n: usize) -> Res<()> {
        let n = n.min(self.pool.len());
        if n == 0 {
            return Ok(());
        }
        let down = self.batch(n, true).await?;
        self.down_busy += down;
        self.down_n += n;
        let up = self.batch(n, false).await?;
        self.up_busy += up;
        self.up_n += n;
        Ok(())
    }

    fn down_rate(&self) -> f64 {
        self.down_n as f64 / self.down_busy.as_secs_f64().max(1e-9)
    }

    fn up_rate(&self) -> f64 {
        self.up_n as f64 / self.up_busy.as_secs_f64().max(1e-9)
    }

    fn sort(&mut self) {
        self.down.sort();
        self.up.sort();
        self.round_trip.sort();
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn secs(sorted: &[Duration], p: f64) -> f64 {
    percentile(sorted, p).as_secs_f64().max(1e-9)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let latency_n = env("BENCH_ISTIO_LATENCY", if quick { 5 } else { 400 });
    let throughput_n = env("BENCH_ISTIO_THROUGHPUT", if quick { 10 } else { 2000 });
    let rounds = env("BENCH_ISTIO_ROUNDS", if quick { 2 } else { 4 }).clamp(1, latency_n.max(throughput_n).max(1));
    let share = |n: usize, round: usize| n / rounds + usize::from(round < n % rounds);
    // Every Application of a throughput batch is distinct (a second update of one could
    // overtake the first, which would then never be seen).
    let pool = share(throughput_n, 0).max(1);

    println!(
        "Istio-programmed sidecars vs direct mTLS, principal + 1 managed agent, real kube-apiserver hub ({} cores)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let setup = Instant::now();
    let agents = [(AGENT, Mode::Managed)];
    let mut istio = Side::start(Net::Istio(Box::new(IstioMesh::start(&agents).await?)), pool).await?;
    let clusters = Clusters { hub: ClusterKind::Real, spokes: ClusterKind::Embedded };
    let mut direct =
        Side::start(Net::Direct(Box::new(Topology::start_on(&agents, clusters, true).await?)), pool).await?;
    println!(
        "setup (istiod, 2 kube-apiservers, sidecars, {pool} Applications each side): {:.1} s",
        setup.elapsed().as_secs_f64()
    );

    let measured = Instant::now();
    for round in 0..rounds {
        let (first, second) = if round % 2 == 0 { (&mut istio, &mut direct) } else { (&mut direct, &mut istio) };
        first.latency(share(latency_n, round)).await?;
        second.latency(share(latency_n, round)).await?;
        first.throughput(share(throughput_n, round)).await?;
        second.throughput(share(throughput_n, round)).await?;
    }
    istio.sort();
    direct.sort();

    println!("same run, interleaved in {rounds} rounds ({:.1} s measured):", measured.elapsed().as_secs_f64());
    println!(
        "latency, one update at a time ({latency_n}):       direct mTLS p50 / p99        Istio p50 / p99        Istio/direct p50  p99"
    );
    for (what, d, i) in [
        ("  down: hub spec -> spoke        ", &direct.down, &istio.down),
        ("  up: spoke status -> hub        ", &direct.up, &istio.up),
        ("  round trip (down, then up)     ", &direct.round_trip, &istio.round_trip),
    ] {
        println!(
            "{what}  {:>10} / {:>10}   {:>10} / {:>10}   {:>6.2}x {:>6.2}x",
            ms(percentile(d, 0.5)),
            ms(percentile(d, 0.99)),
            ms(percentile(i, 0.5)),
            ms(percentile(i, 0.99)),
            secs(i, 0.5) / secs(d, 0.5),
            secs(i, 0.99) / secs(d, 0.99)
        );
    }
    println!(
        "throughput, {WRITERS} writers ({throughput_n} updates each way):   direct mTLS           Istio   Istio/direct"
    );
    for (what, d, i) in [
        ("  down: hub spec -> spoke     ", direct.down_rate(), istio.down_rate()),
        ("  up: spoke status -> hub     ", direct.up_rate(), istio.up_rate()),
    ] {
        println!("{what}     {d:>9.0} events/s   {i:>9.0} events/s   {:>6.2}x", i / d.max(1e-9));
    }
    drop((istio, direct));
    Ok(())
}
