//! Web terminals through the resource proxy (`pods/<p>/exec` over WebSocket, upstream §5.4):
//! `kubectl exec` and Argo CD's terminal reach a pod on an agent's cluster.
//!
//! The request must be a WebSocket upgrade offering `v5.channel.k8s.io` or `v4.channel.k8s.io`
//! (or no subprotocol at all, as Argo CD's UI may); SPDY is not served. The principal answers
//! `101`, sends the agent a `terminal-request` event with a fresh session UUID, and waits (at
//! most [`Limits::attach`]) for that agent, and only that agent, to open `StreamTerminal` for
//! the UUID ([`super::Pending`] binds the session to the agent it was created for; upstream
//! lets any agent take any session). Then it bridges:
//!
//! * client → agent: binary frames `[0, bytes…]` (stdin), `[4, {"Width","Height"}]` (resize),
//!   v5 `[255, 0]` (stdin closed: `eof` with `stream_type "stdin"`), and Argo CD's text frames
//!   (`{"operation":"resize","cols","rows"}`, `{"operation":"stdin","data"}`);
//! * agent → client: `stdout`/`stderr` data on channels 1/2; the end of the session as a
//!   `Status` on channel 3, then a normal close. The agent ends with `eof` (success: `Status`
//!   `Success`) or `error`: our agent puts the API server's `Status` JSON there (e.g.
//!   `NonZeroExitCode` with the exit code, which kubectl turns into its own exit code); an
//!   upstream agent puts an error text there, read as `command terminated with exit code N`
//!   when it says so, else as a failure with that message.
//!
//! Terminals are served for managed agents only (as upstream): a terminal runs commands on the
//! spoke with the agent's credentials, which an autonomous agent's cluster never granted the
//! hub. The agent refuses as well, and also with `--enable-resource-proxy=false` and for pods
//! that are not managed by an Argo CD Application there.

use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use protocol::payload::{ApiResource, ContainerTerminalRequest, is_status, status_body};
use protocol::pb::terminalstreamapi::TerminalStreamData;
use protocol::{AgentMode, Event, EventType, Target};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

use protocol::remotecommand::{self, ClientFrame, ERROR, STDERR, STDIN, STDOUT, V5};

use super::{ProxyBody, ResourceProxy, boxed, status};

/// An agent's `StreamTerminal` call, handed to the terminal session waiting for it.
#[derive(Debug)]
pub(crate) struct Attach {
    /// What the agent sends (its first frame, the handshake, already read).
    pub(crate) from_agent: tonic::Streaming<TerminalStreamData>,
    /// What the principal sends the agent; the call ends when this is dropped.
    pub(crate) to_agent: mpsc::Sender<Result<TerminalStreamData, tonic::Status>>,
}

/// Frames buffered towards the agent (upstream's channel buffers: 100).
pub(crate) const BUFFER: usize = 100;

/// How long a terminal session may wait and idle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// The agent must open `StreamTerminal` within this.
    pub(crate) attach: Duration,
    /// Nothing either way for this long ends the session (upstream's session time-out).
    pub(crate) idle: Duration,
    /// The client must complete the WebSocket upgrade within this.
    pub(crate) upgrade: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self { attach: Duration::from_secs(30), idle: Duration::from_secs(30 * 60), upgrade: Duration::from_secs(10) }
    }
}

/// Answers `…/pods/<p>/exec` (a WebSocket upgrade) for `agent`.
pub(super) async fn serve<B>(
    proxy: &ResourceProxy,
    agent: &str,
    target: ApiResource,
    mut req: Request<B>,
) -> Response<ProxyBody>
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
{
    if target.namespace.is_empty() || target.name.is_empty() {
        return boxed(status::failure(StatusCode::BAD_REQUEST, "exec needs a pod: …/namespaces/<ns>/pods/<pod>/exec"));
    }
    let params = match ExecParams::parse(req.uri().query().unwrap_or("")) {
        Ok(p) => p,
        Err(message) => return boxed(status::failure(StatusCode::BAD_REQUEST, &message)),
    };
    let peer = match proxy.connected(agent) {
        Ok(peer) => peer,
        Err(resp) => return boxed(resp),
    };
    if peer.mode() != AgentMode::Managed {
        return boxed(status::failure(
            StatusCode::FORBIDDEN,
            &format!("terminals are served for managed agents only; agent {agent:?} is autonomous"),
        ));
    }
    // Checked after the refusals above: kubectl falls back to SPDY when the WebSocket upgrade
    // is refused, and prints what the SPDY attempt is answered; so that says why.
    let (protocol, key) = match check_upgrade(req.method(), req.headers()) {
        Ok(found) => found,
        Err(message) => return boxed(status::failure(StatusCode::BAD_REQUEST, &message)),
    };
    let uuid = protocol::event::new_uuid();
    let (ticket, attached) = match proxy.tables.terminals.begin(agent, &uuid, proxy.config.max_in_flight_per_agent) {
        Ok(t) => t,
        Err(busy) => {
            return boxed(status::busy(&format!(
                "agent {agent:?} already has {} terminal sessions open",
                busy.in_flight
            )));
        }
    };
    let request = ContainerTerminalRequest {
        uuid: uuid.clone(),
        namespace: target.namespace.clone(),
        pod_name: target.name.clone(),
        container_name: params.container,
        command: params.command,
        tty: params.tty,
        stdin: params.stdin,
        stdout: params.stdout,
        stderr: params.stderr,
    };
    let event = match Event::request(EventType::TerminalRequest, Target::Terminal, &uuid).with_json(&request) {
        Ok(e) => e.with_principal_uid(proxy.hub.principal_uid.clone()),
        Err(e) => {
            return boxed(status::failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("cannot encode the terminal request: {e}"),
            ));
        }
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    peer.push(event);
    tracing::info!(%agent, %uuid, namespace = %target.namespace, pod = %target.name, tty = request.tty,
        protocol = protocol.unwrap_or(""), "terminal session requested");
    let limits = Limits::default();
    let agent = agent.to_owned();
    tokio::spawn(async move {
        // The session counts against the agent's bound until it ends.
        let _ticket = ticket;
        let upgraded = match tokio::time::timeout(limits.upgrade, on_upgrade).await {
            Ok(Ok(upgraded)) => upgraded,
            Ok(Err(error)) => {
                peer.mailbox().withdraw(&uuid);
                return tracing::debug!(%agent, %uuid, %error, "terminal: WebSocket upgrade failed");
            }
            Err(_) => {
                peer.mailbox().withdraw(&uuid);
                return tracing::debug!(%agent, %uuid, "terminal: WebSocket upgrade timed out");
            }
        };
        let ws =
            WebSocketStream::from_raw_socket(hyper_util::rt::TokioIo::new(upgraded), Role::Server, Some(ws_config()))
                .await;
        let attach = async {
            let attach = tokio::time::timeout(limits.attach, attached).await;
            // Attached or not, the request must not be sent (again) from now on.
            peer.mailbox().withdraw(&uuid);
            match attach {
                Ok(Ok(attach)) => Ok(attach),
                Ok(Err(_)) => {
                    Err(status_body(502, &format!("agent {agent:?} disconnected before it opened the terminal")))
                }
                Err(_) => Err(status_body(
                    504,
                    &format!("agent {agent:?} did not open the terminal within {:?}", limits.attach),
                )),
            }
        };
        let session = Session { agent: agent.clone(), uuid: uuid.clone(), protocol, limits };
        let end = session.run(ws, attach).await;
        tracing::info!(%agent, %uuid, end = ?end, "terminal session ended");
    });
    boxed(switching(&key, protocol))
}

/// Largest client message (a terminal's keystrokes, a pasted block, a resize): what waits
/// towards the agent stays bounded (`BUFFER` messages of at most this).
const MAX_CLIENT_MESSAGE: usize = 256 << 10;

/// The terminal WebSocket's limits: client messages bounded by [`MAX_CLIENT_MESSAGE`] (a
/// larger one ends the session), the default buffers otherwise.
fn ws_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_CLIENT_MESSAGE))
        .max_frame_size(Some(MAX_CLIENT_MESSAGE))
}

/// The `101 Switching Protocols` answer.
fn switching(key: &str, protocol: Option<&'static str>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = resp.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    if let Ok(v) = HeaderValue::from_str(&accept) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Some(p) = protocol {
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(p));
    }
    resp
}

/// Whether the request is a WebSocket upgrade this proxy serves: the subprotocol chosen
/// (`None`: the client offered none) and the `Sec-WebSocket-Key`; else why not.
fn check_upgrade(method: &Method, headers: &HeaderMap) -> Result<(Option<&'static str>, String), String> {
    const NEEDED: &str = "exec through the resource proxy needs a WebSocket upgrade (GET, Upgrade: websocket) \
        with subprotocol v5.channel.k8s.io or v4.channel.k8s.io; SPDY is not served";
    if method != Method::GET || !remotecommand::is_websocket_upgrade(headers) {
        return Err(NEEDED.to_owned());
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY).and_then(|v| v.to_str().ok()).map(str::trim) else {
        return Err(format!("{NEEDED} (Sec-WebSocket-Key is missing)"));
    };
    if headers.get(header::SEC_WEBSOCKET_VERSION).and_then(|v| v.to_str().ok()).map(str::trim) != Some("13") {
        return Err(format!("{NEEDED} (Sec-WebSocket-Version must be 13)"));
    }
    let offered: Vec<&str> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    match negotiate(&offered) {
        Ok(p) => Ok((p, key.to_owned())),
        Err(()) => Err(format!("{NEEDED} (offered: {})", offered.join(", "))),
    }
}

/// The subprotocol to speak: v5 before v4; `None` when none was offered (answered without a
/// subprotocol, framed as v4); an error when only others were offered.
fn negotiate(offered: &[&str]) -> Result<Option<&'static str>, ()> {
    if offered.is_empty() {
        return Ok(None);
    }
    remotecommand::negotiate(offered.iter().copied()).map(Some).ok_or(())
}

/// What `…/exec?…` asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)] // The query's shape.
struct ExecParams {
    container: String,
    command: Vec<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

impl ExecParams {
    /// Reads the query as the API server does (`command` repeated, flags as Go's
    /// `strconv.ParseBool`). Argo CD's UI shape (no stream flags at all) is an interactive
    /// terminal: tty, stdin and stdout; its single `command` may hold arguments separated by
    /// blanks.
    fn parse(query: &str) -> Result<Self, String> {
        let mut p = Self::default();
        let mut flags = false;
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            let flag = || match v.as_ref() {
                "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
                "" | "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
                other => Err(format!("query parameter {k}={other:?} is not a boolean")),
            };
            match k.as_ref() {
                "container" => p.container = v.into_owned(),
                "command" => p.command.push(v.into_owned()),
                "stdin" => (p.stdin, flags) = (flag()?, true),
                "stdout" => (p.stdout, flags) = (flag()?, true),
                "stderr" => (p.stderr, flags) = (flag()?, true),
                "tty" => (p.tty, flags) = (flag()?, true),
                _ => {}
            }
        }
        if !flags {
            (p.tty, p.stdin, p.stdout, p.stderr) = (true, true, true, false);
            if let [single] = p.command.as_slice() {
                p.command = single.split_whitespace().map(str::to_owned).collect();
            }
        }
        if p.command.iter().all(|c| c.is_empty()) {
            return Err("exec needs a command (query parameter command, repeated for each argument)".to_owned());
        }
        if !(p.stdin || p.stdout || p.stderr) {
            return Err("at least one of stdin, stdout and stderr must be true".to_owned());
        }
        if p.tty && p.stderr {
            // As kubectl and the kubelet: a terminal has one output.
            p.stderr = false;
        }
        Ok(p)
    }
}

/// A client frame, as the agent is to see it (`None`: nothing for the agent).
fn client_frame(uuid: &str, msg: &Message, protocol: Option<&str>) -> Option<TerminalStreamData> {
    let frame = |f: TerminalStreamData| Some(TerminalStreamData { request_uuid: uuid.to_owned(), ..f });
    let resize = |cols: u32, rows: u32| frame(TerminalStreamData { resize: true, cols, rows, ..Default::default() });
    let stdin = |data: Vec<u8>| {
        (!data.is_empty()).then(|| TerminalStreamData {
            request_uuid: uuid.to_owned(),
            data,
            stream_type: "stdin".to_owned(),
            ..Default::default()
        })
    };
    match msg {
        Message::Binary(b) => match remotecommand::parse_client_frame(b, protocol == Some(V5)) {
            Ok(ClientFrame::Stdin(data)) => stdin(data.to_vec()),
            Ok(ClientFrame::Resize(size)) => resize(u32::from(size.width), u32::from(size.height)),
            Ok(ClientFrame::Close(STDIN)) => {
                frame(TerminalStreamData { stream_type: "stdin".to_owned(), eof: true, ..Default::default() })
            }
            Ok(ClientFrame::Close(_)) | Err(_) => None,
        },
        Message::Text(t) => {
            let v: serde_json::Value = serde_json::from_str(t.as_str()).ok()?;
            match v["operation"].as_str() {
                Some("resize") => resize(dimension(&v["cols"])?, dimension(&v["rows"])?),
                Some("stdin") => stdin(v["data"].as_str()?.as_bytes().to_vec()),
                None => resize(dimension(&v["Width"])?, dimension(&v["Height"])?),
                Some(_) => None,
            }
        }
        _ => None,
    }
}

fn dimension(v: &serde_json::Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok()).filter(|&n| n <= u32::from(u16::MAX))
}

/// What an agent frame means for the client: output on a channel, and whether it ends the
/// session with a `Status` (JSON text).
fn agent_frame(f: &TerminalStreamData) -> (Option<(u8, &[u8])>, Option<String>) {
    let output = (!f.data.is_empty()).then(|| (if f.stream_type == "stderr" { STDERR } else { STDOUT }, &f.data[..]));
    let end = if !f.error.is_empty() {
        Some(agent_error(&f.error))
    } else if f.eof {
        Some(success())
    } else {
        None
    };
    (output, end)
}

/// The `Status` of an agent's `error`: ours sends the API server's `Status` JSON; an upstream
/// agent sends client-go's error text.
fn agent_error(error: &str) -> String {
    if is_status(error) {
        return error.to_owned();
    }
    let code = error.rsplit_once("exit code ").and_then(|(_, n)| n.trim().parse::<i64>().ok());
    match code {
        Some(code) => non_zero_exit(code, error),
        None => status_body(500, &format!("the agent's terminal failed: {error}")),
    }
}

/// A `Status` of success, as the kubelet sends when the command exits 0 (typed, so it passes
/// [`is_status`] on its way between agent and principal).
pub(crate) fn success() -> String {
    typed(remotecommand::success_status())
}

/// A `Status` of a non-zero exit code, as the kubelet sends it (kubectl exits with `code`).
pub(crate) fn non_zero_exit(code: i64, message: &str) -> String {
    typed(remotecommand::exit_code_status(code, message))
}

/// `status` with its `kind` and `apiVersion`.
fn typed(mut status: serde_json::Value) -> String {
    status["kind"] = "Status".into();
    status["apiVersion"] = "v1".into();
    status.to_string()
}

/// How a session ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// With this `Status` (JSON) on channel 3.
    Status(String),
    /// The client went away (or its connection failed).
    ClientGone,
}

/// One terminal session.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) agent: String,
    pub(crate) uuid: String,
    pub(crate) protocol: Option<&'static str>,
    pub(crate) limits: Limits,
}

impl Session {
    /// Waits for the agent (`attach`, which answers the failure `Status` when it does not
    /// come), then bridges `ws` and the agent's call until either side ends.
    pub(crate) async fn run<S>(
        &self,
        ws: WebSocketStream<S>,
        attach: impl Future<Output = Result<Attach, String>>,
    ) -> End
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let (mut sink, mut stream) = ws.split();
        // The client's frames wait in the connection meanwhile (stdin sent early included).
        let end = match attach.await {
            Ok(attach) => self.bridge(&mut sink, &mut stream, attach).await,
            Err(status) => End::Status(status),
        };
        if let End::Status(status) = &end {
            let failed = !status.contains("\"Success\"");
            let mut frame = Vec::with_capacity(status.len() + 1);
            frame.push(ERROR);
            frame.extend_from_slice(status.as_bytes());
            let reason = if failed { "terminal session failed" } else { "" };
            let close = CloseFrame { code: CloseCode::Normal, reason: reason.into() };
            if sink.send(Message::binary(frame)).await.is_ok() && sink.send(Message::Close(Some(close))).await.is_ok() {
                // Let the client answer the close (bounded), so nothing it still reads is cut.
                let _ = tokio::time::timeout(Duration::from_secs(2), async {
                    while let Some(Ok(_)) = stream.next().await {}
                })
                .await;
            }
        }
        // Close the connection itself cleanly too (TLS close_notify).
        if let Ok(mut ws) = sink.reunite(stream) {
            let _ = tokio::time::timeout(Duration::from_secs(2), ws.get_mut().shutdown()).await;
        }
        end
    }

    async fn bridge<S>(
        &self,
        sink: &mut futures::stream::SplitSink<WebSocketStream<S>, Message>,
        stream: &mut futures::stream::SplitStream<WebSocketStream<S>>,
        attach: Attach,
    ) -> End
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let Attach { mut from_agent, to_agent } = attach;
        tracing::debug!(agent = %self.agent, uuid = %self.uuid, "terminal: the agent attached");
        let idle = tokio::time::sleep(self.limits.idle);
        tokio::pin!(idle);
        // A client frame waiting for room towards the agent: the client is not read meanwhile,
        // while the agent's output still is (no deadlock when both directions fill up).
        let mut waiting: Option<TerminalStreamData> = None;
        loop {
            tokio::select! {
                msg = stream.next(), if waiting.is_none() => match msg {
                    None | Some(Err(_) | Ok(Message::Close(_))) => return End::ClientGone,
                    Some(Ok(msg)) => {
                        // Pings and other frames that carry nothing do not keep a session alive.
                        waiting = client_frame(&self.uuid, &msg, self.protocol);
                        if waiting.is_some() {
                            idle.as_mut().reset(tokio::time::Instant::now() + self.limits.idle);
                        }
                    }
                },
                permit = to_agent.reserve(), if waiting.is_some() => match (permit, waiting.take()) {
                    (Ok(permit), Some(frame)) => permit.send(Ok(frame)),
                    _ => return End::Status(status_body(502, &format!("agent {:?} ended the terminal", self.agent))),
                },
                msg = from_agent.message() => match msg {
                    Ok(Some(frame)) => {
                        idle.as_mut().reset(tokio::time::Instant::now() + self.limits.idle);
                        let (output, end) = agent_frame(&frame);
                        if let Some((channel, data)) = output {
                            let mut out = Vec::with_capacity(data.len() + 1);
                            out.push(channel);
                            out.extend_from_slice(data);
                            if sink.send(Message::binary(out)).await.is_err() {
                                return End::ClientGone;
                            }
                        }
                        if let Some(status) = end {
                            return End::Status(status);
                        }
                    }
                    Ok(None) => {
                        return End::Status(status_body(
                            502,
                            &format!("agent {:?} ended the terminal stream without a result", self.agent),
                        ));
                    }
                    Err(status) => {
                        return End::Status(status_body(
                            502,
                            &format!("agent {:?}: the terminal stream failed: {}", self.agent, status.message()),
                        ));
                    }
                },
                () = &mut idle => {
                    return End::Status(status_body(
                        504,
                        &format!("the terminal was idle for {:?} and is closed", self.limits.idle),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;
    use protocol::remotecommand::V4;
    use tonic::codec::Codec as _;

    const UUID: &str = "u1";

    fn bin(bytes: &[u8]) -> Message {
        Message::binary(bytes.to_vec())
    }

    #[test]
    fn v5_is_preferred_then_v4_and_others_are_refused() {
        assert_eq!(negotiate(&["v4.channel.k8s.io", "v5.channel.k8s.io"]), Ok(Some(V5)));
        assert_eq!(negotiate(&["V4.Channel.K8s.io"]), Ok(Some(V4)));
        assert_eq!(negotiate(&[]), Ok(None), "no subprotocol offered: served without one");
        assert_eq!(negotiate(&["base64.channel.k8s.io", "channel.k8s.io"]), Err(()));

        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(header::SEC_WEBSOCKET_KEY, HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="));
        headers.insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
        headers.append(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static("v4.channel.k8s.io"));
        headers.append(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static("v5.channel.k8s.io"));
        let (protocol, key) = check_upgrade(&Method::GET, &headers).expect("an upgrade");
        assert_eq!((protocol, key.as_str()), (Some(V5), "dGhlIHNhbXBsZSBub25jZQ=="));
        let resp = switching(&key, protocol);
        assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(resp.headers()[header::SEC_WEBSOCKET_ACCEPT], "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(resp.headers()[header::SEC_WEBSOCKET_PROTOCOL], V5);

        let spdy = check_upgrade(&Method::POST, &HeaderMap::new()).expect_err("not a WebSocket");
        assert!(spdy.contains("SPDY is not served"), "{spdy}");
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static("SPDY/3.1"));
        assert!(check_upgrade(&Method::GET, &headers).expect_err("refused").contains("offered: SPDY/3.1"));
    }

    #[test]
    fn exec_queries_of_kubectl_and_of_argo_cds_ui() {
        let kubectl = ExecParams::parse(
            "command=sh&command=-c&command=echo%20a%20b&container=c&stdin=true&stdout=true&stderr=true",
        )
        .expect("valid");
        assert_eq!(kubectl.command, ["sh", "-c", "echo a b"]);
        assert!(kubectl.stdin && kubectl.stdout && kubectl.stderr && !kubectl.tty);
        assert_eq!(kubectl.container, "c");
        let tty = ExecParams::parse("command=sh&stdin=1&stdout=1&stderr=1&tty=1").expect("valid");
        assert!(tty.tty && !tty.stderr, "a terminal has one output");
        let ui = ExecParams::parse("container=main&command=bash%20-l").expect("valid");
        assert_eq!(ui.command, ["bash", "-l"]);
        assert!(ui.tty && ui.stdin && ui.stdout && !ui.stderr);
        assert!(ExecParams::parse("stdin=true").is_err(), "a command is needed");
        assert!(ExecParams::parse("command=ls&stdin=maybe").is_err());
        assert!(ExecParams::parse("command=ls&stdout=false").is_err(), "no stream at all");
    }

    #[test]
    fn client_frames_become_terminal_stream_data() {
        let stdin = client_frame(UUID, &bin(b"\x00ls\n"), Some(V5)).expect("stdin");
        assert_eq!(
            (stdin.request_uuid.as_str(), stdin.stream_type.as_str(), &stdin.data[..]),
            (UUID, "stdin", &b"ls\n"[..])
        );
        assert!(client_frame(UUID, &bin(b"\x00"), Some(V5)).is_none(), "empty stdin");
        let resize = client_frame(UUID, &bin(b"\x04{\"Width\":120,\"Height\":40}"), Some(V4)).expect("resize");
        assert!(resize.resize && resize.cols == 120 && resize.rows == 40);
        let eof = client_frame(UUID, &bin(&[255, 0]), Some(V5)).expect("stdin closed");
        assert!(eof.eof && eof.stream_type == "stdin" && eof.data.is_empty());
        assert!(client_frame(UUID, &bin(&[255, 0]), Some(V4)).is_none(), "v4 has no close frame");
        assert!(client_frame(UUID, &bin(&[255, 1]), Some(V5)).is_none(), "only stdin is the client's to close");
        let ui =
            client_frame(UUID, &Message::text(r#"{"operation":"resize","cols":80,"rows":24}"#), None).expect("resize");
        assert!(ui.resize && ui.cols == 80 && ui.rows == 24);
        let ui = client_frame(UUID, &Message::text(r#"{"operation":"stdin","data":"ls\r"}"#), None).expect("stdin");
        assert_eq!(ui.data, b"ls\r");
        let plain = client_frame(UUID, &Message::text(r#"{"Width":100,"Height":30}"#), None).expect("resize");
        assert!(plain.resize && plain.cols == 100);
        assert!(client_frame(UUID, &Message::text("hello"), None).is_none());
        assert!(client_frame(UUID, &bin(b"\x04{\"Width\":-1,\"Height\":2}"), Some(V5)).is_none());
    }

    #[test]
    fn agent_results_become_the_status_kubectl_reads() {
        let out = TerminalStreamData { data: b"hi".to_vec(), stream_type: "stdout".into(), ..Default::default() };
        assert_eq!(agent_frame(&out), (Some((STDOUT, &b"hi"[..])), None));
        let err = TerminalStreamData { data: b"oops".to_vec(), stream_type: "stderr".into(), ..Default::default() };
        assert_eq!(agent_frame(&err).0, Some((STDERR, &b"oops"[..])));
        let eof = TerminalStreamData { eof: true, ..Default::default() };
        let status: serde_json::Value = serde_json::from_str(&agent_frame(&eof).1.expect("end")).expect("JSON");
        assert_eq!(status["status"], "Success");
        // Ours: the API server's Status, passed on.
        let ours = TerminalStreamData { error: non_zero_exit(3, "exit 3"), ..Default::default() };
        assert_eq!(agent_frame(&ours).1, Some(non_zero_exit(3, "exit 3")));
        // Upstream's: client-go's error text.
        let upstream = TerminalStreamData { error: "command terminated with exit code 7".into(), ..Default::default() };
        let status: serde_json::Value = serde_json::from_str(&agent_frame(&upstream).1.expect("end")).expect("JSON");
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(status["details"]["causes"][0]["message"], "7");
        let other = TerminalStreamData { error: "pod not found".into(), ..Default::default() };
        let status: serde_json::Value = serde_json::from_str(&agent_frame(&other).1.expect("end")).expect("JSON");
        assert_eq!((status["status"].as_str(), status["code"].as_u64()), (Some("Failure"), Some(500)));
        assert!(status["message"].as_str().is_some_and(|m| m.contains("pod not found")));
    }

    /// A `Streaming` of `frames`, as tonic decodes an agent's call.
    fn streaming(frames: mpsc::Receiver<TerminalStreamData>) -> tonic::Streaming<TerminalStreamData> {
        let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(frames).map(|m| {
            let bytes = m.encode_to_vec();
            let mut framed = vec![0];
            framed.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
            framed.extend_from_slice(&bytes);
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from(framed)))
        }));
        let mut codec = protocol::grpc_codec::Codec::<TerminalStreamData, TerminalStreamData>::default();
        tonic::Streaming::new_request(codec.decoder(), body, None, None)
    }

    async fn pair() -> (WebSocketStream<tokio::io::DuplexStream>, WebSocketStream<tokio::io::DuplexStream>) {
        let (a, b) = tokio::io::duplex(64 << 10);
        let server = WebSocketStream::from_raw_socket(a, Role::Server, None).await;
        let client = WebSocketStream::from_raw_socket(b, Role::Client, None).await;
        (server, client)
    }

    fn session(limits: Limits) -> Session {
        Session { agent: "agent-a".into(), uuid: UUID.into(), protocol: Some(V5), limits }
    }

    async fn next_binary(client: &mut WebSocketStream<tokio::io::DuplexStream>) -> Vec<u8> {
        loop {
            match tokio::time::timeout(Duration::from_secs(10), client.next()).await.expect("in time") {
                Some(Ok(Message::Binary(b))) => return b.to_vec(),
                Some(Ok(_)) => {}
                other => panic!("expected a frame, got {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_session_bridges_both_ways_and_ends_with_the_agents_status() {
        let (server, mut client) = pair().await;
        let (agent_tx, agent_rx) = mpsc::channel(16);
        let (to_agent, mut at_agent) = mpsc::channel(16);
        let attach = Attach { from_agent: streaming(agent_rx), to_agent };
        let run = tokio::spawn(async move { session(Limits::default()).run(server, async { Ok(attach) }).await });

        client.send(bin(b"\x00hello")).await.expect("sent");
        client.send(bin(b"\x04{\"Width\":90,\"Height\":20}")).await.expect("sent");
        client.send(bin(&[255, 0])).await.expect("sent");
        let got = at_agent.recv().await.expect("frame").expect("ok");
        assert_eq!((got.data.as_slice(), got.stream_type.as_str()), (&b"hello"[..], "stdin"));
        let got = at_agent.recv().await.expect("frame").expect("ok");
        assert!(got.resize && got.cols == 90 && got.rows == 20);
        assert!(at_agent.recv().await.expect("frame").expect("ok").eof, "stdin closed");

        let frame = |data: &[u8], ty: &str| TerminalStreamData {
            request_uuid: UUID.into(),
            data: data.to_vec(),
            stream_type: ty.into(),
            ..Default::default()
        };
        agent_tx.send(frame(b"out", "stdout")).await.expect("sent");
        agent_tx.send(frame(b"err", "stderr")).await.expect("sent");
        let exit = non_zero_exit(3, "command terminated with non-zero exit code");
        agent_tx.send(TerminalStreamData { error: exit.clone(), ..Default::default() }).await.expect("sent");
        assert_eq!(next_binary(&mut client).await, b"\x01out");
        assert_eq!(next_binary(&mut client).await, b"\x02err");
        let status = next_binary(&mut client).await;
        assert_eq!((status[0], &status[1..]), (ERROR, exit.as_bytes()));
        // Then the server closes; the client answers and the session is over.
        while let Some(Ok(_)) = client.next().await {}
        assert_eq!(run.await.expect("ran"), End::Status(exit));
        assert!(at_agent.recv().await.is_none(), "the agent's call ends with the session");
    }

    #[tokio::test]
    async fn an_agent_that_does_not_attach_or_stays_idle_ends_the_session_with_a_status() {
        let (server, mut client) = pair().await;
        let failed = status_body(504, "agent \"agent-a\" did not open the terminal within 30s");
        let run = tokio::spawn({
            let failed = failed.clone();
            async move { session(Limits::default()).run(server, async { Err(failed) }).await }
        });
        let status = next_binary(&mut client).await;
        assert_eq!(&status[1..], failed.as_bytes());
        while let Some(Ok(_)) = client.next().await {}
        assert!(matches!(run.await.expect("ran"), End::Status(_)));

        let (server, mut client) = pair().await;
        let (_agent_tx, agent_rx) = mpsc::channel(16);
        let (to_agent, _at_agent) = mpsc::channel(16);
        let attach = Attach { from_agent: streaming(agent_rx), to_agent };
        let limits = Limits { idle: Duration::from_millis(200), ..Limits::default() };
        let run = tokio::spawn(async move { session(limits).run(server, async { Ok(attach) }).await });
        let status = String::from_utf8(next_binary(&mut client).await).expect("text");
        assert!(status.contains("idle"), "{status}");
        while let Some(Ok(_)) = client.next().await {}
        assert!(matches!(run.await.expect("ran"), End::Status(_)));
    }

    #[tokio::test]
    async fn the_client_going_away_ends_the_agents_call() {
        let (server, mut client) = pair().await;
        let (_agent_tx, agent_rx) = mpsc::channel(16);
        let (to_agent, mut at_agent) = mpsc::channel(16);
        let attach = Attach { from_agent: streaming(agent_rx), to_agent };
        let run = tokio::spawn(async move { session(Limits::default()).run(server, async { Ok(attach) }).await });
        client.close(None).await.expect("closed");
        assert_eq!(run.await.expect("ran"), End::ClientGone);
        assert!(at_agent.recv().await.is_none());
    }
}
