//! Principal and agent end to end, beside a raw tonic bidi stream of the same message sizes.
//!
//! - end to end (spawned principal and agent over mTLS, embedded hub and spoke API servers):
//!   hub write to spoke write latency p50/p99 one at a time, and throughput with many writes in
//!   flight;
//! - baseline in the same run: a tonic EventStream Subscribe stream on loopback carrying
//!   CloudEvents with the same Application payload: one-way latency p50/p99 one at a time, and
//!   pipelined throughput.
//!
//! Run: `cargo bench -p tests --bench sync` (sizes: BENCH_SYNC_LATENCY, BENCH_SYNC_THROUGHPUT,
//! BENCH_STREAM_EVENTS). Figures are printed, never asserted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kube::api::{Api, DynamicObject, PostParams};
use kube::runtime::watcher;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::pb::eventstreamapi::event_stream_server::{EventStream, EventStreamServer};
use protocol::pb::eventstreamapi::{Event as WireEvent, PingRequest, PongReply, PushSummary};
use serde_json::{Value, json};
use tests::fixtures::{application_resource, dynamic};
use tests::topology::{ARGOCD_NS, Mode, Topology};

type Res<T> = anyhow::Result<T>;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn app_json(name: &str, ns: &str) -> Value {
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

// === baseline: a raw tonic bidi stream ===

/// Records the arrival time of every event by id.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<HashMap<String, Instant>>>);

#[tonic::async_trait]
impl EventStream for Sink {
    type SubscribeStream = futures::stream::BoxStream<'static, Result<WireEvent, tonic::Status>>;

    async fn subscribe(
        &self,
        request: tonic::Request<tonic::Streaming<WireEvent>>,
    ) -> Result<tonic::Response<Self::SubscribeStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let arrivals = self.0.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        tokio::spawn(async move {
            while let Some(Ok(ev)) = inbound.next().await {
                let id = ev.event.as_ref().map(|e| e.id.clone()).unwrap_or_default();
                if let Ok(mut a) = arrivals.lock() {
                    a.insert(id, Instant::now());
                }
                // Echo it back, as an ACK of the same size would travel.
                if tx.send(Ok(ev)).await.is_err() {
                    break;
                }
            }
        });
        Ok(tonic::Response::new(tokio_stream::wrappers::ReceiverStream::new(rx).boxed()))
    }

    async fn push(
        &self,
        _r: tonic::Request<tonic::Streaming<WireEvent>>,
    ) -> Result<tonic::Response<PushSummary>, tonic::Status> {
        Err(tonic::Status::unimplemented("push"))
    }

    async fn ping(&self, _r: tonic::Request<PingRequest>) -> Result<tonic::Response<PongReply>, tonic::Status> {
        Ok(tonic::Response::new(PongReply::default()))
    }
}

fn wire_event(i: usize) -> Res<WireEvent> {
    let ev = protocol::event::Event::new(
        protocol::event::EventType::parse("io.argoproj.argocd-agent.event.create"),
        protocol::event::Target::parse("application"),
        format!("app-{i}_uid"),
        format!("app-{i}_uid_1"),
    )
    .with_json(&app_json(&format!("app-{i}"), "argocd"))?;
    let mut wire = ev.to_wire();
    if let Some(e) = wire.event.as_mut() {
        e.id = format!("ev-{i}");
    }
    Ok(wire)
}

async fn baseline(latency_n: usize, throughput_n: usize) -> Res<(Vec<Duration>, f64, usize)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let sink = Sink::default();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(EventStreamServer::new(sink.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut client = EventStreamClient::connect(format!("http://{addr}")).await?;
    let size = prost::Message::encoded_len(&wire_event(0)?);

    // One at a time: send, wait for the echo, record the one-way arrival.
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let mut echoes = client.subscribe(tokio_stream::wrappers::ReceiverStream::new(rx)).await?.into_inner();
    let mut lat = Vec::with_capacity(latency_n);
    for i in 0..latency_n {
        let ev = wire_event(i)?;
        let sent = Instant::now();
        tx.send(ev).await?;
        echoes.next().await.ok_or_else(|| anyhow::anyhow!("stream ended"))??;
        let arrived =
            sink.0.lock().map_err(|_| anyhow::anyhow!("lock"))?.get(&format!("ev-{i}")).copied().unwrap_or(sent);
        lat.push(arrived.saturating_duration_since(sent));
    }
    // Pipelined: everything in flight at once.
    let start = Instant::now();
    let sender = tokio::spawn(async move {
        for i in 0..throughput_n {
            if tx.send(wire_event(latency_n + i).unwrap_or_default()).await.is_err() {
                break;
            }
        }
    });
    for _ in 0..throughput_n {
        echoes.next().await.ok_or_else(|| anyhow::anyhow!("stream ended"))??;
    }
    let rate = throughput_n as f64 / start.elapsed().as_secs_f64();
    sender.abort();
    server.abort();
    lat.sort();
    Ok((lat, rate, size))
}

// === end to end ===

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

async fn end_to_end(latency_n: usize, throughput_n: usize) -> Res<(Vec<Duration>, f64)> {
    let t = Topology::start(&[("bench", Mode::Managed)]).await?;
    let hub: Api<DynamicObject> = Api::namespaced_with(t.hub(), "bench", &application_resource());
    let spoke: Api<DynamicObject> = Api::namespaced_with(t.spoke("bench")?, ARGOCD_NS, &application_resource());
    let (seen, watch) = spoke_arrivals(spoke);
    let mut lat = Vec::with_capacity(latency_n);
    for i in 0..latency_n {
        let name = format!("lat-{i}");
        let sent = Instant::now();
        hub.create(&PostParams::default(), &dynamic(app_json(&name, "bench"))?).await?;
        let arrived = wait_arrived(&seen, &name, Instant::now() + Duration::from_secs(60)).await?;
        lat.push(arrived.saturating_duration_since(sent));
    }
    let start = Instant::now();
    futures::stream::iter(0..throughput_n)
        .map(|i| {
            let hub = hub.clone();
            async move {
                hub.create(&PostParams::default(), &dynamic(app_json(&format!("tp-{i}"), "bench"))?)
                    .await
                    .map(|_| ())
                    .map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Res<Vec<()>>>()?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut last = start;
    for i in 0..throughput_n {
        last = last.max(wait_arrived(&seen, &format!("tp-{i}"), deadline).await?);
    }
    let rate = throughput_n as f64 / last.duration_since(start).as_secs_f64();
    watch.abort();
    lat.sort();
    Ok((lat, rate))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let latency_n = env("BENCH_SYNC_LATENCY", if quick { 5 } else { 200 });
    let throughput_n = env("BENCH_SYNC_THROUGHPUT", if quick { 10 } else { 1000 });
    let stream_n = env("BENCH_STREAM_EVENTS", if quick { 50 } else { 20_000 });

    println!("principal + agent benchmarks ({} cores)", std::thread::available_parallelism().map_or(0, |n| n.get()));
    let (base_lat, base_rate, size) = baseline(latency_n, stream_n).await?;
    let (e2e_lat, e2e_rate) = end_to_end(latency_n, throughput_n).await?;
    println!("message: one CloudEvent carrying an Application, {size} bytes on the wire");
    println!("latency, one at a time ({latency_n} events):");
    println!(
        "  baseline raw tonic bidi stream (h2c, one way)   p50 {:>10}   p99 {:>10}",
        ms(percentile(&base_lat, 0.5)),
        ms(percentile(&base_lat, 0.99))
    );
    println!(
        "  hub write -> spoke write (mTLS, 2 API servers)  p50 {:>10}   p99 {:>10}   ({:.1}x baseline p50)",
        ms(percentile(&e2e_lat, 0.5)),
        ms(percentile(&e2e_lat, 0.99)),
        percentile(&e2e_lat, 0.5).as_secs_f64() / percentile(&base_lat, 0.5).as_secs_f64().max(1e-9)
    );
    println!("throughput:");
    println!("  baseline raw tonic bidi stream, pipelined ({stream_n} events)   {base_rate:>9.0} events/s");
    println!(
        "  end to end, 16 hub writers ({throughput_n} Applications)         {e2e_rate:>9.0} events/s   ({:.3}x baseline)",
        e2e_rate / base_rate
    );
    Ok(())
}
