//! A stand-in for Argo CD's application controller, for the quickstart only: there is no
//! Argo CD here, so something must play the spoke's controller and report status. It marks
//! every Application on a spoke Synced/Healthy at a revision derived from its source, the way
//! the real controller would after a successful sync. It never touches the hub.

use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use sha2::Digest as _;

/// The status the simulated controller reports for an Application spec.
fn desired_status(app: &DynamicObject) -> Value {
    let source = &app.data["spec"]["source"];
    let revision = hex::encode(&sha2::Sha256::digest(source.to_string().as_bytes())[..20]);
    json!({
        "sync": {
            "status": "Synced",
            "revision": revision,
            "comparedTo": {"source": source, "destination": app.data["spec"]["destination"]},
        },
        "health": {"status": "Healthy"},
        "reconciledAt": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    })
}

fn up_to_date(app: &DynamicObject, desired: &Value) -> bool {
    let status = &app.data["status"];
    status["sync"]["status"] == "Synced"
        && status["sync"]["revision"] == desired["sync"]["revision"]
        && status["health"]["status"] == "Healthy"
}

/// Run until the task is dropped: watch the spoke's Applications and report them synced.
pub async fn run(apps: Api<DynamicObject>, spoke: String) {
    let mut events = watcher(apps.clone(), watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        let app = match event {
            Ok(watcher::Event::Apply(app) | watcher::Event::InitApply(app)) => app,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(%spoke, error = %e, "simulated controller watch error (retrying)");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        if app.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let desired = desired_status(&app);
        if up_to_date(&app, &desired) {
            continue;
        }
        let Some(name) = app.metadata.name.clone() else { continue };
        let patch = json!({"status": desired});
        match apps.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                tracing::info!(%spoke, app = %name, "simulated application controller (not Argo CD): marked Synced/Healthy")
            }
            Err(e) => {
                tracing::debug!(%spoke, app = %name, error = %e, "simulated controller could not write status (will retry on the next event)")
            }
        }
    }
}
