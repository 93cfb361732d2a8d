//! [`FaultProxy`]: a TCP proxy on `127.0.0.1:0` that sits between a client (an agent) and its
//! upstream (the principal) and injects network faults, changeable at runtime through a cloneable
//! [`FaultControl`]. Faults apply to live connections and to new ones.
//!
//! - [`FaultControl::set_latency`]: each chunk is delivered `d` after the proxy read it, in order
//!   (a one-way delay per direction, not a throughput cap).
//! - [`FaultControl::set_bandwidth`]: at most `n` bytes/s per direction; a chunk's time is paid
//!   before it is sent.
//! - [`FaultControl::blackhole`]: silence both ways, nothing closed. The proxy stops reading and
//!   holds what it already read; new connections are accepted but not dialled upstream (like a
//!   SYN that never arrives). Lifting it delivers what was held, as TCP does once a partition
//!   heals.
//! - [`FaultControl::reset_all`]: every live connection is closed with RST (`SO_LINGER` 0) on
//!   both sides.
//! - [`FaultControl::half_open`]: on live connections one side (or both) is held open and never
//!   read, written or closed, like a peer that vanished without a FIN; the other side is closed.
//! - [`FaultControl::refuse`]: new connections are accepted and at once closed with RST.
//!
//! A connection on which either endpoint fails (e.g. sends RST) is reset on the other side too;
//! a FIN is forwarded as a FIN (half-close).
//!
//! [`FaultControl::stats`] counts connections and bytes, so tests wait on conditions ("the agent
//! reconnected": `accepted` grew) rather than sleeping. [`FaultControl::flap`] takes the link down
//! and up on a period. Dropping the [`FaultProxy`] stops accepting and closes every connection.
//!
//! ```ignore
//! let mut t = Topology::start_without_agents(&[("m1", Mode::Managed)]).await?;
//! let proxy = FaultProxy::start(t.principal_addr().context("no principal")?).await?;
//! t.start_agent_via("m1", proxy.addr()).await?;
//! proxy.blackhole(true);
//! // ... change things; reset the agent's connections, once it has dialled again each time:
//! let before = proxy.stats().accepted;
//! proxy.reset_all();
//! wait_until_async(DEFAULT_TIMEOUT, "a redial", || async { proxy.stats().accepted > before }).await?;
//! proxy.blackhole(false);
//! // Flapping: down 1 s out of every 3 s until the flapper is dropped.
//! let flapper = proxy.flap(Duration::from_secs(3), Duration::from_secs(1));
//! wait_until_async(DEFAULT_TIMEOUT, "two flaps", || async { flapper.cycles() >= 2 }).await?;
//! drop(flapper);
//! ```

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Largest chunk read at once.
const CHUNK: usize = 16 * 1024;
/// Chunks in flight per direction between the reading and the writing half (the latency line).
const IN_FLIGHT: usize = 64;
/// A bandwidth limit is paid in pieces of at most this fraction of a second's worth of bytes.
const PIECES_PER_SECOND: u64 = 20;

/// Which way bytes travel through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to upstream (agent to principal).
    ToUpstream,
    /// Upstream to client (principal to agent).
    ToClient,
    /// Both ways.
    Both,
}

impl Direction {
    fn includes(self, one: Self) -> bool {
        self == Self::Both || self == one
    }
}

/// One end of a proxied connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The socket the client connected to the proxy with.
    Client,
    /// The proxy's socket to the upstream.
    Upstream,
    /// Both.
    Both,
}

/// The faults in force (see the module documentation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Delay added to each chunk from the client to the upstream.
    pub latency_to_upstream: Duration,
    /// Delay added to each chunk from the upstream to the client.
    pub latency_to_client: Duration,
    /// Bytes per second from the client to the upstream (`None`: unlimited).
    pub bandwidth_to_upstream: Option<u64>,
    /// Bytes per second from the upstream to the client (`None`: unlimited).
    pub bandwidth_to_client: Option<u64>,
    /// Nothing is forwarded either way; nothing is closed.
    pub blackhole: bool,
    /// New connections are accepted and closed with RST at once.
    pub refuse: bool,
}

impl Faults {
    fn latency(&self, dir: Direction) -> Duration {
        if dir == Direction::ToUpstream { self.latency_to_upstream } else { self.latency_to_client }
    }

    fn bandwidth(&self, dir: Direction) -> Option<u64> {
        if dir == Direction::ToUpstream { self.bandwidth_to_upstream } else { self.bandwidth_to_client }
    }
}

/// Counters, read with [`FaultControl::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted from clients, refused ones included.
    pub accepted: u64,
    /// Of those, closed at once because of [`FaultControl::refuse`].
    pub refused: u64,
    /// Connections the proxy holds open now (half-open ones included).
    pub live: u64,
    /// Of those, connections made half-open by [`FaultControl::half_open`].
    pub half_open: u64,
    /// Connections the proxy closed with RST (by [`FaultControl::reset_all`] or because the
    /// other endpoint failed), refused ones excluded.
    pub resets: u64,
    /// Connections the upstream could not be dialled for (the client was reset).
    pub upstream_failures: u64,
    /// Bytes written to upstreams.
    pub bytes_to_upstream: u64,
    /// Bytes written to clients.
    pub bytes_to_client: u64,
}

/// What a live connection is told to do.
#[derive(Debug, Clone, Copy)]
enum Command {
    Reset,
    HalfOpen(Side),
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    refused: AtomicU64,
    half_open: AtomicU64,
    resets: AtomicU64,
    upstream_failures: AtomicU64,
    bytes_to_upstream: AtomicU64,
    bytes_to_client: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    faults: watch::Sender<Faults>,
    connections: Mutex<HashMap<u64, mpsc::UnboundedSender<Command>>>,
    next_id: AtomicU64,
    counters: Counters,
}

impl Shared {
    fn connections(&self) -> MutexGuard<'_, HashMap<u64, mpsc::UnboundedSender<Command>>> {
        self.connections.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Send `command` to every live connection; how many were told.
    fn broadcast(&self, command: Command) -> usize {
        self.connections().values().filter(|tx| tx.send(command).is_ok()).count()
    }

    fn count_bytes(&self, dir: Direction, n: usize) {
        let counter = match dir {
            Direction::ToUpstream => &self.counters.bytes_to_upstream,
            _ => &self.counters.bytes_to_client,
        };
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// A running proxy. Dereferences to its [`FaultControl`]; dropping it stops accepting and closes
/// every connection it holds.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    control: FaultControl,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Listen on `127.0.0.1:0` and forward every accepted connection to `upstream`, with no
    /// faults until told otherwise. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// The listener cannot be bound.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            faults: watch::Sender::new(Faults::default()),
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            counters: Counters::default(),
        });
        let accept = tokio::spawn(accept_loop(shared.clone(), listener));
        Ok(Self { addr, control: FaultControl { shared }, accept })
    }

    /// Where clients connect.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The upstream every connection is forwarded to.
    #[must_use]
    pub fn upstream(&self) -> SocketAddr {
        self.control.shared.upstream
    }

    /// A handle that changes faults and reads counters (cloneable, usable from other tasks).
    #[must_use]
    pub fn control(&self) -> FaultControl {
        self.control.clone()
    }
}

impl std::ops::Deref for FaultProxy {
    type Target = FaultControl;

    fn deref(&self) -> &FaultControl {
        &self.control
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Each connection task sees its command channel close and drops its sockets.
        self.control.shared.connections().clear();
    }
}

/// Changes a [`FaultProxy`]'s faults at runtime and reads its counters. Every change applies to
/// live connections and to new ones.
#[derive(Debug, Clone)]
pub struct FaultControl {
    shared: Arc<Shared>,
}

impl FaultControl {
    fn modify(&self, change: impl FnOnce(&mut Faults)) {
        self.shared.faults.send_modify(change);
    }

    /// The faults in force.
    #[must_use]
    pub fn faults(&self) -> Faults {
        *self.shared.faults.borrow()
    }

    /// Delay every chunk travelling `dir` by `delay` (zero: none), preserving order.
    pub fn set_latency(&self, dir: Direction, delay: Duration) {
        self.modify(|f| {
            if dir.includes(Direction::ToUpstream) {
                f.latency_to_upstream = delay;
            }
            if dir.includes(Direction::ToClient) {
                f.latency_to_client = delay;
            }
        });
    }

    /// Limit `dir` to `bytes_per_second` (`None`: unlimited; 0 counts as 1).
    pub fn set_bandwidth(&self, dir: Direction, bytes_per_second: Option<u64>) {
        let limit = bytes_per_second.map(|b| b.max(1));
        self.modify(|f| {
            if dir.includes(Direction::ToUpstream) {
                f.bandwidth_to_upstream = limit;
            }
            if dir.includes(Direction::ToClient) {
                f.bandwidth_to_client = limit;
            }
        });
    }

    /// Stop (`true`) or resume (`false`) forwarding in both directions, closing nothing.
    pub fn blackhole(&self, on: bool) {
        self.modify(|f| f.blackhole = on);
    }

    /// Close new connections with RST as soon as they are accepted (`true`), or forward them
    /// again (`false`). Live connections are not touched (see [`Self::reset_all`]).
    pub fn refuse(&self, on: bool) {
        self.modify(|f| f.refuse = on);
    }

    /// Lift every fault: no latency, no bandwidth limit, no blackhole, no refusal. Connections
    /// already half-open stay so.
    pub fn clear(&self) {
        self.modify(|f| *f = Faults::default());
    }

    /// Close every live connection, half-open ones included, with RST on both sides. Returns how
    /// many connections were told; they are gone once [`Stats::live`] drops.
    pub fn reset_all(&self) -> usize {
        self.shared.broadcast(Command::Reset)
    }

    /// Make every live connection half-open: the `keep` side is held open and never read,
    /// written or closed (until [`Self::reset_all`] or the proxy is dropped), as if its peer
    /// vanished without a FIN; the other side, unless `keep` is [`Side::Both`], is closed.
    /// New connections are forwarded as usual. Returns how many connections were told.
    ///
    /// `Side::Client` leaves the agent on a stream that will never say anything again while the
    /// principal sees the connection close; `Side::Upstream` is the reverse.
    pub fn half_open(&self, keep: Side) -> usize {
        self.shared.broadcast(Command::HalfOpen(keep))
    }

    /// The counters now.
    #[must_use]
    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            accepted: get(&c.accepted),
            refused: get(&c.refused),
            live: self.shared.connections().len() as u64,
            half_open: get(&c.half_open),
            resets: get(&c.resets),
            upstream_failures: get(&c.upstream_failures),
            bytes_to_upstream: get(&c.bytes_to_upstream),
            bytes_to_client: get(&c.bytes_to_client),
        }
    }

    /// Take the link down for `down_for` out of every `period`, starting now, with
    /// [`FlapMode::Reset`]. Must be called inside a tokio runtime.
    #[must_use = "dropping the Flapper stops the flapping"]
    pub fn flap(&self, period: Duration, down_for: Duration) -> Flapper {
        self.flap_with(FlapMode::Reset, period, down_for)
    }

    /// [`Self::flap`] with an explicit way of taking the link down.
    #[must_use = "dropping the Flapper stops the flapping"]
    pub fn flap_with(&self, mode: FlapMode, period: Duration, down_for: Duration) -> Flapper {
        let control = self.clone();
        let cycles = Arc::new(AtomicU64::new(0));
        let stopped = Arc::new(Mutex::new(false));
        let up_for = period.saturating_sub(down_for);
        let task = {
            let (control, cycles, stopped) = (control.clone(), cycles.clone(), stopped.clone());
            tokio::spawn(async move {
                loop {
                    {
                        // Under the lock, so a concurrent stop cannot be followed by a down.
                        let stopped = stopped.lock().unwrap_or_else(PoisonError::into_inner);
                        if *stopped {
                            return;
                        }
                        control.link_down(mode);
                    }
                    // The fault's timing is what is under test: plain sleeps.
                    tokio::time::sleep(down_for).await;
                    control.link_up(mode);
                    cycles.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(up_for).await;
                }
            })
        };
        Flapper { control, mode, cycles, stopped, task }
    }

    fn link_down(&self, mode: FlapMode) {
        match mode {
            FlapMode::Reset => {
                self.refuse(true);
                self.reset_all();
            }
            FlapMode::Blackhole => self.blackhole(true),
        }
    }

    fn link_up(&self, mode: FlapMode) {
        match mode {
            FlapMode::Reset => self.refuse(false),
            FlapMode::Blackhole => self.blackhole(false),
        }
    }
}

/// How [`FaultControl::flap_with`] takes the link down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlapMode {
    /// Reset every live connection and refuse new ones while down.
    Reset,
    /// Black-hole while down (connections survive, silent).
    Blackhole,
}

/// A running [`FaultControl::flap`]. Dropping it stops the flapping and leaves the link up.
#[derive(Debug)]
pub struct Flapper {
    control: FaultControl,
    mode: FlapMode,
    cycles: Arc<AtomicU64>,
    stopped: Arc<Mutex<bool>>,
    task: JoinHandle<()>,
}

impl Flapper {
    /// How many down periods have ended so far.
    #[must_use]
    pub fn cycles(&self) -> u64 {
        self.cycles.load(Ordering::Relaxed)
    }

    /// Stop flapping and leave the link up (the same as dropping it).
    pub fn stop(self) {}
}

impl Drop for Flapper {
    fn drop(&mut self) {
        let mut stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        *stopped = true;
        self.task.abort();
        self.control.link_up(self.mode);
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(e) => {
                // Out of descriptors and the like: try again shortly rather than spin.
                eprintln!("fault proxy: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if shared.faults.borrow().refuse {
            shared.counters.refused.fetch_add(1, Ordering::Relaxed);
            shared.counters.accepted.fetch_add(1, Ordering::Relaxed);
            reset(client);
            continue;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        // Registered before its task runs, so a reset_all() from now on reaches it; counted only
        // then, so a caller that saw `accepted` grow and calls reset_all() reaches this one too
        // (counted first, a reset could miss it and leave a client hanging in a black hole).
        shared.connections().insert(id, tx);
        shared.counters.accepted.fetch_add(1, Ordering::Relaxed);
        let task_shared = shared.clone();
        tokio::spawn(async move {
            connection(&task_shared, client, rx).await;
            task_shared.connections().remove(&id);
        });
    }
}

/// Close with RST rather than FIN.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Wait until the link is not black-holed.
async fn open(faults: &mut watch::Receiver<Faults>) {
    if faults.wait_for(|f| !f.blackhole).await.is_err() {
        // The proxy is gone; its connections are being closed.
        std::future::pending::<()>().await;
    }
}

async fn connection(shared: &Shared, client: TcpStream, mut commands: mpsc::UnboundedReceiver<Command>) {
    let _ = client.set_nodelay(true);
    // A black-holed link does not reach the upstream: dial once it is lifted.
    let dial = async {
        let mut faults = shared.faults.subscribe();
        open(&mut faults).await;
        TcpStream::connect(shared.upstream).await
    };
    let command = tokio::select! {
        upstream = dial => match upstream {
            Ok(upstream) => return forward(shared, client, upstream, &mut commands).await,
            Err(_) => {
                shared.counters.upstream_failures.fetch_add(1, Ordering::Relaxed);
                reset(client);
                return;
            }
        },
        command = commands.recv() => command,
    };
    obey(shared, command, Some(client), None, &mut commands).await;
}

async fn forward(
    shared: &Shared,
    mut client: TcpStream,
    mut upstream: TcpStream,
    commands: &mut mpsc::UnboundedReceiver<Command>,
) {
    let _ = upstream.set_nodelay(true);
    let command = {
        let (client_read, client_write) = client.split();
        let (upstream_read, upstream_write) = upstream.split();
        let both = async {
            tokio::try_join!(
                pump(shared, client_read, upstream_write, Direction::ToUpstream),
                pump(shared, upstream_read, client_write, Direction::ToClient),
            )
        };
        tokio::select! {
            done = both => match done {
                // Both sides closed (FIN each way): close normally.
                Ok(_) => return,
                // One endpoint failed: the other one is reset.
                Err(_) => Some(Command::Reset),
            },
            command = commands.recv() => command,
        }
    };
    obey(shared, command, Some(client), Some(upstream), commands).await;
}

/// Carry out `command` on what is left of a connection (`None`: the proxy is gone).
async fn obey(
    shared: &Shared,
    command: Option<Command>,
    client: Option<TcpStream>,
    upstream: Option<TcpStream>,
    commands: &mut mpsc::UnboundedReceiver<Command>,
) {
    let keep = match command {
        None => return,
        Some(Command::Reset) => {
            shared.counters.resets.fetch_add(1, Ordering::Relaxed);
            client.into_iter().chain(upstream).for_each(reset);
            return;
        }
        Some(Command::HalfOpen(keep)) => keep,
    };
    let (kept, closed): (Vec<_>, Vec<_>) = [(Side::Client, client), (Side::Upstream, upstream)]
        .into_iter()
        .filter_map(|(side, s)| s.map(|s| (side, s)))
        .partition(|(side, _)| keep == Side::Both || keep == *side);
    drop(closed);
    if kept.is_empty() {
        return;
    }
    shared.counters.half_open.fetch_add(1, Ordering::Relaxed);
    // Hold the kept side(s), silent, until reset or the proxy goes.
    let reset_later = loop {
        match commands.recv().await {
            Some(Command::HalfOpen(_)) => {}
            Some(Command::Reset) => break true,
            None => break false,
        }
    };
    shared.counters.half_open.fetch_sub(1, Ordering::Relaxed);
    if reset_later {
        shared.counters.resets.fetch_add(1, Ordering::Relaxed);
        kept.into_iter().for_each(|(_, s)| reset(s));
    }
}

/// Forward one direction until `from` says EOF (then half-close `to`) or either side fails.
/// The reading half stamps each chunk with when it is due; the writing half waits for that,
/// then for the bandwidth limit, so latency does not cap throughput and order is kept.
async fn pump(shared: &Shared, mut from: ReadHalf<'_>, mut to: WriteHalf<'_>, dir: Direction) -> io::Result<()> {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let mut read_faults = shared.faults.subscribe();
    let mut write_faults = shared.faults.subscribe();
    let reader = async move {
        loop {
            open(&mut read_faults).await;
            let mut buf = vec![0; CHUNK];
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, io::Error>(());
            }
            buf.truncate(n);
            let latency = read_faults.borrow().latency(dir);
            if tx.send((Instant::now() + latency, buf)).await.is_err() {
                return Ok(());
            }
        }
    };
    let writer = async move {
        let mut next_free = Instant::now();
        while let Some((due, buf)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            let mut rest = &buf[..];
            while !rest.is_empty() {
                open(&mut write_faults).await;
                let limit = write_faults.borrow().bandwidth(dir);
                let n = match limit {
                    None => rest.len(),
                    Some(rate) => {
                        let piece = usize::try_from((rate / PIECES_PER_SECOND).max(1)).unwrap_or(CHUNK).min(CHUNK);
                        let n = rest.len().min(piece);
                        next_free = next_free.max(Instant::now()) + Duration::from_secs_f64(n as f64 / rate as f64);
                        tokio::time::sleep_until(next_free).await;
                        n
                    }
                };
                to.write_all(&rest[..n]).await?;
                shared.count_bytes(dir, n);
                rest = &rest[n..];
            }
        }
        to.shutdown().await
    };
    tokio::try_join!(reader, writer).map(|_| ())
}
