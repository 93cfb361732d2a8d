//! Argo CD objects decode into our types and encode back without losing anything a user (or
//! a newer Argo CD) wrote.

use protocol::argocd::{AppProject, Application, ConfigMap, Secret, annotations};
use serde_json::{Value, json};

fn rich_application() -> Value {
    json!({
      "apiVersion": "argoproj.io/v1alpha1",
      "kind": "Application",
      "metadata": {
        "name": "guestbook",
        "namespace": "argocd",
        "uid": "8d7c8c5e-2f5a-4b59-9d1c-7a5c1f0e9b11",
        "resourceVersion": "184467",
        "generation": 42,
        "creationTimestamp": "2025-03-01T10:00:00Z",
        "labels": {"app.kubernetes.io/part-of": "shop", "team": "payments"},
        "annotations": {
          "argocd.argoproj.io/refresh": "hard",
          "notifications.argoproj.io/subscribe.on-sync-succeeded.slack": "deployments",
          "kubectl.kubernetes.io/last-applied-configuration": "{\"apiVersion\":\"argoproj.io/v1alpha1\"}"
        },
        "finalizers": ["resources-finalizer.argocd.argoproj.io"],
        "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet", "name": "shop",
                             "uid": "0b5f8a7e-1111-4222-8333-944455556666", "controller": true, "blockOwnerDeletion": true}],
        "managedFields": [{"manager": "argocd-server", "operation": "Update", "apiVersion": "argoproj.io/v1alpha1",
                           "time": "2025-03-01T10:00:00Z", "fieldsType": "FieldsV1",
                           "fieldsV1": {"f:spec": {"f:project": {}}}}],
        "generateName": "guestbook-"
      },
      "spec": {
        "project": "shop",
        "sources": [
          {"repoURL": "https://github.com/example/shop.git", "targetRevision": "main", "path": "deploy/guestbook",
           "kustomize": {"namePrefix": "prod-", "images": ["guestbook=ghcr.io/example/guestbook:1.4.2"],
                         "patches": [{"target": {"kind": "Deployment"}, "patch": "- op: replace\n  path: /spec/replicas\n  value: 3"}]}},
          {"repoURL": "https://charts.example.com", "chart": "redis", "targetRevision": "18.1.0",
           "helm": {"releaseName": "cache", "valuesObject": {"replica": {"replicaCount": 2}, "auth": {"enabled": false}},
                    "parameters": [{"name": "image.tag", "value": "7.2", "forceString": true}]}, "ref": "values"}
        ],
        "destination": {"name": "agent-1", "namespace": "shop", "futureField": {"zone": "eu-west-1"}},
        "syncPolicy": {"automated": {"prune": true, "selfHeal": true, "allowEmpty": false},
                       "syncOptions": ["CreateNamespace=true", "ServerSideApply=true"],
                       "retry": {"limit": 5, "backoff": {"duration": "5s", "factor": 2, "maxDuration": "3m"}},
                       "managedNamespaceMetadata": {"labels": {"istio-injection": "enabled"}}},
        "ignoreDifferences": [{"group": "apps", "kind": "Deployment", "jsonPointers": ["/spec/replicas"]}],
        "revisionHistoryLimit": 5,
        "info": [{"name": "runbook", "value": "https://wiki.example.com/guestbook"}]
      },
      "operation": {"sync": {"revision": "4f2a1c9", "prune": true, "syncStrategy": {"hook": {}}},
                    "initiatedBy": {"username": "alice"}, "retry": {"limit": 2}},
      "status": {
        "sync": {"status": "OutOfSync", "revisions": ["4f2a1c9", "18.1.0"],
                 "comparedTo": {"destination": {"name": "agent-1", "namespace": "shop"}}},
        "health": {"status": "Progressing", "lastTransitionTime": "2025-03-01T10:05:00Z"},
        "operationState": {"phase": "Running", "message": "waiting for healthy state",
                           "startedAt": "2025-03-01T10:04:00Z", "retryCount": 1,
                           "operation": {"sync": {"revision": "4f2a1c9"}},
                           "syncResult": {"revision": "4f2a1c9", "resources": [{"kind": "Deployment", "name": "guestbook",
                                          "namespace": "shop", "status": "Synced", "hookPhase": "Running", "syncPhase": "Sync"}]}},
        "resources": [{"group": "apps", "version": "v1", "kind": "Deployment", "namespace": "shop", "name": "guestbook",
                       "status": "Synced", "health": {"status": "Progressing"}}],
        "history": [{"id": 7, "revision": "1a2b3c4", "deployedAt": "2025-02-28T09:00:00Z", "initiatedBy": {"automated": true}}],
        "reconciledAt": "2025-03-01T10:05:10Z",
        "sourceTypes": ["Kustomize", "Helm"],
        "controllerNamespace": "argocd",
        "summary": {"images": ["ghcr.io/example/guestbook:1.4.2"], "externalURLs": ["https://shop.example.com"]}
      },
      "x-unmodelled-top-level": {"kept": [1, 2.5, null, "three"]}
    })
}

#[test]
fn rich_application_round_trips_losslessly() {
    let original = rich_application();
    let app: Application = serde_json::from_value(original.clone()).unwrap();

    // The typed view sees what principal and agent need.
    assert_eq!(app.metadata.name.as_deref(), Some("guestbook"));
    assert_eq!(app.metadata.resource_id(), "guestbook_8d7c8c5e-2f5a-4b59-9d1c-7a5c1f0e9b11");
    assert_eq!(app.metadata.event_id(), "guestbook_8d7c8c5e-2f5a-4b59-9d1c-7a5c1f0e9b11_184467");
    assert_eq!(app.metadata.annotation(annotations::REFRESH), Some("hard"));
    assert_eq!(app.spec.project.as_deref(), Some("shop"));
    let dest = app.spec.destination.as_ref().unwrap();
    assert_eq!(dest.name.as_deref(), Some("agent-1"));
    assert!(dest.extra.contains_key("futureField"));
    assert_eq!(app.operation_phase(), Some("Running"));
    assert!(!app.is_terminating());
    assert!(app.operation.is_some());
    assert!(app.metadata.extra.contains_key("managedFields"));
    assert!(app.extra.contains_key("x-unmodelled-top-level"));

    // Nothing is lost, nothing is added.
    let back = serde_json::to_value(&app).unwrap();
    assert_eq!(back, original);
    // Through text as well (the wire form).
    let text = serde_json::to_string(&app).unwrap();
    let again: Application = serde_json::from_str(&text).unwrap();
    assert_eq!(again, app);
}

#[test]
fn edits_keep_unmodelled_fields() {
    let mut app: Application = serde_json::from_value(rich_application()).unwrap();
    // What the agent does to a managed app: rewrite destination, strip a few things.
    let dest = app.spec.destination.get_or_insert_with(Default::default);
    dest.name = Some("in-cluster".into());
    dest.server = Some(String::new());
    app.metadata.owner_references = None;
    app.metadata.remove_annotation(annotations::LAST_APPLIED_CONFIGURATION);
    app.metadata.set_annotation(annotations::SOURCE_UID, "8d7c8c5e-2f5a-4b59-9d1c-7a5c1f0e9b11");

    let v = serde_json::to_value(&app).unwrap();
    assert_eq!(v["spec"]["destination"]["futureField"]["zone"], "eu-west-1");
    assert_eq!(v["spec"]["destination"]["server"], "");
    assert_eq!(v["spec"]["ignoreDifferences"][0]["jsonPointers"][0], "/spec/replicas");
    assert_eq!(v["status"]["operationState"]["retryCount"], 1);
    assert!(v["metadata"].get("ownerReferences").is_none());
    assert_eq!(v["x-unmodelled-top-level"]["kept"][1], 2.5);
}

#[test]
fn appproject_secret_and_configmap_round_trip() {
    let proj = json!({
      "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
      "metadata": {"name": "shop", "namespace": "argocd", "uid": "u-1", "resourceVersion": "9"},
      "spec": {"description": "Shop team", "sourceRepos": ["https://github.com/example/*"],
               "destinations": [{"name": "agent-*", "namespace": "shop-*", "server": "*"}, {"name": "!agent-9", "namespace": "*"}],
               "sourceNamespaces": ["agent-*"],
               "roles": [{"name": "ci", "policies": ["p, proj:shop:ci, applications, sync, shop/*, allow"], "jwtTokens": [{"iat": 1700000000}]}],
               "clusterResourceWhitelist": [{"group": "", "kind": "Namespace"}],
               "syncWindows": [{"kind": "deny", "schedule": "0 22 * * *", "duration": "1h", "applications": ["*"]}],
               "signatureKeys": [{"keyID": "4AEE18F83AFDEB23"}]},
      "status": {"jwtTokensByRole": {"ci": {"items": [{"iat": 1700000000}]}}}
    });
    let p: AppProject = serde_json::from_value(proj.clone()).unwrap();
    assert_eq!(p.spec.destinations.as_ref().unwrap().len(), 2);
    assert!(p.spec.extra.contains_key("syncWindows"));
    assert_eq!(serde_json::to_value(&p).unwrap(), proj);

    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": false,
        "metadata": {"name": "repo-shop", "namespace": "argocd", "labels": {"argocd.argoproj.io/secret-type": "repository"}},
        "data": {"url": "aHR0cHM6Ly9naXRodWIuY29tL2V4YW1wbGUvc2hvcA==", "project": "c2hvcA=="}});
    let s: Secret = serde_json::from_value(secret.clone()).unwrap();
    assert_eq!(s.metadata.label(annotations::SECRET_TYPE_LABEL), Some("repository"));
    assert_eq!(serde_json::to_value(&s).unwrap(), secret);

    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "argocd-gpg-keys-cm"},
        "data": {"4AEE18F83AFDEB23": "-----BEGIN PGP PUBLIC KEY BLOCK-----\n...\n"}, "binaryData": {"x": "AAE="}});
    let c: ConfigMap = serde_json::from_value(cm.clone()).unwrap();
    assert_eq!(serde_json::to_value(&c).unwrap(), cm);
}
