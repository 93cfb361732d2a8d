//! Which agent a cache key belongs to (upstream §5.2, §4.9).
//!
//! Only Argo CD's per-Application keys ([`AppCacheKey`]: managed resources, resource trees)
//! can belong to an agent; every other key stays on the hub's Redis.
//! * Namespace-based mapping: the agent is the Application's namespace, when the principal
//!   admits that namespace as an agent's (upstream takes any namespace; a key of a hub-local
//!   Application in some other namespace then went to an agent that does not exist).
//! * Destination-based mapping: the agent the hub Application maps to (its
//!   `spec.destination.name`, or the namespace of an autonomous agent's copy), looked up in
//!   the principal's cache; a key without a namespace is of an Application in the principal's
//!   namespace. An Application the principal does not know stays on the hub's Redis.

use protocol::payload::{AppCacheKey, AppCacheKind};

use crate::sync::hub::Hub;

/// A key that belongs to an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AgentKey {
    /// The agent.
    pub(super) agent: String,
    /// What the key holds.
    pub(super) kind: AppCacheKind,
    /// Whether its value is gzip.
    pub(super) gzip: bool,
}

/// The agent `key` belongs to, if any.
pub(super) fn agent_key(hub: &Hub, key: &[u8]) -> Option<AgentKey> {
    let key = std::str::from_utf8(key).ok()?;
    let parsed = AppCacheKey::parse(key)?;
    let agent = if hub.config.destination_based_mapping {
        let namespace = parsed.namespace.unwrap_or(&hub.config.namespace);
        let app = hub.seen_apps.get(&(namespace.to_owned(), parsed.name.to_owned()))?;
        hub.agent_of(&app)?.to_owned()
    } else {
        let namespace = parsed.namespace?;
        if !hub.config.admits(namespace) {
            return None;
        }
        namespace.to_owned()
    };
    Some(AgentKey { agent, kind: parsed.kind, gzip: parsed.gzip })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PrincipalConfig;

    #[tokio::test]
    async fn namespace_mapping_routes_admitted_namespaces_only() {
        let mut config = PrincipalConfig::new("argocd");
        config.allowed_namespaces = vec!["agent-*".into()];
        let hub = Hub::offline(config);
        let routed = agent_key(&hub, b"app|resources-tree|agent-a_guestbook|1.8.3.gz").expect("agent key");
        assert_eq!(routed, AgentKey { agent: "agent-a".into(), kind: AppCacheKind::ResourcesTree, gzip: true });
        let sub = agent_key(&hub, b"app|managed-resources|agent-b_app|1.8.3").expect("agent key");
        assert_eq!((sub.agent.as_str(), sub.kind, sub.gzip), ("agent-b", AppCacheKind::ManagedResources, false));
        for hub_key in [
            &b"app|resources-tree|guestbook|1.8.3.gz"[..],
            b"app|resources-tree|team-x_guestbook|1.8.3.gz",
            b"app|resources-tree|argocd_guestbook|1.8.3.gz",
            b"mfst|x|agent-a_app|1.8.3.gz",
            b"\xff",
        ] {
            assert_eq!(agent_key(&hub, hub_key), None, "{}", String::from_utf8_lossy(hub_key));
        }
    }

    #[tokio::test]
    async fn destination_mapping_looks_the_application_up() {
        let mut config = PrincipalConfig::new("argocd");
        config.allowed_namespaces = vec!["*".into()];
        config.destination_based_mapping = true;
        let hub = Hub::offline(config);
        let app = |ns: &str, name: &str, dest: &str| -> protocol::argocd::Application {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": {"namespace": ns, "name": name},
                "spec": {"destination": {"name": dest}, "project": "default", "source": {"repoURL": "r"}},
            }))
            .expect("application")
        };
        for a in [app("argocd", "web", "spoke-1"), app("team-a", "api", "spoke-2")] {
            let key = crate::sync::hub::key_of(&a.metadata);
            let _ = hub.seen_apps.observed(key, &a);
        }
        assert_eq!(agent_key(&hub, b"app|resources-tree|web|1.8.3.gz").map(|k| k.agent).as_deref(), Some("spoke-1"));
        assert_eq!(
            agent_key(&hub, b"app|managed-resources|team-a_api|1.8.3").map(|k| k.agent).as_deref(),
            Some("spoke-2")
        );
        assert_eq!(agent_key(&hub, b"app|resources-tree|team-a_unknown|1.8.3.gz"), None, "not the principal's");
    }
}
