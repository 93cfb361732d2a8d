//! Periodic resync (`--resync-interval` on the agent, `--resync-min-interval` on the principal):
//! agents that hold what the hub says send one digest per interval and get nothing back (the
//! principal counts `in_sync`), in both modes and for every kind a managed agent holds
//! (Applications, AppProjects, repository secrets, the GPG keys ConfigMap); a digest that differs
//! makes the principal run the resync, in upstream's own events.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;
use tests::apps::{apps, converge, path_is, projects};
use tests::fixtures::dynamic;
use tests::topology::{ARGOCD_NS, Mode, StartOptions, Topology};

const METRIC: &str = "argocd_principal_resyncs_total";

async fn count(t: &Topology, agent: &str, result: &str) -> Result<f64> {
    let addr = t.principal_metrics_addr().context("principal metrics address")?;
    let (_, text) = tests::http::get(addr, "/metrics").await?;
    Ok(tests::http::sample(&text, METRIC, &format!("agent_name=\"{agent}\",result=\"{result}\"")).unwrap_or(0.0))
}

fn core(client: &kube::Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", kind), plural);
    Api::namespaced_with(client.clone(), ARGOCD_NS, &ar)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_in_line_with_the_hub_cost_one_digest_per_interval_and_nothing_more() -> Result<()> {
    let (managed, autonomous) = ("pr-m", "pr-a");
    let options = StartOptions {
        start_agents: false,
        principal_args: vec!["--resync-min-interval".into(), "0".into()],
        ..StartOptions::default()
    };
    let mut t =
        Topology::start_with_options(&[(managed, Mode::Managed), (autonomous, Mode::Autonomous)], options).await?;
    t.set_agent_args(&["--resync-interval", "200ms"]);
    t.start_agent(managed).await?;
    t.start_agent(autonomous).await?;

    // Every kind a managed agent holds, and an autonomous agent's Application.
    let hub = t.hub();
    projects(&hub, ARGOCD_NS)
        .create(
            &PostParams::default(),
            &dynamic(json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "team", "namespace": ARGOCD_NS},
                "spec": {"sourceRepos": ["*"], "sourceNamespaces": [managed],
                 "destinations": [{"name": managed, "namespace": "*", "server": "*"}]},
            }))?,
        )
        .await?;
    core(&hub, "Secret", "secrets")
        .create(
            &PostParams::default(),
            &dynamic(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "repo", "namespace": ARGOCD_NS,
                             "labels": {"argocd.argoproj.io/secret-type": "repository"}},
                "stringData": {"type": "git", "url": "https://git.example/r.git", "project": "team"},
            }))?,
        )
        .await?;
    core(&hub, "ConfigMap", "configmaps")
        .create(
            &PostParams::default(),
            &dynamic(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "argocd-gpg-keys-cm", "namespace": ARGOCD_NS}, "data": {"ABC": "key"},
            }))?,
        )
        .await?;
    apps(&hub, managed).create(&PostParams::default(), &tests::fixtures::app_with_path("m", managed, "v1")?).await?;
    let auto_spoke = apps(&t.spoke(autonomous)?, ARGOCD_NS);
    auto_spoke.create(&PostParams::default(), &tests::fixtures::app_with_path("a", ARGOCD_NS, "v1")?).await?;

    let spoke = t.spoke(managed)?;
    converge(&t, &apps(&spoke, ARGOCD_NS), "m", "the managed Application", path_is("v1")).await?;
    converge(&t, &projects(&spoke, ARGOCD_NS), "team", "the AppProject", |o| o.is_some()).await?;
    converge(&t, &core(&spoke, "Secret", "secrets"), "repo", "the repository secret", |o| o.is_some()).await?;
    converge(&t, &core(&spoke, "ConfigMap", "configmaps"), "argocd-gpg-keys-cm", "the GPG keys", |o| o.is_some())
        .await?;
    converge(&t, &apps(&hub, autonomous), "a", "the autonomous agent's Application on the hub", path_is("v1")).await?;

    // Once a digest has agreed, the next ones all agree: nothing is re-sent.
    for agent in [managed, autonomous] {
        tests::wait_until_async(Duration::from_secs(60), "a periodic resync in line with the hub", || async {
            count(&t, agent, "in_sync").await.is_ok_and(|n| n >= 1.0)
        })
        .await
        .with_context(|| t.logs())?;
    }
    let mut before = Vec::new();
    for agent in [managed, autonomous] {
        before.push((agent, count(&t, agent, "in_sync").await?, count(&t, agent, "repaired").await?));
    }
    for (agent, in_sync, _) in &before {
        tests::wait_until_async(Duration::from_secs(60), "five more periodic resyncs", || async {
            count(&t, agent, "in_sync").await.is_ok_and(|n| n >= in_sync + 5.0)
        })
        .await
        .with_context(|| t.logs())?;
    }
    for (agent, _, repaired) in &before {
        let now = count(&t, agent, "repaired").await?;
        ensure!(now == *repaired, "{agent}: digests of resources in line with the hub disagreed ({repaired} -> {now})");
    }
    Ok(())
}
