//! The spoke watcher on AppProjects.
//!
//! * managed: principal-owned AppProjects edited or deleted locally are restored from the
//!   copy last received from the principal;
//! * autonomous: every AppProject goes up (`create`, `spec-update`, `delete`); the principal
//!   keeps a renamed copy (§4.4).
//!
//! Re-lists are handled by [`link::watch`].

use std::sync::Arc;

use kube::api::DynamicObject;
use kube::runtime::watcher;
use link::Gone;
use link::watch::Index;
use protocol::argocd::AppProject;
use protocol::{EventType, Target};
use tokio_util::sync::CancellationToken;

use super::{Spoke, clear_server_fields};
use crate::config::AgentMode;

/// The spoke's AppProjects, by name: managed, only principal-owned ones; autonomous, all.
pub(crate) struct Projects<'a>(pub(crate) &'a Spoke);

impl Index for Projects<'_> {
    type Object = DynamicObject;
    type Item = AppProject;
    type Key = String;

    fn what(&self) -> &str {
        "spoke AppProject"
    }
    fn decode(&self, obj: &DynamicObject) -> Option<AppProject> {
        let managed = self.0.config.mode == AgentMode::Managed;
        self.0
            .projects
            .decode_or_skip::<AppProject>(obj, self.what())
            .filter(|p| !managed || p.metadata.source_uid().is_some())
    }
    fn key(p: &AppProject) -> String {
        p.metadata.name.clone().unwrap_or_default()
    }
    async fn apply(&self, p: AppProject) {
        applied(self.0, p).await;
    }
    async fn delete(&self, p: AppProject) {
        deleted(self.0, p).await;
    }
    /// Managed: the principal's copies; autonomous: what was sent up.
    fn known(&self) -> Vec<AppProject> {
        match self.0.config.mode {
            AgentMode::Managed => self.0.managed_projects.sources(),
            AgentMode::Autonomous => self.0.sent_projects.values(),
        }
    }
}

/// Watches the spoke's AppProjects until `cancel` fires.
pub(crate) async fn run_projects(spoke: Arc<Spoke>, cancel: CancellationToken) {
    let api = spoke.projects.api(Some(spoke.ns()));
    link::watch::run(&Projects(&spoke), api, watcher::Config::default(), &cancel).await;
}

async fn applied(spoke: &Spoke, project: AppProject) {
    let name = project.metadata.name.clone().unwrap_or_default();
    if spoke.config.mode == AgentMode::Autonomous {
        if spoke.excluded(&project.metadata) {
            if spoke.sent_projects.remove(&name).is_some() {
                spoke.send_object(EventType::Delete, Target::AppProject, &project.metadata, &project);
            }
            return;
        }
        let mut bare = project.clone();
        bare.metadata.resource_version = None;
        bare.metadata.extra.remove("managedFields");
        let prev = spoke.sent_projects.insert(name, bare.clone());
        let ty = match prev {
            None => EventType::Create,
            Some(p) if p != bare => EventType::SpecUpdate,
            Some(_) => return,
        };
        spoke.send_object(ty, Target::AppProject, &project.metadata, &project);
        return;
    }
    if project.metadata.deletion_timestamp.is_some() {
        return;
    }
    if let Some(src) = spoke.managed_projects.source_or_adopt(&name, &project)
        && src.spec != project.spec
    {
        tracing::info!(project = %name, "reverting a local edit of a principal-owned AppProject");
        let result = spoke
            .projects
            .update::<AppProject, _>(spoke.ns(), &name, |cur| {
                let changed = cur.spec != src.spec;
                cur.spec.clone_from(&src.spec);
                changed
            })
            .await;
        if let Err(e) = result {
            tracing::warn!(project = %name, error = %e, "cannot revert local AppProject edit");
        }
    }
}

async fn deleted(spoke: &Spoke, project: AppProject) {
    let name = project.metadata.name.clone().unwrap_or_default();
    if spoke.config.mode == AgentMode::Autonomous {
        if spoke.sent_projects.remove(&name).is_some() || !spoke.excluded(&project.metadata) {
            spoke.send_object(EventType::Delete, Target::AppProject, &project.metadata, &project);
        }
        return;
    }
    let Gone::Restore(mut src) = spoke.managed_projects.deleted(&name) else { return };
    tracing::info!(project = %name, "recreating a principal-owned AppProject deleted locally");
    clear_server_fields(&mut src.metadata);
    if let Err(e) = spoke.projects.create(spoke.ns(), &name, &src).await {
        tracing::warn!(project = %name, error = %e, "cannot recreate deleted AppProject");
    }
}
