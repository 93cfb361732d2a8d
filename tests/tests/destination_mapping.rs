//! Destination-based mapping (upstream §4.9) across spawned binaries: hub Applications in any
//! allowed namespace reach the managed agent their `spec.destination.name` names, keep their
//! namespace there (created by the agent with `--create-namespace`), report status back, move
//! when the destination changes, and an ApplicationSet's generated Applications fan out to many
//! agents through it.

use anyhow::{Result, ensure};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tests::apps::{apps, converge, gone, path_is};
use tests::fixtures::{app_with_path, dynamic};
use tests::topology::{ARGOCD_NS, Mode, StartOptions, Topology, ensure_namespace};

/// A hub Application in `ns` targeting cluster (agent) `dest`.
fn targeting(name: &str, ns: &str, dest: &str, path: &str) -> Result<DynamicObject> {
    let mut app = app_with_path(name, ns, path)?;
    app.data["spec"]["destination"] = json!({"name": dest, "namespace": "guestbook"});
    Ok(app)
}

async fn set_destination(api: &Api<DynamicObject>, name: &str, dest: &str) -> Result<()> {
    let patch = json!({"spec": {"destination": {"name": dest}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await?;
    Ok(())
}

fn options() -> StartOptions {
    StartOptions {
        // A small processor pool: agents' events queue for it rather than run all at once.
        principal_args: ["--destination-based-mapping", "--event-processors", "2"].map(String::from).to_vec(),
        agent_args: ["--destination-based-mapping", "--create-namespace", "--allowed-namespaces", "team-*"]
            .map(String::from)
            .to_vec(),
        ..StartOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applications_follow_their_destination_name_and_keep_their_namespace() -> Result<()> {
    let t = Topology::start_with_options(&[("dm1", Mode::Managed), ("dm2", Mode::Managed)], options()).await?;
    ensure_namespace(&t.hub(), "team-a").await?;
    let hub = apps(&t.hub(), "team-a");
    let hub_argocd = apps(&t.hub(), ARGOCD_NS);
    let (dm1, dm2) = (t.spoke("dm1")?, t.spoke("dm2")?);
    let dm1_team = apps(&dm1, "team-a");
    let dm2_team = apps(&dm2, "team-a");

    // In a team namespace: reaches dm1 in that namespace (created by the agent), not dm2.
    hub.create(&PostParams::default(), &targeting("web", "team-a", "dm1", "v1")?).await?;
    converge(&t, &dm1_team, "web", "the Application reaches the agent it targets, in its hub namespace", path_is("v1"))
        .await?;
    // In the principal's own namespace: allowed too, and kept there.
    hub_argocd.create(&PostParams::default(), &targeting("api", ARGOCD_NS, "dm2", "v1")?).await?;
    converge(&t, &apps(&dm2, ARGOCD_NS), "api", "an Application in the principal namespace reaches dm2", path_is("v1"))
        .await?;
    converge(&t, &dm2_team, "web", "dm2 never gets dm1's Application", gone).await?;

    // Spec down, status up.
    hub.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"source": {"path": "v2"}}}))).await?;
    converge(&t, &dm1_team, "web", "a hub spec change reaches the agent", path_is("v2")).await?;
    let status = json!({"status": {"sync": {"status": "Synced", "revision": "abc"}, "health": {"status": "Healthy"}}});
    dm1_team.patch("web", &PatchParams::default(), &Patch::Merge(status)).await?;
    converge(&t, &hub, "web", "the agent's status returns to the hub Application", |o| {
        o.is_some_and(|o| o["status"]["sync"]["revision"] == "abc")
    })
    .await?;

    // A new destination moves it: deleted on dm1, created on dm2.
    set_destination(&hub, "web", "dm2").await?;
    converge(&t, &dm2_team, "web", "a changed destination creates it on the new agent", path_is("v2")).await?;
    converge(&t, &dm1_team, "web", "and deletes it from the agent it left", gone).await?;

    // No agent: in-cluster or empty destinations go nowhere; a namespace the agent does not
    // allow never reaches it. A later Application is the barrier both are checked against.
    ensure_namespace(&t.hub(), "other").await?;
    hub.create(&PostParams::default(), &targeting("local", "team-a", "in-cluster", "v1")?).await?;
    apps(&t.hub(), "other").create(&PostParams::default(), &targeting("stray", "other", "dm1", "v1")?).await?;
    hub.create(&PostParams::default(), &targeting("barrier", "team-a", "dm1", "v1")?).await?;
    converge(&t, &dm1_team, "barrier", "a later Application reaches dm1", path_is("v1")).await?;
    for spoke in [&dm1_team, &dm2_team] {
        converge(&t, spoke, "local", "an in-cluster Application reaches no agent", gone).await?;
    }
    converge(&t, &apps(&dm1, "other"), "stray", "a namespace outside --allowed-namespaces is refused", gone).await?;
    ensure!(
        t.agent_log_lines("dm1", "is not allowed on this agent").iter().any(|l| l.contains("other")),
        "the agent says why it refused the Application"
    );

    // Deleted on the hub: deleted on the agent.
    hub.delete("web", &DeleteParams::default()).await?;
    converge(&t, &dm2_team, "web", "a hub deletion reaches the agent", gone).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_set_fans_out_to_many_agents_through_destination_names() -> Result<()> {
    let agents = ["as1", "as2", "as3"];
    let t = Topology::start_with_options(&agents.map(|a| (a, Mode::Managed)), options()).await?;
    ensure_namespace(&t.hub(), "team-b").await?;
    let appsets = Api::<DynamicObject>::namespaced_with(t.hub(), "team-b", &tests::apps::application_set_resource());
    // The ApplicationSet as a user writes it (a list generator over the agents' cluster names).
    let appset = appsets
        .create(
            &PostParams::default(),
            &dynamic(json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "ApplicationSet",
                "metadata": {"name": "guestbook", "namespace": "team-b"},
                "spec": {
                    "generators": [{"list": {"elements": agents.map(|a| json!({"cluster": a}))}}],
                    "template": {
                        "metadata": {"name": "guestbook-{{cluster}}"},
                        "spec": {
                            "project": "default",
                            "source": {"repoURL": "https://example.com/repo.git", "path": "guestbook"},
                            "destination": {"name": "{{cluster}}", "namespace": "guestbook"},
                        },
                    },
                },
            }))?,
        )
        .await?;
    let uid = appset.metadata.uid.clone().unwrap_or_default();
    // Its Applications as Argo CD's ApplicationSet controller writes them: owned by it.
    let hub = apps(&t.hub(), "team-b");
    for a in agents {
        let mut app = targeting(&format!("guestbook-{a}"), "team-b", a, "guestbook")?;
        app.metadata.owner_references = Some(vec![serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet", "name": "guestbook", "uid": uid,
            "controller": true, "blockOwnerDeletion": true,
        }))?]);
        hub.create(&PostParams::default(), &app).await?;
    }
    for a in agents {
        let spoke = apps(&t.spoke(a)?, "team-b");
        converge(&t, &spoke, &format!("guestbook-{a}"), "each generated Application reaches its agent", |o| {
            o.is_some_and(|o| o["spec"]["source"]["path"] == "guestbook" && o["metadata"]["ownerReferences"].is_null())
        })
        .await?;
        for other in agents.iter().filter(|o| **o != a) {
            converge(&t, &spoke, &format!("guestbook-{other}"), "and no other agent's", gone).await?;
        }
        let spoke_sets =
            Api::<DynamicObject>::namespaced_with(t.spoke(a)?, "team-b", &tests::apps::application_set_resource());
        ensure!(spoke_sets.get_opt("guestbook").await?.is_none(), "the ApplicationSet itself is not synced to {a}");
    }
    // The generator drops an element: Argo CD deletes that Application; it leaves its agent.
    hub.delete("guestbook-as2", &DeleteParams::default()).await?;
    converge(&t, &apps(&t.spoke("as2")?, "team-b"), "guestbook-as2", "a pruned Application leaves its agent", gone)
        .await?;
    Ok(())
}
