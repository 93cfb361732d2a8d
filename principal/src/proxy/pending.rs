//! Resource-proxy requests waiting for their agent's answer.
//!
//! Each request is registered under its UUID with the agent it was sent to, before it is
//! queued. An answer completes it only when it comes from that same agent: an agent can never
//! answer for another agent's cluster. Requests per agent are bounded; the bound answers 429
//! instead of queueing without limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use protocol::payload::ResourceResponse;
use tokio::sync::oneshot;

use link::lock;

#[derive(Debug)]
struct Waiting {
    agent: String,
    answer: oneshot::Sender<ResourceResponse>,
}

#[derive(Debug, Default)]
struct Inner {
    waiting: HashMap<String, Waiting>,
    per_agent: HashMap<String, usize>,
}

/// Requests in flight, by UUID.
#[derive(Debug, Default, Clone)]
pub(crate) struct Pending {
    inner: Arc<Mutex<Inner>>,
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
pub(crate) struct Ticket {
    pending: Pending,
    uuid: String,
    agent: String,
}

impl Drop for Ticket {
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

impl Pending {
    /// Registers request `uuid` for `agent`, unless `limit` requests of it are in flight.
    pub(crate) fn begin(
        &self,
        agent: &str,
        uuid: &str,
        limit: usize,
    ) -> Result<(Ticket, oneshot::Receiver<ResourceResponse>), Busy> {
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
    pub(crate) fn complete(&self, from: &str, uuid: &str, answer: ResourceResponse) -> Completion {
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
