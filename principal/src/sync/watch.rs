//! Hub watchers (kube-runtime `watcher`) for Applications (all namespaces, filtered to agent
//! namespaces) and AppProjects (principal namespace).
//!
//! Recovery: the watcher re-lists after errors and 410 Gone. A re-list is bracketed by
//! `Init`..`InitDone`; objects the principal knew that the re-list did not return were deleted
//! during the gap and are handled as deletions then (upstream drops such tombstones, §10.11).
//! The principal knows an Application from the watch, or from a resync's live read that sent it
//! to an agent before the watch showed it; one of the latter the re-list did not return is
//! deleted only once the hub confirms it is gone (the re-list may be older than that read).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kube::api::DynamicObject;
use kube::runtime::watcher;
use link::watch::Index;
use protocol::argocd::core::{GPG_KEYS_CONFIG_MAP, gpg_keys_selector, repository_selector};
use protocol::argocd::{AppProject, Application, ConfigMap, Secret};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::hub::{Hub, Key, key_of};
use crate::sync::route::{autonomous, gpg, managed, project, repository};
use crate::sync::rules::is_autonomous_copy;

/// Hub Applications in agent namespaces, as the routes see them.
pub(crate) struct Applications<'a>(pub(crate) &'a Hub);

impl Index for Applications<'_> {
    type Object = DynamicObject;
    type Item = Application;
    type Key = Key;

    fn what(&self) -> &str {
        "hub Application"
    }
    /// Only Applications in the namespaces the principal routes from
    /// ([`crate::config::PrincipalConfig::watches_app_namespace`]).
    fn decode(&self, obj: &DynamicObject) -> Option<Application> {
        let ns = obj.metadata.namespace.as_deref().unwrap_or_default();
        self.0.config.watches_app_namespace(ns).then(|| self.0.apps.decode_or_skip(obj, self.what())).flatten()
    }
    fn key(app: &Application) -> Key {
        key_of(&app.metadata)
    }
    async fn apply(&self, app: Application) {
        app_applied(self.0, app).await;
    }
    async fn delete(&self, app: Application) {
        app_deleted(self.0, app).await;
    }
    fn known(&self) -> Vec<Application> {
        self.0.seen_apps.all()
    }
    fn synced(&self) {
        self.0.apps_synced.store(true, Ordering::Relaxed);
    }
}

/// Watches hub Applications until `cancel` fires.
pub(crate) async fn run_applications(hub: Arc<Hub>, cancel: CancellationToken) {
    let api = hub.apps.api(None);
    link::watch::run(&Applications(&hub), api, watcher::Config::default(), &cancel).await;
}

async fn app_applied(hub: &Hub, app: Application) {
    let operation = if hub.seen_apps.contains(&key_of(&app.metadata)) { "update" } else { "create" };
    let span = crate::otel::hub_event_span("Application", operation, &app.metadata);
    app_applied_in_span(hub, app).instrument(span).await;
}

async fn app_applied_in_span(hub: &Hub, app: Application) {
    let key = key_of(&app.metadata);
    if !is_autonomous_copy(&app) && hub.excluded(&app.metadata) {
        if let Some(prev) = hub.seen_apps.forget(&key) {
            managed::hub_app_deleted(hub, &prev);
        }
        return;
    }
    let prev = hub.seen_apps.observed(key.clone(), &app);
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
    if hub.seen_apps.only_shipped(&key) && still_on_the_hub(hub, &key, &app).await {
        return; // a re-list older than the live read that sent it: the watch shows it next
    }
    let seen = hub.seen_apps.forget(&key);
    if seen.is_none() && !is_autonomous_copy(&app) && hub.excluded(&app.metadata) {
        return; // never distributed: nothing to delete anywhere
    }
    if is_autonomous_copy(&app) {
        if let Err(e) = autonomous::hub_copy_deleted(hub, &app).await {
            tracing::warn!(agent = %key.0, app = %key.1, error = %e, "cannot recreate a deleted hub copy");
        }
    } else {
        managed::hub_app_deleted(hub, &app);
    }
}

/// Whether the hub still has `app` (the same incarnation), read live. An Application an agent
/// was sent from a live read the watch had not shown ([`super::index::AppIndex::shipped_unwatched`])
/// and a re-list did not return was deleted while the watch was down, or the re-list is older
/// than that read; only the hub can tell which. When it cannot be read the Application is kept:
/// a wrong delete would remove a live Application on the agent, a kept one is settled by the
/// next re-list or the agent's periodic resync.
async fn still_on_the_hub(hub: &Hub, key: &Key, app: &Application) -> bool {
    let live = hub.apps.get::<Application>(&key.0, &key.1).await;
    same_incarnation(live.map(|l| l.map(|l| l.metadata)), &app.metadata, "Application")
}

/// [`still_on_the_hub`] for an AppProject of the principal namespace.
async fn project_still_on_the_hub(hub: &Hub, name: &str, p: &AppProject) -> bool {
    let live = hub.projects.get::<AppProject>(&hub.config.namespace, name).await;
    same_incarnation(live.map(|l| l.map(|l| l.metadata)), &p.metadata, "AppProject")
}

/// Whether a live read found the object of `shipped` (same UID); `true` when it failed.
fn same_incarnation(
    live: Result<Option<protocol::argocd::ObjectMeta>, protocol::kube_store::StoreError>,
    shipped: &protocol::argocd::ObjectMeta,
    kind: &str,
) -> bool {
    match live {
        Ok(live) => live.is_some_and(|live| live.uid == shipped.uid),
        Err(e) => {
            tracing::warn!(namespace = ?shipped.namespace, name = ?shipped.name, error = %e,
                "a re-list did not return an {kind} an agent was sent from a live read, and the hub cannot be \
                 read to tell whether it was deleted; kept until the next re-list");
            true
        }
    }
}

/// Hub AppProjects in the principal namespace.
pub(crate) struct Projects<'a>(pub(crate) &'a Hub);

impl Index for Projects<'_> {
    type Object = DynamicObject;
    type Item = AppProject;
    type Key = String;

    fn what(&self) -> &str {
        "hub AppProject"
    }
    fn decode(&self, obj: &DynamicObject) -> Option<AppProject> {
        self.0.projects.decode_or_skip(obj, self.what())
    }
    fn key(p: &AppProject) -> String {
        p.metadata.name.clone().unwrap_or_default()
    }
    async fn apply(&self, p: AppProject) {
        if self.0.excluded(&p.metadata) {
            // Left out (now): agents that had it lose it, as if it were deleted.
            if let Some(prev) = self.0.seen_projects.remove(&Self::key(&p)) {
                let _span = crate::otel::hub_event_span("AppProject", "delete", &p.metadata).entered();
                project::hub_project_deleted(self.0, &prev);
                repository::project_changed(self.0, &Self::key(&prev));
            }
            return;
        }
        let prev = self.0.seen_projects.insert(Self::key(&p), p.clone());
        let operation = if prev.is_some() { "update" } else { "create" };
        let _span = crate::otel::hub_event_span("AppProject", operation, &p.metadata).entered();
        project::hub_project_changed(self.0, prev.as_ref(), &p);
        // After the project's own events, so an agent gets a project before its repositories.
        repository::project_changed(self.0, &Self::key(&p));
    }
    async fn delete(&self, p: AppProject) {
        let name = Self::key(&p);
        if self.0.seen_projects.only_shipped(&name) && project_still_on_the_hub(self.0, &name, &p).await {
            return; // a re-list older than the live read that sent it: the watch shows it next
        }
        if self.0.seen_projects.remove(&name).is_none() && self.0.excluded(&p.metadata) {
            return;
        }
        let _span = crate::otel::hub_event_span("AppProject", "delete", &p.metadata).entered();
        project::hub_project_deleted(self.0, &p);
        repository::project_changed(self.0, &Self::key(&p));
    }
    fn known(&self) -> Vec<AppProject> {
        self.0.seen_projects.values()
    }
    fn synced(&self) {
        self.0.projects_synced.store(true, Ordering::Relaxed);
    }
}

/// Watches AppProjects in the principal namespace until `cancel` fires.
pub(crate) async fn run_projects(hub: Arc<Hub>, cancel: CancellationToken) {
    let api = hub.projects.api(Some(&hub.config.namespace));
    link::watch::run(&Projects(&hub), api, watcher::Config::default(), &cancel).await;
}

/// Repository and repo-creds secrets in the principal namespace.
pub(crate) struct Repositories<'a>(pub(crate) &'a Hub);

impl Index for Repositories<'_> {
    type Object = DynamicObject;
    type Item = Secret;
    type Key = String;

    fn what(&self) -> &str {
        "hub repository secret"
    }
    fn decode(&self, obj: &DynamicObject) -> Option<Secret> {
        self.0.secrets.decode_or_skip::<Secret>(obj, self.what()).filter(Secret::is_repository)
    }
    fn key(s: &Secret) -> String {
        s.metadata.name.clone().unwrap_or_default()
    }
    async fn apply(&self, s: Secret) {
        let operation = if self.0.repos.get(&Self::key(&s)).is_some() { "update" } else { "create" };
        let _span = crate::otel::hub_event_span("Repository", operation, &s.metadata).entered();
        repository::hub_repo_changed(self.0, &s);
    }
    async fn delete(&self, s: Secret) {
        let _span = crate::otel::hub_event_span("Repository", "delete", &s.metadata).entered();
        repository::hub_repo_deleted(self.0, &s);
    }
    fn known(&self) -> Vec<Secret> {
        self.0.repos.all()
    }
    fn synced(&self) {
        self.0.repos_synced.store(true, Ordering::Relaxed);
    }
}

/// Watches repository secrets in the principal namespace until `cancel` fires.
pub(crate) async fn run_repositories(hub: Arc<Hub>, cancel: CancellationToken) {
    let api = hub.secrets.api(Some(&hub.config.namespace));
    let config = watcher::Config::default().labels(&repository_selector());
    link::watch::run(&Repositories(&hub), api, config, &cancel).await;
}

/// The GPG keys ConfigMap of the principal namespace.
pub(crate) struct GpgKeys<'a>(pub(crate) &'a Hub);

impl Index for GpgKeys<'_> {
    type Object = DynamicObject;
    type Item = ConfigMap;
    type Key = String;

    fn what(&self) -> &str {
        "hub GPG keys ConfigMap"
    }
    fn decode(&self, obj: &DynamicObject) -> Option<ConfigMap> {
        self.0
            .config_maps
            .decode_or_skip::<ConfigMap>(obj, self.what())
            .filter(|c| c.metadata.name.as_deref() == Some(GPG_KEYS_CONFIG_MAP))
    }
    fn key(c: &ConfigMap) -> String {
        c.metadata.name.clone().unwrap_or_default()
    }
    async fn apply(&self, c: ConfigMap) {
        let _span = crate::otel::hub_event_span("GPGKey", "update", &c.metadata).entered();
        gpg::hub_gpg_changed(self.0, &c);
    }
    async fn delete(&self, c: ConfigMap) {
        let _span = crate::otel::hub_event_span("GPGKey", "delete", &c.metadata).entered();
        gpg::hub_gpg_deleted(self.0, &c);
    }
    fn known(&self) -> Vec<ConfigMap> {
        self.0.gpg.all()
    }
    fn synced(&self) {
        self.0.gpg_synced.store(true, Ordering::Relaxed);
    }
}

/// Watches the GPG keys ConfigMap of the principal namespace until `cancel` fires.
pub(crate) async fn run_gpg_keys(hub: Arc<Hub>, cancel: CancellationToken) {
    let api = hub.config_maps.api(Some(&hub.config.namespace));
    let config = watcher::Config::default().fields(&gpg_keys_selector());
    link::watch::run(&GpgKeys(&hub), api, config, &cancel).await;
}
