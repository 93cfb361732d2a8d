//! Principal and agents as spawned binaries with a fault-injecting proxy on the link between them
//! ([`tests::faultproxy`]): changes made while the link is black-holed, reset or partitioned
//! converge once it heals, in both modes.

use std::time::Duration;

use anyhow::{Context as _, Result};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tests::apps::{gone, health_is, path_is, wait_object};
use tests::faultproxy::{Direction, FaultProxy, Side};
use tests::fixtures::application_resource;
use tests::topology::{ARGOCD_NS, Mode, Topology};
use tests::wait_until_async;

/// Convergence after faults: reconnects back off (up to tens of seconds after several failures).
const CONVERGE: Duration = Duration::from_secs(90);

fn apps(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &application_resource())
}

fn app(name: &str, ns: &str, path: &str) -> Result<DynamicObject> {
    tests::fixtures::app_with_path(name, ns, path)
}

/// What failure messages show: every process's logs and the proxy's counters.
fn context(t: &Topology, proxy: &FaultProxy) -> String {
    format!("proxy: {:?} {:?}\n{}", proxy.faults(), proxy.stats(), t.logs())
}

/// Wait until `check` holds for the object (`None` when it does not exist).
async fn wait_app(
    t: &Topology,
    proxy: &FaultProxy,
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    check: impl Fn(Option<&Value>) -> bool,
) -> Result<()> {
    wait_object(api, name, CONVERGE, what, check, || context(t, proxy)).await
}

async fn set_path(api: &Api<DynamicObject>, name: &str, path: &str) -> Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"source": {"path": path}}}))).await?;
    Ok(())
}

async fn set_health(api: &Api<DynamicObject>, name: &str, health: &str) -> Result<()> {
    let status = json!({"status": {"sync": {"status": "Synced"}, "health": {"status": health}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(status)).await?;
    Ok(())
}

/// A topology whose agents all dial the principal through one fault proxy, each connected.
async fn behind_proxy(agents: &[(&str, Mode)]) -> Result<(Topology, FaultProxy)> {
    behind_proxy_with(agents, &[]).await
}

/// [`behind_proxy`], every agent started with `agent_args` as well.
async fn behind_proxy_with(agents: &[(&str, Mode)], agent_args: &[&str]) -> Result<(Topology, FaultProxy)> {
    let mut t = Topology::start_without_agents(agents).await?;
    t.set_agent_args(agent_args);
    let proxy = FaultProxy::start(t.principal_addr().context("the principal's address")?).await?;
    for (name, _) in agents {
        t.start_agent_via(name, proxy.addr()).await?;
    }
    for (name, _) in agents {
        let r = wait_until_async(CONVERGE, &format!("agent {name} to connect through the proxy"), || async {
            t.principal_connects(name) >= 1
        })
        .await;
        r.with_context(|| context(&t, &proxy))?;
    }
    Ok((t, proxy))
}

/// Reset every connection `times` times, each time once the agents have dialled again (the new
/// connections may hang in their handshake if the link is black-holed; they are reset too).
async fn reset_repeatedly(t: &Topology, proxy: &FaultProxy, times: usize) -> Result<()> {
    for round in 0..times {
        let accepted = proxy.stats().accepted;
        proxy.reset_all();
        let what = format!("the agents to redial after reset {}", round + 1);
        let r = wait_until_async(CONVERGE, &what, || async { proxy.stats().accepted > accepted }).await;
        r.with_context(|| context(t, proxy))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_changes_made_while_black_holed_and_reset_converge_when_the_link_heals() -> Result<()> {
    let (t, proxy) = behind_proxy(&[("f1", Mode::Managed)]).await?;
    let hub = apps(&t.hub(), "f1");
    let spoke = apps(&t.spoke("f1")?, ARGOCD_NS);
    for name in ["keep", "change", "remove"] {
        hub.create(&PostParams::default(), &app(name, "f1", "v1")?).await?;
    }
    for name in ["keep", "change", "remove"] {
        wait_app(&t, &proxy, &spoke, name, "initial sync through the proxy", path_is("v1")).await?;
    }

    let connects = t.principal_connects("f1");
    proxy.blackhole(true);
    let created: Vec<String> = (0..5).map(|i| format!("new-{i}")).collect();
    for name in &created {
        hub.create(&PostParams::default(), &app(name, "f1", "v1")?).await?;
    }
    set_path(&hub, "change", "v2").await?;
    hub.delete("remove", &DeleteParams::default()).await?;
    reset_repeatedly(&t, &proxy, 3).await?;
    // Nothing can have crossed a black hole.
    for name in &created {
        assert!(spoke.get_opt(name).await?.is_none(), "{name} crossed the black hole\n{}", context(&t, &proxy));
    }

    proxy.blackhole(false);
    for name in &created {
        wait_app(&t, &proxy, &spoke, name, "created while black-holed", path_is("v1")).await?;
    }
    wait_app(&t, &proxy, &spoke, "change", "changed while black-holed", path_is("v2")).await?;
    wait_app(&t, &proxy, &spoke, "remove", "deleted while black-holed", gone).await?;
    wait_app(&t, &proxy, &spoke, "keep", "untouched", path_is("v1")).await?;
    assert!(t.principal_connects("f1") > connects, "the agent never redialled\n{}", context(&t, &proxy));

    // The link works both ways afterwards.
    set_health(&spoke, "new-0", "Healthy").await?;
    wait_app(&t, &proxy, &hub, "new-0", "status back to the hub after the faults", health_is("Healthy")).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_healed_after_changes_on_both_sides_converges_both_modes() -> Result<()> {
    let (t, proxy) = behind_proxy(&[("pm", Mode::Managed), ("pa", Mode::Autonomous)]).await?;
    let hub_m = apps(&t.hub(), "pm");
    let spoke_m = apps(&t.spoke("pm")?, ARGOCD_NS);
    let hub_a = apps(&t.hub(), "pa");
    let spoke_a = apps(&t.spoke("pa")?, ARGOCD_NS);

    for name in ["web", "old"] {
        hub_m.create(&PostParams::default(), &app(name, "pm", "v1")?).await?;
        spoke_a.create(&PostParams::default(), &app(name, ARGOCD_NS, "v1")?).await?;
    }
    for name in ["web", "old"] {
        wait_app(&t, &proxy, &spoke_m, name, "managed initial sync", path_is("v1")).await?;
        wait_app(&t, &proxy, &hub_a, name, "autonomous initial sync", path_is("v1")).await?;
    }
    set_health(&spoke_m, "web", "Healthy").await?;
    wait_app(&t, &proxy, &hub_m, "web", "managed status before the partition", health_is("Healthy")).await?;

    // Partition: every connection reset and every new one refused.
    proxy.refuse(true);
    proxy.reset_all();
    let r = wait_until_async(CONVERGE, "the agents to be refused", || async { proxy.stats().refused >= 2 }).await;
    r.with_context(|| context(&t, &proxy))?;

    // Managed: the hub changes specs, the spoke its status.
    set_path(&hub_m, "web", "v2").await?;
    hub_m.create(&PostParams::default(), &app("added", "pm", "v1")?).await?;
    hub_m.delete("old", &DeleteParams::default()).await?;
    set_health(&spoke_m, "web", "Degraded").await?;
    // Autonomous: the spoke changes everything.
    set_path(&spoke_a, "web", "v2").await?;
    set_health(&spoke_a, "web", "Progressing").await?;
    spoke_a.create(&PostParams::default(), &app("added", ARGOCD_NS, "v1")?).await?;
    spoke_a.delete("old", &DeleteParams::default()).await?;
    assert!(spoke_m.get_opt("added").await?.is_none(), "crossed the partition\n{}", context(&t, &proxy));
    assert!(hub_a.get_opt("added").await?.is_none(), "crossed the partition\n{}", context(&t, &proxy));

    proxy.refuse(false);
    wait_app(&t, &proxy, &spoke_m, "web", "managed spec update", path_is("v2")).await?;
    wait_app(&t, &proxy, &spoke_m, "added", "managed create", path_is("v1")).await?;
    wait_app(&t, &proxy, &spoke_m, "old", "managed delete", gone).await?;
    wait_app(&t, &proxy, &hub_m, "web", "managed status from the spoke", health_is("Degraded")).await?;
    wait_app(&t, &proxy, &hub_a, "web", "autonomous spec and status", |o| {
        path_is("v2")(o) && health_is("Progressing")(o)
    })
    .await?;
    wait_app(&t, &proxy, &hub_a, "added", "autonomous create", path_is("v1")).await?;
    wait_app(&t, &proxy, &hub_a, "old", "autonomous delete", gone).await?;
    // The spoke's status of a managed Application survives the hub's spec update.
    wait_app(&t, &proxy, &spoke_m, "web", "managed spoke keeps its status", |o| {
        path_is("v2")(o) && health_is("Degraded")(o)
    })
    .await?;
    Ok(())
}

/// The principal's side of every stream is left half-open (held, silent, never closed) while the
/// agent sees its connection close: the agent dials again and the principal must serve the new
/// stream while the old one still looks alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_reconnects_while_the_principal_still_holds_a_half_open_stream() -> Result<()> {
    let (t, proxy) = behind_proxy(&[("h2", Mode::Managed)]).await?;
    let hub = apps(&t.hub(), "h2");
    let spoke = apps(&t.spoke("h2")?, ARGOCD_NS);
    hub.create(&PostParams::default(), &app("before", "h2", "v1")?).await?;
    wait_app(&t, &proxy, &spoke, "before", "initial sync", path_is("v1")).await?;
    let connects = t.principal_connects("h2");

    assert!(proxy.half_open(Side::Upstream) >= 1, "no connection to make half-open");
    let r =
        wait_until_async(CONVERGE, "the agent to reconnect", || async { t.principal_connects("h2") > connects }).await;
    r.with_context(|| context(&t, &proxy))?;
    assert!(proxy.stats().half_open >= 1, "the stale streams are still held: {:?}", proxy.stats());

    hub.create(&PostParams::default(), &app("after", "h2", "v1")?).await?;
    set_path(&hub, "before", "v2").await?;
    wait_app(&t, &proxy, &spoke, "after", "a create after the reconnect", path_is("v1")).await?;
    wait_app(&t, &proxy, &spoke, "before", "an update after the reconnect", path_is("v2")).await?;
    set_health(&spoke, "after", "Healthy").await?;
    wait_app(&t, &proxy, &hub, "after", "status back to the hub", health_is("Healthy")).await?;
    Ok(())
}

/// The agent's side of every stream is left half-open: the principal sees the connection close,
/// the agent's stream just goes quiet, as when the principal's host vanishes without a FIN or a
/// middlebox drops the path. The agent's HTTP/2 keepalive (default 30 s, 20 s to answer) notices,
/// and it reconnects; without it the hub's changes would never arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_detects_a_silently_dead_stream_and_reconnects() -> Result<()> {
    let (t, proxy) = behind_proxy(&[("h1", Mode::Managed)]).await?;
    let hub = apps(&t.hub(), "h1");
    let spoke = apps(&t.spoke("h1")?, ARGOCD_NS);
    hub.create(&PostParams::default(), &app("before", "h1", "v1")?).await?;
    wait_app(&t, &proxy, &spoke, "before", "initial sync", path_is("v1")).await?;

    assert!(proxy.half_open(Side::Client) >= 1, "no connection to make half-open");
    hub.create(&PostParams::default(), &app("after", "h1", "v1")?).await?;
    wait_app(&t, &proxy, &spoke, "after", "a create after the stream died silently", path_is("v1")).await?;
    Ok(())
}

/// The heartbeat path of docs/reliability.md "Dead connections": with HTTP/2 keepalive off and
/// heartbeats every 4 s, the link is black-holed (nothing forwarded either way, nothing closed:
/// no FIN, no RST, no PING answered). Only the silence limit can notice: three heartbeat
/// intervals, 12 s (above the 10 s floor). The agent must give the stream up and dial again
/// within that (plus its first backoff and a noisy machine's slack), and not long before it;
/// while the link is healthy the principal's ACKs keep an otherwise idle stream up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_replaces_a_stream_silent_for_three_heartbeat_intervals() -> Result<()> {
    const HEARTBEAT: Duration = Duration::from_secs(4);
    const SILENCE_LIMIT: Duration = Duration::from_secs(12); // 3 × HEARTBEAT, above the 10 s floor
    /// Reconnect backoff's first step, scheduling on two busy cores.
    const SLACK: Duration = Duration::from_secs(15);
    let (t, proxy) =
        behind_proxy_with(&[("hb", Mode::Managed)], &["--heartbeat-interval", "4s", "--keep-alive-ping-interval", "0"])
            .await?;
    let hub = apps(&t.hub(), "hb");
    let spoke = apps(&t.spoke("hb")?, ARGOCD_NS);
    hub.create(&PostParams::default(), &app("before", "hb", "v1")?).await?;
    wait_app(&t, &proxy, &spoke, "before", "initial sync", path_is("v1")).await?;

    // Healthy and idle: heartbeats and their ACKs are the only messages on the stream, for well
    // over the silence limit, and the stream stays (HTTP/2 PINGs do not count as messages: without
    // the ACKs it would be replaced here). This waits on purpose: the claim is about a stretch of
    // time.
    let (connects, accepted) = (t.principal_connects("hb"), proxy.stats().accepted);
    tokio::time::sleep(SILENCE_LIMIT + HEARTBEAT * 2).await;
    assert_eq!(
        (t.principal_connects("hb"), proxy.stats().accepted),
        (connects, accepted),
        "an idle stream with heartbeats on was replaced: the principal's ACKs do not keep it up\n{}",
        context(&t, &proxy)
    );

    let black_holed = std::time::Instant::now();
    proxy.blackhole(true);
    let r =
        wait_until_async(SILENCE_LIMIT + SLACK, "the agent to give up the silent stream and dial again", || async {
            proxy.stats().accepted > accepted
        })
        .await;
    r.with_context(|| context(&t, &proxy))?;
    let after = black_holed.elapsed();
    // The last ACK arrived at most one heartbeat interval (and a bit) before the black hole.
    assert!(
        after >= SILENCE_LIMIT - HEARTBEAT - Duration::from_secs(1),
        "the agent dialled again {after:?} after the link went silent, before three heartbeat intervals: \
         something other than the silence limit replaced the stream\n{}",
        context(&t, &proxy)
    );
    println!("the agent dialled again {:.1} s after the link went silent", after.as_secs_f64());

    // The replacement works once the link does: a change made meanwhile arrives.
    hub.create(&PostParams::default(), &app("after", "hb", "v1")?).await?;
    proxy.blackhole(false);
    wait_app(&t, &proxy, &spoke, "after", "a create after the silent stream was replaced", path_is("v1")).await?;
    assert!(t.principal_connects("hb") > connects, "the agent never connected again\n{}", context(&t, &proxy));
    Ok(())
}

/// Applications created while the link is slow, thin and flapping (every connection reset and
/// new ones refused for part of each period) converge once the flapping stops, still through the
/// slow, thin link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_on_a_slow_flapping_link_converge() -> Result<()> {
    let (t, proxy) = behind_proxy(&[("fl", Mode::Managed)]).await?;
    let hub = apps(&t.hub(), "fl");
    let spoke = apps(&t.spoke("fl")?, ARGOCD_NS);
    proxy.set_latency(Direction::Both, Duration::from_millis(100));
    proxy.set_bandwidth(Direction::Both, Some(256 * 1024));
    hub.create(&PostParams::default(), &app("first", "fl", "v1")?).await?;
    wait_app(&t, &proxy, &spoke, "first", "sync over a slow link", path_is("v1")).await?;

    let connects = t.principal_connects("fl");
    let flapper = proxy.flap(Duration::from_millis(1500), Duration::from_millis(500));
    let mut created = Vec::new();
    for i in 0..10 {
        let name = format!("flap-{i}");
        hub.create(&PostParams::default(), &app(&name, "fl", "v1")?).await?;
        created.push(name);
    }
    set_path(&hub, "first", "v2").await?;
    let r = wait_until_async(CONVERGE, "three flaps", || async { flapper.cycles() >= 3 }).await;
    r.with_context(|| context(&t, &proxy))?;
    drop(flapper);

    for name in &created {
        wait_app(&t, &proxy, &spoke, name, "created while flapping", path_is("v1")).await?;
    }
    wait_app(&t, &proxy, &spoke, "first", "updated while flapping", path_is("v2")).await?;
    assert!(t.principal_connects("fl") > connects, "the flaps did not break the stream\n{}", context(&t, &proxy));
    Ok(())
}

/// Behind Envoy sidecars the proxy sits between the agent's sidecar and the principal's (the
/// mTLS hop): a black-holed, reset link heals the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_envoy_sidecars_a_black_holed_reset_link_converges() -> Result<()> {
    let mut t = Topology::start_mesh(&[("em", Mode::Managed)]).await?;
    let proxy = FaultProxy::start(t.principal_addr().context("the principal sidecar's address")?).await?;
    // Restarts the agent and its sidecar, now dialling through the proxy.
    t.start_agent_via("em", proxy.addr()).await?;
    let hub = apps(&t.hub(), "em");
    let spoke = apps(&t.spoke("em")?, ARGOCD_NS);
    hub.create(&PostParams::default(), &app("first", "em", "v1")?).await?;
    wait_app(&t, &proxy, &spoke, "first", "sync across both sidecars and the proxy", path_is("v1")).await?;
    assert!(proxy.stats().bytes_to_client > 0, "the stream bypassed the proxy: {:?}", proxy.stats());

    proxy.blackhole(true);
    hub.create(&PostParams::default(), &app("second", "em", "v1")?).await?;
    set_path(&hub, "first", "v2").await?;
    reset_repeatedly(&t, &proxy, 2).await?;
    assert!(spoke.get_opt("second").await?.is_none(), "crossed the black hole\n{}", context(&t, &proxy));
    proxy.blackhole(false);
    wait_app(&t, &proxy, &spoke, "second", "created while black-holed", path_is("v1")).await?;
    wait_app(&t, &proxy, &spoke, "first", "changed while black-holed", path_is("v2")).await?;
    Ok(())
}
