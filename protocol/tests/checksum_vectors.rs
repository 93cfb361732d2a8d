//! Resync checksums against vectors computed independently from the algorithm in
//! docs/upstream-argocd-agent.md §4.13: Go 1.27's `encoding/json` + `crypto/sha256` over the
//! same inputs decoded the way Kubernetes' unstructured decoder does (ints as int64).

use protocol::argocd::{ObjectMeta, annotations};
use protocol::checksum::{
    ChecksumError, RESYNC_KIND_APP_PROJECT, RESYNC_KIND_APPLICATION, ResourceKey, go_json, resource_set_checksum,
    spec_checksum, to_hex,
};
use serde_json::{Value, json};

fn meta(name: &str, ns: &str, uid: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), uid: Some(uid.into()), ..ObjectMeta::default() }
}

#[test]
fn resource_set_checksum_sorts_and_concatenates() {
    let app = ResourceKey::from_meta(
        RESYNC_KIND_APPLICATION,
        &meta("guestbook", "agent-1", "6f1c9d1e-0000-4000-8000-000000000001"),
    );
    // The AppProject copy carries the source UID annotation: it wins over its own UID.
    let mut proj_meta = meta("default", "argocd", "local-uid");
    proj_meta.set_annotation(annotations::SOURCE_UID, "6f1c9d1e-0000-4000-8000-000000000002");
    let proj = ResourceKey::from_meta(RESYNC_KIND_APP_PROJECT, &proj_meta);
    assert_eq!(proj.checksum_string(), "AppProject/default/6f1c9d1e-0000-4000-8000-000000000002");

    // sha256("AppProject/default/6f1c...0002Application/guestbook/6f1c...0001")
    let expected = "173ab1eb5496d4d46e13e40de7513dfb2fc1bc4845811380ce7ebc031091696d";
    let sum = resource_set_checksum([&app, &proj]).unwrap();
    assert_eq!(to_hex(&sum), expected);
    // Order of input does not matter; duplicates count once.
    let sum2 = resource_set_checksum([&proj, &app, &proj]).unwrap();
    assert_eq!(sum, sum2);
}

#[test]
fn namespace_is_left_out_but_still_distinguishes_keys() {
    let a = ResourceKey::from_meta("Application", &meta("app", "ns-a", "uid-1"));
    let b = ResourceKey::from_meta("Application", &meta("app", "ns-b", "uid-1"));
    // sha256("Application/app/uid-1Application/app/uid-1")
    assert_eq!(
        to_hex(&resource_set_checksum([&a, &b]).unwrap()),
        "167a7d7c93ee29dce525cfeb7970b5ed8f7eac74be12d0f20b1a6a37fde9fe2f"
    );
}

#[test]
fn empty_set_has_no_checksum() {
    assert_eq!(resource_set_checksum(std::iter::empty()), None);
}

fn application() -> Value {
    json!({
      "apiVersion": "argoproj.io/v1alpha1",
      "kind": "Application",
      "metadata": {"name": "guestbook", "namespace": "agent-1", "uid": "6f1c9d1e-0000-4000-8000-000000000001"},
      "spec": {
        "project": "default",
        "source": {"repoURL": "https://github.com/argoproj/argocd-example-apps.git", "targetRevision": "HEAD", "path": "guestbook",
                   "helm": {"valuesObject": {"replicas": 3, "ratio": 0.25, "tiny": 1.5e-7, "html": "<b>&</b>"}}},
        "destination": {"server": "https://kubernetes.default.svc", "namespace": "guestbook"},
        "syncPolicy": {"automated": {"prune": true, "selfHeal": false}, "syncOptions": ["CreateNamespace=true"]},
        "revisionHistoryLimit": 10,
        "info": [{"name": "owner", "value": "team-a \u{2028} é"}]
      },
      "status": {"sync": {"status": "Synced"}}
    })
}

#[test]
fn application_spec_checksum_matches_go() {
    let app = application();
    let mut spec = app["spec"].clone();
    spec.as_object_mut().unwrap().remove("destination");
    assert_eq!(
        String::from_utf8(go_json::marshal(&spec)).unwrap(),
        r#"{"info":[{"name":"owner","value":"team-a \u2028 é"}],"project":"default","revisionHistoryLimit":10,"source":{"helm":{"valuesObject":{"html":"\u003cb\u003e\u0026\u003c/b\u003e","ratio":0.25,"replicas":3,"tiny":1.5e-7}},"path":"guestbook","repoURL":"https://github.com/argoproj/argocd-example-apps.git","targetRevision":"HEAD"},"syncPolicy":{"automated":{"prune":true,"selfHeal":false},"syncOptions":["CreateNamespace=true"]}}"#
    );
    assert_eq!(
        to_hex(&spec_checksum(&app).unwrap()),
        "4b0ccd6ab8d880ae83219b15f8d9291fe7602eb7a1075742da2e83a5e0ce62b4"
    );
}

#[test]
fn destination_does_not_change_the_checksum() {
    let mut app = application();
    app["spec"]["destination"] = json!({"name": "in-cluster", "server": ""});
    assert_eq!(
        to_hex(&spec_checksum(&app).unwrap()),
        "4b0ccd6ab8d880ae83219b15f8d9291fe7602eb7a1075742da2e83a5e0ce62b4"
    );
    // ... but `destinations` (AppProject) does: only the key `destination` is dropped.
    let proj = json!({"apiVersion":"argoproj.io/v1alpha1","kind":"AppProject","metadata":{"name":"default"},
        "spec":{"sourceRepos":["*"],"destinations":[{"name":"agent-1","namespace":"*","server":"*"}],
                "clusterResourceWhitelist":[{"group":"*","kind":"*"}]}});
    assert_eq!(
        to_hex(&spec_checksum(&proj).unwrap()),
        "4bccb3b18adebe543c5dd46182c47fa6845bb87380ead2ee3a8ccf09b7578181"
    );
}

#[test]
fn secret_and_configmap_hash_their_data() {
    let secret = json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"repo-1"},"type":"Opaque",
        "data":{"url":"aHR0cHM6Ly9naXRodWIuY29tL2V4YW1wbGUvcmVwbw==","type":"Z2l0","project":"ZGVmYXVsdA==","destination":"eA=="}});
    assert_eq!(
        to_hex(&spec_checksum(&secret).unwrap()),
        "dc20c173205465fb5291ba1b8f5faa2368b34bf1a1f80ab204c7f83bb969d753"
    );
    // A ConfigMap without data hashes `{}`: sha256("{}").
    let cm = json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"argocd-gpg-keys-cm"}});
    assert_eq!(
        to_hex(&spec_checksum(&cm).unwrap()),
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
}

#[test]
fn missing_or_odd_fields_are_errors() {
    let no_spec = json!({"kind": "Application", "metadata": {"name": "a"}});
    assert_eq!(
        spec_checksum(&no_spec),
        Err(ChecksumError::MissingField { kind: "Application".into(), name: "a".into(), field: "spec" })
    );
    let no_data = json!({"kind": "Secret", "metadata": {"name": "s"}});
    assert!(matches!(spec_checksum(&no_data), Err(ChecksumError::MissingField { field: "data", .. })));
    let odd = json!({"kind": "Application", "spec": [1, 2]});
    let err = spec_checksum(&odd).unwrap_err();
    assert!(matches!(err, ChecksumError::NotAnObject { field: "spec", .. }));
    assert!(err.to_string().contains("spec"));
}
