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

/// `(namespace, name)` of a spoke Application.
pub(crate) type AppKey = (String, String);

/// The key of an Application's metadata.
pub(crate) fn app_key(meta: &protocol::argocd::ObjectMeta) -> AppKey {
    (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

/// Where a principal's Application is kept on the spoke ([`Spoke::app_namespace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement<'a> {
    /// The spoke namespace.
    pub(crate) namespace: &'a str,
    /// Moved from the principal's namespace to the agent's (annotated
    /// `argocd.argoproj.io/namespace-remapped=true`).
    pub(crate) remapped: bool,
}

/// Whether a spoke Application was moved here from the principal's namespace.
pub(crate) fn is_remapped(meta: &protocol::argocd::ObjectMeta) -> bool {
    meta.annotation(protocol::argocd::annotations::NAMESPACE_REMAPPED) == Some("true")
}

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
    pub(crate) managed: Copies<AppKey, Application>,
    /// Managed: status and operation last reported per Application.
    pub(crate) reported: Known<AppKey, Reported>,
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
    /// Held while an event from the principal is applied, and while the watcher restores a
    /// principal-owned Application deleted here: a `delete` from the principal and the restore
    /// of the same Application's local deletion never interleave (upstream #1056: deleted on
    /// both sides at once, it was recreated here forever).
    pub(crate) applying: tokio::sync::Mutex<()>,
    /// The connection of the current (or last) event stream: pod logs and terminals open their
    /// own calls on it, as upstream's agent does ([`Spoke::side_channel`]).
    pub(crate) principal: Mutex<Option<tonic::transport::Channel>>,
}

impl Spoke {
    pub(crate) fn new(config: AgentConfig, client: kube::Client) -> Self {
        if config.destination_based_mapping && config.principal_namespace.as_deref().unwrap_or_default().is_empty() {
            tracing::warn!(
                "the principal's namespace is not known (no Authenticate answer): Applications from it keep their namespace here instead of moving to this agent's"
            );
        }
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
            applying: tokio::sync::Mutex::new(()),
            principal: Mutex::new(None),
        }
    }

    /// The connection to the principal to open a side call on (`StreamLogs`, `StreamTerminal`)
    /// and the credentials every call carries; `None` before the first stream was accepted.
    pub(crate) fn side_channel(&self) -> Option<(tonic::transport::Channel, Option<crate::credentials::MetadataFn>)> {
        let channel = link::lock(&self.principal).clone()?;
        Some((channel, self.config.credentials.clone()))
    }

    pub(crate) fn ns(&self) -> &str {
        &self.config.namespace
    }

    /// The principal's namespace, when known ([`AgentConfig::principal_namespace`]).
    pub(crate) fn principal_namespace(&self) -> Option<&str> {
        self.config.principal_namespace.as_deref().filter(|ns| !ns.is_empty())
    }

    /// Where a managed Application from the principal lives here: the agent's namespace, or
    /// under destination-based mapping the hub namespace it names, if allowed here; one in the
    /// principal's namespace, when that is not the agent's, is kept in the agent's namespace
    /// instead (remapped, upstream §4.2).
    pub(crate) fn app_namespace<'a>(
        &'a self,
        named: Option<&'a str>,
    ) -> Result<Placement<'a>, crate::error::InboundError> {
        if !self.config.destination_based_mapping {
            return Ok(Placement { namespace: self.ns(), remapped: false });
        }
        let ns = named.filter(|n| !n.is_empty()).unwrap_or(self.ns());
        if ns != self.ns() && self.principal_namespace() == Some(ns) {
            return Ok(Placement { namespace: self.ns(), remapped: true });
        }
        if self.config.app_namespace_allowed(ns) {
            Ok(Placement { namespace: ns, remapped: false })
        } else {
            Err(crate::error::InboundError::NamespaceNotAllowed { namespace: ns.to_owned() })
        }
    }

    /// Whether `existing`, a spoke Application kept `at` a place, is the copy of another hub
    /// Application than the one placed there: under destination-based mapping, one moved from the
    /// principal's namespace and one of the agent's own namespace, of one name, share a place.
    pub(crate) fn holds_other(&self, existing: &protocol::argocd::ObjectMeta, at: Placement<'_>) -> bool {
        self.config.destination_based_mapping && existing.source_uid().is_some() && is_remapped(existing) != at.remapped
    }

    /// The hub namespace of a spoke Application: the principal's for one remapped here (see
    /// [`Self::app_namespace`]), its own otherwise. A remapped one whose principal namespace is
    /// not known keeps its namespace (its annotation still tells the principal).
    pub(crate) fn hub_namespace<'a>(&'a self, meta: &'a protocol::argocd::ObjectMeta) -> &'a str {
        let ns = meta.namespace.as_deref().unwrap_or_default();
        match self.principal_namespace() {
            Some(principal) if is_remapped(meta) && ns == self.ns() => principal,
            _ => ns,
        }
    }

    /// A spoke Application's metadata as the principal knows it: in its hub namespace, the
    /// remapping annotation kept (a principal strips it; one that does not know it still finds
    /// the Application by namespace).
    pub(crate) fn hub_meta(&self, meta: &protocol::argocd::ObjectMeta) -> protocol::argocd::ObjectMeta {
        let mut out = meta.clone();
        out.namespace = Some(self.hub_namespace(meta).to_owned());
        out
    }

    /// Queues an Application event for the principal, naming the Application as the principal
    /// knows it ([`Self::hub_meta`]).
    pub(crate) fn send_app(&self, ty: EventType, app: &Application) {
        if self.hub_namespace(&app.metadata) == app.metadata.namespace.as_deref().unwrap_or_default() {
            self.send_object(ty, Target::Application, &app.metadata, app);
        } else {
            let mut hub = app.clone();
            hub.metadata = self.hub_meta(&app.metadata);
            self.send_object(ty, Target::Application, &hub.metadata, &hub);
        }
    }

    /// The namespaces the Application watcher and resync read: one, or all under
    /// destination-based mapping (filtered by [`AgentConfig::app_namespace_allowed`]).
    pub(crate) fn app_scope(&self) -> Option<&str> {
        (!self.config.destination_based_mapping).then(|| self.ns())
    }

    /// Lists the spoke's Applications in every allowed namespace.
    pub(crate) async fn list_apps(&self) -> Result<Vec<Application>, protocol::kube_store::StoreError> {
        let apps = match self.app_scope() {
            Some(ns) => self.apps.list::<Application>(ns).await?,
            None => self.apps.list_all::<Application>().await?,
        };
        Ok(apps
            .into_iter()
            .filter(|a| self.config.app_namespace_allowed(a.metadata.namespace.as_deref().unwrap_or_default()))
            .collect())
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

impl crate::host::Host for Spoke {
    fn config(&self) -> &AgentConfig {
        &self.config
    }
    fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }
    fn application(&self, namespace: &str, name: &str) -> Option<Application> {
        match self.config.mode {
            crate::config::AgentMode::Managed => self.managed.source(&(namespace.to_owned(), name.to_owned())),
            crate::config::AgentMode::Autonomous => {
                self.sent.get(name).filter(|a| a.metadata.namespace.as_deref().unwrap_or(self.ns()) == namespace)
            }
        }
    }
}
