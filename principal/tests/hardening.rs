//! Hardening of the principal's side of the event stream (docs/reliability.md): bad and
//! oversized events, two streams of one agent, and streams ending with the session that
//! opened them (expiry, revocation). Raw tonic clients play the agent.

mod common;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use common::{
    Harness, RawStream, WAIT, access_token, autonomous_create, header_sessions, is_ack_of, open_insecure,
    open_with_token, raw, read_to_end, read_until, wait_until,
};
use kube::api::{DynamicObject, PostParams};
use protocol::pb::eventstreamapi::Event as WireEvent;
use protocol::{Event, EventType, Target};
use tonic::Code;

/// A hub Application `name` in agent namespace `ns`, made `filler` bytes larger by an annotation.
fn hub_app(ns: &str, name: &str, filler: usize) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": ns, "annotations": {"filler": "x".repeat(filler)}},
        "spec": {"project": "default"},
    }))?)
}

/// Sends a heartbeat and waits for its ACK: proof the stream is up both ways, and a barrier
/// behind everything the principal queued before it.
async fn round_trip(s: &mut RawStream) -> anyhow::Result<Vec<Event>> {
    let hb = Event::heartbeat();
    s.tx.send(hb.to_wire()).await?;
    read_until(&mut s.inbound, "the heartbeat's ACK", |ev| is_ack_of(ev, &hb.resource_id)).await
}

fn acks_by_resource(seen: &[Event]) -> HashMap<String, usize> {
    let mut acks = HashMap::new();
    for ev in seen.iter().filter(|e| e.event_type == EventType::Processed && e.target == Target::EventProcessed) {
        *acks.entry(ev.resource_id.clone()).or_default() += 1;
    }
    acks
}

/// Policy "bad events": each malformed, unknown or invalid event is ACKed exactly once and
/// logged; what cannot be answered (no CloudEvent, no `resourceid`, an undecodable ACK) is
/// only logged; none ends the stream, and a good event after them is applied.
#[tokio::test]
async fn bad_events_are_acked_once_and_the_stream_keeps_working() -> anyhow::Result<()> {
    let h = Harness::start(&["agent-bad"], |_| {}).await?;
    let mut s = open_insecure(&h.url, "agent-bad", "autonomous").await?;

    let create = EventType::Create.as_str();
    let answered = [
        raw("0.3", create, "application", "bad-version", "{}"),
        raw("1.0", create, "frobnicate", "unknown-schema", "{}"),
        raw("1.0", "io.argoproj.argocd-agent.event.frobnicate", "application", "unknown-type", "{}"),
        raw("1.0", create, "application", "bad-payload", "[1, 2, 3]"),
        raw("1.0", create, "application", "not-json", "{{{"),
        // Well-formed, but a status update is not valid from an autonomous agent.
        raw("1.0", EventType::StatusUpdate.as_str(), "application", "wrong-mode", r#"{"metadata":{"name":"w"}}"#),
    ];
    for ev in answered {
        s.tx.send(ev).await?;
    }
    s.tx.send(WireEvent { event: None }).await?;
    let mut no_resource_id = raw("1.0", create, "application", "no-rid", "{}");
    if let Some(ce) = no_resource_id.event.as_mut() {
        ce.attributes.remove("resourceid");
    }
    s.tx.send(no_resource_id).await?;
    s.tx.send(raw("0.3", EventType::Processed.as_str(), "eventProcessed", "bad-ack", "")).await?;

    let good = autonomous_create("after-bad", 0)?;
    s.tx.send(good.to_wire()).await?;
    let mut seen = read_until(&mut s.inbound, "the good event's ACK", |ev| is_ack_of(ev, &good.resource_id)).await?;
    seen.extend(round_trip(&mut s).await?);
    let apps = h.apps("agent-bad");
    wait_until("the good event's Application is on the hub", || async {
        Ok(apps.get_opt("after-bad").await?.is_some())
    })
    .await?;

    let acks = acks_by_resource(&seen);
    for id in ["bad-version", "unknown-schema", "unknown-type", "bad-payload", "not-json", "wrong-mode"] {
        assert_eq!(acks.get(id), Some(&1), "{id} must be ACKed exactly once: {acks:?}");
    }
    for id in ["bad-ack", "no-rid"] {
        assert_eq!(acks.get(id), None, "{id} cannot be answered: {acks:?}");
    }
    assert!(h.principal.is_connected("agent-bad"), "bad events must not end the stream");
    h.stop().await
}

/// Policy "oversized message from an agent": tonic cannot skip it, so the stream ends with
/// `OutOfRange` naming the limit (the agent sees why), the principal detaches, nothing is
/// applied, and the next stream works.
#[tokio::test]
async fn an_oversized_message_ends_its_stream_with_out_of_range_and_the_next_stream_works() -> anyhow::Result<()> {
    const LIMIT: usize = 64 * 1024;
    let h = Harness::start(&["agent-big"], |c| c.max_message_bytes = LIMIT).await?;
    let mut s = open_insecure(&h.url, "agent-big", "autonomous").await?;
    round_trip(&mut s).await?;

    let too_big = autonomous_create("too-big", 2 * LIMIT)?;
    s.tx.send(too_big.to_wire()).await?;
    let (_, status) = read_to_end(&mut s.inbound).await?;
    let status = status.context("the stream must end with a status, not cleanly")?;
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("too large") && status.message().contains(&LIMIT.to_string()), "{status:?}");
    wait_until("the principal detached the stream", || async { Ok(!h.principal.is_connected("agent-big")) }).await?;

    let mut s = open_insecure(&h.url, "agent-big", "autonomous").await?;
    let fits = autonomous_create("fits", LIMIT / 2)?;
    s.tx.send(fits.to_wire()).await?;
    read_until(&mut s.inbound, "the ACK of an event below the limit", |ev| is_ack_of(ev, &fits.resource_id)).await?;
    let apps = h.apps("agent-big");
    assert!(apps.get_opt("fits").await?.is_some());
    assert!(apps.get_opt("too-big").await?.is_none(), "the oversized event must not be applied");
    h.stop().await
}

/// Policy "oversized event for an agent": the principal never sends it (sending would end
/// the stream at encode time, and the event would be resent on every reconnect); it gives it
/// up at once and the stream carries on with the next events.
#[tokio::test]
async fn an_event_too_large_for_the_agent_is_given_up_without_ending_the_stream() -> anyhow::Result<()> {
    const LIMIT: usize = 64 * 1024;
    let h = Harness::start(&["agent-out"], |c| c.max_message_bytes = LIMIT).await?;
    let mut s = open_insecure(&h.url, "agent-out", "managed").await?;
    round_trip(&mut s).await?;

    let apps = h.apps("agent-out");
    apps.create(&PostParams::default(), &hub_app("agent-out", "huge", 2 * LIMIT)?).await?;
    apps.create(&PostParams::default(), &hub_app("agent-out", "small", 0)?).await?;
    let mut seen =
        read_until(&mut s.inbound, "the small Application", |ev| ev.resource_id.starts_with("small_")).await?;
    seen.extend(round_trip(&mut s).await?);
    assert!(
        !seen.iter().any(|ev| ev.resource_id.starts_with("huge_")),
        "the oversized event must never be sent: {:?}",
        seen.iter().map(|e| &e.resource_id).collect::<Vec<_>>()
    );
    assert!(h.principal.is_connected("agent-out"));
    h.stop().await
}

/// Policy "one stream per agent, the newest wins": the older stream ends on the wire with
/// `Aborted`, and the newer one carries the agent's events both ways.
#[tokio::test]
async fn a_second_stream_of_an_agent_closes_the_first_with_aborted() -> anyhow::Result<()> {
    let h = Harness::start(&["agent-dup"], |_| {}).await?;
    let mut first = open_insecure(&h.url, "agent-dup", "managed").await?;
    round_trip(&mut first).await?;
    let mut second = open_insecure(&h.url, "agent-dup", "managed").await?;

    let (_, status) = read_to_end(&mut first.inbound).await?;
    let status = status.context("the replaced stream must end with a status")?;
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains("replaced by a newer stream"), "{status:?}");

    h.apps("agent-dup").create(&PostParams::default(), &hub_app("agent-dup", "for-newest", 0)?).await?;
    read_until(&mut second.inbound, "the hub change on the newest stream", |ev| {
        ev.resource_id.starts_with("for-newest_")
    })
    .await?;
    round_trip(&mut second).await?;
    assert!(h.principal.is_connected("agent-dup"));
    h.stop().await
}

/// Policy "one stream per agent": however many streams of one agent open at once, all but
/// one end with `Aborted` and the survivor carries the agent's events.
#[tokio::test]
async fn concurrent_streams_of_an_agent_leave_exactly_one_live() -> anyhow::Result<()> {
    const STREAMS: usize = 6;
    let h = Harness::start(&["agent-race"], |_| {}).await?;
    let opened =
        futures::future::try_join_all((0..STREAMS).map(|_| open_insecure(&h.url, "agent-race", "managed"))).await?;

    // Each stream's reader forwards its events, and reports its end.
    let (ended_tx, mut ended_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut senders = Vec::new();
    let mut events = Vec::new();
    for (i, RawStream { tx, mut inbound }) in opened.into_iter().enumerate() {
        let (ev_tx, ev_rx) = tokio::sync::mpsc::unbounded_channel();
        let ended_tx = ended_tx.clone();
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(msg)) => {
                        let _ = ev_tx.send(msg);
                    }
                    Ok(None) => break ended_tx.send((i, None)),
                    Err(status) => break ended_tx.send((i, Some(status))),
                }
            }
        });
        senders.push(tx);
        events.push(ev_rx);
    }

    let mut ended = Vec::new();
    for _ in 1..STREAMS {
        let (i, status) = tokio::time::timeout(WAIT, ended_rx.recv())
            .await
            .context("all but one stream must end")?
            .context("reader gone")?;
        let status = status.with_context(|| format!("stream {i} ended without a status"))?;
        assert_eq!(status.code(), Code::Aborted, "stream {i}: {status:?}");
        ended.push(i);
    }
    let survivor = (0..STREAMS).find(|i| !ended.contains(i)).context("no survivor")?;
    assert!(h.principal.is_connected("agent-race"));

    let hb = Event::heartbeat();
    senders[survivor].send(hb.to_wire()).await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let msg = tokio::time::timeout_at(deadline, events[survivor].recv())
            .await
            .context("the survivor must answer")?
            .context("the survivor's stream ended")?;
        if is_ack_of(&Event::from_wire(msg)?, &hb.resource_id) {
            break;
        }
    }
    assert!(ended_rx.try_recv().is_err(), "the survivor must stay up");
    h.stop().await
}

/// Policy "expiry": a stream ends with `Unauthenticated` ("expired") when the access token
/// that opened it expires, not before; the expired token is refused, a fresh one works.
#[tokio::test]
async fn a_stream_ends_with_unauthenticated_when_its_access_token_expires() -> anyhow::Result<()> {
    let sessions = header_sessions(Duration::from_secs(3));
    let h = Harness::start_with_auth(&["agent-exp"], |_| {}, sessions.clone()).await?;
    let token = access_token(&sessions, "agent-exp", auth::AgentMode::Managed);
    let expires_at = sessions.issuer().verify(&token, auth::TokenKind::Access)?.expires_at.context("no expiry")?;

    let mut s = open_with_token(&h.url, "agent-exp", &token).await??;
    round_trip(&mut s).await?;
    let (_, status) = read_to_end(&mut s.inbound).await?;
    let ended = SystemTime::now();
    let status = status.context("the stream must end with a status")?;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("expired"), "{status:?}");
    // Timers are never early; allow for the wall clock and the monotonic clock drifting apart.
    assert!(ended + Duration::from_millis(100) >= expires_at, "ended {ended:?} before expiry {expires_at:?}");
    wait_until("the principal detached the stream", || async { Ok(!h.principal.is_connected("agent-exp")) }).await?;

    let refused = open_with_token(&h.url, "agent-exp", &token).await?.err().context("an expired token must fail")?;
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let fresh = access_token(&sessions, "agent-exp", auth::AgentMode::Managed);
    let mut s = open_with_token(&h.url, "agent-exp", &fresh).await??;
    round_trip(&mut s).await?;
    h.stop().await
}

/// Policy "expiry", refreshed: a refresh of the same session (same binding) moves the end of
/// the live stream to the new access token's expiry, so an agent that keeps its session fresh
/// keeps its stream; a refresh bound to another identity does not; without further refreshes
/// the stream ends at the new expiry.
#[tokio::test]
async fn a_refreshed_session_keeps_its_stream_past_the_first_tokens_expiry() -> anyhow::Result<()> {
    use auth::SessionHook as _;
    let sessions = header_sessions(Duration::from_secs(3));
    let h = Harness::start_with_auth(&["agent-ref"], |_| {}, sessions.clone()).await?;
    let token = access_token(&sessions, "agent-ref", auth::AgentMode::Managed);
    let first_expiry = sessions.issuer().verify(&token, auth::TokenKind::Access)?.expires_at.context("no expiry")?;
    let mut s = open_with_token(&h.url, "agent-ref", &token).await??;
    round_trip(&mut s).await?;

    let name = auth::AgentName::new("agent-ref")?;
    let hook = h.principal.session_hook();
    let impostor = auth::AgentIdentity::new(name.clone(), "header", auth::Binding::header_value(b"someone-else"));
    hook.on_refreshed(&impostor, first_expiry + Duration::from_secs(60))?;
    let agent = auth::AgentIdentity::new(name, "header", auth::Binding::header_value(b"agent-ref"));
    let second_expiry = first_expiry + Duration::from_secs(3);
    hook.on_refreshed(&agent, second_expiry)?;

    // Past the first token's expiry, the stream still carries events.
    let past_first = first_expiry.duration_since(SystemTime::now()).unwrap_or_default() + Duration::from_millis(500);
    tokio::time::sleep(past_first).await; // the passage of time is what is under test
    round_trip(&mut s).await?;
    let (_, status) = read_to_end(&mut s.inbound).await?;
    let ended = SystemTime::now();
    let status = status.context("the stream must end with a status")?;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(ended + Duration::from_millis(100) >= second_expiry, "ended {ended:?} before {second_expiry:?}");
    assert!(
        ended < first_expiry + Duration::from_secs(60),
        "a refresh bound to another identity must not extend the stream"
    );
    h.stop().await
}

/// Policy "revocation": `Principal::revoke` closes the agent's live stream now with
/// `Unauthenticated` ("revoked") and refuses the token that opened it; a new token works.
/// Shutdown ends streams with `Unavailable`.
#[tokio::test]
async fn revoking_a_session_closes_its_stream_and_refuses_its_token() -> anyhow::Result<()> {
    let sessions = header_sessions(Duration::from_secs(300));
    let h = Harness::start_with_auth(&["agent-rev"], |_| {}, sessions.clone()).await?;
    assert!(!h.principal.revoke("agent-rev"), "nothing to revoke before the agent connects");

    let token = access_token(&sessions, "agent-rev", auth::AgentMode::Autonomous);
    let mut s = open_with_token(&h.url, "agent-rev", &token).await??;
    round_trip(&mut s).await?;
    assert!(h.principal.revoke("agent-rev"));
    let (_, status) = read_to_end(&mut s.inbound).await?;
    let status = status.context("the revoked stream must end with a status")?;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("revoked"), "{status:?}");
    wait_until("the principal detached the stream", || async { Ok(!h.principal.is_connected("agent-rev")) }).await?;
    assert!(!h.principal.revoke("agent-rev"), "no live stream left to revoke");

    let refused = open_with_token(&h.url, "agent-rev", &token).await?.err().context("a revoked token must fail")?;
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("revoked"), "{refused:?}");

    let fresh = access_token(&sessions, "agent-rev", auth::AgentMode::Autonomous);
    let mut s = open_with_token(&h.url, "agent-rev", &fresh).await??;
    round_trip(&mut s).await?;

    h.principal.disconnect_all();
    let (_, status) = read_to_end(&mut s.inbound).await?;
    assert_eq!(status.map(|s| s.code()), Some(Code::Unavailable), "shutdown ends streams with Unavailable");
    h.stop().await
}
