//! OpenAPI v3 documents: enough for kubectl to find each kind, see that the server validates
//! fields itself (`fieldValidation` on PATCH), and skip client-side schema validation.
//!
//! Every schema here preserves unknown fields, so kubectl validates nothing itself: the server
//! prunes and validates custom resources by their CRD's schema ([`crate::schema`]) and answers
//! `fieldValidation=Strict` as kube-apiserver does.

use std::collections::BTreeMap;
use std::hash::{Hash as _, Hasher as _};

use serde_json::{Value, json};

use crate::resource::{Registry, ResourceType};

/// Key of a group/version in the document index (`api/v1`, `apis/argoproj.io/v1alpha1`).
fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}

fn types_by_gv(registry: &Registry) -> BTreeMap<String, Vec<(String, std::sync::Arc<ResourceType>)>> {
    let mut out: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for t in registry.all() {
        for v in &t.versions {
            out.entry(gv_path(&t.group, v)).or_default().push((v.clone(), t.clone()));
        }
    }
    out
}

fn doc_hash(doc: &Value) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    doc.to_string().hash(&mut h);
    format!("{:016X}", h.finish())
}

/// `/openapi/v3`: the index of group/version documents.
#[must_use]
pub fn root(registry: &Registry) -> Value {
    let paths: serde_json::Map<String, Value> = types_by_gv(registry)
        .keys()
        .filter_map(|gv| {
            let doc = group_version(registry, gv)?;
            Some((gv.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={}", doc_hash(&doc))})))
        })
        .collect();
    json!({ "paths": paths })
}

fn schema_name(t: &ResourceType, version: &str) -> String {
    let group = if t.group.is_empty() {
        "io.k8s.api.core".to_string()
    } else {
        t.group.split('.').rev().collect::<Vec<_>>().join(".")
    };
    format!("{group}.{version}.{}", t.kind)
}

/// `/openapi/v3/{api/v1 | apis/group/version}`.
#[must_use]
pub fn group_version(registry: &Registry, gv: &str) -> Option<Value> {
    let all = types_by_gv(registry);
    let types = all.get(gv)?;
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    let param = |name: &str, place: &str| json!({"name": name, "in": place, "schema": {"type": "string"}, "required": place == "path"});
    for (version, t) in types {
        let gvk = json!({"group": t.group, "version": version, "kind": t.kind});
        let schema = schema_name(t, version);
        let reference = json!({"$ref": format!("#/components/schemas/{schema}")});
        schemas.insert(
            schema.clone(),
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true, "x-kubernetes-group-version-kind": [gvk.clone()]}),
        );
        let base = if t.group.is_empty() { format!("/api/{version}") } else { format!("/apis/{}/{version}", t.group) };
        let collection = if t.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", t.plural)
        } else {
            format!("{base}/{}", t.plural)
        };
        let mut common = vec![
            param("dryRun", "query"),
            param("fieldManager", "query"),
            param("fieldValidation", "query"),
            param("pretty", "query"),
        ];
        if t.namespaced {
            common.push(param("namespace", "path"));
        }
        let mut item_params = common.clone();
        item_params.push(param("name", "path"));
        // kubectl looks for `fieldValidation` among the PATCH operation's own parameters and
        // reads the operation's GVK extension as a single object (schemas carry a list).
        let op = |action: &str, params: &Vec<Value>| {
            json!({
                "parameters": params,
                "operationId": format!("{action}{}", t.kind),
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
                "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}},
            })
        };
        paths.insert(collection.clone(), json!({"get": op("list", &common), "post": op("post", &common)}));
        paths.insert(
            format!("{collection}/{{name}}"),
            json!({
                "get": op("get", &item_params),
                "put": op("put", &item_params),
                "patch": op("patch", &item_params),
                "delete": op("delete", &item_params),
            }),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (argocd-agent embedded API server)", "version": "v1.37.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// `/openapi/v2` as JSON: a valid Swagger 2.0 document without definitions. kubectl falls back to
/// it for kinds it validates on the client (such as `kind: List`); with no schema for a kind it
/// validates nothing and lets the server decide, as with a CRD that has no schema.
#[must_use]
pub fn v2_json() -> Value {
    json!({"swagger": "2.0", "info": {"title": "Kubernetes (argocd-agent embedded API server)", "version": "v1.37.0"}, "paths": {}})
}

/// The same document in gnostic's protobuf encoding (`openapi_v2.Document`), which is what
/// client-go asks for: swagger = 1, info = 2 (title = 1, version = 2), paths = 8.
#[must_use]
pub fn v2_protobuf() -> Vec<u8> {
    fn field(out: &mut Vec<u8>, number: u8, bytes: &[u8]) {
        out.push((number << 3) | 2); // length-delimited
        let mut len = bytes.len();
        loop {
            let byte = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.extend_from_slice(bytes);
    }
    let mut info = Vec::new();
    field(&mut info, 1, b"Kubernetes (argocd-agent embedded API server)");
    field(&mut info, 2, b"v1.37.0");
    let mut doc = Vec::new();
    field(&mut doc, 1, b"2.0");
    field(&mut doc, 2, &info);
    field(&mut doc, 8, &[]);
    doc
}

#[cfg(test)]
mod tests {
    #[test]
    fn v2_protobuf_is_the_expected_bytes() {
        let doc = super::v2_protobuf();
        assert_eq!(&doc[..5], &[0x0a, 3, b'2', b'.', b'0']);
        assert_eq!(doc[5], 0x12);
        assert_eq!(&doc[doc.len() - 2..], &[0x42, 0]);
    }
}
