//! Repository and repo-creds secrets in managed mode (upstream §4.5): a secret of the principal
//! namespace labelled `argocd.argoproj.io/secret-type: repository|repo-creds` with a non-empty
//! `data.project` goes, credentials included, to every managed agent that project matches;
//! project changes and changes of the secret's own project move it; autonomous agents never
//! get one. The decisions and their bookkeeping live in [`crate::sync::hub::RepoIndex`].

use std::collections::BTreeSet;

use protocol::argocd::{AppProject, Secret};

use crate::config::AgentMode;
use crate::sync::hub::Hub;
use crate::sync::rules::matches_agent;

/// The hub AppProject that decides where `repo` goes: the one it names, unless `repo` is left out.
fn project_of(hub: &Hub, repo: &Secret) -> Option<AppProject> {
    if hub.excluded(&repo.metadata) {
        return None;
    }
    repo.project().and_then(|p| hub.seen_projects.get(&p))
}

/// Whether `repo` belongs on `agent`: it names a project, the hub has that project, and the
/// project matches the agent (the same rule as for the project itself).
pub(crate) fn belongs_on(hub: &Hub, repo: &Secret, agent: &str) -> bool {
    project_of(hub, repo).is_some_and(|p| matches_agent(&p, agent, hub.config.mapping()))
}

/// The connected-since-start managed agents `repo` belongs on.
pub(crate) fn targets(hub: &Hub, repo: &Secret) -> BTreeSet<String> {
    let Some(project) = project_of(hub, repo) else { return BTreeSet::new() };
    hub.peers
        .all()
        .into_iter()
        .filter(|s| s.mode() == AgentMode::Managed && matches_agent(&project, s.name(), hub.config.mapping()))
        .map(|s| s.name().to_owned())
        .collect()
}

/// The watch shows a repository secret (new, changed, or listed again).
pub(crate) fn hub_repo_changed(hub: &Hub, repo: &Secret) {
    if repo.project().is_none() || hub.excluded(&repo.metadata) {
        // Not scoped to a project (any more), or left out: not distributed; copies sent
        // earlier go.
        hub_repo_deleted(hub, repo);
        return;
    }
    let mut shipper = hub.shipper();
    hub.repos.observed(repo, &targets(hub, repo), |agent, ty, r| shipper.ship(agent, ty, r));
}

/// The watch shows a repository secret deleted.
pub(crate) fn hub_repo_deleted(hub: &Hub, repo: &Secret) {
    let mut shipper = hub.shipper();
    hub.repos.deleted(repo, &targets(hub, repo), |agent, ty, r| shipper.ship(agent, ty, r));
}

/// A hub AppProject changed or was deleted: its repositories follow its matching agents.
pub(crate) fn project_changed(hub: &Hub, project: &str) {
    let mut shipper = hub.shipper();
    hub.repos.retarget(
        |r| r.project().as_deref() == Some(project),
        |r| targets(hub, r),
        |agent, ty, r| shipper.ship(agent, ty, r),
    );
}
