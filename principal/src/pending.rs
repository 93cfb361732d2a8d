//! Requests to agents waiting for their answer: the resource proxy's (answer
//! [`ResourceResponse`]) and the Redis proxy's (answer
//! [`RedisResponseBody`](protocol::payload::RedisResponseBody)).
//!
//! Each request is registered under its UUID with the agent it was sent to, before it is
//! queued. An answer completes it only when it comes from that same agent: an agent can never
//! answer for another agent's cluster. Requests per agent are bounded; the bound answers 429
//! (the Redis proxy: an error reply) instead of queueing without limit. When an agent's stream
//! ends, [`Pending::abandon`] fails its requests at once instead of letting them time out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use protocol::payload::ResourceResponse;
use tokio::sync::oneshot;

use link::lock;

#[derive(Debug)]
struct Waiting<A> {
    agent: String,
    answer: oneshot::Sender<A>,
}

#[derive(Debug)]
struct Inner<A> {
    waiting: HashMap<String, Waiting<A>>,
    per_agent: HashMap<String, usize>,
}

/// Requests in flight, by UUID, each waiting for an answer `A`.
#[derive(Debug)]
pub(crate) struct Pending<A = ResourceResponse> {
    inner: Arc<Mutex<Inner<A>>>,
}

impl<A> Default for Pending<A> {
    fn default() -> Self {
        Self { inner: Arc::new(Mutex::new(Inner { waiting: HashMap::new(), per_agent: HashMap::new() })) }
    }
}

impl<A> Clone for Pending<A> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone() }
    }
}

/// What became of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completion {
    /// Handed to the waiting caller.
    Delivered,
    /// Nobody waits for that UUID (the caller timed out or went away).
    Unknown,
    /// The request was sent to another agent: refused.
    WrongAgent,
}

/// Too many requests for one agent are in flight.
#[derive(Debug)]
pub(crate) struct Busy {
    pub(crate) in_flight: usize,
}

/// A registered request; dropping it unregisters it.
#[derive(Debug)]
pub(crate) struct Ticket<A = ResourceResponse> {
    pending: Pending<A>,
    uuid: String,
    agent: String,
}

impl<A> Drop for Ticket<A> {
    fn drop(&mut self) {
        let mut inner = lock(&self.pending.inner);
        inner.waiting.remove(&self.uuid);
        if let Some(n) = inner.per_agent.get_mut(&self.agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                inner.per_agent.remove(&self.agent);
            }
        }
    }
}

impl<A> Pending<A> {
    /// Registers request `uuid` for `agent`, unless `limit` requests of it are in flight.
    pub(crate) fn begin(
        &self,
        agent: &str,
        uuid: &str,
        limit: usize,
    ) -> Result<(Ticket<A>, oneshot::Receiver<A>), Busy> {
        let mut inner = lock(&self.inner);
        let in_flight = inner.per_agent.get(agent).copied().unwrap_or(0);
        if in_flight >= limit {
            return Err(Busy { in_flight });
        }
        let (tx, rx) = oneshot::channel();
        inner.waiting.insert(uuid.to_owned(), Waiting { agent: agent.to_owned(), answer: tx });
        *inner.per_agent.entry(agent.to_owned()).or_default() += 1;
        drop(inner);
        Ok((Ticket { pending: self.clone(), uuid: uuid.to_owned(), agent: agent.to_owned() }, rx))
    }

    /// Hands `answer` (for request `uuid`) from agent `from` to its caller.
    pub(crate) fn complete(&self, from: &str, uuid: &str, answer: A) -> Completion {
        let mut inner = lock(&self.inner);
        match inner.waiting.get(uuid) {
            None => Completion::Unknown,
            Some(w) if w.agent != from => Completion::WrongAgent,
            Some(_) => {
                let Some(w) = inner.waiting.remove(uuid) else { return Completion::Unknown };
                drop(inner);
                // The caller may have given up this instant; then nobody needs the answer.
                let _ = w.answer.send(answer);
                Completion::Delivered
            }
        }
    }

    /// Fails every request waiting for `agent` (its stream ended): each caller sees its answer
    /// channel closed at once. Returns how many there were.
    pub(crate) fn abandon(&self, agent: &str) -> usize {
        let mut inner = lock(&self.inner);
        let before = inner.waiting.len();
        inner.waiting.retain(|_, w| w.agent != agent);
        before - inner.waiting.len()
    }

    /// Requests in flight for `agent`.
    #[cfg(test)]
    pub(crate) fn in_flight(&self, agent: &str) -> usize {
        lock(&self.inner).per_agent.get(agent).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: i64) -> ResourceResponse {
        ResourceResponse { uuid: "u".into(), status, resource: String::new() }
    }

    #[tokio::test]
    async fn only_the_agent_asked_can_answer_and_only_once() {
        let pending = Pending::default();
        let (ticket, rx) = pending.begin("agent-a", "u1", 4).expect("room");
        assert_eq!(pending.complete("agent-b", "u1", answer(200)), Completion::WrongAgent);
        assert_eq!(pending.complete("agent-a", "u2", answer(200)), Completion::Unknown);
        assert_eq!(pending.complete("agent-a", "u1", answer(201)), Completion::Delivered);
        assert_eq!(pending.complete("agent-a", "u1", answer(200)), Completion::Unknown, "answered already");
        assert_eq!(rx.await.expect("answer").status, 201);
        drop(ticket);
        assert_eq!(pending.in_flight("agent-a"), 0);
    }

    #[tokio::test]
    async fn an_agent_gone_fails_its_requests_at_once() {
        let pending = Pending::<u8>::default();
        let (_a, rx_a) = pending.begin("a", "1", 4).expect("room");
        let (_b, rx_b) = pending.begin("b", "2", 4).expect("room");
        assert_eq!(pending.abandon("a"), 1);
        assert!(rx_a.await.is_err(), "the caller sees the request fail");
        assert_eq!(pending.complete("b", "2", 7), Completion::Delivered);
        assert_eq!(rx_b.await.expect("answer"), 7);
    }

    #[test]
    fn requests_per_agent_are_bounded_and_the_bound_frees_on_drop() {
        let pending = Pending::default();
        let a1 = pending.begin("a", "1", 2).expect("room");
        let _a2 = pending.begin("a", "2", 2).expect("room");
        assert_eq!(pending.begin("a", "3", 2).expect_err("full").in_flight, 2);
        let _b1 = pending.begin("b", "4", 2).expect("other agents are not affected");
        drop(a1);
        let _a3 = pending.begin("a", "3", 2).expect("room again");
        assert_eq!(pending.complete("a", "1", answer(200)), Completion::Unknown, "a dropped request is gone");
    }
}
