//! The principal and one managed agent on real kube-apiservers (etcd + kube-apiserver built from
//! Kubernetes' Go modules, Argo CD v3.5.1's CRDs, the processes bound to `install/rbac/`)
//! beside the same on embedded API servers, each beside its own API server's rates measured in
//! the same run:
//!
//! - latency, one at a time: hub create to spoke arrival (p50/p99), beside the hub API server's
//!   own create to watch-event latency;
//! - status throughput: the spoke's Argo CD (played by this bench, `BENCH_REALKUBE_WRITERS` in
//!   flight) writes status on `BENCH_REALKUBE_APPS` Applications; status updates/s until the hub
//!   has them all, beside the hub API server's own status-patch rate at the same concurrency;
//! - the ratio real/embedded of each.
//!
//! Run: `cargo build --release -p cli && cargo bench -p tests --bench realkube` (sizes:
//! BENCH_REALKUBE_LATENCY, BENCH_REALKUBE_APPS, BENCH_REALKUBE_WRITERS). Figures are printed,
//! never asserted.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use tests::bench::{AGENT, Seen, Side, app_json, env, percentile, watch_values};
use tests::fixtures::{application_resource, dynamic};
use tests::topology::{ARGOCD_NS, ClusterKind, Clusters, Mode, Topology};

type Res<T> = anyhow::Result<T>;

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

fn revision(o: &DynamicObject) -> Option<String> {
    o.data["status"]["sync"]["revision"].as_str().map(str::to_string)
}

fn label(o: &DynamicObject) -> Option<String> {
    o.metadata.labels.as_ref()?.get("bench-round").cloned()
}

/// The figures of one kind of API server.
struct Figures {
    e2e: Vec<Duration>,
    hub_watch: Vec<Duration>,
    status_rate: f64,
    hub_rate: f64,
}

fn status_patch(value: &str) -> Patch<serde_json::Value> {
    Patch::Merge(serde_json::json!({"status": {"sync": {"status": "Synced", "revision": value}}}))
}

async fn measure(kind: ClusterKind, latency_n: usize, apps: usize, writers: usize) -> Res<Figures> {
    let clusters = Clusters { hub: kind, spokes: kind };
    let topology = Topology::start_on(&[(AGENT, Mode::Managed)], clusters, true).await?;
    let mut side = Side::start(topology).await?;
    let hub: Api<DynamicObject> = Api::namespaced_with(side.topology.hub(), AGENT, &application_resource());
    let spoke: Api<DynamicObject> =
        Api::namespaced_with(side.topology.spoke(AGENT)?, ARGOCD_NS, &application_resource());

    // Baseline latency: the hub API server's own create -> watch event, on another namespace.
    let base_ns = "bench-baseline";
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(side.topology.hub());
    namespaces.create(&PostParams::default(), &dynamic_ns(base_ns)?).await?;
    let base: Api<DynamicObject> = Api::namespaced_with(side.topology.hub(), base_ns, &application_resource());
    let (base_seen, base_watch) = watch_values(base.clone(), label);
    let mut hub_watch = Vec::with_capacity(latency_n);
    // End to end and baseline alternate, so load from elsewhere falls on both.
    for i in 0..latency_n {
        side.latency(1).await?;
        let mut obj = app_json(&format!("base-{i}"), base_ns);
        obj["metadata"]["labels"]["bench-round"] = serde_json::json!(i.to_string());
        let sent = Instant::now();
        base.create(&PostParams::default(), &dynamic(obj)?).await?;
        let seen = wait_seen(&base_seen, &(format!("base-{i}"), i.to_string()), sent + Duration::from_secs(60)).await?;
        hub_watch.push(seen.saturating_duration_since(sent));
    }
    base_watch.abort();

    // Status throughput: `apps` Applications on the spoke, statuses written there with
    // `writers` in flight; the rate at which they land on the hub.
    side.throughput(apps).await?;
    let names: Vec<String> =
        spoke.list(&Default::default()).await?.items.into_iter().filter_map(|o| o.metadata.name).take(apps).collect();
    let (hub_seen, hub_watch_task) = watch_values(hub.clone(), revision);
    let start = Instant::now();
    futures::stream::iter(&names)
        .map(|name| {
            let spoke = spoke.clone();
            async move { spoke.patch(name, &PatchParams::default(), &status_patch(&format!("e2e-{name}"))).await }
        })
        .buffer_unordered(writers)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let deadline = start + Duration::from_secs(300);
    let mut last = start;
    for name in &names {
        last = last.max(wait_seen(&hub_seen, &(name.clone(), format!("e2e-{name}")), deadline).await?);
    }
    hub_watch_task.abort();
    let status_rate = names.len() as f64 / last.duration_since(start).as_secs_f64().max(1e-9);

    // Baseline: the hub API server's own rate of the same status patches, same concurrency.
    let start = Instant::now();
    futures::stream::iter(&names)
        .map(|name| {
            let hub = hub.clone();
            async move { hub.patch(name, &PatchParams::default(), &status_patch(&format!("base-{name}"))).await }
        })
        .buffer_unordered(writers)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let hub_rate = names.len() as f64 / start.elapsed().as_secs_f64().max(1e-9);

    let mut e2e = std::mem::take(&mut side.latencies);
    e2e.sort();
    hub_watch.sort();
    drop(side);
    Ok(Figures { e2e, hub_watch, status_rate, hub_rate })
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
            "  status spoke -> hub, {apps} Applications, {writers} in flight   {:>8.0} updates/s   baseline hub status patches {:>8.0} writes/s  ({:.2}x)",
            f.status_rate,
            f.hub_rate,
            f.status_rate / f.hub_rate.max(1e-9)
        );
    }
    println!("real / embedded:");
    println!(
        "  latency p50 {:.2}x  p99 {:.2}x   status throughput {:.2}x   API server write rate {:.2}x",
        p50(&real.e2e) / p50(&embedded.e2e),
        p99(&real.e2e) / p99(&embedded.e2e),
        real.status_rate / embedded.status_rate.max(1e-9),
        real.hub_rate / embedded.hub_rate.max(1e-9)
    );
    Ok(())
}
