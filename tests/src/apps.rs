//! Checks on Applications and AppProjects that the cross-process sync tests share: typed access,
//! waiting until an object reaches a state, the usual states, and that nothing loops.

use std::time::Duration;

use anyhow::Context as _;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::fixtures::{app_with_path, application_resource};
use crate::topology::Topology;
use crate::wait::wait_until_async;

/// How long a barrier of [`assert_quiet`] may take to cross.
const CONVERGE: Duration = Duration::from_secs(60);

/// Applications in `ns`.
#[must_use]
pub fn apps(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &application_resource())
}

/// AppProjects in `ns`.
#[must_use]
pub fn projects(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AppProject"),
        "appprojects",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// ApplicationSets (`argoproj.io/v1alpha1`).
#[must_use]
pub fn application_set_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "ApplicationSet"),
        "applicationsets",
    )
}

/// Wait up to `timeout` until `check` holds for object `name` (`None` when it does not exist);
/// on a timeout the error carries `context()` (e.g. the processes' logs).
///
/// # Errors
/// `check` did not hold in time.
pub async fn wait_object(
    api: &Api<DynamicObject>,
    name: &str,
    timeout: Duration,
    what: &str,
    check: impl Fn(Option<&Value>) -> bool,
    context: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    let r = wait_until_async(timeout, what, || async {
        match api.get_opt(name).await {
            Ok(o) => check(o.map(|o| serde_json::to_value(o).unwrap_or_default()).as_ref()),
            Err(_) => false,
        }
    })
    .await;
    r.map_err(|e| e.context(context()))
}

/// [`wait_object`] for a topology's sync: up to a minute, with its processes' logs on a timeout.
///
/// # Errors
/// `check` did not hold in time.
pub async fn converge(
    t: &Topology,
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    check: impl Fn(Option<&Value>) -> bool,
) -> anyhow::Result<()> {
    wait_object(api, name, CONVERGE, what, check, || t.logs()).await
}

/// The object exists with `spec.source.path == expected`.
pub fn path_is(expected: &'static str) -> impl Fn(Option<&Value>) -> bool {
    move |o| o.is_some_and(|o| o["spec"]["source"]["path"] == expected)
}

/// The object exists with `status.health.status == expected`.
pub fn health_is(expected: &'static str) -> impl Fn(Option<&Value>) -> bool {
    move |o| o.is_some_and(|o| o["status"]["health"]["status"] == expected)
}

/// The object does not exist.
#[must_use]
pub fn gone(o: Option<&Value>) -> bool {
    o.is_none()
}

/// Merge-patch `spec.source.path`.
///
/// # Errors
/// The API server refuses the patch.
pub async fn set_path(api: &Api<DynamicObject>, name: &str, path: &str) -> anyhow::Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"source": {"path": path}}}))).await?;
    Ok(())
}

/// A round trip through the agent's stream: `object` is created on `from`, reaches `to`, gets a
/// status there (as the owning side's Argo CD would), and that status reaches the hub. Events
/// of one agent are ordered, so whatever was in flight before has been applied by then.
///
/// # Errors
/// The barrier does not cross in time.
pub async fn round_trip(
    t: &Topology,
    hub: &Api<DynamicObject>,
    (from, to): (&Api<DynamicObject>, &Api<DynamicObject>),
    object: DynamicObject,
) -> anyhow::Result<()> {
    let name = object.metadata.name.clone().context("barrier name")?;
    from.create(&PostParams::default(), &object).await?;
    wait_object(to, &name, CONVERGE, "the barrier crosses", |o| o.is_some(), || t.logs()).await?;
    let status = json!({"status": {"health": {"status": "Healthy"}}});
    // The side that owns the Application writes its status: the spoke in both modes.
    let spoke_side = if std::ptr::eq(from, hub) { to } else { from };
    spoke_side.patch(&name, &PatchParams::default(), &Patch::Merge(status)).await?;
    wait_object(hub, &name, CONVERGE, "the barrier's status reaches the hub", health_is("Healthy"), || t.logs()).await
}

/// Nothing loops on Application `name`: once a first round trip has flushed what was in flight, its
/// resourceVersion on both sides stays the same across a second one (an agent writing a field
/// the server prunes or defaults, seeing a diff and writing again, would change it). `managed`
/// says which side owns it; the barrier Applications go into `barrier_ns` on the owner's side.
///
/// # Errors
/// A barrier does not cross in time, or `name` changed: the error shows both versions.
pub async fn assert_quiet(
    t: &Topology,
    hub: &Api<DynamicObject>,
    spoke: &Api<DynamicObject>,
    name: &str,
    managed: bool,
    barrier_ns: &str,
) -> anyhow::Result<()> {
    let sides = if managed { (hub, spoke) } else { (spoke, hub) };
    round_trip(t, hub, sides, app_with_path(&format!("{name}-settle"), barrier_ns, "b")?).await?;
    let (hub_before, spoke_before) = (hub.get(name).await?, spoke.get(name).await?);
    round_trip(t, hub, sides, app_with_path(&format!("{name}-quiet"), barrier_ns, "b")?).await?;
    let (hub_after, spoke_after) = (hub.get(name).await?, spoke.get(name).await?);
    let rv = |o: &DynamicObject| o.metadata.resource_version.clone().unwrap_or_default();
    anyhow::ensure!(
        rv(&hub_before) == rv(&hub_after) && rv(&spoke_before) == rv(&spoke_after),
        "{name} kept changing after it converged: a write loop\nhub before: {}\nhub after: {}\nspoke before: {}\nspoke after: {}\n{}",
        serde_json::to_string(&hub_before)?,
        serde_json::to_string(&hub_after)?,
        serde_json::to_string(&spoke_before)?,
        serde_json::to_string(&spoke_after)?,
        t.logs()
    );
    Ok(())
}
