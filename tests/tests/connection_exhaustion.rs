//! Connection exhaustion (issue #31 item 2), against the real principal with real TLS: hostile
//! connections that never authenticate are closed within their bounds and capped per listener,
//! so they cannot take the descriptors the agents need.
//!
//! The principal runs with an open-file limit of [`OPEN_FILES`], below the [`HOSTILE`]
//! connections opened on each of its ports, and with short timeouts (1 s) so the test is
//! fast. Attackers keep [`HOSTILE`] connections open on each port (reopening each as soon as the
//! principal closes it): TLS connections without a client certificate that send the HTTP/2
//! preface and go silent on the resource proxy, silent TCP connections (a TLS handshake never
//! started) on the Redis proxy, the metrics port and the agents' gRPC port. While they are held
//! an agent connects and an Application reaches its cluster; every hostile connection is closed
//! within the bound; the principal's descriptors come back to near where they were.
//!
//! Before the bounds, the resource proxy held such HTTP/2 connections forever, the metrics port
//! held silent connections forever, and the hostile connections took every descriptor: accepts
//! failed (`EMFILE`) and the agent could not connect.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use kube::api::PostParams;
use tests::apps::{apps, converge, path_is};
use tests::topology::{ARGOCD_NS, Mode, StartOptions, Topology};
use tests::wait_until_async;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Hostile connections kept open on each port.
const HOSTILE: usize = 200;
/// The principal's open-file limit: below the hostile connections of all ports together.
const OPEN_FILES: u64 = 512;
/// The handshake and header timeouts the principal runs with.
const BOUND: Duration = Duration::from_secs(1);
/// What a closing may take beyond its bound (a loaded machine).
const SLACK: Duration = Duration::from_secs(2);
/// An attacker pauses this long before reopening a closed connection (paces the reconnects so
/// the test does not run the machine out of ephemeral ports).
const REOPEN_PAUSE: Duration = Duration::from_millis(500);

/// The client preface of HTTP/2 and an empty SETTINGS frame: what a client sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// What one attack saw.
#[derive(Debug, Default)]
struct Stats {
    /// Connections opened.
    opened: AtomicU64,
    /// Connections open now.
    open: AtomicUsize,
    /// The longest any connection was held open by the principal (ms).
    longest_ms: AtomicU64,
}

/// How a hostile connection behaves.
#[derive(Clone)]
enum Hostile {
    /// TCP connect, then nothing: a TLS handshake (or an HTTP request) never started.
    Silent,
    /// A TLS handshake without a client certificate, the HTTP/2 preface, then nothing.
    H2Preface(Arc<rustls::ClientConfig>),
}

/// Keeps [`HOSTILE`] connections of kind `hostile` open on `addr` until `stop` fires; each one
/// closed by the principal is reopened after [`REOPEN_PAUSE`]. Returns when every connection
/// has been closed by the principal after `stop` (the caller bounds the wait).
fn attack(addr: SocketAddr, hostile: Hostile, stop: CancellationToken) -> (Arc<Stats>, tokio::task::JoinSet<()>) {
    let stats = Arc::new(Stats::default());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..HOSTILE {
        let (hostile, stop, stats) = (hostile.clone(), stop.clone(), stats.clone());
        tasks.spawn(async move {
            while !stop.is_cancelled() {
                let started = Instant::now();
                if let Ok(tcp) = TcpStream::connect(addr).await {
                    stats.opened.fetch_add(1, Ordering::Relaxed);
                    stats.open.fetch_add(1, Ordering::Relaxed);
                    hold(tcp, &hostile).await;
                    stats.open.fetch_sub(1, Ordering::Relaxed);
                    let held = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    stats.longest_ms.fetch_max(held, Ordering::Relaxed);
                }
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(REOPEN_PAUSE) => {}
                }
            }
        });
    }
    (stats, tasks)
}

/// Does what `hostile` does on `tcp`, then reads (sending nothing) until the principal closes it.
async fn hold(tcp: TcpStream, hostile: &Hostile) {
    let mut buf = [0u8; 4096];
    match hostile {
        Hostile::Silent => {
            let mut tcp = tcp;
            while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
        }
        Hostile::H2Preface(tls) => {
            let connector = tokio_rustls::TlsConnector::from(tls.clone());
            let Ok(name) = rustls_pki_types::ServerName::try_from("127.0.0.1") else { return };
            let Ok(mut stream) = connector.connect(name, tcp).await else { return };
            if stream.write_all(H2_PREFACE).await.is_err() {
                return;
            }
            while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
        }
    }
}

/// Open file descriptors of process `pid`.
fn fds(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd")).with_context(|| format!("/proc/{pid}/fd"))?.count())
}

/// A TLS client that trusts the hub's CA (the resource proxy's issuer) and has no certificate.
async fn client_without_certificate(t: &Topology) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(t.hub_ca().await?.der()?)?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The Redis proxy's address, from the principal's log.
fn redis_proxy_addr(t: &Topology) -> Result<SocketAddr> {
    t.redis_proxy_addr().context("the principal serves the Redis proxy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_connections_are_closed_in_time_capped_and_agents_are_still_served() -> Result<()> {
    // The Redis proxy over TLS (a silent client never finishes its handshake); its hub Redis is
    // never dialled, since no hostile connection gets that far.
    let scratch = tempfile::tempdir()?;
    let redis_ca = tests::pki::Ca::generate("redis-proxy-ca")?;
    let redis_cert = redis_ca.server("redis-proxy", &["127.0.0.1"], &[])?;
    let (cert, key) = (scratch.path().join("redis.crt"), scratch.path().join("redis.key"));
    std::fs::write(&cert, redis_cert.cert)?;
    std::fs::write(&key, redis_cert.key)?;
    let bound = format!("{}s", BOUND.as_secs());
    let mut principal_args: Vec<String> = [
        "--handshake-timeout",
        &bound,
        "--header-read-timeout",
        &bound,
        "--http2-keepalive-interval",
        &bound,
        "--http2-keepalive-timeout",
        &bound,
        "--redis-server-address",
        "127.0.0.1:1",
        "--redis-proxy-listen-address",
        "127.0.0.1:0",
        "--redis-tls-enabled",
        "--redis-tls-insecure",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    principal_args.push("--redis-proxy-server-tls-cert".into());
    principal_args.push(cert.display().to_string());
    principal_args.push("--redis-proxy-server-tls-key".into());
    principal_args.push(key.display().to_string());
    let options = StartOptions {
        resource_proxy: true,
        start_agents: false,
        principal_open_files: Some(OPEN_FILES),
        principal_args,
        ..StartOptions::default()
    };
    let mut t = Topology::start_with_options(&[("agent-a", Mode::Managed)], options).await?;
    let pid = t.principal_pid().context("the principal runs")?;
    let proxy = t.resource_proxy_addr().context("the resource proxy listens")?;
    let redis = redis_proxy_addr(&t)?;
    let metrics = t.principal_metrics_addr().context("the metrics endpoint listens")?;
    let grpc = t.principal_addr().context("the agents' listener")?;
    let tls = client_without_certificate(&t).await?;
    let baseline = fds(pid)?;

    // Peak descriptors of the principal, sampled while attacked.
    let peak = Arc::new(AtomicUsize::new(baseline));
    let sampling = CancellationToken::new();
    let sampler = tokio::spawn({
        let (peak, sampling) = (peak.clone(), sampling.clone());
        async move {
            while !sampling.is_cancelled() {
                if let Ok(n) = fds(pid) {
                    peak.fetch_max(n, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });

    // The proxies and the metrics port under attack first: the agent must still connect.
    let stop = CancellationToken::new();
    let started = Instant::now();
    let mut attacks = vec![
        ("resource proxy (TLS, no certificate, HTTP/2 preface)", attack(proxy, Hostile::H2Preface(tls), stop.clone())),
        ("Redis proxy (silent TLS handshake)", attack(redis, Hostile::Silent, stop.clone())),
        ("metrics (silent)", attack(metrics, Hostile::Silent, stop.clone())),
    ];
    let every_port = &attacks;
    wait_until_async(Duration::from_secs(10), "every hostile connection to be opened once", || async move {
        every_port.iter().all(|(_, (s, _))| s.opened.load(Ordering::Relaxed) >= HOSTILE as u64)
    })
    .await?;
    let held_at_start: Vec<usize> = attacks.iter().map(|(_, (s, _))| s.open.load(Ordering::Relaxed)).collect();

    t.start_agent("agent-a").await?;
    let topology = &t;
    wait_until_async(Duration::from_secs(15), "the agent to connect while the proxies are attacked", || async move {
        topology.principal_connects("agent-a") >= 1
    })
    .await
    .with_context(|| t.logs())?;
    let connected_after = started.elapsed();

    // Now the agents' port too: the connected agent keeps being served.
    attacks.push(("agents' gRPC (silent TLS handshake)", attack(grpc, Hostile::Silent, stop.clone())));
    let grpc_attack = attacks[3].1.0.clone();
    wait_until_async(Duration::from_secs(10), "the gRPC attack to open its connections", || {
        let opened = grpc_attack.opened.load(Ordering::Relaxed);
        async move { opened >= HOSTILE as u64 }
    })
    .await?;
    let hub = apps(&t.hub(), "agent-a");
    let spoke = apps(&t.spoke("agent-a")?, ARGOCD_NS);
    hub.create(&PostParams::default(), &tests::fixtures::app_with_path("guestbook", "agent-a", "v1")?).await?;
    converge(&t, &spoke, "guestbook", "an Application reaches the agent while every port is attacked", path_is("v1"))
        .await?;
    let flowed_after = started.elapsed();
    let held_under_attack = fds(pid)?;

    // Stop: every hostile connection is closed by the principal within its bound.
    stop.cancel();
    let deadline = BOUND + SLACK;
    for (name, (stats, tasks)) in &mut attacks {
        let closed =
            tokio::time::timeout(deadline + REOPEN_PAUSE, async { while tasks.join_next().await.is_some() {} });
        ensure!(
            closed.await.is_ok(),
            "{name}: {} hostile connections still open {deadline:?} after the attack stopped",
            stats.open.load(Ordering::Relaxed)
        );
    }
    wait_until_async(Duration::from_secs(5), "the principal's descriptors to come back", || async move {
        fds(pid).is_ok_and(|n| n <= baseline + 16)
    })
    .await
    .with_context(|| format!("descriptors: {:?} now, {baseline} before", fds(pid)))?;
    let after = fds(pid)?;
    sampling.cancel();
    let _ = sampler.await;
    let peak = peak.load(Ordering::Relaxed);

    eprintln!("connection exhaustion: principal RLIMIT_NOFILE {OPEN_FILES}, bounds {BOUND:?} (handshake, header)");
    for (i, (name, (stats, _))) in attacks.iter().enumerate() {
        let longest = Duration::from_millis(stats.longest_ms.load(Ordering::Relaxed));
        eprintln!(
            "  {name}: {HOSTILE} kept open, {} opened in all, {} open when the agent started, longest held {longest:?}",
            stats.opened.load(Ordering::Relaxed),
            held_at_start.get(i).map_or_else(|| "-".to_owned(), ToString::to_string),
        );
        ensure!(longest <= deadline, "{name}: a connection was held {longest:?} (bound {BOUND:?} + {SLACK:?})");
    }
    eprintln!(
        "  agent connected {connected_after:?} after the attack began, its Application arrived after {flowed_after:?}"
    );
    eprintln!("  principal fds: {baseline} before, {peak} at peak, {held_under_attack} under attack, {after} after");
    ensure!(peak < OPEN_FILES as usize, "the principal reached its open-file limit ({peak} of {OPEN_FILES})");
    Ok(())
}
