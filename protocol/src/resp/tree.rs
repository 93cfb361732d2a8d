//! The namespace rewrite of an autonomous agent's cached resource tree (upstream #1048).
//!
//! An autonomous agent's Argo CD caches each Application's resource tree
//! (`app|resources-tree|<app>|<version>[.gz]`: `ApplicationTree` as JSON, gzipped when the key
//! ends in `.gz`) with the namespaces of the agent's cluster. On the hub, the agent's
//! Applications live in the namespace named after the agent, so the hub's Argo CD UI, which
//! builds links from the tree, must see that namespace for `Application` and `ApplicationSet`
//! nodes (app-of-apps children, ApplicationSet-generated Applications). Both kinds are
//! rewritten, nodes and the parent references pointing at them alike: the UI only connects a
//! parent and a child whose namespaces are equal. Every other field, and every other node, is
//! kept as it was.
//!
//! The bytes come from the agent: decompression is bounded, and anything that does not parse
//! is reported so the caller can pass the bytes on unchanged.

use std::io::{Read as _, Write as _};

use serde_json::Value;

const ARGO_GROUP: &str = "argoproj.io";
const KINDS: [&str; 2] = ["Application", "ApplicationSet"];

/// Why a cached tree was not rewritten.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    /// The gzip stream is broken.
    #[error("the cached resource tree is not valid gzip: {0}")]
    Gzip(#[source] std::io::Error),
    /// Decompressed, it is larger than allowed.
    #[error("the cached resource tree is larger than {max} bytes decompressed")]
    TooLarge {
        /// The limit.
        max: usize,
    },
    /// It is not the JSON of a resource tree.
    #[error("the cached resource tree is not JSON: {0}")]
    Json(#[source] serde_json::Error),
}

/// `value` (the cached bytes; gzip when `gzip`) with the namespace of every `Application` and
/// `ApplicationSet` node, and of parent references to them, set to `namespace`; `None` when no
/// node needed it (pass the original bytes on). At most `max_bytes` are decompressed.
///
/// # Errors
///
/// [`TreeError`] when the bytes are not a (gzipped) JSON tree within `max_bytes`.
pub fn rewrite_app_namespaces(
    value: &[u8],
    gzip: bool,
    namespace: &str,
    max_bytes: usize,
) -> Result<Option<Vec<u8>>, TreeError> {
    let mut tree: Value = if gzip {
        let mut out = Vec::new();
        let limit = u64::try_from(max_bytes).unwrap_or(u64::MAX).saturating_add(1);
        let read = flate2::read::GzDecoder::new(value).take(limit).read_to_end(&mut out);
        if out.len() > max_bytes {
            return Err(TreeError::TooLarge { max: max_bytes });
        }
        match read {
            Ok(_) => serde_json::from_slice(&out).map_err(TreeError::Json)?,
            // Argo CD's cache flushes its gzip writer and never closes it (util/cache/redis.go
            // `marshal`): the stream ends after a sync flush, without a final block or trailer.
            // Go's gzip reader hands its JSON decoder every byte up to there, and the decoder
            // stops after one value; so do we. A stream cut anywhere else fails below.
            Err(e) => first_json_value(&out).ok_or(TreeError::Gzip(e))?,
        }
    } else {
        if value.len() > max_bytes {
            return Err(TreeError::TooLarge { max: max_bytes });
        }
        serde_json::from_slice(value).map_err(TreeError::Json)?
    };
    let mut changed = false;
    for list in ["nodes", "orphanedNodes"] {
        let Some(Value::Array(nodes)) = tree.get_mut(list) else { continue };
        for node in nodes {
            changed |= set_namespace(node, namespace);
            if let Some(Value::Array(parents)) = node.get_mut("parentRefs") {
                for parent in parents {
                    changed |= set_namespace(parent, namespace);
                }
            }
        }
    }
    if !changed {
        return Ok(None);
    }
    // As Argo CD writes it: Go's json.Encoder, one value and a newline.
    let mut text = serde_json::to_vec(&tree).map_err(TreeError::Json)?;
    text.push(b'\n');
    if !gzip {
        return Ok(Some(text));
    }
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(&text).map_err(TreeError::Gzip)?;
    encoder.finish().map(Some).map_err(TreeError::Gzip)
}

/// The first JSON value in `bytes`, when it is whole (as Go's `json.Decoder` reads one).
fn first_json_value(bytes: &[u8]) -> Option<Value> {
    serde_json::Deserializer::from_slice(bytes).into_iter::<Value>().next()?.ok()
}

/// Sets `namespace` on a node or reference of an Argo CD Application or ApplicationSet that
/// names another one; whether it changed.
fn set_namespace(reference: &mut Value, namespace: &str) -> bool {
    let Value::Object(fields) = reference else { return false };
    let is_argo = fields.get("group").and_then(Value::as_str) == Some(ARGO_GROUP)
        && fields.get("kind").and_then(Value::as_str).is_some_and(|k| KINDS.contains(&k));
    let current = fields.get("namespace").and_then(Value::as_str).unwrap_or("");
    if !is_argo || current.is_empty() || current == namespace {
        return false;
    }
    fields.insert("namespace".to_owned(), Value::String(namespace.to_owned()));
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An app-of-apps tree as Argo CD 3.x caches it on an autonomous agent (Go's field order).
    const TREE: &str = r#"{"nodes":[{"version":"v1","kind":"ApplicationSet","namespace":"argocd","name":"team","uid":"u1","group":"argoproj.io","resourceVersion":"7","health":{"status":"Healthy"},"createdAt":"2025-01-01T00:00:00Z"},{"version":"v1alpha1","kind":"Application","namespace":"argocd","name":"child","uid":"u2","group":"argoproj.io","parentRefs":[{"group":"argoproj.io","kind":"ApplicationSet","namespace":"argocd","name":"team","uid":"u1"}],"resourceVersion":"9","createdAt":"2025-01-01T00:00:00Z"},{"version":"v1","kind":"Deployment","namespace":"guestbook","name":"ui","uid":"u3","group":"apps","resourceVersion":"3"}],"hosts":[{"name":"node-1"}],"shardsCount":0}"#;

    fn gz(text: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(text).expect("gzip");
        e.finish().expect("gzip")
    }

    fn gunzip(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes).read_to_end(&mut out).expect("gunzip");
        out
    }

    #[test]
    fn application_and_applicationset_nodes_move_to_the_agent_namespace() {
        let input = gz(format!("{TREE}\n").as_bytes());
        let out = rewrite_app_namespaces(&input, true, "agent-auto", 1 << 20).expect("rewritten").expect("changed");
        let text = String::from_utf8(gunzip(&out)).expect("utf-8");
        assert!(text.ends_with("}\n"), "one JSON value and a newline, as Go writes it");
        let tree: Value = serde_json::from_str(&text).expect("json");
        let nodes = tree["nodes"].as_array().expect("nodes");
        assert_eq!(nodes[0]["namespace"], "agent-auto");
        assert_eq!(nodes[1]["namespace"], "agent-auto");
        assert_eq!(nodes[1]["parentRefs"][0]["namespace"], "agent-auto");
        assert_eq!(nodes[2]["namespace"], "guestbook", "other kinds keep their namespace");
        // Field order and unknown fields survive.
        let again: Value = serde_json::from_str(TREE).expect("json");
        assert_eq!(tree["hosts"], again["hosts"]);
        assert!(text.starts_with(r#"{"nodes":[{"version":"v1","kind":"ApplicationSet","namespace":"agent-auto""#));
    }

    /// What Argo CD's cache writes (util/cache/redis.go): the gzip writer flushed, never closed,
    /// so the stream has no final block and no trailer.
    fn gz_flushed_not_closed(text: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(text).expect("gzip");
        e.flush().expect("sync flush");
        e.get_ref().clone()
    }

    #[test]
    fn a_stream_flushed_and_not_closed_as_argo_cd_writes_it_is_read_up_to_its_value() {
        let input = gz_flushed_not_closed(format!("{TREE}\n").as_bytes());
        let mut strict = Vec::new();
        assert!(flate2::read::GzDecoder::new(&input[..]).read_to_end(&mut strict).is_err(), "no trailer");
        let out = rewrite_app_namespaces(&input, true, "agent-auto", 1 << 20).expect("rewritten").expect("changed");
        let tree: Value = serde_json::from_slice(&gunzip(&out)).expect("json");
        assert_eq!(tree["nodes"][1]["parentRefs"][0]["namespace"], "agent-auto");
        // Cut inside the value: still an error, never half a tree.
        let cut = &input[..input.len() / 2];
        assert!(matches!(rewrite_app_namespaces(cut, true, "x", 1 << 20), Err(TreeError::Gzip(_))));
    }

    #[test]
    fn trees_without_such_nodes_are_left_alone() {
        let plain = br#"{"nodes":[{"kind":"Pod","namespace":"a","name":"p","group":""}]}"#;
        assert!(rewrite_app_namespaces(plain, false, "x", 1 << 20).expect("parses").is_none());
        let done = TREE.replace("\"argocd\"", "\"agent-auto\"");
        assert!(rewrite_app_namespaces(done.as_bytes(), false, "agent-auto", 1 << 20).expect("parses").is_none());
    }

    #[test]
    fn bad_or_oversized_values_are_reported() {
        assert!(matches!(rewrite_app_namespaces(b"not gzip", true, "x", 1024), Err(TreeError::Gzip(_))));
        assert!(matches!(rewrite_app_namespaces(b"{", false, "x", 1024), Err(TreeError::Json(_))));
        let bomb = gz(&vec![b' '; 1 << 20]);
        assert!(matches!(rewrite_app_namespaces(&bomb, true, "x", 4096), Err(TreeError::TooLarge { max: 4096 })));
    }
}
