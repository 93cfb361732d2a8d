//! Principal and agent end to end, beside a raw tonic bidi stream of the same message sizes, and
//! through Envoy sidecars beside direct mTLS.
//!
//! - end to end (spawned principal and agent over mTLS, embedded hub and spoke API servers):
//!   hub write to spoke write latency p50/p99 one at a time, and throughput with many writes in
//!   flight;
//! - baseline in the same run: a tonic EventStream Subscribe stream on loopback carrying
//!   CloudEvents with the same Application payload: one-way latency p50/p99 one at a time, and
//!   pipelined throughput;
//! - the same end-to-end measures through two real Envoy sidecars (agent -> agent sidecar ->
//!   principal sidecar -> plaintext principal, `--auth xfcc:`) beside the direct mTLS topology:
//!   both run at once and the measures alternate between them in rounds.
//!
//! Run: `cargo build --release -p cli && cargo bench -p tests --bench sync` (sizes:
//! BENCH_SYNC_LATENCY, BENCH_SYNC_THROUGHPUT, BENCH_SYNC_ROUNDS, BENCH_STREAM_EVENTS). Figures are
//! printed, never asserted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::pb::eventstreamapi::event_stream_server::{EventStream, EventStreamServer};
use protocol::pb::eventstreamapi::{Event as WireEvent, PingRequest, PongReply, PushSummary};
use tests::bench::{AGENT, Side, app_json, env, percentile};
use tests::topology::{Mode, Topology};

type Res<T> = anyhow::Result<T>;

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
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

/// Direct mTLS and Envoy sidecars side by side: both topologies run at once and the measures
/// alternate between them in `rounds`, so load from other processes falls on both.
async fn end_to_end(latency_n: usize, throughput_n: usize, rounds: usize) -> Res<(Side, Side)> {
    let agents = [(AGENT, Mode::Managed)];
    let mut direct = Side::start(Topology::start(&agents).await?).await?;
    let mut mesh = Side::start(Topology::start_mesh(&agents).await?).await?;
    let rounds = rounds.clamp(1, latency_n.max(throughput_n).max(1));
    let share = |n: usize, round: usize| n / rounds + usize::from(round < n % rounds);
    for round in 0..rounds {
        let (first, second) = if round % 2 == 0 { (&mut direct, &mut mesh) } else { (&mut mesh, &mut direct) };
        first.latency(share(latency_n, round)).await?;
        second.latency(share(latency_n, round)).await?;
        first.throughput(share(throughput_n, round)).await?;
        second.throughput(share(throughput_n, round)).await?;
    }
    direct.latencies.sort();
    mesh.latencies.sort();
    Ok((direct, mesh))
}

fn p50(sorted: &[Duration]) -> f64 {
    percentile(sorted, 0.5).as_secs_f64().max(1e-9)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let latency_n = env("BENCH_SYNC_LATENCY", if quick { 5 } else { 200 });
    let throughput_n = env("BENCH_SYNC_THROUGHPUT", if quick { 10 } else { 1000 });
    let rounds = env("BENCH_SYNC_ROUNDS", if quick { 2 } else { 4 });
    let stream_n = env("BENCH_STREAM_EVENTS", if quick { 50 } else { 20_000 });

    println!("principal + agent benchmarks ({} cores)", std::thread::available_parallelism().map_or(0, |n| n.get()));
    let (base_lat, base_rate, size) = baseline(latency_n, stream_n).await?;
    let (direct, mesh) = end_to_end(latency_n, throughput_n, rounds).await?;
    let (e2e_lat, e2e_rate) = (&direct.latencies, direct.rate());
    println!("message: one CloudEvent carrying an Application, {size} bytes on the wire");
    println!("latency, one at a time ({latency_n} events):");
    println!(
        "  baseline raw tonic bidi stream (h2c, one way)   p50 {:>10}   p99 {:>10}",
        ms(percentile(&base_lat, 0.5)),
        ms(percentile(&base_lat, 0.99))
    );
    println!(
        "  hub write -> spoke write (mTLS, 2 API servers)  p50 {:>10}   p99 {:>10}   ({:.1}x baseline p50)",
        ms(percentile(e2e_lat, 0.5)),
        ms(percentile(e2e_lat, 0.99)),
        p50(e2e_lat) / p50(&base_lat)
    );
    println!("throughput:");
    println!("  baseline raw tonic bidi stream, pipelined ({stream_n} events)   {base_rate:>9.0} events/s");
    println!(
        "  end to end, 16 hub writers ({throughput_n} Applications)         {e2e_rate:>9.0} events/s   ({:.3}x baseline)",
        e2e_rate / base_rate
    );
    println!(
        "through two Envoy sidecars (agent -> agent sidecar -> principal sidecar -> principal, --auth xfcc:) \
         beside direct mTLS (--auth mtls:subject), same run, interleaved in {rounds} rounds:"
    );
    println!(
        "  latency, one at a time ({latency_n})     direct mTLS p50 {:>10} p99 {:>10}   Envoy p50 {:>10} p99 {:>10}   ({:.2}x at p50)",
        ms(percentile(&direct.latencies, 0.5)),
        ms(percentile(&direct.latencies, 0.99)),
        ms(percentile(&mesh.latencies, 0.5)),
        ms(percentile(&mesh.latencies, 0.99)),
        p50(&mesh.latencies) / p50(&direct.latencies)
    );
    println!(
        "  throughput, 16 hub writers ({throughput_n})  direct mTLS {:>9.0} events/s   Envoy {:>9.0} events/s   ({:.2}x)",
        direct.rate(),
        mesh.rate(),
        mesh.rate() / direct.rate().max(1e-9)
    );
    drop((direct, mesh));
    Ok(())
}
