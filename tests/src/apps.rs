//! Checks on Applications and AppProjects that the cross-process sync tests share: typed access,
//! waiting until an object reaches a state, and the usual states.

use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};

use crate::fixtures::application_resource;
use crate::wait::wait_until_async;

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
