//! Hub watchers (kube-runtime `watcher`) for Applications (all namespaces, filtered to agent
//! namespaces) and AppProjects (principal namespace).
//!
//! Recovery: the watcher re-lists after errors and 410 Gone. A re-list is bracketed by
//! `Init`..`InitDone`; objects the principal knew that the re-list did not return were deleted
//! during the gap and are handled as deletions then (upstream drops such tombstones, §10.11).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent};
use protocol::argocd::{AppProject, Application};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Hub, Key, key_of};
use crate::route::{autonomous, is_autonomous_copy, is_ignored, managed, project};
use crate::session::lock;

/// Watches hub Applications until `cancel` fires.
pub(crate) async fn run_applications(hub: Arc<Hub>, cancel: CancellationToken) {
    let stream = watcher::watcher(hub.apps.api(None), watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut relisted: Option<HashSet<Key>> = None;
    loop {
        let next = tokio::select! {
            () = cancel.cancelled() => return,
            next = stream.next() => next,
        };
        let event = match next {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "hub Application watch failed; retrying with backoff");
                continue;
            }
            Some(Ok(ev)) => ev,
        };
        match event {
            WatchEvent::Init => relisted = Some(HashSet::new()),
            WatchEvent::InitApply(obj) => {
                if let Some(app) = decode_app(&hub, &obj) {
                    if let Some(seen) = relisted.as_mut() {
                        seen.insert(key_of(&app.metadata));
                    }
                    app_applied(&hub, app).await;
                }
            }
            WatchEvent::InitDone => {
                hub.apps_synced.store(true, Ordering::Relaxed);
                let Some(seen) = relisted.take() else { continue };
                let gone: Vec<Application> =
                    lock(&hub.seen_apps).iter().filter(|(k, _)| !seen.contains(*k)).map(|(_, v)| v.clone()).collect();
                for app in gone {
                    app_deleted(&hub, app).await;
                }
            }
            WatchEvent::Apply(obj) => {
                if let Some(app) = decode_app(&hub, &obj) {
                    app_applied(&hub, app).await;
                }
            }
            WatchEvent::Delete(obj) => {
                if let Some(app) = decode_app(&hub, &obj) {
                    app_deleted(&hub, app).await;
                }
            }
        }
    }
}

fn decode_app(hub: &Hub, obj: &DynamicObject) -> Option<Application> {
    let ns = obj.metadata.namespace.as_deref().unwrap_or_default();
    if !hub.config.admits(ns) {
        return None;
    }
    match hub.apps.decode(obj) {
        Ok(app) => Some(app),
        Err(e) => {
            tracing::warn!(error = %e, "skipping a hub Application that does not decode");
            None
        }
    }
}

async fn app_applied(hub: &Hub, app: Application) {
    let operation = if lock(&hub.seen_apps).contains_key(&key_of(&app.metadata)) { "update" } else { "create" };
    let span = crate::otel::hub_event_span("Application", operation, &app.metadata);
    app_applied_in_span(hub, app).instrument(span).await;
}

async fn app_applied_in_span(hub: &Hub, app: Application) {
    let key = key_of(&app.metadata);
    if !is_autonomous_copy(&app) && is_ignored(&app) {
        let prev = lock(&hub.seen_apps).remove(&key);
        if let Some(prev) = prev {
            managed::hub_app_deleted(hub, &prev);
        }
        return;
    }
    let prev = lock(&hub.seen_apps).insert(key.clone(), app.clone());
    {
        // The watch has caught up with the principal's own status write: it is the base again.
        let mut written = lock(&hub.status_written);
        if written.get(&key).is_some_and(|w| app.metadata.resource_version.as_ref() == Some(&w.resource_version)) {
            written.remove(&key);
        }
    }
    if is_autonomous_copy(&app) {
        let span = tracing::info_span!("hub_app", agent = %key.0, app = %key.1, mode = "autonomous");
        if let Err(e) = autonomous::hub_copy_changed(hub, prev.as_ref(), &app).instrument(span).await {
            tracing::warn!(agent = %key.0, app = %key.1, error = %e, "cannot keep the hub copy in line with its agent");
        }
    } else {
        managed::hub_app_changed(hub, prev.as_ref(), &app);
    }
}

async fn app_deleted(hub: &Hub, app: Application) {
    let span = crate::otel::hub_event_span("Application", "delete", &app.metadata);
    app_deleted_in_span(hub, app).instrument(span).await;
}

async fn app_deleted_in_span(hub: &Hub, app: Application) {
    let key = key_of(&app.metadata);
    lock(&hub.seen_apps).remove(&key);
    lock(&hub.status_written).remove(&key);
    if is_autonomous_copy(&app) {
        if let Err(e) = autonomous::hub_copy_deleted(hub, &app).await {
            tracing::warn!(agent = %key.0, app = %key.1, error = %e, "cannot recreate a deleted hub copy");
        }
    } else {
        managed::hub_app_deleted(hub, &app);
    }
}

/// Watches AppProjects in the principal namespace until `cancel` fires.
pub(crate) async fn run_projects(hub: Arc<Hub>, cancel: CancellationToken) {
    let api = hub.projects.api(Some(&hub.config.namespace));
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut relisted: Option<HashSet<String>> = None;
    loop {
        let next = tokio::select! {
            () = cancel.cancelled() => return,
            next = stream.next() => next,
        };
        let event = match next {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "hub AppProject watch failed; retrying with backoff");
                continue;
            }
            Some(Ok(ev)) => ev,
        };
        let decode = |obj: &DynamicObject| match hub.projects.decode::<AppProject>(obj) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(error = %e, "skipping a hub AppProject that does not decode");
                None
            }
        };
        match event {
            WatchEvent::Init => relisted = Some(HashSet::new()),
            WatchEvent::InitApply(obj) | WatchEvent::Apply(obj) => {
                let Some(p) = decode(&obj) else { continue };
                let name = p.metadata.name.clone().unwrap_or_default();
                if let Some(seen) = relisted.as_mut() {
                    seen.insert(name.clone());
                }
                let prev = lock(&hub.seen_projects).insert(name, p.clone());
                let operation = if prev.is_some() { "update" } else { "create" };
                let _span = crate::otel::hub_event_span("AppProject", operation, &p.metadata).entered();
                project::hub_project_changed(&hub, prev.as_ref(), &p);
            }
            WatchEvent::InitDone => {
                hub.projects_synced.store(true, Ordering::Relaxed);
                let Some(seen) = relisted.take() else { continue };
                let mut known = lock(&hub.seen_projects);
                let gone: Vec<String> = known.keys().filter(|k| !seen.contains(*k)).cloned().collect();
                let gone: Vec<AppProject> = gone.iter().filter_map(|k| known.remove(k)).collect();
                drop(known);
                for p in gone {
                    project::hub_project_deleted(&hub, &p);
                }
            }
            WatchEvent::Delete(obj) => {
                let Some(p) = decode(&obj) else { continue };
                lock(&hub.seen_projects).remove(p.metadata.name.as_deref().unwrap_or_default());
                let _span = crate::otel::hub_event_span("AppProject", "delete", &p.metadata).entered();
                project::hub_project_deleted(&hub, &p);
            }
        }
    }
}
