//! Event routing per agent mode: what a hub change sends to an agent, and what an agent's
//! event changes on the hub.

pub mod autonomous;
pub mod gpg;
pub mod managed;
pub mod project;
pub mod repository;

use protocol::argocd::Application;
use protocol::argocd::annotations::{LAST_UPDATED, NOTIFIED, REFRESH};

/// Whether a hub Application is the copy of an autonomous agent's Application (it carries the
/// `source-uid` annotation the principal stamps on such copies).
pub(crate) fn is_autonomous_copy(app: &Application) -> bool {
    app.metadata.source_uid().is_some()
}

/// Whether the parts the source of truth owns (spec, labels, annotations other than the
/// bookkeeping ones, finalizers, deletion) differ.
pub(crate) fn owned_parts_differ(a: &Application, b: &Application) -> bool {
    let annotations = |app: &Application| {
        let mut m = app.metadata.annotations.clone().unwrap_or_default();
        for k in [LAST_UPDATED, NOTIFIED, REFRESH] {
            m.remove(k);
        }
        m
    };
    a.spec != b.spec
        || a.metadata.labels.clone().unwrap_or_default() != b.metadata.labels.clone().unwrap_or_default()
        || annotations(a) != annotations(b)
        || a.metadata.finalizers.clone().unwrap_or_default() != b.metadata.finalizers.clone().unwrap_or_default()
        || a.metadata.deletion_timestamp != b.metadata.deletion_timestamp
}

/// Whether the operation was just requested (absent before, present now).
pub(crate) fn operation_appeared(prev: Option<&Application>, cur: &Application) -> bool {
    cur.operation.is_some() && prev.is_none_or(|p| p.operation.is_none())
}

/// Whether the operation just entered phase `Terminating`.
pub(crate) fn termination_requested(prev: Option<&Application>, cur: &Application) -> bool {
    cur.is_terminating() && !prev.is_some_and(Application::is_terminating)
}

/// Clears the fields a new copy must not carry over from the object it was made from.
pub(crate) fn clear_server_fields(m: &mut protocol::argocd::ObjectMeta) {
    m.uid = None;
    m.resource_version = None;
    m.generation = None;
    m.creation_timestamp = None;
    m.deletion_timestamp = None;
    m.owner_references = None;
    m.extra.remove("managedFields");
    m.extra.remove("deletionGracePeriodSeconds");
}

/// Whether the refresh annotation (`argocd.argoproj.io/refresh`) was just set: a refresh
/// request the hub's user or Argo CD makes, forwarded to the agent.
pub(crate) fn refresh_requested(prev: Option<&Application>, cur: &Application) -> bool {
    cur.metadata.annotation(REFRESH).is_some() && prev.is_none_or(|p| p.metadata.annotation(REFRESH).is_none())
}
