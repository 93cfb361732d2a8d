//! The principal's TLS for native mTLS.
//!
//! The client-certificate verifier *allows* clients without a certificate but verifies every
//! chain that is presented against the configured CA. A chain from another CA fails the
//! handshake; a missing certificate reaches the auth layer, which can then answer
//! `Unauthenticated` with "no client certificate" instead of a bare TLS alert.
//!
//! [`TlsIncoming`] accepts TCP connections and runs handshakes concurrently, each with a timeout,
//! for tonic's `serve_with_incoming`. Each handshake uses the configuration current when its
//! connection was accepted ([`TlsIncoming::reloading`]), so a reloaded certificate or CA reaches
//! the next connection while established ones (and their streams) carry on; tonic then puts the peer certificates into every request's
//! extensions (`TlsConnectInfo`), where [`crate::TransportIdentity::from_extensions`] reads them.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::Stream;

/// How long a TLS handshake may take before the connection is dropped.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepted connections waiting for tonic.
const ACCEPTED_BACKLOG: usize = 64;

/// What the principal's TLS server needs.
#[derive(Debug)]
pub struct ServerTlsSettings {
    /// The server certificate chain, leaf first.
    pub cert_chain: Vec<CertificateDer<'static>>,
    /// The server key.
    pub key: PrivateKeyDer<'static>,
    /// CA certificates that issue agent client certificates; `None` requests no client
    /// certificate (no `mtls` authentication possible then).
    pub client_ca: Option<Vec<CertificateDer<'static>>>,
    /// With `client_ca`: refuse the handshake of a client without a certificate that chains to
    /// it (`--require-client-certs`); otherwise such a client reaches the auth layer, which
    /// decides.
    pub require_client_cert: bool,
    /// TLS versions and cipher suites (upstream's principal default: TLS 1.3 only).
    pub policy: crate::tls_policy::TlsPolicy,
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A client CA certificate was refused.
    #[error("client CA certificate {index} cannot be used as a trust anchor: {source}")]
    BadClientCa {
        /// Its position in the list.
        index: usize,
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
    /// The client CA list is empty.
    #[error(
        "no client CA certificate: agents' certificates cannot be verified (check --root-ca-path or secret argocd-agent-ca)"
    )]
    NoClientCa,
    /// The client verifier could not be built.
    #[error("cannot build the client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The versions or cipher suites cannot be used.
    #[error(transparent)]
    Policy(#[from] crate::tls_policy::TlsPolicyError),
    /// The server certificate or key was refused.
    #[error("server certificate or key refused: {0}")]
    ServerCertificate(#[source] rustls::Error),
}

/// A rustls server configuration for the principal: ring provider, ALPN `h2`, and a client
/// verifier that verifies presented chains against `client_ca` but lets clients without a
/// certificate through to the auth layer.
///
/// # Errors
///
/// [`TlsError`] for unusable CA certificates, server certificate or key.
pub fn server_config(settings: ServerTlsSettings) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = settings.policy.provider()?;
    let versions = settings.policy.versions()?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(TlsError::ServerCertificate)?;
    let builder = match settings.client_ca {
        None => builder.with_no_client_auth(),
        Some(cas) => {
            if cas.is_empty() {
                return Err(TlsError::NoClientCa);
            }
            let mut roots = RootCertStore::empty();
            for (index, ca) in cas.into_iter().enumerate() {
                roots.add(ca).map_err(|source| TlsError::BadClientCa { index, source })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if settings.require_client_cert {
                verifier.build()?
            } else {
                verifier.allow_unauthenticated().build()?
            };
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config =
        builder.with_single_cert(settings.cert_chain, settings.key).map_err(TlsError::ServerCertificate)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// TLS connections for tonic's `Server::serve_with_incoming`: accepts on `listener`, handshakes
/// concurrently in the background, and yields finished connections. Failed or timed-out
/// handshakes are logged and dropped. Dropping the stream stops accepting and aborts pending
/// handshakes.
#[derive(Debug)]
pub struct TlsIncoming {
    accepted: mpsc::Receiver<io::Result<TlsStream<TcpStream>>>,
    acceptor: JoinHandle<()>,
}

impl TlsIncoming {
    /// Serves `config` on `listener` with [`DEFAULT_HANDSHAKE_TIMEOUT`].
    #[must_use]
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> Self {
        Self::with_handshake_timeout(listener, config, DEFAULT_HANDSHAKE_TIMEOUT)
    }

    /// Serves `config` on `listener`, giving each handshake `timeout`.
    #[must_use]
    pub fn with_handshake_timeout(listener: TcpListener, config: Arc<ServerConfig>, timeout: Duration) -> Self {
        // The sender goes at once; the receiver keeps the one value.
        Self::reloading_with_timeout(listener, watch::channel(config).1, timeout)
    }

    /// Serves on `listener` whatever configuration `config` holds when a connection is
    /// accepted, with [`DEFAULT_HANDSHAKE_TIMEOUT`].
    #[must_use]
    pub fn reloading(listener: TcpListener, config: watch::Receiver<Arc<ServerConfig>>) -> Self {
        Self::reloading_with_timeout(listener, config, DEFAULT_HANDSHAKE_TIMEOUT)
    }

    fn reloading_with_timeout(
        listener: TcpListener,
        config: watch::Receiver<Arc<ServerConfig>>,
        timeout: Duration,
    ) -> Self {
        let (tx, accepted) = mpsc::channel(ACCEPTED_BACKLOG);
        let acceptor = tokio::spawn(accept_loop(listener, config, timeout, tx));
        Self { accepted, acceptor }
    }
}

impl Stream for TlsIncoming {
    type Item = io::Result<TlsStream<TcpStream>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.accepted.poll_recv(cx)
    }
}

impl Drop for TlsIncoming {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    config: watch::Receiver<Arc<ServerConfig>>,
    timeout: Duration,
    tx: mpsc::Sender<io::Result<TlsStream<TcpStream>>>,
) {
    // Handshakes live in the set, so aborting this task aborts them too.
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, remote)) => {
                    if let Err(error) = tcp.set_nodelay(true) {
                        tracing::debug!(%remote, %error, "cannot set TCP_NODELAY");
                    }
                    let acceptor = TlsAcceptor::from(config.borrow().clone());
                    let tx = tx.clone();
                    handshakes.spawn(async move {
                        match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                            Ok(Ok(tls)) => {
                                // The receiver is gone only when the server stopped.
                                let _ = tx.send(Ok(tls)).await;
                            }
                            Ok(Err(error)) => tracing::info!(%remote, %error, "TLS handshake failed"),
                            Err(_) => tracing::info!(%remote, ?timeout, "TLS handshake timed out"),
                        }
                    });
                }
                Err(error) => {
                    // Per-connection errors (reset before accept, fd limits) must not stop the
                    // server; back off briefly so a persistent one does not spin.
                    tracing::warn!(%error, "accepting a TCP connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            () = tx.closed() => return,
        }
    }
}
