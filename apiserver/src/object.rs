//! Object metadata: reading and writing the fields the server manages, and validating names.

use serde_json::{Map, Value};

/// `metadata.<field>` as a string, or "".
#[must_use]
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str).unwrap_or_default()
}

/// The metadata map, created if missing. A non-object root (callers validate bodies first, so
/// this does not happen) is replaced by an empty object rather than panicking.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = Value::Object(Map::new());
    }
    #[allow(clippy::expect_used)] // proven invariant: both were made objects just above
    obj.get_mut("metadata").and_then(Value::as_object_mut).expect("metadata is an object")
}

/// `metadata.finalizers`.
#[must_use]
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj["metadata"]["finalizers"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Whether deletion was requested.
#[must_use]
pub fn is_deleting(obj: &Value) -> bool {
    !meta_str(obj, "deletionTimestamp").is_empty()
}

/// The parsed `metadata.resourceVersion` of a request body; `None` when absent or empty.
#[must_use]
pub fn resource_version(obj: &Value) -> Option<&str> {
    Some(meta_str(obj, "resourceVersion")).filter(|s| !s.is_empty())
}

/// Whether two versions of an object differ outside metadata and status: what bumps `generation`.
#[must_use]
pub fn spec_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Map<String, Value> {
        v.as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    strip(old) != strip(new)
}

/// The current time as Kubernetes writes timestamps (RFC 3339, seconds, UTC).
#[must_use]
pub fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;

fn is_label_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
}

/// Validate a DNS-1123 label (namespace names).
///
/// # Errors
/// The Kubernetes message for an invalid label.
pub fn validate_dns1123_label(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= DNS1123_LABEL_MAX
        && name.chars().all(is_label_char)
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name', or '123-abc'), at most {DNS1123_LABEL_MAX} characters"
        ))
    }
}

/// Validate a DNS-1123 subdomain (most object names).
///
/// # Errors
/// The Kubernetes message for an invalid subdomain.
pub fn validate_dns1123_subdomain(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= DNS1123_SUBDOMAIN_MAX
        && name.split('.').all(|part| {
            !part.is_empty() && part.chars().all(is_label_char) && !part.starts_with('-') && !part.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com'), at most {DNS1123_SUBDOMAIN_MAX} characters"
        ))
    }
}

/// Validate label keys and values and annotation keys; returns field causes.
#[must_use]
pub fn validate_labels_and_annotations(obj: &Value) -> Vec<(String, String)> {
    let mut causes = Vec::new();
    for (field, check_value) in [("labels", true), ("annotations", false)] {
        let Some(v) = obj["metadata"].get(field) else { continue };
        if v.is_null() {
            continue;
        }
        let Some(map) = v.as_object() else {
            causes.push((format!("metadata.{field}"), "Invalid value: must be a map of string to string".into()));
            continue;
        };
        for (k, val) in map {
            if let Err(e) = validate_qualified_name(k) {
                causes.push((format!("metadata.{field}"), format!("Invalid value: \"{k}\": {e}")));
            }
            match val.as_str() {
                None => causes.push((format!("metadata.{field}.{k}"), "Invalid value: must be a string".into())),
                Some(s) if check_value && !is_label_value(s) => causes.push((
                    format!("metadata.labels.{k}"),
                    format!("Invalid value: \"{s}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, at most 63 characters"),
                )),
                Some(_) => {}
            }
        }
    }
    causes
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.chars().all(is_name_char)
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// A qualified name: optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
///
/// # Errors
/// What is wrong with the name.
pub fn validate_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        validate_dns1123_subdomain(p).map_err(|_| "prefix part must be a lowercase RFC 1123 subdomain".to_string())?;
    }
    if name.is_empty() || !is_label_value(name) {
        return Err("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, at most 63 characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names() {
        assert!(validate_dns1123_label("argocd").is_ok());
        assert!(validate_dns1123_label("Argo").is_err());
        assert!(validate_dns1123_label("a.b").is_err());
        assert!(validate_dns1123_label(&"a".repeat(64)).is_err());
        assert!(validate_dns1123_subdomain("applications.argoproj.io").is_ok());
        assert!(validate_dns1123_subdomain("a..b").is_err());
        assert!(validate_dns1123_subdomain("-a").is_err());
        assert!(validate_dns1123_subdomain("").is_err());
    }

    #[test]
    fn labels() {
        let ok = json!({"metadata": {"labels": {"app.kubernetes.io/name": "x", "a": ""}, "annotations": {"k": "any value: at all"}}});
        assert!(validate_labels_and_annotations(&ok).is_empty());
        let bad = json!({"metadata": {"labels": {"a b": "x", "ok": "-x", "n": 1}}});
        assert_eq!(validate_labels_and_annotations(&bad).len(), 3);
    }

    #[test]
    fn generation_ignores_metadata_and_status() {
        let a = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"x": 1}, "status": {"s": 1}});
        let b = json!({"metadata": {"labels": {"a": "2"}}, "spec": {"x": 1}, "status": {"s": 2}});
        let c = json!({"metadata": {}, "spec": {"x": 2}});
        assert!(!spec_changed(&a, &b));
        assert!(spec_changed(&a, &c));
    }
}
