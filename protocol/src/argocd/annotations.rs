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
/// Stamped by the principal when it writes agent status.
pub const LAST_UPDATED: &str = "argocd-agent.argoproj-labs.io/last-updated";
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
