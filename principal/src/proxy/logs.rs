//! Pod logs through the resource proxy (`GET …/namespaces/<ns>/pods/<p>/log`, upstream §5.3).
//!
//! The request is sent to the agent as a `containerlog` event (type `GET`, payload
//! [`ContainerLogRequest`]); the agent answers on its own `StreamLogs` call (see
//! [`crate::service::logstream`]), which is handed here through the proxy's [`Tables`](super::Tables) — only when it
//! comes from the agent the request was sent to (upstream does not check, §10 item 14). The
//! bytes are streamed to the HTTP client as they come, with at most [`BUFFERED`] chunks between
//! the agent's call and the client (the gRPC stream's flow control holds the agent back).
//!
//! An `error` frame before any byte is answered as an HTTP error: the agent's Kubernetes
//! `Status` JSON when the error is one (a missing pod: 404), else 502 with the text.
//!
//! Follow mode survives the agent's call breaking (its stream reconnecting, or the agent
//! restarting): the principal asks the agent for timestamps (stripping them again when the
//! client did not ask), remembers the last one, re-registers the request and asks again from
//! there; whichever comes first — the agent resuming on its own, or answering the new request —
//! continues the response, and lines at or before the last one seen are dropped, so nothing is
//! lost or repeated. The response ends when the client goes away; the agent's call then ends
//! with `Canceled`, which stops it following.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, StreamBody};
use k8s_openapi::jiff::Timestamp;
use protocol::payload::loglines::LogLines;
use protocol::payload::{ApiResource, ContainerLogRequest};
use protocol::pb::logstreamapi::{LogStreamData, LogStreamResponse};
use protocol::{Event, EventType, Target};
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument as _;

use super::{ProxyBody, ResourceProxy, boxed, status};
use crate::pending::Ticket;

/// An agent's `StreamLogs` call, handed to the HTTP request waiting for it.
#[derive(Debug)]
pub(crate) struct Attach {
    /// The log bytes the agent streams (its first frame, the handshake, already read).
    pub(crate) data: tonic::Streaming<LogStreamData>,
    /// Where the call's answer goes; the call ends when it is sent (or dropped).
    pub(crate) done: oneshot::Sender<LogStreamResponse>,
}

/// Chunks buffered between the agent's call and the HTTP body.
const BUFFERED: usize = 4;
/// How long the answer waits for the agent's first frame (an error or the first bytes) before
/// it starts anyway (an agent that sends nothing before the log has output: upstream's).
const FIRST_FRAME: Duration = Duration::from_secs(5);

type Chunk = Result<http_body::Frame<Bytes>, std::io::Error>;

/// Answers `GET …/pods/<p>/log` for `agent`.
pub(super) async fn serve<B>(
    proxy: &ResourceProxy,
    agent: &str,
    target: ApiResource,
    req: Request<B>,
) -> Response<ProxyBody>
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
{
    if req.method() != Method::GET {
        return boxed(status::failure(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("{} is not served for pods/log (GET is)", req.method()),
        ));
    }
    let request = match parse(&target, req.uri().query().unwrap_or("")) {
        Ok(r) => r,
        Err(message) => return boxed(status::failure(StatusCode::BAD_REQUEST, &message)),
    };
    let span = tracing::debug_span!("pod_log", %agent, namespace = %request.namespace, pod = %request.pod_name,
        follow = request.follow, uuid = tracing::field::Empty);
    open(proxy, agent, request).instrument(span).await
}

async fn open(proxy: &ResourceProxy, agent: &str, mut request: ContainerLogRequest) -> Response<ProxyBody> {
    let peer = match proxy.connected(agent) {
        Ok(peer) => peer,
        Err(resp) => return boxed(resp),
    };
    let uuid = protocol::event::new_uuid();
    tracing::Span::current().record("uuid", uuid.as_str());
    request.uuid.clone_from(&uuid);
    let (ticket, attached) = match proxy.tables.logs.begin(agent, &uuid, proxy.config.max_in_flight_per_agent) {
        Ok(t) => t,
        Err(busy) => {
            return boxed(status::busy(&format!(
                "agent {agent:?} already has {} pod logs open through the resource proxy",
                busy.in_flight
            )));
        }
    };
    let mut lines = LogLines::new(&request);
    let wire = lines.wire_request(&request);
    match event(proxy, &wire) {
        Ok(ev) => peer.push(ev),
        Err(resp) => return boxed(resp),
    }
    let answered = tokio::time::timeout(proxy.config.request_timeout, attached).await;
    peer.mailbox().withdraw(&uuid);
    let mut attach = match answered {
        Ok(Ok(attach)) => attach,
        Ok(Err(_)) => {
            return boxed(status::failure(
                StatusCode::BAD_GATEWAY,
                &format!("agent {agent:?}: the log request was dropped"),
            ));
        }
        Err(_) => {
            return boxed(status::failure(
                StatusCode::GATEWAY_TIMEOUT,
                &format!("agent {agent:?} did not start streaming the log within {:?}", proxy.config.request_timeout),
            ));
        }
    };
    // The first frame says whether the log could be read at all: an error is an HTTP error.
    let first = match tokio::time::timeout(FIRST_FRAME, attach.data.message()).await {
        Ok(Ok(Some(frame))) if !frame.error.is_empty() && frame.data.is_empty() => {
            let resp = failure_of(agent, &frame.error);
            let _ = attach.done.send(LogStreamResponse {
                request_uuid: uuid,
                status: i32::from(resp.status().as_u16()),
                error: frame.error,
                lines_received: 0,
            });
            return boxed(resp);
        }
        Ok(Ok(Some(frame))) => Some(frame),
        Ok(Ok(None) | Err(_)) if !request.follow => {
            return boxed(status::failure(
                StatusCode::BAD_GATEWAY,
                &format!("agent {agent:?}: the log stream ended before it started"),
            ));
        }
        // Broken at once in follow mode (the pump resumes it), or nothing to say yet.
        Ok(Ok(None) | Err(_)) | Err(_) => None,
    };
    let (tx, rx) = mpsc::channel::<Chunk>(BUFFERED);
    let session = Session {
        proxy: proxy.clone(),
        agent: agent.to_owned(),
        uuid,
        follow: request.follow,
        wire,
        ticket: Some(ticket),
        lines: std::mem::take(&mut lines),
        bytes: 0,
    };
    tokio::spawn(session.pump(attach, first, tx).instrument(tracing::Span::current()));
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed_unsync();
    let mut resp = Response::new(body);
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    resp
}

/// The `containerlog` event asking for `wire`.
#[allow(clippy::result_large_err)]
fn event(proxy: &ResourceProxy, wire: &ContainerLogRequest) -> Result<Event, Response<http_body_util::Full<Bytes>>> {
    Event::request(EventType::HttpGet, Target::ContainerLog, &wire.uuid)
        .with_json(wire)
        .map(|e| e.with_principal_uid(proxy.hub.principal_uid.clone()))
        .map_err(|e| status::failure(StatusCode::INTERNAL_SERVER_ERROR, &format!("cannot encode the request: {e}")))
}

/// The answer to an agent's `error` frame: its Kubernetes `Status` when it is one, else 502.
fn failure_of(agent: &str, error: &str) -> Response<http_body_util::Full<Bytes>> {
    if status::is_status(error) {
        let code = serde_json::from_str::<serde_json::Value>(error)
            .ok()
            .and_then(|v| v["code"].as_u64())
            .and_then(|c| u16::try_from(c).ok())
            .and_then(|c| StatusCode::from_u16(c).ok())
            .filter(|c| !c.is_success() && super::api_server_answers(&Method::GET, *c))
            .unwrap_or(StatusCode::BAD_GATEWAY);
        return status::json(code, error.to_owned());
    }
    status::failure(StatusCode::BAD_GATEWAY, &format!("agent {agent:?} cannot stream the log: {error}"))
}

/// One log response being streamed.
struct Session {
    proxy: ResourceProxy,
    agent: String,
    uuid: String,
    follow: bool,
    /// What the agent was asked (timestamps forced in follow mode).
    wire: ContainerLogRequest,
    /// Holds the request's place among the agent's (bounded) logs; registered under `uuid`
    /// while a call is awaited.
    ticket: Option<Ticket<Attach>>,
    lines: LogLines,
    bytes: u64,
}

impl Session {
    /// Moves the agent's frames to the HTTP body until the end, the client leaving, or a break
    /// that cannot be resumed.
    async fn pump(mut self, mut attach: Attach, mut first: Option<LogStreamData>, tx: mpsc::Sender<Chunk>) {
        loop {
            let frame = match first.take() {
                Some(f) => Ok(Some(f)),
                None => tokio::select! {
                    f = attach.data.message() => f,
                    () = tx.closed() => {
                        tracing::debug!("the log's client went away; the agent's call is cancelled");
                        break;
                    }
                },
            };
            match frame {
                Ok(Some(frame)) => {
                    if !frame.data.is_empty() {
                        let out = self.lines.push(&frame.data);
                        if !self.send(&tx, out).await {
                            break;
                        }
                    }
                    if !frame.error.is_empty() {
                        tracing::debug!(error = %frame.error, "the agent ended the log with an error");
                        let _ = tx.send(Err(std::io::Error::other(format!("agent: {}", frame.error)))).await;
                        let _ = attach.done.send(self.answer(502, &frame.error));
                        break;
                    }
                    if frame.eof {
                        let rest = self.lines.finish();
                        self.send(&tx, rest).await;
                        let _ = attach.done.send(self.answer(200, ""));
                        break;
                    }
                }
                Ok(None) | Err(_) => {
                    if let Err(e) = &frame {
                        tracing::debug!(error = %e, "the agent's log call broke");
                    }
                    if !self.follow {
                        let _ = tx.send(Err(std::io::Error::other("the agent's log stream broke"))).await;
                        break;
                    }
                    // The broken call is answered (`Canceled`) now, not when the log ends.
                    drop(std::mem::replace(&mut attach.done, oneshot::channel().0));
                    match self.reattach(&tx).await {
                        Some(again) => {
                            tracing::debug!("the agent resumed the log");
                            attach = again;
                            self.lines.resuming();
                        }
                        None => {
                            let _ = tx.send(Err(std::io::Error::other("the agent's log stream broke"))).await;
                            break;
                        }
                    }
                }
            }
        }
        tracing::debug!(bytes = self.bytes, lines = self.lines.count(), "pod log ended");
        // Dropping `attach` (and its `done`) ends the agent's call with `Canceled` if it is open.
    }

    /// Sends `out` to the client; false when it went away.
    async fn send(&mut self, tx: &mpsc::Sender<Chunk>, out: Vec<u8>) -> bool {
        if out.is_empty() {
            return true;
        }
        self.bytes += out.len() as u64;
        crate::metrics::global().proxy_log_bytes(&self.agent, out.len() as u64);
        tx.send(Ok(http_body::Frame::data(Bytes::from(out)))).await.is_ok()
    }

    fn answer(&self, status: i32, error: &str) -> LogStreamResponse {
        LogStreamResponse {
            request_uuid: self.uuid.clone(),
            status,
            error: error.to_owned(),
            lines_received: i32::try_from(self.lines.count()).unwrap_or(i32::MAX),
        }
    }

    /// After a break in follow mode: waits (bounded) for the agent to call again, asking it
    /// again from the last line seen (an agent that restarted does not know the request; one
    /// still following ignores the copy, same UUID, and resumes on its own).
    async fn reattach(&mut self, tx: &mpsc::Sender<Chunk>) -> Option<Attach> {
        let hub = &self.proxy.hub;
        // Re-registered under the same UUID: the old ticket must go first.
        self.ticket = None;
        let (ticket, attached) =
            self.proxy.tables.logs.begin(&self.agent, &self.uuid, self.proxy.config.max_in_flight_per_agent).ok()?;
        self.ticket = Some(ticket);
        let mut again = self.wire.clone();
        if let Some(last) = self.lines.last() {
            again.since_time = last.to_string();
            again.since_seconds = None;
            again.tail_lines = None;
        }
        let peer = hub.peers.get(&self.agent);
        if let Some(peer) = &peer
            && let Ok(ev) = event(&self.proxy, &again)
        {
            peer.push(ev);
        }
        let wait = self.proxy.config.request_timeout;
        let result = tokio::select! {
            r = tokio::time::timeout(wait, attached) => r.ok().and_then(Result::ok),
            () = tx.closed() => None,
        };
        if let Some(peer) = &peer {
            peer.mailbox().withdraw(&self.uuid);
        }
        result
    }
}

/// Parses the query of a `pods/<p>/log` request as the API server does: a bad value is an
/// error naming the parameter.
pub(crate) fn parse(target: &ApiResource, query: &str) -> Result<ContainerLogRequest, String> {
    if target.namespace.is_empty() || target.name.is_empty() {
        return Err("pod logs need a namespace and a pod name (…/namespaces/<ns>/pods/<pod>/log)".to_owned());
    }
    let mut r = ContainerLogRequest {
        namespace: target.namespace.clone(),
        pod_name: target.name.clone(),
        ..ContainerLogRequest::default()
    };
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "container" => r.container = v.into_owned(),
            "follow" => r.follow = boolean(&k, &v)?,
            "timestamps" => r.timestamps = boolean(&k, &v)?,
            "previous" => r.previous = boolean(&k, &v)?,
            "insecureSkipTLSVerifyBackend" => r.insecure_skip_tls_verify_backend = boolean(&k, &v)?,
            "sinceSeconds" => r.since_seconds = Some(integer(&k, &v, 1)?),
            "tailLines" => r.tail_lines = Some(integer(&k, &v, 0)?),
            "limitBytes" => r.limit_bytes = Some(integer(&k, &v, 1)?),
            "sinceTime" => {
                let t: Timestamp = v.parse().map_err(|e| format!("sinceTime: {v:?} is not an RFC 3339 time: {e}"))?;
                r.since_time = t.to_string();
            }
            _ => {}
        }
    }
    if r.since_seconds.is_some() && !r.since_time.is_empty() {
        return Err("at most one of sinceTime or sinceSeconds may be specified".to_owned());
    }
    Ok(r)
}

/// A boolean query value as Go's `strconv.ParseBool` reads it (an empty value is `true`).
fn boolean(name: &str, v: &str) -> Result<bool, String> {
    match v {
        "" | "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{name}: {v:?} is not a boolean")),
    }
}

fn integer(name: &str, v: &str, min: i64) -> Result<i64, String> {
    let n: i64 = v.parse().map_err(|_| format!("{name}: {v:?} is not an integer"))?;
    if n < min {
        return Err(format!("{name}: must be at least {min}, not {n}"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> ApiResource {
        ApiResource {
            version: "v1".into(),
            namespace: "shop".into(),
            resource: "pods".into(),
            name: "web".into(),
            subresource: "log".into(),
            ..ApiResource::default()
        }
    }

    #[test]
    fn the_query_is_parsed_strictly() {
        let r = parse(
            &pod(),
            "container=app&follow=true&timestamps=1&tailLines=3&limitBytes=100&previous=false&insecureSkipTLSVerifyBackend=true&pretty=x",
        )
        .expect("valid");
        assert_eq!((r.namespace.as_str(), r.pod_name.as_str(), r.container.as_str()), ("shop", "web", "app"));
        assert!(r.follow && r.timestamps && !r.previous && r.insecure_skip_tls_verify_backend);
        assert_eq!((r.tail_lines, r.limit_bytes), (Some(3), Some(100)));
        let t = parse(&pod(), "sinceTime=2024-05-01T10:00:00Z").expect("valid");
        assert_eq!(t.since_time, "2024-05-01T10:00:00Z");
        for (query, names) in [
            ("follow=yes", "follow"),
            ("timestamps=2", "timestamps"),
            ("tailLines=x", "tailLines"),
            ("tailLines=-1", "tailLines"),
            ("sinceSeconds=0", "sinceSeconds"),
            ("limitBytes=1.5", "limitBytes"),
            ("sinceTime=yesterday", "sinceTime"),
            ("previous=nope", "previous"),
            ("insecureSkipTLSVerifyBackend=maybe", "insecureSkipTLSVerifyBackend"),
        ] {
            let e = parse(&pod(), query).expect_err(query);
            assert!(e.starts_with(names), "{query}: {e}");
        }
        assert!(parse(&pod(), "sinceSeconds=5&sinceTime=2024-05-01T10:00:00Z").is_err());
        let no_ns = ApiResource { namespace: String::new(), ..pod() };
        assert!(parse(&no_ns, "").is_err());
    }

    #[test]
    fn an_error_frame_becomes_the_status_it_carries() {
        let nf = protocol::payload::status_body(404, "pods \"x\" not found");
        let resp = failure_of("a", &nf);
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let resp = failure_of("a", "connection refused");
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    }
}
