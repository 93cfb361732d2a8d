//! Self-registration (`--enable-self-cluster-registration`, upstream §3.9,
//! `principal/registration/registration.go`): when an agent authenticates, the principal makes
//! sure the hub's Argo CD has a cluster secret for it, pointing at the resource proxy.
//!
//! * no `cluster-<agent>` secret: one is created as upstream writes it (labels `agent-name` and
//!   `self-registered-cluster=true`, annotation `skip-reconcile=true`, server
//!   `https://<resource-proxy-address>?agentName=<agent>`, config with a non-expiring
//!   resource-proxy bearer token for the agent and the shared client certificate, key and CA of
//!   `--self-registration-client-cert-secret`);
//! * a secret without the self-registered label (made by an operator or `agentctl agent
//!   create`): left alone;
//! * a self-registered secret: its bearer token is re-issued if it no longer verifies or names
//!   another agent (a new JWT key, a copied secret), its TLS data refreshed from the shared
//!   secret when that changed; nothing is written when nothing changed.
//!
//! A failure refuses the authentication (`Unauthenticated`), as upstream: an agent Argo CD
//! cannot reach would sync blind.

pub mod cluster_secret;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

use self::cluster_secret::{ClusterConfig, ClusterSecret, LABEL_SELF_REGISTERED};

/// How self-registration writes cluster secrets.
#[derive(Clone, Debug)]
pub struct SelfRegistration {
    /// The resource proxy's address as Argo CD reaches it (`--resource-proxy-address`).
    pub resource_proxy_address: String,
    /// The Secret (principal namespace) holding the shared client certificate Argo CD presents
    /// to the resource proxy: `tls.crt`, `tls.key`, `ca.crt`.
    pub client_cert_secret: String,
    /// Issues and verifies the resource-proxy bearer tokens.
    pub tokens: auth::SessionIssuer,
}

/// What registering an agent did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    /// A cluster secret was created.
    Created,
    /// The self-registered secret's token or TLS data was renewed.
    Refreshed,
    /// The self-registered secret was current.
    Current,
    /// A secret not made by self-registration exists: left alone.
    Manual,
}

/// Why an agent could not be registered; the message says what to fix.
#[derive(Debug, thiserror::Error)]
#[error("self-registration of agent {agent:?}: {reason}")]
pub struct RegistrationError {
    agent: String,
    reason: String,
}

impl SelfRegistration {
    /// Makes sure agent `agent` has its cluster secret in `namespace` (see the module docs).
    ///
    /// # Errors
    ///
    /// The shared client certificate cannot be read, a token cannot be issued, or the hub
    /// refuses the write.
    pub async fn ensure(
        &self,
        client: &kube::Client,
        namespace: &str,
        agent: &str,
    ) -> Result<Registered, RegistrationError> {
        let fail = |reason: String| RegistrationError { agent: agent.to_owned(), reason };
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let (cert, key, ca) = self.shared_material(&secrets).await.map_err(fail)?;
        let name = cluster_secret::secret_name(agent);
        // Two attempts: a create racing another connection of the agent, or an update racing
        // another writer, is read again once.
        for _ in 0..2 {
            let existing = secrets.get_opt(&name).await.map_err(|e| fail(format!("cannot read secret {name}: {e}")))?;
            let Some(existing) = existing else {
                let server = cluster_secret::server_url(&self.resource_proxy_address, agent)
                    .map_err(|e| fail(format!("{e} (--resource-proxy-address)")))?;
                let mut config =
                    ClusterConfig { bearer_token: self.token(agent).map_err(&fail)?, ..ClusterConfig::default() };
                config.tls_client_config.set(&cert, &key, &ca);
                let labels = BTreeMap::from([(LABEL_SELF_REGISTERED.to_owned(), "true".to_owned())]);
                let secret = ClusterSecret::new(namespace, agent, server, labels, config)
                    .to_secret()
                    .map_err(|e| fail(e.to_string()))?;
                match secrets.create(&PostParams::default(), &secret).await {
                    Ok(_) => return Ok(Registered::Created),
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => return Err(fail(format!("cannot create secret {name}: {e}"))),
                }
            };
            let mut cs = ClusterSecret::from_secret(existing).map_err(|e| fail(e.to_string()))?;
            if cs.label(LABEL_SELF_REGISTERED) != Some("true") {
                return Ok(Registered::Manual);
            }
            let mut changed = false;
            if !self.token_names(&cs.config.bearer_token, agent) {
                cs.config.bearer_token = self.token(agent).map_err(&fail)?;
                changed = true;
            }
            let tls = &cs.config.tls_client_config;
            if tls.cert_pem().as_deref() != Some(cert.as_str())
                || tls.key_pem().as_deref() != Some(key.as_str())
                || tls.ca_pem().as_deref() != Some(ca.as_str())
            {
                cs.config.tls_client_config.set(&cert, &key, &ca);
                changed = true;
            }
            if !changed {
                return Ok(Registered::Current);
            }
            let secret = cs.to_secret().map_err(|e| fail(e.to_string()))?;
            match secrets.replace(&name, &PostParams::default(), &secret).await {
                Ok(_) => return Ok(Registered::Refreshed),
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
                Err(e) => return Err(fail(format!("cannot update secret {name}: {e}"))),
            }
        }
        Err(fail(format!("secret {name} kept changing while it was written; the agent's next connection retries")))
    }

    fn token(&self, agent: &str) -> Result<String, String> {
        let name = auth::AgentName::new(agent).map_err(|e| e.to_string())?;
        self.tokens.issue_resource_proxy_token(&name).map_err(|e| format!("cannot issue a resource-proxy token: {e}"))
    }

    /// Whether `token` is a valid resource-proxy token for `agent`.
    fn token_names(&self, token: &str, agent: &str) -> bool {
        !token.is_empty()
            && self.tokens.verify(token, auth::TokenKind::ResourceProxy).is_ok_and(|v| v.agent.as_str() == agent)
    }

    /// `tls.crt`, `tls.key` and `ca.crt` of the shared client certificate secret.
    async fn shared_material(&self, secrets: &Api<Secret>) -> Result<(String, String, String), String> {
        let name = &self.client_cert_secret;
        let secret = secrets
            .get_opt(name)
            .await
            .map_err(|e| format!("cannot read secret {name} (--self-registration-client-cert-secret): {e}"))?
            .ok_or_else(|| format!("secret {name} (--self-registration-client-cert-secret) does not exist"))?;
        let field = |key: &str| -> Result<String, String> {
            let value =
                secret.data.as_ref().and_then(|d| d.get(key)).map(|b| String::from_utf8_lossy(&b.0).into_owned());
            value
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| format!("secret {name} (--self-registration-client-cert-secret) has no {key}"))
        };
        Ok((field("tls.crt")?, field("tls.key")?, field("ca.crt")?))
    }
}
