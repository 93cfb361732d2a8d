//! Destination-based mapping (upstream §4.9) across spawned binaries: hub Applications in any
//! allowed namespace reach the managed agent their `spec.destination.name` names, keep their
//! namespace there (created by the agent with `--create-namespace`), report status back, move
//! when the destination changes, and an ApplicationSet's generated Applications fan out to many
//! agents through it. Applications of the principal's namespace move to an agent's own namespace
//! when the two differ (`argocd.argoproj.io/namespace-remapped`, upstream §4.2).

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

/// The remapping mark an agent sets on an Application it moved from the principal's namespace.
const REMAPPED: &str = "argocd.argoproj.io/namespace-remapped";

/// The names of the Applications in `api`'s namespace.
async fn names(api: &Api<DynamicObject>) -> Result<Vec<String>> {
    let mut out: Vec<String> =
        api.list(&Default::default()).await?.items.into_iter().filter_map(|o| o.metadata.name).collect();
    out.sort();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applications_of_the_principal_namespace_move_to_the_agent_namespace() -> Result<()> {
    const AGENT_NS: &str = "argocd-agent";
    let mut t =
        Topology::start_with_options(&[("rm1", Mode::Managed)], StartOptions { start_agents: false, ..options() })
            .await?;
    let spoke = t.spoke("rm1")?;
    ensure_namespace(&spoke, AGENT_NS).await?;
    // The agent runs in its own namespace; its TLS material from files (the topology's
    // Secrets are in `argocd`).
    let pki = t.pki_dir();
    let file = |f: &str| pki.join(f).display().to_string();
    let (ca, cert, key) = (file("ca.crt"), file("rm1.crt"), file("rm1.key"));
    let mut args: Vec<&str> = vec!["--namespace", AGENT_NS, "--root-ca-path", &ca];
    args.extend(["--tls-client-cert", &cert, "--tls-client-key", &key]);
    let dm = options().agent_args;
    args.extend(dm.iter().map(String::as_str));
    t.set_agent_args(&args);
    t.start_agent("rm1").await?;

    let hub = apps(&t.hub(), ARGOCD_NS);
    let moved = apps(&spoke, AGENT_NS);
    let marked = |path: &'static str| {
        move |o: Option<&serde_json::Value>| {
            o.is_some_and(|o| o["spec"]["source"]["path"] == path && o["metadata"]["annotations"][REMAPPED] == "true")
        }
    };

    // Created in the principal's namespace: kept in the agent's, marked.
    hub.create(&PostParams::default(), &targeting("guestbook", ARGOCD_NS, "rm1", "v1")?).await?;
    converge(
        &t,
        &moved,
        "guestbook",
        "an Application of the principal namespace lands in the agent's, marked",
        marked("v1"),
    )
    .await?;
    ensure!(
        apps(&spoke, ARGOCD_NS).get_opt("guestbook").await?.is_none(),
        "not in the hub's namespace name on the spoke"
    );

    // Status up, to the hub Application in the principal's namespace, without the mark.
    let status = json!({"status": {"sync": {"status": "Synced", "revision": "abc"}, "health": {"status": "Healthy"}}});
    moved.patch("guestbook", &PatchParams::default(), &Patch::Merge(status)).await?;
    converge(&t, &hub, "guestbook", "the agent's status reaches the hub Application, unmarked", |o| {
        o.is_some_and(|o| o["status"]["sync"]["revision"] == "abc" && o["metadata"]["annotations"][REMAPPED].is_null())
    })
    .await?;

    // Spec down.
    hub.patch("guestbook", &PatchParams::default(), &Patch::Merge(json!({"spec": {"source": {"path": "v2"}}}))).await?;
    converge(&t, &moved, "guestbook", "a hub spec change reaches the moved copy", marked("v2")).await?;

    // The same name in the agent's own hub namespace would take the moved one's place: refused,
    // and the hub says why; the moved copy is left alone, also when the other is deleted.
    ensure_namespace(&t.hub(), AGENT_NS).await?;
    let hub_agent_ns = apps(&t.hub(), AGENT_NS);
    hub_agent_ns.create(&PostParams::default(), &targeting("guestbook", AGENT_NS, "rm1", "clash")?).await?;
    converge(&t, &hub_agent_ns, "guestbook", "the colliding Application is marked degraded on the hub", |o| {
        o.is_some_and(|o| {
            o["status"]["health"]["status"] == "Degraded"
                && o["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["type"] == "AgentError" && c["message"].as_str().is_some_and(|m| m.contains("rename"))
                    })
                })
        })
    })
    .await?;
    hub_agent_ns.delete("guestbook", &DeleteParams::default()).await?;
    hub.create(&PostParams::default(), &targeting("barrier", ARGOCD_NS, "rm1", "v1")?).await?;
    converge(&t, &moved, "barrier", "a later Application arrives", marked("v1")).await?;
    converge(&t, &moved, "guestbook", "the moved copy outlives the collision", marked("v2")).await?;

    // Changed while the agent is down; the restarted agent resyncs it in place.
    t.kill_agent("rm1")?;
    hub.patch("guestbook", &PatchParams::default(), &Patch::Merge(json!({"spec": {"source": {"path": "v3"}}}))).await?;
    t.start_agent("rm1").await?;
    converge(&t, &moved, "guestbook", "the restarted agent resyncs the moved copy", marked("v3")).await?;
    hub.create(&PostParams::default(), &targeting("after", ARGOCD_NS, "rm1", "v1")?).await?;
    converge(&t, &moved, "after", "an Application created after the restart arrives", marked("v1")).await?;
    ensure!(names(&moved).await? == ["after", "barrier", "guestbook"], "one copy each: {:?}", names(&moved).await?);
    ensure!(names(&apps(&spoke, ARGOCD_NS)).await?.is_empty(), "nothing in the hub's namespace name on the spoke");
    ensure!(
        names(&hub).await? == ["after", "barrier", "guestbook"],
        "one hub Application each: {:?}",
        names(&hub).await?
    );
    ensure!(names(&hub_agent_ns).await?.is_empty(), "nothing written to the hub in the agent's namespace");
    let status = json!({"status": {"sync": {"status": "Synced", "revision": "def"}}});
    moved.patch("guestbook", &PatchParams::default(), &Patch::Merge(status)).await?;
    converge(&t, &hub, "guestbook", "status still flows after the restart", |o| {
        o.is_some_and(|o| o["status"]["sync"]["revision"] == "def" && o["metadata"]["annotations"][REMAPPED].is_null())
    })
    .await?;

    // Deleted on the hub: deleted from the agent's namespace.
    hub.delete("guestbook", &DeleteParams::default()).await?;
    converge(&t, &moved, "guestbook", "a hub deletion removes the moved copy", gone).await?;
    converge(&t, &hub, "guestbook", "and it stays deleted on the hub", gone).await?;
    Ok(())
}
