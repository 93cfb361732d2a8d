//! Resync checksums against the vectors in `checksum_vectors.json` (upstream §4.13: Go's
//! `encoding/json` + `crypto/sha256`, inputs decoded the way Kubernetes' unstructured decoder
//! does: ints as int64, other numbers as float64). The Go peer test
//! `gopeer_codec_checksum_vectors_are_what_go_computes` checks that Go computes every expected
//! value in that file, so the reference is Go itself, not a hand computation.

use protocol::argocd::{ObjectMeta, annotations};
use protocol::checksum::{
    ChecksumError, RESYNC_KIND_APP_PROJECT, RESYNC_KIND_APPLICATION, ResourceKey, go_json, resource_set_checksum,
    spec_checksum, to_hex,
};
use serde_json::{Value, json};

/// The shared vectors.
fn vectors() -> serde_json::Result<Value> {
    serde_json::from_str(include_str!("checksum_vectors.json"))
}

fn key(k: &Value) -> ResourceKey {
    let field = |f: &str| k[f].as_str().unwrap_or_default().to_owned();
    ResourceKey { kind: field("kind"), name: field("name"), namespace: field("namespace"), uid: field("uid") }
}

#[test]
fn every_resource_set_vector() {
    let v = vectors().unwrap();
    let sets = v["resource_sets"].as_array().unwrap();
    assert!(sets.len() >= 3);
    for set in sets {
        let keys: Vec<ResourceKey> = set["keys"].as_array().unwrap().iter().map(key).collect();
        let ours = resource_set_checksum(&keys).map(|c| to_hex(&c));
        assert_eq!(ours.as_deref(), set["checksum"].as_str(), "{}", set["name"]);
    }
}

#[test]
fn every_spec_vector() {
    let v = vectors().unwrap();
    let specs = v["specs"].as_array().unwrap();
    assert!(specs.len() >= 5);
    for spec in specs {
        assert_eq!(
            to_hex(&spec_checksum(&spec["object"]).unwrap()),
            spec["checksum"].as_str().unwrap(),
            "{}",
            spec["name"]
        );
    }
}

fn meta(name: &str, ns: &str, uid: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), uid: Some(uid.into()), ..ObjectMeta::default() }
}

#[test]
fn resource_keys_take_the_source_uid_and_sets_ignore_order_and_duplicates() {
    let app = ResourceKey::from_meta(
        RESYNC_KIND_APPLICATION,
        &meta("guestbook", "agent-1", "6f1c9d1e-0000-4000-8000-000000000001"),
    );
    // The AppProject copy carries the source UID annotation: it wins over its own UID.
    let mut proj_meta = meta("default", "argocd", "local-uid");
    proj_meta.set_annotation(annotations::SOURCE_UID, "6f1c9d1e-0000-4000-8000-000000000002");
    let proj = ResourceKey::from_meta(RESYNC_KIND_APP_PROJECT, &proj_meta);
    assert_eq!(proj.checksum_string(), "AppProject/default/6f1c9d1e-0000-4000-8000-000000000002");
    let v = vectors().unwrap();
    let first = &v["resource_sets"][0];
    assert_eq!(first["keys"][1]["uid"], "6f1c9d1e-0000-4000-8000-000000000002", "the vector holds the source UID");
    let sum = resource_set_checksum([&app, &proj]).unwrap();
    assert_eq!(Some(to_hex(&sum).as_str()), first["checksum"].as_str());
    assert_eq!(resource_set_checksum([&proj, &app, &proj]).unwrap(), sum);
}

#[test]
fn application_spec_is_marshalled_as_go_does() {
    let v = vectors().unwrap();
    let mut spec = v["specs"][0]["object"]["spec"].clone();
    spec.as_object_mut().unwrap().remove("destination");
    assert_eq!(
        String::from_utf8(go_json::marshal(&spec)).unwrap(),
        r#"{"info":[{"name":"owner","value":"team-a \u2028 é"}],"project":"default","revisionHistoryLimit":10,"source":{"helm":{"valuesObject":{"html":"\u003cb\u003e\u0026\u003c/b\u003e","ratio":0.25,"replicas":3,"tiny":1.5e-7}},"path":"guestbook","repoURL":"https://github.com/argoproj/argocd-example-apps.git","targetRevision":"HEAD"},"syncPolicy":{"automated":{"prune":true,"selfHeal":false},"syncOptions":["CreateNamespace=true"]}}"#
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
