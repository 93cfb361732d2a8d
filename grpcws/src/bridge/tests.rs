use std::convert::Infallible;
use std::time::Duration;

use http_body_util::StreamBody;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::DuplexStream;

use super::*;

const MAX: usize = 1 << 16;
const DEADLINE: Duration = Duration::from_secs(10);

fn message(payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    v.extend_from_slice(payload);
    v
}

fn options() -> ClientOptions {
    ClientOptions { max_message_bytes: MAX, keepalive: None, keepalive_timeout: Duration::from_secs(1) }
}

async fn ws_pair() -> (WebSocketStream<DuplexStream>, WebSocketStream<DuplexStream>) {
    let (c, s) = tokio::io::duplex(1 << 16);
    let client = WebSocketStream::from_raw_socket(c, Role::Client, Some(config(MAX))).await;
    let server = WebSocketStream::from_raw_socket(s, Role::Server, Some(config(MAX))).await;
    (client, server)
}

/// A gRPC-shaped HTTP/2 server: `/echo` answers every request message back and ends with
/// `grpc-status: 0` and the number of messages; `/deny` answers trailers-only; `/hang` sends
/// headers and never ends, telling `hung_up` when the call is cancelled.
async fn upstream(hung_up: mpsc::Sender<()>) -> hyper::client::conn::http2::SendRequest<Body> {
    let (a, b) = tokio::io::duplex(1 << 16);
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let hung_up = hung_up.clone();
        async move {
            let saw_auth = request.headers().get("authorization").cloned();
            let saw_te = request.headers().get("te").cloned();
            let path = request.uri().path().to_owned();
            let (tx, body) = channel_body();
            let mut response = Response::new(body);
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            if let Some(auth) = saw_auth {
                response.headers_mut().insert("x-saw-auth", auth);
            }
            if let Some(te) = saw_te {
                response.headers_mut().insert("x-saw-te", te);
            }
            match path.as_str() {
                "/deny" => {
                    let _ = tonic::Status::permission_denied("no").add_header(response.headers_mut());
                    *response.body_mut() = empty_body();
                }
                "/hang" => {
                    tokio::spawn(async move {
                        tx.closed().await;
                        let _ = hung_up.send(()).await;
                    });
                }
                _ => {
                    let mut incoming = request.into_body();
                    tokio::spawn(async move {
                        let mut count = 0;
                        while let Some(Ok(frame)) = incoming.frame().await {
                            if let Ok(data) = frame.into_data() {
                                count += 1;
                                let _ = tx.send(Ok(Frame::data(data))).await;
                            }
                        }
                        let mut trailers = status_headers(&tonic::Status::ok(""));
                        trailers.remove(CONTENT_TYPE);
                        trailers.insert("x-chunks", HeaderValue::from(count));
                        let _ = tx.send(Ok(Frame::trailers(trailers))).await;
                    });
                }
            }
            Ok::<_, Infallible>(response)
        }
    });
    tokio::spawn(
        hyper::server::conn::http2::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(b), service),
    );
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(a)).await.unwrap();
    tokio::spawn(conn);
    send
}

fn upgrade_head(path: &str) -> http::request::Parts {
    let request = Request::builder()
        .method(Method::GET)
        .uri(path)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("sec-websocket-protocol", SUBPROTOCOL)
        .header("content-type", "application/grpc")
        .header("authorization", "token-1")
        .body(())
        .unwrap();
    request.into_parts().0
}

/// A request body of fixed chunks.
type ChunkBody = StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

fn request_body(chunks: Vec<Vec<u8>>) -> ChunkBody {
    let frames: Vec<_> = chunks.into_iter().map(|c| Ok(Frame::data(Bytes::from(c)))).collect();
    StreamBody::new(futures::stream::iter(frames))
}

#[tokio::test]
async fn a_call_round_trips_with_metadata_messages_and_trailers() {
    let (client, server) = ws_pair().await;
    let (hung_up, _) = mpsc::channel(1);
    let send = upstream(hung_up).await;
    let head = upgrade_head("/echo");
    let served = tokio::spawn(async move { serve(server, &head, send, MAX).await });

    // Two messages, the first cut across chunks: the splitter makes one WebSocket message each.
    let one = message(b"first");
    let two = message(&[7; 300]);
    let chunks = vec![one[..3].to_vec(), [&one[3..], &two[..]].concat()];
    let response = tokio::time::timeout(DEADLINE, forward(client, request_body(chunks), options())).await.unwrap();
    assert_eq!(response.headers().get("x-saw-auth").unwrap(), "token-1");
    assert_eq!(response.headers().get("x-saw-te").unwrap(), "trailers");
    assert!(response.headers().get("grpc-status").is_none());
    let collected = tokio::time::timeout(DEADLINE, response.into_body().collect()).await.unwrap().unwrap();
    let trailers = collected.trailers().cloned().unwrap();
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    assert!(trailers.get("x-chunks").is_some());
    assert_eq!(collected.to_bytes(), [one, two].concat());
    assert_eq!(tokio::time::timeout(DEADLINE, served).await.unwrap().unwrap(), Served::Answered);
}

#[tokio::test]
async fn trailers_only_answers_stay_trailers_only() {
    let (client, server) = ws_pair().await;
    let (hung_up, _) = mpsc::channel(1);
    let send = upstream(hung_up).await;
    let head = upgrade_head("/deny");
    let served = tokio::spawn(async move { serve(server, &head, send, MAX).await });
    let response = tokio::time::timeout(DEADLINE, forward(client, request_body(vec![]), options())).await.unwrap();
    let status = tonic::Status::from_header_map(response.headers()).unwrap();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert!(http_body::Body::is_end_stream(response.body()));
    assert_eq!(tokio::time::timeout(DEADLINE, served).await.unwrap().unwrap(), Served::Answered);
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_call() {
    let (client, server) = ws_pair().await;
    let (hung_up, mut cancelled) = mpsc::channel(1);
    let send = upstream(hung_up).await;
    let head = upgrade_head("/hang");
    let served = tokio::spawn(async move { serve(server, &head, send, MAX).await });
    let (tx, body) = channel_body();
    let response = tokio::time::timeout(DEADLINE, forward(client, body, options())).await.unwrap();
    assert!(response.headers().get("grpc-status").is_none());
    drop((response, tx));
    tokio::time::timeout(DEADLINE, cancelled.recv()).await.unwrap().unwrap();
    let outcome = tokio::time::timeout(DEADLINE, served).await.unwrap().unwrap();
    assert!(matches!(outcome, Served::ClientGone(_)), "{outcome:?}");
}

#[tokio::test]
async fn an_oversized_client_message_closes_with_message_too_big() {
    let (mut client, server) = ws_pair().await;
    let (hung_up, _) = mpsc::channel(1);
    let send = upstream(hung_up).await;
    let head = upgrade_head("/hang");
    let served = tokio::spawn(async move { serve(server, &head, send, 16).await });
    client.send(Message::Binary(message(&[1; 17]).into())).await.unwrap();
    let outcome = tokio::time::timeout(DEADLINE, served).await.unwrap().unwrap();
    assert!(matches!(&outcome, Served::ClientGone(why) if why.contains("exceeds the limit")), "{outcome:?}");
    // The client is told why: the answer's headers, then a close frame with 1009.
    let mut close = None;
    while let Some(Ok(m)) = tokio::time::timeout(DEADLINE, client.next()).await.unwrap() {
        if let Message::Close(frame) = m {
            close = frame;
            break;
        }
    }
    assert_eq!(close.map(|f| f.code), Some(CloseCode::Size));
}

#[tokio::test]
async fn a_silent_server_fails_the_call_as_unavailable_with_keepalive() {
    let (client, _server) = ws_pair().await;
    let options = ClientOptions {
        keepalive: Some(Duration::from_millis(50)),
        keepalive_timeout: Duration::from_millis(50),
        ..options()
    };
    // `_server` is never read, so no pong comes back.
    let response = tokio::time::timeout(DEADLINE, forward(client, request_body(vec![]), options)).await.unwrap();
    let status = tonic::Status::from_header_map(response.headers()).unwrap();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("not even an answer to pings"), "{}", status.message());
}

#[tokio::test]
async fn a_server_that_closes_early_fails_the_call_as_unavailable() {
    let (client, mut server) = ws_pair().await;
    tokio::spawn(async move {
        let _ = server.close(None).await;
        while server.next().await.is_some() {}
    });
    let response = tokio::time::timeout(DEADLINE, forward(client, request_body(vec![]), options())).await.unwrap();
    let status = tonic::Status::from_header_map(response.headers()).unwrap();
    assert_eq!(status.code(), tonic::Code::Unavailable);
}

/// Answers the client's handshake with `answer` (where `{accept}` is replaced by the right
/// accept key) and returns what the client sent.
async fn scripted(answer: &'static str) -> (Result<WebSocketStream<DuplexStream>, HandshakeError>, String) {
    let (c, mut s) = tokio::io::duplex(1 << 16);
    let server = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while !got.ends_with(b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8(got).unwrap();
        let key = text
            .lines()
            .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
            .map(|k| tungstenite::handshake::derive_accept_key(k.trim().as_bytes()))
            .unwrap();
        s.write_all(answer.replace("{accept}", &key).as_bytes()).await.unwrap();
        (text, s)
    });
    let mut headers = HeaderMap::new();
    headers.insert("authorization", HeaderValue::from_static("jwt"));
    headers.insert("te", HeaderValue::from_static("trailers"));
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    let result = handshake(c, "principal:8443", "/authapi.Authentication/Authenticate", &headers, MAX).await;
    let (sent, _s) = server.await.unwrap();
    (result, sent)
}

#[tokio::test]
async fn the_handshake_sends_grpc_headers_and_checks_the_answer() {
    let ok = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n";
    let (result, sent) = scripted(ok).await;
    assert!(result.is_ok(), "{:?}", result.err());
    assert!(
        sent.starts_with("GET /authapi.Authentication/Authenticate HTTP/1.1\r\nHost: principal:8443\r\n"),
        "{sent}"
    );
    assert!(sent.contains("Sec-WebSocket-Protocol: grpc-ws\r\n"));
    assert!(sent.contains("authorization: jwt\r\n"));
    assert!(sent.contains("content-type: application/grpc\r\n"));
    assert!(!sent.contains("te: trailers"), "hop-by-hop headers stay out: {sent}");

    // Our principal names the subprotocol; grpc-http1's does not. Both are fine.
    let named = "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-accept: {accept}\r\nsec-websocket-protocol: grpc-ws\r\n\r\n";
    assert!(scripted(named).await.0.is_ok());
}

#[tokio::test]
async fn handshake_refusals_say_what_the_server_said() {
    let (result, _) = scripted("HTTP/1.1 426 Upgrade Required\r\nContent-Length: 12\r\n\r\nneeds grpcws").await;
    let error = result.err().unwrap().to_string();
    assert!(error.contains("HTTP 426 Upgrade Required: needs grpcws"), "{error}");
    assert!(error.contains("--enable-websocket"), "{error}");

    let wrong_key = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: nope\r\n\r\n";
    assert!(matches!(scripted(wrong_key).await.0, Err(HandshakeError::BadAnswer(_))));
    let other_protocol = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: chat\r\n\r\n";
    assert!(matches!(scripted(other_protocol).await.0, Err(HandshakeError::BadAnswer(e)) if e.contains("chat")));
    let no_upgrade =
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n";
    assert!(matches!(scripted(no_upgrade).await.0, Err(HandshakeError::BadAnswer(_))));
    assert!(matches!(scripted("garbage\r\n\r\n").await.0, Err(HandshakeError::BadAnswer(_))));
}

#[tokio::test]
async fn an_endless_handshake_answer_is_cut_off() {
    let (c, mut s) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await;
        let _ = s.write_all(b"HTTP/1.1 101 Switching Protocols\r\n").await;
        loop {
            if s.write_all(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n").await.is_err() {
                return;
            }
        }
    });
    let result = handshake(c, "p:1", "/x", &HeaderMap::new(), MAX).await;
    assert!(matches!(result, Err(HandshakeError::BadAnswer(_))), "{:?}", result.err());
}

#[test]
fn upgrade_checks_follow_grpc_http1() {
    let head = upgrade_head("/eventstreamapi.EventStream/Subscribe");
    let answer = check_upgrade(&head).unwrap();
    assert_eq!(answer.get("sec-websocket-accept").unwrap(), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    assert_eq!(answer.get("sec-websocket-protocol").unwrap(), SUBPROTOCOL);

    let mut plain = upgrade_head("/x");
    plain.headers.remove("sec-websocket-protocol");
    assert_eq!(check_upgrade(&plain).unwrap_err().status, StatusCode::UPGRADE_REQUIRED);

    let mut stripped = upgrade_head("/x");
    stripped.headers.remove("connection");
    let refusal = check_upgrade(&stripped).unwrap_err();
    assert_eq!(refusal.status, StatusCode::BAD_REQUEST);
    assert!(refusal.message.contains("Connection: Upgrade"), "{}", refusal.message);

    let mut listed = upgrade_head("/x");
    listed.headers.insert("connection", HeaderValue::from_static("keep-alive, Upgrade"));
    listed.headers.insert("sec-websocket-protocol", HeaderValue::from_static("other, grpc-ws"));
    assert!(check_upgrade(&listed).is_ok());

    let mut post = upgrade_head("/x");
    post.method = Method::POST;
    assert_eq!(check_upgrade(&post).unwrap_err().status, StatusCode::METHOD_NOT_ALLOWED);

    let mut old = upgrade_head("/x");
    old.headers.insert("sec-websocket-version", HeaderValue::from_static("8"));
    assert_eq!(check_upgrade(&old).unwrap_err().status, StatusCode::BAD_REQUEST);

    let mut keyless = upgrade_head("/x");
    keyless.headers.remove("sec-websocket-key");
    assert_eq!(check_upgrade(&keyless).unwrap_err().status, StatusCode::BAD_REQUEST);
}

#[test]
fn the_grpc_request_keeps_metadata_and_drops_hop_headers() {
    let head = upgrade_head("/authapi.Authentication/Authenticate");
    let request = grpc_request(&head, empty_body());
    assert_eq!(request.method(), Method::POST);
    assert_eq!(request.uri().path(), "/authapi.Authentication/Authenticate");
    assert_eq!(request.headers().get("authorization").unwrap(), "token-1");
    assert_eq!(request.headers().get("te").unwrap(), "trailers");
    assert!(request.headers().keys().all(|k| !k.as_str().starts_with("sec-websocket")));
    assert!(request.headers().get("connection").is_none() && request.headers().get("upgrade").is_none());
}
