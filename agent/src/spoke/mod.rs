//! The spoke side's shared state: the Kubernetes stores, the outbox, and the caches the
//! watchers and inbound handlers keep.

pub mod projects;
pub mod shipped;
pub mod watch;

#[cfg(test)]
mod tests;

use std::sync::Mutex;

use link::{Copies, Known, Mailbox};
use protocol::argocd::Application;
use protocol::kube_store::ObjectStore;
use protocol::{Event, EventType, Target};

use crate::config::AgentConfig;

/// The status-related parts of an Application last reported to the principal.
pub(crate) type Reported = (Option<protocol::argocd::ApplicationStatus>, Option<serde_json::Value>);

/// Everything the agent's tasks share.
#[derive(Debug)]
pub(crate) struct Spoke {
    pub(crate) config: AgentConfig,
    pub(crate) apps: ObjectStore,
    pub(crate) projects: ObjectStore,
    pub(crate) secrets: ObjectStore,
    pub(crate) config_maps: ObjectStore,
    pub(crate) mailbox: Mailbox,
    /// Managed: each Application as last received from the principal (spoke form), by name,
    /// the source for reverting local edits and deletions (rebuilt from the spoke at startup),
    /// and the deletions the principal asked for.
    pub(crate) managed: Copies<String, Application>,
    /// Managed: status and operation last reported per Application.
    pub(crate) reported: Known<String, Reported>,
    /// Autonomous: each Application as last sent up.
    pub(crate) sent: Known<String, Application>,
    /// Managed: each AppProject as last received from the principal, by name, and the
    /// deletions the principal asked for.
    pub(crate) managed_projects: Copies<String, protocol::argocd::AppProject>,
    /// Managed: each repository secret as last received from the principal, by name, and
    /// the deletions the principal asked for.
    pub(crate) managed_repos: Copies<String, protocol::argocd::Secret>,
    /// Managed: the GPG keys ConfigMap as last received from the principal.
    pub(crate) managed_gpg: Copies<String, protocol::argocd::ConfigMap>,
    /// Autonomous: each AppProject as last sent up.
    pub(crate) sent_projects: Known<String, protocol::argocd::AppProject>,
    /// The principal UID seen on the latest event.
    pub(crate) principal_uid: Mutex<Option<String>>,
    /// Whether a stream is up.
    pub(crate) connected: std::sync::atomic::AtomicBool,
}

impl Spoke {
    pub(crate) fn new(config: AgentConfig, client: kube::Client) -> Self {
        Self {
            mailbox: Mailbox::new(config.retry.clone()),
            config,
            apps: ObjectStore::applications(client.clone()),
            projects: ObjectStore::app_projects(client.clone()),
            secrets: ObjectStore::secrets(client.clone()),
            config_maps: ObjectStore::config_maps(client),
            managed: Copies::default(),
            reported: Known::default(),
            sent: Known::default(),
            managed_projects: Copies::default(),
            managed_repos: Copies::default(),
            managed_gpg: Copies::default(),
            sent_projects: Known::default(),
            principal_uid: Mutex::new(None),
            connected: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(crate) fn ns(&self) -> &str {
        &self.config.namespace
    }

    /// Queues an object event for the principal.
    pub(crate) fn send_object<T: serde::Serialize>(
        &self,
        ty: EventType,
        target: Target,
        meta: &protocol::argocd::ObjectMeta,
        obj: &T,
    ) {
        match Event::for_object(ty, target, meta, obj) {
            Ok(ev) => {
                let mut ev = ev.with_source(format!("agent://{}", self.config.name));
                // The principal's span joins the trace of the spoke change at hand.
                protocol::otel::inject_current(&mut ev);
                self.mailbox.push(ev);
            }
            Err(e) => tracing::error!(error = %e, name = ?meta.name, "cannot encode event"),
        }
    }
}

/// Clears the fields a new copy must not carry over from the object it was made from.
pub(crate) fn clear_server_fields(meta: &mut protocol::argocd::ObjectMeta) {
    meta.uid = None;
    meta.resource_version = None;
    meta.generation = None;
    meta.creation_timestamp = None;
    meta.deletion_timestamp = None;
    meta.owner_references = None;
    meta.extra.remove("managedFields");
    meta.extra.remove("deletionGracePeriodSeconds");
}

impl Spoke {
    /// Whether an object this agent owns (autonomous) is left out of synchronisation: labelled
    /// `argocd-agent.argoproj-labs.io/ignore-sync=true` (upstream §4.10) or not matching
    /// `--label-selector`. Leaving out one the principal holds deletes it there.
    pub(crate) fn excluded(&self, meta: &protocol::argocd::ObjectMeta) -> bool {
        meta.left_out(self.config.label_selector.as_ref())
    }
}
