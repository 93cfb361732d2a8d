//! One stream's events being applied: concurrently across resources, in arrival order within
//! one, a bounded number at once.
//!
//! An agent's outbox keeps one event per resource in flight, so a busy agent (its Argo CD
//! writing the status of many Applications) sends the events of many resources back to back.
//! Applied one at a time, the agent's status reached the hub at about a third of the hub API
//! server's own rate (one write's latency per event); upstream applies them one at a time too.
//!
//! Rules, per stream (the agent's own locks in [`crate::peer::AgentPeer::applying`] keep the
//! same per resource across streams and against a resync):
//! * an event with a lane key (an Application's create, update, status or delete: its
//!   namespace and name) starts when no event of the same key and no barrier is running;
//! * an event without one (projects, resync requests, anything else) is a **barrier**: it starts
//!   when nothing is running, and nothing starts while it runs;
//! * nothing overtakes an event held back, so per-key order and barrier order are arrival order;
//! * at most `limit` events are running or held back; [`Lanes::has_room`] tells the receive
//!   loop to stop reading (HTTP/2 flow control then holds the agent back).
//!
//! An idle stream holds no allocation here: the running set is allocated when an event
//! arrives and freed when the last one finishes.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

/// A running event's future, yielding its key when it is done.
struct Keyed<'a> {
    run: BoxFuture<'a, ()>,
    key: Option<Box<str>>,
}

impl Future for Keyed<'_> {
    type Output = Option<Box<str>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        ready!(self.run.as_mut().poll(cx));
        Poll::Ready(self.key.take())
    }
}

/// What a busy stream holds: the running events and those held back behind them.
struct Busy<'a, T> {
    running: FuturesUnordered<Keyed<'a>>,
    /// The keys of the running events (`None`: a barrier); at most `limit` long.
    keys: Vec<Option<Box<str>>>,
    held: VecDeque<(Option<Box<str>>, T)>,
}

/// The events of one stream being applied; `start` makes an event's future.
pub(crate) struct Lanes<'a, T, S> {
    limit: usize,
    start: S,
    busy: Option<Box<Busy<'a, T>>>,
}

impl<'a, T, S> Lanes<'a, T, S>
where
    S: FnMut(Option<Box<str>>, T) -> BoxFuture<'a, ()>,
{
    /// At most `limit` (at least 1) events running or held back at once.
    pub(crate) fn new(limit: usize, start: S) -> Self {
        Self { limit: limit.max(1), start, busy: None }
    }

    /// Whether another event may be accepted now.
    pub(crate) fn has_room(&self) -> bool {
        self.busy.as_ref().is_none_or(|b| b.running.len() + b.held.len() < self.limit)
    }

    /// Whether no event is running or held back.
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        self.busy.is_none()
    }

    /// Takes an event: starts it now if its key allows, else holds it back.
    pub(crate) fn submit(&mut self, key: Option<Box<str>>, item: T) {
        let busy = self.busy.get_or_insert_with(|| {
            Box::new(Busy { running: FuturesUnordered::new(), keys: Vec::new(), held: VecDeque::new() })
        });
        busy.held.push_back((key, item));
        Self::start_admissible(busy, &mut self.start);
    }

    /// Waits until a running event is done and starts what that lets through; `None` at once
    /// when nothing is running.
    pub(crate) async fn finished(&mut self) -> Option<()> {
        let busy = self.busy.as_mut()?;
        let key = busy.running.next().await?;
        if let Some(at) = busy.keys.iter().position(|k| *k == key) {
            busy.keys.swap_remove(at);
        }
        Self::start_admissible(busy, &mut self.start);
        if busy.running.is_empty() && busy.held.is_empty() {
            self.busy = None;
        }
        Some(())
    }

    /// Runs every running event to its end; what is held back is dropped unstarted.
    pub(crate) async fn drain(&mut self) {
        if let Some(busy) = self.busy.as_mut() {
            busy.held.clear();
            while busy.running.next().await.is_some() {}
        }
        self.busy = None;
    }

    fn start_admissible(busy: &mut Busy<'a, T>, start: &mut S) {
        while let Some((key, _)) = busy.held.front() {
            let admissible = match key {
                None => busy.keys.is_empty(),
                Some(_) => !busy.keys.iter().any(|k| k.is_none() || k == key),
            };
            if !admissible {
                return;
            }
            let Some((key, item)) = busy.held.pop_front() else { return };
            busy.keys.push(key.clone());
            busy.running.push(Keyed { run: start(key.clone(), item), key });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::sync::oneshot;

    use super::*;

    type Gates = Arc<Mutex<Vec<(&'static str, oneshot::Sender<()>)>>>;
    type Start = Box<dyn FnMut(Option<Box<str>>, &'static str) -> BoxFuture<'static, ()> + Send>;

    /// A lane set whose events finish when the test says: each started event records its
    /// name and waits on a oneshot the test holds.
    struct Rig {
        started: Arc<Mutex<Vec<&'static str>>>,
        gates: Gates,
    }

    impl Rig {
        fn new() -> Self {
            Self { started: Arc::default(), gates: Arc::default() }
        }

        fn lanes(&self, limit: usize) -> Lanes<'static, &'static str, Start> {
            let (started, gates) = (self.started.clone(), self.gates.clone());
            Lanes::new(
                limit,
                Box::new(move |_key, name| {
                    let (tx, rx) = oneshot::channel();
                    started.lock().unwrap().push(name);
                    gates.lock().unwrap().push((name, tx));
                    Box::pin(async move {
                        _ = rx.await;
                    })
                }),
            )
        }

        fn started(&self) -> Vec<&'static str> {
            self.started.lock().unwrap().clone()
        }

        fn finish(&self, name: &str) {
            let mut gates = self.gates.lock().unwrap();
            let at = gates.iter().position(|(n, _)| *n == name).expect("started");
            _ = gates.remove(at).1.send(());
        }
    }

    fn key(k: &str) -> Option<Box<str>> {
        Some(k.into())
    }

    #[tokio::test]
    async fn different_resources_run_at_once_and_one_resource_keeps_its_order() {
        let rig = Rig::new();
        let mut lanes = rig.lanes(16);
        lanes.submit(key("a"), "a1");
        lanes.submit(key("b"), "b1");
        lanes.submit(key("a"), "a2");
        lanes.submit(key("c"), "c1");
        // a2 waits for a1, and c1 waits behind a2: nothing overtakes a held event.
        assert_eq!(rig.started(), ["a1", "b1"]);
        rig.finish("b1");
        lanes.finished().await.unwrap();
        assert_eq!(rig.started(), ["a1", "b1"]);
        rig.finish("a1");
        lanes.finished().await.unwrap();
        assert_eq!(rig.started(), ["a1", "b1", "a2", "c1"]);
        rig.finish("c1");
        rig.finish("a2");
        lanes.finished().await.unwrap();
        lanes.finished().await.unwrap();
        assert!(lanes.is_idle(), "the running set is freed when the last event is done");
        assert_eq!(lanes.finished().await, None);
    }

    #[tokio::test]
    async fn a_barrier_waits_for_everything_before_it_and_holds_everything_after_it() {
        let rig = Rig::new();
        let mut lanes = rig.lanes(16);
        lanes.submit(key("a"), "a1");
        lanes.submit(key("b"), "b1");
        lanes.submit(None, "project");
        lanes.submit(key("c"), "c1");
        assert_eq!(rig.started(), ["a1", "b1"]);
        rig.finish("a1");
        lanes.finished().await.unwrap();
        assert_eq!(rig.started(), ["a1", "b1"]);
        rig.finish("b1");
        lanes.finished().await.unwrap();
        assert_eq!(rig.started(), ["a1", "b1", "project"]);
        rig.finish("project");
        lanes.finished().await.unwrap();
        assert_eq!(rig.started(), ["a1", "b1", "project", "c1"]);
    }

    #[tokio::test]
    async fn the_limit_counts_running_and_held_events() {
        let rig = Rig::new();
        let mut lanes = rig.lanes(2);
        assert!(lanes.has_room());
        lanes.submit(key("a"), "a1");
        assert!(lanes.has_room());
        lanes.submit(key("a"), "a2");
        assert!(!lanes.has_room(), "one running and one held back fill a limit of 2");
        rig.finish("a1");
        lanes.finished().await.unwrap();
        assert!(lanes.has_room());
        assert_eq!(rig.started(), ["a1", "a2"]);
        // A limit of 1 is upstream's one event at a time.
        let rig = Rig::new();
        let mut one = rig.lanes(1);
        one.submit(key("a"), "a1");
        assert!(!one.has_room());
    }

    #[tokio::test]
    async fn drain_finishes_what_runs_and_drops_what_is_held() {
        let rig = Rig::new();
        let mut lanes = rig.lanes(16);
        lanes.submit(key("a"), "a1");
        lanes.submit(key("a"), "a2");
        rig.finish("a1");
        lanes.drain().await;
        assert_eq!(rig.started(), ["a1"], "a2 was held back behind a1 and is never started");
        assert!(lanes.is_idle());
    }
}
