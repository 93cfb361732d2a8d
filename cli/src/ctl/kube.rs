//! Kubernetes access for argocd-agentctl: a client per kube context, and the few secret operations
//! the commands need (read, create-or-refuse, create-or-replace, delete).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// Build a client for `context` (None: the kubeconfig's current context).
///
/// The kubeconfig is `kubeconfig` when given, else what `KUBECONFIG` names (a `:`-separated list is
/// merged) or `~/.kube/config`; with neither a file nor a context, the in-cluster service account.
///
/// # Errors
/// The kubeconfig cannot be read, the context does not exist, or the client cannot be built.
pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> anyhow::Result<Client> {
    client_with_limit(kubeconfig, context, None).await
}

/// As [`client`], with at most `max_in_flight` requests in flight at once (watches included,
/// for as long as they run); the others wait their turn. Each request in flight can hold a
/// pooled connection to the API server, so this also bounds the connections: a burst of
/// thousands of agents must not become thousands of connections (and their TLS buffers).
///
/// # Errors
/// As [`client`].
pub async fn client_with_limit(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    max_in_flight: Option<usize>,
) -> anyhow::Result<Client> {
    let options = KubeConfigOptions { context: context.map(str::to_owned), ..KubeConfigOptions::default() };
    let what = context.map_or_else(|| "the current context".to_owned(), |c| format!("context {c:?}"));
    let config = match kubeconfig {
        Some(path) => {
            let kc =
                Kubeconfig::read_from(path).with_context(|| format!("cannot read --kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .with_context(|| format!("cannot use {what} of --kubeconfig {}", path.display()))?
        }
        None if context.is_some() => {
            Config::from_kubeconfig(&options).await.with_context(|| format!("cannot use {what} of the kubeconfig"))?
        }
        None => {
            Config::infer().await.context("no Kubernetes configuration found (pass --kubeconfig or set KUBECONFIG)")?
        }
    };
    let builder = kube::client::ClientBuilder::try_from(config)
        .with_context(|| format!("cannot build a Kubernetes client for {what}"))?;
    Ok(match max_in_flight {
        Some(n) => builder.with_layer(&tower::limit::ConcurrencyLimitLayer::new(n)).build(),
        None => builder.build(),
    })
}

/// Secrets of one namespace in one cluster, with names for messages.
#[derive(Clone)]
pub struct Secrets {
    api: Api<Secret>,
    namespace: String,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

/// What to do when the secret to write exists already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfExists {
    /// Fail with this hint.
    Refuse(&'static str),
    /// Replace type and data, keeping the rest of the existing object's metadata.
    Replace,
}

/// Whether a write created or replaced the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// It did not exist.
    Created,
    /// It existed and was replaced.
    Replaced,
}

impl Secrets {
    /// Secrets in `namespace` through `client`.
    #[must_use]
    pub fn new(client: Client, namespace: &str) -> Self {
        Self { api: Api::namespaced(client, namespace), namespace: namespace.to_owned() }
    }

    /// The namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Read a secret; `None` when it does not exist.
    ///
    /// # Errors
    /// The API call fails for another reason.
    pub async fn get(&self, name: &str) -> anyhow::Result<Option<Secret>> {
        self.api.get_opt(name).await.map_err(|e| self.api_error(e, "read", name))
    }

    /// Write a secret of `type_` with `data`, per `if_exists`.
    ///
    /// # Errors
    /// The secret exists and `if_exists` refuses, or an API call fails.
    pub async fn write(
        &self,
        name: &str,
        type_: &str,
        data: BTreeMap<String, Vec<u8>>,
        if_exists: IfExists,
    ) -> anyhow::Result<Written> {
        let data: BTreeMap<String, ByteString> = data.into_iter().map(|(k, v)| (k, ByteString(v))).collect();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            type_: Some(type_.to_owned()),
            data: Some(data.clone()),
            ..Secret::default()
        };
        match self.api.create(&PostParams::default(), &secret).await {
            Ok(_) => return Ok(Written::Created),
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(e) => return Err(self.api_error(e, "create", name)),
        }
        if let IfExists::Refuse(hint) = if_exists {
            bail!("secret {}/{name} already exists; {hint}", self.namespace);
        }
        let Some(mut existing) = self.get(name).await? else {
            bail!("secret {}/{name} disappeared while it was being replaced; run the command again", self.namespace);
        };
        let existing_type = existing.type_.as_deref().unwrap_or("Opaque");
        if existing_type != type_ {
            bail!(
                "secret {}/{name} exists with type {existing_type}, not {type_}; the type of a secret cannot be \
                 changed, delete it first",
                self.namespace
            );
        }
        // Keep labels, annotations and the resourceVersion (so a concurrent writer gets a conflict
        // instead of being overwritten silently); replace what the secret holds.
        existing.data = Some(data);
        existing.string_data = None;
        existing.immutable = None;
        self.api
            .replace(name, &PostParams::default(), &existing)
            .await
            .map_err(|e| self.api_error(e, "replace", name))?;
        Ok(Written::Replaced)
    }

    /// The client these secrets are read through (for other kinds in the same cluster).
    #[must_use]
    pub fn client(&self) -> Client {
        self.api.clone().into_client()
    }

    /// List the secrets matching `label_selector` (all with `None`).
    ///
    /// # Errors
    /// The API call fails.
    pub async fn list(&self, label_selector: Option<&str>) -> anyhow::Result<Vec<Secret>> {
        let mut params = ListParams::default();
        if let Some(selector) = label_selector {
            params = params.labels(selector);
        }
        let what = label_selector.map_or_else(String::new, |s| format!(" labelled {s}"));
        let list = self.api.list(&params).await.with_context(|| {
            format!(
                "cannot list secrets{what} in namespace {} (check the context, the namespace and RBAC on secrets)",
                self.namespace
            )
        })?;
        Ok(list.items)
    }

    /// Create `secret` as it is (labels, annotations and all); `false` when one of that name exists.
    ///
    /// # Errors
    /// The API call fails for another reason.
    pub async fn create(&self, secret: &Secret) -> anyhow::Result<bool> {
        let name = secret.metadata.name.as_deref().unwrap_or_default();
        match self.api.create(&PostParams::default(), secret).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(false),
            Err(e) => Err(self.api_error(e, "create", name)),
        }
    }

    /// Replace `secret` (read before, so its resourceVersion guards against concurrent writers).
    ///
    /// # Errors
    /// The API call fails, e.g. with a conflict when the secret changed in between.
    pub async fn replace(&self, secret: &Secret) -> anyhow::Result<()> {
        let name = secret.metadata.name.as_deref().unwrap_or_default();
        self.api.replace(name, &PostParams::default(), secret).await.map_err(|e| self.api_error(e, "replace", name))?;
        Ok(())
    }

    /// Delete a secret; `false` when it did not exist.
    ///
    /// # Errors
    /// The API call fails for another reason.
    pub async fn delete(&self, name: &str) -> anyhow::Result<bool> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(false),
            Err(e) => Err(self.api_error(e, "delete", name)),
        }
    }

    /// Turn a failed call into a message that names the secret and says what to fix, instead of
    /// kube's debug dump of the Status.
    fn api_error(&self, err: kube::Error, verb: &str, name: &str) -> anyhow::Error {
        let ns = &self.namespace;
        let kube::Error::Api(status) = &err else {
            return anyhow::Error::new(err).context(format!("cannot {verb} secret {ns}/{name}"));
        };
        let hint = if status.is_not_found() && status.details.as_ref().is_some_and(|d| d.kind == "namespaces") {
            format!(
                " (create namespace {ns} first, or pass the right --principal-namespace/--agent-namespace or context)"
            )
        } else if status.is_forbidden() {
            " (the kubeconfig user lacks RBAC permission on secrets there)".to_owned()
        } else if status.is_conflict() {
            " (it changed while this command ran; run it again)".to_owned()
        } else {
            String::new()
        };
        anyhow::anyhow!(
            "cannot {verb} secret {ns}/{name}: {} (HTTP {} {}){hint}",
            status.message,
            status.code,
            status.reason
        )
    }
}

/// A data field of a secret as UTF-8 text.
///
/// # Errors
/// The field is missing or not UTF-8.
pub fn field_text(secret: &Secret, key: &str) -> anyhow::Result<String> {
    let name = secret.metadata.name.as_deref().unwrap_or("?");
    let ns = secret.metadata.namespace.as_deref().unwrap_or("?");
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .with_context(|| format!("secret {ns}/{name} has no field {key:?}"))?;
    String::from_utf8(bytes.0.clone()).with_context(|| format!("field {key:?} of secret {ns}/{name} is not text"))
}
