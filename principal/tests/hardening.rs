//! Hardening of the principal's side of the event stream (docs/reliability.md): bad and
//! oversized events, two streams of one agent, and streams ending with the session that
//! opened them (expiry, revocation). Raw tonic clients play the agent.

mod common;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use common::{
    CapturedLogs, Harness, ProxyMode, RawStream, WAIT, access_token, authenticate, autonomous_create, header_sessions,
    is_ack_of, open_insecure, open_with_token, raw, read_to_end, read_until, refresh, wait_until,
};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::pb::eventstreamapi::{Event as WireEvent, PushSummary};
use protocol::{Event, EventType, Target};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
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
/// up at once, parked, with a warning naming the resource and its size; the stream carries on,
/// and the same resource's next event (once it fits) is delivered.
#[tokio::test]
async fn an_event_too_large_for_the_agent_is_given_up_without_ending_the_stream() -> anyhow::Result<()> {
    const LIMIT: usize = 64 * 1024;
    let logs = CapturedLogs::start();
    let h = Harness::start(&["agent-out"], |c| c.max_message_bytes = LIMIT).await?;
    let mut s = open_insecure(&h.url, "agent-out", "managed").await?;
    round_trip(&mut s).await?;

    let apps = h.apps("agent-out");
    let huge = apps.create(&PostParams::default(), &hub_app("agent-out", "huge", 2 * LIMIT)?).await?;
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

    // The warning names the resource and its size.
    let huge_id = format!("huge_{}", huge.metadata.uid.as_deref().context("uid")?);
    let lines = logs.lines();
    let warning = lines
        .iter()
        .find(|l| {
            l.contains("WARN") && l.contains("event too large to send") && l.contains(&format!("resource_id={huge_id}"))
        })
        .with_context(|| format!("no warning naming {huge_id}: {lines:#?}"))?;
    let bytes: usize = warning
        .split_whitespace()
        .find_map(|f| f.strip_prefix("bytes="))
        .with_context(|| format!("no size in {warning:?}"))?
        .parse()?;
    assert!(bytes > LIMIT && warning.contains(&format!("limit={LIMIT}")), "{warning}");
    // Parked (given up and counted), not left in flight.
    let metrics = h.principal.metrics_text();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("argocd_principal_event_writer_events_discarded_total{agent_name=\"agent-out\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );

    // The same resource's next event goes ahead once it fits.
    let shrink =
        serde_json::json!({"metadata": {"annotations": {"filler": null}}, "spec": {"source": {"path": "shrunk"}}});
    apps.patch("huge", &PatchParams::default(), &Patch::Merge(&shrink)).await?;
    let seen = read_until(&mut s.inbound, "the huge Application's next event", |ev| ev.resource_id == huge_id).await?;
    let next = seen.last().context("no event")?;
    assert_eq!(next.event_type, EventType::SpecUpdate, "{next:?}");
    round_trip(&mut s).await?;
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

/// Policy "expiry", refreshed, through the real `RefreshToken` RPC behind the auth layer: the
/// agent's refresh (same binding) moves the end of its live stream to the new access token's
/// expiry, so the stream outlives its first token; a refresh token presented from another
/// transport identity is refused; another workload claiming the same agent name (another
/// binding) refreshes its own session but never extends the agent's stream; once the agent
/// stops refreshing, the stream ends with `Unauthenticated` at its last token's expiry.
#[tokio::test]
async fn a_refreshed_session_keeps_its_stream_past_the_first_tokens_expiry() -> anyhow::Result<()> {
    const AGENT: &str = "agent-ref";
    const IMPOSTOR: &str = "agent-ref;instance=other";
    let sessions = header_sessions(Duration::from_secs(3));
    let h = Harness::start_with_auth(&[AGENT], |_| {}, sessions.clone()).await?;
    let expiry = |token: &str| -> anyhow::Result<SystemTime> {
        sessions.issuer().verify(token, auth::TokenKind::Access)?.expires_at.context("no expiry")
    };
    // Waits until wall-clock `at`: the passage of time is what is under test here.
    let wait_for_clock = |at: SystemTime| tokio::time::sleep(at.duration_since(SystemTime::now()).unwrap_or_default());

    let agent = authenticate(&h.url, AGENT, "managed").await?;
    let impostor = authenticate(&h.url, IMPOSTOR, "managed").await?;
    let first_expiry = expiry(&agent.access_token)?;
    let mut s = open_with_token(&h.url, AGENT, &agent.access_token).await??;
    round_trip(&mut s).await?;

    // The agent's refresh token, presented by the other workload: the auth layer refuses it.
    let stolen = refresh(&h.url, IMPOSTOR, &agent.refresh_token).await?.err().context("a stolen refresh must fail")?;
    assert_eq!(stolen.code(), Code::Unauthenticated, "{stolen:?}");

    // The agent refreshes 1.5 s before its first token expires (token expiries are whole
    // seconds, so not at once: the new expiry must be later than the first).
    wait_for_clock(first_expiry - Duration::from_millis(1500)).await;
    let refreshed = refresh(&h.url, AGENT, &agent.refresh_token).await??;
    let refreshed_at = SystemTime::now();
    let second_expiry = expiry(&refreshed.access_token)?;
    assert!(second_expiry > first_expiry, "{second_expiry:?} must be later than {first_expiry:?}");

    // Past the first token's expiry, the stream still carries events.
    wait_for_clock(first_expiry + Duration::from_millis(200)).await;
    round_trip(&mut s).await.context("the refreshed stream must outlive its first token")?;
    assert!(h.principal.is_connected(AGENT));

    // From now on only the other workload refreshes, every 300 ms, each time successfully: had
    // its refreshes extended the agent's stream, the stream would not end before the deadline.
    let impostor_refreshes = CancellationToken::new();
    let refresher = tokio::spawn({
        let (url, token, stop) = (h.url.clone(), impostor.refresh_token.clone(), impostor_refreshes.clone());
        async move {
            let mut refreshed = 0u32;
            while !stop.is_cancelled() {
                refresh(&url, IMPOSTOR, &token).await??;
                refreshed += 1;
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_millis(300)) => {}
                }
            }
            anyhow::Ok(refreshed)
        }
    });
    let ended = read_to_end(&mut s.inbound)
        .await
        .context("the stream must end with the agent's session: another workload's refreshes must not extend it");
    impostor_refreshes.cancel();
    let (_, status) = ended?;
    let ended = SystemTime::now();
    let impostor_refreshed = refresher.await??;
    let status = status.context("the stream must end with a status")?;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("expired"), "{status:?}");
    // Timers are never early; allow for the wall clock and the monotonic clock drifting apart.
    assert!(ended + Duration::from_millis(100) >= second_expiry, "ended {ended:?} before {second_expiry:?}");
    // The principal extends to the refresh time + the access lifetime (sub-second), the token
    // says whole seconds: the stream ends no later than 3 s after the agent's refresh.
    let agents_end = refreshed_at + Duration::from_secs(3);
    assert!(
        ended < agents_end + Duration::from_secs(2),
        "the stream lived until {ended:?}, past the agent's session ({agents_end:?}): \
         the other workload's refreshes ({impostor_refreshed}) extended it"
    );
    assert!(impostor_refreshed >= 1, "the other workload's refreshes must succeed (only the binding differs)");
    h.stop().await
}

/// Policy "Push" (the unused call, as upstream): it honours revocation of its access token,
/// checked between messages. Messages before the revocation are applied and the call stays
/// open; the first message after it ends the call with `Unauthenticated` and is not applied.
#[tokio::test]
async fn push_ends_at_the_first_message_after_its_token_is_revoked() -> anyhow::Result<()> {
    const AGENT: &str = "agent-push";
    let sessions = header_sessions(Duration::from_secs(300));
    let h = Harness::start_with_auth(&[AGENT], |_| {}, sessions.clone()).await?;
    let token = access_token(&sessions, AGENT, auth::AgentMode::Autonomous);
    // Revocation ends the stream the token opened and refuses that token from then on.
    let mut s = open_with_token(&h.url, AGENT, &token).await??;
    round_trip(&mut s).await?;
    let (push, call) = open_push(&h.url, AGENT, &token).await?;

    push.send(autonomous_create("pushed-before", 0)?.to_wire()).await?;
    let apps = h.apps(AGENT);
    wait_until("the pushed event is applied", || async { Ok(apps.get_opt("pushed-before").await?.is_some()) }).await?;
    assert!(!call.is_finished(), "Push must stay open while its token is valid");

    assert!(h.principal.revoke(AGENT));
    let (_, status) = read_to_end(&mut s.inbound).await?;
    assert_eq!(status.map(|s| s.code()), Some(Code::Unauthenticated));
    push.send(autonomous_create("pushed-after", 0)?.to_wire()).await?;
    let refused = tokio::time::timeout(WAIT, call).await.context("Push must end")??.err().context("must fail")?;
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("revoked"), "{refused:?}");
    assert!(apps.get_opt("pushed-after").await?.is_none(), "nothing after the revocation is applied");
    h.stop().await
}

/// Policy "Push": the call ends with `Unauthenticated` ("expired") when its access token
/// expires, not before, even while the agent sends nothing.
#[tokio::test]
async fn push_ends_with_unauthenticated_when_its_access_token_expires() -> anyhow::Result<()> {
    const AGENT: &str = "agent-push-exp";
    let sessions = header_sessions(Duration::from_secs(3));
    let h = Harness::start_with_auth(&[AGENT], |_| {}, sessions.clone()).await?;
    let token = access_token(&sessions, AGENT, auth::AgentMode::Autonomous);
    let expires_at = sessions.issuer().verify(&token, auth::TokenKind::Access)?.expires_at.context("no expiry")?;
    let (push, call) = open_push(&h.url, AGENT, &token).await?;
    push.send(Event::heartbeat().to_wire()).await?;
    let ended = tokio::time::timeout(WAIT, call).await.context("Push must end")??;
    let at = SystemTime::now();
    let status = ended.err().context("Push must end with a status")?;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("expired"), "{status:?}");
    assert!(at + Duration::from_millis(100) >= expires_at, "ended {at:?} before expiry {expires_at:?}");
    drop(push);
    h.stop().await
}

/// Opens `Push` as `agent` with `token`: the sender of its messages, and the call's outcome.
async fn open_push(
    url: &str,
    agent: &str,
    token: &str,
) -> anyhow::Result<(mpsc::Sender<WireEvent>, JoinHandle<Result<PushSummary, tonic::Status>>)> {
    let (tx, rx) = mpsc::channel::<WireEvent>(16);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request.metadata_mut().insert("authorization", token.parse()?);
    request.metadata_mut().insert(common::AGENT_HEADER, agent.parse()?);
    let mut client = EventStreamClient::connect(url.to_owned()).await?;
    let call = tokio::spawn(async move { client.push(request).await.map(tonic::Response::into_inner) });
    Ok((tx, call))
}

/// Policy "bad events", the transient kind: while the hub API is unavailable, an event is not
/// ACKed, so the agent's outbox (its default retry policy) resends it with backoff and gives
/// it up after 20 sends; an event resent once the hub is back is applied and ACKed. The test
/// plays the agent with the agent's outbox, on a simulated clock (its backoff reaches minutes).
#[tokio::test]
async fn an_event_failing_while_the_hub_is_unavailable_is_not_acked_and_resent_at_most_20_times() -> anyhow::Result<()>
{
    const AGENT: &str = "agent-down";
    let h = Harness::start_behind_proxies(&[AGENT], |_| {}).await?;
    let proxies = h.proxies.as_ref().context("proxies")?;
    let mut s = open_insecure(&h.url, AGENT, "autonomous").await?;
    round_trip(&mut s).await?;
    let policy = protocol::outbox::RetryPolicy::default();
    assert_eq!(policy.max_attempts, 20, "the documented limit");
    let mut outbox = protocol::outbox::Outbox::<Event>::new(policy);
    let mut now = std::time::Instant::now();

    // Sends what the outbox has due at `now`; returns the events sent and whether each was ACKed.
    async fn send_due(
        s: &mut RawStream,
        outbox: &mut protocol::outbox::Outbox<Event>,
        now: std::time::Instant,
    ) -> anyhow::Result<Vec<(String, bool)>> {
        let mut sent = Vec::new();
        while let Some(ev) = outbox.next_ready(now) {
            s.tx.send(ev.to_wire()).await?;
            sent.push(ev);
        }
        // The principal handles an agent's messages in order: the heartbeat's ACK comes after
        // the answer to everything sent before it, and ACKs leave in the order they were queued.
        let seen = round_trip(s).await?;
        Ok(sent
            .into_iter()
            .map(|ev| {
                let acked = seen.iter().any(|a| is_ack_of(a, &ev.resource_id) && a.event_id == ev.event_id);
                if acked {
                    outbox.ack(&ev.resource_id, &ev.event_id);
                }
                (ev.resource_id, acked)
            })
            .collect())
    }

    // The hub stays unavailable: 20 sends, none ACKed, then the event is parked.
    proxies.requests.set(ProxyMode::Down);
    let given_up = autonomous_create("given-up", 0)?;
    assert!(outbox.push(given_up.clone(), now).is_none());
    let mut sends = 0;
    let mut delays = Vec::new();
    loop {
        let sent = send_due(&mut s, &mut outbox, now).await?;
        assert!(sent.iter().all(|(_, acked)| !acked), "nothing may be ACKed while the hub is down: {sent:?}");
        sends += sent.len();
        let Some(next) = outbox.next_deadline() else { break };
        delays.push(next - now);
        now = next;
        anyhow::ensure!(sends <= 20, "sent {sends} times");
    }
    assert_eq!(sends, 20, "sent {sends} times");
    let parked = outbox.take_parked();
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(parked[0].attempts, 20);
    assert_eq!(parked[0].item.resource_id, given_up.resource_id);
    assert!(delays.windows(2).take(2).all(|w| w[1] > w[0]), "resends back off: {delays:?}");
    assert!(h.principal.is_connected(AGENT), "a failing hub must not end the stream");

    // Not ACKed twice, then the hub is back: the third send is applied and ACKed.
    let recovers = autonomous_create("recovers", 0)?;
    assert!(outbox.push(recovers.clone(), now).is_none());
    for _ in 0..2 {
        let sent = send_due(&mut s, &mut outbox, now).await?;
        assert_eq!(sent, [(recovers.resource_id.clone(), false)]);
        now = outbox.next_deadline().context("a resend is due")?;
    }
    proxies.requests.set(ProxyMode::Open);
    let sent = send_due(&mut s, &mut outbox, now).await?;
    assert_eq!(sent, [(recovers.resource_id.clone(), true)], "resent after the hub is back: applied and ACKed");
    assert!(outbox.is_empty() && outbox.take_parked().is_empty());
    let apps = h.apps(AGENT);
    assert!(apps.get_opt("recovers").await?.is_some());
    assert!(apps.get_opt("given-up").await?.is_none());
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
