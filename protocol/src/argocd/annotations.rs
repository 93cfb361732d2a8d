//! Annotation and label keys argocd-agent reads and writes (upstream's `internal/manager` and `pkg/types`; docs/compatibility.md).

/// The UID of the object on the source-of-truth side this copy was made from.
pub const SOURCE_UID: &str = "argocd.argoproj.io/source-uid";
/// The identity of the principal an agent copy came from.
pub const PRINCIPAL_UID: &str = "argocd.argoproj.io/principal-uid";
/// Set when the agent remapped an Application's namespace (destination-based mapping).
pub const NAMESPACE_REMAPPED: &str = "argocd.argoproj.io/namespace-remapped";
/// Per-resource override of `--source-uid-mismatch-policy`.
pub const SOURCE_UID_MISMATCH_POLICY: &str = "argocd.argoproj.io/source-uid-mismatch-policy";
/// Per-resource override of `--adoption-policy`.
pub const ADOPTION_POLICY: &str = "argocd.argoproj.io/adoption-policy";
/// When the principal last wrote the object (RFC 3339), stamped on every principal write of an
/// agent's data to the hub: a managed agent's status (and its errors), an autonomous agent's
/// Application and AppProject copies. Upstream's key (`internal/manager/application` and
/// `internal/manager/appproject`, `LastUpdatedAnnotation`, the same since v0.5.0).
pub const LAST_UPDATED: &str = "argocd-agent.argoproj.io/last-updated";
/// The key earlier versions of ours stamped instead of [`LAST_UPDATED`]. Still read
/// (`ObjectMeta::last_updated`, and left out of comparisons beside it); `ObjectMeta::stamp_last_updated` removes it,
/// so an object stamped by an earlier version moves to upstream's key on its next write.
pub const LEGACY_LAST_UPDATED: &str = "argocd-agent.argoproj-labs.io/last-updated";
/// Both `last-updated` keys, for code that must treat them alike (bookkeeping, not content).
pub const LAST_UPDATED_KEYS: [&str; 2] = [LAST_UPDATED, LEGACY_LAST_UPDATED];
/// The agent a cluster secret belongs to.
pub const AGENT_NAME: &str = "argocd-agent.argoproj-labs.io/agent-name";
/// Marks a cluster secret created by self-registration.
pub const SELF_REGISTERED_CLUSTER: &str = "argocd-agent.argoproj-labs.io/self-registered-cluster";
/// Excludes an object from synchronisation.
pub const IGNORE_SYNC: &str = "argocd-agent.argoproj-labs.io/ignore-sync";
/// Argo CD's skip-reconcile annotation.
pub const SKIP_RECONCILE: &str = "argocd.argoproj.io/skip-reconcile";
/// Argo CD notifications state, owned by the principal.
pub const NOTIFIED: &str = "notified.notifications.argoproj.io";
/// Argo CD's refresh request, mirrored between the two sides.
pub const REFRESH: &str = "argocd.argoproj.io/refresh";
/// Argo CD's resource tracking id.
pub const TRACKING_ID: &str = "argocd.argoproj.io/tracking-id";
/// kubectl's last-applied configuration, stripped by the agent.
pub const LAST_APPLIED_CONFIGURATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// The label selecting repository secrets (`repository` or `repo-creds`).
pub const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argocd::ObjectMeta;

    #[test]
    fn last_updated_is_upstreams_key_and_the_earlier_one_is_still_read() {
        assert_eq!(LAST_UPDATED, "argocd-agent.argoproj.io/last-updated");
        let mut meta = ObjectMeta::default();
        assert_eq!(meta.last_updated(), None);
        meta.set_annotation(LEGACY_LAST_UPDATED, "2026-01-01T00:00:00Z");
        assert_eq!(meta.last_updated(), Some("2026-01-01T00:00:00Z"), "stamped by an earlier version of ours");
        meta.stamp_last_updated("2026-12-02T12:00:00Z");
        assert_eq!(meta.annotation(LAST_UPDATED), Some("2026-12-02T12:00:00Z"));
        assert_eq!(meta.annotation(LEGACY_LAST_UPDATED), None, "the earlier key moves to upstream's");
        assert_eq!(meta.last_updated(), Some("2026-12-02T12:00:00Z"));
        meta.set_annotation(LEGACY_LAST_UPDATED, "2026-01-01T00:00:00Z");
        assert_eq!(meta.last_updated(), Some("2026-12-02T12:00:00Z"), "upstream's key first");
    }
}
