//! Property tests of the delivery engine: random pushes, transmissions, ACKs (current, stale
//! and late), time passing and disconnects, checked against the delivery rules.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use protocol::event::{Event, EventType, Target};
use protocol::outbox::{AckOutcome, Outbox, RetryPolicy, SeededJitter};

const RESOURCES: usize = 4;
const KINDS: [EventType; 5] =
    [EventType::Create, EventType::SpecUpdate, EventType::StatusUpdate, EventType::Delete, EventType::SetOperation];
/// Per resource: one in flight plus at most one pending event per kind.
const PER_RESOURCE: usize = KINDS.len() + 1;

#[derive(Debug, Clone)]
enum Op {
    Push {
        res: usize,
        kind: usize,
    },
    /// Let `ms` pass, then transmit everything that is ready.
    Send {
        ms: u64,
    },
    /// The peer ACKs the event in flight.
    AckInflight {
        res: usize,
    },
    /// An ACK for some earlier transmitted event arrives (stale, or late after a disconnect).
    AckEarlier {
        res: usize,
        pick: usize,
    },
    Disconnect,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..RESOURCES, 0..KINDS.len()).prop_map(|(res, kind)| Op::Push { res, kind }),
        3 => prop_oneof![Just(0u64), 1..30_000u64].prop_map(|ms| Op::Send { ms }),
        3 => (0..RESOURCES).prop_map(|res| Op::AckInflight { res }),
        1 => (0..RESOURCES, any::<usize>()).prop_map(|(res, pick)| Op::AckEarlier { res, pick }),
        1 => Just(Op::Disconnect),
    ]
}

fn rid(res: usize) -> String {
    format!("r{res}")
}

#[derive(Default)]
struct Model {
    /// Every push per resource: (event id, kind index), in order.
    pushed: HashMap<String, Vec<(String, usize)>>,
    /// Event ids transmitted, per resource, in order (with repeats).
    emitted: HashMap<String, Vec<String>>,
    /// Step at which each event id was first transmitted.
    first_emit: HashMap<String, usize>,
    /// Event ids the outbox settled as delivered, per resource, in order, with the step.
    acked: HashMap<String, Vec<(String, usize)>>,
}

struct Harness {
    ob: Outbox<Event>,
    now: Instant,
    step: usize,
    seq: usize,
    model: Model,
}

impl Harness {
    fn new(seed: u64, max_attempts: u32) -> Self {
        let policy = RetryPolicy { max_attempts, ..RetryPolicy::default() };
        Self {
            ob: Outbox::with_jitter(policy, Box::new(SeededJitter::new(seed))),
            now: Instant::now(),
            step: 0,
            seq: 0,
            model: Model::default(),
        }
    }

    fn ack(&mut self, r: &str, id: &str) -> AckOutcome {
        let outcome = self.ob.ack(r, id);
        if outcome == AckOutcome::Matched {
            self.model.acked.entry(r.to_owned()).or_default().push((id.to_owned(), self.step));
        }
        outcome
    }

    /// Transmits everything ready now, checking the one-in-flight rule for each.
    fn send_all(&mut self) -> Result<(), TestCaseError> {
        loop {
            let before: HashMap<String, (String, Instant)> = (0..RESOURCES)
                .filter_map(|i| {
                    let r = rid(i);
                    let v = self.ob.in_flight(&r)?;
                    Some((r, (v.item.event_id.clone(), v.deadline)))
                })
                .collect();
            let Some(e) = self.ob.next_ready(self.now) else {
                return Ok(());
            };
            if let Some((prev, deadline)) = before.get(&e.resource_id) {
                prop_assert!(*deadline <= self.now, "{} sent while {} was in flight and not yet due", e.event_id, prev);
            }
            let view = self.ob.in_flight(&e.resource_id);
            prop_assert_eq!(view.map(|v| v.item.event_id.clone()), Some(e.event_id.clone()));
            self.model.emitted.entry(e.resource_id.clone()).or_default().push(e.event_id.clone());
            self.model.first_emit.entry(e.event_id.clone()).or_insert(self.step);
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.step += 1;
        match *op {
            Op::Push { res, kind } => {
                let r = rid(res);
                self.seq += 1;
                let id = format!("{r}-{}", self.seq);
                self.ob.push(Event::new(KINDS[kind].clone(), Target::Application, &r, &id), self.now);
                self.model.pushed.entry(r).or_default().push((id, kind));
            }
            Op::Send { ms } => {
                self.now += Duration::from_millis(ms);
                self.send_all()?;
            }
            Op::AckInflight { res } => {
                let r = rid(res);
                if let Some(id) = self.ob.in_flight(&r).map(|v| v.item.event_id.clone()) {
                    prop_assert_eq!(self.ack(&r, &id), AckOutcome::Matched);
                }
            }
            Op::AckEarlier { res, pick } => {
                let r = rid(res);
                let Some(emitted) = self.model.emitted.get(&r).filter(|e| !e.is_empty()) else {
                    return Ok(());
                };
                let id = emitted[pick % emitted.len()].clone();
                let in_flight = self.ob.in_flight(&r).map(|v| v.item.event_id.clone());
                let pending: HashSet<String> = self.ob.pending_for(&r).map(|e| e.event_id.clone()).collect();
                let outcome = self.ack(&r, &id);
                if in_flight.as_deref() != Some(id.as_str()) && !pending.contains(&id) {
                    prop_assert_ne!(outcome, AckOutcome::Matched, "stale ACK {} matched", id);
                }
            }
            Op::Disconnect => {
                self.ob.on_disconnect();
                prop_assert_eq!(self.ob.inflight(), 0);
            }
        }
        // Memory is bounded by distinct resources, not by the number of pushes.
        let distinct = self.model.pushed.len();
        prop_assert!(self.ob.len() + self.ob.parked() <= distinct * PER_RESOURCE);
        prop_assert!(self.ob.resources() <= distinct);
        for i in 0..RESOURCES {
            prop_assert!(self.ob.pending_for(&rid(i)).count() <= KINDS.len());
        }
        Ok(())
    }

    /// A healthy peer from now on: time passes, everything is sent and ACKed.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..1000 {
            if self.ob.is_empty() {
                return Ok(());
            }
            self.step += 1;
            self.now += Duration::from_secs(300);
            while let Some(e) = self.ob.next_ready(self.now) {
                self.model.first_emit.entry(e.event_id.clone()).or_insert(self.step);
                let outcome = self.ack(&e.resource_id, &e.event_id);
                prop_assert_eq!(outcome, AckOutcome::Matched);
            }
        }
        prop_assert!(self.ob.is_empty(), "outbox never drained");
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn delivery_rules_hold(ops in prop::collection::vec(op(), 0..200), seed in any::<u64>()) {
        let mut h = Harness::new(seed, u32::MAX);
        for op in &ops {
            h.apply(op)?;
        }
        h.drain()?;
        prop_assert!(h.ob.take_parked().is_empty());

        for (r, pushes) in &h.model.pushed {
            let acked = h.model.acked.get(r).cloned().unwrap_or_default();
            // The final delivered state equals the newest pushed.
            let newest = &pushes.last().unwrap().0;
            prop_assert_eq!(acked.last().map(|a| &a.0), Some(newest));

            // The last delete is never lost, and nothing pushed after it goes out before it
            // is delivered.
            let delete_kind = 3;
            if let Some(pos) = pushes.iter().rposition(|(_, k)| *k == delete_kind) {
                let delete_id = &pushes[pos].0;
                let delivered = acked.iter().find(|(id, _)| id == delete_id);
                prop_assert!(delivered.is_some(), "delete {} was lost", delete_id);
                let delivered_at = delivered.unwrap().1;
                for (later, _) in &pushes[pos + 1..] {
                    if let Some(step) = h.model.first_emit.get(later) {
                        prop_assert!(
                            *step >= delivered_at,
                            "{} went out before delete {} was delivered", later, delete_id
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn with_a_poison_limit_nothing_vanishes(
        ops in prop::collection::vec(op(), 0..200),
        seed in any::<u64>(),
        limit in 1u32..4,
    ) {
        let mut h = Harness::new(seed, limit);
        for op in &ops {
            h.apply(op)?;
        }
        h.drain()?;
        let parked: HashSet<String> = h.ob.take_parked().into_iter().map(|p| p.item.event_id).collect();
        for (r, pushes) in &h.model.pushed {
            let acked: HashSet<&String> = h.model.acked.get(r).into_iter().flatten().map(|a| &a.0).collect();
            // The newest event of every resource was delivered or reported parked; a parked
            // report is only replaced by a newer one of the same resource.
            let newest = &pushes.last().unwrap().0;
            let parked_here = pushes.iter().any(|(id, _)| parked.contains(id));
            prop_assert!(acked.contains(newest) || parked_here, "{} vanished", newest);
        }
    }
}
