//! Principal state that must survive a restart, kept in the hub's Kubernetes API.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};

/// The ConfigMap holding the principal's persistent identity (upstream
/// `pkg/principal/identity.go`).
pub const IDENTITY_CONFIG_MAP: &str = "argocd-agent-principal-identity";
/// The key of the principal UID in [`IDENTITY_CONFIG_MAP`].
pub const IDENTITY_KEY: &str = "principal-uid";

/// The principal UID could not be read or stored.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot read or create ConfigMap {namespace}/{IDENTITY_CONFIG_MAP} holding the principal UID \
     (does namespace {namespace} exist, and may the principal read and create ConfigMaps there?): {source}"
)]
pub struct IdentityError {
    /// The principal namespace.
    pub namespace: String,
    /// The client error.
    #[source]
    pub source: kube::Error,
}

/// Returns the principal UID, creating it once (a random UUID) if the ConfigMap is missing.
///
/// # Errors
///
/// [`IdentityError`] when the hub API cannot be read or written.
pub async fn ensure_principal_uid(client: &kube::Client, namespace: &str) -> Result<String, IdentityError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let err = |source| IdentityError { namespace: namespace.to_owned(), source };
    for _ in 0..3 {
        if let Some(cm) = api.get_opt(IDENTITY_CONFIG_MAP).await.map_err(err)? {
            if let Some(uid) = cm.data.as_ref().and_then(|d| d.get(IDENTITY_KEY)).filter(|u| !u.is_empty()) {
                return Ok(uid.clone());
            }
            // Present but empty: fill it in.
            let uid = uuid::Uuid::new_v4().to_string();
            let mut cm = cm;
            cm.data.get_or_insert_with(BTreeMap::new).insert(IDENTITY_KEY.into(), uid.clone());
            match api.replace(IDENTITY_CONFIG_MAP, &PostParams::default(), &cm).await {
                Ok(_) => return Ok(uid),
                Err(kube::Error::Api(s)) if s.is_conflict() => continue,
                Err(e) => return Err(err(e)),
            }
        }
        let uid = uuid::Uuid::new_v4().to_string();
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(IDENTITY_CONFIG_MAP.into());
        cm.metadata.namespace = Some(namespace.into());
        cm.data = Some(BTreeMap::from([(IDENTITY_KEY.to_owned(), uid.clone())]));
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => return Ok(uid),
            Err(kube::Error::Api(s)) if s.is_already_exists() => continue,
            Err(e) => return Err(err(e)),
        }
    }
    Err(err(kube::Error::Service("principal UID ConfigMap kept changing while it was being created".into())))
}

pub use protocol::kube_store::ensure_namespace;
