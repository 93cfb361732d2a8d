//! One request to an agent: queued in its mailbox as a `redis-request` event, answered by a
//! `redis-response` the receive loop hands to [`super::Exchange`]; withdrawn from the mailbox
//! when the answer came or the caller gave up, so a late reconnect does not run it.

use std::time::Duration;

use protocol::payload::{RedisCommandBody, RedisRequest, RedisResponseBody};
use protocol::{Event, EventType, Target};

use super::Exchange;
use crate::sync::hub::Hub;

/// Why an agent gave no answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum AskError {
    /// The agent has no stream.
    #[error("agent {0:?} is not connected to this principal")]
    NotConnected(String),
    /// Too many requests for the agent are in flight.
    #[error("agent {agent:?} already has {in_flight} Redis requests in flight; try again")]
    Busy { agent: String, in_flight: usize },
    /// No answer in time.
    #[error("agent {agent:?} did not answer within {timeout:?}")]
    Timeout { agent: String, timeout: Duration },
    /// The agent's stream ended before it answered.
    #[error("agent {0:?} disconnected before it answered")]
    Gone(String),
    /// The request could not be encoded.
    #[error("cannot encode the request: {0}")]
    Encode(String),
}

impl AskError {
    /// The metrics reason.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            Self::NotConnected(_) => "agent_disconnected",
            Self::Busy { .. } => "busy",
            Self::Timeout { .. } => "timeout",
            Self::Gone(_) => "agent_lost",
            Self::Encode(_) => "encode",
        }
    }
}

/// Sends `body` for client connection `conn` to `agent` and waits up to `timeout` for the
/// answer; at most `limit` requests of one agent are in flight.
pub(super) async fn ask(
    hub: &Hub,
    exchange: &Exchange,
    agent: &str,
    conn: &str,
    body: RedisCommandBody,
    timeout: Duration,
    limit: usize,
) -> Result<RedisResponseBody, AskError> {
    let Some(peer) = hub.peers.get(agent).filter(|p| p.is_connected()) else {
        return Err(AskError::NotConnected(agent.to_owned()));
    };
    let uuid = protocol::event::new_uuid();
    let (_ticket, answer) = exchange
        .pending
        .begin(agent, &uuid, limit)
        .map_err(|busy| AskError::Busy { agent: agent.to_owned(), in_flight: busy.in_flight })?;
    let request = RedisRequest { uuid: uuid.clone(), connection_uuid: conn.to_owned(), body };
    let event = Event::request(EventType::RedisRequest, Target::Redis, &uuid)
        .with_json(&request)
        .map_err(|e| AskError::Encode(e.to_string()))?
        .with_principal_uid(hub.principal_uid.clone());
    peer.push(event);
    // Answered, timed out or abandoned (the client went away): nothing of this request may be
    // sent (again) from then on.
    let _withdraw = Withdraw { peer, uuid };
    let answered = tokio::time::timeout(timeout, answer).await;
    match answered {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(_)) => Err(AskError::Gone(agent.to_owned())),
        Err(_) => Err(AskError::Timeout { agent: agent.to_owned(), timeout }),
    }
}

/// Withdraws a request from its agent's mailbox when dropped.
struct Withdraw {
    peer: std::sync::Arc<crate::peer::AgentPeer>,
    uuid: String,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        self.peer.mailbox().withdraw(&self.uuid);
    }
}
