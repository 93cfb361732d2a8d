//! The client's side (the agent with `--enable-websocket`): a tonic channel dials [`Dialer::connector`],
//! which serves HTTP/2 in process; each call it carries opens its own WebSocket to the server
//! ([`bridge::handshake`]) over a connection the caller opens ([`Connect`]: TCP, TLS, whatever
//! the caller's transport is) and is forwarded on it ([`bridge::forward`]). Callers keep their
//! tonic clients, interceptors and limits as they are.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream};

use crate::bridge::{self, BoxError, ClientOptions};

/// Bytes buffered each way between the channel and the in-process server.
const LOCAL_BUFFER: usize = 64 << 10;

/// A connection to the server, TLS or not.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// Opens the connection one call's WebSocket runs on.
pub type Connect = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Box<dyn Io>, BoxError>> + Send>> + Send + Sync>;

/// Opens one WebSocket per call to the server at `authority`.
pub struct Dialer {
    /// `host:port` as the `Host` header names it.
    authority: String,
    options: ClientOptions,
    /// Longest opening a call's WebSocket (connection, TLS, upgrade) may take.
    dial_timeout: Duration,
    connect: Connect,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer").field("authority", &self.authority).finish_non_exhaustive()
    }
}

impl Dialer {
    /// Calls to `authority` (the `Host` header) with `options`, each on a connection `connect`
    /// opens, within `dial_timeout` for the connection and the upgrade.
    #[must_use]
    pub fn new(authority: String, options: ClientOptions, dial_timeout: Duration, connect: Connect) -> Arc<Self> {
        Arc::new(Self { authority, options, dial_timeout, connect })
    }

    /// What a tonic `Endpoint` dials (`connect_with_connector`): a new in-process HTTP/2 server
    /// whose calls go out as WebSockets.
    pub fn connector(
        self: Arc<Self>,
    ) -> impl tower::Service<
        Uri,
        Response = TokioIo<DuplexStream>,
        Error = std::io::Error,
        Future = impl Future<Output = std::io::Result<TokioIo<DuplexStream>>> + Send,
    > + Clone
    + Send
    + 'static {
        tower::service_fn(move |_: Uri| {
            let this = self.clone();
            async move {
                let (local, server) = tokio::io::duplex(LOCAL_BUFFER);
                let service = hyper::service::service_fn(move |request| this.clone().call(request));
                let connection = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .timer(hyper_util::rt::TokioTimer::new())
                    .max_frame_size(1 << 20)
                    .serve_connection(TokioIo::new(server), service);
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!(%error, "in-process HTTP/2 connection of the WebSocket transport ended");
                    }
                });
                Ok(TokioIo::new(local))
            }
        })
    }

    /// One call: open its WebSocket and carry it; a call that cannot be carried is answered
    /// `UNAVAILABLE`, naming the server and the cause.
    async fn call(
        self: Arc<Self>,
        request: http::Request<hyper::body::Incoming>,
    ) -> Result<http::Response<bridge::Body>, std::convert::Infallible> {
        let (head, body) = request.into_parts();
        let path = head.uri.path_and_query().map_or("/", http::uri::PathAndQuery::as_str);
        let opened = tokio::time::timeout(self.dial_timeout, self.open(path, &head.headers)).await;
        let ws = match opened {
            Ok(Ok(ws)) => ws,
            Ok(Err(e)) => {
                return Ok(bridge::status_response(&tonic::Status::unavailable(format!(
                    "cannot open a WebSocket to the principal at {}: {e}",
                    self.authority
                ))));
            }
            Err(_) => {
                return Ok(bridge::status_response(&tonic::Status::unavailable(format!(
                    "opening a WebSocket to the principal at {} took longer than {:?}",
                    self.authority, self.dial_timeout
                ))));
            }
        };
        Ok(bridge::forward(ws, body, self.options).await)
    }

    async fn open(
        &self,
        path: &str,
        headers: &http::HeaderMap,
    ) -> Result<tokio_tungstenite::WebSocketStream<Box<dyn Io>>, BoxError> {
        let io = (self.connect)().await?;
        Ok(bridge::handshake(io, &self.authority, path, headers, self.options.max_message_bytes).await?)
    }
}
