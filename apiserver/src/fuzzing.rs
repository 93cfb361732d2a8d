//! Entry points for the fuzz targets (`apiserver/fuzz`), kept in the library so unit tests run
//! the same checks on stable over real and hostile inputs.

use serde_json::json;

use crate::builtin::{argocd_crds, builtin_types};
use crate::prepare::{self, Part, Target};
use crate::resource::ResourceType;

/// Feed untrusted bytes through everything a request body reaches before storage: decoding,
/// create and update preparation for a custom and a core kind (both parts), delete options
/// (JSON and protobuf), JSON patches (decoded and applied), and the path and query parsers.
/// Must never panic; every rejection must be a 4xx.
pub fn check_request_body(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = crate::http::route::parse(&text);
    if let Ok(params) = crate::http::query::parse(Some(&text)) {
        let _ = params.resource_version.as_deref().map(crate::http::query::parse_rv);
    }
    for content_type in ["application/json", crate::protobuf::CONTENT_TYPE] {
        if let Err(e) = prepare::delete_options(data, content_type) {
            assert!((400..500).contains(&e.code), "delete options: {e}");
        }
    }
    for validation in [prepare::FieldValidation::Ignore, prepare::FieldValidation::Warn] {
        match crate::jsonpatch::decode(data, validation) {
            Ok(p) => {
                let mut doc =
                    json!({"metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"l": [1, null, {"a": 2}]}});
                if let Err(e) = crate::jsonpatch::apply(&mut doc, &p.operations) {
                    assert_eq!(e.code, 422, "json patch apply: {e}");
                }
            }
            Err(e) => assert!((400..500).contains(&e.code), "json patch decode: {e}"),
        }
    }
    let mut types: Vec<ResourceType> = builtin_types();
    types.extend(argocd_crds().iter().filter_map(|c| ResourceType::from_crd(c).ok()));
    for content_type in ["application/json", "application/yaml"] {
        let body = match prepare::decode_body(data, content_type) {
            Ok(b) => b,
            Err(e) => {
                assert!((400..500).contains(&e.code), "decode: {e}");
                continue;
            }
        };
        for t in types.iter().filter(|t| {
            matches!(t.plural.as_str(), "applications" | "secrets" | "namespaces" | "customresourcedefinitions")
        }) {
            let ns = if t.namespaced { "argocd" } else { "" };
            let target = Target::new(t, &t.versions[0], ns);
            if let Err(e) = prepare::create(target, body.clone()) {
                assert!((400..500).contains(&e.code), "create {}: {e}", t.plural);
            }
            let existing = json!({
                "apiVersion": t.api_version(&t.versions[0]), "kind": t.kind,
                "metadata": {"name": "a", "namespace": ns, "uid": "u", "resourceVersion": "7", "generation": 1, "finalizers": ["f"]},
                "spec": {"x": 1}, "status": {"phase": "Ok"},
            });
            for part in [Part::Main, Part::Status] {
                if let Err(e) = prepare::update(target, &existing, body.clone(), part) {
                    assert!((400..500).contains(&e.code), "update {}: {e}", t.plural);
                }
            }
        }
    }
}

/// Feed untrusted bytes through what the simulated node parses from clients: the log and exec
/// query strings, the exec channel frames (v4 and v5, resize JSON included) and the
/// WebSocket subprotocol negotiation. Must never panic; every rejection must be a 400, and what
/// the log filters render must respect `limitBytes`.
pub fn check_node_inputs(data: &[u8]) {
    use crate::node::{channel, exec, logs};
    let text = String::from_utf8_lossy(data);
    match logs::parse_log_query(Some(&text)) {
        Ok(o) => {
            let now = chrono::Utc::now();
            let lines: Vec<logs::LogLine> = text
                .split('&')
                .enumerate()
                .map(|(i, part)| logs::LogLine {
                    time: now - chrono::Duration::seconds(i64::try_from(i).unwrap_or(0)),
                    data: bytes::Bytes::from(format!("{part}\n")),
                })
                .collect();
            let out = logs::render_all(&lines, &o, now);
            if let Some(limit) = o.limit_bytes {
                assert!(out.len() as u64 <= u64::try_from(limit).unwrap_or(0), "limitBytes {limit} exceeded");
            }
        }
        Err(e) => assert_eq!(e.code, 400, "log query: {e}"),
    }
    if let Err(e) = exec::parse_exec_query(Some(&text)) {
        assert_eq!(e.code, 400, "exec query: {e}");
    }
    for v5 in [true, false] {
        if let Ok(channel::ClientFrame::Close(_)) = channel::parse_client_frame(data, v5) {
            assert!(v5, "a close frame in v4");
        }
    }
    let _ = channel::negotiate([text.as_ref()]);
}

#[cfg(test)]
mod tests {
    use super::{check_node_inputs, check_request_body};

    #[test]
    fn node_inputs_never_panic() {
        let inputs: &[&[u8]] = &[
            b"container=a&follow=true&tailLines=2&limitBytes=5&timestamps=1&sinceSeconds=10",
            b"sinceTime=2026-01-01T00:00:00Z&previous=true",
            b"tailLines=99999999999999999999&sinceSeconds=9223372036854775807",
            b"limitBytes=-1&tailLines=-5&follow=perhaps",
            b"command=sh&command=-c&command=exit%203&stdin=1&tty=true",
            b"\x04{\"Width\":80,\"Height\":24}",
            b"\x04{\"Width\":-1}",
            b"\xff\x00",
            b"\xff",
            b"\x00hello",
            b"\x03",
            b"v5.channel.k8s.io, v4.channel.k8s.io",
            b"",
            b"\xff\xfe%%%&&&==",
        ];
        for input in inputs {
            check_node_inputs(input);
        }
    }

    #[test]
    fn real_and_hostile_bodies_never_panic() {
        let inputs: &[&[u8]] = &[
            br#"{"apiVersion":"argoproj.io/v1alpha1","kind":"Application","metadata":{"name":"guestbook","namespace":"argocd"},"spec":{"project":"default"}}"#,
            br#"{"kind":"Secret","apiVersion":"v1","metadata":{"name":"s"},"data":{"a":"not base64!"},"stringData":{"b":"c"}}"#,
            br#"{"metadata":{"name":"x","labels":{"a":["nested"]},"finalizers":"nope"}}"#,
            br#"{"metadata":"string"}"#,
            br#"{"metadata":{"generateName":"a-"},"status":{"phase":1}}"#,
            br#"{"spec":{"group":"","names":{},"versions":[{"name":"v1","served":true,"subresources":{"status":[]}}]}}"#,
            b"apiVersion: v1\nkind: Namespace\nmetadata: {name: [a]}\n",
            b"\xff\xfe\x00",
            b"/api/v1/namespaces/%ff%fe/..",
            b"labelSelector=a+in+(b&limit=-1&watch=maybe&resourceVersion=abc",
            br#"{"preconditions":{"uid":5}}"#,
            br#"{"dryRun":["All"],"propagationPolicy":"Sideways","orphanDependents":true}"#,
            br#"[{"op":"replace","path":"/status","value":{}},{"op":"copy","from":"/spec","path":"/spec/l/-1"}]"#,
            br#"[{"op":"move","from":"/spec/l/-1","path":"/spec/l/0"},{"op":"test","path":"x/~0~1"},null]"#,
            b"k8s\0\x0a\x13\x0a\x02v1\x12\x0dDeleteOptions\x12\x04\x12\x02\x0a\x00",
            b"",
            b"null",
            b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
        ];
        for input in inputs {
            check_request_body(input);
        }
        // Deep nesting must be rejected, not overflow the stack.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        check_request_body(deep.as_bytes());
    }
}
