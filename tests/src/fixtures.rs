//! Realistic objects shared by tests (as JSON values, convertible to YAML manifests), and typed
//! access to the Argo CD kinds through `kube` without generated structs.

use anyhow::Context as _;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

/// A Namespace.
#[must_use]
pub fn namespace(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"team": "platform"}},
    })
}

/// An Argo CD Application as users write them: source, destination, automated sync policy, labels.
#[must_use]
pub fn application(name: &str, namespace: &str, target_revision: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "guestbook", "environment": "staging"},
            "finalizers": ["resources-finalizer.argocd.argoproj.io"],
        },
        "spec": {
            "project": "default",
            "source": {
                "repoURL": "https://github.com/argoproj/argocd-example-apps.git",
                "targetRevision": target_revision,
                "path": "guestbook",
                "directory": {"recurse": true},
            },
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "guestbook"},
            "syncPolicy": {
                "automated": {"prune": true, "selfHeal": true},
                "syncOptions": ["CreateNamespace=true", "ServerSideApply=true"],
                "retry": {"limit": 5, "backoff": {"duration": "5s", "factor": 2, "maxDuration": "3m"}},
            },
            "revisionHistoryLimit": 10,
        },
    })
}

/// An Application without finalizers (deletion is immediate, as for objects no controller owns).
#[must_use]
pub fn application_without_finalizers(name: &str, namespace: &str, target_revision: &str) -> Value {
    let mut app = application(name, namespace, target_revision);
    if let Some(meta) = app.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("finalizers");
    }
    app
}

/// A minimal Application named `name` in `namespace` whose `spec.source.path` is `path` (tests
/// change the path to tell versions apart), as a dynamic object.
///
/// # Errors
/// Never for these values (the conversion is fallible in general).
pub fn app_with_path(name: &str, namespace: &str, path: &str) -> anyhow::Result<DynamicObject> {
    dynamic(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "project": "default",
            "source": {"repoURL": "https://example.com/repo.git", "path": path, "targetRevision": "HEAD"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": name},
        },
    }))
}

/// A value as a YAML manifest.
///
/// # Errors
/// The value cannot be serialised (never for JSON values).
pub fn to_yaml(value: &Value) -> anyhow::Result<String> {
    serde_yaml::to_string(value).context("cannot serialise to YAML")
}

/// `argoproj.io/v1alpha1` Application as a dynamic kube resource.
#[must_use]
pub fn application_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"), "applications")
}

/// Applications in `namespace`.
#[must_use]
pub fn applications(client: kube::Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client, namespace, &application_resource())
}

/// A value as a `DynamicObject` (to create it with a kube client).
///
/// # Errors
/// The value is not an object with metadata.
pub fn dynamic(value: Value) -> anyhow::Result<DynamicObject> {
    serde_json::from_value(value).context("not a Kubernetes object")
}
