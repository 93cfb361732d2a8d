//! `terminalstreamapi.TerminalStreamService/StreamTerminal`: an agent carries the web terminal a
//! resource-proxy request opened (upstream §5.4, [`crate::proxy::terminal`]).
//!
//! The agent's first frame is the handshake: only `request_uuid`. The call is handed to the
//! session waiting for that UUID only if the session was created for the calling agent (the
//! [`crate::access::authz::Permit`] names it): another agent is refused with `PermissionDenied`
//! (upstream hands any agent any session, §10 item 14); an unknown or expired UUID is
//! `NotFound`. From then on the session sends the agent stdin, resizes and stdin EOF on this
//! call's answer stream, and ends it when the terminal closes.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use protocol::pb::terminalstreamapi::TerminalStreamData;
use protocol::pb::terminalstreamapi::terminal_stream_service_server::TerminalStreamService;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::pending::Completion;
use crate::proxy::Tables;
use crate::proxy::terminal::{Attach, BUFFER};

/// How long an agent may take to send the handshake frame after opening the call.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The `TerminalStreamService` (behind [`crate::access::authz`]: every call carries a
/// [`crate::access::authz::Permit`]).
#[derive(Debug, Clone)]
pub struct TerminalStreams {
    tables: Arc<Tables>,
}

impl TerminalStreams {
    pub(crate) fn new(tables: Arc<Tables>) -> Self {
        Self { tables }
    }
}

/// What `StreamTerminal` answers with.
pub type TerminalOut = Pin<Box<dyn futures::Stream<Item = Result<TerminalStreamData, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl TerminalStreamService for TerminalStreams {
    type StreamTerminalStream = TerminalOut;

    async fn stream_terminal(
        &self,
        request: Request<Streaming<TerminalStreamData>>,
    ) -> Result<Response<TerminalOut>, Status> {
        let agent = request
            .extensions()
            .get::<crate::access::authz::Permit>()
            .map(|p| p.agent.clone())
            .ok_or_else(|| Status::unauthenticated("no authorized agent on this call"))?;
        let mut from_agent = request.into_inner();
        let handshake = match tokio::time::timeout(HANDSHAKE_TIMEOUT, from_agent.message()).await {
            Ok(Ok(Some(first))) => first,
            Ok(Ok(None)) => return Err(Status::invalid_argument("the terminal stream ended before its handshake")),
            Ok(Err(status)) => return Err(status),
            Err(_) => {
                return Err(Status::deadline_exceeded(format!(
                    "no handshake frame (request_uuid) within {HANDSHAKE_TIMEOUT:?}"
                )));
            }
        };
        let uuid = handshake.request_uuid;
        if uuid.is_empty() {
            return Err(Status::invalid_argument("the handshake frame names no request_uuid"));
        }
        let (to_agent, rx) = mpsc::channel(BUFFER);
        match self.tables.terminals.complete(&agent, &uuid, Attach { from_agent, to_agent }) {
            Completion::Delivered => {
                tracing::debug!(%agent, %uuid, "terminal stream attached");
                Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
            }
            Completion::Unknown => {
                tracing::debug!(%agent, %uuid, "terminal stream for a session nobody waits for");
                Err(Status::not_found(format!("no terminal session {uuid} waits (closed or timed out)")))
            }
            Completion::WrongAgent => {
                tracing::warn!(%agent, %uuid, "terminal stream for a session of another agent; refused");
                Err(Status::permission_denied(format!("terminal session {uuid} was not opened for agent {agent:?}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::authz::Permit;
    use crate::config::AgentMode;
    use futures::StreamExt as _;
    use prost::Message as _;
    use tonic::codec::Codec as _;

    /// A `Streaming` of `frames` as tonic would decode them from an agent's call.
    pub(crate) fn streaming(frames: mpsc::Receiver<TerminalStreamData>) -> Streaming<TerminalStreamData> {
        let body = http_body_util::StreamBody::new(ReceiverStream::new(frames).map(|m| {
            let bytes = m.encode_to_vec();
            let mut framed = Vec::with_capacity(bytes.len() + 5);
            framed.push(0);
            framed.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
            framed.extend_from_slice(&bytes);
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(bytes::Bytes::from(framed)))
        }));
        let mut codec = protocol::grpc_codec::Codec::<TerminalStreamData, TerminalStreamData>::default();
        Streaming::new_request(codec.decoder(), body, None, None)
    }

    fn call(agent: &str, frames: mpsc::Receiver<TerminalStreamData>) -> Request<Streaming<TerminalStreamData>> {
        let mut req = Request::new(streaming(frames));
        req.extensions_mut().insert(Permit {
            agent: agent.to_owned(),
            mode: AgentMode::Managed,
            grant: crate::ident::StreamGrant::default(),
        });
        req
    }

    fn handshake(uuid: &str) -> mpsc::Receiver<TerminalStreamData> {
        let (tx, rx) = mpsc::channel(4);
        let _ = tx.try_send(TerminalStreamData { request_uuid: uuid.to_owned(), ..Default::default() });
        rx
    }

    #[tokio::test]
    async fn only_the_agent_a_session_was_opened_for_can_carry_it() {
        let tables = Arc::new(Tables::default());
        let service = TerminalStreams::new(tables.clone());
        let (_ticket, attached) = tables.terminals.begin("agent-a", "u1", 4).expect("room");

        let refused = service.stream_terminal(call("agent-b", handshake("u1"))).await.err().expect("refused");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused}");
        let unknown = service.stream_terminal(call("agent-a", handshake("u2"))).await.err().expect("refused");
        assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown}");
        let (tx, rx) = mpsc::channel(4);
        tx.send(TerminalStreamData::default()).await.expect("room");
        let empty = service.stream_terminal(call("agent-a", rx)).await.err().expect("refused");
        assert_eq!(empty.code(), tonic::Code::InvalidArgument, "{empty}");

        // The right agent attaches: the session gets its frames, the agent what the session sends.
        let (tx, rx) = mpsc::channel(4);
        tx.send(TerminalStreamData { request_uuid: "u1".into(), ..Default::default() }).await.expect("room");
        let answer = service.stream_terminal(call("agent-a", rx)).await.expect("attached");
        let Attach { mut from_agent, to_agent } = attached.await.expect("delivered");
        tx.send(TerminalStreamData { request_uuid: "u1".into(), data: b"out".to_vec(), ..Default::default() })
            .await
            .expect("room");
        assert_eq!(from_agent.message().await.expect("frame").expect("frame").data, b"out");
        to_agent
            .send(Ok(TerminalStreamData { request_uuid: "u1".into(), eof: true, ..Default::default() }))
            .await
            .expect("room");
        let mut out = answer.into_inner();
        assert!(out.next().await.expect("frame").expect("frame").eof);
        drop(to_agent);
        assert!(out.next().await.is_none(), "the call ends when the session drops its sender");
        // Delivered once: a second attach for the same session is unknown.
        let again = service.stream_terminal(call("agent-a", handshake("u1"))).await.err().expect("refused");
        assert_eq!(again.code(), tonic::Code::NotFound);
    }
}
