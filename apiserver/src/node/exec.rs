//! `pods/{name}/exec` over WebSocket with the channel protocols `v5.channel.k8s.io` and
//! `v4.channel.k8s.io`: the command runs as a local process in the pod's working dir and env,
//! optionally on a pseudo-terminal.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures::{SinkExt as _, StreamExt as _};
use http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

use super::channel::{self, ClientFrame};
use super::pty::{MasterReader, MasterWriter, Pty};
use super::run::{self, PodRuntime};
use super::{Inner, pick_container};
use crate::error::{ApiError, ApiResult};
use crate::object::meta_str;

/// How long the client has to finish the upgrade.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(10);
/// Grace for an exec'd process whose client went away or whose pod stops.
const EXEC_GRACE: Duration = Duration::from_secs(1);
/// How long output still in the pipes is sent after the process exits.
const DRAIN: Duration = Duration::from_secs(2);

/// The `PodExecOptions` of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    /// `command` (repeated): argv.
    pub command: Vec<String>,
    /// `container`.
    pub container: Option<String>,
    /// `stdin`.
    pub stdin: bool,
    /// `stdout`.
    pub stdout: bool,
    /// `stderr` (ignored with a tty: the terminal carries both).
    pub stderr: bool,
    /// `tty`.
    pub tty: bool,
}

fn flag(name: &str, v: &str) -> ApiResult<bool> {
    match v {
        "" | "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(ApiError::bad_request(format!("{name}: invalid value {v:?}: must be true or false"))),
    }
}

/// Parse and validate the query of an exec request.
///
/// # Errors
/// 400 for a malformed flag, no command, or no stream at all.
pub fn parse_exec_query(query: Option<&str>) -> ApiResult<ExecOptions> {
    let mut o = ExecOptions::default();
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "command" => o.command.push(v.into_owned()),
            "container" if !v.is_empty() => o.container = Some(v.into_owned()),
            "stdin" => o.stdin = flag("stdin", &v)?,
            "stdout" => o.stdout = flag("stdout", &v)?,
            "stderr" => o.stderr = flag("stderr", &v)?,
            "tty" => o.tty = flag("tty", &v)?,
            _ => {}
        }
    }
    if o.command.is_empty() || o.command[0].is_empty() {
        return Err(ApiError::bad_request("you must specify at least 1 command"));
    }
    if o.command.iter().any(|a| a.contains('\0')) {
        return Err(ApiError::bad_request("command: arguments cannot contain NUL bytes"));
    }
    if !(o.stdin || o.stdout || o.stderr) {
        return Err(ApiError::bad_request("you must specify at least one of stdin, stdout, stderr"));
    }
    Ok(o)
}

/// Check a WebSocket upgrade request: the `Sec-WebSocket-Accept` value and the subprotocol.
///
/// # Errors
/// 400 saying what is missing (SPDY and plain requests are not served).
pub fn check_upgrade(method: &http::Method, headers: &HeaderMap) -> ApiResult<(String, &'static str)> {
    let needs = "exec needs a WebSocket upgrade (GET, Connection: Upgrade, Upgrade: websocket) with subprotocol \
                 v5.channel.k8s.io (or v4.channel.k8s.io); SPDY is not served here";
    if !channel::is_websocket_upgrade(headers) {
        return Err(ApiError::bad_request(needs));
    }
    if method != http::Method::GET {
        return Err(ApiError::bad_request(format!("{needs} (a WebSocket upgrade is a GET)")));
    }
    if headers.get(header::SEC_WEBSOCKET_VERSION).and_then(|v| v.to_str().ok()).map(str::trim) != Some("13") {
        return Err(ApiError::bad_request("only WebSocket version 13 is supported"));
    }
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| ApiError::bad_request("WebSocket upgrade without Sec-WebSocket-Key"))?;
    let offered = headers.get_all(header::SEC_WEBSOCKET_PROTOCOL).iter().filter_map(|v| v.to_str().ok());
    let protocol = channel::negotiate(offered).ok_or_else(|| {
        ApiError::bad_request(format!(
            "{needs}: none of the offered subprotocols is served (supported: {})",
            channel::PROTOCOLS.join(", ")
        ))
    })?;
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    Ok((accept, protocol))
}

/// Answer an exec request: checks, then the 101 and the session on the upgraded connection.
pub(crate) fn serve(inner: &Arc<Inner>, pod: &Value, mut req: Request<Body>) -> ApiResult<Response> {
    let opts = parse_exec_query(req.uri().query())?;
    let (namespace, name, uid) = (meta_str(pod, "namespace"), meta_str(pod, "name"), meta_str(pod, "uid"));
    let phase = pod["status"]["phase"].as_str().unwrap_or_default();
    if matches!(phase, "Succeeded" | "Failed") {
        return Err(ApiError::bad_request(format!(
            "cannot exec into a container in a completed pod; current phase is {phase}"
        )));
    }
    let container = pick_container(pod, opts.container.as_deref())?;
    let rt = inner.pod(namespace, name, uid);
    let running = rt.as_ref().and_then(|p| p.container(&container)).is_some_and(|c| c.lock().pid.is_some());
    let (Some(rt), true) = (rt, running) else {
        return Err(ApiError::bad_request(format!("container not found ({container:?})")));
    };
    let (accept, protocol) = check_upgrade(req.method(), req.headers())?;
    let on_upgrade = hyper::upgrade::on(&mut req);
    let c = rt.container(&container).cloned();
    let env = c.map(|c| c.env.clone()).unwrap_or_default();
    let shutdown = inner.shutdown.clone();
    tokio::spawn(async move {
        let upgraded = match tokio::time::timeout(UPGRADE_TIMEOUT, on_upgrade).await {
            Ok(Ok(u)) => u,
            Ok(Err(e)) => return tracing::debug!(error = %e, "exec upgrade failed"),
            Err(_) => return tracing::debug!("exec upgrade timed out"),
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        session(ws, protocol == channel::V5, opts, env, rt, shutdown).await;
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(protocol));
    h.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).map_err(|e| ApiError::internal(e.to_string()))?,
    );
    Ok(resp)
}

async fn pump(mut from: impl AsyncRead + Unpin, ch: u8, to: mpsc::Sender<Vec<u8>>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.send(channel::frame(ch, &buf[..n])).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn pump_tty(mut master: MasterReader, to: mpsc::Sender<Vec<u8>>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match master.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.send(channel::frame(channel::STDOUT, &buf[..n])).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// `setsid -c`, when installed: the command becomes a session leader with the pty as its
/// controlling terminal (so ^C and window-size signals reach it).
fn setsid() -> Option<&'static str> {
    ["/usr/bin/setsid", "/bin/setsid"].into_iter().find(|p| std::path::Path::new(p).exists())
}

enum Io {
    Pipes(Option<tokio::process::ChildStdin>),
    Tty(MasterWriter),
}

async fn session<S>(
    ws: WebSocketStream<S>,
    v5: bool,
    opts: ExecOptions,
    env: Vec<(String, String)>,
    pod: Arc<PodRuntime>,
    mut shutdown: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(async move {
        while let Some(f) = out_rx.recv().await {
            if sink.send(Message::Binary(f.into())).await.is_err() {
                return;
            }
        }
        // A normal close (1000): Go's clients treat a close without a code as an error.
        let close = CloseFrame { code: CloseCode::Normal, reason: "".into() };
        let _ = sink.send(Message::Close(Some(close))).await;
        let _ = sink.close().await;
    });
    let mut pod_stop = pod.stop.subscribe();
    let mut readers = JoinSet::new();
    let pty = if opts.tty {
        match Pty::open() {
            Ok(p) => Some(p),
            Err(e) => {
                let _ = out_tx
                    .send(channel::frame(
                        channel::ERROR,
                        channel::failure_status(&format!("cannot allocate a pseudo-terminal: {e}"))
                            .to_string()
                            .as_bytes(),
                    ))
                    .await;
                drop(out_tx);
                let _ = writer.await;
                return;
            }
        }
    } else {
        None
    };
    let argv: Vec<String> = match (&pty, setsid()) {
        (Some(_), Some(s)) => [s.to_string(), "-c".into()].into_iter().chain(opts.command.iter().cloned()).collect(),
        _ => opts.command.clone(),
    };
    let mut cmd = run::command(&argv, &env, &pod.workdir, &pod.name);
    let stdio = |on: bool| if on { Stdio::piped() } else { Stdio::null() };
    let slaves = pty.as_ref().map(|p| Ok::<_, std::io::Error>((p.slave_stdio()?, p.slave_stdio()?, p.slave_stdio()?)));
    match slaves {
        Some(Ok((i, o, e))) => {
            cmd.stdin(i).stdout(o).stderr(e);
            if setsid().is_none() {
                cmd.process_group(0);
            }
        }
        Some(Err(_)) | None => {
            cmd.stdin(stdio(opts.stdin)).stdout(stdio(opts.stdout)).stderr(stdio(opts.stderr && !opts.tty));
            cmd.process_group(0);
        }
    }
    let spawned = cmd.spawn();
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            let msg = format!("cannot run {:?}: {e}\n", opts.command[0]);
            let ch = if opts.stderr && !opts.tty {
                Some(channel::STDERR)
            } else if opts.stdout {
                Some(channel::STDOUT)
            } else {
                None
            };
            if let Some(ch) = ch {
                let _ = out_tx.send(channel::frame(ch, msg.as_bytes())).await;
            }
            let status = channel::exit_status(code, &opts.command).to_string();
            let _ = out_tx.send(channel::frame(channel::ERROR, status.as_bytes())).await;
            drop(out_tx);
            let _ = writer.await;
            return;
        }
    };
    let pid = child.id().unwrap_or_default();
    let mut io = match pty {
        Some(p) => match p.into_master() {
            Ok((reader, writer)) => {
                if opts.stdout {
                    readers.spawn(pump_tty(reader, out_tx.clone()));
                }
                Io::Tty(writer)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot use the pseudo-terminal's master");
                Io::Pipes(None)
            }
        },
        None => {
            if let Some(o) = child.stdout.take() {
                readers.spawn(pump(o, channel::STDOUT, out_tx.clone()));
            }
            if let Some(e) = child.stderr.take() {
                readers.spawn(pump(e, channel::STDERR, out_tx.clone()));
            }
            Io::Pipes(child.stdin.take())
        }
    };
    let exited = loop {
        tokio::select! {
            s = child.wait() => break s.ok(),
            msg = stream.next() => match msg {
                Some(Ok(Message::Binary(b))) => match channel::parse_client_frame(&b, v5) {
                    Ok(ClientFrame::Stdin(d)) if !d.is_empty() => match &mut io {
                        Io::Pipes(Some(stdin)) => {
                            if stdin.write_all(d).await.is_err() {
                                io = Io::Pipes(None);
                            }
                        }
                        Io::Pipes(None) => {}
                        Io::Tty(m) => { let _ = m.write_all(d).await; }
                    },
                    Ok(ClientFrame::Resize(size)) => {
                        if let Io::Tty(m) = &io
                            && let Err(e) = m.resize(size.width, size.height)
                        {
                            tracing::debug!(error = %e, "terminal resize failed");
                        }
                    }
                    Ok(ClientFrame::Close(channel::STDIN)) => match &mut io {
                        Io::Pipes(_) => io = Io::Pipes(None),
                        // End of input on a terminal: ^D.
                        Io::Tty(m) => { let _ = m.write_all(&[4]).await; }
                    },
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "ignoring an exec frame"),
                },
                Some(Ok(Message::Close(_)) | Err(_)) | None => break None,
                Some(Ok(_)) => {}
            },
            () = run::stopped(&mut pod_stop) => break None,
            () = run::stopped(&mut shutdown) => break None,
        }
    };
    drop(io);
    let Some(status) = exited else {
        // The client went away, or the pod or the server stops: the process goes too.
        run::terminate(&mut child, pid, EXEC_GRACE).await;
        readers.abort_all();
        drop(out_tx);
        writer.abort();
        return;
    };
    run::signal_group(pid, rustix::process::Signal::KILL);
    let all = async { while readers.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN, all).await.is_err() {
        readers.abort_all();
    }
    let code = run::exit_code(status);
    let status = channel::exit_status(code, &opts.command).to_string();
    let _ = out_tx.send(channel::frame(channel::ERROR, status.as_bytes())).await;
    drop(out_tx);
    let _ = tokio::time::timeout(DRAIN, writer).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_queries() {
        let o = parse_exec_query(Some("command=sh&command=-c&command=echo%20hi&container=c&stdout=true&stderr=1"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.command, vec!["sh", "-c", "echo hi"]);
        assert_eq!(o.container.as_deref(), Some("c"));
        assert!(o.stdout && o.stderr && !o.stdin && !o.tty);
        for bad in ["stdout=true", "command=ls", "command=ls&stdout=maybe", "command=&stdout=1"] {
            assert_eq!(parse_exec_query(Some(bad)).err().map(|e| e.code), Some(400), "{bad}");
        }
    }

    #[test]
    fn upgrades() {
        let mut h = HeaderMap::new();
        let get = http::Method::GET;
        let err = check_upgrade(&get, &h).err().map(|e| e.message).unwrap_or_default();
        assert!(err.contains("v5.channel.k8s.io") && err.contains("SPDY"), "{err}");
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
        h.insert(header::SEC_WEBSOCKET_KEY, HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="));
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static("v4.channel.k8s.io, v5.channel.k8s.io"));
        let (accept, proto) = check_upgrade(&get, &h).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(proto, channel::V5);
        assert_eq!(check_upgrade(&http::Method::POST, &h).err().map(|e| e.code), Some(400));
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static("SPDY/3.1"));
        assert_eq!(check_upgrade(&get, &h).err().map(|e| e.code), Some(400));
    }
}
