//! gRPC over WebSocket (`--enable-websocket`), both ends of one call, wire-compatible with
//! `golang.stackrox.io/grpc-http1` (upstream's library). The frames are
//! [`crate::frame`]; this module moves them between a WebSocket and an HTTP/2 call:
//!
//! * [`handshake`] opens the client's WebSocket for one call over a connected (TLS or plain)
//!   stream; [`forward`] then carries an HTTP/2 request's messages out and turns the answer back
//!   into an HTTP/2 response (headers, messages, trailers). The agent runs it behind an
//!   in-process HTTP/2 server, so its tonic channel and every client stay as they are.
//! * [`check_upgrade`] decides whether an HTTP/1.1 request may become a gRPC WebSocket, and
//!   [`serve`] sends the call it carries to a gRPC server over an HTTP/2 connection and writes
//!   the answer back. The principal runs it against its own tonic server over an in-memory
//!   connection, so a WebSocket call passes exactly the layers a native call passes.
//!
//! Everything is bounded: messages by the gRPC limit (the WebSocket configuration refuses
//! larger ones), metadata by [`crate::frame::MAX_METADATA_BYTES`], the handshake head by
//! [`MAX_HANDSHAKE_HEAD`], and at most [`BODY_BUFFER`] messages wait between the two sides.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::frame::{self as framing, ClientFrame, FrameError, ServerFrame, Splitter};
use bytes::Bytes;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use http::header::{CONTENT_TYPE, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};

pub use crate::frame::SUBPROTOCOL;

/// Errors crossing the bridge.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of bridged requests and responses.
pub type Body = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// Messages waiting between a WebSocket and its HTTP/2 side, each way.
pub const BODY_BUFFER: usize = 4;

/// How long a side waits for the peer's close frame after sending its own.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// The largest HTTP response head the client reads during the handshake.
pub const MAX_HANDSHAKE_HEAD: usize = 16 << 10;

/// The WebSocket settings for calls whose messages may reach `max_message_bytes`: larger
/// messages (and frames) are refused while being read, so no peer makes either side buffer
/// more than one message.
#[must_use]
pub fn config(max_message_bytes: usize) -> WebSocketConfig {
    let max = max_message_bytes.max(framing::MAX_METADATA_BYTES).saturating_add(framing::PREFIX_LEN);
    WebSocketConfig::default()
        .read_buffer_size(64 << 10)
        .write_buffer_size(64 << 10)
        .max_write_buffer_size(max.saturating_add(128 << 10))
        .max_message_size(Some(max))
        .max_frame_size(Some(max))
}

/// Why a WebSocket call could not be opened (client side).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// Reading or writing the connection failed.
    #[error("WebSocket handshake: {0}")]
    Io(#[from] std::io::Error),
    /// The server answered, but not with `101 Switching Protocols`.
    #[error(
        "the server answered the WebSocket upgrade with HTTP {status} {reason}{detail} (does the principal \
         run with --enable-websocket, and does every proxy on the way pass WebSocket upgrades?)"
    )]
    Refused {
        /// The HTTP status.
        status: u16,
        /// Its reason phrase.
        reason: String,
        /// The start of the answer's body, if it came with the head (`: ...`).
        detail: String,
    },
    /// The answer is not a valid WebSocket handshake.
    #[error("invalid WebSocket handshake answer: {0}")]
    BadAnswer(String),
}

/// Opens the WebSocket of one gRPC call on `io` (already connected, TLS or not): `GET
/// path_and_query` on `authority` with subprotocol [`SUBPROTOCOL`] and the call's request
/// `headers` (metadata included), as grpc-http1's client sends it.
///
/// # Errors
///
/// [`HandshakeError`] when the connection fails or the server does not switch to WebSocket.
pub async fn handshake<S>(
    mut io: S,
    authority: &str,
    path_and_query: &str,
    headers: &HeaderMap,
    max_message_bytes: usize,
) -> Result<WebSocketStream<S>, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let key = tungstenite::handshake::client::generate_key();
    let mut head = format!(
        "GET {path_and_query} HTTP/1.1\r\nHost: {authority}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {SUBPROTOCOL}\r\n"
    )
    .into_bytes();
    for (name, value) in headers {
        if is_connection_specific(name) {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    io.write_all(&head).await?;
    io.flush().await?;

    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    let (used, rest) = loop {
        let n = io.read(&mut chunk).await?;
        if n == 0 {
            return Err(HandshakeError::BadAnswer("the connection closed during the handshake".into()));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut answer = httparse::Response::new(&mut fields);
        match answer.parse(&buf) {
            Ok(httparse::Status::Complete(used)) => {
                check_answer(&answer, &key, &buf[used..])?;
                break (used, buf[used..].to_vec());
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HANDSHAKE_HEAD => {}
            Ok(httparse::Status::Partial) => {
                return Err(HandshakeError::BadAnswer(format!(
                    "the answer's head is longer than {MAX_HANDSHAKE_HEAD} bytes"
                )));
            }
            Err(e) => return Err(HandshakeError::BadAnswer(format!("not an HTTP/1.1 answer: {e}"))),
        }
    };
    let _ = used;
    Ok(WebSocketStream::from_partially_read(io, rest, Role::Client, Some(config(max_message_bytes))).await)
}

fn check_answer(answer: &httparse::Response<'_, '_>, key: &str, after: &[u8]) -> Result<(), HandshakeError> {
    let status = answer.code.unwrap_or_default();
    if status != 101 {
        let text = String::from_utf8_lossy(&after[..after.len().min(300)]);
        let text = text.trim();
        return Err(HandshakeError::Refused {
            status,
            reason: answer.reason.unwrap_or_default().to_owned(),
            detail: if text.is_empty() { String::new() } else { format!(": {text}") },
        });
    }
    let field = |name: &str| {
        answer.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| String::from_utf8_lossy(h.value))
    };
    let bad = |what: String| Err(HandshakeError::BadAnswer(what));
    if !field("upgrade").is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket")) {
        return bad("no 'Upgrade: websocket'".into());
    }
    if !field("connection").is_some_and(|v| has_token(&v, "upgrade")) {
        return bad("no 'Connection: Upgrade'".into());
    }
    let expected = tungstenite::handshake::derive_accept_key(key.as_bytes());
    if field("sec-websocket-accept").as_deref().map(str::trim) != Some(expected.as_str()) {
        return bad("Sec-WebSocket-Accept does not match the key sent".into());
    }
    // grpc-http1's server does not name the subprotocol; ours does. Anything else is refused.
    match field("sec-websocket-protocol") {
        Some(p) if p.trim() != SUBPROTOCOL => bad(format!("subprotocol {p:?} instead of {SUBPROTOCOL}")),
        _ => Ok(()),
    }
}

fn has_token(list: &str, token: &str) -> bool {
    list.split(',').any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Headers that belong to one HTTP hop and never travel between the HTTP/2 call and the
/// WebSocket's upgrade request.
fn is_connection_specific(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host"
            | "connection"
            | "upgrade"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "content-length"
            | "te"
    ) || name.as_str().starts_with("sec-websocket-")
}

fn without_connection_headers(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !is_connection_specific(name) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

// === the server end ===

/// Why an HTTP/1.1 request does not become a gRPC WebSocket: the answer to give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeRefusal {
    /// The HTTP status of the answer.
    pub status: StatusCode,
    /// Its text body: what to fix.
    pub message: String,
}

/// Checks that `head` is a WebSocket upgrade for a gRPC call (subprotocol [`SUBPROTOCOL`]) and
/// returns the headers of the `101 Switching Protocols` answer.
///
/// # Errors
///
/// The [`UpgradeRefusal`] to answer with: `426` for HTTP/1.1 requests that are no WebSocket
/// upgrade (e.g. gRPC downgraded to HTTP/1.1 by a proxy), `400` for broken upgrades (a proxy
/// that dropped the `Connection`/`Upgrade` headers), `405` for a method other than GET.
pub fn check_upgrade(head: &http::request::Parts) -> Result<HeaderMap, UpgradeRefusal> {
    let refuse = |status, message: &str| Err(UpgradeRefusal { status, message: message.to_owned() });
    let field = |name: &str| head.headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>();
    let grpc_ws = field("sec-websocket-protocol").iter().any(|v| has_token(v, SUBPROTOCOL));
    if !grpc_ws {
        return refuse(
            StatusCode::UPGRADE_REQUIRED,
            "this port serves gRPC over HTTP/2, or over HTTP/1.1 as a WebSocket with subprotocol grpc-ws \
             (the agent's --enable-websocket)\n",
        );
    }
    if !field("connection").iter().any(|v| has_token(v, "upgrade")) {
        return refuse(
            StatusCode::BAD_REQUEST,
            "gRPC-WebSocket request without 'Connection: Upgrade' (a proxy on the way probably does not pass \
             WebSocket upgrades)\n",
        );
    }
    if !field("upgrade").iter().any(|v| has_token(v, "websocket")) {
        return refuse(
            StatusCode::BAD_REQUEST,
            "gRPC-WebSocket request without 'Upgrade: websocket' (a proxy on the way probably does not pass \
             WebSocket upgrades)\n",
        );
    }
    if head.method != Method::GET {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, "a WebSocket upgrade is a GET request\n");
    }
    if field("sec-websocket-version").first().map(|v| v.trim()) != Some("13") {
        return refuse(StatusCode::BAD_REQUEST, "only WebSocket version 13 is supported\n");
    }
    let Some(key) = head.headers.get("sec-websocket-key") else {
        return refuse(StatusCode::BAD_REQUEST, "WebSocket upgrade without Sec-WebSocket-Key\n");
    };
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut answer = HeaderMap::new();
    answer.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
    answer.insert(http::header::CONNECTION, HeaderValue::from_static("Upgrade"));
    answer.insert(
        http::header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).map_err(|_| UpgradeRefusal {
            status: StatusCode::BAD_REQUEST,
            message: "invalid Sec-WebSocket-Key\n".into(),
        })?,
    );
    answer.insert(http::header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(SUBPROTOCOL));
    Ok(answer)
}

/// How a served call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    /// The answer (trailers included) reached the client.
    Answered,
    /// The client went away (or broke the protocol) before the answer was complete; the call
    /// was cancelled.
    ClientGone(String),
    /// The gRPC server could not be reached or answered with something that is no gRPC
    /// response; the client got an error status.
    Failed(String),
}

/// The server end of one call: the WebSocket `ws`, opened by the upgrade request `head`,
/// carries a call that goes to the gRPC server behind `upstream` (an HTTP/2 connection) with
/// the upgrade request's headers as its metadata; the answer goes back as grpc-http1 frames.
/// Returns when the call is over and the WebSocket closed (or [`CLOSE_WAIT`] passed).
pub async fn serve<S>(
    ws: WebSocketStream<S>,
    head: &http::request::Parts,
    upstream: hyper::client::conn::http2::SendRequest<Body>,
    max_message_bytes: usize,
) -> Served
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (tx, body) = channel_body();
    let request = grpc_request(head, body);
    let (mut sink, mut stream) = ws.split();
    let mut reader = Box::pin(read_requests(&mut stream, tx, max_message_bytes));
    let mut writer = Box::pin(answer(&mut sink, upstream, request, max_message_bytes));
    let first = tokio::select! {
        answered = &mut writer => Ok(answered),
        gone = &mut reader => Err(gone),
    };
    // The unfinished side is dropped here: a client gone cancels the call in flight.
    drop(writer);
    match first {
        Ok(answered) => {
            let close = match &answered {
                Ok(()) => CloseFrame { code: CloseCode::Normal, reason: "".into() },
                Err(e) => CloseFrame { code: CloseCode::Error, reason: close_reason(e) },
            };
            let _ = sink.send(Message::Close(Some(close))).await;
            let _ = tokio::time::timeout(CLOSE_WAIT, reader).await;
            match answered {
                Ok(()) => Served::Answered,
                Err(e) => Served::Failed(e),
            }
        }
        Err(gone) => {
            drop(reader);
            let closing = async {
                if let ReadEnd::Broken(reason, code) = &gone {
                    let frame = CloseFrame { code: *code, reason: close_reason(reason) };
                    let _ = sink.send(Message::Close(Some(frame))).await;
                }
                // Flushes the answer to the client's close frame, if it sent one.
                let _ = sink.close().await;
            };
            let _ = tokio::time::timeout(CLOSE_WAIT, closing).await;
            Served::ClientGone(gone.to_string())
        }
    }
}

/// A close frame's reason is at most 123 bytes.
fn close_reason(text: &str) -> tungstenite::Utf8Bytes {
    let mut end = text.len().min(120);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].into()
}

/// The HTTP/2 gRPC request for the call whose upgrade request is `head`.
fn grpc_request(head: &http::request::Parts, body: Body) -> Request<Body> {
    let mut request = Request::new(body);
    *request.method_mut() = Method::POST;
    *request.version_mut() = http::Version::HTTP_2;
    let path = head.uri.path_and_query().map_or("/", http::uri::PathAndQuery::as_str);
    *request.uri_mut() = http::Uri::builder()
        .scheme("http")
        .authority("grpc-ws.localhost")
        .path_and_query(path)
        .build()
        .unwrap_or_else(|_| http::Uri::from_static("http://grpc-ws.localhost/"));
    *request.headers_mut() = without_connection_headers(&head.headers);
    request.headers_mut().insert(http::header::TE, HeaderValue::from_static("trailers"));
    request
}

/// How the client's side of a served call ended.
#[derive(Debug)]
enum ReadEnd {
    /// A close frame.
    Closed,
    /// The connection ended or failed without one.
    Lost(String),
    /// The client broke the protocol; close with this reason and code.
    Broken(String, CloseCode),
}

impl std::fmt::Display for ReadEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Closed => f.write_str("the client closed the WebSocket"),
            Self::Lost(e) => write!(f, "the WebSocket connection was lost: {e}"),
            Self::Broken(e, _) => write!(f, "protocol error: {e}"),
        }
    }
}

/// Feeds the client's messages into the request body until the client closes.
async fn read_requests<S>(
    stream: &mut SplitStream<WebSocketStream<S>>,
    tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    max_message_bytes: usize,
) -> ReadEnd
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut tx = Some(tx);
    let mut ended = false;
    loop {
        let message = match stream.next().await {
            None => return ReadEnd::Lost("closed without a close frame".into()),
            Some(Err(tungstenite::Error::Capacity(e))) => {
                let reason = format!("{e} (the gRPC message limit is {max_message_bytes} bytes)");
                fail_body(tx.take(), &reason).await;
                return ReadEnd::Broken(reason, CloseCode::Size);
            }
            Some(Err(e)) => {
                fail_body(tx.take(), &e.to_string()).await;
                return ReadEnd::Lost(e.to_string());
            }
            Some(Ok(message)) => message,
        };
        match message {
            Message::Binary(bytes) => match framing::decode_client(&bytes, max_message_bytes) {
                Ok(_) if ended => {
                    return ReadEnd::Broken("message after the end of the stream".into(), CloseCode::Protocol);
                }
                Ok(ClientFrame::Message(_)) => {
                    if let Some(sender) = &tx
                        && sender.send(Ok(Frame::data(bytes))).await.is_err()
                    {
                        // The call no longer reads its request: drop what follows.
                        tx = None;
                    }
                }
                Ok(ClientFrame::EndOfStream) => {
                    ended = true;
                    tx = None;
                }
                Err(e) => {
                    let reason = e.to_string();
                    fail_body(tx.take(), &reason).await;
                    let code =
                        if matches!(e, FrameError::TooLarge { .. }) { CloseCode::Size } else { CloseCode::Protocol };
                    return ReadEnd::Broken(reason, code);
                }
            },
            Message::Text(_) => {
                let reason = "text message: gRPC-WebSocket messages are binary";
                fail_body(tx.take(), reason).await;
                return ReadEnd::Broken(reason.into(), CloseCode::Unsupported);
            }
            Message::Close(_) => {
                if !ended {
                    fail_body(tx.take(), "the client closed the WebSocket").await;
                }
                return ReadEnd::Closed;
            }
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
        }
    }
}

async fn fail_body(tx: Option<mpsc::Sender<Result<Frame<Bytes>, BoxError>>>, reason: &str) {
    if let Some(tx) = tx {
        let _ = tx.try_send(Err(reason.to_owned().into()));
    }
}

/// Sends the request to the gRPC server and writes its answer as grpc-http1 frames.
async fn answer<S>(
    sink: &mut SplitSink<WebSocketStream<S>, Message>,
    mut upstream: hyper::client::conn::http2::SendRequest<Body>,
    request: Request<Body>,
    max_message_bytes: usize,
) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let send = |m: Vec<u8>| Message::Binary(Bytes::from(m));
    let response = async {
        upstream.ready().await?;
        upstream.send_request(request).await
    }
    .await;
    let response = match response {
        Ok(response) => response,
        Err(e) => {
            let status = tonic::Status::unavailable(format!("the gRPC server behind the WebSocket failed: {e}"));
            sink.send(send(framing::encode_metadata(&status_headers(&status)))).await.map_err(|e| e.to_string())?;
            return Err(status.message().to_owned());
        }
    };
    let (parts, mut body) = response.into_parts();
    let mut headers = without_connection_headers(&parts.headers);
    if parts.status != StatusCode::OK && !headers.contains_key("grpc-status") {
        // Not a gRPC answer: tell the client in gRPC's terms, as gRPC clients read HTTP errors.
        let status =
            tonic::Status::new(http_to_grpc(parts.status), format!("HTTP {} from the gRPC server", parts.status));
        let _ = status.add_header(&mut headers);
    }
    let trailers_only = headers.contains_key("grpc-status");
    sink.send(send(framing::encode_metadata(&headers))).await.map_err(|e| e.to_string())?;
    if trailers_only {
        return Ok(());
    }
    let mut splitter = Splitter::new(max_message_bytes);
    let trailers = loop {
        match body.frame().await {
            None => break status_headers(&tonic::Status::internal("the gRPC response ended without trailers")),
            Some(Err(e)) => break status_headers(&tonic::Status::internal(format!("the gRPC response failed: {e}"))),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    splitter.push(data);
                    loop {
                        match splitter.next_frame() {
                            Ok(Some(message)) => {
                                sink.send(Message::Binary(message)).await.map_err(|e| e.to_string())?;
                            }
                            Ok(None) => break,
                            Err(e) => {
                                let status =
                                    tonic::Status::internal(format!("the gRPC response cannot be framed: {e}"));
                                sink.send(send(framing::encode_metadata(&status_headers(&status))))
                                    .await
                                    .map_err(|e| e.to_string())?;
                                return Err(e.to_string());
                            }
                        }
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        break if splitter.pending() == 0 {
                            without_connection_headers(&trailers)
                        } else {
                            status_headers(&tonic::Status::internal("the gRPC response ended inside a message"))
                        };
                    }
                }
            },
        }
    };
    sink.send(send(framing::encode_metadata(&trailers))).await.map_err(|e| e.to_string())
}

/// gRPC's mapping of HTTP statuses (`doc/http-grpc-status-mapping.md`).
fn http_to_grpc(status: StatusCode) -> tonic::Code {
    match status.as_u16() {
        400 => tonic::Code::Internal,
        401 => tonic::Code::Unauthenticated,
        403 => tonic::Code::PermissionDenied,
        404 => tonic::Code::Unimplemented,
        429 | 502 | 503 | 504 => tonic::Code::Unavailable,
        _ => tonic::Code::Unknown,
    }
}

fn status_headers(status: &tonic::Status) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    // Only fails for metadata that cannot be encoded; the code and message always can.
    let _ = status.add_header(&mut headers);
    headers
}

// === the client end ===

/// The client end's settings.
#[derive(Debug, Clone, Copy)]
pub struct ClientOptions {
    /// The largest gRPC message either way.
    pub max_message_bytes: usize,
    /// Send a WebSocket ping this often; with no frame at all from the server for this long
    /// plus `keepalive_timeout`, the call fails as `UNAVAILABLE`.
    pub keepalive: Option<Duration>,
    /// See `keepalive`.
    pub keepalive_timeout: Duration,
}

/// An answer with only a status (`grpc-status` in the headers, no body): what the client end
/// returns when the call cannot be carried.
#[must_use]
pub fn status_response(status: &tonic::Status) -> Response<Body> {
    let mut response = Response::new(empty_body());
    *response.headers_mut() = status_headers(status);
    response
}

/// The client end of one call: sends the messages of `request_body` on `ws` (an open gRPC
/// WebSocket) as they come, then the end of stream, and returns the answer as an HTTP response
/// as soon as its headers arrive; its messages and trailers follow in the body. A transport
/// failure becomes an `UNAVAILABLE` status, as grpc-http1's client reports it.
pub async fn forward<S, B>(ws: WebSocketStream<S>, request_body: B, options: ClientOptions) -> Response<Body>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display + Send,
{
    let (head_tx, head_rx) = oneshot::channel();
    tokio::spawn(run_client(ws, request_body, options, head_tx));
    head_rx.await.unwrap_or_else(|_| {
        status_response(&tonic::Status::unavailable("the WebSocket call ended before the principal answered"))
    })
}

async fn run_client<S, B>(
    ws: WebSocketStream<S>,
    request_body: B,
    options: ClientOptions,
    head: oneshot::Sender<Response<Body>>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let (mut sink, mut stream) = ws.split();
    let mut reader = Box::pin(relay_answer(&mut stream, head, options));
    let mut sender = Box::pin(send_requests(&mut sink, request_body, options));
    let relayed = tokio::select! {
        relayed = &mut reader => Some(relayed),
        failed = &mut sender => {
            tracing::debug!(error = %failed, "gRPC-WebSocket call: sending stopped");
            None
        }
    };
    drop(sender);
    let relayed = match relayed {
        Some(relayed) => {
            drop(reader);
            relayed
        }
        // Sending stopped: the local caller cancelled, or the connection broke (the reader then
        // reports it); either way the answer has a little longer to end.
        None => tokio::time::timeout(CLOSE_WAIT, reader).await.unwrap_or(Relayed::Gone),
    };
    if relayed != Relayed::Broken {
        let close = CloseFrame { code: CloseCode::Normal, reason: "".into() };
        if tokio::time::timeout(CLOSE_WAIT, sink.send(Message::Close(Some(close)))).await.is_ok_and(|r| r.is_ok()) {
            // The server's close frame ends the stream.
            let _ = tokio::time::timeout(CLOSE_WAIT, async { while stream.next().await.is_some() {} }).await;
        }
    }
}

/// How the answer's relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relayed {
    /// The trailers were relayed.
    Done,
    /// The local caller stopped listening.
    Gone,
    /// The connection failed or the server broke the protocol; the caller got `UNAVAILABLE`.
    Broken,
}

/// Reads the answer: the headers (returned through `head`), the messages and the trailers.
async fn relay_answer<S>(
    stream: &mut SplitStream<WebSocketStream<S>>,
    head: oneshot::Sender<Response<Body>>,
    options: ClientOptions,
) -> Relayed
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let silence = options.keepalive.map(|k| k + options.keepalive_timeout);
    let unavailable = |e: &str| tonic::Status::unavailable(format!("gRPC over WebSocket: {e}"));
    let mut head = head;
    let first = tokio::select! {
        first = next_frame(stream, silence, options.max_message_bytes) => first,
        () = head.closed() => return Relayed::Gone,
    };
    let headers = match first {
        Ok(ServerFrameOwned::Metadata(headers)) => headers,
        Ok(ServerFrameOwned::Message(_)) => {
            let _ = head.send(status_response(&unavailable("the server sent a message before the headers")));
            return Relayed::Broken;
        }
        Err(e) => {
            let _ = head.send(status_response(&unavailable(&e)));
            return Relayed::Broken;
        }
    };
    let headers = without_connection_headers(&headers);
    if headers.contains_key("grpc-status") {
        let mut response = Response::new(empty_body());
        *response.headers_mut() = headers;
        return if head.send(response).is_ok() { Relayed::Done } else { Relayed::Gone };
    }
    let (tx, body) = channel_body();
    let mut response = Response::new(body);
    *response.headers_mut() = headers;
    if head.send(response).is_err() {
        return Relayed::Gone;
    }
    loop {
        let frame = tokio::select! {
            frame = next_frame(stream, silence, options.max_message_bytes) => frame,
            () = tx.closed() => return Relayed::Gone,
        };
        let (frame, end) = match frame {
            Ok(ServerFrameOwned::Message(message)) => (Frame::data(message), None),
            Ok(ServerFrameOwned::Metadata(trailers)) => {
                (Frame::trailers(without_connection_headers(&trailers)), Some(Relayed::Done))
            }
            Err(e) => (Frame::trailers(status_headers(&unavailable(&e))), Some(Relayed::Broken)),
        };
        if tx.send(Ok(frame)).await.is_err() {
            return Relayed::Gone;
        }
        if let Some(end) = end {
            return end;
        }
    }
}

enum ServerFrameOwned {
    Message(Bytes),
    Metadata(HeaderMap),
}

/// The next frame from the server, skipping pings and pongs; `silence` bounds the wait for
/// any frame at all.
async fn next_frame<S>(
    stream: &mut SplitStream<WebSocketStream<S>>,
    silence: Option<Duration>,
    max_message_bytes: usize,
) -> Result<ServerFrameOwned, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let next = match silence {
            Some(limit) => tokio::time::timeout(limit, stream.next())
                .await
                .map_err(|_| format!("nothing from the server for {limit:?}, not even an answer to pings"))?,
            None => stream.next().await,
        };
        match next {
            None => return Err("the connection closed before the call ended".into()),
            Some(Err(e)) => return Err(e.to_string()),
            Some(Ok(Message::Binary(bytes))) => {
                return match framing::decode_server(&bytes, max_message_bytes).map_err(|e| e.to_string())? {
                    ServerFrame::Message(_) => Ok(ServerFrameOwned::Message(bytes)),
                    ServerFrame::Metadata(headers) => Ok(ServerFrameOwned::Metadata(headers)),
                };
            }
            Some(Ok(Message::Close(frame))) => {
                let why = frame.map(|f| format!(" ({}: {})", u16::from(f.code), f.reason)).unwrap_or_default();
                return Err(format!("the server closed the WebSocket before the call ended{why}"));
            }
            Some(Ok(Message::Text(_))) => return Err("the server sent a text message".into()),
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
        }
    }
}

/// Sends the request's messages, then the end of stream; then only keepalive pings. Returns
/// only when sending fails (or the request body does).
async fn send_requests<S, B>(
    sink: &mut SplitSink<WebSocketStream<S>, Message>,
    body: B,
    options: ClientOptions,
) -> String
where
    S: AsyncRead + AsyncWrite + Unpin,
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut body = Some(body);
    let mut splitter = Splitter::new(options.max_message_bytes);
    let mut ticker = options.keepalive.map(|every| {
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    loop {
        let tick = async {
            match ticker.as_mut() {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        let frame = async {
            match body.as_mut() {
                Some(b) => b.frame().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tick => {
                if let Err(e) = sink.send(Message::Ping(Bytes::new())).await {
                    return format!("sending a ping: {e}");
                }
            }
            frame = frame => match frame {
                None => {
                    body = None;
                    if splitter.pending() != 0 {
                        return "the request ended inside a message".into();
                    }
                    if let Err(e) = sink.send(Message::Binary(Bytes::from_static(&framing::END_OF_STREAM))).await {
                        return format!("sending the end of stream: {e}");
                    }
                }
                Some(Err(e)) => return format!("the request failed: {e}"),
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else { continue };
                    splitter.push(data);
                    loop {
                        match splitter.next_frame() {
                            Ok(Some(message)) => {
                                if let Err(e) = sink.send(Message::Binary(message)).await {
                                    return format!("sending a message: {e}");
                                }
                            }
                            Ok(None) => break,
                            Err(e) => return format!("the request cannot be framed: {e}"),
                        }
                    }
                }
            }
        }
    }
}

// === bodies ===

struct ChannelBody(mpsc::Receiver<Result<Frame<Bytes>, BoxError>>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0.poll_recv(cx)
    }
}

fn channel_body() -> (mpsc::Sender<Result<Frame<Bytes>, BoxError>>, Body) {
    let (tx, rx) = mpsc::channel(BODY_BUFFER);
    (tx, ChannelBody(rx).boxed())
}

fn empty_body() -> Body {
    http_body_util::Empty::new().map_err(|never| match never {}).boxed()
}

#[cfg(test)]
mod tests;
