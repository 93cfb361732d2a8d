//! The principal and one managed agent on real kube-apiservers (etcd + kube-apiserver built from
//! Kubernetes' Go modules, Argo CD v3.5.1's CRDs, the processes bound to `install/rbac/`)
//! beside the same on embedded API servers, each beside its own API server's rates measured in
//! the same run:
//!
//! - latency, one at a time: hub create to spoke arrival (p50/p99), beside the hub API server's
//!   own create to watch-event latency, and beside the floor of any relay: the same two hops
//!   chained by the bench itself (a create on the hub, its watch event, then a create on the
//!   spoke and its watch event), with nothing in between;
//! - status throughput: the spoke's Argo CD (played by this bench, `BENCH_REALKUBE_WRITERS` in
//!   flight) writes status on `BENCH_REALKUBE_APPS` Applications; status updates/s until the hub
//!   has them all, beside the hub API server's own status-patch rate at the same concurrency,
//!   and beside the same through a principal that applies the agent's events one at a time
//!   (`--agent-event-concurrency 1`, as upstream and this principal before; a fresh topology
//!   on the same kind of API server);
//! - hub to spoke throughput, from each status round's set-up: `BENCH_REALKUBE_APPS` creates by
//!   `BENCH_REALKUBE_WRITERS` hub writers until the last is on the spoke, beside the spoke API
//!   server's own create rate at the same concurrency;
//! - the ratio real/embedded of each.
//!
//! Run: `cargo build --release -p cli && cargo bench -p tests --bench realkube` (sizes:
//! BENCH_REALKUBE_LATENCY, BENCH_REALKUBE_APPS, BENCH_REALKUBE_WRITERS). Figures are printed,
//! never asserted.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use futures::stream::BoxStream;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use tests::bench::{AGENT, Seen, Side, app_json, cpu_time, env, machine_busy, percentile, watch_values};
use tests::fixtures::{application_resource, dynamic};
use tests::topology::{ARGOCD_NS, ClusterKind, Clusters, Mode, StartOptions, Topology};

type Res<T> = anyhow::Result<T>;

/// The spoke namespace of the Applications the ceiling writes straight to.
const CEILING_NS: &str = "bench-ceiling";

/// The namespace, on the hub and on the spoke, of the latency baselines' Applications.
const BASE_NS: &str = "bench-baseline";

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

async fn wait_seen(seen: &Seen, key: &(String, String), deadline: Instant) -> Res<Instant> {
    loop {
        if let Some(t) = seen.lock().map_err(|_| anyhow::anyhow!("lock"))?.get(key).copied() {
            return Ok(t);
        }
        anyhow::ensure!(Instant::now() < deadline, "{key:?} was not seen in time");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Creates Application `name` through `api`.
async fn create(api: &Api<DynamicObject>, name: &str) -> Res<()> {
    api.create(&PostParams::default(), &dynamic(app_json(name, BASE_NS))?).await?;
    Ok(())
}

type Applied = BoxStream<'static, Result<DynamicObject, watcher::Error>>;

/// [`BASE_NS`] on `client`'s API server, and its Applications as its watch delivers them, acted
/// on as they arrive (as the principal and the agent do; polling what a watch task recorded would
/// add its poll interval). A first object, created and seen here, has the watch running when this
/// returns.
async fn baseline_ns(client: kube::Client) -> Res<(Api<DynamicObject>, Applied)> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces.create(&PostParams::default(), &dynamic_ns(BASE_NS)?).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client, BASE_NS, &application_resource());
    let mut events = watcher(api.clone(), watcher::Config::default()).applied_objects().boxed();
    create(&api, "watch-start").await?;
    next_named(&mut events, "watch-start").await?;
    Ok((api, events))
}

/// Waits (60 s at most) for `events` to show the object `name`.
async fn next_named(events: &mut Applied, name: &str) -> Res<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(Ok(o))) if o.metadata.name.as_deref() == Some(name) => return Ok(()),
            Ok(Some(_)) => {}
            Ok(None) => anyhow::bail!("the watch ended before {name} was seen"),
            Err(_) => anyhow::bail!("{name} was not seen in time"),
        }
    }
}

fn revision(o: &DynamicObject) -> Option<String> {
    o.data["status"]["sync"]["revision"].as_str().map(str::to_string)
}

/// The figures of one kind of API server.
struct Figures {
    e2e: Vec<Duration>,
    hub_watch: Vec<Duration>,
    /// Hub create to the spoke's watch event of a create the bench made on seeing the hub's.
    chained: Vec<Duration>,
    status: Status,
    /// The same through a principal applying one event at a time.
    one_at_a_time: Status,
}

/// One status throughput measurement ([`status_throughput`]).
struct Status {
    /// Updates/s from the spoke's writes until the hub has them all.
    rate: f64,
    /// The hub API server's own status patches/s at the same concurrency.
    hub_rate: f64,
    /// The same patches written straight to the spoke and the hub at once, `writers` in flight
    /// each: what both API servers manage together on the machine's cores, per update.
    ceiling: f64,
    /// Share of the machine's cores busy during each of the two.
    busy: f64,
    hub_busy: f64,
    /// CPU per update of the principal and of the agent.
    principal: Duration,
    agent: Duration,
    /// How the principal wrote the statuses ([`STATUS_PATHS`]), counted over the round.
    paths: [f64; 4],
    /// Applications/s created on the hub by `writers` until the last is on the spoke (the
    /// round's set-up), and the spoke API server's own create rate at the same concurrency.
    down: f64,
    spoke_creates: f64,
}

/// The `path` values of `argocd_principal_status_writes_total`.
const STATUS_PATHS: [&str; 4] = ["patched", "refused", "no_base", "unchanged"];

/// The principal's count of status writes by each of [`STATUS_PATHS`].
async fn status_paths(side: &Side) -> Res<[f64; 4]> {
    let addr = side.topology.principal_metrics_addr().ok_or_else(|| anyhow::anyhow!("no principal metrics address"))?;
    let (code, text) = tests::http::get(addr, "/metrics").await?;
    anyhow::ensure!(code == 200, "/metrics answered {code}");
    Ok(STATUS_PATHS.map(|p| {
        tests::http::sample(&text, "argocd_principal_status_writes_total", &format!("path=\"{p}\"")).unwrap_or(0.0)
    }))
}

fn status_patch(value: &str) -> Patch<serde_json::Value> {
    Patch::Merge(serde_json::json!({"status": {"sync": {"status": "Synced", "revision": value}}}))
}

/// The principal and one managed agent on API servers of `kind`, the principal started with
/// `principal_args`.
async fn start(kind: ClusterKind, principal_args: &[&str]) -> Res<Side> {
    let clusters = Clusters { hub: kind, spokes: kind };
    let options = StartOptions {
        clusters,
        start_agents: true,
        principal_args: principal_args.iter().map(|a| (*a).to_owned()).collect(),
        ..StartOptions::default()
    };
    Side::start(Topology::start_with_options(&[(AGENT, Mode::Managed)], options).await?).await
}

async fn measure(kind: ClusterKind, latency_n: usize, apps: usize, writers: usize) -> Res<Figures> {
    let mut side = start(kind, &[]).await?;

    // Baselines, in a namespace the principal and the agent do not watch: the hub API server's
    // own create -> watch event, and the two hops chained (the hub's watch event, then a create
    // on the spoke and its watch event).
    let (hub, mut hub_events) = baseline_ns(side.topology.hub()).await?;
    let (spoke, mut spoke_events) = baseline_ns(side.topology.spoke(AGENT)?).await?;
    let mut hub_watch = Vec::with_capacity(latency_n);
    let mut chained = Vec::with_capacity(latency_n);
    // End to end and the baselines alternate, so load from elsewhere falls on all three.
    for i in 0..latency_n {
        side.latency(1).await?;
        let (name, sent) = (format!("base-{i}"), Instant::now());
        create(&hub, &name).await?;
        next_named(&mut hub_events, &name).await?;
        hub_watch.push(sent.elapsed());
        let (name, sent) = (format!("chain-{i}"), Instant::now());
        create(&hub, &name).await?;
        next_named(&mut hub_events, &name).await?;
        create(&spoke, &name).await?;
        next_named(&mut spoke_events, &name).await?;
        chained.push(sent.elapsed());
    }
    drop((hub_events, spoke_events));

    let status = status_throughput(&mut side, apps, writers).await?;
    let mut e2e = std::mem::take(&mut side.latencies);
    e2e.sort();
    hub_watch.sort();
    chained.sort();
    drop(side);

    // The same-run comparison: a fresh principal, hub and spoke of the same kind, the principal
    // applying the agent's events one at a time.
    let mut one = start(kind, &["--agent-event-concurrency", "1"]).await?;
    let one_at_a_time = status_throughput(&mut one, apps, writers).await?;
    drop(one);
    Ok(Figures { e2e, hub_watch, chained, status, one_at_a_time })
}

/// `apps` Applications on the spoke, statuses written there with `writers` in flight: the rate
/// at which they land on the hub; then the hub API server's own rate of the same status
/// patches at the same concurrency; with the machine's busy share and the principal's and the
/// agent's CPU per update.
async fn status_throughput(side: &mut Side, apps: usize, writers: usize) -> Res<Status> {
    let hub: Api<DynamicObject> = Api::namespaced_with(side.topology.hub(), AGENT, &application_resource());
    let spoke: Api<DynamicObject> =
        Api::namespaced_with(side.topology.spoke(AGENT)?, ARGOCD_NS, &application_resource());
    side.throughput(apps).await?;
    let down = side.rate();
    let names: Vec<String> =
        spoke.list(&Default::default()).await?.items.into_iter().filter_map(|o| o.metadata.name).take(apps).collect();
    let (hub_seen, hub_watch_task) = watch_values(hub.clone(), revision);
    let principal_pid = side.topology.principal_pid().ok_or_else(|| anyhow::anyhow!("no principal"))?;
    let agent_pid = side.topology.agent_pid(AGENT).ok_or_else(|| anyhow::anyhow!("no agent"))?;
    let cpu = || -> Res<[Duration; 3]> { Ok([machine_busy()?, cpu_time(principal_pid)?, cpu_time(agent_pid)?]) };
    let paths_before = status_paths(side).await?;
    let before = cpu()?;
    let start = Instant::now();
    patch_all(&spoke, &names, writers, "e2e").await?;
    let deadline = start + Duration::from_secs(300);
    let mut last = start;
    for name in &names {
        last = last.max(wait_seen(&hub_seen, &(name.clone(), format!("e2e-{name}")), deadline).await?);
    }
    let after = cpu()?;
    let paths_after = status_paths(side).await?;
    let wall = last.duration_since(start).as_secs_f64().max(1e-9);
    hub_watch_task.abort();
    let rate = names.len() as f64 / wall;
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f64;
    let per_update = |i: usize| (after[i] - before[i]) / u32::try_from(names.len().max(1)).unwrap_or(u32::MAX);

    // Baseline: the hub API server's own rate of the same status patches, same concurrency.
    let hub_before = machine_busy()?;
    let start = Instant::now();
    patch_all(&hub, &names, writers, "base").await?;
    let hub_wall = start.elapsed().as_secs_f64().max(1e-9);
    let hub_busy = (machine_busy()? - hub_before).as_secs_f64() / hub_wall / cores;

    // The ceiling on one machine: every update through the agent costs a write on the spoke's
    // API server and one on the hub's, on the same cores. The same patches written straight to
    // both at once, the spoke's on copies in a namespace the agent does not watch.
    let spoke_client = side.topology.spoke(AGENT)?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(spoke_client.clone());
    namespaces.create(&PostParams::default(), &dynamic_ns(CEILING_NS)?).await?;
    let aside: Api<DynamicObject> = Api::namespaced_with(spoke_client, CEILING_NS, &application_resource());
    let creates = Instant::now();
    futures::stream::iter(&names)
        .map(|name| {
            let aside = aside.clone();
            async move {
                aside
                    .create(&PostParams::default(), &dynamic(app_json(name, CEILING_NS))?)
                    .await
                    .map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(writers)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Res<Vec<_>>>()?;
    let spoke_creates = names.len() as f64 / creates.elapsed().as_secs_f64().max(1e-9);
    let start = Instant::now();
    let (spoke_done, hub_done) =
        tokio::join!(patch_all(&aside, &names, writers, "ceiling"), patch_all(&hub, &names, writers, "ceiling"));
    spoke_done?;
    hub_done?;
    let ceiling = names.len() as f64 / start.elapsed().as_secs_f64().max(1e-9);
    Ok(Status {
        ceiling,
        rate,
        hub_rate: names.len() as f64 / hub_wall,
        busy: (after[0] - before[0]).as_secs_f64() / wall / cores,
        hub_busy,
        principal: per_update(1),
        agent: per_update(2),
        paths: std::array::from_fn(|i| paths_after[i] - paths_before[i]),
        down,
        spoke_creates,
    })
}

/// Status patches on every one of `names` through `api`, `writers` in flight, each naming
/// `{tag}-{name}` as its revision.
async fn patch_all(api: &Api<DynamicObject>, names: &[String], writers: usize, tag: &str) -> Res<()> {
    futures::stream::iter(names)
        .map(|name| async move { api.patch(name, &PatchParams::default(), &status_patch(&format!("{tag}-{name}"))).await })
        .buffer_unordered(writers)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    Ok(())
}

fn dynamic_ns(name: &str) -> Res<k8s_openapi::api::core::v1::Namespace> {
    Ok(serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?)
}

fn p50(sorted: &[Duration]) -> f64 {
    percentile(sorted, 0.5).as_secs_f64().max(1e-9)
}

fn p99(sorted: &[Duration]) -> f64 {
    percentile(sorted, 0.99).as_secs_f64().max(1e-9)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let latency_n = env("BENCH_REALKUBE_LATENCY", if quick { 5 } else { 200 });
    let apps = env("BENCH_REALKUBE_APPS", if quick { 10 } else { 500 });
    let writers = env("BENCH_REALKUBE_WRITERS", 16);

    println!(
        "real kube-apiserver vs embedded API server, principal + 1 managed agent ({} cores)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let real = measure(ClusterKind::Real, latency_n, apps, writers).await?;
    let embedded = measure(ClusterKind::Embedded, latency_n, apps, writers).await?;
    for (name, f) in [("real kube-apiserver v1.37", &real), ("embedded API server", &embedded)] {
        println!("{name}:");
        println!(
            "  hub create -> spoke arrival, one at a time ({latency_n})  p50 {:>10}  p99 {:>10}   baseline hub create -> hub watch p50 {:>10}  p99 {:>10}  ({:.1}x at p50)",
            ms(percentile(&f.e2e, 0.5)),
            ms(percentile(&f.e2e, 0.99)),
            ms(percentile(&f.hub_watch, 0.5)),
            ms(percentile(&f.hub_watch, 0.99)),
            p50(&f.e2e) / p50(&f.hub_watch)
        );
        println!(
            "    the two hops chained by the bench (hub create, its watch event, spoke create, its watch event)  p50 {:>10}  p99 {:>10}",
            ms(percentile(&f.chained, 0.5)),
            ms(percentile(&f.chained, 0.99)),
        );
        println!(
            "    end to end / hub create -> hub watch  p50 {:.2}x  p99 {:.2}x;  end to end / the two hops chained  p50 {:.2}x  p99 {:.2}x",
            p50(&f.e2e) / p50(&f.hub_watch),
            p99(&f.e2e) / p99(&f.hub_watch),
            p50(&f.e2e) / p50(&f.chained),
            p99(&f.e2e) / p99(&f.chained),
        );
        for (label, st) in [
            ("", &f.status),
            (", principal applying one event at a time (--agent-event-concurrency 1)", &f.one_at_a_time),
        ] {
            println!(
                "  status spoke -> hub{label}, {apps} Applications, {writers} in flight   {:>8.0} updates/s   baseline hub status patches {:>8.0} writes/s  ({:.2}x)",
                st.rate,
                st.hub_rate,
                st.rate / st.hub_rate.max(1e-9)
            );
            println!(
                "    ceiling: the same patches straight to the spoke and the hub at once {:>8.0} updates/s  (end to end {:.2}x of it)",
                st.ceiling,
                st.rate / st.ceiling.max(1e-9)
            );
            println!(
                "    machine busy {:.0} % of its cores (hub alone {:.0} %); CPU per update: principal {:.0} µs, agent {:.0} µs",
                st.busy * 100.0,
                st.hub_busy * 100.0,
                st.principal.as_secs_f64() * 1e6,
                st.agent.as_secs_f64() * 1e6
            );
            let paths: Vec<String> = STATUS_PATHS.iter().zip(st.paths).map(|(p, n)| format!("{p} {n:.0}")).collect();
            println!("    the principal's status writes: {}", paths.join(", "));
            println!(
                "    set-up, hub -> spoke: {apps} creates by {writers} hub writers {:>8.0} Applications/s   baseline spoke creates, {writers} in flight {:>8.0}/s  ({:.2}x)",
                st.down,
                st.spoke_creates,
                st.down / st.spoke_creates.max(1e-9)
            );
        }
        println!("  concurrent / one at a time {:.2}x", f.status.rate / f.one_at_a_time.rate.max(1e-9));
    }
    println!("real / embedded:");
    println!(
        "  latency p50 {:.2}x  p99 {:.2}x   status throughput {:.2}x   API server write rate {:.2}x",
        p50(&real.e2e) / p50(&embedded.e2e),
        p99(&real.e2e) / p99(&embedded.e2e),
        real.status.rate / embedded.status.rate.max(1e-9),
        real.status.hub_rate / embedded.status.hub_rate.max(1e-9)
    );
    Ok(())
}
