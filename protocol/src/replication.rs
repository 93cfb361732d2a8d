//! The events the principals of a cross-hub HA pair replicate (`replicationapi.ReplicatedEvent`,
//! upstream `pkg/replication`): how the active principal wraps an agent's applied event
//! ([`encode`]) and how a replica reads what it receives ([`decode`]).
//!
//! Why here and not in the principal: a replica decodes bytes that came over the network from
//! its peer, so the decoding is a parser of untrusted input and gets a fuzz target
//! (`fuzz/fuzz_targets/replication_decode.rs`, through [`crate::fuzzing::check_replication_decode`]).
//! The fuzz crates depend on `protocol`, not on `principal`, so the pure part lives here and the
//! principal calls it.
//!
//! [`decode`] is total: every message is a change to apply ([`Decoded::Apply`]), one to ignore
//! ([`Decoded::Ignore`], with the reason), or a [`DecodeError`] naming what is wrong. A replica
//! never skips an event that does not decode: it takes a fresh snapshot instead (docs/ha.md).

use crate::event::{AttributeValue, Event, EventError, EventType, Target};
use crate::mode::AgentMode;
use crate::pb::replicationapi::ReplicatedEvent;

/// The CloudEvent extension carrying the agent's mode on a replicated event (upstream
/// replicas ignore it; upstream primaries do not send it).
pub const MODE_EXTENSION: &str = "agentmode";

/// `ReplicatedEvent.direction` of an agent's event applied to the hub (agent → principal).
pub const INBOUND: &str = "inbound";

/// `ReplicatedEvent.direction` of an event the principal sent to an agent. Upstream primaries
/// forward these too; the hub state they come from reaches a replica by snapshots.
pub const OUTBOUND: &str = "outbound";

/// Whether an agent's event changes what the hub holds (what a replica applies): Applications
/// and AppProjects created, updated or deleted.
#[must_use]
pub fn replicable(ev: &Event) -> bool {
    matches!(ev.target, Target::Application | Target::AppProject)
        && matches!(
            ev.event_type,
            EventType::Create | EventType::SpecUpdate | EventType::StatusUpdate | EventType::Delete
        )
}

/// The message the active principal sends its replicas for `agent`'s (in `mode`) applied event
/// `ev`, numbered `sequence_num`, processed at `processed_at_unix` (seconds).
#[must_use]
pub fn encode(agent: &str, mode: AgentMode, ev: &Event, sequence_num: u64, processed_at_unix: i64) -> ReplicatedEvent {
    let mut ev = ev.clone();
    ev.extensions.insert(MODE_EXTENSION.to_owned(), AttributeValue::String(mode.to_string()));
    ReplicatedEvent {
        event: Some(ev.to_proto()),
        agent_name: agent.to_owned(),
        direction: INBOUND.to_owned(),
        sequence_num,
        processed_at_unix,
    }
}

/// An agent's change, as a replica applies it to its own hub.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The agent the event came from (`ReplicatedEvent.agent_name`), as the active sent it.
    pub agent: String,
    /// The agent's mode, when the active said ([`MODE_EXTENSION`]; upstream primaries do not).
    pub mode: Option<AgentMode>,
    /// The agent's event (with the [`MODE_EXTENSION`] extension still in it, if any).
    pub event: Event,
}

/// Why a replicated event that decodes has nothing for a replica to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// An event the principal sent to an agent ([`OUTBOUND`]).
    Outbound,
    /// An event that changes nothing on the hub (not [`replicable`]).
    NotAHubChange,
}

/// What a replica makes of one replicated event ([`decode`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// Apply this change to the hub.
    Apply(Box<Change>),
    /// Nothing to apply, and why.
    Ignore(Ignored),
}

/// Why a replicated event does not decode. The replica does not skip it: it takes a fresh
/// snapshot.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// An inbound event without its CloudEvent.
    #[error("it carries no CloudEvent (field `event` is unset)")]
    MissingEvent,
    /// A `direction` neither [`INBOUND`] nor [`OUTBOUND`].
    #[error("its direction {0:?} is neither \"inbound\" nor \"outbound\"")]
    UnknownDirection(String),
    /// The CloudEvent itself does not decode.
    #[error("its CloudEvent does not decode: {0}")]
    Event(#[from] EventError),
    /// The [`MODE_EXTENSION`] extension is there but names no agent mode.
    #[error("its {MODE_EXTENSION} extension {0:?} is not \"managed\" or \"autonomous\"")]
    BadMode(String),
}

/// Reads one replicated event (module docs). An empty `direction` is read as [`INBOUND`] (the
/// protobuf default, as a replica always did).
///
/// # Errors
/// A [`DecodeError`] naming what is wrong with it.
pub fn decode(rep: ReplicatedEvent) -> Result<Decoded, DecodeError> {
    match rep.direction.as_str() {
        OUTBOUND => return Ok(Decoded::Ignore(Ignored::Outbound)),
        INBOUND | "" => {}
        other => return Err(DecodeError::UnknownDirection(other.to_owned())),
    }
    let ce = rep.event.ok_or(DecodeError::MissingEvent)?;
    let event = Event::from_proto(ce)?;
    let mode = match event.extensions.get(MODE_EXTENSION) {
        None => None,
        Some(value) => {
            let text = value.as_text().ok_or_else(|| DecodeError::BadMode(format!("{value:?}")))?;
            Some(text.parse::<AgentMode>().map_err(|_| DecodeError::BadMode(text.to_owned()))?)
        }
    };
    if !replicable(&event) {
        return Ok(Decoded::Ignore(Ignored::NotAHubChange));
    }
    Ok(Decoded::Apply(Box::new(Change { agent: rep.agent_name, mode, event })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(target: Target, ty: EventType) -> Event {
        Event::new(ty, target, "r".to_owned(), "e".to_owned())
    }

    #[test]
    fn only_hub_changes_are_replicated() {
        assert!(replicable(&ev(Target::Application, EventType::Create)));
        assert!(replicable(&ev(Target::Application, EventType::StatusUpdate)));
        assert!(replicable(&ev(Target::AppProject, EventType::Delete)));
        assert!(!replicable(&ev(Target::EventProcessed, EventType::Processed)));
        assert!(!replicable(&ev(Target::Application, EventType::RequestUpdate)));
    }

    #[test]
    fn what_the_active_encodes_the_replica_decodes() {
        let event = ev(Target::Application, EventType::Create);
        let rep = encode("agent-a", AgentMode::Managed, &event, 7, 1_700_000_000);
        assert_eq!((rep.sequence_num, rep.direction.as_str()), (7, INBOUND));
        let Decoded::Apply(change) = decode(rep).expect("decodes") else { panic!("an Application create applies") };
        assert_eq!((change.agent.as_str(), change.mode), ("agent-a", Some(AgentMode::Managed)));
        let mut expected = event;
        expected.extensions.insert(MODE_EXTENSION.to_owned(), AttributeValue::String("managed".into()));
        assert_eq!(change.event, expected);
    }

    #[test]
    fn what_is_not_applied_says_why_and_what_is_wrong_is_named() {
        let ack = encode("agent-a", AgentMode::Managed, &ev(Target::EventProcessed, EventType::Processed), 1, 0);
        assert!(matches!(decode(ack), Ok(Decoded::Ignore(Ignored::NotAHubChange))));
        let outbound = ReplicatedEvent { direction: OUTBOUND.into(), ..ReplicatedEvent::default() };
        assert!(matches!(decode(outbound), Ok(Decoded::Ignore(Ignored::Outbound))));
        assert!(matches!(decode(ReplicatedEvent::default()), Err(DecodeError::MissingEvent)));
        let sideways = ReplicatedEvent { direction: "sideways".into(), ..ReplicatedEvent::default() };
        assert_eq!(
            decode(sideways).unwrap_err().to_string(),
            "its direction \"sideways\" is neither \"inbound\" nor \"outbound\""
        );
        let mut bad = encode("agent-a", AgentMode::Managed, &ev(Target::Application, EventType::Create), 1, 0);
        if let Some(ce) = bad.event.as_mut() {
            ce.spec_version = "0.3".into();
        }
        assert!(matches!(decode(bad), Err(DecodeError::Event(EventError::BadSpecVersion { .. }))));
        let mut odd = ev(Target::Application, EventType::Create);
        odd.extensions.insert(MODE_EXTENSION.to_owned(), AttributeValue::String("boss".into()));
        let rep = ReplicatedEvent { event: Some(odd.to_proto()), ..ReplicatedEvent::default() };
        assert!(matches!(decode(rep), Err(DecodeError::BadMode(m)) if m == "boss"));
    }

    /// The fuzz target's check over its committed seeds (real messages of [`encode`]), so the
    /// target's logic runs in every `cargo test`.
    #[test]
    fn fuzz_seeds_pass_the_check() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/replication_decode");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            let bytes = std::fs::read(&path).expect("seed");
            crate::fuzzing::check_replication_decode(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
        assert!(seen >= 3, "{} holds {seen} seeds", dir.display());
    }
}
