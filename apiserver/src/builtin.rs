//! Types served from the start: the core kinds this project uses, Lease, CRDs themselves, and the
//! Argo CD CRDs (seeded as real CustomResourceDefinition objects, so `kubectl get crd` shows them).

use serde_json::{Value, json};

use crate::resource::ResourceType;

fn builtin(
    group: &str,
    version: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short_names: &[&str],
    status_subresource: bool,
) -> ResourceType {
    ResourceType {
        group: group.to_string(),
        versions: vec![version.to_string()],
        plural: plural.to_string(),
        singular: kind.to_lowercase(),
        kind: kind.to_string(),
        list_kind: format!("{kind}List"),
        namespaced,
        short_names: short_names.iter().map(|s| (*s).to_string()).collect(),
        categories: vec![],
        status_subresource,
        printer_columns: vec![],
        schemas: std::collections::BTreeMap::new(),
    }
}

/// The types that do not come from CRD objects.
#[must_use]
pub fn builtin_types() -> Vec<ResourceType> {
    vec![
        builtin("", "v1", "namespaces", "Namespace", false, &["ns"], true),
        builtin("", "v1", "secrets", "Secret", true, &[], false),
        builtin("", "v1", "configmaps", "ConfigMap", true, &["cm"], false),
        builtin("", "v1", "pods", "Pod", true, &["po"], true),
        builtin("", "v1", "events", "Event", true, &["ev"], false),
        builtin("", "v1", "services", "Service", true, &["svc"], true),
        builtin("coordination.k8s.io", "v1", "leases", "Lease", true, &[], false),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
        ),
    ]
}

/// Namespaces a fresh cluster has.
pub const SEED_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

fn argo_crd(plural: &str, kind: &str, short: &[&str], status_subresource: bool, columns: Value) -> Value {
    let mut version = json!({
        "name": "v1alpha1",
        "served": true,
        "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
    });
    if status_subresource {
        version["subresources"] = json!({"status": {}});
    }
    if columns.as_array().is_some_and(|c| !c.is_empty()) {
        version["additionalPrinterColumns"] = columns;
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{plural}.argoproj.io"),
            "labels": {"app.kubernetes.io/name": format!("{plural}.argoproj.io"), "app.kubernetes.io/part-of": "argocd"},
        },
        "spec": {
            "group": "argoproj.io",
            "names": {
                "kind": kind,
                "listKind": format!("{kind}List"),
                "plural": plural,
                "singular": kind.to_lowercase(),
                "shortNames": short,
            },
            "scope": "Namespaced",
            "versions": [version],
        },
    })
}

/// The Argo CD CRDs, shaped like Argo CD's own manifests: Application and AppProject have no
/// status subresource (Argo CD writes their status through the main resource); ApplicationSet has.
#[must_use]
pub fn argocd_crds() -> Vec<Value> {
    vec![
        argo_crd(
            "applications",
            "Application",
            &["app", "apps"],
            false,
            json!([
                {"name": "Sync Status", "type": "string", "jsonPath": ".status.sync.status"},
                {"name": "Health Status", "type": "string", "jsonPath": ".status.health.status"},
                {"name": "Revision", "type": "string", "jsonPath": ".status.sync.revision", "priority": 10},
            ]),
        ),
        argo_crd("appprojects", "AppProject", &["appproj", "appprojs"], false, json!([])),
        argo_crd("applicationsets", "ApplicationSet", &["appset", "appsets"], true, json!([])),
    ]
}
