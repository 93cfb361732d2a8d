//! How the agent reaches the principal: plaintext h2c (behind a mesh sidecar on loopback), TLS
//! configured by tonic (a CA file and a client certificate), or TLS from a rustls configuration
//! supplied by the caller (e.g. X.509-SVIDs from the SPIFFE Workload API, whose resolver presents
//! the current SVID on every handshake, so a rotation reaches the next connection), or from a
//! configuration the caller replaces as certificates are reissued ([`AgentTls::Reloading`]: each
//! new connection uses the latest one).
//!
//! Calls travel as native gRPC over HTTP/2 ([`Wire::Http2`]) or, with `--enable-websocket`, as
//! gRPC over WebSocket on HTTP/1.1 ([`Wire::WebSocket`], grpc-http1's framing, one WebSocket per
//! call): the channel then talks HTTP/2 to an in-process server that opens a WebSocket to the
//! principal for each call ([`grpcws`]). Either way callers get a tonic [`Channel`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// TLS towards the principal.
#[derive(Clone)]
pub enum AgentTls {
    /// tonic's TLS (CA certificate, client identity, domain name).
    Tonic(ClientTlsConfig),
    /// A caller-built rustls client configuration; `server_name` is the name sent in SNI and
    /// checked by the configuration's verifier (SPIFFE verifiers ignore it and check the peer's
    /// SPIFFE ID instead). ALPN `h2` is added when the configuration has no ALPN protocols.
    Rustls {
        /// The client configuration.
        config: Arc<rustls::ClientConfig>,
        /// The server name for SNI.
        server_name: String,
    },
    /// As [`Self::Rustls`], with the configuration the watch holds when a connection is made:
    /// the owner of the sender replaces it when the client certificate or CA is reissued.
    Reloading {
        /// The current client configuration.
        config: watch::Receiver<Arc<rustls::ClientConfig>>,
        /// The server name for SNI.
        server_name: String,
    },
}

impl fmt::Debug for AgentTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tonic(_) => f.write_str("AgentTls::Tonic"),
            Self::Rustls { server_name, .. } => {
                f.debug_struct("AgentTls::Rustls").field("server_name", server_name).finish_non_exhaustive()
            }
            Self::Reloading { server_name, .. } => {
                f.debug_struct("AgentTls::Reloading").field("server_name", server_name).finish_non_exhaustive()
            }
        }
    }
}

impl From<ClientTlsConfig> for AgentTls {
    fn from(config: ClientTlsConfig) -> Self {
        Self::Tonic(config)
    }
}

/// Why a channel to the principal cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The address is not a valid URI, or tonic refused the TLS settings.
    #[error("principal address {addr:?} is invalid (expected e.g. https://principal:8443): {source}")]
    BadAddress {
        /// The address.
        addr: String,
        /// The parse error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The TLS server name is not a DNS name or IP address.
    #[error("TLS server name {0:?} is not a DNS name or IP address")]
    BadServerName(String),
    /// The WebSocket transport needs TLS it drives itself.
    #[error(
        "the WebSocket transport (--enable-websocket) needs a rustls TLS configuration, not tonic's ClientTlsConfig"
    )]
    WebSocketNeedsRustls,
    /// TCP/TLS/HTTP2 connection failed.
    #[error("cannot connect to the principal at {addr}: {source}")]
    Dial {
        /// The address.
        addr: String,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
}

/// The endpoint for `addr` with the agent's user agent. With [`AgentTls::Rustls`] the connector
/// does TLS itself, and tonic refuses an `https` URI without its own TLS: the endpoint gets `http`.
fn endpoint(addr: &str, tls: Option<&AgentTls>, keepalive: Option<Duration>) -> Result<Endpoint, TransportError> {
    let bad = |source| TransportError::BadAddress { addr: addr.to_owned(), source };
    let uri = match (tls, addr.strip_prefix("https://")) {
        (Some(AgentTls::Rustls { .. } | AgentTls::Reloading { .. }), Some(rest)) => format!("http://{rest}"),
        _ => addr.to_owned(),
    };
    let endpoint = Endpoint::from_shared(uri)
        .map_err(bad)?
        .user_agent(concat!("argocd-agent/v", env!("CARGO_PKG_VERSION")))
        .map_err(bad)?;
    Ok(match keepalive {
        // HTTP/2 PINGs, also while no call is open, so a peer that vanished without closing the
        // connection (host gone, path dropped, NAT entry expired) is noticed.
        Some(interval) => endpoint
            .http2_keep_alive_interval(interval)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true),
        None => endpoint,
    })
}

/// How long an HTTP/2 PING may go unanswered before the connection is considered dead.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// What a connector needs for [`AgentTls::Rustls`] and [`AgentTls::Reloading`].
#[derive(Clone)]
struct RustlsConnector {
    config: watch::Receiver<Arc<rustls::ClientConfig>>,
    server_name: ServerName<'static>,
}

impl RustlsConnector {
    fn new(tls: &AgentTls) -> Result<Option<Self>, TransportError> {
        let (config, server_name) = match tls {
            AgentTls::Tonic(_) => return Ok(None),
            // The sender goes at once; the receiver keeps the one value.
            AgentTls::Rustls { config, server_name } => (watch::channel(config.clone()).1, server_name),
            AgentTls::Reloading { config, server_name } => (config.clone(), server_name),
        };
        let server_name = ServerName::try_from(server_name.clone())
            .map_err(|_| TransportError::BadServerName(server_name.clone()))?;
        Ok(Some(Self { config, server_name }))
    }

    /// The connector for a WebSocket connection: the current configuration offering ALPN
    /// `http/1.1` only (what the connection speaks).
    fn http1_connector(&self) -> tokio_rustls::TlsConnector {
        let mut config = (**self.config.borrow()).clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }

    /// The connector for a new connection: the current configuration, with ALPN `h2` added
    /// when it has none.
    fn connector(&self) -> tokio_rustls::TlsConnector {
        let config = self.config.borrow().clone();
        let config = if config.alpn_protocols.is_empty() {
            let mut with_alpn = (*config).clone();
            with_alpn.alpn_protocols = vec![b"h2".to_vec()];
            Arc::new(with_alpn)
        } else {
            config
        };
        tokio_rustls::TlsConnector::from(config)
    }

    fn service(
        self,
    ) -> impl tower::Service<
        Uri,
        Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
        Error = std::io::Error,
        Future = impl Future<Output = std::io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>> + Send,
    > + Clone
    + Send
    + 'static {
        tower::service_fn(move |uri: Uri| {
            let this = self.clone();
            async move {
                let host = uri.host().ok_or_else(|| std::io::Error::other(format!("{uri} has no host")))?;
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let port = uri.port_u16().unwrap_or(443);
                let tcp = TcpStream::connect((host, port)).await?;
                tcp.set_nodelay(true)?;
                let tls = this.connector().connect(this.server_name, tcp).await?;
                Ok(TokioIo::new(tls))
            }
        })
    }
}

/// How calls travel to the principal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wire {
    /// Native gRPC over HTTP/2 (h2 with TLS, h2c in plaintext).
    #[default]
    Http2,
    /// gRPC over WebSocket on HTTP/1.1 (`--enable-websocket`), framed as upstream's
    /// `golang.stackrox.io/grpc-http1` frames it: one WebSocket connection per call. For
    /// networks whose proxies pass only HTTP/1.1. HTTP/2 keepalive becomes WebSocket pings.
    WebSocket,
}

/// A channel to `addr` that connects on first use (and reconnects after failures on later
/// calls), with `tls` when given and HTTP/2 keepalive PINGs every `keepalive` when given.
///
/// # Errors
///
/// A malformed address or server name, or TLS settings tonic refuses.
pub fn lazy_channel(
    addr: &str,
    tls: Option<&AgentTls>,
    keepalive: Option<Duration>,
) -> Result<Channel, TransportError> {
    lazy_channel_over(addr, tls, keepalive, Wire::Http2)
}

/// [`lazy_channel`] over `wire`.
///
/// # Errors
///
/// As [`lazy_channel`]; [`TransportError::WebSocketNeedsRustls`] for [`Wire::WebSocket`] with
/// [`AgentTls::Tonic`].
pub fn lazy_channel_over(
    addr: &str,
    tls: Option<&AgentTls>,
    keepalive: Option<Duration>,
    wire: Wire,
) -> Result<Channel, TransportError> {
    if wire == Wire::WebSocket {
        let (endpoint, dialer) = websocket(addr, tls, keepalive)?;
        return Ok(endpoint.connect_with_connector_lazy(dialer.connector()));
    }
    let endpoint = endpoint(addr, tls, keepalive)?;
    match tls {
        None => Ok(endpoint.connect_lazy()),
        Some(AgentTls::Tonic(config)) => Ok(endpoint
            .tls_config(config.clone())
            .map_err(|source| TransportError::BadAddress { addr: addr.to_owned(), source })?
            .connect_lazy()),
        Some(tls) => match RustlsConnector::new(tls)? {
            Some(connector) => Ok(endpoint.connect_with_connector_lazy(connector.service())),
            None => Ok(endpoint.connect_lazy()),
        },
    }
}

/// Connects a channel to `addr` now, as [`lazy_channel`] configures it.
///
/// # Errors
///
/// As [`lazy_channel`], or [`TransportError::Dial`] when the connection fails.
pub async fn connect(
    addr: &str,
    tls: Option<&AgentTls>,
    keepalive: Option<Duration>,
) -> Result<Channel, TransportError> {
    connect_over(addr, tls, keepalive, Wire::Http2).await
}

/// [`connect`] over `wire`. With [`Wire::WebSocket`] the channel's connection is in-process:
/// the principal is dialled by each call, and a call that cannot reach it fails with
/// `UNAVAILABLE` naming why.
///
/// # Errors
///
/// As [`lazy_channel_over`], or [`TransportError::Dial`] when the connection fails.
pub async fn connect_over(
    addr: &str,
    tls: Option<&AgentTls>,
    keepalive: Option<Duration>,
    wire: Wire,
) -> Result<Channel, TransportError> {
    let dial = |source| TransportError::Dial { addr: addr.to_owned(), source };
    if wire == Wire::WebSocket {
        let (endpoint, dialer) = websocket(addr, tls, keepalive)?;
        return endpoint.connect_with_connector(dialer.connector()).await.map_err(dial);
    }
    let endpoint = endpoint(addr, tls, keepalive)?;
    match tls {
        None => endpoint.connect().await.map_err(dial),
        Some(AgentTls::Tonic(config)) => endpoint
            .tls_config(config.clone())
            .map_err(|source| TransportError::BadAddress { addr: addr.to_owned(), source })?
            .connect()
            .await
            .map_err(dial),
        Some(tls) => match RustlsConnector::new(tls)? {
            Some(connector) => endpoint.connect_with_connector(connector.service()).await.map_err(dial),
            None => endpoint.connect().await.map_err(dial),
        },
    }
}

// === WebSocket ===

/// How long opening one call's WebSocket (TCP, TLS, upgrade) may take.
pub const WEBSOCKET_DIAL_TIMEOUT: Duration = Duration::from_secs(30);

/// The endpoint the channel dials (in-process, so plaintext HTTP/2 without keepalive) and the
/// dialer that opens each call's WebSocket to the principal at `addr` ([`grpcws::client`]).
fn websocket(
    addr: &str,
    tls: Option<&AgentTls>,
    keepalive: Option<Duration>,
) -> Result<(Endpoint, Arc<grpcws::client::Dialer>), TransportError> {
    let bad = |source| TransportError::BadAddress { addr: addr.to_owned(), source };
    let tls = match tls {
        None => None,
        Some(AgentTls::Tonic(_)) => return Err(TransportError::WebSocketNeedsRustls),
        Some(tls) => RustlsConnector::new(tls)?,
    };
    let uri = Endpoint::from_shared(addr.to_owned()).map_err(bad)?.uri().clone();
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_owned();
    let port = uri.port_u16().unwrap_or(if tls.is_some() { 443 } else { 80 });
    let authority = uri.authority().map_or_else(|| format!("{host}:{port}"), ToString::to_string);
    let endpoint = Endpoint::from_shared(format!("http://{authority}"))
        .map_err(bad)?
        .user_agent(concat!("argocd-agent/v", env!("CARGO_PKG_VERSION")))
        .map_err(bad)?;
    let options = grpcws::bridge::ClientOptions {
        max_message_bytes: protocol::pb::MAX_MESSAGE_BYTES,
        keepalive,
        keepalive_timeout: KEEPALIVE_TIMEOUT,
    };
    let tls = tls.map(Arc::new);
    let connect: grpcws::client::Connect = Arc::new(move || {
        let (host, tls) = (host.clone(), tls.clone());
        Box::pin(async move { open(&host, port, tls.as_deref()).await })
    });
    Ok((endpoint, grpcws::client::Dialer::new(authority, options, WEBSOCKET_DIAL_TIMEOUT, connect)))
}

/// The connection one call's WebSocket runs on: TCP, and TLS offering HTTP/1.1 when configured.
async fn open(
    host: &str,
    port: u16,
    tls: Option<&RustlsConnector>,
) -> Result<Box<dyn grpcws::client::Io>, grpcws::bridge::BoxError> {
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    Ok(match tls {
        Some(tls) => Box::new(tls.http1_connector().connect(tls.server_name.clone(), tcp).await.map_err(|e| {
            if e.to_string().contains("NoApplicationProtocol") {
                format!("{e} (the principal does not offer HTTP/1.1: does it run with --enable-websocket?)").into()
            } else {
                grpcws::bridge::BoxError::from(e)
            }
        })?),
        None => Box::new(tcp),
    })
}
