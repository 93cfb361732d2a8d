//! The receive side: the next message of a stream, what it is, and which answer it gets.
//!
//! The ACK policy, the same on both sides (docs/reliability.md, "Delivery guarantees"):
//! * an **ACK** settles the event it names in the [`Mailbox`]; it is never answered (so two peers
//!   can never ping-pong ACKs), not even when it does not decode;
//! * an **event** is applied, then answered with an ACK when it was applied or when it failed
//!   for good (so it is not resent forever); a failure that may pass (the API server is
//!   unavailable, a conflict) is not answered, and the peer resends it;
//! * an **undecodable event** with a usable `resourceid` is answered with an ACK (the sender
//!   would otherwise retry it until it gives up); one without a `resourceid` cannot be answered
//!   (no sender can be tracking it) and is only logged.

use std::fmt::Display;
use std::time::Duration;

use protocol::event::AckRef;
use protocol::pb::cloudevents::CloudEvent;
use protocol::pb::cloudevents::cloud_event::cloud_event_attribute_value::Attr;
use protocol::pb::eventstreamapi::Event as WireEvent;
use protocol::{Event, EventType, Target};
use tokio_util::sync::CancellationToken;

use crate::mailbox::Mailbox;

/// Why applying an event failed, as far as the ACK policy cares.
pub trait Retryable: Display {
    /// Whether the failure may pass: the event is then not ACKed, and the peer resends it.
    fn is_retryable(&self) -> bool;
}

/// Applying that cannot fail (a simulated peer).
impl Retryable for std::convert::Infallible {
    fn is_retryable(&self) -> bool {
        match *self {}
    }
}

/// What a stream offers next.
#[derive(Debug)]
pub enum Next {
    /// A message.
    Message(WireEvent),
    /// The peer ended the stream cleanly.
    Ended,
    /// The stream failed with this status (the peer's, or the transport's).
    Failed(tonic::Status),
    /// Nothing arrived for the silence limit: the stream is taken as dead.
    Silent(Duration),
    /// `stop` fired.
    Stopped,
}

/// Waits for the next message of `inbound`, until `stop` fires (checked first) or nothing has
/// arrived for `silence`.
pub async fn next(
    inbound: &mut tonic::Streaming<WireEvent>,
    stop: &CancellationToken,
    silence: Option<Duration>,
) -> Next {
    // Boxed, and only when there is a limit: inline, the timer sized every waiting receiver
    // (one per idle agent on the principal, which sets none).
    let silent = async {
        match silence {
            Some(limit) => Box::pin(tokio::time::sleep(limit)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        () = stop.cancelled() => Next::Stopped,
        msg = inbound.message() => match msg {
            Ok(Some(msg)) => Next::Message(msg),
            Ok(None) => Next::Ended,
            Err(status) => Next::Failed(status),
        },
        () = silent => Next::Silent(silence.unwrap_or_default()),
    }
}

/// A received message, once the ACK policy has dealt with what it could.
#[derive(Debug)]
pub enum Inbound {
    /// An ACK, already settled in the mailbox.
    Ack {
        /// The resource it named.
        resource_id: String,
        /// The event it named.
        event_id: String,
    },
    /// An event to apply; answer it with [`settle`] afterwards.
    Event(Box<Event>),
    /// A message that did not decode: logged, and answered when it could be.
    Undecodable,
}

/// Reads one message from `peer`: settles an ACK in `mailbox`, answers an undecodable event when
/// it can, and hands over an event to apply.
pub fn receive(mailbox: &Mailbox, peer: &str, msg: WireEvent) -> Inbound {
    let ack_ref = msg.event.as_ref().and_then(AckRef::of);
    let claims_ack = msg.event.as_ref().is_some_and(claims_to_be_ack);
    let ev = match Event::from_wire(msg) {
        Ok(ev) => ev,
        Err(error) => {
            match ack_ref {
                Some(r) if claims_ack => tracing::warn!(%peer, %error, resource_id = %r.resource_id,
                    event_id = %r.event_id, "undecodable ACK; ignored (an ACK is never answered)"),
                Some(r) => {
                    tracing::warn!(%peer, %error, resource_id = %r.resource_id, event_id = %r.event_id,
                        "undecodable event; acknowledged so it is not resent");
                    mailbox.push(ack_for(r));
                }
                None => tracing::warn!(%peer, %error,
                    "undecodable event without a resourceid; cannot answer it, ignored"),
            }
            return Inbound::Undecodable;
        }
    };
    if ev.is_ack() {
        let outcome = mailbox.ack(&ev.resource_id, &ev.event_id);
        tracing::trace!(%peer, resource_id = %ev.resource_id, event_id = %ev.event_id, ?outcome, "ACK");
        return Inbound::Ack { resource_id: ev.resource_id, event_id: ev.event_id };
    }
    Inbound::Event(Box::new(ev))
}

/// Answers event `ev` after applying it, by the policy above; returns whether it was ACKed.
pub fn settle<E: Retryable>(mailbox: &Mailbox, ev: &Event, result: &Result<(), E>) -> bool {
    match result {
        Ok(()) => {}
        Err(e) if e.is_retryable() => {
            tracing::warn!(error = %e, "cannot apply event now; the peer will resend it");
            return false;
        }
        Err(e) => tracing::warn!(error = %e, "cannot apply event; acknowledged so it is not resent"),
    }
    mailbox.push(ev.processed_ack());
    true
}

fn ack_for(r: AckRef) -> Event {
    Event::new(EventType::Processed, Target::EventProcessed, r.resource_id, r.event_id)
}

/// Whether a raw CloudEvent claims to be an ACK (by type or by `dataschema`).
fn claims_to_be_ack(ce: &CloudEvent) -> bool {
    let schema = ce.attributes.get("dataschema").and_then(|v| match &v.attr {
        Some(Attr::CeString(s) | Attr::CeUri(s) | Attr::CeUriRef(s)) => Some(s.as_str()),
        _ => None,
    });
    ce.r#type == EventType::Processed.as_str() || schema == Some(Target::EventProcessed.as_str())
}

#[cfg(test)]
mod tests {
    use protocol::outbox::RetryPolicy;

    use super::*;

    #[derive(Debug)]
    struct Failure(bool);

    impl Display for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(if self.0 { "unavailable" } else { "invalid" })
        }
    }

    impl Retryable for Failure {
        fn is_retryable(&self) -> bool {
            self.0
        }
    }

    /// What the mailbox would send next (attaching a fresh stream takes everything due).
    fn outgoing(mailbox: &Mailbox) -> Vec<Event> {
        let a = mailbox.attach();
        mailbox.take_ready(a, "peer").expect("attached").events
    }

    fn spec_update(resource: &str, id: &str) -> Event {
        Event::new(EventType::SpecUpdate, Target::Application, resource.to_owned(), id.to_owned())
    }

    /// A wire message whose `data` is not the JSON its content type claims, so it does not decode.
    fn undecodable(ev: &Event) -> WireEvent {
        let mut wire = ev.to_wire();
        let ce = wire.event.as_mut().expect("cloud event");
        ce.data = Some(protocol::pb::cloudevents::cloud_event::Data::BinaryData(b"{not json".to_vec().into()));
        ce.attributes.insert(
            "datacontenttype".into(),
            protocol::pb::cloudevents::cloud_event::CloudEventAttributeValue {
                attr: Some(Attr::CeString("application/json".into())),
            },
        );
        wire
    }

    #[test]
    fn an_ack_settles_its_event_and_is_never_answered() {
        let mailbox = Mailbox::new(RetryPolicy::default());
        let a = mailbox.attach();
        mailbox.push(spec_update("r1", "e1"));
        mailbox.take_ready(a, "peer").expect("attached");
        let ack = spec_update("r1", "e1").processed_ack();
        match receive(&mailbox, "peer", ack.to_wire()) {
            Inbound::Ack { resource_id, event_id } => {
                assert_eq!((resource_id.as_str(), event_id.as_str()), ("r1", "e1"))
            }
            other => panic!("expected an ACK, got {other:?}"),
        }
        assert_eq!(mailbox.backlog().0, 0, "settled, and nothing queued in answer");
    }

    #[test]
    fn an_undecodable_event_is_answered_but_an_undecodable_ack_is_not() {
        let mailbox = Mailbox::new(RetryPolicy::default());
        assert!(matches!(receive(&mailbox, "peer", undecodable(&spec_update("r1", "e1"))), Inbound::Undecodable));
        let answers = outgoing(&mailbox);
        assert_eq!(answers.len(), 1);
        assert!(answers[0].is_ack() && answers[0].resource_id == "r1" && answers[0].event_id == "e1");

        let mailbox = Mailbox::new(RetryPolicy::default());
        let ack = spec_update("r1", "e1").processed_ack();
        assert!(matches!(receive(&mailbox, "peer", undecodable(&ack)), Inbound::Undecodable));
        assert!(outgoing(&mailbox).is_empty(), "an ACK is never answered, decodable or not");

        let mailbox = Mailbox::new(RetryPolicy::default());
        assert!(matches!(receive(&mailbox, "peer", WireEvent { event: None }), Inbound::Undecodable));
        assert!(outgoing(&mailbox).is_empty(), "no resourceid: nothing to answer");
    }

    #[test]
    fn applied_and_permanently_failed_events_are_acked_retryable_ones_are_not() {
        let ev = spec_update("r1", "e1");
        for (result, acked) in [(Ok(()), true), (Err(Failure(false)), true), (Err(Failure(true)), false)] {
            let mailbox = Mailbox::new(RetryPolicy::default());
            let Inbound::Event(received) = receive(&mailbox, "peer", ev.to_wire()) else {
                panic!("a decodable event");
            };
            assert_eq!(settle(&mailbox, &received, &result), acked);
            let answers = outgoing(&mailbox);
            assert_eq!(answers.len(), usize::from(acked), "{result:?}");
            assert!(answers.iter().all(|a| a.is_ack() && a.event_id == "e1"));
        }
    }
}
