//! Pod logs for the principal's resource proxy (upstream §5.3, `agent/log.go`).
//!
//! A `containerlog` request (type `GET`, payload [`ContainerLogRequest`]) is taken at once and
//! streamed in the background, never on the receive loop: the log is read from this cluster
//! with the agent's client, then a `StreamLogs` call is opened on the event stream's
//! connection ([`Spoke::side_channel`]); its first frame names the request (`request_uuid`
//! only), then come the raw log bytes in frames of at most [`CHUNK`] bytes, and `eof=true` (or
//! `error`) at the end. Kubernetes is asked first, so when the log cannot be read the first
//! frame after the handshake is an `error` carrying the API server's `Status` JSON (a missing
//! pod: 404), which the principal answers with; when it can, an empty data frame says so at
//! once (upstream's principal writes nothing for it).
//!
//! Follow mode resumes: the log is read with timestamps (removed again when the request did
//! not ask for them) and the last one is remembered; when the call or the Kubernetes stream
//! breaks, it is opened again with backoff (200 ms doubling to 5 s; given up after 30 s without
//! progress) from that timestamp, on the connection of the moment, and lines at or before it
//! are dropped. The principal answering `Canceled` (its client went away), `NotFound` or
//! `PermissionDenied` ends it. Requests are de-duplicated by UUID while they stream (a copy the
//! principal resends is ignored; one that comes after the stream ended, which the principal
//! sends to resume after this agent restarted, is served), and at most [`SESSIONS`] stream at
//! once.
//!
//! Only pods an Application of this agent manages are read (the rule of resource-proxy reads,
//! [`crate::live::Live::managed_pod`]); any other is refused with the `Status` saying why
//! (upstream reads any pod). Each request is checked once; a resume the principal asks for is a
//! new request.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use futures::AsyncBufReadExt as _;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, LogParams};
use protocol::payload::loglines::{LogLines, whole_second};
use protocol::payload::{ContainerLogRequest, status_body};
use protocol::pb::logstreamapi::LogStreamData;
use protocol::pb::logstreamapi::log_stream_service_client::LogStreamServiceClient;
use protocol::{Event, Payload, Target};
use tokio::sync::{Semaphore, mpsc};
use tracing::Instrument as _;

use crate::error::InboundError;
use crate::live::Live;
use crate::spoke::Spoke;

/// Largest data frame (upstream's).
pub(crate) const CHUNK: usize = 64 << 10;
/// Log streams at once per agent; more are refused with an `error` frame.
pub(crate) const SESSIONS: usize = 32;
/// Frames queued towards the principal (the call's flow control holds the reader back).
const BUFFERED: usize = 4;
const FIRST_DELAY: Duration = Duration::from_millis(200);
const MAX_DELAY: Duration = Duration::from_secs(5);
/// Follow mode gives up after this long without getting a frame through.
const GIVE_UP: Duration = Duration::from_secs(30);
/// After a break, `NotFound` may mean the principal has not re-registered the request yet.
const NOT_FOUND_GRACE: Duration = Duration::from_secs(5);

/// The UUIDs being streamed, and the slots for them.
static ACTIVE: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Mutex::default);
static SLOTS: LazyLock<Arc<Semaphore>> = LazyLock::new(|| Arc::new(Semaphore::new(SESSIONS)));

/// Holds a UUID in [`ACTIVE`] until dropped.
struct Active(String);

impl Active {
    fn claim(uuid: &str) -> Option<Self> {
        link::lock(&ACTIVE).insert(uuid.to_owned()).then(|| Self(uuid.to_owned()))
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        link::lock(&ACTIVE).remove(&self.0);
    }
}

/// Whether `ev` is a pod-log request (handled here, not by the event handlers).
pub(crate) fn is_request(ev: &Event) -> bool {
    ev.target == Target::ContainerLog && ev.event_type.is_http_method()
}

/// Takes pod-log request `ev`: streamed in the background on a `StreamLogs` call.
pub(crate) fn accept(spoke: &Arc<Spoke>, live: &Arc<Live>, ev: &Event) -> Result<(), InboundError> {
    let Payload::ContainerLogRequest(req) = ev.payload()? else {
        return Ok(());
    };
    if req.uuid.is_empty() || req.uuid != ev.event_id {
        tracing::warn!(uuid = %req.uuid, event_id = %ev.event_id, "pod log request whose uuid is not its eventid; ignored");
        return Ok(());
    }
    let Some(active) = Active::claim(&req.uuid) else {
        tracing::debug!(uuid = %req.uuid, "pod log request resent while it streams; ignored");
        return Ok(());
    };
    let span = tracing::debug_span!("pod_log", uuid = %req.uuid, namespace = %req.namespace, pod = %req.pod_name,
        follow = req.follow);
    let (spoke, live) = (spoke.clone(), live.clone());
    tokio::spawn(
        async move {
            let _active = active;
            stream(&spoke, &live, &req).await;
        }
        .instrument(span),
    );
    Ok(())
}

/// How one attempt ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Over (the log ended, was refused, or the principal ended it).
    Done,
    /// Broken: try again (follow mode). `progress`: frames got through.
    Broken { progress: bool, why: String },
}

async fn stream(spoke: &Arc<Spoke>, live: &Live, req: &ContainerLogRequest) {
    if !spoke.config.enable_resource_proxy {
        let why =
            format!("the resource proxy is disabled on agent {:?} (--enable-resource-proxy=false)", spoke.config.name);
        refuse(spoke, &req.uuid, &status_body(403, &why)).await;
        return;
    }
    if let Err((_, status)) = live.managed_pod(&**spoke, &req.namespace, &req.pod_name).await {
        refuse(spoke, &req.uuid, &status).await;
        return;
    }
    let Ok(_slot) = SLOTS.clone().try_acquire_owned() else {
        let why = format!("agent {:?} already streams {SESSIONS} pod logs", spoke.config.name);
        refuse(spoke, &req.uuid, &status_body(429, &why)).await;
        return;
    };
    let api: Api<Pod> = Api::namespaced(live.client().clone(), &req.namespace);
    let mut lines = LogLines::new(req);
    let mut delay = FIRST_DELAY;
    let mut broken_since: Option<Instant> = None;
    loop {
        match attempt(spoke, &api, req, &mut lines, broken_since).await {
            Outcome::Done => return,
            Outcome::Broken { progress, why } => {
                if !req.follow {
                    tracing::debug!(%why, "pod log broke");
                    return;
                }
                if progress {
                    broken_since = None;
                    delay = FIRST_DELAY;
                }
                let since = *broken_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= GIVE_UP {
                    tracing::warn!(%why, "pod log broke and could not be resumed for {GIVE_UP:?}; given up");
                    return;
                }
                tracing::debug!(%why, ?delay, "pod log broke; resuming");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_DELAY);
            }
        }
    }
}

/// A `StreamLogs` call in flight: its answer.
type Call = tokio::task::JoinHandle<Result<(), tonic::Status>>;

/// Opens a `StreamLogs` call for `uuid` (handshake sent); `None` without a connection.
fn open_call(spoke: &Spoke, uuid: &str) -> Option<(mpsc::Sender<LogStreamData>, Call)> {
    let (channel, credentials) = spoke.side_channel()?;
    let mut client = LogStreamServiceClient::new(channel).max_encoding_message_size(spoke.config.max_message_bytes);
    if spoke.config.compression {
        client = client.send_compressed(crate::compression::GZIP).accept_compressed(crate::compression::GZIP);
    }
    let (tx, rx) = mpsc::channel(BUFFERED);
    let _ = tx.try_send(LogStreamData { request_uuid: uuid.to_owned(), ..LogStreamData::default() });
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(credentials) = &credentials {
        credentials(request.metadata_mut());
    }
    let call = tokio::spawn(async move { client.stream_logs(request).await.map(|_| ()) });
    Some((tx, call))
}

/// Answers request `uuid` with an `error` frame only.
async fn refuse(spoke: &Spoke, uuid: &str, error: &str) {
    tracing::debug!(%error, "pod log refused");
    let Some((tx, call)) = open_call(spoke, uuid) else { return };
    let _ = tx
        .send(LogStreamData { request_uuid: uuid.to_owned(), error: error.to_owned(), ..LogStreamData::default() })
        .await;
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(10), call).await;
}

fn frame(uuid: &str, data: Vec<u8>) -> LogStreamData {
    LogStreamData { request_uuid: uuid.to_owned(), data, ..LogStreamData::default() }
}

/// What the principal's answer to the call means.
fn ended(answer: Result<Result<(), tonic::Status>, tokio::task::JoinError>, progress: bool, grace: bool) -> Outcome {
    match answer {
        Ok(Ok(())) => Outcome::Done,
        Ok(Err(status)) => match status.code() {
            tonic::Code::Cancelled | tonic::Code::PermissionDenied => {
                tracing::debug!(code = ?status.code(), message = status.message(), "the principal ended the pod log");
                Outcome::Done
            }
            tonic::Code::NotFound if !grace => {
                tracing::debug!(message = status.message(), "the principal does not wait for the pod log any more");
                Outcome::Done
            }
            _ => Outcome::Broken { progress, why: format!("{:?}: {}", status.code(), status.message()) },
        },
        Err(e) => Outcome::Broken { progress, why: e.to_string() },
    }
}

/// One attempt: the log from Kubernetes (from the last line seen when resuming), to one call.
async fn attempt(
    spoke: &Spoke,
    api: &Api<Pod>,
    req: &ContainerLogRequest,
    lines: &mut LogLines,
    broken_since: Option<Instant>,
) -> Outcome {
    let resuming = broken_since.is_some() || lines.last().is_some();
    let grace = broken_since.is_some_and(|t| t.elapsed() < NOT_FOUND_GRACE);
    let params = match params(lines, req) {
        Ok(p) => p,
        Err(why) => {
            refuse(spoke, &req.uuid, &status_body(400, &why)).await;
            return Outcome::Done;
        }
    };
    let log = match api.log_stream(&req.pod_name, &params).await {
        Ok(log) => Ok(log),
        Err(kube::Error::Api(status)) => Err(status_body(status.code, &status.message)),
        Err(e) if resuming => return Outcome::Broken { progress: false, why: e.to_string() },
        Err(e) => Err(status_body(503, &format!("cannot read the log from this cluster's API server: {e}"))),
    };
    let Some((tx, mut call)) = open_call(spoke, &req.uuid) else {
        return Outcome::Broken { progress: false, why: "not connected to the principal".to_owned() };
    };
    let log = match log {
        Ok(log) => log,
        Err(error) => {
            tracing::debug!(%error, "pod log cannot be read");
            let _ = tx.send(LogStreamData { request_uuid: req.uuid.clone(), error, ..LogStreamData::default() }).await;
            drop(tx);
            return match tokio::time::timeout(Duration::from_secs(10), call).await {
                Ok(answer) => ended(answer, false, grace),
                Err(_) => Outcome::Done,
            };
        }
    };
    let mut log = Box::pin(log);
    // Kubernetes answered: the principal may answer its client now.
    let mut progress = tx.send(frame(&req.uuid, Vec::new())).await.is_ok();
    if resuming {
        lines.resuming();
    }
    loop {
        let read = tokio::select! {
            answer = &mut call => return ended(answer, progress, grace),
            read = log.fill_buf() => read.map(<[u8]>::to_vec),
        };
        match read {
            Ok(data) if data.is_empty() => {
                let rest = lines.finish();
                let mut last = frame(&req.uuid, rest);
                last.eof = true;
                if tx.send(last).await.is_err() {
                    return ended(call.await, progress, grace);
                }
                drop(tx);
                return match tokio::time::timeout(Duration::from_secs(10), call).await {
                    Ok(answer) => ended(answer, true, grace),
                    Err(_) => Outcome::Done,
                };
            }
            Ok(data) => {
                log.consume_unpin(data.len());
                let out = lines.push(&data);
                for piece in out.chunks(CHUNK) {
                    if tx.send(frame(&req.uuid, piece.to_vec())).await.is_err() {
                        return ended(call.await, progress, grace);
                    }
                    progress = true;
                }
            }
            Err(e) if req.follow => return Outcome::Broken { progress, why: format!("reading the log: {e}") },
            Err(e) => {
                let error = status_body(502, &format!("reading the log from this cluster broke: {e}"));
                let _ =
                    tx.send(LogStreamData { request_uuid: req.uuid.clone(), error, ..LogStreamData::default() }).await;
                drop(tx);
                let _ = tokio::time::timeout(Duration::from_secs(10), call).await;
                return Outcome::Done;
            }
        }
    }
}

/// What Kubernetes is asked for `req` with `lines` so far: as the request says, with timestamps
/// when tracked, and from the whole second of the last line seen once there is one (see
/// [`whole_second`]).
fn params(lines: &LogLines, req: &ContainerLogRequest) -> Result<LogParams, String> {
    let since_time = if req.since_time.is_empty() {
        None
    } else {
        Some(req.since_time.parse::<Timestamp>().map_err(|e| format!("sinceTime {:?}: {e}", req.since_time))?)
    };
    let mut p = LogParams {
        container: (!req.container.is_empty()).then(|| req.container.clone()),
        follow: req.follow,
        limit_bytes: req.limit_bytes,
        pretty: false,
        previous: req.previous,
        since_seconds: req.since_seconds,
        since_time: since_time.map(whole_second),
        tail_lines: req.tail_lines,
        timestamps: req.timestamps || lines.tracks(),
    };
    if let Some(last) = lines.last() {
        p.since_time = Some(whole_second(last));
        p.since_seconds = None;
        p.tail_lines = None;
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow() -> ContainerLogRequest {
        ContainerLogRequest {
            uuid: "u".into(),
            namespace: "ns".into(),
            pod_name: "p".into(),
            follow: true,
            tail_lines: Some(3),
            ..ContainerLogRequest::default()
        }
    }

    #[test]
    fn kubernetes_is_asked_for_timestamps_when_following_and_from_the_whole_second_on_a_resume() {
        let req = follow();
        let mut lines = LogLines::new(&req);
        let p = params(&lines, &req).expect("params");
        assert!(p.timestamps && p.follow);
        assert_eq!(p.tail_lines, Some(3));
        let once = ContainerLogRequest { follow: false, ..follow() };
        assert!(!params(&LogLines::new(&once), &once).expect("params").timestamps, "not following: as asked");
        let bad = ContainerLogRequest { since_time: "soon".into(), ..follow() };
        assert!(params(&LogLines::new(&bad), &bad).is_err());

        assert_eq!(lines.push(b"2024-05-01T10:00:00.1Z 1\n2024-05-01T10:00:00.7Z 2\n"), b"1\n2\n");
        let p = params(&lines, &req).expect("params");
        // Down to the whole second: kube-rs would round 10:00:00.7 up to 10:00:01 and lose lines.
        assert_eq!(p.since_time, Some("2024-05-01T10:00:00Z".parse().expect("time")));
        assert_eq!(p.tail_lines, None, "everything since the last line, not the tail again");
        // A resume the principal asks for (a restarted agent knows nothing of the request).
        let from_principal = ContainerLogRequest { since_time: "2024-05-01T10:00:00.9Z".into(), ..follow() };
        let p = params(&LogLines::new(&from_principal), &from_principal).expect("params");
        assert_eq!(p.since_time, Some("2024-05-01T10:00:00Z".parse().expect("time")));
    }

    #[test]
    fn a_request_streams_once_at_a_time() {
        let a = Active::claim("x").expect("first");
        assert!(Active::claim("x").is_none(), "a resend while it streams");
        drop(a);
        assert!(Active::claim("x").is_some(), "served again once it ended (a resume after a restart)");
    }
}
