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
use protocol::pb::replicationapi::replication_server::{Replication, ReplicationServer};
use protocol::pb::replicationapi::{
    AgentState, ConfirmMissingResourceResult, ConfirmMissingResourcesRequest, ConfirmMissingResourcesResponse,
    ReplicatedEvent, ReplicationAck, ReplicationSnapshot, ReplicationStatus, Resource, SnapshotRequest,
    StatusRequest as ReplicationStatusRequest,
};
use protocol::{EventType, Target};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
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
        // A plaintext listener without an mTLS method: callers have no identity, so replication
        // is allowed to any caller explicitly (denied by default).
        allowed_replication_clients: vec![principal::ha::replication::ANY_REPLICATION_CLIENT.to_owned()],
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

/// What the scripted active's `Subscribe` stream sends, as the test pushes it.
type EventQueue = mpsc::Receiver<Result<ReplicatedEvent, tonic::Status>>;

/// A scripted active principal for one replica: its `GetSnapshot` answers are given in order
/// (the last one repeats), its `Subscribe` stream sends what the test pushes, and it records
/// the replica's latest ACK.
#[derive(Clone)]
struct ScriptedActive {
    snapshots: Arc<std::sync::Mutex<Vec<ReplicationSnapshot>>>,
    snapshot_calls: Arc<std::sync::atomic::AtomicUsize>,
    stream: Arc<std::sync::Mutex<Option<EventQueue>>>,
    acked: Arc<watch::Sender<Option<u64>>>,
}

#[tonic::async_trait]
impl Replication for ScriptedActive {
    type SubscribeStream = ReceiverStream<Result<ReplicatedEvent, tonic::Status>>;

    async fn subscribe(
        &self,
        request: tonic::Request<tonic::Streaming<ReplicationAck>>,
    ) -> Result<tonic::Response<Self::SubscribeStream>, tonic::Status> {
        let Some(rx) = self.stream.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() else {
            return Err(tonic::Status::unavailable("this scripted active serves one subscription"));
        };
        let mut acks = request.into_inner();
        let acked = self.acked.clone();
        tokio::spawn(async move {
            while let Ok(Some(ack)) = acks.message().await {
                acked.send_modify(|a| *a = Some(a.unwrap_or(0).max(ack.acked_sequence_num)));
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }

    async fn get_snapshot(
        &self,
        _request: tonic::Request<SnapshotRequest>,
    ) -> Result<tonic::Response<ReplicationSnapshot>, tonic::Status> {
        self.snapshot_calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut snapshots = self.snapshots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let next = if snapshots.len() > 1 { snapshots.remove(0) } else { snapshots[0].clone() };
        Ok(tonic::Response::new(next))
    }

    async fn status(
        &self,
        _request: tonic::Request<ReplicationStatusRequest>,
    ) -> Result<tonic::Response<ReplicationStatus>, tonic::Status> {
        Ok(tonic::Response::new(ReplicationStatus::default()))
    }

    async fn confirm_missing_resources(
        &self,
        request: tonic::Request<ConfirmMissingResourcesRequest>,
    ) -> Result<tonic::Response<ConfirmMissingResourcesResponse>, tonic::Status> {
        let results = request
            .into_inner()
            .resources
            .into_iter()
            .map(|r| ConfirmMissingResourceResult {
                resource: Some(r),
                status: "unknown".into(),
                reason: "scripted".into(),
            })
            .collect();
        Ok(tonic::Response::new(ConfirmMissingResourcesResponse { results }))
    }
}

/// Application `name` of autonomous agent `agent-a` as the active hub holds it, for a snapshot.
fn snapshot_app(name: &str) -> anyhow::Result<Resource> {
    let app = serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": "agent-a", "uid": format!("hub-uid-{name}")},
        "spec": {"project": "default"},
    });
    Ok(Resource {
        name: name.to_owned(),
        namespace: "agent-a".to_owned(),
        kind: "Application".to_owned(),
        uid: format!("hub-uid-{name}"),
        spec_checksum: Vec::new(),
        data: serde_json::to_vec(&app)?,
    })
}

fn snapshot(seq: u64, apps: &[&str]) -> anyhow::Result<ReplicationSnapshot> {
    Ok(ReplicationSnapshot {
        agents: vec![AgentState {
            name: "agent-a".into(),
            mode: "autonomous".into(),
            connected: true,
            resources: apps.iter().map(|a| snapshot_app(a)).collect::<anyhow::Result<_>>()?,
        }],
        last_sequence_num: seq,
        principal_resources: Vec::new(),
    })
}

/// docs/ha.md: no event is skipped; one the replica cannot decode makes it take a fresh
/// snapshot. The active sends sequence 1 undecodable (a CloudEvent of spec version 0.3,
/// standing for the create of app-1), then 2 and, once 2 is ACKed, 3 (creates of app-2 and
/// app-3); its second snapshot (sequence 2) has app-1 and app-2. The replica must not apply 2
/// over the hole: it fetches that snapshot, resumes after it, applies 3, and ends with all
/// three Applications, sequence 3 applied.
#[tokio::test]
async fn an_undecodable_replicated_event_makes_the_replica_take_a_fresh_snapshot() -> anyhow::Result<()> {
    use protocol::replication::encode;
    let (tx, rx) = mpsc::channel(16);
    let active = ScriptedActive {
        snapshots: Arc::new(std::sync::Mutex::new(vec![snapshot(0, &[])?, snapshot(2, &["app-1", "app-2"])?])),
        snapshot_calls: Arc::default(),
        stream: Arc::new(std::sync::Mutex::new(Some(rx))),
        acked: Arc::new(watch::Sender::new(None)),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let peer = listener.local_addr()?.to_string();
    let cancel = CancellationToken::new();
    let server = tokio::spawn({
        let (active, cancel) = (active.clone(), cancel.clone());
        tonic::transport::Server::builder()
            .add_service(ReplicationServer::new(active))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move { cancel.cancelled().await })
    });
    let b = Hub::start(Harness::start(&["agent-a"], |_| {}).await?, Role::Replica, &peer).await?;
    let ack_reaches = |seq: u64| {
        let mut acked = active.acked.subscribe();
        async move {
            match tokio::time::timeout(common::WAIT, acked.wait_for(|a| a.is_some_and(|a| a >= seq))).await {
                Ok(Ok(_)) => Ok(()),
                _ => Err(anyhow::anyhow!("the replica did not ACK sequence {seq}")),
            }
        }
    };
    ack_reaches(0).await?;
    b.state_is(State::Replicating).await?;

    let mode = protocol::AgentMode::Autonomous;
    let mut undecodable = encode("agent-a", mode, &app_event(EventType::Create, "app-1", "default", 1)?, 1, 0);
    if let Some(ce) = undecodable.event.as_mut() {
        ce.spec_version = "0.3".into();
    }
    tx.send(Ok(undecodable)).await?;
    tx.send(Ok(encode("agent-a", mode, &app_event(EventType::Create, "app-2", "default", 1)?, 2, 0))).await?;
    ack_reaches(2).await?;
    tx.send(Ok(encode("agent-a", mode, &app_event(EventType::Create, "app-3", "default", 1)?, 3, 0))).await?;
    ack_reaches(3).await?;

    let calls = active.snapshot_calls.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(calls, 2, "the replica took a fresh snapshot for the event it could not decode (and only then)");
    for app in ["app-1", "app-2", "app-3"] {
        assert!(b.has_app(app).await?, "{app} is missing on the replica's hub after sequence 3 was ACKed");
    }
    assert_eq!(b.ha.applied_sequence(), 3);
    assert_eq!(b.ha.state(), State::Replicating, "the stream went on after the snapshot");
    let metrics = b.ha.metrics_text();
    assert!(metrics.contains("argocd_agent_replication_client_undecodable_events_total 1\n"), "{metrics}");
    drop(tx);
    b.stop().await?;
    cancel.cancel();
    tokio::time::timeout(common::WAIT, server).await???;
    Ok(())
}
