//! The spoke watcher on AppProjects.
//!
//! * managed: principal-owned AppProjects edited or deleted locally are restored from the
//!   copy last received from the principal;
//! * autonomous: every AppProject goes up (`create`, `spec-update`, `delete`); the principal
//!   keeps a renamed copy (§4.4).
//!
//! Re-lists are handled as in [`super::watch`].

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent};
use protocol::argocd::AppProject;
use protocol::{EventType, Target};
use tokio_util::sync::CancellationToken;

use super::{Spoke, clear_server_fields};
use crate::config::AgentMode;
use crate::outbound::lock;

/// Watches the spoke's AppProjects until `cancel` fires.
pub(crate) async fn run_projects(spoke: Arc<Spoke>, cancel: CancellationToken) {
    let managed = spoke.config.mode == AgentMode::Managed;
    let stream = watcher::watcher(spoke.projects.api(Some(spoke.ns())), watcher::Config::default()).default_backoff();
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
                tracing::warn!(error = %e, "spoke AppProject watch failed; retrying with backoff");
                continue;
            }
            Some(Ok(ev)) => ev,
        };
        let decode = |obj: &kube::api::DynamicObject| match spoke.projects.decode::<AppProject>(obj) {
            // Managed: only principal-owned projects; autonomous: all of them.
            Ok(p) => (!managed || p.metadata.source_uid().is_some()).then_some(p),
            Err(e) => {
                tracing::warn!(error = %e, "skipping a spoke AppProject that does not decode");
                None
            }
        };
        match event {
            WatchEvent::Init => relisted = Some(HashSet::new()),
            WatchEvent::InitApply(obj) | WatchEvent::Apply(obj) => {
                let Some(p) = decode(&obj) else { continue };
                if let Some(seen) = relisted.as_mut() {
                    seen.insert(p.metadata.name.clone().unwrap_or_default());
                }
                applied(&spoke, p).await;
            }
            WatchEvent::InitDone => {
                let Some(seen) = relisted.take() else { continue };
                let known = if managed { &spoke.project_source } else { &spoke.sent_projects };
                let gone: Vec<AppProject> =
                    lock(known).iter().filter(|(k, _)| !seen.contains(*k)).map(|(_, v)| v.clone()).collect();
                for p in gone {
                    deleted(&spoke, p).await;
                }
            }
            WatchEvent::Delete(obj) => {
                if let Some(p) = decode(&obj) {
                    deleted(&spoke, p).await;
                }
            }
        }
    }
}

async fn applied(spoke: &Spoke, project: AppProject) {
    let name = project.metadata.name.clone().unwrap_or_default();
    if spoke.config.mode == AgentMode::Autonomous {
        let mut bare = project.clone();
        bare.metadata.resource_version = None;
        bare.metadata.extra.remove("managedFields");
        let prev = lock(&spoke.sent_projects).insert(name, bare.clone());
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
    let source = lock(&spoke.project_source).get(&name).cloned();
    match source {
        Some(src) if src.spec != project.spec => {
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
        Some(_) => {}
        None => {
            lock(&spoke.project_source).insert(name, project);
        }
    }
}

async fn deleted(spoke: &Spoke, project: AppProject) {
    let name = project.metadata.name.clone().unwrap_or_default();
    if spoke.config.mode == AgentMode::Autonomous {
        lock(&spoke.sent_projects).remove(&name);
        spoke.send_object(EventType::Delete, Target::AppProject, &project.metadata, &project);
        return;
    }
    if lock(&spoke.expected_project_deletes).remove(&name) {
        lock(&spoke.project_source).remove(&name);
        return;
    }
    let Some(mut src) = lock(&spoke.project_source).get(&name).cloned() else { return };
    tracing::info!(project = %name, "recreating a principal-owned AppProject deleted locally");
    clear_server_fields(&mut src.metadata);
    if let Err(e) = spoke.projects.create(spoke.ns(), &name, &src).await {
        tracing::warn!(project = %name, error = %e, "cannot recreate deleted AppProject");
    }
}
