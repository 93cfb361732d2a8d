//! `--enable-websocket`: the agents' port also takes gRPC over WebSocket (HTTP/1.1), as
//! upstream's principal does with `golang.stackrox.io/grpc-http1`'s downgrading handler, for
//! networks whose proxies pass only HTTP/1.1.
//!
//! [`with_websocket`] wraps the stream of accepted connections (plaintext or TLS) that tonic
//! serves. Each connection's first bytes decide: the HTTP/2 preface goes to tonic untouched
//! (native gRPC, h2 or h2c); anything else is read as HTTP/1.1, and a WebSocket upgrade with
//! subprotocol `grpc-ws` becomes one gRPC call. That call reaches tonic as a request on an
//! in-memory HTTP/2 connection that carries the WebSocket's own connection info (address, TLS
//! client certificates), so it passes the very layers a native call passes (compression mirror,
//! authentication, authorization) and the same services with the same limits.
//! [`crate::bridge`] moves the frames.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tonic::transport::server::Connected;

/// What the WebSocket side of the agents' port allows.
#[derive(Debug, Clone, Copy)]
pub struct WebSocketOptions {
    /// The largest gRPC message either way (the services' limit).
    pub max_message_bytes: usize,
    /// How long a connection may take to show its protocol, send its HTTP/1.1 request head and
    /// complete the upgrade.
    pub handshake_timeout: Duration,
}

impl Default for WebSocketOptions {
    fn default() -> Self {
        Self { max_message_bytes: protocol::pb::MAX_MESSAGE_BYTES, handshake_timeout: Duration::from_secs(10) }
    }
}

/// Connections whose protocol is being read at once; more wait in the accept queue.
const MAX_SNIFFING: usize = 1024;

/// Bytes buffered each way on the in-memory connection of a WebSocket call.
const BRIDGE_BUFFER: usize = 64 << 10;

/// The HTTP/2 client preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection for tonic: one that started with the HTTP/2 preface, or the in-memory end of a
/// WebSocket call, which reports the connection info of the WebSocket's own connection.
pub enum Conn<IO: Connected> {
    /// A native HTTP/2 connection (its first bytes replayed).
    Native(Rewind<IO>),
    /// One WebSocket call.
    Bridged(DuplexStream, Box<IO::ConnectInfo>),
}

impl<IO: Connected> std::fmt::Debug for Conn<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Native(_) => "Conn::Native",
            Self::Bridged(..) => "Conn::Bridged",
        })
    }
}

impl<IO> Connected for Conn<IO>
where
    IO: Connected,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
{
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            Self::Native(io) => io.io.connect_info(),
            Self::Bridged(_, info) => (**info).clone(),
        }
    }
}

impl<IO: Connected + AsyncRead + Unpin> AsyncRead for Conn<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Native(io) => Pin::new(io).poll_read(cx, buf),
            Self::Bridged(io, _) => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl<IO: Connected + AsyncWrite + Unpin> AsyncWrite for Conn<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Native(io) => Pin::new(io).poll_write(cx, buf),
            Self::Bridged(io, _) => Pin::new(io).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Native(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Self::Bridged(io, _) => Pin::new(io).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Native(io) => io.is_write_vectored(),
            Self::Bridged(io, _) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Native(io) => Pin::new(io).poll_flush(cx),
            Self::Bridged(io, _) => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Native(io) => Pin::new(io).poll_shutdown(cx),
            Self::Bridged(io, _) => Pin::new(io).poll_shutdown(cx),
        }
    }
}

/// A connection whose first bytes were read to tell its protocol, and are read again first.
#[derive(Debug)]
pub struct Rewind<IO> {
    prefix: Vec<u8>,
    pos: usize,
    io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewind<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = (self.prefix.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Rewind<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
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

/// The connections of [`with_websocket`], for tonic's `serve_with_incoming`. Dropping it stops
/// accepting; WebSocket calls already bridged run to their end.
#[derive(Debug)]
pub struct WebSocketIncoming<IO: Connected> {
    accepted: mpsc::Receiver<io::Result<Conn<IO>>>,
    acceptor: JoinHandle<()>,
}

impl<IO: Connected> Stream for WebSocketIncoming<IO> {
    type Item = io::Result<Conn<IO>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.accepted.poll_recv(cx)
    }
}

impl<IO: Connected> Drop for WebSocketIncoming<IO> {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// Serves `incoming` (plaintext or TLS connections) to tonic as before, and also takes gRPC
/// over WebSocket on the same connections (see the module docs).
pub fn with_websocket<I, IO, IE>(incoming: I, options: WebSocketOptions) -> WebSocketIncoming<IO>
where
    I: Stream<Item = Result<IO, IE>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    IE: std::fmt::Display + Send + 'static,
{
    let (tx, accepted) = mpsc::channel(64);
    let acceptor = tokio::spawn(accept_loop(incoming, options, tx));
    WebSocketIncoming { accepted, acceptor }
}

async fn accept_loop<I, IO, IE>(incoming: I, options: WebSocketOptions, tx: mpsc::Sender<io::Result<Conn<IO>>>)
where
    I: Stream<Item = Result<IO, IE>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    IE: std::fmt::Display + Send + 'static,
{
    let mut incoming = std::pin::pin!(incoming);
    // Aborting this task aborts the sniffing in progress too.
    let mut sniffing = JoinSet::new();
    loop {
        tokio::select! {
            next = incoming.next(), if sniffing.len() < MAX_SNIFFING => match next {
                Some(Ok(io)) => {
                    sniffing.spawn(classify(io, options, tx.clone()));
                }
                Some(Err(error)) => tracing::debug!(%error, "accepting a connection failed"),
                None => break,
            },
            Some(_) = sniffing.join_next(), if !sniffing.is_empty() => {}
            () = tx.closed() => return,
        }
    }
    while sniffing.join_next().await.is_some() {}
}

/// Reads a connection's first bytes: HTTP/2 goes to tonic, HTTP/1.1 to the upgrade handler.
async fn classify<IO>(mut io: IO, options: WebSocketOptions, tx: mpsc::Sender<io::Result<Conn<IO>>>)
where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
{
    let (h2, prefix) = match tokio::time::timeout(options.handshake_timeout, sniff(&mut io)).await {
        Ok(Ok(found)) => found,
        Ok(Err(error)) => {
            tracing::debug!(%error, "connection closed before it sent a request");
            return;
        }
        Err(_) => {
            tracing::debug!(timeout = ?options.handshake_timeout, "connection sent no request in time");
            return;
        }
    };
    let info = io.connect_info();
    let io = Rewind { prefix, pos: 0, io };
    if h2 {
        let _ = tx.send(Ok(Conn::Native(io))).await;
    } else {
        // Detached: a WebSocket call lives as long as its call, not as long as the acceptor.
        tokio::spawn(serve_http1(io, info, options, tx));
    }
}

/// Reads until the bytes are the whole HTTP/2 preface (`true`) or stop matching it (`false`),
/// and returns what was read.
async fn sniff<IO: AsyncRead + Unpin>(io: &mut IO) -> io::Result<(bool, Vec<u8>)> {
    let mut read = Vec::with_capacity(PREFACE.len());
    let mut chunk = [0u8; PREFACE.len()];
    while read.len() < PREFACE.len() {
        let n = io.read(&mut chunk[..PREFACE.len() - read.len()]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        read.extend_from_slice(&chunk[..n]);
        if !PREFACE.starts_with(&read) {
            return Ok((false, read));
        }
    }
    Ok((true, read))
}

/// One HTTP/1.1 request: a gRPC WebSocket upgrade, or an answer saying what this port serves.
async fn serve_http1<IO>(
    io: Rewind<IO>,
    info: IO::ConnectInfo,
    options: WebSocketOptions,
    tx: mpsc::Sender<io::Result<Conn<IO>>>,
) where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
{
    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let (tx, info) = (tx.clone(), info.clone());
        async move { Ok::<_, std::convert::Infallible>(upgrade(request, info, options, tx)) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(options.handshake_timeout)
        .max_buf_size(64 << 10)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades()
        .await;
    if let Err(error) = served {
        tracing::debug!(%error, "HTTP/1.1 connection failed");
    }
}

fn upgrade<IO>(
    mut request: http::Request<Incoming>,
    info: IO::ConnectInfo,
    options: WebSocketOptions,
    tx: mpsc::Sender<io::Result<Conn<IO>>>,
) -> http::Response<Full<Bytes>>
where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
{
    let on_upgrade = hyper::upgrade::on(&mut request);
    let (head, _) = request.into_parts();
    match crate::bridge::check_upgrade(&head) {
        Err(refusal) => {
            tracing::info!(method = %head.method, path = %head.uri.path(), status = %refusal.status, "HTTP/1.1 request refused: {}", refusal.message.trim());
            let mut response = http::Response::new(Full::new(Bytes::from(refusal.message)));
            *response.status_mut() = refusal.status;
            response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain"));
            // One answer per connection. (Not on the 101: Go's client drops a `Connection`
            // header that says `close`, and with it the `Upgrade` token it checks.)
            response.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            response
        }
        Ok(headers) => {
            tokio::spawn(bridge(on_upgrade, head, info, options, tx));
            let mut response = http::Response::new(Full::new(Bytes::new()));
            *response.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
            *response.headers_mut() = headers;
            response
        }
    }
}

/// Carries one upgraded WebSocket's call to tonic over an in-memory HTTP/2 connection.
async fn bridge<IO>(
    on_upgrade: hyper::upgrade::OnUpgrade,
    head: http::request::Parts,
    info: IO::ConnectInfo,
    options: WebSocketOptions,
    tx: mpsc::Sender<io::Result<Conn<IO>>>,
) where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
{
    let path = head.uri.path().to_owned();
    let upgraded = match tokio::time::timeout(options.handshake_timeout, on_upgrade).await {
        Ok(Ok(upgraded)) => upgraded,
        Ok(Err(error)) => return tracing::debug!(%path, %error, "WebSocket upgrade failed"),
        Err(_) => return tracing::debug!(%path, "WebSocket upgrade timed out"),
    };
    tracing::debug!(%path, "WebSocket call opened");
    let config = crate::bridge::config(options.max_message_bytes);
    let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await;
    let (client, server) = tokio::io::duplex(BRIDGE_BUFFER);
    if tx.send(Ok(Conn::Bridged(server, Box::new(info)))).await.is_err() {
        return tracing::debug!(%path, "WebSocket call refused: the server is stopping");
    }
    let handshake = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .max_frame_size(Some(1 << 20))
        .handshake::<_, crate::bridge::Body>(TokioIo::new(client));
    let (send, connection) = match tokio::time::timeout(options.handshake_timeout, handshake).await {
        Ok(Ok(pair)) => pair,
        Ok(Err(error)) => return tracing::warn!(%path, %error, "WebSocket call: the gRPC server refused it"),
        Err(_) => return tracing::warn!(%path, "WebSocket call: the gRPC server did not take it in time"),
    };
    // Ends once the call is over and `send` is gone.
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "WebSocket call: in-memory HTTP/2 connection failed");
        }
    });
    match crate::bridge::serve(ws, &head, send, options.max_message_bytes).await {
        crate::bridge::Served::Answered => tracing::debug!(%path, "WebSocket call answered"),
        crate::bridge::Served::ClientGone(why) => tracing::debug!(%path, %why, "WebSocket call: the client went away"),
        crate::bridge::Served::Failed(why) => tracing::warn!(%path, %why, "WebSocket call failed"),
    }
}

/// `config` with ALPN `http/1.1` offered after `h2`: a client that asks only for HTTP/1.1 (a
/// WebSocket client, a proxy) completes the TLS handshake instead of failing it.
#[must_use]
pub fn offer_http1(config: &rustls::ServerConfig) -> Arc<rustls::ServerConfig> {
    let mut config = config.clone();
    if !config.alpn_protocols.iter().any(|p| p == b"http/1.1") {
        config.alpn_protocols.push(b"http/1.1".to_vec());
    }
    Arc::new(config)
}

/// [`offer_http1`] over a configuration that is reloaded: the returned watch follows `config`.
#[must_use]
pub fn offer_http1_reloading(
    mut config: watch::Receiver<Arc<rustls::ServerConfig>>,
) -> watch::Receiver<Arc<rustls::ServerConfig>> {
    let (tx, rx) = watch::channel(offer_http1(&config.borrow_and_update()));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = config.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let next = offer_http1(&config.borrow_and_update());
                    if tx.send(next).is_err() {
                        return;
                    }
                }
                () = tx.closed() => return,
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sniff_tells_http2_from_http1() {
        let (mut a, mut b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, PREFACE).await.unwrap();
        assert_eq!(sniff(&mut b).await.unwrap(), (true, PREFACE.to_vec()));

        let (mut a, mut b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b"GET / HTTP/1.1\r\n").await.unwrap();
        let (h2, read) = sniff(&mut b).await.unwrap();
        assert!(!h2 && read.starts_with(b"G") && read.len() <= PREFACE.len(), "{read:?}");

        // A client that stops early is no connection.
        let (mut a, mut b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b"PRI * ").await.unwrap();
        drop(a);
        assert!(sniff(&mut b).await.is_err());
    }

    /// `versionapi.Version`, answering a fixed version.
    struct TestVersion;

    #[tonic::async_trait]
    impl protocol::pb::versionapi::version_server::Version for TestVersion {
        async fn version(
            &self,
            _request: tonic::Request<protocol::pb::versionapi::VersionRequest>,
        ) -> Result<tonic::Response<protocol::pb::versionapi::VersionResponse>, tonic::Status> {
            Ok(tonic::Response::new(protocol::pb::versionapi::VersionResponse { version: "argocd-agent-test".into() }))
        }
    }

    /// Serves `Version` with tonic behind [`with_websocket`] on a free loopback port.
    async fn version_server() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let service = protocol::pb::versionapi::version_server::VersionServer::new(TestVersion);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(with_websocket(incoming, WebSocketOptions::default())),
        );
        addr
    }

    async fn exchange(addr: std::net::SocketAddr, request: &str) -> String {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut tcp, request.as_bytes()).await.unwrap();
        let mut answer = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut answer)).await.unwrap().unwrap();
        String::from_utf8_lossy(&answer[..n]).into_owned()
    }

    #[tokio::test]
    async fn http1_upgrades_are_answered_and_other_requests_told_what_to_fix() {
        let addr = version_server().await;
        // As grpc-http1's client (Go's net/http and coder/websocket) sends it.
        let upgrade = "GET /versionapi.Version/Version HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: Go-http-client/1.1\r\n\
                       Connection: Upgrade\r\nContent-Type: application/grpc\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                       Sec-WebSocket-Protocol: grpc-ws\r\nSec-WebSocket-Version: 13\r\nTe: trailers\r\nUpgrade: websocket\r\n\r\n";
        let answer = exchange(addr, upgrade).await.to_ascii_lowercase();
        assert!(answer.starts_with("http/1.1 101"), "{answer}");
        // Exactly `Upgrade`: Go's client drops a Connection header that also says `close`.
        assert!(answer.contains("\r\nconnection: upgrade\r\n"), "{answer}");
        assert!(answer.contains("\r\nupgrade: websocket\r\n"), "{answer}");
        assert!(answer.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="), "{answer}");

        let post = "POST /versionapi.Version/Version HTTP/1.1\r\nHost: x\r\nContent-Type: application/grpc\r\nContent-Length: 0\r\n\r\n";
        let answer = exchange(addr, post).await;
        assert!(answer.starts_with("HTTP/1.1 426"), "{answer}");
        assert!(answer.contains("grpc-ws"), "{answer}");
    }

    #[tokio::test]
    async fn rewind_replays_the_prefix() {
        let (mut a, b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b"rest").await.unwrap();
        drop(a);
        let mut r = Rewind { prefix: b"GE".to_vec(), pos: 0, io: b };
        let mut all = Vec::new();
        r.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"GErest");
    }
}
