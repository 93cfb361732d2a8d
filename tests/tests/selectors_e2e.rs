//! `--label-selector` and the `ignore-sync` label (upstream §4.10) across spawned binaries: what
//! the principal distributes to a managed agent, what an autonomous agent sends up, and that
//! leaving an object out later deletes it on the other side, while objects that were never
//! distributed (a hybrid setup's own Applications) are never touched.

use anyhow::{Result, ensure};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;
use tests::apps::{apps, converge, gone, path_is, projects};
use tests::fixtures::{app_with_path, dynamic};
use tests::topology::{ARGOCD_NS, Mode, StartOptions, Topology};

fn labelled(name: &str, ns: &str, labels: serde_json::Value) -> Result<DynamicObject> {
    let mut app = app_with_path(name, ns, "v1")?;
    app.metadata.labels = serde_json::from_value(labels)?;
    Ok(app)
}

async fn set_labels(api: &Api<DynamicObject>, name: &str, labels: serde_json::Value) -> Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": labels}}))).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_principal_distributes_only_selected_objects_and_never_touches_the_others() -> Result<()> {
    let agent = "ms1";
    let options =
        StartOptions { principal_args: vec!["--label-selector".into(), "team=a".into()], ..StartOptions::default() };
    let t = Topology::start_with_options(&[(agent, Mode::Managed)], options).await?;
    let hub = apps(&t.hub(), agent);
    let spoke = apps(&t.spoke(agent)?, ARGOCD_NS);

    // A hybrid spoke's own Application, named as an unselected hub one.
    spoke.create(&PostParams::default(), &app_with_path("theirs", ARGOCD_NS, "local")?).await?;
    hub.create(&PostParams::default(), &labelled("theirs", agent, json!({}))?).await?;
    hub.create(&PostParams::default(), &labelled("ours", agent, json!({"team": "a"}))?).await?;
    hub.create(&PostParams::default(), &labelled("ignored", agent, json!({"team": "a"}))?).await?;
    converge(&t, &spoke, "ours", "a selected Application reaches the agent", path_is("v1")).await?;
    converge(&t, &spoke, "ignored", "so does another", path_is("v1")).await?;

    // Left out later: deleted on the agent (the selector no longer matches; ignore-sync set).
    set_labels(&hub, "ours", json!({"team": null})).await?;
    converge(&t, &spoke, "ours", "an Application that stops matching leaves the agent", gone).await?;
    set_labels(&hub, "ignored", json!({"argocd-agent.argoproj-labs.io/ignore-sync": "true"})).await?;
    converge(&t, &spoke, "ignored", "an Application labelled ignore-sync leaves the agent", gone).await?;

    // The unselected hub Application is deleted: the spoke's own one of that name stays.
    hub.delete("theirs", &DeleteParams::default()).await?;
    hub.create(&PostParams::default(), &labelled("barrier", agent, json!({"team": "a"}))?).await?;
    converge(&t, &spoke, "barrier", "a later selected Application arrives", path_is("v1")).await?;
    converge(&t, &spoke, "theirs", "the spoke's own Application is untouched", path_is("local")).await?;

    // AppProjects and repository secrets follow the same selector.
    let project = |name: &str, labels: serde_json::Value| {
        dynamic(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": {"name": name, "namespace": ARGOCD_NS, "labels": labels},
            "spec": {"sourceRepos": ["*"], "sourceNamespaces": [agent],
                     "destinations": [{"name": agent, "namespace": "*", "server": "*"}]}}))
    };
    let hub_projects = projects(&t.hub(), ARGOCD_NS);
    let spoke_projects = projects(&t.spoke(agent)?, ARGOCD_NS);
    hub_projects.create(&PostParams::default(), &project("unselected", json!({}))?).await?;
    hub_projects.create(&PostParams::default(), &project("selected", json!({"team": "a"}))?).await?;
    converge(&t, &spoke_projects, "selected", "a selected AppProject reaches the agent", |o| o.is_some()).await?;
    let secrets = |client: kube::Client| {
        let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Secret"), "secrets");
        Api::<DynamicObject>::namespaced_with(client, ARGOCD_NS, &ar)
    };
    let repo = |name: &str, labels: serde_json::Value| {
        let mut l = labels;
        l["argocd.argoproj.io/secret-type"] = json!("repository");
        dynamic(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": ARGOCD_NS, "labels": l},
            "stringData": {"url": "https://git.example/r.git", "project": "selected"}}))
    };
    let hub_secrets = secrets(t.hub());
    let spoke_secrets = secrets(t.spoke(agent)?);
    hub_secrets.create(&PostParams::default(), &repo("unselected-repo", json!({}))?).await?;
    hub_secrets.create(&PostParams::default(), &repo("selected-repo", json!({"team": "a"}))?).await?;
    converge(&t, &spoke_secrets, "selected-repo", "a selected repository reaches the agent", |o| o.is_some()).await?;
    ensure!(spoke_projects.get_opt("unselected").await?.is_none(), "an unselected AppProject stays on the hub");
    ensure!(spoke_secrets.get_opt("unselected-repo").await?.is_none(), "an unselected repository stays on the hub");
    set_labels(&hub_projects, "selected", json!({"team": "b"})).await?;
    converge(&t, &spoke_projects, "selected", "an AppProject that stops matching leaves the agent", gone).await?;
    set_labels(&hub_secrets, "selected-repo", json!({"team": "b"})).await?;
    converge(&t, &spoke_secrets, "selected-repo", "so does a repository", gone).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autonomous_agent_sends_only_selected_applications() -> Result<()> {
    let agent = "as1";
    let mut t = Topology::start_with_options(
        &[(agent, Mode::Autonomous)],
        StartOptions { start_agents: false, ..StartOptions::default() },
    )
    .await?;
    t.set_agent_args(&["--label-selector", "sync=yes"]);
    t.start_agent(agent).await?;
    let spoke = apps(&t.spoke(agent)?, ARGOCD_NS);
    let hub = apps(&t.hub(), agent);
    spoke.create(&PostParams::default(), &labelled("private", ARGOCD_NS, json!({}))?).await?;
    spoke.create(&PostParams::default(), &labelled("shared", ARGOCD_NS, json!({"sync": "yes"}))?).await?;
    converge(&t, &hub, "shared", "a selected Application reaches the hub", path_is("v1")).await?;
    ensure!(hub.get_opt("private").await?.is_none(), "an unselected Application stays on the agent");
    set_labels(&spoke, "shared", json!({"sync": null})).await?;
    converge(&t, &hub, "shared", "one that stops matching is deleted on the hub", gone).await?;
    converge(&t, &spoke, "shared", "and stays on the agent", path_is("v1")).await?;
    Ok(())
}
