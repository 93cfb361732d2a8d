//! Typed access to Argo CD objects through kube-rs, for the principal (hub) and the agent (spoke):
//! get, list, create, replace with conflict retry, delete, finalizer removal. Objects travel as
//! [`crate::argocd`] types, which keep every field they do not model. Behind the `kube` feature.

use std::fmt;

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// How often a read-modify-write is retried when the API server answers 409 Conflict.
const CONFLICT_RETRIES: usize = 8;

/// A Kubernetes call on an Argo CD object failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The API server refused or could not be reached.
    #[error("{op} {kind} {namespace}/{name}: the Kubernetes API call failed (check the kubeconfig and RBAC): {source}")]
    Kube {
        /// What was attempted.
        op: &'static str,
        /// The kind.
        kind: &'static str,
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The client error (boxed: it is large).
        #[source]
        source: Box<kube::Error>,
    },
    /// The object did not have the shape of its kind.
    #[error("{kind} {namespace}/{name} does not decode as an Argo CD {kind}: {source}")]
    Decode {
        /// The kind.
        kind: &'static str,
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// Every attempt of a read-modify-write met a concurrent writer.
    #[error(
        "{kind} {namespace}/{name}: gave up after {attempts} conflicting writes (another writer keeps changing it)"
    )]
    Conflict {
        /// The kind.
        kind: &'static str,
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// Attempts made.
        attempts: usize,
    },
}

impl StoreError {
    /// Whether retrying later may succeed (API unreachable, 5xx, 429, conflicts), as
    /// upstream's `kube.IsRetryableError`: such events are not ACKed so the peer resends.
    /// Also what a kube-apiserver answers while it starts: a 404 about the resource type rather
    /// than the object (it does not serve the CRD yet, see [`object_not_found`]), and 401/403
    /// (its authenticator and RBAC authorizer caches have not synced: a principal with every
    /// grant it needs is told `forbidden` for a few seconds after the hub's API server restarts).
    /// Taken as final, the event was acknowledged and its write lost for good; retried, a
    /// permission that is really missing is resent with backoff, logged each time with the API
    /// server's reason, and parked after the attempt limit.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Kube { source, .. } => match source.as_ref() {
                kube::Error::Api(status) => {
                    status.code >= 500
                        || matches!(status.code, 401 | 403 | 429)
                        || (status.is_not_found() && !object_not_found(status))
                }
                _ => true,
            },
            Self::Conflict { .. } => true,
            Self::Decode { .. } => false,
        }
    }
}

impl StoreError {
    /// Whether a create failed because its namespace does not exist (a 404 naming a
    /// namespace).
    #[must_use]
    pub fn is_missing_namespace(&self) -> bool {
        matches!(self, Self::Kube { source, .. } if matches!(source.as_ref(),
            kube::Error::Api(s) if s.is_not_found() && s.details.as_ref().is_some_and(|d| d.kind == "namespaces")))
    }
}

/// One kind of Argo CD object (Application or AppProject) on one cluster.
#[derive(Clone)]
pub struct ObjectStore {
    client: kube::Client,
    resource: ApiResource,
    kind: &'static str,
}

impl fmt::Debug for ObjectStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectStore").field("kind", &self.kind).finish_non_exhaustive()
    }
}

impl ObjectStore {
    /// Applications (`applications.argoproj.io/v1alpha1`).
    #[must_use]
    pub fn applications(client: kube::Client) -> Self {
        Self::argo(client, "Application", "applications")
    }

    /// AppProjects (`appprojects.argoproj.io/v1alpha1`).
    #[must_use]
    pub fn app_projects(client: kube::Client) -> Self {
        Self::argo(client, "AppProject", "appprojects")
    }

    /// Secrets (`v1`): repository and repo-creds secrets.
    #[must_use]
    pub fn secrets(client: kube::Client) -> Self {
        Self::of(client, "", "v1", "Secret", "secrets")
    }

    /// ConfigMaps (`v1`): the GPG keys ConfigMap.
    #[must_use]
    pub fn config_maps(client: kube::Client) -> Self {
        Self::of(client, "", "v1", "ConfigMap", "configmaps")
    }

    fn argo(client: kube::Client, kind: &'static str, plural: &str) -> Self {
        Self::of(client, "argoproj.io", "v1alpha1", kind, plural)
    }

    fn of(client: kube::Client, group: &str, version: &str, kind: &'static str, plural: &str) -> Self {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        Self { client, resource: ApiResource::from_gvk_with_plural(&gvk, plural), kind }
    }

    /// The client this store uses.
    #[must_use]
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The kind's name, for logs.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The raw API for a namespace (`None`: all namespaces), for watchers.
    #[must_use]
    pub fn api(&self, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &self.resource),
            None => Api::all_with(self.client.clone(), &self.resource),
        }
    }

    fn kube_err(&self, op: &'static str, ns: &str, name: &str, source: kube::Error) -> StoreError {
        StoreError::Kube {
            op,
            kind: self.kind,
            namespace: ns.to_owned(),
            name: name.to_owned(),
            source: Box::new(source),
        }
    }

    fn decode_err(&self, ns: &str, name: &str, source: serde_json::Error) -> StoreError {
        StoreError::Decode { kind: self.kind, namespace: ns.to_owned(), name: name.to_owned(), source }
    }

    /// Converts a dynamic object into a typed one.
    ///
    /// # Errors
    ///
    /// [`StoreError::Decode`] when it does not fit `T`.
    pub fn decode<T: DeserializeOwned>(&self, obj: &DynamicObject) -> Result<T, StoreError> {
        serde_json::to_value(obj).and_then(serde_json::from_value).map_err(|source| {
            let ns = obj.metadata.namespace.as_deref().unwrap_or_default();
            self.decode_err(ns, obj.metadata.name.as_deref().unwrap_or_default(), source)
        })
    }

    /// As [`Self::decode`] for a watcher: an object that does not decode is logged (naming
    /// `what` watched it and why) and skipped, so one bad object never stops a watch.
    #[must_use]
    pub fn decode_or_skip<T: DeserializeOwned>(&self, obj: &DynamicObject, what: &str) -> Option<T> {
        self.decode(obj).map_err(|e| tracing::warn!(%what, error = %e, "skipping an object that does not decode")).ok()
    }

    /// `obj` as the body of a write: its JSON with this kind's `apiVersion` and `kind`.
    fn encode<T: Serialize>(&self, ns: &str, name: &str, obj: &T) -> Result<Vec<u8>, StoreError> {
        let err = |source| self.decode_err(ns, name, source);
        let mut value = serde_json::to_value(obj).map_err(err)?;
        if let Some(map) = value.as_object_mut() {
            map.insert("apiVersion".into(), self.resource.api_version.clone().into());
            map.insert("kind".into(), self.kind.into());
        }
        serde_json::to_vec(&value).map_err(err)
    }

    /// Requests for the objects of namespace `ns`.
    fn request(&self, ns: &str) -> kube::core::Request {
        kube::core::Request::new(<DynamicObject as kube::Resource>::url_path(&self.resource, Some(ns)))
    }

    /// Sends a request about one object (`op` names it in the client's traces, as `Api` does)
    /// and returns the object the API server answered, as text: [`Self::decoded`] decodes it
    /// straight into the caller's type. Through `Api<DynamicObject>` and [`Self::decode`], the
    /// whole object was converted three times (a `DynamicObject`, a JSON value, the type); in
    /// the principal's profile of status updates, a third of the time went to the allocator.
    async fn send(
        &self,
        op: &'static str,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<String, kube::Error> {
        let mut req = req.map_err(kube::Error::BuildRequest)?;
        req.extensions_mut().insert(op);
        self.client.request_text(req).await
    }

    /// An object the API server answered ([`Self::send`]) as `T`.
    fn decoded<T: DeserializeOwned>(&self, ns: &str, name: &str, text: &str) -> Result<T, StoreError> {
        serde_json::from_str(text).map_err(|source| self.decode_err(ns, name, source))
    }

    /// Reads one object; `None` if it does not exist.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the API call fails or the object does not decode.
    pub async fn get<T: DeserializeOwned>(&self, ns: &str, name: &str) -> Result<Option<T>, StoreError> {
        match self.send("get", self.request(ns).get(name, &kube::api::GetParams::default())).await {
            Ok(text) => self.decoded(ns, name, &text).map(Some),
            Err(kube::Error::Api(s)) if object_not_found(&s) => Ok(None),
            Err(e) => Err(self.kube_err("get", ns, name, e)),
        }
    }

    /// Lists the objects of a namespace.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the API call fails or an object does not decode.
    pub async fn list<T: DeserializeOwned>(&self, ns: &str) -> Result<Vec<T>, StoreError> {
        let list =
            self.api(Some(ns)).list(&ListParams::default()).await.map_err(|e| self.kube_err("list", ns, "*", e))?;
        list.items.iter().map(|o| self.decode(o)).collect()
    }

    /// Lists the objects of every namespace.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the API call fails or an object does not decode.
    pub async fn list_all<T: DeserializeOwned>(&self) -> Result<Vec<T>, StoreError> {
        let list = self.api(None).list(&ListParams::default()).await.map_err(|e| self.kube_err("list", "*", "*", e))?;
        list.items.iter().map(|o| self.decode(o)).collect()
    }

    /// Creates an object; `Ok(false)` if it already exists.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the API call fails for another reason.
    pub async fn create<T: Serialize>(&self, ns: &str, name: &str, obj: &T) -> Result<bool, StoreError> {
        let body = self.encode(ns, name, obj)?;
        match self.send("create", self.request(ns).create(&PostParams::default(), body)).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
            Err(e) => Err(self.kube_err("create", ns, name, e)),
        }
    }

    /// Read-modify-write: `mutate` edits the current object and says whether it changed;
    /// a 409 Conflict re-reads and retries. `Ok(None)` if the object does not exist.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the API call fails, or [`StoreError::Conflict`] after repeated
    /// conflicts.
    pub async fn update<T, F>(&self, ns: &str, name: &str, mutate: F) -> Result<Option<T>, StoreError>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(&mut T) -> bool,
    {
        self.update_from(ns, name, None, mutate).await
    }

    /// [`Self::update`] starting from `read`, the object as the caller has just read it (one
    /// request fewer); a conflict re-reads as [`Self::update`] does. `None` reads it first.
    ///
    /// # Errors
    ///
    /// As [`Self::update`].
    pub async fn update_from<T, F>(
        &self,
        ns: &str,
        name: &str,
        mut read: Option<T>,
        mut mutate: F,
    ) -> Result<Option<T>, StoreError>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(&mut T) -> bool,
    {
        for _ in 0..CONFLICT_RETRIES {
            let current = match read.take() {
                Some(obj) => Some(obj),
                None => self.get::<T>(ns, name).await?,
            };
            let Some(mut obj) = current else { return Ok(None) };
            if !mutate(&mut obj) {
                return Ok(Some(obj));
            }
            let body = self.encode(ns, name, &obj)?;
            match self.send("replace", self.request(ns).replace(name, &PostParams::default(), body)).await {
                Ok(written) => return self.decoded(ns, name, &written).map(Some),
                Err(kube::Error::Api(s)) if s.is_conflict() => {}
                Err(kube::Error::Api(s)) if object_not_found(&s) => return Ok(None),
                Err(e) => return Err(self.kube_err("update", ns, name, e)),
            }
        }
        Err(StoreError::Conflict {
            kind: self.kind,
            namespace: ns.into(),
            name: name.into(),
            attempts: CONFLICT_RETRIES,
        })
    }

    /// Merge-patches an object whose `patch` carries `metadata.resourceVersion`: the write
    /// happens only if the object is still at that version (one request where
    /// [`Self::update`] needs a read and a write). `Ok(None)` if it has changed since or does
    /// not exist: the caller reads it again. `Ok(Some(written))`: the object as written.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the API call fails for another reason, or the written object does
    /// not decode.
    pub async fn patch_if_unchanged<T: DeserializeOwned>(
        &self,
        ns: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Option<T>, StoreError> {
        match self.send("patch", self.request(ns).patch(name, &PatchParams::default(), &Patch::Merge(patch))).await {
            Ok(written) => self.decoded(ns, name, &written).map(Some),
            Err(kube::Error::Api(s)) if s.is_conflict() || object_not_found(&s) => Ok(None),
            Err(e) => Err(self.kube_err("patch", ns, name, e)),
        }
    }

    /// Deletes an object (background propagation); `Ok(false)` if it did not exist.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the API call fails.
    pub async fn delete(&self, ns: &str, name: &str) -> Result<bool, StoreError> {
        match self.api(Some(ns)).delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if object_not_found(&s) => Ok(false),
            Err(e) => Err(self.kube_err("delete", ns, name, e)),
        }
    }

    /// Removes every finalizer (merge patch), letting a pending deletion complete.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the API call fails for another reason than a missing object.
    pub async fn strip_finalizers(&self, ns: &str, name: &str) -> Result<(), StoreError> {
        let patch = serde_json::json!({"metadata": {"finalizers": null}});
        match self.api(Some(ns)).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if object_not_found(&s) => Ok(()),
            Err(e) => Err(self.kube_err("remove finalizers of", ns, name, e)),
        }
    }
}

/// Creates namespace `name` with `labels` unless it exists; `Ok(true)` if it was created here.
///
/// # Errors
///
/// The API call's, when reading or creating the namespace fails.
pub async fn ensure_namespace(
    client: &kube::Client,
    name: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<bool, kube::Error> {
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Namespace"), "namespaces");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    if api.get_opt(name).await?.is_some() {
        return Ok(false);
    }
    let mut ns = DynamicObject::new(name, &resource);
    ns.metadata.labels = (!labels.is_empty()).then(|| labels.clone());
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
        Err(e) => Err(e),
    }
}

/// A 404 about the object itself (`applications.argoproj.io "x" not found`, which names it in its
/// details), as opposed to one about its resource type: a kube-apiserver that has just restarted
/// answers "the server could not find the requested resource" for a custom resource until its
/// CRD handler is registered. That is an outage to retry, never "the object is gone" (taken so, a
/// status update was acknowledged and dropped).
fn object_not_found(status: &kube::core::Status) -> bool {
    status.is_not_found() && status.details.as_ref().is_some_and(|d| !d.name.is_empty())
}

#[cfg(test)]
mod not_found_tests {
    use super::object_not_found;

    fn status(json: serde_json::Value) -> kube::core::Status {
        serde_json::from_value(json).expect("a Status")
    }

    #[test]
    fn only_a_404_naming_the_object_means_it_is_gone() {
        // As kube-apiserver answers a GET of a missing Application.
        let gone = status(serde_json::json!({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": "applications.argoproj.io \"a\" not found",
            "details": {"name": "a", "group": "argoproj.io", "kind": "applications"}}));
        assert!(object_not_found(&gone));
        // As it answers while the CRD's handler is not registered yet (just restarted).
        let no_type =
            status(serde_json::json!({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": "the server could not find the requested resource", "details": {}}));
        assert!(!object_not_found(&no_type));
        let bare = status(serde_json::json!({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": "the server could not find the requested resource"}));
        assert!(!object_not_found(&bare));
    }

    #[test]
    fn startup_answers_are_retried_final_ones_are_not() {
        let err = |json| super::StoreError::Kube {
            op: "get",
            kind: "Application",
            namespace: "cm".into(),
            name: "a".into(),
            source: Box::new(kube::Error::Api(Box::new(status(json)))),
        };
        let no_type = err(serde_json::json!({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": "the server could not find the requested resource", "details": {}}));
        assert!(no_type.is_retryable(), "a restarting API server's 404 must be retried, not acknowledged");
        let namespace_gone =
            err(serde_json::json!({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": "namespaces \"cm\" not found", "details": {"name": "cm", "kind": "namespaces"}}));
        assert!(!namespace_gone.is_retryable());
        // As a restarted kube-apiserver answers before its RBAC caches sync (seen in the chaos run).
        let forbidden = err(
            serde_json::json!({"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
            "message": "applications.argoproj.io \"a\" is forbidden: User \"system:serviceaccount:argocd:argocd-agent-principal\" cannot patch resource \"applications\""}),
        );
        assert!(forbidden.is_retryable(), "a restarting API server's 403 must be retried, not acknowledged");
        let invalid = err(serde_json::json!({"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
            "message": "spec.destination: Required value"}));
        assert!(!invalid.is_retryable());
    }
}
