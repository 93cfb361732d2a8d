//! The fault-injecting proxy against a plain echo server: forwarding, latency, bandwidth, resets,
//! blackholes, half-open connections, refusal and flapping. Timing assertions are lower bounds
//! only (a busy machine is slow, never fast).

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use tests::faultproxy::{Direction, FaultControl, FaultProxy, FlapMode, Side, Stats};
use tests::{DEFAULT_TIMEOUT, wait_until_async};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How long a read must stay unanswered to count as "silent". Only an absence is shown with it,
/// so a slow machine cannot make a test fail, only pass for the wrong reason less often.
const SILENCE: Duration = Duration::from_millis(300);

/// Echoes every connection back until EOF, counting connections opened and closed.
struct Echo {
    addr: SocketAddr,
    opened: Arc<AtomicU64>,
    closed: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Echo {
    async fn start() -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (opened, closed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let task = {
            let (opened, closed) = (opened.clone(), closed.clone());
            tokio::spawn(async move {
                while let Ok((mut s, _)) = listener.accept().await {
                    opened.fetch_add(1, Ordering::SeqCst);
                    let closed = closed.clone();
                    tokio::spawn(async move {
                        let (mut r, mut w) = s.split();
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                        let _ = w.shutdown().await;
                        closed.fetch_add(1, Ordering::SeqCst);
                    });
                }
            })
        };
        Ok(Self { addr, opened, closed, task })
    }

    fn opened(&self) -> u64 {
        self.opened.load(Ordering::SeqCst)
    }

    fn closed(&self) -> u64 {
        self.closed.load(Ordering::SeqCst)
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn setup() -> Result<(Echo, FaultProxy)> {
    let echo = Echo::start().await?;
    let proxy = FaultProxy::start(echo.addr).await?;
    assert!(proxy.addr().ip().is_loopback());
    Ok((echo, proxy))
}

async fn wait_stats(proxy: &FaultControl, what: &str, check: impl Fn(&Stats) -> bool) -> Result<()> {
    let r = wait_until_async(DEFAULT_TIMEOUT, what, || async { check(&proxy.stats()) }).await;
    r.with_context(|| format!("{:?}", proxy.stats()))
}

async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Result<()> {
    s.write_all(msg).await?;
    let mut back = vec![0; msg.len()];
    tokio::time::timeout(DEFAULT_TIMEOUT, s.read_exact(&mut back)).await.context("echo timed out")??;
    ensure!(back == msg, "echo differs");
    Ok(())
}

/// The stream ends: EOF or a reset, within the default deadline.
async fn ends(s: &mut TcpStream) -> Result<ErrorKind> {
    let mut buf = [0; 64];
    match tokio::time::timeout(DEFAULT_TIMEOUT, s.read(&mut buf)).await.context("the stream did not end")? {
        Ok(0) => Ok(ErrorKind::UnexpectedEof),
        Ok(n) => bail!("unexpected {n} bytes"),
        Err(e) => Ok(e.kind()),
    }
}

/// Nothing arrives for [`SILENCE`], and the stream has not ended.
async fn silent(s: &mut TcpStream) -> Result<()> {
    let mut buf = [0; 64];
    match tokio::time::timeout(SILENCE, s.read(&mut buf)).await {
        Err(_) => Ok(()),
        Ok(Ok(0)) => bail!("the stream ended (EOF) instead of staying open"),
        Ok(Ok(n)) => bail!("{n} bytes arrived through a silent link"),
        Ok(Err(e)) => bail!("the stream failed instead of staying open: {e}"),
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| u8::try_from((i * 31 + i / 251) % 256).unwrap_or(0)).collect()
}

#[tokio::test]
async fn forwards_both_ways_keeps_data_intact_and_counts() -> Result<()> {
    let (echo, proxy) = setup().await?;
    let mut a = TcpStream::connect(proxy.addr()).await?;
    let mut b = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut a, b"hello").await?;
    round_trip(&mut b, b"world").await?;

    // A payload far larger than any buffer, written while it is read back.
    let payload = pattern(2 * 1024 * 1024 + 17);
    let (mut r, mut w) = a.split();
    let write = async {
        w.write_all(&payload).await?;
        w.shutdown().await
    };
    let mut back = Vec::new();
    let read = r.read_to_end(&mut back);
    let (wrote, read) = tokio::time::timeout(DEFAULT_TIMEOUT, async { tokio::join!(write, read) }).await?;
    wrote?;
    read?;
    assert!(back == payload, "the payload came back altered ({} of {} bytes)", back.len(), payload.len());

    let total = 5 + 5 + payload.len() as u64;
    wait_stats(&proxy, "every byte counted", |s| s.bytes_to_upstream == total && s.bytes_to_client == total).await?;
    // The half-close went through: the echo server saw EOF and closed, so the proxy did too.
    wait_stats(&proxy, "the half-closed connection to go", |s| s.live == 1).await?;
    drop(b);
    wait_stats(&proxy, "both connections to go", |s| s.live == 0).await?;
    let s = proxy.stats();
    assert_eq!((s.accepted, s.refused, s.resets, s.half_open), (2, 0, 0, 0), "{s:?}");
    assert_eq!(echo.opened(), 2);
    Ok(())
}

#[tokio::test]
async fn latency_is_added_per_direction_in_order_on_live_connections() -> Result<()> {
    let (_echo, proxy) = setup().await?;
    let mut s = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut s, b"warm").await?;

    // Set on a live connection.
    let (up, down) = (Duration::from_millis(150), Duration::from_millis(100));
    proxy.set_latency(Direction::ToUpstream, up);
    proxy.set_latency(Direction::ToClient, down);
    assert_eq!(proxy.faults().latency_to_upstream, up);
    let start = Instant::now();
    round_trip(&mut s, b"ping").await?;
    let rtt = start.elapsed();
    assert!(rtt >= up + down, "round trip {rtt:?} below the added {:?}", up + down);

    // Many small writes arrive in order, and latency does not serialise them: the lower bound
    // is one round trip, whatever the count (no upper bound is asserted).
    let start = Instant::now();
    let mut sent = Vec::new();
    for i in 0..50u32 {
        let msg = format!("<{i}>");
        s.write_all(msg.as_bytes()).await?;
        sent.extend_from_slice(msg.as_bytes());
    }
    let mut back = vec![0; sent.len()];
    tokio::time::timeout(DEFAULT_TIMEOUT, s.read_exact(&mut back)).await??;
    assert!(back == sent, "reordered: {}", String::from_utf8_lossy(&back));
    assert!(start.elapsed() >= up + down);

    proxy.set_latency(Direction::Both, Duration::ZERO);
    round_trip(&mut s, b"fast again").await?;
    Ok(())
}

#[tokio::test]
async fn bandwidth_limit_bounds_throughput() -> Result<()> {
    const RATE: u64 = 64 * 1024;
    const LEN: usize = 48 * 1024;
    let (_echo, proxy) = setup().await?;
    proxy.set_bandwidth(Direction::ToUpstream, Some(RATE));
    assert_eq!(proxy.faults().bandwidth_to_upstream, Some(RATE));
    let mut s = TcpStream::connect(proxy.addr()).await?;
    let payload = pattern(LEN);
    let start = Instant::now();
    round_trip(&mut s, &payload).await?;
    let elapsed = start.elapsed();
    let floor = Duration::from_secs_f64(LEN as f64 / RATE as f64);
    assert!(elapsed >= floor, "{LEN} bytes at {RATE} B/s took {elapsed:?}, below {floor:?}");

    // The limit is per direction, and lifting it applies to the live connection.
    proxy.set_bandwidth(Direction::Both, None);
    round_trip(&mut s, &payload).await?;
    Ok(())
}

#[tokio::test]
async fn reset_all_resets_live_connections_and_new_ones_still_work() -> Result<()> {
    let (echo, proxy) = setup().await?;
    let mut a = TcpStream::connect(proxy.addr()).await?;
    let mut b = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut a, b"a").await?;
    round_trip(&mut b, b"b").await?;
    assert_eq!(proxy.reset_all(), 2);
    for s in [&mut a, &mut b] {
        assert_eq!(ends(s).await?, ErrorKind::ConnectionReset, "an RST, not a FIN");
    }
    // The upstream side was reset too.
    wait_until_async(DEFAULT_TIMEOUT, "the echo server to see both go", || async { echo.closed() == 2 }).await?;
    wait_stats(&proxy, "no live connection", |s| s.live == 0 && s.resets == 2).await?;

    let mut c = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut c, b"after").await?;
    Ok(())
}

#[tokio::test]
async fn blackhole_silences_without_closing_and_lifting_delivers_what_was_held() -> Result<()> {
    let (echo, proxy) = setup().await?;
    let mut live = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut live, b"before").await?;

    proxy.blackhole(true);
    live.write_all(b"held").await?;
    silent(&mut live).await?;
    // A new connection is accepted, but the upstream never hears of it.
    let mut fresh = TcpStream::connect(proxy.addr()).await?;
    fresh.write_all(b"queued").await?;
    silent(&mut fresh).await?;
    assert_eq!(echo.opened(), 1, "a black-holed link must not reach the upstream");
    wait_stats(&proxy, "both connections held", |s| s.live == 2 && s.accepted == 2 && s.resets == 0).await?;

    proxy.blackhole(false);
    let mut back = [0; 4];
    tokio::time::timeout(DEFAULT_TIMEOUT, live.read_exact(&mut back)).await??;
    assert_eq!(&back, b"held");
    let mut back = [0; 6];
    tokio::time::timeout(DEFAULT_TIMEOUT, fresh.read_exact(&mut back)).await??;
    assert_eq!(&back, b"queued");
    round_trip(&mut live, b"after").await?;
    assert_eq!(echo.opened(), 2);
    Ok(())
}

#[tokio::test]
async fn refuse_closes_new_connections_at_once_and_spares_live_ones() -> Result<()> {
    let (echo, proxy) = setup().await?;
    let mut live = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut live, b"live").await?;

    proxy.refuse(true);
    let mut refused = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(ends(&mut refused).await?, ErrorKind::ConnectionReset, "an RST, not a FIN");
    wait_stats(&proxy, "the refusal counted", |s| s.refused == 1).await?;
    assert_eq!(echo.opened(), 1, "a refused connection must not reach the upstream");
    round_trip(&mut live, b"still here").await?;

    proxy.refuse(false);
    let mut again = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut again, b"welcome back").await?;
    Ok(())
}

#[tokio::test]
async fn half_open_client_side_stays_open_and_silent_while_the_upstream_is_closed() -> Result<()> {
    let (echo, proxy) = setup().await?;
    let mut s = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut s, b"hi").await?;

    assert_eq!(proxy.half_open(Side::Client), 1);
    wait_until_async(DEFAULT_TIMEOUT, "the upstream side to close", || async { echo.closed() == 1 }).await?;
    s.write_all(b"anyone?").await?;
    silent(&mut s).await?;
    let stats = proxy.stats();
    assert_eq!((stats.live, stats.half_open), (1, 1), "{stats:?}");

    // New connections are not affected.
    let mut fresh = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut fresh, b"fresh").await?;

    // Only a reset (or dropping the proxy) releases the held side.
    assert_eq!(proxy.reset_all(), 2);
    let kind = ends(&mut s).await?;
    assert!(matches!(kind, ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof), "{kind:?}");
    wait_stats(&proxy, "nothing half-open", |s| s.live == 0 && s.half_open == 0).await?;
    Ok(())
}

#[tokio::test]
async fn half_open_upstream_side_keeps_the_upstream_waiting_while_the_client_is_closed() -> Result<()> {
    let (echo, proxy) = setup().await?;
    let mut s = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut s, b"hi").await?;

    assert_eq!(proxy.half_open(Side::Upstream), 1);
    let kind = ends(&mut s).await?;
    assert!(matches!(kind, ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof), "{kind:?}");
    wait_stats(&proxy, "one half-open connection", |s| s.half_open == 1 && s.live == 1).await?;
    assert_eq!(echo.closed(), 0, "the upstream side must not be closed");

    drop(proxy);
    wait_until_async(DEFAULT_TIMEOUT, "dropping the proxy to close the held side", || async { echo.closed() == 1 })
        .await?;
    Ok(())
}

#[tokio::test]
async fn dropping_the_proxy_closes_connections_and_stops_listening() -> Result<()> {
    let (echo, proxy) = setup().await?;
    let addr = proxy.addr();
    let mut s = TcpStream::connect(addr).await?;
    round_trip(&mut s, b"hi").await?;
    drop(proxy);
    ends(&mut s).await?;
    wait_until_async(DEFAULT_TIMEOUT, "the upstream side to close", || async { echo.closed() == 1 }).await?;
    // The accept task is aborted asynchronously; the port stops answering soon after.
    wait_until_async(DEFAULT_TIMEOUT, "the listener to close", || async { TcpStream::connect(addr).await.is_err() })
        .await?;
    Ok(())
}

#[tokio::test]
async fn flapping_resets_and_refuses_on_a_period_and_stopping_leaves_the_link_up() -> Result<()> {
    let (_echo, proxy) = setup().await?;
    let mut s = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut s, b"hi").await?;
    let flapper = proxy.flap(Duration::from_millis(300), Duration::from_millis(100));
    let kind = ends(&mut s).await?;
    assert!(matches!(kind, ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof), "{kind:?}");
    wait_until_async(DEFAULT_TIMEOUT, "two flaps", || async { flapper.cycles() >= 2 }).await?;
    flapper.stop();
    let f = proxy.faults();
    assert!(!f.refuse && !f.blackhole, "{f:?}");
    let mut again = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut again, b"up").await?;

    // Black-hole flapping keeps the connection: what is sent arrives once the link is up.
    let flapper =
        proxy.control().flap_with(FlapMode::Blackhole, Duration::from_millis(200), Duration::from_millis(100));
    for i in 0..5u8 {
        round_trip(&mut again, &[i; 10]).await?;
    }
    drop(flapper);
    assert!(!proxy.faults().blackhole);
    round_trip(&mut again, b"steady").await?;
    assert_eq!(proxy.stats().resets, 1, "only the first connection was reset");
    Ok(())
}

#[tokio::test]
async fn clear_lifts_every_fault() -> Result<()> {
    let (_echo, proxy) = setup().await?;
    let control = proxy.control();
    control.set_latency(Direction::Both, Duration::from_secs(5));
    control.set_bandwidth(Direction::Both, Some(0));
    control.blackhole(true);
    control.refuse(true);
    assert_eq!(control.faults().bandwidth_to_client, Some(1), "0 B/s counts as 1");
    control.clear();
    assert_eq!(control.faults(), tests::faultproxy::Faults::default());
    let mut s = TcpStream::connect(proxy.addr()).await?;
    round_trip(&mut s, b"clear").await?;
    Ok(())
}
