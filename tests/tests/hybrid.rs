//! Upstream's hybrid walkthrough (`docs/user-guide/hybrid-architecture.md`) as a test: a hub whose
//! existing ("traditional") Applications, AppProjects and repository secrets carry no label sits
//! next to a principal with `--label-selector argocd-agent=true` and destination-based mapping;
//! the agent is created with `argocd-agentctl agent create` and configured as the guide says;
//! one Application is migrated exactly as the guide's steps do. Then the guide's checklist:
//! unlabelled objects are never touched (nor logged) by principal or agent, the agent's cluster
//! secret carries `skip-reconcile`, the migrated Application reaches the spoke with its project
//! and repository secret, and its status returns to the hub.

use anyhow::{Result, ensure};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tests::apps::{apps, converge, gone, projects};
use tests::fixtures::{app_with_path, dynamic};
use tests::topology::{ARGOCD_NS, Mode, StartOptions, Topology};

const AGENT: &str = "agent-spoke-1";
const LABEL: &str = "argocd-agent";

fn secrets(client: kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Secret"), "secrets");
    Api::namespaced_with(client, ARGOCD_NS, &ar)
}

fn project(name: &str, dest: &str) -> Result<DynamicObject> {
    dynamic(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": name, "namespace": ARGOCD_NS},
        "spec": {"sourceRepos": ["*"], "sourceNamespaces": [dest],
                 "destinations": [{"name": dest, "namespace": "*"}]}}))
}

fn repo(name: &str, url: &str, project: &str) -> Result<DynamicObject> {
    dynamic(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": ARGOCD_NS, "labels": {"argocd.argoproj.io/secret-type": "repository"}},
        "type": "Opaque",
        "stringData": {"type": "git", "url": url, "project": project, "password": "s3cr3t-token"}}))
}

async fn label(api: &Api<DynamicObject>, name: &str) -> Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {LABEL: "true"}}}))).await?;
    Ok(())
}

fn rv(o: &DynamicObject) -> String {
    o.metadata.resource_version.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hybrid_walkthrough_migrates_one_application_and_leaves_the_rest_alone() -> Result<()> {
    let selector = format!("{LABEL}=true");
    let options = StartOptions {
        principal_args: vec!["--label-selector".into(), selector.clone(), "--destination-based-mapping".into()],
        agent_args: [
            "--destination-based-mapping",
            "--create-namespace",
            "--allowed-namespaces",
            "*",
            "--label-selector",
            &selector,
            "--ignore-unmanaged-apps",
        ]
        .map(String::from)
        .to_vec(),
        start_agents: false,
        ..StartOptions::default()
    };
    let mut t = Topology::start_with_options(&[(AGENT, Mode::Managed)], options).await?;
    let (hub_apps, hub_projects, hub_secrets) =
        (apps(&t.hub(), ARGOCD_NS), projects(&t.hub(), ARGOCD_NS), secrets(t.hub()));
    let spoke = t.spoke(AGENT)?;
    let (spoke_apps, spoke_projects, spoke_secrets) =
        (apps(&spoke, ARGOCD_NS), projects(&spoke, ARGOCD_NS), secrets(spoke.clone()));

    // The existing hub: traditional objects, no label, the hub's own controller's business.
    let traditional = [
        hub_projects.create(&PostParams::default(), &project("trad-project", AGENT)?).await?,
        hub_secrets
            .create(&PostParams::default(), &repo("trad-repo", "https://git.example/trad.git", "trad-project")?)
            .await?,
        hub_apps.create(&PostParams::default(), &app_with_path("trad-app", ARGOCD_NS, "trad")?).await?,
    ];
    let mut to_migrate = app_with_path("my-app", ARGOCD_NS, "backend")?;
    to_migrate.data["spec"]["project"] = json!("my-project");
    hub_apps.create(&PostParams::default(), &to_migrate).await?;
    hub_projects.create(&PostParams::default(), &project("my-project", AGENT)?).await?;
    hub_secrets
        .create(&PostParams::default(), &repo("my-private-repo", "https://git.example/backend.git", "my-project")?)
        .await?;
    // And on the spoke, an Application made there.
    let spoke_local =
        spoke_apps.create(&PostParams::default(), &app_with_path("spoke-local", ARGOCD_NS, "own")?).await?;

    // Setup step 3: create the agent; its cluster secret tells the hub's controller to skip it.
    t.ctl(&["agent", "create", AGENT, "--resource-proxy-server", "argocd-agent-resource-proxy:9090"])?;
    let cluster = hub_secrets.get(&format!("cluster-{AGENT}")).await?;
    ensure!(
        cluster
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("argocd.argoproj.io/skip-reconcile"))
            .map(String::as_str)
            == Some("true"),
        "the agent's cluster secret lacks skip-reconcile: {:?}",
        cluster.metadata.annotations
    );
    // Step 4: the agent joins.
    t.start_agent(AGENT).await?;

    // Migration steps 1-3: project and repository labelled, the Application retargeted and labelled.
    label(&hub_projects, "my-project").await?;
    label(&hub_secrets, "my-private-repo").await?;
    hub_apps
        .patch("my-app", &PatchParams::default(), &Patch::Merge(json!({"spec": {"destination": {"name": AGENT}}})))
        .await?;
    label(&hub_apps, "my-app").await?;

    // Step 4: verify. The project and repository reach the spoke, then the Application.
    converge(&t, &spoke_projects, "my-project", "the labelled AppProject reaches the spoke", |o| o.is_some()).await?;
    converge(&t, &spoke_secrets, "my-private-repo", "the labelled repository secret reaches the spoke", |o| {
        o.is_some_and(|o| o["data"]["url"].is_string())
    })
    .await?;
    converge(&t, &spoke_apps, "my-app", "the migrated Application reaches the spoke", |o| {
        o.is_some_and(|o| o["spec"]["source"]["path"] == "backend" && o["spec"]["project"] == "my-project")
    })
    .await?;
    let status = json!({"status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}});
    spoke_apps.patch("my-app", &PatchParams::default(), &Patch::Merge(status)).await?;
    converge(&t, &hub_apps, "my-app", "its status returns to the hub", |o: Option<&Value>| {
        o.is_some_and(|o| o["status"]["health"]["status"] == "Healthy" && o["status"]["sync"]["status"] == "Synced")
    })
    .await?;

    // The checklist: nothing unlabelled reached the spoke, nothing traditional was written, on
    // either side, and neither process named them in its logs.
    converge(&t, &spoke_apps, "trad-app", "the traditional Application stays on the hub", gone).await?;
    converge(&t, &spoke_projects, "trad-project", "so does its AppProject", gone).await?;
    converge(&t, &spoke_secrets, "trad-repo", "and its repository secret", gone).await?;
    for before in &traditional {
        let name = before.metadata.name.clone().unwrap_or_default();
        let api = match before.types.as_ref().map(|t| t.kind.as_str()) {
            Some("AppProject") => &hub_projects,
            Some("Secret") => &hub_secrets,
            _ => &hub_apps,
        };
        let now = api.get(&name).await?;
        ensure!(rv(&now) == rv(before), "the unlabelled hub object {name} was written: {:?}", now.data);
        for (who, lines) in [("principal", t.principal_log_lines(&name)), ("agent", t.agent_log_lines(AGENT, &name))] {
            ensure!(lines.is_empty(), "the {who} logged the unlabelled {name}: {lines:?}");
        }
    }
    let now = spoke_apps.get("spoke-local").await?;
    ensure!(rv(&now) == rv(&spoke_local), "the spoke's own Application was written: {:?}", now.data);
    ensure!(
        // As written and as the Secret's data carries it (base64).
        ["s3cr3t-token", "czNjcjN0LXRva2Vu"]
            .iter()
            .all(|s| t.agent_log_lines(AGENT, s).is_empty() && t.principal_log_lines(s).is_empty()),
        "a repository credential was logged"
    );
    Ok(())
}
