//! The send side: the events a [`Mailbox`] owes one stream, as a stream the transport pulls
//! ([`events`]) or drained into a channel ([`send_loop`]).
//!
//! Policies, the same on both sides:
//! * **one stream at a time**: the loop sends only while its [`Attachment`] is the mailbox's
//!   current one, and stops as soon as a newer stream replaced it or `stop` fires;
//! * **oversized events are given up at once**: an event that would encode above
//!   [`SendOptions::max_bytes`] would fail the stream on every reconnect (the peer's decoder
//!   refuses it), so it is rejected, logged and counted; the next resync repairs what it carried;
//! * **heartbeats** ([`SendOptions::heartbeat`]) are events like any other, pushed to the mailbox
//!   so they are ACKed and keep the peer's silence detector quiet;
//! * **backpressure**: the loop waits while the transport's buffer is full; nothing is dropped,
//!   the mailbox holds the rest.

use std::time::Duration;

use futures::Stream;
use protocol::Event;
use protocol::outbox::Parked;
use protocol::pb::eventstreamapi::Event as WireEvent;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::mailbox::{Attachment, Mailbox};

/// How a send loop behaves.
#[derive(Clone, Copy, Debug)]
pub struct SendOptions {
    /// Push a heartbeat this often (`None`: never; the principal answers heartbeats and does not
    /// send its own).
    pub heartbeat: Option<Duration>,
    /// The largest encoded message the peer accepts.
    pub max_bytes: usize,
}

/// What the send loop reports, for metrics and logs. Every method has a no-op default.
pub trait SendHooks: Sync {
    /// Who the events are for, in log lines.
    fn peer(&self) -> &str;
    /// `event` was handed to the transport.
    fn sent(&self, _event: &Event) {}
    /// The transport went away while an event was being handed over.
    fn send_failed(&self) {}
    /// The mailbox gave up on an event (too many attempts, or rejected as oversized).
    fn discarded(&self, _parked: &Parked<Event>) {}
}

/// Where a stream's events come from: the peer's mailbox, and who hears what happened to them.
pub trait Outlet: SendHooks {
    /// The peer's mailbox.
    fn mailbox(&self) -> &Mailbox;
}

/// The events due to the stream holding `attachment`, drawn from `outlet`'s mailbox as the
/// transport pulls them: a gRPC body needs no task and no channel between the mailbox and the
/// connection (the principal's streams; [`send_loop`] drives the same stream into a channel).
/// It ends when `stop` fires or a newer stream replaced this one. An event is in flight from the
/// moment the stream takes it from the mailbox; dropped while it still holds events it took but
/// did not hand over, it reports [`SendHooks::send_failed`] (the transport went away), and those
/// events are due again on the next stream.
pub fn events<O: Outlet>(
    outlet: O,
    attachment: Attachment,
    stop: CancellationToken,
    options: SendOptions,
) -> impl Stream<Item = WireEvent> {
    futures::stream::unfold(Drawn::new(outlet, attachment, stop, options), |mut state| async move {
        let wire = state.next_wire().await?;
        Some((wire, state))
    })
}

/// The state of an [`events`] stream between two events.
struct Drawn<O: Outlet> {
    outlet: O,
    attachment: Attachment,
    stop: CancellationToken,
    options: SendOptions,
    ticker: Option<tokio::time::Interval>,
    /// Taken from the mailbox (in flight), not yet handed over.
    batch: std::vec::IntoIter<Event>,
}

impl<O: Outlet> Drawn<O> {
    fn new(outlet: O, attachment: Attachment, stop: CancellationToken, options: SendOptions) -> Self {
        let ticker =
            options.heartbeat.map(|every| tokio::time::interval_at(tokio::time::Instant::now() + every, every));
        Self { outlet, attachment, stop, options, ticker, batch: Vec::new().into_iter() }
    }

    /// The transport refused an event: reported once, here; the rest of the batch stays in
    /// flight in the mailbox, due again on the next stream.
    fn transport_failed(&mut self) {
        self.batch = Vec::new().into_iter();
        self.outlet.send_failed();
    }

    async fn next_wire(&mut self) -> Option<WireEvent> {
        loop {
            if self.stop.is_cancelled() {
                return None;
            }
            for mut ev in self.batch.by_ref() {
                ev.stamp_sent_at(chrono::Utc::now());
                let wire = ev.to_wire();
                let len = prost::Message::encoded_len(&wire);
                if len > self.options.max_bytes {
                    let limit = self.options.max_bytes;
                    tracing::warn!(peer = %self.outlet.peer(), event_type = %ev.event_type, target = %ev.target,
                        resource_id = %ev.resource_id, event_id = %ev.event_id, bytes = len, limit,
                        "event too large to send; given up (the next resync repairs)");
                    self.outlet
                        .mailbox()
                        .reject(&ev, format!("encodes to {len} bytes, above the {limit}-byte message limit"));
                    continue;
                }
                self.outlet.sent(&ev);
                return Some(wire);
            }
            // Handed over: the batch's memory goes back before the stream idles.
            self.batch = Vec::new().into_iter();
            // `None`: a newer stream replaced this one and must not lose events to it.
            let ready = self.outlet.mailbox().take_ready(self.attachment, self.outlet.peer())?;
            for parked in &ready.parked {
                self.outlet.discarded(parked);
            }
            if !ready.events.is_empty() {
                self.batch = ready.events.into_iter();
                continue;
            }
            // When to look at the mailbox again without being woken (a retransmission is due).
            let retransmit = async {
                match ready.next {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            let heartbeat = async {
                match self.ticker.as_mut() {
                    Some(t) => {
                        t.tick().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return None,
                () = self.outlet.mailbox().changed() => {}
                () = retransmit => {}
                () = heartbeat => {
                    self.outlet.mailbox().push(Event::heartbeat());
                }
            }
        }
    }
}

impl<O: Outlet> Drop for Drawn<O> {
    fn drop(&mut self) {
        if self.batch.len() > 0 && !self.stop.is_cancelled() {
            self.outlet.send_failed();
        }
    }
}

/// A borrowed mailbox and reporter, as one [`Outlet`].
struct Borrowed<'a> {
    mailbox: &'a Mailbox,
    hooks: &'a dyn SendHooks,
}

impl SendHooks for Borrowed<'_> {
    fn peer(&self) -> &str {
        self.hooks.peer()
    }
    fn sent(&self, event: &Event) {
        self.hooks.sent(event);
    }
    fn send_failed(&self) {
        self.hooks.send_failed();
    }
    fn discarded(&self, parked: &Parked<Event>) {
        self.hooks.discarded(parked);
    }
}

impl Outlet for Borrowed<'_> {
    fn mailbox(&self) -> &Mailbox {
        self.mailbox
    }
}

/// Drains `mailbox` onto `tx` while `attachment` is current, until `stop` fires or the transport
/// closes: the [`events`] stream, driven into a channel (the agent's stream and the load
/// generator's). `T` is what the channel carries (`WireEvent`, or a `Box` of one to keep an
/// idle stream's channel small).
pub async fn send_loop<T: From<WireEvent>>(
    mailbox: &Mailbox,
    attachment: Attachment,
    tx: &mpsc::Sender<T>,
    stop: &CancellationToken,
    options: SendOptions,
    hooks: &dyn SendHooks,
) {
    let mut drawn = Drawn::new(Borrowed { mailbox, hooks }, attachment, stop.clone(), options);
    loop {
        let wire = tokio::select! {
            biased;
            next = drawn.next_wire() => match next {
                Some(wire) => wire,
                None => return,
            },
            () = tx.closed() => return,
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            sent = tx.send(T::from(wire)) => if sent.is_err() {
                drawn.transport_failed();
                return;
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use protocol::outbox::RetryPolicy;
    use protocol::{EventType, Target};

    use super::*;

    #[derive(Default)]
    struct Counted {
        sent: AtomicUsize,
        failed: AtomicUsize,
        discarded: Mutex<Vec<String>>,
    }

    impl SendHooks for Counted {
        fn peer(&self) -> &str {
            "peer"
        }
        fn sent(&self, _: &Event) {
            self.sent.fetch_add(1, Ordering::Relaxed);
        }
        fn send_failed(&self) {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        fn discarded(&self, parked: &Parked<Event>) {
            crate::lock(&self.discarded).push(parked.item.event_id.clone());
        }
    }

    fn event(resource: &str, id: &str, body: usize) -> Event {
        let mut ev = Event::new(EventType::SpecUpdate, Target::Application, resource.to_owned(), id.to_owned());
        ev.data = Some(serde_json::Value::String("x".repeat(body)).into());
        ev
    }

    const LIMIT: usize = 4096;
    const WAIT: Duration = Duration::from_secs(10);

    async fn recv(rx: &mut mpsc::Receiver<Box<WireEvent>>) -> Event {
        let wire = tokio::time::timeout(WAIT, rx.recv()).await.expect("an event in time").expect("open");
        Event::from_wire(*wire).expect("decodes")
    }

    #[tokio::test]
    async fn sends_in_order_gives_up_oversized_events_and_sends_the_rest() {
        let mailbox = Mailbox::new(RetryPolicy::default());
        let hooks = Counted::default();
        let attachment = mailbox.attach();
        mailbox.push(event("r1", "small-1", 10));
        mailbox.push(event("r2", "huge", LIMIT * 2));
        mailbox.push(event("r3", "small-2", 10));
        let (tx, mut rx) = mpsc::channel::<Box<WireEvent>>(8);
        let stop = CancellationToken::new();
        let options = SendOptions { heartbeat: None, max_bytes: LIMIT };
        let run = send_loop(&mailbox, attachment, &tx, &stop, options, &hooks);
        let check = async {
            assert_eq!(recv(&mut rx).await.event_id, "small-1");
            assert_eq!(recv(&mut rx).await.event_id, "small-2");
            // The rejected one is reported once the loop looks again (woken by the reject).
            tokio::time::timeout(WAIT, async {
                while crate::lock(&hooks.discarded).is_empty() {
                    mailbox.changed().await;
                }
            })
            .await
            .ok();
            stop.cancel();
        };
        tokio::join!(run, check);
        assert_eq!(hooks.sent.load(Ordering::Relaxed), 2);
        assert_eq!(*crate::lock(&hooks.discarded), ["huge"]);
        assert_eq!(mailbox.backlog().0, 2, "the two sent await their ACKs");
    }

    #[tokio::test]
    async fn heartbeats_are_pushed_and_sent_like_events() {
        let mailbox = Mailbox::new(RetryPolicy::default());
        let hooks = Counted::default();
        let attachment = mailbox.attach();
        let (tx, mut rx) = mpsc::channel::<Box<WireEvent>>(8);
        let stop = CancellationToken::new();
        let options = SendOptions { heartbeat: Some(Duration::from_millis(20)), max_bytes: LIMIT };
        let run = send_loop(&mailbox, attachment, &tx, &stop, options, &hooks);
        let check = async {
            let ev = recv(&mut rx).await;
            assert_eq!(ev.target, Target::Heartbeat);
            stop.cancel();
        };
        tokio::join!(run, check);
    }

    #[tokio::test]
    async fn a_replaced_stream_stops_and_a_closed_transport_ends_the_loop() {
        let mailbox = Mailbox::new(RetryPolicy::default());
        let hooks = Counted::default();
        let old = mailbox.attach();
        let _new = mailbox.attach();
        mailbox.push(event("r1", "e1", 10));
        let (tx, mut rx) = mpsc::channel::<Box<WireEvent>>(8);
        let options = SendOptions { heartbeat: None, max_bytes: LIMIT };
        tokio::time::timeout(WAIT, send_loop(&mailbox, old, &tx, &CancellationToken::new(), options, &hooks))
            .await
            .expect("a replaced stream's loop returns at once");
        assert!(rx.try_recv().is_err(), "the replaced stream sent nothing");

        let current = mailbox.attach();
        drop(rx);
        tokio::time::timeout(WAIT, send_loop(&mailbox, current, &tx, &CancellationToken::new(), options, &hooks))
            .await
            .expect("a closed transport ends the loop");
        assert_eq!(hooks.failed.load(Ordering::Relaxed), 1);
        assert_eq!(mailbox.backlog().0, 1, "the event is still owed");
    }

    /// The reporter and the mailbox, owned, as the principal's streams hold them.
    struct Owned(std::sync::Arc<(Mailbox, Counted)>);

    impl SendHooks for Owned {
        fn peer(&self) -> &str {
            self.0.1.peer()
        }
        fn sent(&self, event: &Event) {
            self.0.1.sent(event);
        }
        fn send_failed(&self) {
            self.0.1.send_failed();
        }
        fn discarded(&self, parked: &Parked<Event>) {
            self.0.1.discarded(parked);
        }
    }

    impl Outlet for Owned {
        fn mailbox(&self) -> &Mailbox {
            &self.0.0
        }
    }

    async fn pull(stream: &mut (impl Stream<Item = WireEvent> + Unpin)) -> Option<Event> {
        use futures::StreamExt;
        let wire = tokio::time::timeout(WAIT, stream.next()).await.expect("an answer in time")?;
        Some(Event::from_wire(wire).expect("decodes"))
    }

    #[tokio::test]
    async fn a_pulled_stream_takes_events_as_the_transport_asks_and_ends_when_stopped() {
        let shared = std::sync::Arc::new((Mailbox::new(RetryPolicy::default()), Counted::default()));
        let (mailbox, hooks) = (&shared.0, &shared.1);
        let attachment = mailbox.attach();
        mailbox.push(event("r1", "e1", 10));
        mailbox.push(event("r2", "huge", LIMIT * 2));
        let stop = CancellationToken::new();
        let options = SendOptions { heartbeat: None, max_bytes: LIMIT };
        let mut stream = Box::pin(events(Owned(shared.clone()), attachment, stop.clone(), options));
        assert_eq!(pull(&mut stream).await.map(|e| e.event_id), Some("e1".to_owned()));
        // Nothing more is due: the stream waits for the mailbox, and wakes on a push.
        mailbox.push(event("r3", "e3", 10));
        assert_eq!(pull(&mut stream).await.map(|e| e.event_id), Some("e3".to_owned()));
        assert_eq!(hooks.sent.load(Ordering::Relaxed), 2);
        assert_eq!(*crate::lock(&hooks.discarded), ["huge"], "the oversized one was given up");
        stop.cancel();
        assert!(pull(&mut stream).await.is_none(), "a stopped stream ends");
        assert_eq!(hooks.failed.load(Ordering::Relaxed), 0, "an end is not a failure");
        assert_eq!(mailbox.backlog().0, 2, "what was sent awaits its ACK");
    }

    #[tokio::test]
    async fn a_pulled_stream_dropped_with_events_in_hand_reports_it_and_they_go_on_the_next_stream() {
        let shared = std::sync::Arc::new((Mailbox::new(RetryPolicy::default()), Counted::default()));
        let mailbox = &shared.0;
        let first = mailbox.attach();
        for i in 0..3 {
            mailbox.push(event(&format!("r{i}"), &format!("e{i}"), 10));
        }
        let options = SendOptions { heartbeat: None, max_bytes: LIMIT };
        let mut stream = Box::pin(events(Owned(shared.clone()), first, CancellationToken::new(), options));
        assert_eq!(pull(&mut stream).await.map(|e| e.event_id), Some("e0".to_owned()));
        drop(stream); // the transport went away with two events taken and not handed over
        assert_eq!(shared.1.failed.load(Ordering::Relaxed), 1);
        let second = mailbox.attach();
        let mut stream = Box::pin(events(Owned(shared.clone()), second, CancellationToken::new(), options));
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(pull(&mut stream).await.expect("due again").event_id);
        }
        ids.sort();
        assert_eq!(ids, ["e0", "e1", "e2"], "all three are due again on the new stream");
        // The first stream, replaced, would take nothing more.
        let mut replaced = Box::pin(events(Owned(shared.clone()), first, CancellationToken::new(), options));
        assert!(pull(&mut replaced).await.is_none());
    }
}
