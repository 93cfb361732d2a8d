//! The periodic resync digest on a synthetic hub, in process (`principal/benches/periodic_resync.rs`),
//! beside the full scan it replaced: what a managed agent should hold found by going through
//! every Application, AppProject and repository secret of the hub, each checksum computed afresh.
//! The full scan is also the unit tests' reference for the digest the indexes give.

use kube::api::DynamicObject;
use kube::runtime::watcher::Event as WatchEvent;
use link::watch::{Index, drive};
use protocol::argocd::core::GPG_KEYS_CONFIG_MAP;
use protocol::checksum::Checksum;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::hub::{Hub, Shipped, app_entry, digest, project_entry};
use super::watch::{Applications, GpgKeys, Projects, Repositories};
use crate::config::PrincipalConfig;
use crate::sync::route::repository;
use crate::sync::rules::{self, is_autonomous_copy};

/// The principal namespace of the synthetic hub.
const NAMESPACE: &str = "argocd";

/// The digest of what managed `agent` should hold, by a full scan of the hub's caches.
pub(crate) fn full_scan_digest(hub: &Hub, agent: &str) -> Option<Checksum> {
    let held = |a: &protocol::argocd::Application| !is_autonomous_copy(a) && !hub.excluded(&a.metadata);
    let apps = if hub.config.destination_based_mapping {
        hub.seen_apps.matching(|_, a| held(a) && hub.agent_of(a) == Some(agent))
    } else {
        hub.seen_apps.matching(|(ns, _), a| ns == agent && held(a))
    };
    let mapping = hub.config.mapping();
    let projects = hub
        .seen_projects
        .values()
        .into_iter()
        .filter(|p| !hub.excluded(&p.metadata) && rules::matches_agent(p, agent, mapping));
    let repos = hub.repos.all().into_iter().filter(|r| repository::belongs_on(hub, r, agent));
    let gpg = hub.gpg.all().into_iter().filter(|c| !hub.excluded(&c.metadata));
    let entries: Vec<_> = (apps.iter().map(app_entry))
        .chain(projects.map(|p| project_entry(&p, agent, mapping)))
        .chain(repos.map(|r| r.digest_entry()))
        .chain(gpg.map(|c| c.digest_entry()))
        .map(std::sync::Arc::new)
        .collect();
    digest(&entries)
}

/// A synthetic hub: `agents` managed agents (`agent-<i>`), each with `apps_per_agent`
/// Applications, its own AppProject and a repository secret of that project; one more
/// AppProject (with its repository) matching every agent; the GPG keys ConfigMap.
#[derive(Debug, Clone, Copy)]
pub struct HubShape {
    /// Managed agents, `agent-0` on.
    pub agents: usize,
    /// Applications of each agent.
    pub apps_per_agent: usize,
    /// Applications in the principal namespace routed by `spec.destination.name`, instead of
    /// one namespace per agent.
    pub destination_mapping: bool,
}

/// A principal's hub state whose watches listed a [`HubShape`] (its API server is never
/// reached). Needs a tokio runtime.
#[derive(Debug)]
pub struct DigestBench {
    hub: Hub,
    shape: HubShape,
}

/// Name of the `i`th agent.
#[must_use]
pub fn agent(i: usize) -> String {
    format!("agent-{i}")
}

/// The object `value` describes (`None` never happens: every value here is a valid object).
fn object(value: serde_json::Value) -> Option<DynamicObject> {
    serde_json::from_value(value).ok()
}

fn application(shape: HubShape, agent: &str, j: usize, rv: u64) -> Option<DynamicObject> {
    let (namespace, name, destination) = if shape.destination_mapping {
        (NAMESPACE.to_owned(), format!("{agent}-app-{j}"), json!({"name": agent, "namespace": "default"}))
    } else {
        (
            agent.to_owned(),
            format!("app-{j}"),
            json!({"server": "https://kubernetes.default.svc", "namespace": "default"}),
        )
    };
    object(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}"),
                     "resourceVersion": rv.to_string()},
        "spec": {"project": format!("{agent}-project"),
                 "source": {"repoURL": "https://example.com/r.git", "path": format!("apps/{j}/v{rv}"),
                            "targetRevision": "HEAD"},
                 "destination": destination,
                 "syncPolicy": {"automated": {"prune": true, "selfHeal": true}}},
        "status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}},
    }))
}

fn app_project(name: &str, destination: &str) -> Option<DynamicObject> {
    object(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}"), "resourceVersion": "1"},
        "spec": {"sourceRepos": ["*"], "sourceNamespaces": ["*"],
                 "destinations": [{"name": destination, "namespace": "*", "server": "*"}]},
    }))
}

fn repository_secret(project: &str) -> Option<DynamicObject> {
    let name = format!("repo-{project}");
    object(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}"), "resourceVersion": "1",
                     "labels": {"argocd.argoproj.io/secret-type": "repository"}},
        "stringData": {"project": project, "url": format!("https://example.com/{project}.git")},
    }))
}

/// Feeds a watch's first list to an index.
async fn list<I: Index<Object = DynamicObject>>(index: &I, objects: Vec<DynamicObject>) {
    let events = std::iter::once(WatchEvent::Init)
        .chain(objects.into_iter().map(WatchEvent::InitApply))
        .chain([WatchEvent::InitDone])
        .map(Ok);
    drive(index, futures::stream::iter(events), &CancellationToken::new()).await;
}

impl DigestBench {
    /// Builds the hub and lists it as the principal's watches would.
    pub async fn new(shape: HubShape) -> Self {
        let mut config = PrincipalConfig::new(NAMESPACE);
        config.allowed_namespaces = vec!["agent-*".into()];
        config.destination_based_mapping = shape.destination_mapping;
        let hub = Hub::offline(config);
        let agents: Vec<String> = (0..shape.agents).map(agent).collect();
        let projects: Vec<DynamicObject> = (agents.iter().map(|a| app_project(&format!("{a}-project"), a)))
            .chain([app_project("shared", "agent-*")])
            .flatten()
            .collect();
        let repos: Vec<DynamicObject> = (agents.iter().map(|a| repository_secret(&format!("{a}-project"))))
            .chain([repository_secret("shared")])
            .flatten()
            .collect();
        let gpg = object(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": GPG_KEYS_CONFIG_MAP, "namespace": NAMESPACE, "uid": "uid-gpg", "resourceVersion": "1"},
            "data": {"4AEE18F83AFDEB23": "-----BEGIN PGP PUBLIC KEY BLOCK-----"},
        }));
        let apps: Vec<DynamicObject> = agents
            .iter()
            .flat_map(|a| (0..shape.apps_per_agent).filter_map(move |j| application(shape, a, j, 1)))
            .collect();
        list(&Projects(&hub), projects).await;
        list(&Repositories(&hub), repos).await;
        list(&GpgKeys(&hub), gpg.into_iter().collect()).await;
        list(&Applications(&hub), apps).await;
        Self { hub, shape }
    }

    /// The digest the principal answers a periodic resync of `agent` with, from its indexes.
    /// `None` also when it could not be computed (never once the hub is listed).
    pub async fn indexed_digest(&self, agent: &str) -> Option<Checksum> {
        crate::sync::resync::managed_digest(&self.hub, agent).await.ok().flatten()
    }

    /// The same digest by a full scan of the hub's caches (the way it was computed before the
    /// indexes by agent).
    #[must_use]
    pub fn full_scan_digest(&self, agent: &str) -> Option<Checksum> {
        full_scan_digest(&self.hub, agent)
    }

    /// The watch shows a new version `rv` (above 1) of the `j`th Application of `agent`, with
    /// another spec.
    pub async fn change_app(&self, agent: &str, j: usize, rv: u64) {
        let events = application(self.shape, agent, j, rv).map(|app| Ok(WatchEvent::Apply(app)));
        drive(&Applications(&self.hub), futures::stream::iter(events), &CancellationToken::new()).await;
    }
}
