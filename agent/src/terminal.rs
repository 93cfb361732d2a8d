//! Web terminals for the principal's resource proxy (upstream §5.4, `agent/terminal.go`).
//!
//! A `terminal-request` event names a session UUID and a pod, container and command. The agent
//! opens `StreamTerminal` on the connection of its event stream, sends the handshake frame
//! (only `request_uuid`), and execs into the pod on this cluster with its own credentials
//! (kube-rs over WebSocket, `v5.channel.k8s.io`): the principal's `stdin` frames go to the
//! process (`eof` closes its stdin), resizes to its terminal; its stdout and stderr come back
//! as frames of those stream types (kept apart without a tty). The session ends with one frame:
//! `eof` when the command succeeded, or `error` holding the API server's `Status` JSON
//! (`NonZeroExitCode` with the exit code, or why the exec failed or was refused), which the
//! principal hands to the client on channel 3; an upstream principal shows it as the error
//! text. When the principal ends the call first (the client went away), the process is
//! abandoned (its exec connection closed).
//!
//! Refused, with a `Status` the client shows: with `--enable-resource-proxy=false`, on an
//! autonomous agent (as upstream: terminals are for managed agents), unless the operator turned
//! terminals on (`--enable-web-terminal`, default off: a terminal runs any command with the
//! pod's privileges; upstream has no switch), and for a pod that is not *managed* by the rules
//! resource-proxy reads follow ([`crate::live`]: tracked by an Application of this agent that
//! exists and deploys here, or owned through a chain of at most 5 links by an object that is).
//! Sessions run in the background; a request the principal resends is carried once.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use futures::SinkExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, TerminalSize};
use protocol::payload::{ContainerTerminalRequest, status_body};
use protocol::pb::terminalstreamapi::TerminalStreamData;
use protocol::pb::terminalstreamapi::terminal_stream_service_client::TerminalStreamServiceClient;
use protocol::{Event, EventType, Payload, Target};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, ReadHalf, SimplexStream, WriteHalf};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::error::InboundError;
use crate::live::Live;
use crate::spoke::Spoke;

/// Largest data frame sent, and the exec pipes' buffers.
const CHUNK: usize = 32 << 10;
/// Frames buffered towards the principal.
const BUFFER: usize = 100;
/// How long the exit status may take once the outputs ended.
const STATUS_WAIT: Duration = Duration::from_secs(10);
/// How long the principal may take to end the call after the last frame.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Session UUIDs already taken (a resent request is carried once).
static SEEN: LazyLock<Mutex<crate::recent::RecentIds>> = LazyLock::new(Mutex::default);

/// Whether `ev` is a terminal request (handled here, not by the event handlers).
pub(crate) fn is_request(ev: &Event) -> bool {
    ev.target == Target::Terminal && ev.event_type == EventType::TerminalRequest
}

/// Takes terminal request `ev`: carried in the background on a `StreamTerminal` call.
pub(crate) fn accept(spoke: &Arc<Spoke>, live: &Arc<Live>, ev: &Event) -> Result<(), InboundError> {
    let Payload::TerminalRequest(req) = ev.payload()? else {
        return Ok(());
    };
    if req.uuid.is_empty() || req.uuid != ev.event_id {
        tracing::warn!(uuid = %req.uuid, event_id = %ev.event_id,
            "terminal request whose uuid is not its eventid; ignored");
        return Ok(());
    }
    if !link::lock(&SEEN).first_time(&req.uuid) {
        tracing::debug!(uuid = %req.uuid, "terminal request resent; carried once already");
        return Ok(());
    }
    let (spoke, live) = (spoke.clone(), live.clone());
    tokio::spawn(async move { session(&spoke, &live, &req).await });
    Ok(())
}

/// How a session ended.
#[derive(Debug)]
enum Outcome {
    /// The command ran: `None` on success, else the `Status` (JSON) saying why not.
    Done(Option<String>),
    /// The principal ended the call first.
    PrincipalGone,
}

async fn session(spoke: &Spoke, live: &Live, req: &ContainerTerminalRequest) {
    let uuid = req.uuid.as_str();
    let Some((channel, credentials)) = spoke.side_channel() else {
        tracing::warn!(%uuid, "terminal request without a connection to the principal; dropped");
        return;
    };
    let max = spoke.config.max_message_bytes;
    let mut client =
        TerminalStreamServiceClient::new(channel).max_decoding_message_size(max).max_encoding_message_size(max);
    if spoke.config.compression {
        client = client.send_compressed(crate::compression::GZIP).accept_compressed(crate::compression::GZIP);
    }
    let (tx, rx) = mpsc::channel(BUFFER);
    let handshake = TerminalStreamData { request_uuid: uuid.to_owned(), ..Default::default() };
    if tx.send(handshake).await.is_err() {
        return;
    }
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(credentials) = &credentials {
        credentials(request.metadata_mut());
    }
    let mut from_principal = match client.stream_terminal(request).await {
        Ok(resp) => resp.into_inner(),
        Err(status) => {
            tracing::warn!(%uuid, %status, "the principal refused the terminal stream");
            return;
        }
    };
    tracing::info!(%uuid, namespace = %req.namespace, pod = %req.pod_name, container = %req.container_name,
        tty = req.tty, "terminal session started");
    let outcome = carry(spoke, live, req, &mut from_principal, &tx).await;
    tracing::info!(%uuid, ?outcome, "terminal session ended");
    let last = match outcome {
        Outcome::PrincipalGone => return,
        Outcome::Done(None) => TerminalStreamData { request_uuid: uuid.to_owned(), eof: true, ..Default::default() },
        Outcome::Done(Some(status)) => {
            TerminalStreamData { request_uuid: uuid.to_owned(), error: status, ..Default::default() }
        }
    };
    if tx.send(last).await.is_err() {
        return;
    }
    drop(tx);
    // The principal ends the call once it has passed the result on; cancelling it sooner
    // could cut the last frame.
    let _ = tokio::time::timeout(CLOSE_WAIT, async { while let Ok(Some(_)) = from_principal.message().await {} }).await;
}

/// Runs the session's command, if it is allowed, and carries its streams.
async fn carry(
    spoke: &Spoke,
    live: &Live,
    req: &ContainerTerminalRequest,
    from_principal: &mut Streaming<TerminalStreamData>,
    tx: &mpsc::Sender<TerminalStreamData>,
) -> Outcome {
    let refuse = |code: u16, message: String| Outcome::Done(Some(status_body(code, &message)));
    let name = &spoke.config.name;
    if !spoke.config.enable_resource_proxy {
        return refuse(
            403,
            format!("the resource proxy is disabled on agent {name:?} (--enable-resource-proxy=false): no terminals"),
        );
    }
    if spoke.config.mode != crate::config::AgentMode::Managed {
        return refuse(403, format!("terminals are served by managed agents only; agent {name:?} is autonomous"));
    }
    if !spoke.config.enable_web_terminal {
        return refuse(
            403,
            format!(
                "terminals are off on agent {name:?}: its operator enables them with --enable-web-terminal (ARGOCD_AGENT_ENABLE_WEB_TERMINAL)"
            ),
        );
    }
    if req.namespace.is_empty() || req.pod_name.is_empty() || req.command.iter().all(String::is_empty) {
        return refuse(400, "a terminal request needs a namespace, a pod and a command".to_owned());
    }
    if let Err((_, status)) = live.managed_pod(spoke, &req.namespace, &req.pod_name).await {
        return Outcome::Done(Some(status));
    }
    let params = AttachParams {
        container: (!req.container_name.is_empty()).then(|| req.container_name.clone()),
        stdin: req.stdin,
        stdout: req.stdout,
        stderr: req.stderr && !req.tty,
        tty: req.tty,
        max_stdin_buf_size: Some(CHUNK),
        max_stdout_buf_size: Some(CHUNK),
        max_stderr_buf_size: Some(CHUNK),
    };
    let pods: Api<Pod> = Api::namespaced(live.client().clone(), &req.namespace);
    let mut process = match pods.exec(&req.pod_name, req.command.clone(), &params).await {
        Ok(process) => process,
        Err(error) => return refuse(502, format!("cannot exec into pod {:?}: {error}", req.pod_name)),
    };
    let (stdin, stdout, stderr, resize) =
        (process.stdin(), process.stdout(), process.stderr(), process.terminal_size());
    let status = process.take_status();
    let uuid = req.uuid.as_str();
    tokio::select! {
        ((), ()) = async { tokio::join!(pump(stdout, "stdout", uuid, tx), pump(stderr, "stderr", uuid, tx)) } => {}
        () = feed(from_principal, stdin, resize) => return Outcome::PrincipalGone,
    }
    let status = match status {
        Some(status) => tokio::time::timeout(STATUS_WAIT, status).await.ok().flatten(),
        None => None,
    };
    if let Some(status) = status {
        if status.status.as_deref() == Some("Success") {
            return Outcome::Done(None);
        }
        return match serde_json::to_string(&status) {
            Ok(json) if protocol::payload::is_status(&json) => Outcome::Done(Some(json)),
            _ => refuse(500, status.message.unwrap_or_else(|| "the command failed".to_owned())),
        };
    }
    match tokio::time::timeout(STATUS_WAIT, process.join()).await {
        Ok(Ok(())) => Outcome::Done(None),
        Ok(Err(error)) => refuse(502, format!("the exec stream failed: {error}")),
        Err(_) => refuse(504, format!("the command's exit status did not come within {STATUS_WAIT:?}")),
    }
}

/// Sends what `reader` yields as frames of `stream_type` until it ends.
async fn pump(
    reader: Option<ReadHalf<SimplexStream>>,
    stream_type: &str,
    uuid: &str,
    tx: &mpsc::Sender<TerminalStreamData>,
) {
    let Some(mut reader) = reader else { return };
    let mut buf = vec![0u8; CHUNK];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let frame = TerminalStreamData {
                    request_uuid: uuid.to_owned(),
                    data: buf[..n].to_vec(),
                    stream_type: stream_type.to_owned(),
                    ..Default::default()
                };
                if tx.send(frame).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Hands the principal's frames to the process until the principal ends the call.
async fn feed(
    from_principal: &mut Streaming<TerminalStreamData>,
    mut stdin: Option<WriteHalf<SimplexStream>>,
    mut resize: Option<futures::channel::mpsc::Sender<TerminalSize>>,
) {
    while let Ok(Some(frame)) = from_principal.message().await {
        match input(&frame) {
            Input::Resize { width, height } => {
                if let Some(r) = resize.as_mut()
                    && r.send(TerminalSize { width, height }).await.is_err()
                {
                    resize = None;
                }
            }
            Input::Stdin { data, eof } => {
                if !data.is_empty()
                    && let Some(w) = stdin.as_mut()
                    && w.write_all(data).await.is_err()
                {
                    stdin = None;
                }
                if eof && let Some(mut w) = stdin.take() {
                    // The process sees its stdin end (v5: the close-channel frame).
                    let _ = w.shutdown().await;
                }
            }
            Input::Nothing => {}
        }
    }
}

/// What a frame from the principal asks of the process.
#[derive(Debug, PartialEq, Eq)]
enum Input<'a> {
    Resize { width: u16, height: u16 },
    Stdin { data: &'a [u8], eof: bool },
    Nothing,
}

fn input(frame: &TerminalStreamData) -> Input<'_> {
    if frame.resize {
        let clamp = |n: u32| u16::try_from(n).unwrap_or(u16::MAX);
        return Input::Resize { width: clamp(frame.cols), height: clamp(frame.rows) };
    }
    if !matches!(frame.stream_type.as_str(), "" | "stdin") {
        return Input::Nothing;
    }
    if frame.data.is_empty() && !frame.eof {
        return Input::Nothing;
    }
    Input::Stdin { data: &frame.data, eof: frame.eof }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principal_frames_become_stdin_stdin_eof_and_resizes() {
        let data = |d: &[u8], eof: bool| TerminalStreamData {
            request_uuid: "u".into(),
            data: d.to_vec(),
            stream_type: "stdin".into(),
            eof,
            ..Default::default()
        };
        assert_eq!(input(&data(b"ls\n", false)), Input::Stdin { data: b"ls\n", eof: false });
        assert_eq!(input(&data(b"", true)), Input::Stdin { data: b"", eof: true });
        assert_eq!(input(&data(b"", false)), Input::Nothing);
        let resize = TerminalStreamData { resize: true, rows: 40, cols: 132, ..Default::default() };
        assert_eq!(input(&resize), Input::Resize { width: 132, height: 40 });
        let huge = TerminalStreamData { resize: true, rows: 1 << 20, cols: 80, ..Default::default() };
        assert_eq!(input(&huge), Input::Resize { width: 80, height: u16::MAX });
        let odd = TerminalStreamData { data: b"x".to_vec(), stream_type: "stdout".into(), ..Default::default() };
        assert_eq!(input(&odd), Input::Nothing, "only stdin goes to the process");
    }

    /// A `Streaming` that yields nothing more, as tonic decodes a principal's answer.
    fn quiet() -> Streaming<TerminalStreamData> {
        let body = http_body_util::Empty::<hyper::body::Bytes>::new();
        let mut codec = protocol::grpc_codec::Codec::<TerminalStreamData, TerminalStreamData>::default();
        Streaming::new_empty(tonic::codec::Codec::decoder(&mut codec), body)
    }

    async fn refusal(config: crate::config::AgentConfig) -> serde_json::Value {
        let live = Live::new(link::testing::offline_client("argocd"), &config.namespace);
        let spoke = Spoke::new(config, link::testing::offline_client("argocd"));
        let req = ContainerTerminalRequest {
            uuid: "u".into(),
            namespace: "shop".into(),
            pod_name: "web".into(),
            command: vec!["sh".into()],
            stdin: true,
            stdout: true,
            tty: true,
            ..Default::default()
        };
        let (tx, _rx) = mpsc::channel(4);
        let Outcome::Done(Some(status)) = carry(&spoke, &live, &req, &mut quiet(), &tx).await else {
            panic!("refused")
        };
        serde_json::from_str(&status).expect("a Status")
    }

    #[tokio::test]
    async fn terminals_are_refused_when_disabled_autonomous_or_unverifiable() {
        use crate::config::{AgentConfig, AgentMode};
        let mut disabled = AgentConfig::new("http://127.0.0.1:1", "agent-1", AgentMode::Managed);
        disabled.enable_resource_proxy = false;
        let status = refusal(disabled).await;
        assert_eq!(status["code"], 403);
        assert!(status["message"].as_str().is_some_and(|m| m.contains("--enable-resource-proxy=false")), "{status}");
        let status = refusal(AgentConfig::new("http://127.0.0.1:1", "agent-1", AgentMode::Autonomous)).await;
        assert!(status["message"].as_str().is_some_and(|m| m.contains("managed agents only")), "{status}");
        // Off unless the operator turns terminals on.
        let status = refusal(AgentConfig::new("http://127.0.0.1:1", "agent-1", AgentMode::Managed)).await;
        assert_eq!(status["code"], 403, "{status}");
        assert!(status["message"].as_str().is_some_and(|m| m.contains("--enable-web-terminal")), "{status}");
        // Whether the pod is managed cannot be known (the cluster is unreachable): refused.
        let mut enabled = AgentConfig::new("http://127.0.0.1:1", "agent-1", AgentMode::Managed);
        enabled.enable_web_terminal = true;
        let status = refusal(enabled).await;
        assert_eq!(status["status"], "Failure", "{status}");
    }

    /// The session's end for a terminal into `pod` of namespace `monitoring` on `cluster`.
    async fn outcome(spoke: &Spoke, live: &Live, pod: &str) -> Outcome {
        let req = ContainerTerminalRequest {
            uuid: "u".into(),
            namespace: "monitoring".into(),
            pod_name: pod.into(),
            command: vec!["sh".into()],
            stdout: true,
            ..Default::default()
        };
        let (tx, _rx) = mpsc::channel(4);
        carry(spoke, live, &req, &mut quiet(), &tx).await
    }

    #[tokio::test]
    async fn exec_needs_the_switch_and_an_existing_application_owning_the_pod() {
        use crate::config::{AgentConfig, AgentMode};
        let cluster = crate::live::tests::Cluster::start().await;
        for (name, id) in [("web-0", "web:/Pod:monitoring/web-0"), ("stray", "ghost:/Pod:monitoring/stray")] {
            cluster
                .create(
                    "/api/v1/namespaces/monitoring/pods",
                    serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name, "annotations": {"argocd.argoproj.io/tracking-id": id}},
                        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
                )
                .await;
        }
        let live = Live::new(cluster.client.clone(), "argocd");
        let web: protocol::argocd::Application = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "argocd"},
            "spec": {"destination": {"name": "in-cluster", "namespace": "monitoring"}}}))
        .expect("an Application");
        let status = |outcome: Outcome| -> serde_json::Value {
            match outcome {
                Outcome::Done(Some(status)) => serde_json::from_str(&status).expect("a Status"),
                other => panic!("not refused: {other:?}"),
            }
        };

        // Off by default, even for a pod an Application owns.
        let config = AgentConfig::new("http://127.0.0.1:1", "agent-1", AgentMode::Managed);
        let off = Spoke::new(config.clone(), cluster.client.clone());
        off.managed.set_source(("argocd".into(), "web".into()), web.clone());
        let refused = status(outcome(&off, &live, "web-0").await);
        assert_eq!(refused["code"], 403, "{refused}");
        assert!(refused["message"].as_str().is_some_and(|m| m.contains("--enable-web-terminal")), "{refused}");

        // On: a pod whose tracking annotation names an Application that does not exist is refused.
        let mut enabled = config;
        enabled.enable_web_terminal = true;
        let on = Spoke::new(enabled, cluster.client.clone());
        on.managed.set_source(("argocd".into(), "web".into()), web);
        let refused = status(outcome(&on, &live, "stray").await);
        assert_eq!(refused["code"], 403, "{refused}");
        assert!(
            refused["message"].as_str().is_some_and(|m| m.contains("Application argocd/ghost, which agent")),
            "{refused}"
        );
        // The owned pod passes the checks: the exec itself is tried (this API server runs no pods).
        let tried = outcome(&on, &live, "web-0").await;
        if let Outcome::Done(Some(status)) = &tried {
            assert!(!status.contains("not managed") && !status.contains("--enable-web-terminal"), "{status}");
        }
    }

    #[test]
    fn a_resent_request_is_carried_once() {
        let ev = |uuid: &str| {
            let req = ContainerTerminalRequest { uuid: uuid.into(), ..Default::default() };
            Event::request(EventType::TerminalRequest, Target::Terminal, uuid).with_json(&req).expect("encodes")
        };
        let first = ev(&protocol::event::new_uuid());
        assert!(is_request(&first));
        let Ok(Payload::TerminalRequest(req)) = first.payload() else { panic!("a terminal request") };
        assert!(link::lock(&SEEN).first_time(&req.uuid));
        assert!(!link::lock(&SEEN).first_time(&req.uuid));
    }
}
