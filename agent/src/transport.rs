//! How the agent reaches the principal: plaintext h2c (behind a mesh sidecar on loopback), TLS
//! configured by tonic (a CA file and a client certificate), or TLS from a rustls configuration
//! supplied by the caller (e.g. X.509-SVIDs from the SPIFFE Workload API, whose resolver presents
//! the current SVID on every handshake, so a rotation reaches the next connection), or from a
//! configuration the caller replaces as certificates are reissued ([`AgentTls::Reloading`]: each
//! new connection uses the latest one).

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
    let endpoint = endpoint(addr, tls, keepalive)?;
    let dial = |source| TransportError::Dial { addr: addr.to_owned(), source };
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
