use std::time::{Duration, Instant};

use super::*;
use crate::event::{Event, EventType, Target};

fn ev(t: EventType, res: &str, id: &str) -> Event {
    Event::new(t, Target::Application, res, id)
}

fn policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy { jitter: 0.0, max_attempts, ..RetryPolicy::default() }
}

fn outbox() -> Outbox<Event> {
    Outbox::with_jitter(policy(20), Box::new(NoJitter))
}

fn ids(items: &[Event]) -> Vec<&str> {
    items.iter().map(|e| e.event_id.as_str()).collect()
}

fn drain(ob: &mut Outbox<Event>, now: Instant) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(e) = ob.next_ready(now) {
        ob.ack(&e.resource_id.clone(), &e.event_id.clone());
        out.push(e);
    }
    out
}

#[test]
fn one_in_flight_per_resource_and_acks_release_the_next() {
    let t0 = Instant::now();
    let mut ob = outbox();
    ob.push(ev(EventType::Create, "a", "a1"), t0);
    ob.push(ev(EventType::SpecUpdate, "a", "a2"), t0);
    ob.push(ev(EventType::Create, "b", "b1"), t0);
    assert_eq!(ob.next_ready(t0).unwrap().event_id, "a1");
    assert_eq!(ob.next_ready(t0).unwrap().event_id, "b1");
    assert!(ob.next_ready(t0).is_none(), "a2 must wait for a1's ACK");
    assert_eq!(ob.inflight(), 2);
    assert_eq!(ob.queued(), 1);
    assert_eq!(ob.ack("a", "a2"), AckOutcome::Stale);
    assert_eq!(ob.ack("a", "a0"), AckOutcome::Stale);
    assert_eq!(ob.ack("zzz", "a1"), AckOutcome::UnknownResource);
    assert!(ob.next_ready(t0).is_none());
    assert_eq!(ob.ack("a", "a1"), AckOutcome::Matched);
    assert_eq!(ob.next_ready(t0).unwrap().event_id, "a2");
    assert_eq!(ob.ack("a", "a2"), AckOutcome::Matched);
    assert_eq!(ob.ack("b", "b1"), AckOutcome::Matched);
    assert!(ob.is_empty());
    assert_eq!(ob.resources(), 0);
}

#[test]
fn pending_spec_and_status_updates_coalesce_to_the_newest() {
    let t0 = Instant::now();
    let mut ob = outbox();
    ob.push(ev(EventType::SpecUpdate, "a", "s1"), t0);
    ob.push(ev(EventType::StatusUpdate, "a", "st1"), t0);
    ob.push(ev(EventType::SpecUpdate, "a", "s2"), t0 + Duration::from_secs(1));
    ob.push(ev(EventType::StatusUpdate, "a", "st2"), t0 + Duration::from_secs(2));
    assert_eq!(ob.len(), 2);
    // The coalesced entry keeps the age of the oldest change it stands for.
    assert_eq!(ob.oldest_pending_age(t0 + Duration::from_secs(10)), Some(Duration::from_secs(10)));
    let sent = drain(&mut ob, t0);
    assert_eq!(ids(&sent), ["s2", "st2"]);
}

#[test]
fn delete_supersedes_pending_and_a_later_create_follows_it() {
    let t0 = Instant::now();
    let mut ob = outbox();
    ob.push(ev(EventType::Create, "a", "c1"), t0);
    ob.push(ev(EventType::SpecUpdate, "a", "s1"), t0);
    ob.push(ev(EventType::Delete, "a", "d1"), t0);
    ob.push(ev(EventType::Create, "a", "c2"), t0);
    ob.push(ev(EventType::SpecUpdate, "a", "s2"), t0);
    ob.push(ev(EventType::Create, "a", "c3"), t0);
    assert_eq!(ob.pending_for("a").map(|e| e.event_id.as_str()).collect::<Vec<_>>(), ["d1", "s2", "c3"]);
    let sent = drain(&mut ob, t0);
    assert_eq!(ids(&sent), ["d1", "s2", "c3"]);
}

#[test]
fn unacked_events_are_retried_with_backoff() {
    let t0 = Instant::now();
    let mut ob = outbox();
    ob.push(ev(EventType::Create, "a", "c1"), t0);
    assert!(ob.next_ready(t0).is_some());
    assert_eq!(ob.next_deadline(), Some(t0 + Duration::from_secs(5)));
    assert!(ob.next_ready(t0 + Duration::from_millis(4999)).is_none());
    let t1 = t0 + Duration::from_secs(5);
    assert_eq!(ob.next_ready(t1).unwrap().event_id, "c1");
    let view = ob.in_flight("a").unwrap();
    assert_eq!(view.attempts, 2);
    assert_eq!(view.deadline, t1 + Duration::from_secs(20));
    let t2 = t1 + Duration::from_secs(20);
    assert_eq!(ob.next_ready(t2).unwrap().event_id, "c1");
    assert_eq!(ob.next_deadline(), Some(t2 + Duration::from_secs(80)));
}

#[test]
fn jitter_is_applied_from_the_injected_source() {
    #[derive(Debug)]
    struct Half;
    impl JitterSource for Half {
        fn next_unit(&mut self) -> f64 {
            0.5
        }
    }
    let t0 = Instant::now();
    let mut ob = Outbox::with_jitter(RetryPolicy { jitter: 1.0, ..RetryPolicy::default() }, Box::new(Half));
    ob.push(ev(EventType::Create, "a", "c1"), t0);
    ob.next_ready(t0);
    assert_eq!(ob.next_deadline(), Some(t0 + Duration::from_millis(7500)));
}

#[test]
fn superseded_in_flight_event_is_not_resent() {
    let t0 = Instant::now();
    let mut ob = outbox();
    ob.push(ev(EventType::SpecUpdate, "a", "s1"), t0);
    assert_eq!(ob.next_ready(t0).unwrap().event_id, "s1");
    ob.push(ev(EventType::SpecUpdate, "a", "s2"), t0);
    assert!(ob.next_ready(t0).is_none(), "still one in flight");
    let t1 = t0 + Duration::from_secs(5);
    assert_eq!(ob.next_ready(t1).unwrap().event_id, "s2");
    assert_eq!(ob.ack("a", "s1"), AckOutcome::Stale, "late ACK of s1");
    assert_eq!(ob.in_flight("a").unwrap().item.event_id, "s2");
}

#[test]
fn disconnect_puts_in_flight_events_back_first() {
    let t0 = Instant::now();
    let mut ob = outbox();
    ob.push(ev(EventType::Create, "a", "c1"), t0);
    ob.next_ready(t0);
    ob.push(ev(EventType::SpecUpdate, "a", "s1"), t0);
    assert_eq!(ob.on_disconnect(), 1);
    assert_eq!(ob.inflight(), 0);
    assert_eq!(ob.next_deadline(), None);
    let sent = drain(&mut ob, t0);
    assert_eq!(ids(&sent), ["c1", "s1"]);
}

#[test]
fn ack_after_disconnect_settles_a_transmitted_event() {
    let t0 = Instant::now();
    let mut ob = outbox();
    ob.push(ev(EventType::Create, "a", "c1"), t0);
    ob.next_ready(t0);
    ob.on_disconnect();
    assert_eq!(ob.ack("a", "c1"), AckOutcome::Matched);
    assert!(ob.is_empty());
}

#[test]
fn superseded_in_flight_event_is_dropped_on_disconnect() {
    let t0 = Instant::now();
    let mut ob = outbox();
    ob.push(ev(EventType::SpecUpdate, "a", "s1"), t0);
    ob.next_ready(t0);
    ob.push(ev(EventType::Delete, "a", "d1"), t0);
    assert_eq!(ob.on_disconnect(), 0);
    assert_eq!(ids(&drain(&mut ob, t0)), ["d1"]);
}

#[test]
fn poison_events_are_parked_after_the_attempt_limit() {
    let t0 = Instant::now();
    let mut ob = Outbox::with_jitter(policy(2), Box::new(NoJitter));
    ob.push(ev(EventType::Create, "a", "c1"), t0);
    ob.push(ev(EventType::SpecUpdate, "a", "s1"), t0);
    assert_eq!(ob.next_ready(t0).unwrap().event_id, "c1");
    let t1 = t0 + Duration::from_secs(5);
    assert_eq!(ob.next_ready(t1).unwrap().event_id, "c1");
    let t2 = t1 + Duration::from_secs(20);
    // Second timeout: parked, and the resource's next event goes out.
    assert_eq!(ob.next_ready(t2).unwrap().event_id, "s1");
    let parked = ob.take_parked();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].item.event_id, "c1");
    assert_eq!(parked[0].attempts, 2);
    assert_eq!(parked[0].reason, ParkReason::MaxAttempts);
    assert_eq!(parked[0].parked_at, t2);
    assert_eq!(ob.parked(), 0);
}

#[test]
fn attempts_count_across_disconnects() {
    let t0 = Instant::now();
    let mut ob = Outbox::with_jitter(policy(3), Box::new(NoJitter));
    ob.push(ev(EventType::Create, "a", "kills-the-stream"), t0);
    for _ in 0..3 {
        assert!(ob.next_ready(t0).is_some());
        ob.on_disconnect();
    }
    assert!(ob.next_ready(t0).is_none());
    assert_eq!(ob.take_parked()[0].attempts, 3);
    assert!(ob.is_empty());
}

#[test]
fn reject_and_nack() {
    let t0 = Instant::now();
    let mut ob = outbox();
    ob.push(ev(EventType::Create, "a", "c1"), t0);
    ob.push(ev(EventType::SpecUpdate, "a", "s1"), t0);
    ob.next_ready(t0);
    assert_eq!(ob.reject("a", "nope", "x", t0), AckOutcome::Stale);
    assert_eq!(ob.reject("a", "c1", "admission webhook denied", t0), AckOutcome::Matched);
    assert_eq!(ob.take_parked()[0].reason, ParkReason::Rejected("admission webhook denied".into()));
    assert_eq!(ob.next_ready(t0).unwrap().event_id, "s1");
    let t1 = t0 + Duration::from_secs(3);
    assert_eq!(ob.nack("a", "s1", t1), AckOutcome::Matched);
    assert_eq!(ob.next_deadline(), Some(t1 + Duration::from_secs(5)));
    assert_eq!(ob.nack("b", "s1", t1), AckOutcome::UnknownResource);
}

#[test]
fn acks_and_heartbeats_jump_the_queue_and_coalesce() {
    let t0 = Instant::now();
    let mut ob = outbox();
    let data = ev(EventType::StatusUpdate, "a", "st1");
    ob.push(data.clone(), t0);
    assert_eq!(ob.next_ready(t0).unwrap().event_id, "st1");
    // The peer's event for the same resource id is ACKed while ours is in flight.
    let incoming = ev(EventType::SpecUpdate, "a", "peer-1");
    ob.push(incoming.processed_ack(), t0);
    let newer = ev(EventType::SpecUpdate, "a", "peer-2");
    ob.push(newer.processed_ack(), t0);
    ob.push(Event::heartbeat(), t0);
    ob.push(Event::heartbeat(), t0);
    assert_eq!(ob.len(), 3);
    let ack = ob.next_ready(t0).unwrap();
    assert!(ack.is_ack());
    assert_eq!(ack.event_id, "peer-2");
    assert_eq!(ob.next_ready(t0).unwrap().target, Target::Heartbeat);
    assert!(ob.next_ready(t0).is_none());
    assert_eq!(ob.len(), 1);
}

/// Object events carry `<resourceid>_<resourceVersion>` as their event id: an older version of
/// a resource never follows a newer one, whether the newer one is pending, in flight or already
/// delivered (a watch replaying history after a resync sent the current state).
#[test]
fn an_older_version_never_follows_a_newer_one() {
    let t0 = Instant::now();
    let mut ob = outbox();
    let v = |t: EventType, rv: u64| ev(t, "app_uid1", &format!("app_uid1_{rv}"));
    assert!(ob.push(v(EventType::SpecUpdate, 2649), t0).is_none());
    let sent = drain(&mut ob, t0);
    assert_eq!(ids(&sent), ["app_uid1_2649"]);
    assert!(ob.push(v(EventType::SpecUpdate, 2637), t0).is_some(), "older than what was delivered");
    assert!(ob.push(v(EventType::SpecUpdate, 2649), t0).is_none(), "the same version again (a resync answer) is sent");
    assert!(ob.push(v(EventType::StatusUpdate, 2600), t0).is_none(), "status is its own family");
    assert!(ob.push(v(EventType::Create, 2640), t0).is_some(), "a create is a state of the spec too");
    assert_eq!(ob.stale_dropped(), 2);
    assert_eq!(ids(&drain(&mut ob, t0)), ["app_uid1_2649", "app_uid1_2600"]);

    // A delete is never dropped, even when older; states older than a delete cannot follow it,
    // newer ones can (the object is shared with the agent again).
    assert!(ob.push(v(EventType::Delete, 2000), t0).is_none());
    assert!(ob.push(v(EventType::Delete, 2700), t0).is_none());
    assert!(ob.push(v(EventType::SpecUpdate, 2650), t0).is_some());
    assert!(ob.push(v(EventType::SpecUpdate, 2800), t0).is_none());
    assert_eq!(ids(&drain(&mut ob, t0)), ["app_uid1_2700", "app_uid1_2800"]);

    // Requests and responses (event id = resource id, or not numeric) are not ordered.
    assert!(ob.push(ev(EventType::SpecUpdate, "req-1", "req-1"), t0).is_none());
    assert!(ob.push(ev(EventType::SpecUpdate, "x_uid", "x_uid_abc"), t0).is_none());
    assert!(ob.push(ev(EventType::SpecUpdate, "x_uid", "x_uid_abc"), t0).is_none());
}

#[test]
fn a_withdrawn_request_is_neither_sent_nor_retransmitted() {
    let t0 = Instant::now();
    let mut ob = outbox();
    // Queued, never sent.
    ob.push(Event::request(EventType::HttpGet, Target::Resource, "r1"), t0);
    // Sent, awaiting its ACK.
    ob.push(Event::request(EventType::HttpDelete, Target::Resource, "r2"), t0);
    ob.push(ev(EventType::Create, "a", "a1"), t0);
    assert!(ob.withdraw("r1"));
    let sent = ob.next_ready(t0).expect("r2");
    assert_eq!(sent.event_id, "r2");
    assert_eq!((ob.inflight(), ob.queued()), (1, 1));
    assert!(ob.withdraw("r2"));
    assert!(!ob.withdraw("r2"), "nothing left to withdraw");
    assert_eq!(ob.ack("r2", "r2"), AckOutcome::UnknownResource, "a late ACK is stale");
    assert_eq!(ids(&drain(&mut ob, t0 + Duration::from_secs(3600))), ["a1"], "no retransmission of r2");
    assert_eq!((ob.inflight(), ob.queued(), ob.resources()), (0, 0, 0));
}

#[test]
fn a_drained_outbox_gives_its_collections_memory_back() {
    let t0 = Instant::now();
    let mut ob = outbox();
    for i in 0..200 {
        ob.push(ev(EventType::Create, &format!("r{i}"), &format!("e{i}")), t0);
        ob.push(ev(EventType::Create, &format!("in{i}"), &format!("x{i}")).processed_ack(), t0);
    }
    // Half delivered and acknowledged, half given up on: both paths empty the outbox.
    let mut sent = Vec::new();
    while let Some(e) = ob.next_ready(t0) {
        sent.push(e);
    }
    assert_eq!(sent.len(), 400);
    for (n, e) in sent.iter().filter(|e| e.event_type == EventType::Create).enumerate() {
        if n % 2 == 0 {
            assert_eq!(ob.ack(&e.resource_id, &e.event_id), AckOutcome::Matched);
        } else {
            assert_eq!(ob.reject(&e.resource_id, &e.event_id, "refused", t0), AckOutcome::Matched);
        }
    }
    assert_eq!(ob.take_parked().len(), 100);
    assert!(ob.is_empty());
    assert_eq!(ob.spare_capacity(), 0, "emptied collections keep no room");
    assert!(ob.next_deadline().is_none());
    // Grown again on demand: the next event is delivered as before.
    ob.push(ev(EventType::SpecUpdate, "r0", "e-next"), t0);
    assert_eq!(ob.next_ready(t0).map(|e| e.event_id), Some("e-next".to_owned()));
    assert_eq!(ob.ack("r0", "e-next"), AckOutcome::Matched);
    assert_eq!(ob.spare_capacity(), 0);
}
