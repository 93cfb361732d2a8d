//! An Application deleted on the hub and on the agent at the same moment ends deleted on both
//! and stays deleted (upstream #1056: there, each side's deletion reached the other as an
//! unauthorised change to revert, and the Application was recreated forever). Both modes, many
//! Applications at once, across spawned binaries.

use anyhow::Result;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use tests::apps::{apps, converge, gone, path_is, round_trip};
use tests::fixtures::app_with_path;
use tests::topology::{ARGOCD_NS, Mode, Topology};

const APPS: usize = 24;

async fn delete_both(hub: &Api<DynamicObject>, spoke: &Api<DynamicObject>, name: &str) -> Result<()> {
    let dp = DeleteParams::default();
    let (a, b) = tokio::join!(hub.delete(name, &dp), spoke.delete(name, &dp));
    // One side may already have removed it on behalf of the other: a 404 is fine.
    for r in [a.map(|_| ()), b.map(|_| ())] {
        match r {
            Ok(()) | Err(kube::Error::Api(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

async fn run(mode: Mode) -> Result<()> {
    let agent = if mode == Mode::Managed { "cdm" } else { "cda" };
    let t = Topology::start(&[(agent, mode)]).await?;
    let hub = apps(&t.hub(), agent);
    let spoke = apps(&t.spoke(agent)?, ARGOCD_NS);
    let (owner, owner_ns) = if mode == Mode::Managed { (&hub, agent) } else { (&spoke, ARGOCD_NS) };
    let other = if mode == Mode::Managed { &spoke } else { &hub };
    let names: Vec<String> = (0..APPS).map(|i| format!("both-{i}")).collect();
    for name in &names {
        owner.create(&PostParams::default(), &app_with_path(name, owner_ns, "v1")?).await?;
    }
    for name in &names {
        converge(&t, other, name, "the Application reaches the other side", path_is("v1")).await?;
    }

    let deletes: Vec<_> = names.iter().map(|n| delete_both(&hub, &spoke, n)).collect();
    for r in futures::future::join_all(deletes).await {
        r?;
    }
    for name in &names {
        converge(&t, &hub, name, "deleted on both sides: gone from the hub", gone).await?;
        converge(&t, &spoke, name, "and from the agent", gone).await?;
    }
    // Two round trips through the stream later, nothing came back.
    let sides = if mode == Mode::Managed { (&hub, &spoke) } else { (&spoke, &hub) };
    for barrier in ["settle", "quiet"] {
        round_trip(&t, &hub, sides, app_with_path(barrier, owner_ns, "b")?).await?;
    }
    for name in &names {
        anyhow::ensure!(hub.get_opt(name).await?.is_none(), "{name} came back on the hub\n{}", t.logs());
        anyhow::ensure!(spoke.get_opt(name).await?.is_none(), "{name} came back on the agent\n{}", t.logs());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_deleted_on_both_sides_at_once_stays_deleted() -> Result<()> {
    run(Mode::Managed).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autonomous_deleted_on_both_sides_at_once_stays_deleted() -> Result<()> {
    run(Mode::Autonomous).await
}
