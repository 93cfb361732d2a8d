//! Embedded API server benchmarks, each figure beside a baseline measured in the same run.
//!
//! - creates/s through kube-rs (HTTPS, JSON, validation, fsync per write) vs. redb alone doing
//!   the same durable single-object transactions;
//! - list latency at 10,000 objects (full and paged);
//! - watch delivery latency p50/p99 with 100 concurrent watchers.
//!
//! Run: `cargo bench -p apiserver` (sizes: BENCH_CREATES, BENCH_LIST_OBJECTS, BENCH_WATCHERS,
//! BENCH_WATCH_WRITES). Figures are printed, never asserted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::{ApiServer, Config};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams, WatchEvent, WatchParams};
use redb::{Database, TableDefinition};
use serde_json::json;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn app(name: &str, sent_ns: u128) -> Res<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "annotations": {"bench/sent-ns": sent_ns.to_string()}, "labels": {"team": "bench"}},
        "spec": {
            "project": "default",
            "source": {"repoURL": "https://github.com/argoproj/argocd-example-apps.git", "path": "guestbook", "targetRevision": "HEAD"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": name},
            "syncPolicy": {"automated": {"prune": true, "selfHeal": true}},
        },
    }))?)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Baseline: redb alone, one durable transaction per object, same bytes as the server stores.
fn redb_creates(n: usize) -> Res<f64> {
    let dir = tempfile::tempdir()?;
    let db = Database::create(dir.path().join("bench.redb"))?;
    let table: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("objects");
    let start = Instant::now();
    for i in 0..n {
        let obj = serde_json::to_vec(&app(&format!("app-{i}"), 0)?)?;
        let key = format!("argoproj.io/applications/argocd/app-{i}");
        let txn = db.begin_write()?;
        {
            let mut t = txn.open_table(table)?;
            t.insert(key.as_str(), obj.as_slice())?;
        }
        txn.commit()?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

async fn namespace(client: &kube::Client, name: &str) -> Res<()> {
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await?;
    Ok(())
}

fn app_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

async fn server_creates(client: &kube::Client, n: usize, concurrency: usize) -> Res<f64> {
    let ns = format!("creates-{concurrency}");
    namespace(client, &ns).await?;
    let api = app_api(client, &ns);
    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &app(&format!("app-{i}"), 0)?).await.map(|_| ()).map_err(Into::into)
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await
        .map_err(|e: Box<dyn std::error::Error + Send + Sync>| e)?;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

async fn list_latency(client: &kube::Client, n: usize) -> Res<()> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "list-bench");
    namespace(client, "list-bench").await?;
    let fill = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let cms = cms.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": format!("cm-{i:05}"), "labels": {"shard": (i % 10).to_string()}},
                    "data": {"key": "value", "index": i.to_string()},
                }))?;
                cms.create(&PostParams::default(), &cm).await?;
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    println!("  (filled {n} ConfigMaps in {:.1} s)", fill.elapsed().as_secs_f64());
    for (what, lp) in [
        ("full list", ListParams::default()),
        ("label selector (1/10)", ListParams::default().labels("shard=3")),
        ("first page of 500", ListParams::default().limit(500)),
    ] {
        let mut times = Vec::new();
        let mut count = 0;
        for _ in 0..15 {
            let t = Instant::now();
            count = cms.list(&lp).await?.items.len();
            times.push(t.elapsed());
        }
        times.sort();
        println!(
            "  list {what:<24} {count:>6} items   p50 {:>10}   p99 {:>10}",
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.99))
        );
    }
    Ok(())
}

async fn watch_latency(client: &kube::Client, watchers: usize, writes: usize) -> Res<()> {
    namespace(client, "watch-bench").await?;
    let api = app_api(client, "watch-bench");
    let rv = api.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default();
    let epoch = Arc::new(Instant::now());
    let mut tasks = Vec::new();
    for _ in 0..watchers {
        let stream = api.watch(&WatchParams::default().timeout(600), &rv).await?;
        let epoch = epoch.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = stream.boxed();
            let mut lat = Vec::with_capacity(writes);
            while lat.len() < writes {
                match stream.try_next().await {
                    Ok(Some(WatchEvent::Added(o))) => {
                        let sent: u128 = o
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get("bench/sent-ns"))
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(0);
                        let now = epoch.elapsed().as_nanos();
                        lat.push(Duration::from_nanos(now.saturating_sub(sent) as u64));
                    }
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
            lat
        }));
    }
    let start = Instant::now();
    for i in 0..writes {
        api.create(&PostParams::default(), &app(&format!("w-{i}"), epoch.elapsed().as_nanos())?).await?;
    }
    let write_secs = start.elapsed().as_secs_f64();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    all.sort();
    println!(
        "  watch delivery, {watchers} watchers x {writes} writes: {} events   p50 {:>10}   p99 {:>10}   max {:>10}   (writer {:.0} creates/s)",
        all.len(),
        ms(percentile(&all, 0.5)),
        ms(percentile(&all, 0.99)),
        ms(all.last().copied().unwrap_or_default()),
        writes as f64 / write_secs
    );
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    // `cargo bench` passes --bench; `cargo test --benches` runs this with tiny sizes.
    let quick = std::env::args().any(|a| a == "--test") || std::env::var("BENCH_QUICK").is_ok();
    let scale = |name: &str, full: usize, small: usize| env(name, if quick { small } else { full });
    let creates = scale("BENCH_CREATES", 2000, 20);
    let list_objects = scale("BENCH_LIST_OBJECTS", 10_000, 50);
    let watchers = scale("BENCH_WATCHERS", 100, 3);
    let watch_writes = scale("BENCH_WATCH_WRITES", 200, 5);

    println!("embedded API server benchmarks ({} cores)", std::thread::available_parallelism().map_or(0, |n| n.get()));
    let baseline = tokio::task::spawn_blocking(move || redb_creates(creates)).await??;
    let dir = tempfile::tempdir()?;
    let mut cfg = Config::new(dir.path().join("data"));
    cfg.watch_history = 100_000;
    let server = ApiServer::start(cfg).await?;
    let client = server.client().await?;
    let seq = server_creates(&client, creates, 1).await?;
    let par = server_creates(&client, creates, 16).await?;
    println!("creates/s ({creates} Applications, durable):");
    println!("  baseline redb alone, 1 txn/object      {baseline:>8.0}/s");
    println!("  API server, sequential client          {seq:>8.0}/s   ({:.2}x baseline)", seq / baseline);
    println!("  API server, 16 concurrent clients      {par:>8.0}/s   ({:.2}x baseline)", par / baseline);
    println!("list latency at {list_objects} objects:");
    list_latency(&client, list_objects).await?;
    println!("watch:");
    watch_latency(&client, watchers, watch_writes).await?;
    server.shutdown().await;
    Ok(())
}
