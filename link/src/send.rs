//! The send loop: drains a [`Mailbox`] onto one stream.
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

/// Drains `mailbox` onto `tx` while `attachment` is current, until `stop` fires or the transport
/// closes. `T` is what the transport's channel carries (`WireEvent`, or a `Box` of one to keep
/// an idle stream's channel small).
pub async fn send_loop<T: From<WireEvent>>(
    mailbox: &Mailbox,
    attachment: Attachment,
    tx: &mpsc::Sender<T>,
    stop: &CancellationToken,
    options: SendOptions,
    hooks: &dyn SendHooks,
) {
    let mut ticker =
        options.heartbeat.map(|every| tokio::time::interval_at(tokio::time::Instant::now() + every, every));
    loop {
        if stop.is_cancelled() {
            return;
        }
        // `None`: a newer stream replaced this one and must not lose events to it.
        let Some(ready) = mailbox.take_ready(attachment, hooks.peer()) else {
            return;
        };
        for parked in &ready.parked {
            hooks.discarded(parked);
        }
        for mut ev in ready.events {
            ev.stamp_sent_at(chrono::Utc::now());
            let wire = ev.to_wire();
            let len = prost::Message::encoded_len(&wire);
            if len > options.max_bytes {
                tracing::warn!(peer = %hooks.peer(), event_type = %ev.event_type, target = %ev.target,
                    resource_id = %ev.resource_id, event_id = %ev.event_id, bytes = len, limit = options.max_bytes,
                    "event too large to send; given up (the next resync repairs)");
                mailbox
                    .reject(&ev, format!("encodes to {len} bytes, above the {}-byte message limit", options.max_bytes));
                continue;
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                sent = tx.send(T::from(wire)) => match sent {
                    Ok(()) => hooks.sent(&ev),
                    Err(_) => {
                        hooks.send_failed();
                        return;
                    }
                },
            }
        }
        let retransmit = async {
            match ready.next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let heartbeat = async {
            match ticker.as_mut() {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tx.closed() => return,
            () = mailbox.changed() => {}
            () = retransmit => {}
            () = heartbeat => {
                mailbox.push(Event::heartbeat());
            }
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
}
