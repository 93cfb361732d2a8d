//! The Redis proxy (upstream §5.2): the hub's Argo CD server points its Redis client here
//! instead of at the hub's Redis, and reads the live state of agents' Applications (resource
//! trees, managed resources, their change notifications) from the agents' own Redis.
//!
//! Each client connection gets its own connection to the hub's Redis ([`connection`]).
//! `GET` and `SUBSCRIBE` of an agent's Application keys ([`route`]) become `redis-request`
//! events in that agent's mailbox ([`ask`]); the agent reads its own Redis and answers, or
//! pushes a `redis-response` for each message on a subscribed channel ([`exchange`]).
//! Everything else is forwarded to the hub's Redis byte for byte, and its replies come back
//! byte for byte, in the order of the commands.
//!
//! Among principal replicas (`--agent-leases`), a `GET` or `SUBSCRIBE` for an agent another
//! replica owns is read at that replica ([`forward`]), through its replica-only endpoints on
//! the resource-proxy listener ([`replica`]); what either side asks of the agent is in [`read`].
//!
//! Better than upstream where upstream falls short (§10 item 15): a miss is Redis's null, not
//! an empty error; command names match in any case; replies stay in command order when agent
//! answers and hub replies interleave; a failed `GET` gets an error reply naming the cause (the
//! connection stays usable) instead of a closed connection; an agent that disconnects fails its
//! requests at once and closes the connections subscribed through it (go-redis reconnects and
//! subscribes again); requests per agent are bounded; an agent can only answer its own
//! requests and push on channels subscribed through it; the listen address is configured; an
//! autonomous agent's resource trees get their Application namespaces rewritten (upstream
//! #1048).

mod ask;
mod connection;
mod exchange;
mod forward;
mod read;
pub(crate) mod replica;
mod route;
mod tls;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub(crate) use exchange::Exchange;
pub use tls::{UpstreamTls, UpstreamTlsError};

use crate::proxy::replica::ReplicaForwarding;
use crate::sync::hub::Hub;

/// The Redis proxy's upstream, limits and timing.
#[derive(Clone, Debug)]
pub struct RedisProxyConfig {
    /// `host:port` of the hub's Redis (`--redis-server-address`, upstream default
    /// `argocd-redis:6379`).
    pub upstream: String,
    /// TLS to the hub's Redis; `None`: plaintext.
    pub upstream_tls: Option<UpstreamTls>,
    /// How long a request waits for its agent's answer before the client gets an error.
    /// (Argo CD's go-redis gives up after its own 3 s read timeout and reconnects.)
    pub request_timeout: Duration,
    /// Redis requests of one agent in flight at once; more get an error reply.
    pub max_in_flight_per_agent: usize,
    /// Longest a connection to the hub's Redis may take.
    pub dial_timeout: Duration,
    /// How often an agent holding a connection's subscriptions is pinged (upstream: 1 min).
    pub ping_interval: Duration,
    /// How many client connections it holds, their TLS handshake time, and how long one may go
    /// without a byte either way ([`crate::transport::limits`]).
    pub connections: crate::transport::limits::ListenerLimits,
    /// Bounds on one frame, either way: an authenticated client's commands and the hub's
    /// replies (default: frames of at most 128 MiB, see `DEFAULT_MAX_FRAME_BYTES`). A client that has
    /// not authenticated gets Redis's own tighter bounds
    /// ([`protocol::resp::Limits::unauthenticated`]).
    pub limits: protocol::resp::Limits,
    /// Commands of one connection unanswered at once; then its commands are not read until
    /// replies go out.
    pub max_pipeline: usize,
    /// Largest resource tree (decompressed) the namespace rewrite reads; a larger one passes
    /// unchanged.
    pub max_tree_bytes: usize,
}

/// The largest frame by default, 128 MiB: a quarter of Redis's own `proto-max-bulk-len`, and
/// several times the largest value Argo CD's server reads or writes (gzip'd resource trees
/// and managed resources, tens of MiB at most: what they are made of comes from the
/// repo-server in gRPC messages of at most 200 MB, and gzip shrinks such JSON several times).
const DEFAULT_MAX_FRAME_BYTES: usize = 128 << 20;

impl RedisProxyConfig {
    /// The defaults, for the hub's Redis at `upstream` (plaintext).
    #[must_use]
    pub fn new(upstream: impl Into<String>) -> Self {
        Self {
            upstream: upstream.into(),
            upstream_tls: None,
            request_timeout: Duration::from_secs(30),
            max_in_flight_per_agent: 64,
            dial_timeout: Duration::from_secs(10),
            ping_interval: Duration::from_secs(60),
            connections: crate::transport::limits::ListenerLimits::of(
                crate::transport::limits::Listener::RedisProxy,
                crate::transport::limits::Timeouts::default(),
            ),
            limits: protocol::resp::Limits { max_frame_bytes: DEFAULT_MAX_FRAME_BYTES, ..Default::default() },
            max_pipeline: 256,
            max_tree_bytes: 64 << 20,
        }
    }
}

/// A connection to the hub's Redis, plaintext or TLS.
trait Upstream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Upstream for T {}

/// The Redis proxy of one principal.
#[derive(Clone, Debug)]
pub struct RedisProxy {
    hub: Arc<Hub>,
    exchange: Arc<Exchange>,
    config: Arc<RedisProxyConfig>,
    /// How to reach the replica that owns an agent whose stream this one does not hold: the
    /// resource proxy's forwarding (`--agent-leases` with the replica client certificate), set
    /// when the resource proxy is built; unset, such reads fail naming the owner.
    replicas: Arc<OnceLock<ReplicaForwarding>>,
    /// Idle connections to other replicas, for forwarded `GET`s.
    pool: Arc<forward::Pool>,
}

impl RedisProxy {
    pub(crate) fn new(
        hub: Arc<Hub>,
        exchange: Arc<Exchange>,
        config: RedisProxyConfig,
        replicas: Arc<OnceLock<ReplicaForwarding>>,
    ) -> Self {
        Self { hub, exchange, config: Arc::new(config), replicas, pool: Arc::default() }
    }

    /// Serves RESP on `listener`, in TLS when `tls` is given (its configuration re-read for
    /// every handshake), until `cancel` fires; then open connections close.
    ///
    /// Connections are bounded by [`RedisProxyConfig::connections`]: at most so many at once
    /// (more are closed as they come), a quarter of them in their TLS handshake, which must end
    /// within the handshake timeout; a connection with no byte either way for the idle time is
    /// closed (go-redis pings a subscribed connection every few seconds, and redials a pooled one
    /// it finds closed).
    pub async fn serve(
        self,
        listener: TcpListener,
        tls: Option<tokio::sync::watch::Receiver<Arc<rustls::ServerConfig>>>,
        cancel: CancellationToken,
    ) {
        use crate::transport::limits::{Gate, Gated};
        let limits = self.config.connections;
        let gate = Gate::new("Redis proxy", limits);
        let mut connections = crate::transport::accept::until_cancelled(
            &listener,
            &cancel,
            "Redis proxy",
            || gate.admit(),
            |tcp, remote, mut admission| {
                let proxy = self.clone();
                let cancel = cancel.clone();
                let acceptor = tls.as_ref().map(|t| tokio_rustls::TlsAcceptor::from(t.borrow().clone()));
                async move {
                    let idle = limits.timeouts.idle;
                    match acceptor {
                        None => {
                            admission.authenticated();
                            connection::serve(proxy, Gated::new(tcp, admission).idle_after(idle), cancel).await;
                        }
                        Some(acceptor) => {
                            let timeout = limits.timeouts.handshake;
                            if let Some(stream) =
                                crate::transport::accept::tls_handshake(acceptor, tcp, timeout, remote, "Redis proxy")
                                    .await
                            {
                                admission.authenticated();
                                let stream = Gated::new(stream, admission).idle_after(idle);
                                connection::serve(proxy, stream, cancel).await;
                            }
                        }
                    }
                }
            },
        )
        .await;
        connections.shutdown().await;
    }

    /// A new connection to the hub's Redis.
    async fn dial(&self) -> std::io::Result<Box<dyn Upstream>> {
        let addr = self.config.upstream.as_str();
        let tcp = tokio::time::timeout(self.config.dial_timeout, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connecting timed out"))??;
        let _ = tcp.set_nodelay(true);
        match &self.config.upstream_tls {
            None => Ok(Box::new(tcp)),
            Some(tls) => {
                let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
                let stream = tokio::time::timeout(self.config.dial_timeout, tls.connect(host, tcp))
                    .await
                    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "the TLS handshake timed out"))??;
                Ok(Box::new(stream))
            }
        }
    }
}
