//! What the Redis proxy waits for from agents: answers to its requests (by request UUID, in
//! the pending table the resource proxy uses too) and messages on the channels its client
//! connections subscribed to through an agent (by connection UUID).
//!
//! Only the agent a request went to can answer it, and only the agent a channel was subscribed
//! through can push messages on it: an agent cannot reach another agent's callers. When an
//! agent's stream ends, its requests fail at once and every connection holding one of its
//! subscriptions is told the subscription is lost (the connection then closes, so the client,
//! go-redis for Argo CD, reconnects and subscribes again).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use bytes::Bytes;
use protocol::Event;
use protocol::payload::{RedisResponse, RedisResponseBody};
use tokio::sync::{mpsc, watch};

use crate::pending::{Completion, Pending};
use link::lock;

/// One client connection's subscriptions through agents.
#[derive(Debug)]
struct Subscriber {
    /// `(agent, channel)` pairs subscribed.
    channels: HashSet<(String, String)>,
    /// Messages for the connection's writer (channel names).
    messages: mpsc::Sender<Bytes>,
    /// Set once a subscription is lost: why.
    lost: watch::Sender<Option<String>>,
}

/// The Redis proxy's requests in flight and subscriptions, shared with the event stream's
/// receive loop (which hands answers over through [`super::complete`]).
#[derive(Debug, Default)]
pub(crate) struct Exchange {
    pub(super) pending: Pending<RedisResponseBody>,
    subscribers: Mutex<HashMap<String, Subscriber>>,
}

/// What a connection registers to receive its subscriptions' messages.
#[derive(Debug)]
pub(super) struct Inbox {
    pub(super) messages: mpsc::Receiver<Bytes>,
    pub(super) lost: watch::Receiver<Option<String>>,
}

/// Messages buffered for one connection; beyond, messages are dropped (each only tells Argo
/// CD to read the key again, and one waiting does that).
const MESSAGES_PER_CONNECTION: usize = 256;

impl Exchange {
    /// Registers connection `conn` for messages; call once per connection.
    pub(super) fn open(&self, conn: &str) -> Inbox {
        let (tx, messages) = mpsc::channel(MESSAGES_PER_CONNECTION);
        let (lost_tx, lost) = watch::channel(None);
        lock(&self.subscribers)
            .insert(conn.to_owned(), Subscriber { channels: HashSet::new(), messages: tx, lost: lost_tx });
        Inbox { messages, lost }
    }

    /// Forgets connection `conn` and its subscriptions.
    pub(super) fn close(&self, conn: &str) {
        lock(&self.subscribers).remove(conn);
    }

    /// Records that `conn` subscribed to `channel` through `agent`; returns how many channels
    /// the connection holds, and whether it is the first through that agent.
    pub(super) fn subscribed(&self, conn: &str, agent: &str, channel: &str) -> (usize, bool) {
        let mut subs = lock(&self.subscribers);
        let Some(s) = subs.get_mut(conn) else { return (0, false) };
        let first = !s.channels.iter().any(|(a, _)| a == agent);
        s.channels.insert((agent.to_owned(), channel.to_owned()));
        (s.channels.len(), first)
    }

    /// Marks `conn`'s subscriptions lost, for `reason`.
    pub(super) fn lose(&self, conn: &str, reason: String) {
        if let Some(s) = lock(&self.subscribers).get(conn) {
            s.lost.send_replace(Some(reason));
        }
    }

    /// A message pushed by `agent` for `conn` on `channel`; refused unless `conn` subscribed to
    /// it through that agent.
    pub(super) fn push(&self, agent: &str, conn: &str, channel: &str) {
        let subs = lock(&self.subscribers);
        let Some(s) = subs.get(conn) else {
            tracing::debug!(%agent, conn, channel, "Redis message for a connection that is gone; dropped");
            return;
        };
        if !s.channels.contains(&(agent.to_owned(), channel.to_owned())) {
            tracing::warn!(%agent, conn, channel,
                "Redis message on a channel the connection did not subscribe to through this agent; refused");
            return;
        }
        if s.messages.try_send(Bytes::copy_from_slice(channel.as_bytes())).is_err() {
            tracing::debug!(%agent, conn, channel, "Redis messages pile up for a slow client; this one is dropped");
        }
    }

    /// `agent`'s stream ended: its requests fail now, and connections subscribed through it
    /// lose their subscriptions.
    pub(crate) fn agent_gone(&self, agent: &str) {
        let failed = self.pending.abandon(agent);
        let subs = lock(&self.subscribers);
        let mut lost = 0;
        for s in subs.values() {
            if let Some((_, channel)) = s.channels.iter().find(|(a, _)| a == agent) {
                s.lost.send_replace(Some(format!(
                    "agent {agent:?} disconnected: the subscription to {channel:?} is lost (reconnect to subscribe again)"
                )));
                lost += 1;
            }
        }
        if failed + lost > 0 {
            tracing::info!(%agent, failed, lost, "agent disconnected: its Redis requests failed, subscriptions through it lost");
        }
    }

    /// An answer or message from `agent`.
    pub(crate) fn complete(&self, agent: &str, ev: &Event, answer: RedisResponse) {
        if let Some(push) = &answer.body.push_from_subscribe {
            self.push(agent, &answer.connection_uuid, &push.channel_name);
            return;
        }
        if answer.uuid != ev.event_id {
            tracing::warn!(%agent, event_id = %ev.event_id, uuid = %answer.uuid,
                "Redis answer whose uuid is not its eventid; dropped");
            return;
        }
        match self.pending.complete(agent, &ev.event_id, answer.body) {
            Completion::Delivered => {}
            Completion::Unknown => {
                tracing::debug!(%agent, uuid = %ev.event_id, "Redis answer nobody waits for (timed out); dropped");
            }
            Completion::WrongAgent => {
                tracing::warn!(%agent, uuid = %ev.event_id, "Redis answer for a request sent to another agent; refused");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::payload::RedisPushFromSubscribe;
    use protocol::{EventType, Target};

    fn push(conn: &str, channel: &str) -> RedisResponse {
        RedisResponse {
            uuid: "sub-1".into(),
            connection_uuid: conn.into(),
            body: RedisResponseBody {
                push_from_subscribe: Some(RedisPushFromSubscribe { channel_name: channel.into() }),
                ..RedisResponseBody::default()
            },
        }
    }

    #[tokio::test]
    async fn messages_reach_only_connections_subscribed_through_that_agent() {
        let x = Exchange::default();
        let mut inbox = x.open("c1");
        assert_eq!(x.subscribed("c1", "agent-a", "ch"), (1, true));
        assert_eq!(x.subscribed("c1", "agent-a", "ch2"), (2, false));
        let ev = Event::response(EventType::RedisResponse, Target::Redis, "sub-1");
        x.complete("agent-b", &ev, push("c1", "ch"));
        x.complete("agent-a", &ev, push("c1", "other"));
        x.complete("agent-a", &ev, push("c2", "ch"));
        assert!(inbox.messages.try_recv().is_err(), "refused: wrong agent, channel or connection");
        x.complete("agent-a", &ev, push("c1", "ch"));
        assert_eq!(&inbox.messages.try_recv().expect("delivered")[..], b"ch");
        x.agent_gone("agent-b");
        assert!(inbox.lost.borrow().is_none(), "another agent's disconnect changes nothing");
        x.agent_gone("agent-a");
        assert!(inbox.lost.borrow().as_deref().is_some_and(|r| r.contains("agent-a")));
        x.close("c1");
        x.complete("agent-a", &ev, push("c1", "ch"));
    }

    #[tokio::test]
    async fn answers_complete_requests_of_the_agent_asked() {
        let x = Exchange::default();
        let (_ticket, rx) = x.pending.begin("agent-a", "u1", 4).expect("room");
        let answer = RedisResponse { uuid: "u1".into(), ..RedisResponse::default() };
        let ev = Event::response(EventType::RedisResponse, Target::Redis, "u1");
        x.complete("agent-b", &ev, answer.clone());
        let other = Event::response(EventType::RedisResponse, Target::Redis, "u2");
        x.complete("agent-a", &other, answer.clone());
        x.complete("agent-a", &ev, answer);
        assert!(rx.await.is_ok());
        let (_t, rx) = x.pending.begin("agent-a", "u3", 4).expect("room");
        x.agent_gone("agent-a");
        assert!(rx.await.is_err(), "fails at once when the agent goes");
    }
}
