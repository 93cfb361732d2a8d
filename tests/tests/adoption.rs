//! What a managed agent does when the principal's Application meets one of that name on the
//! spoke (upstream §4.2 `identityAction`): adoption of one made there (`--adoption-policy`, or
//! the annotation on it), another source's copy recreated or updated in place
//! (`--source-uid-mismatch-policy`, or the annotation on the principal's), and what a restored
//! Application carries (`--on-application-recreate`). Across spawned binaries.

use anyhow::{Context as _, Result, ensure};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tests::apps::{apps, converge, path_is};
use tests::fixtures::app_with_path;
use tests::topology::{ARGOCD_NS, Mode, StartOptions, Topology};

const SOURCE_UID: &str = "argocd.argoproj.io/source-uid";

fn annotated(name: &str, ns: &str, path: &str, annotations: Value) -> Result<DynamicObject> {
    let mut app = app_with_path(name, ns, path)?;
    app.metadata.annotations = serde_json::from_value(annotations)?;
    Ok(app)
}

fn annotation<'a>(o: &'a Value, key: &str) -> Option<&'a str> {
    o["metadata"]["annotations"][key].as_str()
}

/// The spoke's Argo CD reports a finished sync of `name`, the status reaches the hub, then
/// someone deletes `name` on the spoke.
async fn synced_then_deleted_here(
    t: &Topology,
    hub: &Api<DynamicObject>,
    spoke: &Api<DynamicObject>,
    name: &str,
) -> Result<()> {
    let status = json!({"status": {"health": {"status": "Healthy"}, "operationState": {"phase": "Succeeded"}}});
    spoke.patch(name, &PatchParams::default(), &Patch::Merge(status)).await?;
    converge(t, hub, name, "the status reaches the hub", |o| {
        o.is_some_and(|o| o["status"]["health"]["status"] == "Healthy")
    })
    .await?;
    spoke.delete(name, &DeleteParams::default()).await?;
    Ok(())
}

async fn principal_uid(t: &Topology) -> Result<String> {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(t.hub(), ARGOCD_NS);
    let cm: k8s_openapi::api::core::v1::ConfigMap = cms.get("argocd-agent-principal-identity").await?;
    cm.data.and_then(|d| d.get("principal-uid").cloned()).context("the principal's UID")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_and_source_uid_mismatch_follow_the_policies() -> Result<()> {
    let agent = "ad1";
    let t = Topology::start(&[(agent, Mode::Managed)]).await?;
    let hub = apps(&t.hub(), agent);
    let spoke = apps(&t.spoke(agent)?, ARGOCD_NS);
    let uid = principal_uid(&t).await?;
    let hub_uid = |o: &DynamicObject| o.metadata.uid.clone().unwrap_or_default();

    // Made on the spoke, no policy: adopted (stamped, the principal's spec written).
    spoke.create(&PostParams::default(), &app_with_path("mine", ARGOCD_NS, "local")?).await?;
    let h = hub.create(&PostParams::default(), &app_with_path("mine", agent, "v1")?).await?;
    let want = hub_uid(&h);
    converge(&t, &spoke, "mine", "an Application made here is adopted", |o| {
        o.is_some_and(|o| annotation(o, SOURCE_UID) == Some(want.as_str()) && o["spec"]["source"]["path"] == "v1")
    })
    .await?;

    // Made on the spoke with adoption policy never: left alone, the hub's marked degraded.
    let never = json!({"argocd.argoproj.io/adoption-policy": "never"});
    let keep = spoke.create(&PostParams::default(), &annotated("keep", ARGOCD_NS, "local", never)?).await?;
    hub.create(&PostParams::default(), &app_with_path("keep", agent, "v1")?).await?;
    converge(&t, &hub, "keep", "the hub Application says why it was not adopted", |o| {
        o.is_some_and(|o| {
            o["status"]["health"]["status"] == "Degraded"
                && o["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["type"] == "AgentError"
                            && c["message"].as_str().is_some_and(|m| m.contains("adoption policy"))
                    })
                })
        })
    })
    .await?;
    let now = spoke.get("keep").await?;
    ensure!(
        now.metadata.uid == keep.metadata.uid && now.data["spec"]["source"]["path"] == "local",
        "an Application with adoption policy never was changed: {:?}",
        now.data
    );
    ensure!(annotation(&serde_json::to_value(&now)?, SOURCE_UID).is_none(), "and it was stamped");

    // Another source's copy (stale source-uid, this principal's UID), no policy: recreated.
    let stale = json!({SOURCE_UID: "stale-uid", "argocd.argoproj.io/principal-uid": uid});
    let old = spoke.create(&PostParams::default(), &annotated("other", ARGOCD_NS, "old", stale.clone())?).await?;
    let h = hub.create(&PostParams::default(), &app_with_path("other", agent, "v1")?).await?;
    let want = hub_uid(&h);
    let old_uid = old.metadata.uid.clone().unwrap_or_default();
    converge(&t, &spoke, "other", "another source's Application is recreated as the principal's", |o| {
        o.is_some_and(|o| {
            annotation(o, SOURCE_UID) == Some(want.as_str())
                && o["metadata"]["uid"].as_str() != Some(old_uid.as_str())
                && o["spec"]["source"]["path"] == "v1"
        })
    })
    .await?;

    // The same with upsert on the principal's Application: updated in place.
    let old = spoke.create(&PostParams::default(), &annotated("up", ARGOCD_NS, "old", stale)?).await?;
    let upsert = json!({"argocd.argoproj.io/source-uid-mismatch-policy": "upsert"});
    let h = hub.create(&PostParams::default(), &annotated("up", agent, "v1", upsert)?).await?;
    let want = hub_uid(&h);
    let old_uid = old.metadata.uid.clone().unwrap_or_default();
    converge(&t, &spoke, "up", "with upsert it is updated in place", |o| {
        o.is_some_and(|o| {
            annotation(o, SOURCE_UID) == Some(want.as_str())
                && o["metadata"]["uid"].as_str() == Some(old_uid.as_str())
                && o["spec"]["source"]["path"] == "v1"
        })
    })
    .await?;

    // Deleted here behind the principal's back (default ignore): back, with its status.
    synced_then_deleted_here(&t, &hub, &spoke, "mine").await?;
    converge(&t, &spoke, "mine", "a local deletion is reverted, status kept (ignore)", |o| {
        o.is_some_and(|o| o["status"]["operationState"]["phase"] == "Succeeded" && o["spec"]["source"]["path"] == "v1")
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_application_gets_what_on_application_recreate_asks_for() -> Result<()> {
    for (agent, action) in [("rc1", "resync"), ("rc2", "clear-status")] {
        let options = StartOptions {
            agent_args: vec!["--on-application-recreate".into(), action.into()],
            ..StartOptions::default()
        };
        let t = Topology::start_with_options(&[(agent, Mode::Managed)], options).await?;
        let hub = apps(&t.hub(), agent);
        let spoke = apps(&t.spoke(agent)?, ARGOCD_NS);
        hub.create(&PostParams::default(), &app_with_path("app", agent, "v1")?).await?;
        converge(&t, &spoke, "app", "the Application reaches the agent", path_is("v1")).await?;
        synced_then_deleted_here(&t, &hub, &spoke, "app").await?;
        converge(&t, &spoke, "app", "the restored Application carries what the flag asks for", |o| {
            o.is_some_and(|o| match action {
                "resync" => o["operation"]["sync"].is_object() && o["status"]["health"]["status"] == "Healthy",
                _ => o["status"]["operationState"].is_null() && o["status"]["health"]["status"] == "Healthy",
            })
        })
        .await?;
    }
    Ok(())
}
