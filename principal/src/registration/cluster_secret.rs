//! Argo CD cluster secrets for agents, written and read as upstream does (`cmd/ctl/agent.go`,
//! `internal/argocd/cluster/conversion.go`, Argo CD's `util/db/cluster.go`):
//!
//! - name `cluster-<agent>` in the principal's namespace, type `Opaque`;
//! - labels `argocd.argoproj.io/secret-type=cluster` (Argo CD finds clusters by it) and
//!   `argocd-agent.argoproj-labs.io/agent-name=<agent>` (the principal maps agents by it), plus
//!   any `-l` labels;
//! - annotations `managed-by=argocd-agent` and `argocd.argoproj.io/skip-reconcile=true` (Argo CD
//!   3.4+ then leaves the agent's Applications to the agent's own controller);
//! - data `server` (`https://<resource-proxy>?agentName=<agent>`), `name` (the agent) and `config`,
//!   the JSON of Argo CD's `ClusterConfig` (`tlsClientConfig.certData|keyData|caData` base64, as Go
//!   marshals `[]byte`).
//!
//! Fields this module does not know (in `config` and in the secret) are kept when it rewrites one.
//! `argocd-agentctl agent create` and the principal's self-registration both write them here.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;
use protocol::argocd::annotations;
use serde::{Deserialize, Serialize};

/// Label Argo CD selects cluster secrets by.
pub const LABEL_SECRET_TYPE: &str = annotations::SECRET_TYPE_LABEL;
/// Its value for clusters.
pub const SECRET_TYPE_CLUSTER: &str = "cluster";
/// Label mapping a cluster secret to its agent.
pub const LABEL_AGENT_NAME: &str = annotations::AGENT_NAME;
/// Label of cluster secrets created by the principal's self-registration.
pub const LABEL_SELF_REGISTERED: &str = annotations::SELF_REGISTERED_CLUSTER;
/// Annotation telling Argo CD (3.4+) not to reconcile Applications of this cluster.
pub const ANNOTATION_SKIP_RECONCILE: &str = annotations::SKIP_RECONCILE;
/// Argo CD's `managed-by` annotation.
pub const ANNOTATION_MANAGED_BY: &str = "managed-by";
/// Its value on secrets argocd-agent manages.
pub const MANAGED_BY_AGENT: &str = "argocd-agent";
/// A cluster secret or its parts that cannot be used; the message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ClusterSecretError(pub String);

macro_rules! bail {
    ($($arg:tt)*) => { return Err(ClusterSecretError(format!($($arg)*))) };
}

/// Kubernetes' generic Secret type.
pub const TYPE_OPAQUE: &str = "Opaque";
/// Upstream's default `--resource-proxy-server`.
pub const DEFAULT_RESOURCE_PROXY: &str = "argocd-agent-resource-proxy:9090";

/// The name of an agent's cluster secret.
#[must_use]
pub fn secret_name(agent: &str) -> String {
    format!("cluster-{agent}")
}

/// `https://<address>?agentName=<agent>` for a resource proxy at `host:port`, checked as upstream
/// checks it (an IP:port, or a DNS name and a port).
///
/// # Errors
/// The address or the agent name is invalid; the message says which.
pub fn server_url(address: &str, agent: &str) -> Result<String, ClusterSecretError> {
    if address.parse::<SocketAddr>().is_err() {
        let Some((host, port)) = address.split_once(':') else {
            bail!("invalid resource proxy address {address:?} (--resource-proxy-server): expected HOST:PORT");
        };
        if !is_dns_subdomain(host) {
            bail!(
                "invalid resource proxy address {address:?} (--resource-proxy-server): {host:?} is neither an IP \
                 address nor a DNS name"
            );
        }
        if port.parse::<u16>().is_err() {
            bail!("invalid port {port:?} in --resource-proxy-server {address:?}: expected 0-65535");
        }
    }
    if let Err(e) = auth::AgentName::new(agent) {
        bail!("{e}");
    }
    Ok(format!("https://{address}?agentName={agent}"))
}

/// A DNS-1123 subdomain: dot-separated labels of `[a-z0-9-]`, alphanumeric at both ends, ≤ 253.
fn is_dns_subdomain(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b.first().is_some_and(u8::is_ascii_alphanumeric)
                && b.last().is_some_and(u8::is_ascii_alphanumeric)
        })
}

/// Argo CD's `ClusterConfig`, the `config` field of a cluster secret.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterConfig {
    /// Basic-auth user for the resource proxy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub username: String,
    /// Basic-auth password.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub password: String,
    /// Bearer token (self-registered clusters carry a resource-proxy JWT here).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bearer_token: String,
    /// Client TLS settings.
    #[serde(default)]
    pub tls_client_config: TlsClientConfig,
    /// Everything else (`awsAuthConfig`, `execProviderConfig`, ...), kept as it is.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// Argo CD's `TLSClientConfig`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsClientConfig {
    /// Skip server certificate verification (Go always writes it).
    #[serde(default)]
    pub insecure: bool,
    /// Server name to verify.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub server_name: String,
    /// Client certificate, PEM.
    #[serde(default, skip_serializing_if = "bytes_empty")]
    pub cert_data: ByteString,
    /// Client key, PEM.
    #[serde(default, skip_serializing_if = "bytes_empty")]
    pub key_data: ByteString,
    /// CA certificates to verify the resource proxy with, PEM.
    #[serde(default, skip_serializing_if = "bytes_empty")]
    pub ca_data: ByteString,
    /// Anything else.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

fn bytes_empty(b: &ByteString) -> bool {
    b.0.is_empty()
}

impl TlsClientConfig {
    /// The client certificate PEM, if any.
    #[must_use]
    pub fn cert_pem(&self) -> Option<String> {
        text(&self.cert_data)
    }

    /// The client key PEM, if any.
    #[must_use]
    pub fn key_pem(&self) -> Option<String> {
        text(&self.key_data)
    }

    /// The CA PEM, if any.
    #[must_use]
    pub fn ca_pem(&self) -> Option<String> {
        text(&self.ca_data)
    }

    /// Set certificate, key and CA.
    pub fn set(&mut self, cert_pem: &str, key_pem: &str, ca_pem: &str) {
        self.cert_data = ByteString(cert_pem.as_bytes().to_vec());
        self.key_data = ByteString(key_pem.as_bytes().to_vec());
        self.ca_data = ByteString(ca_pem.as_bytes().to_vec());
    }
}

fn text(b: &ByteString) -> Option<String> {
    if b.0.is_empty() { None } else { Some(String::from_utf8_lossy(&b.0).into_owned()) }
}

/// An agent's cluster secret, decoded.
#[derive(Debug, Clone)]
pub struct ClusterSecret {
    /// The secret as read (or as to be created).
    pub secret: Secret,
    /// `data.server`.
    pub server: String,
    /// `data.name`.
    pub name: String,
    /// `data.config`.
    pub config: ClusterConfig,
}

impl ClusterSecret {
    /// A new cluster secret for `agent` in `namespace`, shaped as upstream's `agent create`.
    #[must_use]
    pub fn new(
        namespace: &str,
        agent: &str,
        server: String,
        extra_labels: BTreeMap<String, String>,
        config: ClusterConfig,
    ) -> Self {
        let mut labels = extra_labels;
        labels.insert(LABEL_AGENT_NAME.to_owned(), agent.to_owned());
        labels.insert(LABEL_SECRET_TYPE.to_owned(), SECRET_TYPE_CLUSTER.to_owned());
        let annotations = BTreeMap::from([
            (ANNOTATION_MANAGED_BY.to_owned(), MANAGED_BY_AGENT.to_owned()),
            (ANNOTATION_SKIP_RECONCILE.to_owned(), "true".to_owned()),
        ]);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(secret_name(agent)),
                namespace: Some(namespace.to_owned()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            type_: Some(TYPE_OPAQUE.to_owned()),
            ..Secret::default()
        };
        Self { secret, server, name: agent.to_owned(), config }
    }

    /// Decode a cluster secret.
    ///
    /// # Errors
    /// `config` is not valid JSON of Argo CD's `ClusterConfig`.
    pub fn from_secret(secret: Secret) -> Result<Self, ClusterSecretError> {
        let secret_name = secret.metadata.name.clone().unwrap_or_default();
        let field = |key: &str| {
            secret.data.as_ref().and_then(|d| d.get(key)).map(|b| String::from_utf8_lossy(&b.0).into_owned())
        };
        let server = field("server").unwrap_or_default();
        let name = field("name").unwrap_or_default();
        let config = match secret.data.as_ref().and_then(|d| d.get("config")) {
            Some(raw) if !raw.0.is_empty() => serde_json::from_slice(&raw.0).map_err(|e| {
                ClusterSecretError(format!(
                    "field \"config\" of cluster secret {secret_name} is not Argo CD cluster config JSON: {e}"
                ))
            })?,
            _ => ClusterConfig::default(),
        };
        Ok(Self { secret, server, name, config })
    }

    /// The secret with `server`, `name` and `config` written into its data (other data kept).
    ///
    /// # Errors
    /// The config does not serialize.
    pub fn to_secret(&self) -> Result<Secret, ClusterSecretError> {
        let mut secret = self.secret.clone();
        let data = secret.data.get_or_insert_with(BTreeMap::new);
        data.insert("server".to_owned(), ByteString(self.server.trim_end_matches('/').as_bytes().to_vec()));
        data.insert("name".to_owned(), ByteString(self.name.as_bytes().to_vec()));
        let config = serde_json::to_vec(&self.config)
            .map_err(|e| ClusterSecretError(format!("cannot encode the cluster config: {e}")))?;
        data.insert("config".to_owned(), ByteString(config));
        secret.string_data = None;
        Ok(secret)
    }

    /// The secret's name.
    #[must_use]
    pub fn secret_name(&self) -> &str {
        self.secret.metadata.name.as_deref().unwrap_or_default()
    }

    /// A label's value.
    #[must_use]
    pub fn label(&self, key: &str) -> Option<&str> {
        self.secret.metadata.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str)
    }

    /// An annotation's value.
    #[must_use]
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.secret.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
    }

    /// The agent this secret maps (the agent-name label).
    #[must_use]
    pub fn agent(&self) -> Option<&str> {
        self.label(LABEL_AGENT_NAME).filter(|a| !a.is_empty())
    }

    /// Whether Argo CD will skip reconciling this cluster's Applications.
    #[must_use]
    pub fn skips_reconcile(&self) -> bool {
        self.annotation(ANNOTATION_SKIP_RECONCILE) == Some("true")
    }

    /// A kubeconfig reaching this secret's cluster through the resource proxy with its
    /// credentials, as Argo CD uses them: the server URL, the CA, the client certificate and
    /// key, and the bearer token of a self-registered secret. JSON, which kubectl reads as YAML.
    ///
    /// # Errors
    /// The secret holds no CA (a client could not verify the proxy).
    pub fn kubeconfig(&self) -> Result<serde_json::Value, ClusterSecretError> {
        let tls = &self.config.tls_client_config;
        if tls.ca_data.0.is_empty() {
            return Err(ClusterSecretError(format!(
                "cluster secret {} has no config.tlsClientConfig.caData to verify the resource proxy with",
                self.secret_name()
            )));
        }
        let b64 = |bytes: &ByteString| serde_json::to_value(bytes).unwrap_or_default();
        let mut user = serde_json::Map::new();
        if !tls.cert_data.0.is_empty() {
            user.insert("client-certificate-data".to_owned(), b64(&tls.cert_data));
            user.insert("client-key-data".to_owned(), b64(&tls.key_data));
        }
        if !self.config.bearer_token.is_empty() {
            user.insert("token".to_owned(), self.config.bearer_token.clone().into());
        }
        let name = if self.name.is_empty() { self.secret_name() } else { &self.name };
        Ok(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": self.server, "certificate-authority-data": b64(&tls.ca_data)}}],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
        }))
    }

    /// A kube-rs client for [`Self::kubeconfig`].
    ///
    /// # Errors
    /// As [`Self::kubeconfig`] and [`proxy_client`].
    pub async fn client(&self) -> Result<kube::Client, ClusterSecretError> {
        proxy_client(&self.kubeconfig()?).await
    }

    /// How Argo CD authenticates to the resource proxy with this secret.
    #[must_use]
    pub fn auth_kind(&self) -> &'static str {
        let c = &self.config;
        match (c.tls_client_config.cert_data.0.is_empty(), c.bearer_token.is_empty(), c.username.is_empty()) {
            (false, false, _) => "client-cert+token",
            (false, true, _) => "client-cert",
            (true, false, _) => "token",
            (true, true, false) => "basic",
            (true, true, true) => "none",
        }
    }
}

/// A kube-rs client for a kubeconfig reaching the resource proxy (as [`ClusterSecret::kubeconfig`]
/// writes, or kubectl reads). The `?agentName=` query of the server URL is dropped: kube-rs
/// appends request paths to the server URL, which would put them after the query, and the proxy
/// routes by credentials, not by the query (as upstream's).
///
/// # Errors
/// The kubeconfig is not one kube-rs reads, or its TLS material is unusable.
pub async fn proxy_client(kubeconfig: &serde_json::Value) -> Result<kube::Client, ClusterSecretError> {
    let bad = |e: &dyn std::fmt::Display| ClusterSecretError(format!("unusable resource-proxy kubeconfig: {e}"));
    let mut config: kube::config::Kubeconfig = serde_json::from_value(kubeconfig.clone()).map_err(|e| bad(&e))?;
    for c in &mut config.clusters {
        if let Some(server) = c.cluster.as_mut().and_then(|c| c.server.as_mut()) {
            server.truncate(server.find('?').unwrap_or(server.len()));
        }
    }
    let config = kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| bad(&e))?;
    kube::Client::try_from(config).map_err(|e| bad(&e))
}

/// Whether a secret is an agent's cluster secret: a cluster secret with the agent-name label or
/// upstream's `managed-by=argocd-agent` annotation.
#[must_use]
pub fn is_agent_cluster_secret(secret: &Secret) -> bool {
    let labels = secret.metadata.labels.as_ref();
    let cluster = labels.and_then(|l| l.get(LABEL_SECRET_TYPE)).is_some_and(|v| v == SECRET_TYPE_CLUSTER);
    let agent_label = labels.is_some_and(|l| l.contains_key(LABEL_AGENT_NAME));
    let managed = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_MANAGED_BY))
        .is_some_and(|v| v == MANAGED_BY_AGENT);
    cluster && (agent_label || managed)
}

/// `agentName` from a server URL's query.
#[must_use]
pub fn agent_name_param(server: &str) -> Option<&str> {
    let (_, query) = server.split_once('?')?;
    let query = query.split('#').next().unwrap_or_default();
    query.split('&').find_map(|pair| pair.strip_prefix("agentName=")).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_follow_upstream() {
        assert_eq!(server_url("192.168.1.100:8080", "a").unwrap(), "https://192.168.1.100:8080?agentName=a");
        assert_eq!(server_url("[::1]:8080", "a").unwrap(), "https://[::1]:8080?agentName=a");
        assert_eq!(
            server_url(DEFAULT_RESOURCE_PROXY, "agent-1").unwrap(),
            "https://argocd-agent-resource-proxy:9090?agentName=agent-1"
        );
        for bad in ["example.com", "invalid_host:8080", "host:70000", "h:", ""] {
            assert!(server_url(bad, "a").is_err(), "{bad}");
        }
        assert!(server_url("h:1", "Bad_Name").is_err());
    }

    #[test]
    fn agent_name_from_the_query() {
        assert_eq!(agent_name_param("https://x:1?agentName=a-1"), Some("a-1"));
        assert_eq!(agent_name_param("https://x:1?x=1&agentName=b#f"), Some("b"));
        assert_eq!(agent_name_param("https://x:1"), None);
        assert_eq!(agent_name_param("https://x:1?agentName="), None);
    }

    #[test]
    fn config_round_trips_as_go_writes_it() {
        // What upstream writes: []byte as base64, insecure always present, unknown fields kept.
        let json = concat!(
            r#"{"username":"u","tlsClientConfig":{"insecure":false,"certData":"Y2VydA==","keyData":"a2V5","#,
            r#""caData":"Y2E="},"awsAuthConfig":{"clusterName":"c"}}"#
        );
        let config: ClusterConfig = serde_json::from_str(json).unwrap();
        assert_eq!(config.tls_client_config.cert_pem().as_deref(), Some("cert"));
        assert_eq!(config.tls_client_config.ca_pem().as_deref(), Some("ca"));
        assert_eq!(config.username, "u");
        let back: serde_json::Value = serde_json::to_value(&config).unwrap();
        assert_eq!(back, serde_json::from_str::<serde_json::Value>(json).unwrap());
    }

    #[test]
    fn kubeconfig_carries_what_argo_cd_uses() {
        let mut config = ClusterConfig::default();
        config.tls_client_config.set("cert", "key", "ca");
        config.bearer_token = "jwt".into();
        let cs =
            ClusterSecret::new("argocd", "a-1", server_url("127.0.0.1:9090", "a-1").unwrap(), BTreeMap::new(), config);
        let kc = cs.kubeconfig().unwrap();
        assert_eq!(kc["clusters"][0]["cluster"]["server"], "https://127.0.0.1:9090?agentName=a-1");
        assert_eq!(kc["clusters"][0]["cluster"]["certificate-authority-data"], "Y2E=");
        assert_eq!(kc["users"][0]["user"]["client-certificate-data"], "Y2VydA==");
        assert_eq!(kc["users"][0]["user"]["token"], "jwt");
        assert_eq!(kc["current-context"], "a-1");

        let mut no_ca = cs.clone();
        no_ca.config.tls_client_config.ca_data = ByteString(Vec::new());
        let err = no_ca.kubeconfig().unwrap_err().to_string();
        assert!(err.contains("cluster-a-1") && err.contains("caData"), "{err}");
    }
}
