//! The spoke watcher on Applications in the agent's namespace.
//!
//! * managed: local spec edits of principal-owned Applications are reverted, unexpected
//!   deletions recreated, and status/operation changes reported (`status-update`);
//! * autonomous: every change goes up (`create`, `spec-update` with the full object,
//!   `delete`).
//!
//! Recovery ([`link::watch`]): on a re-list, Applications known before and not listed
//! again were deleted during the gap and are handled as deletions.

use std::sync::Arc;

use kube::api::DynamicObject;
use kube::runtime::watcher;
use link::Gone;
use link::watch::Index;
use protocol::argocd::Application;
use protocol::{EventType, Target};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::{AppKey, Spoke, app_key, clear_server_fields};
use crate::config::{AgentMode, RecreateAction};

/// The spoke's Applications, by name.
pub(crate) struct Applications<'a>(pub(crate) &'a Spoke);

impl Index for Applications<'_> {
    type Object = DynamicObject;
    type Item = Application;
    type Key = AppKey;

    fn what(&self) -> &str {
        "spoke Application"
    }
    /// Only Applications in the namespaces the agent keeps them in.
    fn decode(&self, obj: &DynamicObject) -> Option<Application> {
        let ns = obj.metadata.namespace.as_deref().unwrap_or_default();
        self.0.config.app_namespace_allowed(ns).then(|| self.0.apps.decode_or_skip(obj, self.what())).flatten()
    }
    fn key(app: &Application) -> AppKey {
        app_key(&app.metadata)
    }
    async fn apply(&self, app: Application) {
        applied(self.0, app).await;
    }
    async fn delete(&self, app: Application) {
        deleted(self.0, app).await;
    }
    /// Managed: the principal's copies; autonomous: what was sent up.
    fn known(&self) -> Vec<Application> {
        match self.0.config.mode {
            AgentMode::Managed => self.0.managed.sources(),
            AgentMode::Autonomous => self.0.sent.values(),
        }
    }
}

/// Watches the spoke's Applications until `cancel` fires.
pub(crate) async fn run_applications(spoke: Arc<Spoke>, cancel: CancellationToken) {
    let api = spoke.apps.api(spoke.app_scope());
    link::watch::run(&Applications(&spoke), api, watcher::Config::default(), &cancel).await;
}

async fn applied(spoke: &Spoke, app: Application) {
    let known = match spoke.config.mode {
        AgentMode::Managed => spoke.reported.contains(&app_key(&app.metadata)),
        AgentMode::Autonomous => spoke.sent.contains(app.metadata.name.as_deref().unwrap_or_default()),
    };
    let operation = if known { "update" } else { "create" };
    let span = crate::otel::spoke_event_span(&spoke.config, "Application", operation, &app.metadata);
    applied_in_span(spoke, app).instrument(span).await;
}

async fn applied_in_span(spoke: &Spoke, app: Application) {
    let name = app.metadata.name.clone().unwrap_or_default();
    match spoke.config.mode {
        AgentMode::Managed => {
            if app.metadata.source_uid().is_none() {
                return; // not from the principal: none of our business
            }
            managed_applied(spoke, app).await;
        }
        AgentMode::Autonomous => {
            if spoke.excluded(&app.metadata) {
                let prev = spoke.sent.remove(&name);
                if prev.is_some() {
                    spoke.send_object(EventType::Delete, Target::Application, &app.metadata, &app);
                }
                return;
            }
            let prev = spoke.sent.insert(name, app.clone());
            let ty = match prev {
                None => EventType::Create,
                Some(p) if changed_for_principal(&p, &app) => EventType::SpecUpdate,
                Some(_) => return,
            };
            spoke.send_object(ty, Target::Application, &app.metadata, &app);
        }
    }
}

/// Whether anything the principal mirrors differs (everything but server bookkeeping).
fn changed_for_principal(a: &Application, b: &Application) -> bool {
    let strip = |app: &Application| {
        let mut c = app.clone();
        c.metadata.resource_version = None;
        c.metadata.generation = None;
        c.metadata.extra.remove("managedFields");
        c
    };
    strip(a) != strip(b)
}

async fn managed_applied(spoke: &Spoke, app: Application) {
    if app.is_being_deleted() {
        return;
    }
    let key = app_key(&app.metadata);
    let (ns, name) = (&key.0, &key.1);
    if let Some(src) = spoke.managed.source_or_adopt(&key, &app)
        && src.spec != app.spec
    {
        tracing::info!(app = %name, "reverting a local spec edit of a principal-owned Application");
        let result = spoke
            .apps
            .update::<Application, _>(ns, name, |cur| {
                let changed = cur.spec != src.spec;
                cur.spec.clone_from(&src.spec);
                changed
            })
            .await;
        if let Err(e) = result {
            tracing::warn!(app = %name, error = %e, "cannot revert local edit");
        }
    }
    let now = (app.status.clone(), app.operation.clone());
    let before = spoke.reported.insert(key.clone(), now.clone());
    if before.as_ref() != Some(&now) {
        spoke.send_app(EventType::StatusUpdate, &app);
    }
}

async fn deleted(spoke: &Spoke, app: Application) {
    let span = crate::otel::spoke_event_span(&spoke.config, "Application", "delete", &app.metadata);
    deleted_in_span(spoke, app).instrument(span).await;
}

async fn deleted_in_span(spoke: &Spoke, app: Application) {
    let name = app.metadata.name.clone().unwrap_or_default();
    match spoke.config.mode {
        AgentMode::Managed => {
            if app.metadata.source_uid().is_none() {
                return;
            }
            let key = app_key(&app.metadata);
            spoke.reported.remove(&key);
            // Until the restore below is written, no `delete` from the principal is applied:
            // one that was applied first has made this deletion expected or forgotten.
            let _applying = spoke.applying.lock().await;
            let mut src = match spoke.managed.deleted(&key) {
                Gone::Expected => {
                    spoke.send_app(EventType::Delete, &app);
                    return;
                }
                Gone::Restore(src) => src,
                Gone::Unknown => return,
            };
            tracing::info!(app = %name, "recreating a principal-owned Application deleted locally");
            clear_server_fields(&mut src.metadata);
            // As upstream, the Application comes back as it was, status included, with what
            // --on-application-recreate asks for.
            src.status.clone_from(&app.status);
            match spoke.config.on_recreate {
                RecreateAction::Ignore => {}
                RecreateAction::ClearStatus => {
                    if let Some(status) = src.status.as_mut() {
                        status.operation_state = None;
                    }
                }
                RecreateAction::Resync => src.operation = Some(serde_json::json!({"sync": {}})),
            }
            if let Err(e) = spoke.apps.create(&key.0, &name, &src).await {
                tracing::warn!(app = %name, error = %e, "cannot recreate deleted Application");
            }
        }
        AgentMode::Autonomous => {
            if spoke.sent.remove(&name).is_some() || !spoke.excluded(&app.metadata) {
                spoke.send_object(EventType::Delete, Target::Application, &app.metadata, &app);
            }
        }
    }
}
