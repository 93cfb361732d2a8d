//! Principal and agents as spawned binaries on embedded API servers, over mTLS: Applications in
//! managed and autonomous mode, non-owner edits and deletes reverted, and convergence after an
//! agent or the principal was down while things changed.

use std::time::Duration;

use anyhow::{Context as _, Result};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tests::apps::{apps, assert_quiet, converge as wait_app, gone, path_is, projects, set_path};
use tests::fixtures::dynamic;
use tests::topology::{ARGOCD_NS, Clusters, Mode, Topology};
use tests::wait_until_async;

const CONVERGE: Duration = Duration::from_secs(45);

fn app(name: &str, ns: &str, path: &str) -> Result<DynamicObject> {
    tests::fixtures::app_with_path(name, ns, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_mode_lifecycle_and_non_owner_changes_reverted() -> Result<()> {
    let t = Topology::start(&[("m1", Mode::Managed)]).await?;
    let hub = apps(&t.hub(), "m1");
    let spoke = apps(&t.spoke("m1")?, ARGOCD_NS);

    hub.create(&PostParams::default(), &app("web", "m1", "v1")?).await?;
    wait_app(&t, &spoke, "web", "create reaches the spoke", path_is("v1")).await?;

    set_path(&hub, "web", "v2").await?;
    wait_app(&t, &spoke, "web", "spec update reaches the spoke", path_is("v2")).await?;

    spoke
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}})),
        )
        .await?;
    wait_app(&t, &hub, "web", "status comes back to the hub", |o| {
        o.is_some_and(|o| o["status"]["health"]["status"] == "Healthy")
    })
    .await?;

    // The spoke does not own a managed Application: edits and deletes there are reverted.
    set_path(&spoke, "web", "edited-on-spoke").await?;
    wait_app(&t, &spoke, "web", "a spoke edit is reverted", path_is("v2")).await?;
    spoke.delete("web", &DeleteParams::default()).await?;
    wait_app(&t, &spoke, "web", "a spoke delete is reverted", path_is("v2")).await?;

    hub.delete("web", &DeleteParams::default()).await?;
    wait_app(&t, &spoke, "web", "delete reaches the spoke", gone).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autonomous_mode_lifecycle_and_non_owner_changes_reverted() -> Result<()> {
    autonomous_lifecycle("a1", Clusters::default()).await
}

/// The same with the hub and the spoke on real kube-apiservers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_autonomous_lifecycle_and_reverts() -> Result<()> {
    autonomous_lifecycle("ra1", Clusters::REAL).await
}

/// Create, spec and status from the spoke, hub edits and deletes reverted, nothing looping,
/// delete from the spoke.
async fn autonomous_lifecycle(agent: &str, clusters: Clusters) -> Result<()> {
    let t = Topology::start_on(&[(agent, Mode::Autonomous)], clusters, true).await?;
    let hub = apps(&t.hub(), agent);
    let spoke = apps(&t.spoke(agent)?, ARGOCD_NS);

    spoke.create(&PostParams::default(), &app("svc", ARGOCD_NS, "v1")?).await?;
    wait_app(&t, &hub, "svc", "create reaches the hub", path_is("v1")).await?;

    set_path(&spoke, "svc", "v2").await?;
    spoke
        .patch("svc", &PatchParams::default(), &Patch::Merge(json!({"status": {"sync": {"status": "OutOfSync"}}})))
        .await?;
    wait_app(&t, &hub, "svc", "spec and status reach the hub", |o| {
        o.is_some_and(|o| o["spec"]["source"]["path"] == "v2" && o["status"]["sync"]["status"] == "OutOfSync")
    })
    .await?;

    // The hub does not own an autonomous Application: edits and deletes there are reverted.
    set_path(&hub, "svc", "edited-on-hub").await?;
    wait_app(&t, &hub, "svc", "a hub edit is reverted", path_is("v2")).await?;
    hub.delete("svc", &DeleteParams::default()).await?;
    wait_app(&t, &hub, "svc", "a hub delete is reverted", |o| {
        o.is_some_and(|o| o["spec"]["source"]["path"] == "v2" && o["metadata"]["deletionTimestamp"].is_null())
    })
    .await?;

    assert_quiet(&t, &hub, &spoke, "svc", false, ARGOCD_NS).await?;

    spoke.delete("svc", &DeleteParams::default()).await?;
    wait_app(&t, &hub, "svc", "delete reaches the hub", gone).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_down_while_the_hub_changes_converges_after_restart() -> Result<()> {
    let mut t = Topology::start(&[("m2", Mode::Managed)]).await?;
    let hub = apps(&t.hub(), "m2");
    let spoke = apps(&t.spoke("m2")?, ARGOCD_NS);
    for (name, path) in [("keep", "v1"), ("change", "v1"), ("remove", "v1")] {
        hub.create(&PostParams::default(), &app(name, "m2", path)?).await?;
    }
    for name in ["keep", "change", "remove"] {
        wait_app(&t, &spoke, name, "initial sync", path_is("v1")).await?;
    }

    t.kill_agent("m2")?;
    hub.create(&PostParams::default(), &app("added", "m2", "v1")?).await?;
    set_path(&hub, "change", "v2").await?;
    hub.delete("remove", &DeleteParams::default()).await?;
    t.start_agent("m2").await?;

    wait_app(&t, &spoke, "added", "created while the agent was down", path_is("v1")).await?;
    wait_app(&t, &spoke, "change", "changed while the agent was down", path_is("v2")).await?;
    wait_app(&t, &spoke, "remove", "deleted while the agent was down", gone).await?;
    wait_app(&t, &spoke, "keep", "untouched", path_is("v1")).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principal_restart_converges_both_modes() -> Result<()> {
    let mut t = Topology::start(&[("m3", Mode::Managed), ("a3", Mode::Autonomous)]).await?;
    let hub_m = apps(&t.hub(), "m3");
    let spoke_m = apps(&t.spoke("m3")?, ARGOCD_NS);
    let hub_a = apps(&t.hub(), "a3");
    let spoke_a = apps(&t.spoke("a3")?, ARGOCD_NS);
    hub_m.create(&PostParams::default(), &app("one", "m3", "v1")?).await?;
    wait_app(&t, &spoke_m, "one", "initial managed sync", path_is("v1")).await?;

    t.kill_principal()?;
    // Changes on both sides while the principal is down...
    set_path(&hub_m, "one", "v2").await?;
    hub_m.create(&PostParams::default(), &app("two", "m3", "v1")?).await?;
    spoke_a.create(&PostParams::default(), &app("auto", ARGOCD_NS, "v1")?).await?;
    t.start_principal().await?;

    // ...converge once it is back.
    wait_app(&t, &spoke_m, "one", "hub update after restart", path_is("v2")).await?;
    wait_app(&t, &spoke_m, "two", "hub create after restart", path_is("v1")).await?;
    wait_app(&t, &hub_a, "auto", "spoke create after restart", path_is("v1")).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_cascade_delete_waits_for_the_spoke_finalizer() -> Result<()> {
    const FINALIZER: &str = "resources-finalizer.argocd.argoproj.io";
    let t = Topology::start(&[("m4", Mode::Managed)]).await?;
    let hub = apps(&t.hub(), "m4");
    let spoke = apps(&t.spoke("m4")?, ARGOCD_NS);
    let mut a = app("cascade", "m4", "v1")?;
    a.metadata.finalizers = Some(vec![FINALIZER.into()]);
    hub.create(&PostParams::default(), &a).await?;
    wait_app(&t, &spoke, "cascade", "create reaches the spoke", path_is("v1")).await?;

    hub.delete("cascade", &DeleteParams::default()).await?;
    // The spoke copy is being deleted, and the hub keeps its copy while the spoke's Argo CD
    // (played here by the test) prunes resources.
    wait_app(&t, &spoke, "cascade", "deletion reaches the spoke", |o| {
        o.is_some_and(|o| !o["metadata"]["deletionTimestamp"].is_null())
    })
    .await?;
    assert!(hub.get_opt("cascade").await?.is_some(), "the hub keeps its copy until the spoke is done");
    spoke.patch("cascade", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    wait_app(&t, &spoke, "cascade", "the spoke copy goes once its finalizer is removed", gone).await?;
    wait_app(&t, &hub, "cascade", "then the hub copy goes", gone).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appprojects_reach_matching_managed_agents() -> Result<()> {
    appprojects_reach_matching_agents("m5", Clusters::default()).await
}

/// The same with the hub and the spoke on real kube-apiservers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_appprojects_reach_matching_managed_agents() -> Result<()> {
    appprojects_reach_matching_agents("rp5", Clusters::REAL).await
}

/// A project whose destinations match the agent (`<first letter>*`) reaches it, follows updates
/// and deletes; one for elsewhere stays on the hub.
async fn appprojects_reach_matching_agents(agent: &str, clusters: Clusters) -> Result<()> {
    let t = Topology::start_on(&[(agent, Mode::Managed)], clusters, true).await?;
    let hub = projects(&t.hub(), ARGOCD_NS);
    let spoke = projects(&t.spoke(agent)?, ARGOCD_NS);
    let project = |name: &str, dest: &str, description: &str| {
        dynamic(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": {"name": name, "namespace": ARGOCD_NS},
            "spec": {
                "description": description,
                "sourceRepos": ["*"],
                "sourceNamespaces": [dest],
                "destinations": [{"name": dest, "namespace": "*", "server": "*"}],
            },
        }))
    };
    let pattern = format!("{}*", &agent[..1]);
    hub.create(&PostParams::default(), &project("team", &pattern, "first")?).await?;
    hub.create(&PostParams::default(), &project("other", "elsewhere", "not for this agent")?).await?;
    wait_app(&t, &spoke, "team", "a matching project reaches the agent", |o| {
        o.is_some_and(|o| o["spec"]["description"] == "first")
    })
    .await?;
    hub.patch("team", &PatchParams::default(), &Patch::Merge(json!({"spec": {"description": "second"}}))).await?;
    wait_app(&t, &spoke, "team", "a project update reaches the agent", |o| {
        o.is_some_and(|o| o["spec"]["description"] == "second")
    })
    .await?;
    assert!(spoke.get_opt("other").await?.is_none(), "a project that does not match the agent stays on the hub");
    hub.delete("team", &DeleteParams::default()).await?;
    wait_app(&t, &spoke, "team", "a project delete reaches the agent", gone).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principal_stops_cleanly_on_sigterm_with_agents_connected_and_comes_back() -> Result<()> {
    let mut t = Topology::start(&[("m6", Mode::Managed)]).await?;
    let hub = apps(&t.hub(), "m6");
    let spoke = apps(&t.spoke("m6")?, ARGOCD_NS);
    hub.create(&PostParams::default(), &app("before", "m6", "v1")?).await?;
    wait_app(&t, &spoke, "before", "initial sync", path_is("v1")).await?;
    // Open agent streams must not hold a graceful shutdown.
    t.stop_principal(Duration::from_secs(10))?;
    t.start_principal().await?;
    hub.create(&PostParams::default(), &app("after", "m6", "v1")?).await?;
    wait_app(&t, &spoke, "after", "sync after a graceful restart", path_is("v1")).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_envoy_sidecars_agents_are_identified_by_their_spiffe_id() -> Result<()> {
    // agent -> agent sidecar (Envoy, mTLS with the agent's SVID) -> principal sidecar (Envoy,
    // SANITIZE_SET x-forwarded-client-cert) -> plaintext principal on loopback, --auth xfcc:.
    let t = Topology::start_mesh(&[("m7", Mode::Managed), ("a7", Mode::Autonomous)]).await?;
    let hub_m = apps(&t.hub(), "m7");
    let spoke_m = apps(&t.spoke("m7")?, ARGOCD_NS);
    hub_m.create(&PostParams::default(), &app("meshy", "m7", "v1")?).await?;
    wait_app(&t, &spoke_m, "meshy", "a managed app crosses both sidecars", path_is("v1")).await?;
    spoke_m
        .patch("meshy", &PatchParams::default(), &Patch::Merge(json!({"status": {"health": {"status": "Healthy"}}})))
        .await?;
    wait_app(&t, &hub_m, "meshy", "its status comes back", |o| {
        o.is_some_and(|o| o["status"]["health"]["status"] == "Healthy")
    })
    .await?;

    let spoke_a = apps(&t.spoke("a7")?, ARGOCD_NS);
    let hub_a = apps(&t.hub(), "a7");
    spoke_a.create(&PostParams::default(), &app("up", ARGOCD_NS, "v1")?).await?;
    wait_app(&t, &hub_a, "up", "an autonomous app reaches the hub", path_is("v1")).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_envoy_in_front_of_the_principal_only_agents_are_identified_by_their_spiffe_id() -> Result<()> {
    // agent outside the mesh -> mTLS with its own certificate -> principal sidecar (Envoy,
    // SANITIZE_SET x-forwarded-client-cert) -> plaintext principal on loopback, --auth xfcc:.
    let t = Topology::start_principal_sidecar_only(&[("m8", Mode::Managed), ("a8", Mode::Autonomous)]).await?;
    let hub_m = apps(&t.hub(), "m8");
    let spoke_m = apps(&t.spoke("m8")?, ARGOCD_NS);
    hub_m.create(&PostParams::default(), &app("edge", "m8", "v1")?).await?;
    wait_app(&t, &spoke_m, "edge", "a managed app crosses the principal's sidecar", path_is("v1")).await?;
    spoke_m
        .patch("edge", &PatchParams::default(), &Patch::Merge(json!({"status": {"health": {"status": "Healthy"}}})))
        .await?;
    wait_app(&t, &hub_m, "edge", "its status comes back", |o| {
        o.is_some_and(|o| o["status"]["health"]["status"] == "Healthy")
    })
    .await?;
    let spoke_a = apps(&t.spoke("a8")?, ARGOCD_NS);
    let hub_a = apps(&t.hub(), "a8");
    spoke_a.create(&PostParams::default(), &app("up", ARGOCD_NS, "v1")?).await?;
    wait_app(&t, &hub_a, "up", "an autonomous app reaches the hub", path_is("v1")).await?;
    Ok(())
}

/// Through Envoy sidecars whose stream idle timeout is shorter than a quiet period: with the
/// agent's heartbeat below it the one stream stays up; without heartbeats Envoy cuts it and the
/// agent has to reconnect (the control that shows the first half measures something).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_quiet_stream_up_through_envoy_idle_timeouts() -> Result<()> {
    use tests::topology::MeshOptions;
    const IDLE: Duration = Duration::from_secs(3);
    const QUIET: Duration = Duration::from_secs(8);
    for (heartbeat, expect_reconnect) in [(Some(Duration::from_millis(700)), false), (None, true)] {
        let options = MeshOptions { stream_idle_timeout: Some(IDLE), heartbeat };
        let t = Topology::start_mesh_with(&[("hb", Mode::Managed)], options).await?;
        let hub = apps(&t.hub(), "hb");
        let spoke = apps(&t.spoke("hb")?, ARGOCD_NS);
        hub.create(&PostParams::default(), &app("first", "hb", "v1")?).await?;
        wait_app(&t, &spoke, "first", "sync before the quiet period", path_is("v1")).await?;
        let connects_before = t.principal_connects("hb");
        // The quiet period is what is under test, so it is a plain sleep.
        tokio::time::sleep(QUIET).await;
        hub.create(&PostParams::default(), &app("second", "hb", "v1")?).await?;
        wait_app(&t, &spoke, "second", "sync after the quiet period", path_is("v1")).await?;
        let reconnects = t.principal_connects("hb") - connects_before;
        if expect_reconnect {
            assert!(reconnects >= 1, "without heartbeats Envoy should have closed the idle stream\n{}", t.logs());
        } else {
            assert_eq!(reconnects, 0, "with heartbeats below the idle timeout the stream must stay up\n{}", t.logs());
        }
    }
    Ok(())
}

/// Which process a mid-sync restart kills.
#[derive(Clone, Copy, Debug)]
enum Victim {
    Principal,
    Agents,
}

/// How many Applications each side writes in the mid-sync tests: enough that a batch is still
/// travelling when the kill lands, few enough for 2 shared cores.
const MID_SYNC_APPS: usize = 40;

/// Fresh batches tried before giving up on landing the kill while one is crossing.
const MID_SYNC_ATTEMPTS: usize = 5;

async fn count_with_path(api: &Api<DynamicObject>, prefix: &str, path: &str) -> usize {
    live_paths(api)
        .await
        .map_or(0, |paths| paths.iter().filter(|(name, p)| name.starts_with(prefix) && *p == path).count())
}

/// How many of a batch had reached the other side in each mode (managed, autonomous).
type Arrived = (usize, usize);

/// Writes a batch of `n` creates named `<prefix>-NNN` on the owner side of both modes (the modes
/// concurrently, each one create at a time), and SIGKILLs `victim` as soon as the batch has
/// reached the other side of both modes (or a quarter of it in one mode), while the rest are
/// still being written or crossing.
/// Returns how many had arrived in each mode, counted right after the kill (an upper bound of
/// what had arrived at the kill: nothing is deleted meanwhile).
async fn kill_during_batch(
    t: &mut Topology,
    victim: Victim,
    (managed, autonomous): (&str, &str),
    prefix: &str,
    n: usize,
) -> Result<Arrived> {
    let owner_m = apps(&t.hub(), managed);
    let other_m = apps(&t.spoke(managed)?, ARGOCD_NS);
    let owner_a = apps(&t.spoke(autonomous)?, ARGOCD_NS);
    let other_a = apps(&t.hub(), autonomous);
    // One create after the other, at the owner's API server's pace: the batch then crosses over
    // as long as it takes to write, longer than the kill takes to react. Written all at once, a
    // real API server's watch delivered a mode's whole batch in one burst, which crossed before
    // any kill could land.
    let batch = |api: Api<DynamicObject>, ns: String| {
        let prefix = prefix.to_owned();
        async move {
            for i in 0..n {
                let obj = app(&format!("{prefix}-{i:03}"), &ns, "v1")?;
                api.create(&PostParams::default(), &obj).await?;
            }
            anyhow::Ok(())
        }
    };
    let writing = tokio::spawn({
        let (m, a) = (batch(owner_m, managed.to_owned()), batch(owner_a, ARGOCD_NS.to_owned()));
        async move {
            let (m, a) = tokio::join!(m, a);
            m.and(a)
        }
    });
    // Kill as soon as the batch arrives on the other side of both modes, or a quarter of it in
    // one (the modes do not cross at the same pace: on real API servers one mode's batch can
    // cross whole before the other's starts).
    let started = wait_until_async(CONVERGE, "the batch to start arriving", || async {
        let m = count_with_path(&other_m, prefix, "v1").await;
        let a = count_with_path(&other_a, prefix, "v1").await;
        (m > 0 && a > 0) || 4 * m.max(a) >= n
    })
    .await;
    if let Err(e) = started {
        writing.abort();
        return Err(e.context(t.logs()));
    }
    match victim {
        Victim::Principal => t.kill_principal()?,
        Victim::Agents => {
            t.kill_agent(managed)?;
            t.kill_agent(autonomous)?;
        }
    }
    let arrived = (count_with_path(&other_m, prefix, "v1").await, count_with_path(&other_a, prefix, "v1").await);
    // The owners' API servers are up: the rest of the batch is written while the victim is down.
    writing.await??;
    Ok(arrived)
}

async fn restart(t: &mut Topology, victim: Victim, (managed, autonomous): (&str, &str)) -> Result<()> {
    match victim {
        Victim::Principal => t.start_principal().await,
        Victim::Agents => {
            t.start_agent(managed).await?;
            t.start_agent(autonomous).await
        }
    }
}

/// A batch of creates on the owner side of both modes is crossing when `victim` is SIGKILLed:
/// some have reached the other side, and in each mode not all (checked, with fresh batches up to
/// [`MID_SYNC_ATTEMPTS`] times, each mode needing one such kill in some attempt; the test fails
/// if a mode never had one). More creates, updates and deletes land while it is down and after it
/// is back. Every Application must end in its owner's final state on the other side: none lost,
/// none resurrected, none left at an older path.
async fn restart_mid_sync(victim: Victim, managed: &str, autonomous: &str, clusters: Clusters) -> Result<()> {
    let mut t = Topology::start_on(&[(managed, Mode::Managed), (autonomous, Mode::Autonomous)], clusters, true).await?;
    let owner_m = apps(&t.hub(), managed);
    let other_m = apps(&t.spoke(managed)?, ARGOCD_NS);
    let owner_a = apps(&t.spoke(autonomous)?, ARGOCD_NS);
    let other_a = apps(&t.hub(), autonomous);
    let agents = (managed, autonomous);

    let mut missed: Vec<Arrived> = Vec::new();
    // Whether a kill has landed while a batch was crossing, per mode (managed, autonomous). On
    // real API servers one mode's batch often crosses whole before the kill lands, so the modes
    // may get their mid-batch kill in different attempts; every earlier batch is checked whole
    // after its restart, and the last one in the final state.
    let mut landed = (false, false);
    let prefix = loop {
        let prefix = format!("b{}", missed.len());
        let arrived = kill_during_batch(&mut t, victim, agents, &prefix, MID_SYNC_APPS).await?;
        eprintln!(
            "{victim:?} killed with {arrived:?} of {MID_SYNC_APPS} (managed, autonomous) of batch {prefix} arrived"
        );
        if arrived.0 + arrived.1 > 0 {
            landed.0 |= arrived.0 < MID_SYNC_APPS;
            landed.1 |= arrived.1 < MID_SYNC_APPS;
        }
        if landed.0 && landed.1 {
            break prefix;
        }
        // Too late (or too early) in a mode that has not had its mid-batch kill yet: the batch
        // crossed whole. Let it settle, and try a fresh one.
        missed.push(arrived);
        anyhow::ensure!(
            missed.len() < MID_SYNC_ATTEMPTS,
            "the kill never landed while a batch was crossing in both modes: arrived (managed, autonomous) of \
             {MID_SYNC_APPS} at each of {MID_SYNC_ATTEMPTS} kills: {missed:?}"
        );
        let connects = (t.principal_connects(managed), t.principal_connects(autonomous));
        restart(&mut t, victim, agents).await?;
        // The next batch must cross on the live streams, not in the reconnect's resync (which
        // ships a mode's whole batch at once, before the kill can land).
        wait_until_async(CONVERGE, "both agents to connect again", || async {
            t.principal_connects(managed) > connects.0 && t.principal_connects(autonomous) > connects.1
        })
        .await
        .with_context(|| t.logs())?;
        for (other, what) in [(&other_m, "managed"), (&other_a, "autonomous")] {
            wait_until_async(CONVERGE, &format!("{what}: batch {prefix} to arrive after the restart"), || async {
                count_with_path(other, &prefix, "v1").await == MID_SYNC_APPS
            })
            .await
            .with_context(|| t.logs())?;
        }
    };
    let name = |i: usize| format!("{prefix}-{i:03}");

    // While it is down: a third of the Applications move to v2, every fifth is deleted.
    for (owner, ns) in [(&owner_m, managed), (&owner_a, ARGOCD_NS)] {
        for i in (0..MID_SYNC_APPS).step_by(3) {
            set_path(owner, &name(i), "v2").await?;
        }
        for i in (0..MID_SYNC_APPS).step_by(5) {
            owner.delete(&name(i), &DeleteParams::default()).await?;
        }
        owner.create(&PostParams::default(), &app("while-down", ns, "v1")?).await?;
    }
    restart(&mut t, victim, agents).await?;
    // Right after the restart, before the resync can have finished: more updates.
    for owner in [&owner_m, &owner_a] {
        for i in (1..MID_SYNC_APPS).step_by(7) {
            if i % 5 != 0 {
                set_path(owner, &name(i), "v3").await?;
            }
        }
    }

    // The final state on the owner side (with the batches that crossed whole), expected on the
    // other side.
    for (owner, other, what) in [(&owner_m, &other_m, "managed"), (&owner_a, &other_a, "autonomous")] {
        let want = live_paths(owner).await?;
        let expected = MID_SYNC_APPS - MID_SYNC_APPS.div_ceil(5) + 1 + missed.len() * MID_SYNC_APPS;
        assert_eq!(want.len(), expected, "{what}: owner side");
        let last = std::cell::RefCell::new(String::new());
        let r = wait_until_async(CONVERGE, &format!("{what}: the other side in the owner's final state"), || async {
            let Ok(got) = live_paths(other).await else { return false };
            let differ: Vec<_> = want
                .keys()
                .chain(got.keys())
                .filter(|k| want.get(*k) != got.get(*k))
                .map(|k| format!("{k}: want {:?} got {:?}", want.get(k), got.get(k)))
                .collect();
            *last.borrow_mut() = differ.join(", ");
            differ.is_empty()
        })
        .await;
        r.with_context(|| format!("still differing: {}\n{}", last.borrow(), t.logs()))?;
    }
    Ok(())
}

/// Name → `spec.source.path` of every Application not being deleted.
async fn live_paths(api: &Api<DynamicObject>) -> Result<std::collections::BTreeMap<String, Value>> {
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|o| o.metadata.deletion_timestamp.is_none())
        .map(|o| (o.metadata.name.clone().unwrap_or_default(), o.data["spec"]["source"]["path"].clone()))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principal_killed_mid_sync_converges_without_loss_both_modes() -> Result<()> {
    restart_mid_sync(Victim::Principal, "mp", "ap", Clusters::default()).await
}

/// The same with the hub and spokes on real kube-apiservers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_principal_killed_mid_sync_converges_without_loss_both_modes() -> Result<()> {
    restart_mid_sync(Victim::Principal, "rmp", "rap", Clusters::REAL).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_killed_mid_sync_converge_without_loss_both_modes() -> Result<()> {
    restart_mid_sync(Victim::Agents, "mk", "ak", Clusters::default()).await
}

/// The same with the hub and spokes on real kube-apiservers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_agents_killed_mid_sync_converge_without_loss_both_modes() -> Result<()> {
    restart_mid_sync(Victim::Agents, "rmk", "rak", Clusters::REAL).await
}
