//! Bounds on every listener the principal (and the agent, for its metrics and health ports)
//! opens: how many connections it holds, how long a TLS handshake, a request's headers, an
//! idle connection and an unanswered HTTP/2 PING may take.
//!
//! Why: every connection costs a file descriptor, and the process has one limit
//! (`RLIMIT_NOFILE`) for all of them. Without bounds, TLS connections to the resource proxy that
//! send the HTTP/2 preface and go silent were held forever (hyper has a header timeout for
//! HTTP/1.1 only), and enough of them would leave no descriptor for an agent's connection.
//! So each listener gets:
//!
//! * a **cap** ([`Gate`]) on the connections it holds, far below the descriptor limit and
//!   separate per listener ([`cap`] gives each listener its share of the limit), so hostile
//!   connections on the proxy ports cannot take what the agents' listener needs; a connection
//!   over the cap is closed at once, never queued;
//! * a smaller **pre-authentication budget** within the cap: connections in their TLS
//!   handshake, and on listeners that need a client certificate, connections that presented
//!   none, hold one of [`ListenerLimits::max_unauthenticated`] permits as long as they live;
//! * **timeouts** ([`Timeouts`]): the TLS handshake, the first request (HTTP) or the whole life
//!   of a connection that cannot authenticate, idleness (no request open, or for byte streams no
//!   byte either way), and HTTP/2 keepalive (a PING every interval, the connection closed when one
//!   is not answered in time) so dead peers go.
//!
//! The pieces: [`Gate`] and [`Admission`] (the cap), [`Gated`] (a connection holding its
//! admission, with an optional deadline that fails its reads and writes), [`Incoming`] (a gated
//! stream of connections for tonic), and [`serve_http`] (one hyper connection with the timeouts
//! and the idle rule, for the resource proxy and the metrics and health ports).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

pub use crate::config::Keepalive;

/// How long a TLS handshake may take (`--handshake-timeout`).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send its first request's headers (`--header-read-timeout`;
/// upstream's resource proxy: 5 s).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection may stay without a request open (HTTP) or without a byte either way
/// (the Redis proxy) before it is closed (`--idle-timeout`).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Connections of the resource proxy and of the Redis proxy, each (`--proxy-max-connections`).
pub const DEFAULT_PROXY_MAX_CONNECTIONS: usize = 1024;
/// Connections of the metrics, health and HA admin endpoints, each.
pub const DEFAULT_ENDPOINT_MAX_CONNECTIONS: usize = 64;
/// Descriptors left to the process itself (files, the hub's API server, logs) before any
/// listener's share of the limit is counted.
pub const RESERVED_FDS: u64 = 64;
/// Descriptors assumed when the limit cannot be read (not Linux): the usual soft limit.
const FALLBACK_FD_LIMIT: u64 = 1024;

/// The timeouts of a listener's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// The TLS handshake.
    pub handshake: Duration,
    /// HTTP: the first request's headers (and each HTTP/1.1 request's); a connection that
    /// needs a client certificate and has none lives this long at most.
    pub header: Duration,
    /// HTTP: no request open; byte streams: no byte either way.
    pub idle: Duration,
    /// HTTP/2 PINGs.
    pub keepalive: Keepalive,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            handshake: DEFAULT_HANDSHAKE_TIMEOUT,
            header: DEFAULT_HEADER_TIMEOUT,
            idle: DEFAULT_IDLE_TIMEOUT,
            keepalive: Keepalive::default(),
        }
    }
}

/// One listener's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections held at once; more are closed as they come.
    pub max_connections: usize,
    /// Of those, connections not authenticated yet (in their handshake, or without the client
    /// certificate the listener needs).
    pub max_unauthenticated: usize,
    /// The timeouts.
    pub timeouts: Timeouts,
}

impl ListenerLimits {
    /// `max_connections` with a quarter of them (at least one) for unauthenticated ones.
    #[must_use]
    pub fn new(max_connections: usize, timeouts: Timeouts) -> Self {
        let max_connections = max_connections.max(1);
        Self { max_connections, max_unauthenticated: (max_connections / 4).max(1), timeouts }
    }

    /// The default bounds of `listener` under this process's descriptor limit.
    #[must_use]
    pub fn of(listener: Listener, timeouts: Timeouts) -> Self {
        Self::new(cap(listener, None, open_file_limit()), timeouts)
    }
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self::of(Listener::ResourceProxy, Timeouts::default())
    }
}

/// The listeners, each with its share of the descriptor limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// The agents' gRPC listener: half the descriptors.
    Agents,
    /// The resource proxy: an eighth.
    ResourceProxy,
    /// The Redis proxy: a sixteenth (each connection also holds one to the hub's Redis).
    RedisProxy,
    /// The metrics or the health endpoint, the HA admin endpoint: a sixty-fourth each.
    Endpoint,
}

impl Listener {
    /// The divisor of the descriptor budget this listener may hold.
    fn share(self) -> u64 {
        match self {
            Self::Agents => 2,
            Self::ResourceProxy => 8,
            Self::RedisProxy => 16,
            Self::Endpoint => 64,
        }
    }

    fn default_cap(self) -> usize {
        match self {
            Self::Agents => usize::MAX,
            Self::ResourceProxy | Self::RedisProxy => DEFAULT_PROXY_MAX_CONNECTIONS,
            Self::Endpoint => DEFAULT_ENDPOINT_MAX_CONNECTIONS,
        }
    }
}

/// The connection cap of `listener`: `requested` (its default when `None` or 0), but never more
/// than its share of `fd_limit` less [`RESERVED_FDS`], so that all listeners full at once still
/// leave a quarter of the descriptors to the process. A request above the share is lowered, with
/// a warning naming the limit.
#[must_use]
pub fn cap(listener: Listener, requested: Option<usize>, fd_limit: Option<u64>) -> usize {
    let budget = fd_limit.unwrap_or(FALLBACK_FD_LIMIT).saturating_sub(RESERVED_FDS).max(RESERVED_FDS);
    let share = usize::try_from(budget / listener.share()).unwrap_or(usize::MAX).clamp(4, Semaphore::MAX_PERMITS);
    let wanted = requested.filter(|n| *n > 0);
    let cap = wanted.unwrap_or(listener.default_cap()).min(share);
    if let Some(n) = wanted.filter(|n| *n > share) {
        tracing::warn!(
            ?listener,
            requested = n,
            cap,
            fd_limit = fd_limit.unwrap_or(FALLBACK_FD_LIMIT),
            "connection cap lowered to this listener's share of the open-file limit (RLIMIT_NOFILE); raise the limit \
             (ulimit -n) for more"
        );
    }
    cap
}

/// This process's soft limit of open files, from `/proc/self/limits` (`None` where there is no
/// such file).
#[must_use]
pub fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_file_limit(&limits)
}

fn parse_open_file_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line.trim_start_matches("Max open files").split_whitespace().next()?;
    if soft == "unlimited" { Some(u64::MAX) } else { soft.parse().ok() }
}

/// The cap of one listener: admits a connection while it holds fewer than its
/// [`ListenerLimits::max_connections`] (and fewer unauthenticated ones than
/// [`ListenerLimits::max_unauthenticated`]).
#[derive(Clone, Debug)]
pub struct Gate {
    inner: Arc<GateInner>,
}

#[derive(Debug)]
struct GateInner {
    listener: &'static str,
    all: Arc<Semaphore>,
    unauthenticated: Arc<Semaphore>,
    limits: ListenerLimits,
    refused: AtomicU64,
    warned: Mutex<Option<Instant>>,
}

/// Refusals are logged at most this often per listener.
const WARN_EVERY: Duration = Duration::from_secs(10);

impl Gate {
    /// The gate of listener `listener` (named in logs).
    #[must_use]
    pub fn new(listener: &'static str, limits: ListenerLimits) -> Self {
        let all = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
        let unauthenticated = limits.max_unauthenticated.clamp(1, all);
        Self {
            inner: Arc::new(GateInner {
                listener,
                all: Arc::new(Semaphore::new(all)),
                unauthenticated: Arc::new(Semaphore::new(unauthenticated)),
                limits,
                refused: AtomicU64::new(0),
                warned: Mutex::new(None),
            }),
        }
    }

    /// The bounds this gate applies.
    #[must_use]
    pub fn limits(&self) -> &ListenerLimits {
        &self.inner.limits
    }

    /// A new connection's admission (unauthenticated), or `None` when the listener is full: the
    /// caller closes the connection.
    #[must_use]
    pub fn admit(&self) -> Option<Admission> {
        let inner = &self.inner;
        let admitted = inner.all.clone().try_acquire_owned().ok().and_then(|all| {
            let pending = inner.unauthenticated.clone().try_acquire_owned().ok()?;
            Some(Admission { _all: all, unauthenticated: Some(pending) })
        });
        if admitted.is_none() {
            let refused = inner.refused.fetch_add(1, Ordering::Relaxed) + 1;
            let mut warned = inner.warned.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                *warned = Some(Instant::now());
                tracing::warn!(
                    listener = inner.listener,
                    refused_total = refused,
                    open = inner.limits.max_connections.saturating_sub(inner.all.available_permits()),
                    max_connections = inner.limits.max_connections,
                    unauthenticated =
                        inner.limits.max_unauthenticated.saturating_sub(inner.unauthenticated.available_permits()),
                    max_unauthenticated = inner.limits.max_unauthenticated,
                    "connection refused: the listener holds as many connections as it may"
                );
            }
        }
        admitted
    }

    /// Connections refused so far.
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }
}

/// A connection's place under its listener's cap, given back when dropped.
#[derive(Debug)]
pub struct Admission {
    _all: OwnedSemaphorePermit,
    unauthenticated: Option<OwnedSemaphorePermit>,
}

impl Admission {
    /// The connection authenticated (a verified client certificate, or a listener that needs
    /// none after its handshake): it no longer counts against the unauthenticated budget.
    pub fn authenticated(&mut self) {
        self.unauthenticated = None;
    }

    /// Whether it still counts as unauthenticated.
    #[must_use]
    pub fn is_authenticated(&self) -> bool {
        self.unauthenticated.is_none()
    }
}

/// A connection holding its [`Admission`] for as long as it lives (through an HTTP upgrade
/// too), with an optional deadline after which its reads and writes fail (`TimedOut`), so
/// whatever serves it lets it go.
#[derive(Debug)]
pub struct Gated<IO> {
    io: IO,
    _admission: Admission,
    expiry: Option<Expiry>,
}

#[derive(Debug)]
struct Expiry {
    sleep: Pin<Box<Sleep>>,
    /// `Some`: the deadline moves this far past every byte read or written; `None`: fixed.
    idle: Option<Duration>,
}

impl<IO> Gated<IO> {
    /// `io` under `admission`, without a deadline.
    #[must_use]
    pub fn new(io: IO, admission: Admission) -> Self {
        Self { io, _admission: admission, expiry: None }
    }

    /// Fails reads and writes once no byte has moved either way for `idle`.
    #[must_use]
    pub fn idle_after(mut self, idle: Duration) -> Self {
        self.expiry = Some(Expiry { sleep: Box::pin(tokio::time::sleep(idle)), idle: Some(idle) });
        self
    }

    /// Fails reads and writes `lifetime` from now, whatever moves.
    #[must_use]
    pub fn lives_for(mut self, lifetime: Duration) -> Self {
        self.expiry = Some(Expiry { sleep: Box::pin(tokio::time::sleep(lifetime)), idle: None });
        self
    }

    /// The connection.
    #[must_use]
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Whether the deadline has passed; reads register for it (a connection's reader is what
    /// waits on it, so only reads poll the timer: a write would take its wakeup away).
    fn expired(&mut self, cx: Option<&mut Context<'_>>) -> bool {
        let Some(expiry) = self.expiry.as_mut() else { return false };
        match cx {
            Some(cx) => expiry.sleep.as_mut().poll(cx).is_ready(),
            None => expiry.sleep.deadline() <= Instant::now(),
        }
    }

    fn touch(&mut self) {
        if let Some(Expiry { sleep, idle: Some(idle) }) = &mut self.expiry {
            sleep.as_mut().reset(Instant::now() + *idle);
        }
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection closed: idle or unauthenticated for too long")
}

impl<IO: AsyncRead + Unpin> AsyncRead for Gated<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.expired(Some(cx)) {
            return Poll::Ready(Err(timed_out()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Gated<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        if self.expired(None) {
            return Poll::Ready(Err(timed_out()));
        }
        let polled = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.expired(None) {
            return Poll::Ready(Err(timed_out()));
        }
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Gated<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// Gated connections for tonic's `serve_with_incoming`: accepted under a [`Gate`], handshaken
/// (TLS) concurrently in the background within the handshake timeout, then yielded. Dropping it
/// stops accepting and aborts the handshakes in progress.
#[derive(Debug)]
pub struct Incoming<IO> {
    accepted: mpsc::Receiver<io::Result<Gated<IO>>>,
    cancel: CancellationToken,
    acceptor: JoinHandle<()>,
}

impl<IO> futures::Stream for Incoming<IO> {
    type Item = io::Result<Gated<IO>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.accepted.poll_recv(cx)
    }
}

impl<IO> Drop for Incoming<IO> {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.acceptor.abort();
    }
}

/// Connections handed over but not yet taken by the server.
const ACCEPTED_BACKLOG: usize = 64;

/// TLS connections on `listener` (the configuration `tls` holds when each is accepted) under
/// `limits`. With `certificate_required` (the listener's authentication needs a client
/// certificate), a connection that presented none stays unauthenticated and lives at most the
/// header timeout: it can only be refused.
#[must_use]
pub fn tls_incoming(
    listener: TcpListener,
    tls: watch::Receiver<Arc<rustls::ServerConfig>>,
    name: &'static str,
    limits: ListenerLimits,
    certificate_required: bool,
) -> Incoming<tokio_rustls::server::TlsStream<TcpStream>> {
    incoming(listener, name, limits, move |tcp, remote, mut admission| {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.borrow().clone());
        async move {
            let tls = super::accept::tls_handshake(acceptor, tcp, limits.timeouts.handshake, remote, name).await?;
            let has_cert = tls.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
            if has_cert || !certificate_required {
                admission.authenticated();
                Some(Gated::new(tls, admission))
            } else {
                Some(Gated::new(tls, admission).lives_for(limits.timeouts.header))
            }
        }
    })
}

/// Plaintext connections on `listener` under `limits` (behind a sidecar on loopback: the cap
/// only).
#[must_use]
pub fn tcp_incoming(listener: TcpListener, name: &'static str, limits: ListenerLimits) -> Incoming<TcpStream> {
    incoming(listener, name, limits, |tcp, _remote, mut admission| {
        admission.authenticated();
        std::future::ready(Some(Gated::new(tcp, admission)))
    })
}

fn incoming<IO, F, Fut>(
    listener: TcpListener,
    name: &'static str,
    limits: ListenerLimits,
    mut prepare: F,
) -> Incoming<IO>
where
    IO: Send + 'static,
    F: FnMut(TcpStream, std::net::SocketAddr, Admission) -> Fut + Send + 'static,
    Fut: Future<Output = Option<Gated<IO>>> + Send + 'static,
{
    let (tx, accepted) = mpsc::channel(ACCEPTED_BACKLOG);
    let cancel = CancellationToken::new();
    let gate = Gate::new(name, limits);
    let acceptor = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            let mut pending = super::accept::until_cancelled(
                &listener,
                &cancel,
                name,
                || gate.admit(),
                |tcp, remote, admission| {
                    let prepared = prepare(tcp, remote, admission);
                    let tx = tx.clone();
                    async move {
                        if let Some(io) = prepared.await {
                            // The receiver is gone only when the server stopped.
                            let _ = tx.send(Ok(io)).await;
                        }
                    }
                },
            )
            .await;
            pending.shutdown().await;
        }
    });
    Incoming { accepted, cancel, acceptor }
}

/// Requests open on one HTTP connection, and whether it has served one yet.
#[derive(Clone, Debug)]
struct Activity {
    open: Arc<watch::Sender<(usize, bool)>>,
}

/// Counts a request open until dropped (with the response's body).
#[derive(Debug)]
struct OpenRequest {
    activity: Activity,
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.activity.open.send_modify(|(open, _)| *open = open.saturating_sub(1));
    }
}

impl Activity {
    fn new() -> Self {
        Self { open: Arc::new(watch::Sender::new((0, false))) }
    }

    fn begin(&self) -> OpenRequest {
        self.open.send_modify(|(open, served)| {
            *open += 1;
            *served = true;
        });
        OpenRequest { activity: self.clone() }
    }

    /// Resolves once no request has been open for `idle` (for `first` before the first
    /// request).
    async fn idle(&self, first: Duration, idle: Duration) {
        let mut rx = self.open.subscribe();
        loop {
            let served = match rx.wait_for(|(open, _)| *open == 0).await {
                Ok(state) => state.1,
                Err(_) => return,
            };
            let after = if served { idle } else { first };
            if tokio::time::timeout(after, rx.changed()).await.is_err() {
                return;
            }
        }
    }
}

/// A response body that keeps its request counted as open until it is sent or dropped.
#[derive(Debug)]
pub struct TrackedBody<B> {
    inner: Pin<Box<B>>,
    _open: OpenRequest,
}

impl<B: http_body::Body> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// `inner` counting its requests open on `activity`.
#[derive(Clone, Debug)]
struct Tracked<S> {
    inner: S,
    activity: Activity,
}

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for Tracked<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<TrackedBody<ResBody>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let open = self.activity.begin();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let resp = answer.await?;
            Ok(resp.map(|inner| TrackedBody { inner: Box::pin(inner), _open: open }))
        })
    }
}

/// How one HTTP connection is bounded: [`Timeouts`] plus how long it may go without a request
/// open (`idle`; the header timeout before its first).
#[derive(Clone, Copy, Debug)]
pub struct HttpBounds {
    /// The timeouts (header, keepalive).
    pub timeouts: Timeouts,
    /// No request open this long: the connection is closed (gracefully).
    pub idle: Duration,
}

/// Serves one HTTP/1.1 or HTTP/2 connection (with upgrades) with `service` until it ends, is
/// idle past `bounds`, or `cancel` fires (then open requests finish first). Headers must arrive
/// within the header timeout (HTTP/1.1), HTTP/2 PINGs must be answered within the keepalive
/// timeout, and a connection without a request open for the idle time (the header timeout
/// before its first request) is shut down.
pub async fn serve_http<IO, S, ResBody>(io: IO, service: S, bounds: HttpBounds, cancel: &CancellationToken)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<Request<hyper::body::Incoming>, Response = Response<ResBody>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let activity = Activity::new();
    let service = hyper_util::service::TowerToHyperService::new(Tracked { inner: service, activity: activity.clone() });
    let timeouts = bounds.timeouts;
    let mut builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder.http1().timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(timeouts.header);
    builder
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(timeouts.keepalive.interval)
        .keep_alive_timeout(timeouts.keepalive.timeout);
    let conn = builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(io), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = activity.idle(timeouts.header, bounds.idle) => {
            tracing::debug!(idle = ?bounds.idle, "closing a connection without a request open");
            conn.as_mut().graceful_shutdown();
            // A peer that does not read our GOAWAY does not hold the connection either.
            tokio::time::timeout(timeouts.header, conn).await.unwrap_or(Ok(()))
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "HTTP connection ended with an error");
    }
}

/// Serves plaintext HTTP with `service` on `listener` (named `name` in logs) under `limits`
/// until `cancel` fires, then lets open requests finish: the metrics and health endpoints.
/// Each connection is served by [`serve_http`] with the listener's idle time.
pub async fn serve_http_listener<S, ResBody>(
    listener: TcpListener,
    name: &'static str,
    limits: ListenerLimits,
    service: S,
    cancel: CancellationToken,
) where
    S: tower::Service<Request<hyper::body::Incoming>, Response = Response<ResBody>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let gate = Gate::new(name, limits);
    let bounds = HttpBounds { timeouts: limits.timeouts, idle: limits.timeouts.idle };
    let mut connections = super::accept::until_cancelled(
        &listener,
        &cancel,
        name,
        || gate.admit(),
        |tcp, _remote, mut admission| {
            admission.authenticated();
            let (service, cancel) = (service.clone(), cancel.clone());
            async move { serve_http(Gated::new(tcp, admission), service, bounds, &cancel).await }
        },
    )
    .await;
    while connections.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_file_limit_is_read_from_proc() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63704                63704                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_open_file_limit(limits), Some(1024));
        assert_eq!(parse_open_file_limit("Max open files unlimited unlimited files"), Some(u64::MAX));
        assert_eq!(parse_open_file_limit("nothing here"), None);
        assert!(open_file_limit().is_some(), "Linux has /proc/self/limits");
    }

    #[test]
    fn caps_are_shares_of_the_limit_that_leave_room_for_the_process() {
        let limit = Some(1024);
        let agents = cap(Listener::Agents, None, limit);
        let proxy = cap(Listener::ResourceProxy, None, limit);
        let redis = cap(Listener::RedisProxy, None, limit);
        let endpoint = cap(Listener::Endpoint, None, limit);
        assert_eq!((agents, proxy, redis, endpoint), (480, 120, 60, 15));
        // Every listener full (the Redis proxy's connections two descriptors each, three
        // endpoints) still leaves descriptors for the process.
        assert!((agents + proxy + 2 * redis + 3 * endpoint) as u64 + RESERVED_FDS < 1024);
        assert_eq!(cap(Listener::ResourceProxy, None, Some(1 << 20)), DEFAULT_PROXY_MAX_CONNECTIONS);
        assert_eq!(cap(Listener::ResourceProxy, Some(10), Some(1 << 20)), 10, "a lower request is kept");
        assert_eq!(cap(Listener::ResourceProxy, Some(0), Some(1 << 20)), DEFAULT_PROXY_MAX_CONNECTIONS, "0: default");
        assert_eq!(cap(Listener::ResourceProxy, Some(100_000), limit), 120, "lowered to the share");
        assert_eq!(
            cap(Listener::Agents, None, Some(u64::MAX)),
            Semaphore::MAX_PERMITS,
            "unlimited: as many as can be counted"
        );
    }

    #[test]
    fn the_gate_refuses_past_the_cap_and_the_unauthenticated_budget() {
        let gate = Gate::new(
            "test",
            ListenerLimits { max_connections: 3, max_unauthenticated: 2, timeouts: Timeouts::default() },
        );
        let mut a = gate.admit().expect("first");
        let b = gate.admit().expect("second");
        assert!(gate.admit().is_none(), "two unauthenticated at most");
        a.authenticated();
        assert!(a.is_authenticated() && !b.is_authenticated());
        let c = gate.admit().expect("an authenticated one made room");
        assert!(gate.admit().is_none(), "three at most");
        drop(c);
        assert!(gate.admit().is_some(), "a closed one made room");
        assert_eq!(gate.refused(), 2);
    }

    /// An HTTP/2 client that sends the preface and goes silent is let go after the header
    /// timeout (hyper bounds only HTTP/1.1's headers).
    #[tokio::test]
    async fn a_silent_http2_connection_is_closed_after_the_header_timeout() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let service = tower::service_fn(|_req: Request<hyper::body::Incoming>| async {
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(Bytes::from_static(b"ok"))))
        });
        let header = Duration::from_millis(200);
        let timeouts = Timeouts { header, ..Timeouts::default() };
        let bounds = HttpBounds { timeouts, idle: Duration::from_secs(60) };
        let (server, mut client) = tokio::io::duplex(1 << 16);
        let cancel = CancellationToken::new();
        let served = tokio::spawn(async move { serve_http(server, service, bounds, &cancel).await });
        let started = Instant::now();
        client
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await
            .expect("preface");
        let mut buf = [0u8; 1024];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            while client.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        });
        closed.await.expect("closed, not held");
        let held = started.elapsed();
        assert!(held >= header, "held {held:?}, not less than the header timeout");
        served.await.expect("the connection's task ends");
    }

    #[tokio::test]
    async fn a_gated_connection_fails_once_idle_and_not_before() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let gate = Gate::new("test", ListenerLimits::new(4, Timeouts::default()));
        let idle = Duration::from_millis(300);
        let (near, mut far) = tokio::io::duplex(64);
        let mut near = Gated::new(near, gate.admit().expect("admitted")).idle_after(idle);
        let mut byte = [0u8; 1];
        for _ in 0..3 {
            // Traffic more often than the idle time keeps it open (reads and writes both).
            tokio::time::sleep(idle / 2).await;
            far.write_all(b"x").await.expect("write");
            near.read_exact(&mut byte).await.expect("a byte within the idle time");
            tokio::time::sleep(idle / 2).await;
            near.write_all(b"y").await.expect("the read moved the deadline");
        }
        let started = Instant::now();
        let err = near.read(&mut byte).await.expect_err("idle");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= idle / 2, "the last write moved the deadline too");
        assert!(near.write_all(b"z").await.is_err(), "writes fail too");
        drop(near);
        assert_eq!(gate.inner.all.available_permits(), 4, "the admission went with the connection");
    }
}
