//! `principal.apis.logstreamapi.LogStreamService/StreamLogs`: an agent streams the pod log a
//! resource-proxy request asked for (upstream §5.3).
//!
//! The first frame names the request (`request_uuid` only); the call is handed to the HTTP
//! request waiting for it ([`crate::proxy::logs`]) only when the calling agent is the agent the
//! request was sent to: another agent naming that UUID is refused with `PermissionDenied`
//! (upstream accepts any authenticated agent: session hijack, §10 item 14). The call is answered
//! when the log ends (`status: 200`), or `Canceled` when the HTTP client went away (which stops
//! an agent following the log).

use std::sync::Arc;

use protocol::pb::logstreamapi::log_stream_service_server::LogStreamService;
use protocol::pb::logstreamapi::{LogStreamData, LogStreamResponse};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status, Streaming};

use crate::pending::Completion;
use crate::proxy::Tables;
use crate::proxy::logs::Attach;

/// The `LogStreamService` (behind [`crate::access::authz`]: every call carries a [`crate::access::authz::Permit`]).
#[derive(Debug, Clone)]
pub struct LogStreams {
    tables: Arc<Tables>,
}

impl LogStreams {
    pub(crate) fn new(tables: Arc<Tables>) -> Self {
        Self { tables }
    }
}

#[tonic::async_trait]
impl LogStreamService for LogStreams {
    async fn stream_logs(
        &self,
        request: Request<Streaming<LogStreamData>>,
    ) -> Result<Response<LogStreamResponse>, Status> {
        let Some(agent) = request.extensions().get::<crate::access::authz::Permit>().map(|p| p.agent.clone()) else {
            return Err(Status::unauthenticated("the call names no agent"));
        };
        let mut data = request.into_inner();
        let first = data
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the log stream ended before its first frame"))?;
        let uuid = first.request_uuid;
        if uuid.is_empty() {
            return Err(Status::invalid_argument("the first frame of a log stream must name its request_uuid"));
        }
        let (done, answer) = oneshot::channel();
        match self.tables.logs.complete(&agent, &uuid, Attach { data, done }) {
            Completion::Delivered => {
                tracing::debug!(%agent, %uuid, "pod log stream attached");
            }
            Completion::Unknown => {
                tracing::debug!(%agent, %uuid, "pod log stream for a request nobody waits for");
                return Err(Status::not_found(format!("no pod log request {uuid} is waiting (it ended or timed out)")));
            }
            Completion::WrongAgent => {
                tracing::warn!(%agent, %uuid, "pod log stream for a request sent to another agent; refused");
                return Err(Status::permission_denied(format!(
                    "pod log request {uuid} was not sent to agent {agent:?}"
                )));
            }
        }
        match answer.await {
            Ok(resp) => Ok(Response::new(resp)),
            Err(_) => Err(Status::cancelled("the pod log's HTTP client went away (client detached)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes frames as the generated server does.
    struct Frames;

    impl tonic::codec::Decoder for Frames {
        type Item = LogStreamData;
        type Error = Status;

        fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<LogStreamData>, Status> {
            use prost::Message as _;
            LogStreamData::decode(src).map(Some).map_err(|e| Status::internal(e.to_string()))
        }
    }

    fn tables() -> Arc<Tables> {
        Arc::new(Tables::default())
    }

    /// The calls of the test: frames an agent streams, as tonic reads them.
    fn streaming(frames: Vec<LogStreamData>) -> Streaming<LogStreamData> {
        use prost::Message as _;
        let mut body = Vec::new();
        for f in frames {
            let msg = f.encode_to_vec();
            body.push(0u8);
            body.extend_from_slice(&u32::try_from(msg.len()).expect("small").to_be_bytes());
            body.extend_from_slice(&msg);
        }
        let body = http_body_util::Full::new(bytes::Bytes::from(body));
        Streaming::new_request(Frames, body, None, None)
    }

    fn call(agent: &str, frames: Vec<LogStreamData>) -> Request<Streaming<LogStreamData>> {
        let mut req = Request::new(streaming(frames));
        req.extensions_mut().insert(crate::access::authz::Permit {
            agent: agent.to_owned(),
            mode: crate::config::AgentMode::Managed,
            grant: crate::ident::StreamGrant::default(),
        });
        req
    }

    fn frame(uuid: &str, data: &[u8], eof: bool) -> LogStreamData {
        LogStreamData { request_uuid: uuid.into(), data: data.to_vec(), eof, error: String::new() }
    }

    #[tokio::test]
    async fn only_the_agent_asked_can_stream_the_log() {
        let tables = tables();
        let service = LogStreams::new(tables.clone());
        let (_ticket, attached) = tables.logs.begin("agent-a", "u-1", 8).expect("room");
        // Another agent naming agent-a's request is refused, and the request still waits.
        let hijack =
            service.stream_logs(call("agent-b", vec![frame("u-1", b"", false), frame("u-1", b"stolen", true)])).await;
        let status = hijack.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(status.message().contains("agent-b"), "{}", status.message());
        // A request nobody waits for.
        let unknown = service.stream_logs(call("agent-a", vec![frame("nope", b"", false)])).await;
        assert_eq!(unknown.expect_err("unknown").code(), tonic::Code::NotFound);
        // The agent asked attaches; its answer is what the waiting side sends.
        let serving = tokio::spawn({
            let service = service.clone();
            async move {
                service.stream_logs(call("agent-a", vec![frame("u-1", b"", false), frame("u-1", b"ok\n", true)])).await
            }
        });
        let mut attach = attached.await.expect("attached");
        let f = attach.data.message().await.expect("frame").expect("a frame");
        assert_eq!(f.data, b"ok\n");
        attach
            .done
            .send(LogStreamResponse { request_uuid: "u-1".into(), status: 200, ..Default::default() })
            .expect("sent");
        let resp = serving.await.expect("joined").expect("answered").into_inner();
        assert_eq!(resp.status, 200);
    }

    #[tokio::test]
    async fn the_client_going_away_cancels_the_agents_call() {
        let tables = tables();
        let service = LogStreams::new(tables.clone());
        let (_ticket, attached) = tables.logs.begin("a", "u-2", 8).expect("room");
        let serving = tokio::spawn({
            let service = service.clone();
            async move { service.stream_logs(call("a", vec![frame("u-2", b"", false)])).await }
        });
        drop(attached.await.expect("attached"));
        let status = serving.await.expect("joined").expect_err("cancelled");
        assert_eq!(status.code(), tonic::Code::Cancelled);
    }
}
