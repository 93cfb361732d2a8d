//! Principal replicas sharing the agents of one hub (`--agent-leases`, `principal::lease`):
//! two principals on one embedded hub API server, agents played by raw streams.

mod common;

use std::time::Duration;

use common::{Harness, ProxyMode, open_insecure, read_to_end, wait_until};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use principal::lease::{LeaseConfig, agent_lease_name, replica_lease_name};
use principal::{Principal, PrincipalConfig, insecure_metadata_identity};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Short, so a lapse shows within the tests' waits: renewed every 1 s, valid 2 s after.
const DURATION: Duration = Duration::from_secs(3);

fn replica(name: &str) -> impl FnOnce(&mut PrincipalConfig) {
    let name = name.to_owned();
    move |c| c.agent_leases = Some(LeaseConfig::new(name, DURATION))
}

/// A second principal on the harness's hub.
struct Replica {
    principal: Principal,
    url: String,
    cancel: CancellationToken,
    server: JoinHandle<Result<(), principal::PrincipalError>>,
}

impl Replica {
    async fn start(h: &Harness, name: &str) -> anyhow::Result<Self> {
        let mut config = PrincipalConfig::new("argocd");
        config.allowed_namespaces = vec!["agent-*".into()];
        replica(name)(&mut config);
        let principal = Principal::new(config, h.client.clone(), insecure_metadata_identity()).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let cancel = CancellationToken::new();
        let server = tokio::spawn(principal.clone().serve(listener, cancel.clone()));
        Ok(Self { principal, url, cancel, server })
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.cancel.cancel();
        self.server.await??;
        Ok(())
    }
}

fn leases(h: &Harness) -> Api<Lease> {
    Api::namespaced(h.client.clone(), "argocd")
}

/// The agent's Lease holder and transitions.
async fn holder(h: &Harness, agent: &str) -> anyhow::Result<Option<(String, i32)>> {
    let lease = leases(h).get_opt(&agent_lease_name(agent)).await?;
    Ok(lease.and_then(|l| l.spec).map(|s| (s.holder_identity.unwrap_or_default(), s.lease_transitions.unwrap_or(0))))
}

/// Waits until the agent's Lease is held by `replica` with `transitions` (`None`: any).
async fn held_by(h: &Harness, agent: &str, replica: &str, transitions: Option<i32>) -> anyhow::Result<()> {
    wait_until(&format!("{agent}'s Lease held by {replica}"), || async {
        Ok(holder(h, agent).await?.is_some_and(|(r, t)| r == replica && transitions.is_none_or(|n| n == t)))
    })
    .await
}

async fn ready(p: &Principal, what: &str) -> anyhow::Result<()> {
    wait_until(what, || async { Ok(p.is_ready()) }).await
}

fn asks_for_an_immediate_reconnect(status: &tonic::Status) -> bool {
    status.metadata().get(principal::peer::RECONNECT_TRAILER).is_some_and(|v| v == "immediately")
}

#[tokio::test]
async fn the_newest_stream_wins_across_replicas_and_the_old_owner_lets_go() -> anyhow::Result<()> {
    let h = Harness::start(&["agent-a"], replica("r1")).await?;
    let r2 = Replica::start(&h, "r2").await?;
    ready(&h.principal, "r1 is ready").await?;
    ready(&r2.principal, "r2 is ready").await?;

    let mut first = open_insecure(&h.url, "agent-a", "managed").await?;
    held_by(&h, "agent-a", "r1", Some(0)).await?;
    assert_eq!(h.principal.owned_agents(), Some(("r1".into(), 1)));

    let _second = open_insecure(&r2.url, "agent-a", "managed").await?;
    held_by(&h, "agent-a", "r2", Some(1)).await?;
    let (_, status) = read_to_end(&mut first.inbound).await?;
    let status = status.expect("r1 ends its stream with a status");
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    assert!(status.message().contains("r2"), "names the new owner: {status:?}");
    assert!(asks_for_an_immediate_reconnect(&status), "{status:?}");
    wait_until("r1 no longer owns agent-a", || async { Ok(h.principal.owned_agents() == Some(("r1".into(), 0))) })
        .await?;
    assert!(!h.principal.is_connected("agent-a"));
    assert!(r2.principal.is_connected("agent-a"));

    // The agent comes back to r1: r1 takes it again; its own stale view of r2's take is ignored.
    let _third = open_insecure(&h.url, "agent-a", "managed").await?;
    held_by(&h, "agent-a", "r1", Some(2)).await?;
    wait_until("r2 let go", || async { Ok(!r2.principal.is_connected("agent-a")) }).await?;
    assert!(h.principal.is_connected("agent-a"), "r1 keeps the newest stream");

    r2.stop().await?;
    h.stop().await
}

#[tokio::test]
async fn a_replica_cut_off_from_the_hub_gives_its_agents_up_and_refuses_new_ones() -> anyhow::Result<()> {
    let h = Harness::start_behind_proxies(&["agent-a"], replica("r1")).await?;
    let r2 = Replica::start(&h, "r2").await?;
    ready(&h.principal, "r1 is ready").await?;
    ready(&r2.principal, "r2 is ready").await?;
    let mut stream = open_insecure(&h.url, "agent-a", "autonomous").await?;
    held_by(&h, "agent-a", "r1", None).await?;

    // r1 cannot reach the hub: it stops renewing, and within two thirds of the duration it
    // gives the agent up (no more writes for it) and closes its stream.
    let cut = tokio::time::Instant::now();
    let proxies = h.proxies.as_ref().expect("behind proxies");
    proxies.requests.set(ProxyMode::Down);
    proxies.watches.set(ProxyMode::Down);
    let (_, status) = read_to_end(&mut stream.inbound).await?;
    let status = status.expect("closed with a status");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("cannot renew its Lease"), "{status:?}");
    assert!(asks_for_an_immediate_reconnect(&status));
    assert!(cut.elapsed() < DURATION, "gave up within the Lease duration: {:?}", cut.elapsed());
    let why = h.principal.readiness().expect_err("not ready while it cannot renew");
    assert!(why.contains("Lease"), "{why}");
    let refused =
        common::open_with(&h.url, &[("x-argocd-agent-name", "agent-a"), ("x-argocd-agent-mode", "autonomous")])
            .await?
            .err()
            .expect("r1 refuses streams while cut off");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");

    // The agent goes to r2, which takes it (r1's Lease is not renewed: taken from an expired one).
    let _moved = open_insecure(&r2.url, "agent-a", "autonomous").await?;
    held_by(&h, "agent-a", "r2", None).await?;

    // The hub comes back to r1: it serves again, and does not take the agent back by itself.
    proxies.requests.set(ProxyMode::Open);
    proxies.watches.set(ProxyMode::Open);
    ready(&h.principal, "r1 is ready again").await?;
    assert_eq!(holder(&h, "agent-a").await?.map(|(r, _)| r), Some("r2".into()));
    assert_eq!(h.principal.owned_agents(), Some(("r1".into(), 0)));

    r2.stop().await?;
    h.stop().await
}

#[tokio::test]
async fn shutdown_hands_agents_over_at_once_and_deletes_the_replica_lease() -> anyhow::Result<()> {
    let h = Harness::start(&["agent-a"], replica("r1")).await?;
    let r2 = Replica::start(&h, "r2").await?;
    ready(&r2.principal, "r2 is ready").await?;
    wait_until("both replica Leases exist", || async {
        let l = leases(&h);
        Ok(l.get_opt(&replica_lease_name("r1")).await?.is_some()
            && l.get_opt(&replica_lease_name("r2")).await?.is_some())
    })
    .await?;
    let mut stream = open_insecure(&r2.url, "agent-a", "managed").await?;
    held_by(&h, "agent-a", "r2", None).await?;

    r2.cancel.cancel();
    let (_, status) = read_to_end(&mut stream.inbound).await?;
    let status = status.expect("closed with a status");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(asks_for_an_immediate_reconnect(&status), "{status:?}");
    r2.server.await??;
    assert!(leases(&h).get_opt(&replica_lease_name("r2")).await?.is_none(), "r2's own Lease is deleted");
    assert!(!r2.principal.is_ready(), "a stopped replica is not ready");

    // r1 takes the agent at once, from a replica whose Lease is gone.
    let _moved = open_insecure(&h.url, "agent-a", "managed").await?;
    held_by(&h, "agent-a", "r1", Some(1)).await?;
    h.stop().await
}
