//! Repository secrets and the GPG keys ConfigMap (upstream §4.5, §4.6) across spawned principal
//! and agents: a hub secret labelled `argocd.argoproj.io/secret-type: repository` and scoped to a
//! project reaches exactly the managed agents that project matches, follows its changes, moves
//! with the project, is kept in line on the spoke, and converges after an agent or the principal
//! was away; `argocd-gpg-keys-cm` reaches every managed agent.

use anyhow::Result;
use base64::Engine as _;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tests::apps::{converge, gone, projects};
use tests::fixtures::dynamic;
use tests::topology::{ARGOCD_NS, Clusters, Mode, Topology};

fn secrets(client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Secret"), "secrets");
    Api::namespaced_with(client.clone(), ARGOCD_NS, &ar)
}

fn config_maps(client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "ConfigMap"), "configmaps");
    Api::namespaced_with(client.clone(), ARGOCD_NS, &ar)
}

const GPG_CM: &str = "argocd-gpg-keys-cm";

fn gpg_keys(key: &str) -> Result<DynamicObject> {
    dynamic(json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": GPG_CM, "namespace": ARGOCD_NS},
                   "data": {"4AEE18F83AFDEB23": key}}))
}

fn gpg_key_is(expected: &'static str) -> impl Fn(Option<&Value>) -> bool {
    move |o| o.is_some_and(|o| o["data"]["4AEE18F83AFDEB23"] == expected)
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn project(name: &str, agent: &str) -> Result<DynamicObject> {
    dynamic(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": name, "namespace": ARGOCD_NS},
        "spec": {
            "sourceRepos": ["*"],
            "sourceNamespaces": [agent],
            "destinations": [{"name": agent, "namespace": "*", "server": "*"}],
        },
    }))
}

/// A repository secret as an Argo CD user writes it (`stringData`; the API server stores `data`).
fn repo_secret(name: &str, secret_type: &str, project: Option<&str>, password: &str) -> Result<DynamicObject> {
    let mut string_data = json!({"type": "git", "url": format!("https://git.example/{name}.git"),
                                 "username": "deploy", "password": password});
    if let Some(p) = project {
        string_data["project"] = json!(p);
    }
    dynamic(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": ARGOCD_NS,
                     "labels": {"argocd.argoproj.io/secret-type": secret_type}},
        "type": "Opaque",
        "stringData": string_data,
    }))
}

fn password_is(expected: &str) -> impl Fn(Option<&Value>) -> bool {
    let want = b64(expected);
    move |o| o.is_some_and(|o| o["data"]["password"] == want.as_str())
}

async fn patch(api: &Api<DynamicObject>, name: &str, patch: Value) -> Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repository_secrets_follow_their_project_to_managed_agents() -> Result<()> {
    repositories_follow_their_project("mr1", "ar1", Clusters::default()).await
}

/// The same with the hub and the spokes on real kube-apiservers, the principal and agents
/// running under install/rbac/ (a missing Secret rule there fails this test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_repository_secrets_follow_their_project_to_managed_agents() -> Result<()> {
    repositories_follow_their_project("mr2", "ar2", Clusters::REAL).await
}

async fn repositories_follow_their_project(managed: &str, autonomous: &str, clusters: Clusters) -> Result<()> {
    let t = Topology::start_on(&[(managed, Mode::Managed), (autonomous, Mode::Autonomous)], clusters, true).await?;
    let hub = secrets(&t.hub());
    let spoke = secrets(&t.spoke(managed)?);
    let spoke_auto = secrets(&t.spoke(autonomous)?);
    let hub_projects = projects(&t.hub(), ARGOCD_NS);
    hub_projects.create(&PostParams::default(), &project("team", managed)?).await?;
    hub_projects.create(&PostParams::default(), &project("elsewhere", "nobody")?).await?;

    // Scoped to a project matching the agent: arrives with its credentials and source-uid.
    let created =
        hub.create(&PostParams::default(), &repo_secret("private", "repository", Some("team"), "s3cret")?).await?;
    hub.create(&PostParams::default(), &repo_secret("creds", "repo-creds", Some("team"), "c1")?).await?;
    hub.create(&PostParams::default(), &repo_secret("unscoped", "repository", None, "x")?).await?;
    hub.create(&PostParams::default(), &repo_secret("foreign", "repository", Some("elsewhere"), "x")?).await?;
    let hub_uid = created.metadata.uid.clone().unwrap_or_default();
    converge(&t, &spoke, "private", "a repository secret reaches the managed agent of its project", |o| {
        password_is("s3cret")(o)
            && o.is_some_and(|o| {
                o["metadata"]["annotations"]["argocd.argoproj.io/source-uid"] == hub_uid.as_str()
                    && o["metadata"]["labels"]["argocd.argoproj.io/secret-type"] == "repository"
            })
    })
    .await?;
    converge(&t, &spoke, "creds", "a repo-creds secret too", password_is("c1")).await?;

    // Changes follow; local edits and deletions are reverted.
    patch(&hub, "private", json!({"stringData": {"password": "rotated"}})).await?;
    converge(&t, &spoke, "private", "a rotated credential reaches the agent", password_is("rotated")).await?;
    patch(&spoke, "private", json!({"data": {"password": b64("tampered")}})).await?;
    converge(&t, &spoke, "private", "a local edit is reverted", password_is("rotated")).await?;
    spoke.delete("private", &DeleteParams::default()).await?;
    converge(&t, &spoke, "private", "a local deletion is undone", password_is("rotated")).await?;

    // The secret's own project changes: it leaves the agent, and comes back.
    patch(&hub, "private", json!({"stringData": {"project": "elsewhere"}})).await?;
    converge(&t, &spoke, "private", "moved to a project of another agent, it leaves", gone).await?;
    patch(&hub, "private", json!({"stringData": {"project": "team"}})).await?;
    converge(&t, &spoke, "private", "moved back, it returns", password_is("rotated")).await?;

    // The project stops matching the agent: its repositories leave with it, and return.
    patch(
        &hub_projects,
        "team",
        json!({"spec": {"destinations": [{"name": "nobody", "namespace": "*", "server": "*"}]}}),
    )
    .await?;
    converge(&t, &spoke, "creds", "the project no longer matches: its repositories leave", gone).await?;
    patch(
        &hub_projects,
        "team",
        json!({"spec": {"destinations": [{"name": managed, "namespace": "*", "server": "*"}]}}),
    )
    .await?;
    converge(&t, &spoke, "creds", "the project matches again: they return", password_is("c1")).await?;

    // Deleted on the hub: deleted on the agent.
    hub.delete("creds", &DeleteParams::default()).await?;
    converge(&t, &spoke, "creds", "a hub deletion reaches the agent", gone).await?;

    // Never distributed: unscoped, another agent's project, and anything to an autonomous agent.
    for name in ["unscoped", "foreign"] {
        anyhow::ensure!(spoke.get_opt(name).await?.is_none(), "{name} must stay on the hub");
    }
    for name in ["private", "unscoped", "foreign"] {
        anyhow::ensure!(spoke_auto.get_opt(name).await?.is_none(), "{name} must not reach an autonomous agent");
    }

    // The GPG keys ConfigMap reaches the managed agent, is kept in line there, and goes.
    let hub_cm = config_maps(&t.hub());
    let spoke_cm = config_maps(&t.spoke(managed)?);
    hub_cm.create(&PostParams::default(), &gpg_keys("-----BEGIN PGP PUBLIC KEY BLOCK----- one")?).await?;
    converge(
        &t,
        &spoke_cm,
        GPG_CM,
        "the GPG keys reach the managed agent",
        gpg_key_is("-----BEGIN PGP PUBLIC KEY BLOCK----- one"),
    )
    .await?;
    patch(&hub_cm, GPG_CM, json!({"data": {"4AEE18F83AFDEB23": "two"}})).await?;
    converge(&t, &spoke_cm, GPG_CM, "a changed key follows", gpg_key_is("two")).await?;
    patch(&spoke_cm, GPG_CM, json!({"data": {"4AEE18F83AFDEB23": "planted"}})).await?;
    converge(&t, &spoke_cm, GPG_CM, "a key planted locally is reverted", gpg_key_is("two")).await?;
    spoke_cm.delete(GPG_CM, &DeleteParams::default()).await?;
    converge(&t, &spoke_cm, GPG_CM, "a local deletion is undone", gpg_key_is("two")).await?;
    anyhow::ensure!(config_maps(&t.spoke(autonomous)?).get_opt(GPG_CM).await?.is_none(), "not to autonomous agents");
    hub_cm.delete(GPG_CM, &DeleteParams::default()).await?;
    converge(&t, &spoke_cm, GPG_CM, "a hub deletion reaches the agent", gone).await?;

    // Credentials never appear in any process's log (all at debug level), neither in clear nor
    // as the base64 the events carry.
    anyhow::ensure!(t.any_log_contains("shipped object queued"), "the principal logs at debug level");
    for secret in ["s3cret", "rotated", "tampered"] {
        anyhow::ensure!(
            !t.any_log_contains(secret) && !t.any_log_contains(&b64(secret)),
            "a credential was logged: {secret}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repository_changes_made_while_the_agent_or_the_principal_is_down_converge() -> Result<()> {
    let agent = "mr3";
    let mut t = Topology::start(&[(agent, Mode::Managed)]).await?;
    let hub = secrets(&t.hub());
    let spoke = secrets(&t.spoke(agent)?);
    projects(&t.hub(), ARGOCD_NS).create(&PostParams::default(), &project("team", agent)?).await?;
    for name in ["kept", "changed", "deleted"] {
        hub.create(&PostParams::default(), &repo_secret(name, "repository", Some("team"), "v1")?).await?;
    }
    for name in ["kept", "changed", "deleted"] {
        converge(&t, &spoke, name, "initial copies", password_is("v1")).await?;
    }
    let hub_cm = config_maps(&t.hub());
    let spoke_cm = config_maps(&t.spoke(agent)?);
    hub_cm.create(&PostParams::default(), &gpg_keys("one")?).await?;
    converge(&t, &spoke_cm, GPG_CM, "initial GPG keys", gpg_key_is("one")).await?;
    t.kill_agent(agent)?;
    patch(&hub, "changed", json!({"stringData": {"password": "v2"}})).await?;
    patch(&hub_cm, GPG_CM, json!({"data": {"4AEE18F83AFDEB23": "two"}})).await?;
    hub.delete("deleted", &DeleteParams::default()).await?;
    hub.create(&PostParams::default(), &repo_secret("added", "repository", Some("team"), "v1")?).await?;
    t.start_agent(agent).await?;
    converge(&t, &spoke, "changed", "a change made while the agent was down", password_is("v2")).await?;
    converge(&t, &spoke, "deleted", "a deletion made while the agent was down", gone).await?;
    converge(&t, &spoke, "added", "a repository added while the agent was down", password_is("v1")).await?;
    converge(&t, &spoke, "kept", "an unchanged one stays", password_is("v1")).await?;
    converge(&t, &spoke_cm, GPG_CM, "a GPG key changed while the agent was down", gpg_key_is("two")).await?;

    // Deleted and changed while the principal is down: the agent's resync asks about every
    // copy it holds, and the restarted principal (which remembers nothing) answers.
    t.kill_principal()?;
    hub.delete("kept", &DeleteParams::default()).await?;
    patch(&hub, "added", json!({"stringData": {"password": "v3"}})).await?;
    hub_cm.delete(GPG_CM, &DeleteParams::default()).await?;
    t.start_principal().await?;
    converge(&t, &spoke, "kept", "a deletion made while the principal was down", gone).await?;
    converge(&t, &spoke, "added", "a change made while the principal was down", password_is("v3")).await?;
    converge(&t, &spoke_cm, GPG_CM, "the GPG keys deleted while the principal was down", gone).await?;
    Ok(())
}
