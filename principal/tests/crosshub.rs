//! Cross-hub disaster recovery (`principal::ha`): two principals, each on its own embedded hub
//! API server, one active and one replica; agents played by raw streams; promote and demote
//! through the `HAAdmin` API as `argocd-agentctl ha` calls it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Harness, autonomous_create, is_ack_of, open_insecure, read_to_end, read_until, wait_until};
use principal::ha::{Ha, HaConfig, Role, State, admin};
use principal::{Principal, PrincipalConfig};
use protocol::pb::haadminapi::ha_admin_client::HaAdminClient;
use protocol::pb::haadminapi::{DemoteRequest, PromoteRequest, StatusRequest};
use protocol::{EventType, Target};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// One hub with its principal in a cross-hub pair, and its admin endpoint.
struct Hub {
    h: Harness,
    ha: Arc<Ha>,
    admin: String,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

fn config(role: Role, peer: &str) -> HaConfig {
    HaConfig {
        preferred_role: role,
        peer_address: peer.to_owned(),
        probe_interval: Duration::from_millis(200),
        probe_timeout: Duration::from_secs(2),
        reconnect_backoff: (Duration::from_millis(50), Duration::from_millis(300)),
        ..HaConfig::default()
    }
}

fn addr(h: &Harness) -> String {
    h.url.trim_start_matches("http://").to_owned()
}

impl Hub {
    /// A hub whose principal joins the pair as `role`, following or probing `peer`.
    async fn start(h: Harness, role: Role, peer: &str) -> anyhow::Result<Self> {
        Self::start_with(h, config(role, peer)).await
    }

    async fn start_with(h: Harness, config: HaConfig) -> anyhow::Result<Self> {
        let ha = h.principal.enable_ha(config);
        let cancel = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let admin = format!("http://{}", listener.local_addr()?);
        let service = admin::AdminService::new(ha.clone(), None);
        let tasks = vec![
            tokio::spawn(ha.clone().run(cancel.clone())),
            tokio::spawn({
                let cancel = cancel.clone();
                async move {
                    if let Err(e) = admin::serve(listener, None, service, cancel).await {
                        panic!("admin server: {e}");
                    }
                }
            }),
        ];
        Ok(Self { h, ha, admin, cancel, tasks })
    }

    async fn admin(&self) -> anyhow::Result<HaAdminClient<tonic::transport::Channel>> {
        Ok(HaAdminClient::connect(self.admin.clone()).await?)
    }

    async fn state_is(&self, want: State) -> anyhow::Result<()> {
        let what = format!("{} is {want}", self.h.url);
        wait_until(&what, || async { Ok(self.ha.state() == want) }).await
    }

    async fn has_app(&self, name: &str) -> anyhow::Result<bool> {
        Ok(self.h.apps("agent-a").get_opt(name).await?.is_some())
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.cancel.cancel();
        for task in self.tasks {
            task.await?;
        }
        self.h.stop().await
    }
}

/// Two hubs: `a` preferred primary, `b` preferred replica, each naming the other as its peer.
async fn pair() -> anyhow::Result<(Hub, Hub)> {
    let ha = Harness::start(&["agent-a"], |_| {}).await?;
    let hb = Harness::start(&["agent-a"], |_| {}).await?;
    let (pa, pb) = (addr(&ha), addr(&hb));
    let a = Hub::start(ha, Role::Primary, &pb).await?;
    let b = Hub::start(hb, Role::Replica, &pa).await?;
    a.state_is(State::Active).await?;
    b.state_is(State::Replicating).await?;
    wait_until("a has b in sync", || async { Ok(a.ha.replicas().1 == 1) }).await?;
    Ok((a, b))
}

/// Sends `count` autonomous Applications `<prefix>-<i>` on `stream`; after each ACK, checks at
/// once (no wait) that the ACKed Application is already on `replica`'s hub. Returns the names.
async fn write_and_check(
    stream: &mut common::RawStream,
    prefix: &str,
    count: usize,
    replica: &Hub,
) -> anyhow::Result<Vec<String>> {
    let mut acked = Vec::new();
    for i in 0..count {
        let name = format!("{prefix}-{i}");
        let ev = autonomous_create(&name, 0)?;
        let id = ev.resource_id.clone();
        stream.tx.send(ev.to_wire()).await?;
        read_until(&mut stream.inbound, &format!("the ACK of {name}"), |e| is_ack_of(e, &id)).await?;
        assert!(replica.has_app(&name).await?, "{name} was ACKed before it reached the replica's hub");
        acked.push(name);
    }
    Ok(acked)
}

#[tokio::test]
async fn promote_and_demote_across_hubs_lose_no_acked_event() -> anyhow::Result<()> {
    let (a, b) = pair().await?;
    assert!(a.ha.readiness().is_ok());
    assert_eq!(b.ha.readiness().unwrap_err(), "HA state: replicating - not accepting traffic");

    // A replica refuses agents.
    let refused =
        common::open_with(&b.h.url, &[("x-argocd-agent-name", "agent-a"), ("x-argocd-agent-mode", "autonomous")])
            .await?
            .err()
            .expect("the replica refuses the stream");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");

    // The agent writes to the active hub; every ACKed event is on the replica's hub already.
    let mut stream = open_insecure(&a.h.url, "agent-a", "autonomous").await?;
    let mut acked = write_and_check(&mut stream, "before", 20, &b).await?;
    let status = a.admin().await?.status(StatusRequest {}).await?.into_inner();
    assert_eq!((status.state.as_str(), status.connected_replicas, status.connected_agents), ("active", 1, 1));
    let status = b.admin().await?.status(StatusRequest {}).await?.into_inner();
    assert_eq!(status.state, "replicating");
    assert!(status.peer_reachable);
    assert_eq!(status.last_sequence_num, a.ha.forwarded_sequence(), "the replica applied every sequence number");

    // Promote is refused while the replica still follows an active peer.
    let early = b.admin().await?.promote(PromoteRequest { force: false }).await.unwrap_err();
    assert_eq!(early.code(), tonic::Code::FailedPrecondition);
    assert!(early.message().contains("still replicating"), "{early:?}");

    // Switchover: demote a (its agents are told to go), then promote b.
    let demoted = a.admin().await?.demote(DemoteRequest {}).await?.into_inner();
    assert_eq!(demoted.state, "replicating");
    let (_, end) = read_to_end(&mut stream.inbound).await?;
    let end = end.expect("the demoted principal closes the agent's stream");
    assert_eq!(end.code(), tonic::Code::Unavailable, "{end:?}");
    b.state_is(State::Disconnected).await?;
    let promoted = b.admin().await?.promote(PromoteRequest { force: false }).await?.into_inner();
    assert_eq!(promoted.state, "active");
    assert!(b.ha.epoch() > a.ha.epoch(), "a promotion takes a higher epoch");

    // The old primary follows the new one and refuses agents.
    a.state_is(State::Replicating).await?;
    wait_until("b has a in sync", || async { Ok(b.ha.replicas().1 == 1) }).await?;
    let refused =
        common::open_with(&a.h.url, &[("x-argocd-agent-name", "agent-a"), ("x-argocd-agent-mode", "autonomous")])
            .await?
            .err()
            .expect("the demoted principal refuses the stream");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    // Promoting it back without --force is refused while b is active.
    let fenced = a.admin().await?.promote(PromoteRequest { force: false }).await.unwrap_err();
    assert_eq!(fenced.code(), tonic::Code::FailedPrecondition, "{fenced:?}");

    // The agent reconnects to the new active hub: nothing it had ACKed is missing there, and
    // what it writes now reaches the old primary's hub before the ACK.
    for name in &acked {
        assert!(b.has_app(name).await?, "{name} was ACKed by the old primary and is missing after the failover");
    }
    let mut stream = open_insecure(&b.h.url, "agent-a", "autonomous").await?;
    acked.extend(write_and_check(&mut stream, "after", 10, &a).await?);
    for name in &acked {
        assert!(b.has_app(name).await?, "{name} is missing on the active hub");
        assert!(a.has_app(name).await?, "{name} is missing on the replica's hub");
    }
    drop(stream);
    a.stop().await?;
    b.stop().await
}

#[tokio::test]
async fn a_forced_second_active_ends_with_the_lower_epoch_stepping_down() -> anyhow::Result<()> {
    let (a, b) = pair().await?;
    let mut stream = open_insecure(&a.h.url, "agent-a", "autonomous").await?;
    write_and_check(&mut stream, "x", 3, &b).await?;

    // An operator forces b active while a is still active (say, across a partition that
    // healed): a sees an active peer with a higher epoch and steps down, closing its agents.
    let forced = b.admin().await?.promote(PromoteRequest { force: true }).await?.into_inner();
    assert_eq!(forced.state, "active");
    a.state_is(State::Replicating).await?;
    let (_, end) = read_to_end(&mut stream.inbound).await?;
    assert_eq!(end.map(|s| s.code()), Some(tonic::Code::Unavailable));
    assert_eq!(b.ha.state(), State::Active, "the higher epoch stays active");

    a.stop().await?;
    b.stop().await
}

#[tokio::test]
async fn a_late_replica_catches_up_from_snapshots_and_deletes_only_what_the_active_confirms() -> anyhow::Result<()> {
    let ha = Harness::start(&["agent-a"], |_| {}).await?;
    let hb = Harness::start(&["agent-a"], |_| {}).await?;
    let (pa, pb) = (addr(&ha), addr(&hb));
    // a is active alone (b does not answer replication yet): ACKs are not held.
    let a = Hub::start(ha, Role::Primary, &pb).await?;
    a.state_is(State::Active).await?;
    let mut stream = open_insecure(&a.h.url, "agent-a", "autonomous").await?;
    for i in 0..5 {
        let ev = autonomous_create(&format!("early-{i}"), 0)?;
        let id = ev.resource_id.clone();
        stream.tx.send(ev.to_wire()).await?;
        read_until(&mut stream.inbound, "an ACK", |e| is_ack_of(e, &id)).await?;
    }
    // Something on b's hub the active never had.
    let stray = serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "stray", "namespace": "agent-a"}, "spec": {"project": "default"},
    });
    hb.apps("agent-a").create(&kube::api::PostParams::default(), &serde_json::from_value(stray)?).await?;

    // b joins: its snapshot brings what a has, and the stray one goes once a confirms it
    // deleted.
    let b =
        Hub::start_with(hb, HaConfig { reconcile_interval: Duration::from_millis(300), ..config(Role::Replica, &pa) })
            .await?;
    b.state_is(State::Replicating).await?;
    for i in 0..5 {
        assert!(b.has_app(&format!("early-{i}")).await?, "early-{i} came with the snapshot");
    }
    wait_until("the stray Application is gone from b", || async { Ok(!b.has_app("stray").await?) }).await?;

    // Changes made on a's hub directly (no agent event carries them) reach b by the next
    // snapshot: a hub-side Application appears, then goes.
    let hub_made = serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "hub-made", "namespace": "argocd"}, "spec": {"project": "default"},
    });
    a.h.apps("argocd").create(&kube::api::PostParams::default(), &serde_json::from_value(hub_made)?).await?;
    let on_b = || async { Ok(b.h.apps("argocd").get_opt("hub-made").await?.is_some()) };
    wait_until("hub-made reaches b", on_b).await?;
    a.h.apps("argocd").delete("hub-made", &kube::api::DeleteParams::default()).await?;
    wait_until("hub-made is deleted on b too", || async { Ok(!on_b().await?) }).await?;
    assert!(b.has_app("early-1").await?, "the agent's stay");
    drop(stream);
    a.stop().await?;
    b.stop().await
}

#[tokio::test]
async fn a_demoted_primary_that_restarts_stays_a_replica() -> anyhow::Result<()> {
    let (a, b) = pair().await?;
    a.admin().await?.demote(DemoteRequest {}).await?;
    b.state_is(State::Disconnected).await?;
    b.admin().await?.promote(PromoteRequest { force: false }).await?;
    // A new principal process on a's hub, preferring primary, reads the recorded role.
    let restarted = Principal::new(
        {
            let mut c = PrincipalConfig::new("argocd");
            c.allowed_namespaces = vec!["agent-*".into()];
            c
        },
        a.h.client.clone(),
        principal::insecure_metadata_identity(),
    )
    .await?;
    let ha = restarted.enable_ha(config(Role::Primary, &addr(&b.h)));
    let cancel = CancellationToken::new();
    let run = tokio::spawn(ha.clone().run(cancel.clone()));
    wait_until("the restarted primary follows b", || async { Ok(ha.state() == State::Replicating) }).await?;
    assert!(ha.readiness().is_err());
    cancel.cancel();
    run.await?;
    a.stop().await?;
    b.stop().await
}

/// An autonomous agent's event of type `ty` for Application `name` with `spec.project`.
fn app_event(ty: EventType, name: &str, project: &str, n: u32) -> anyhow::Result<protocol::Event> {
    let app = serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}"), "resourceVersion": n.to_string()},
        "spec": {"project": project},
    });
    let ev = protocol::Event::new(ty, Target::Application, format!("{name}_uid-{name}"), format!("{name}-{n}"))
        .with_json(&app)?;
    Ok(protocol::Event { subject: Some(format!("argocd/{name}")), ..ev })
}

/// Sends `ev` and waits for its ACK.
async fn send_acked(stream: &mut common::RawStream, ev: protocol::Event) -> anyhow::Result<()> {
    let id = ev.resource_id.clone();
    stream.tx.send(ev.to_wire()).await?;
    read_until(&mut stream.inbound, "an ACK", |e| is_ack_of(e, &id)).await?;
    Ok(())
}

async fn project_of(hub: &Hub, name: &str) -> anyhow::Result<String> {
    let app = hub.h.apps("agent-a").get(name).await?;
    Ok(app.data["spec"]["project"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test]
async fn a_stuck_replica_is_cut_off_after_the_bounded_wait_and_resyncs() -> anyhow::Result<()> {
    let ha = Harness::start(&["agent-a"], |_| {}).await?;
    let hb = Harness::start_behind_proxies(&["agent-a"], |_| {}).await?;
    let (pa, pb) = (addr(&ha), addr(&hb));
    // Long enough for a healthy replica on a loaded machine, short enough for the test.
    let wait = Duration::from_secs(2);
    let a = Hub::start_with(ha, HaConfig { replicate_timeout: wait, ..config(Role::Primary, &pb) }).await?;
    let b = Hub::start(hb, Role::Replica, &pa).await?;
    a.state_is(State::Active).await?;
    b.state_is(State::Replicating).await?;
    wait_until("a has b in sync", || async { Ok(a.ha.replicas().1 == 1) }).await?;
    let mut stream = open_insecure(&a.h.url, "agent-a", "autonomous").await?;
    write_and_check(&mut stream, "ok", 2, &b).await?;

    // b's hub stops answering: b cannot apply the next event. The agent's ACK waits for b at
    // most `wait`, then b is cut off and the ACK goes out.
    let proxies = b.h.proxies.as_ref().expect("behind proxies");
    proxies.requests.set(common::ProxyMode::Hold);
    let ev = autonomous_create("stuck", 0)?;
    let id = ev.resource_id.clone();
    let sent = tokio::time::Instant::now();
    stream.tx.send(ev.to_wire()).await?;
    read_until(&mut stream.inbound, "the ACK of stuck", |e| is_ack_of(e, &id)).await?;
    assert!(sent.elapsed() >= wait, "the ACK waited for the replica ({:?})", sent.elapsed());
    assert_eq!(a.ha.replicas().1, 0, "b is no longer in sync");

    // While b is cut off, the agent changes one Application and deletes another: ACKed at once.
    send_acked(&mut stream, app_event(EventType::SpecUpdate, "ok-1", "changed", 2)?).await?;
    send_acked(&mut stream, app_event(EventType::Delete, "ok-0", "default", 3)?).await?;

    // b's hub answers again: b learns it was cut off, resyncs from a snapshot, and has it all,
    // without taking the resync's writes for hub edits to revert.
    proxies.requests.set(common::ProxyMode::Open);
    wait_until("b is in sync again", || async { Ok(a.ha.replicas().1 == 1) }).await?;
    assert!(b.has_app("stuck").await?, "the event ACKed while b was cut off reached b by its resync");
    assert!(!b.has_app("ok-0").await?, "deleted while b was cut off");
    assert_eq!(project_of(&b, "ok-1").await?, "agent-a-changed", "the hub copy names the agent's project");
    write_and_check(&mut stream, "again", 2, &b).await?;
    assert!(!b.has_app("ok-0").await?, "b did not restore it");
    assert_eq!(project_of(&b, "ok-1").await?, "agent-a-changed", "b did not revert it");
    drop(stream);
    a.stop().await?;
    b.stop().await
}
