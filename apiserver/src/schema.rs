//! Structural schemas of CustomResourceDefinitions: pruning, defaulting and validation of custom
//! resources, the way kube-apiserver does it (`k8s.io/apiextensions-apiserver/pkg/apiserver/schema`).
//!
//! A custom resource written to the server goes through, in this order:
//! 1. unknown fields: every field the schema does not know is collected (for `fieldValidation`)
//!    and removed, except below `x-kubernetes-preserve-unknown-fields: true`; `apiVersion`, `kind`
//!    and `metadata` of the root (and of `x-kubernetes-embedded-resource` objects) are kept, and
//!    `metadata` keeps only `ObjectMeta`'s fields;
//! 2. `null` where the schema does not say `nullable: true` is dropped (unless the field has a
//!    default);
//! 3. `default`s fill missing fields;
//! 4. validation: `type` (with `x-kubernetes-int-or-string`), `required`, `enum`, `nullable`,
//!    `minLength`/`maxLength`, `pattern`, `minimum`/`maximum`, `minItems`/`maxItems`,
//!    `minProperties`/`maxProperties`, `format: date-time`. Every failure is a field cause in a
//!    `422 Invalid`, worded as Kubernetes words it.
//!
//! Not implemented (no Argo CD CRD uses them): CEL rules (`x-kubernetes-validations`), `oneOf`,
//! `not`, list-type uniqueness (`x-kubernetes-list-type: set|map`) and formats other than
//! `date-time`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use serde_json::{Map, Value};

/// Fields of `ObjectMeta` (what survives in `metadata`).
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Whether a schema keeps what it does not describe (`x-kubernetes-preserve-unknown-fields`).
fn preserves_unknown(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true)
}

fn embedded(schema: &Value) -> bool {
    schema.get("x-kubernetes-embedded-resource").and_then(Value::as_bool) == Some(true)
}

/// Whether a schema prunes nothing at its root (no schema, or preserve-unknown-fields without
/// properties): the server then stores what it is given, as before schemas were known.
#[must_use]
pub fn preserves_everything(schema: &Value) -> bool {
    preserves_unknown(schema) && schema.get("properties").is_none() && schema.get("additionalProperties").is_none()
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

/// Remove every field `schema` does not know from a custom resource, returning the paths of the
/// removed fields (`spec.foo`, `spec.items[0].bar`), as kube-apiserver reports them.
pub fn prune_resource(obj: &mut Value, schema: &Value) -> Vec<String> {
    let mut unknown = Vec::new();
    prune_object(obj, schema, "", true, &mut unknown);
    unknown
}

fn prune_metadata(meta: &mut Value, path: &str, unknown: &mut Vec<String>) {
    if let Some(m) = meta.as_object_mut() {
        m.retain(|k, _| {
            let keep = OBJECT_META_FIELDS.contains(&k.as_str());
            if !keep {
                unknown.push(child(path, k));
            }
            keep
        });
    }
}

fn prune_object(obj: &mut Value, schema: &Value, path: &str, resource: bool, unknown: &mut Vec<String>) {
    match obj {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let preserve = preserves_unknown(schema);
            let mut drop = Vec::new();
            for (k, v) in map.iter_mut() {
                let p = child(path, k);
                if resource && matches!(k.as_str(), "apiVersion" | "kind") {
                    continue;
                }
                if resource && k == "metadata" {
                    prune_metadata(v, &p, unknown);
                    continue;
                }
                if let Some(s) = props.and_then(|ps| ps.get(k)) {
                    prune_value(v, s, &p, unknown);
                } else if let Some(s) = additional.filter(|a| a.is_object()) {
                    prune_value(v, s, &p, unknown);
                } else if preserve || additional.and_then(Value::as_bool) == Some(true) {
                    // Kept as is.
                } else {
                    drop.push(k.clone());
                }
            }
            for k in drop {
                map.remove(&k);
                unknown.push(child(path, &k));
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, v) in items.iter_mut().enumerate() {
                    prune_value(v, s, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

fn prune_value(v: &mut Value, schema: &Value, path: &str, unknown: &mut Vec<String>) {
    prune_object(v, schema, path, embedded(schema), unknown);
}

/// Drop `null`s the schema does not allow (no `nullable: true`, no `default`), as kube-apiserver
/// does before validating.
pub fn drop_disallowed_nulls(obj: &mut Value, schema: &Value) {
    match obj {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            map.retain(|k, v| {
                let Some(s) = props.and_then(|p| p.get(k)).or(additional) else { return true };
                if v.is_null() {
                    return s.get("nullable").and_then(Value::as_bool) == Some(true) || s.get("default").is_some();
                }
                drop_disallowed_nulls(v, s);
                true
            });
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for v in items {
                    drop_disallowed_nulls(v, s);
                }
            }
        }
        _ => {}
    }
}

/// Fill missing (or `null`, non-nullable) fields that have a `default`.
pub fn apply_defaults(obj: &mut Value, schema: &Value) {
    match obj {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, s) in props {
                    let Some(d) = s.get("default") else { continue };
                    let nullable = s.get("nullable").and_then(Value::as_bool) == Some(true);
                    match map.get(k) {
                        None => {
                            map.insert(k.clone(), d.clone());
                        }
                        Some(Value::Null) if !nullable => {
                            map.insert(k.clone(), d.clone());
                        }
                        Some(_) => {}
                    }
                }
                for (k, v) in map.iter_mut() {
                    if let Some(s) = props.get(k) {
                        apply_defaults(v, s);
                    }
                }
            } else if let Some(s) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for v in map.values_mut() {
                    apply_defaults(v, s);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for v in items {
                    apply_defaults(v, s);
                }
            }
        }
        _ => {}
    }
}

/// A validation failure: `(field, message)`, the message starting with Kubernetes' error type
/// (`Required value`, `Invalid value`, `Unsupported value`, `Too long`, ...).
pub type Cause = (String, String);

/// Validate a custom resource (after pruning and defaulting) against its schema. `metadata`,
/// `apiVersion` and `kind` of the root are validated elsewhere.
#[must_use]
pub fn validate_resource(obj: &Value, schema: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(map) = obj.as_object() else { return causes };
    let props = schema.get("properties").and_then(Value::as_object);
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for r in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(r) && !matches!(r, "apiVersion" | "kind" | "metadata") {
                causes.push((r.to_string(), "Required value".to_string()));
            }
        }
    }
    for (k, v) in map {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(s) = props.and_then(|p| p.get(k)) {
            validate(v, s, k, &mut causes);
        }
    }
    causes
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// How kube-apiserver quotes a value in a message.
fn quoted(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Object(_) => "\"object\"".to_string(),
        Value::Array(_) => "\"array\"".to_string(),
        other => other.to_string(),
    }
}

fn type_matches(want: &str, v: &Value) -> bool {
    match (want, json_type(v)) {
        (w, h) if w == h => true,
        ("number", "integer") => true,
        _ => false,
    }
}

fn regex(pattern: &str) -> Option<regex::Regex> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<regex::Regex>>>> = OnceLock::new();
    let mut cache = CACHE.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner);
    cache.entry(pattern.to_string()).or_insert_with(|| regex::Regex::new(pattern).ok()).clone()
}

fn validate(v: &Value, schema: &Value, path: &str, causes: &mut Vec<Cause>) {
    if v.is_null() {
        if schema.get("nullable").and_then(Value::as_bool) != Some(true) {
            let want = schema.get("type").and_then(Value::as_str).unwrap_or("object");
            causes.push((
                path.to_string(),
                format!("Invalid value: \"null\": {path} in body must be of type {want}: \"null\""),
            ));
        }
        return;
    }
    let int_or_string = schema.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true);
    if int_or_string {
        if !matches!(json_type(v), "integer" | "string") {
            let have = json_type(v);
            causes.push((
                path.to_string(),
                format!("Invalid value: \"{have}\": {path} in body must be of type integer,string: \"{have}\""),
            ));
            // As kube-openapi: the anyOf as a whole, then its first branch.
            if let Some(first) = schema.get("anyOf").and_then(Value::as_array).and_then(|a| a.first()) {
                causes.push((
                    "<nil>".to_string(),
                    format!("Invalid value: \"\": \"{path}\" must validate at least one schema (anyOf)"),
                ));
                if let Some(t) = first.get("type").and_then(Value::as_str) {
                    causes.push((
                        path.to_string(),
                        format!("Invalid value: \"{have}\": {path} in body must be of type {t}: \"{have}\""),
                    ));
                }
            }
            return;
        }
    } else if let Some(want) = schema.get("type").and_then(Value::as_str)
        && !type_matches(want, v)
    {
        causes.push((
            path.to_string(),
            format!("Invalid value: \"{}\": {path} in body must be of type {want}: \"{}\"", json_type(v), json_type(v)),
        ));
        return;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(v)
    {
        let supported = options.iter().map(quoted).collect::<Vec<_>>().join(", ");
        causes.push((path.to_string(), format!("Unsupported value: {}: supported values: {supported}", quoted(v))));
    }
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    let count = |k: &str| schema.get(k).and_then(Value::as_u64);
    match v {
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(max) = count("maxLength")
                && len > max
            {
                causes.push((path.to_string(), format!("Too long: may not be more than {max} bytes")));
            }
            if let Some(min) = count("minLength")
                && len < min
            {
                causes.push((
                    path.to_string(),
                    format!("Invalid value: {}: {path} in body should be at least {min} chars long", quoted(v)),
                ));
            }
            if let Some(p) = schema.get("pattern").and_then(Value::as_str)
                && regex(p).is_some_and(|re| !re.is_match(s))
            {
                causes.push((
                    path.to_string(),
                    format!("Invalid value: {}: {path} in body should match '{p}'", quoted(v)),
                ));
            }
            if schema.get("format").and_then(Value::as_str) == Some("date-time")
                && chrono::DateTime::parse_from_rfc3339(s).is_err()
            {
                causes.push((
                    path.to_string(),
                    format!("Invalid value: {}: {path} in body must be of type date-time: {}", quoted(v), quoted(v)),
                ));
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or_default();
            if let Some(max) = num("maximum")
                && x > max
            {
                causes.push((
                    path.to_string(),
                    format!("Invalid value: {n}: {path} in body should be less than or equal to {max}"),
                ));
            }
            if let Some(min) = num("minimum")
                && x < min
            {
                causes.push((
                    path.to_string(),
                    format!("Invalid value: {n}: {path} in body should be greater than or equal to {min}"),
                ));
            }
        }
        Value::Array(items) => {
            let len = items.len() as u64;
            if let Some(max) = count("maxItems")
                && len > max
            {
                causes.push((path.to_string(), format!("Too many: {len}: must have at most {max} items")));
            }
            if let Some(min) = count("minItems")
                && len < min
            {
                causes.push((
                    path.to_string(),
                    format!("Invalid value: {len}: {path} in body should have at least {min} items"),
                ));
            }
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate(item, s, &format!("{path}[{i}]"), causes);
                }
            }
        }
        Value::Object(map) => validate_object(map, schema, path, causes),
        _ => {}
    }
}

fn validate_object(map: &Map<String, Value>, schema: &Value, path: &str, causes: &mut Vec<Cause>) {
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for r in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(r) {
                causes.push((child(path, r), "Required value".to_string()));
            }
        }
    }
    let len = map.len() as u64;
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
        && len > max
    {
        causes.push((path.to_string(), format!("Too many: {len}: must have at most {max} items")));
    }
    if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
        && len < min
    {
        causes.push((
            path.to_string(),
            format!("Invalid value: {len}: {path} in body should have at least {min} properties"),
        ));
    }
    if embedded(schema) {
        // An embedded resource needs apiVersion and kind (its metadata is an ObjectMeta).
        for k in ["apiVersion", "kind"] {
            if map.get(k).and_then(Value::as_str).is_none_or(str::is_empty) {
                causes.push((child(path, k), "Required value: must not be empty".to_string()));
            }
        }
    }
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    for (k, v) in map {
        if embedded(schema) && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(s) = props.and_then(|p| p.get(k)).or(additional) {
            // Keys of a map (additionalProperties) are shown as `path[key]`.
            let p = if props.is_some_and(|p| p.contains_key(k)) { child(path, k) } else { format!("{path}[{k}]") };
            validate(v, s, &p, causes);
        }
    }
}

/// Kubernetes' reason for a field cause, from the error type its message starts with.
#[must_use]
pub fn cause_reason(message: &str) -> &'static str {
    if message.starts_with("Required value") {
        "FieldValueRequired"
    } else if message.starts_with("Unsupported value") {
        "FieldValueNotSupported"
    } else if message.starts_with("Too long") {
        "FieldValueTooLong"
    } else if message.starts_with("Too many") {
        "FieldValueTooMany"
    } else if message.starts_with("Duplicate value") {
        "FieldValueDuplicate"
    } else if message.starts_with("Forbidden") {
        "FieldValueForbidden"
    } else if message.starts_with("namespace ") && message.ends_with(" is being terminated") {
        "NamespaceTerminating"
    } else if message.starts_with("Invalid value") && message.contains(" in body must be of type ") {
        "FieldValueTypeInvalid"
    } else {
        "FieldValueInvalid"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1, "maxLength": 5, "pattern": "^[a-z]+$"},
                        "count": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                        "phase": {"type": "string", "enum": ["A", "B"]},
                        "mode": {"type": "string", "default": "auto"},
                        "when": {"type": "string", "format": "date-time"},
                        "opt": {"type": "string", "nullable": true},
                        "items": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"k": {"type": "object", "properties": {}}}},
                        "raw": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true},
                    },
                },
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            },
        })
    }

    #[test]
    fn pruning_keeps_what_the_schema_knows_and_reports_the_rest() {
        let mut obj = json!({
            "apiVersion": "x.io/v1", "kind": "X",
            "metadata": {"name": "a", "labels": {"k": "v"}, "bogus": 1},
            "spec": {"name": "a", "extra": 1, "items": [{"x": 1, "y": 2}], "labels": {"a": "b"},
                     "free": {"anything": {"deep": 1}, "k": {"gone": 1}}, "raw": {"apiVersion": "v1", "kind": "K", "z": 1}},
            "status": {"whatever": true},
            "top": 1,
        });
        let mut unknown = prune_resource(&mut obj, &schema());
        unknown.sort();
        assert_eq!(unknown, ["metadata.bogus", "spec.extra", "spec.free.k.gone", "spec.items[0].y", "top"]);
        assert_eq!(obj["spec"]["items"], json!([{"x": 1}]));
        assert_eq!(obj["spec"]["free"]["anything"]["deep"], 1);
        assert_eq!(obj["spec"]["raw"]["z"], 1);
        assert_eq!(obj["status"]["whatever"], true);
        assert_eq!(obj["metadata"], json!({"name": "a", "labels": {"k": "v"}}));
        assert_eq!(obj["apiVersion"], "x.io/v1");
    }

    #[test]
    fn nulls_are_dropped_defaults_filled() {
        let mut obj = json!({"spec": {"name": "a", "phase": null, "opt": null, "mode": null}});
        drop_disallowed_nulls(&mut obj, &schema());
        apply_defaults(&mut obj, &schema());
        assert_eq!(obj, json!({"spec": {"name": "a", "opt": null, "mode": "auto"}}));
        let mut obj = json!({"spec": {"name": "a"}});
        apply_defaults(&mut obj, &schema());
        assert_eq!(obj["spec"]["mode"], "auto");
        assert!(validate_resource(&obj, &schema()).is_empty());
    }

    #[test]
    fn validation_names_each_field_with_kubernetes_reasons() {
        let obj = json!({"spec": {"name": "TOOLONG", "count": true, "phase": "C", "when": "yesterday",
                                  "items": [{"x": "one"}], "labels": {"a": 1}}});
        let causes = validate_resource(&obj, &schema());
        let mut got: Vec<(&str, &str)> = causes.iter().map(|(f, m)| (f.as_str(), cause_reason(m))).collect();
        got.sort_unstable();
        assert_eq!(
            got,
            [
                ("<nil>", "FieldValueInvalid"),
                ("spec.count", "FieldValueTypeInvalid"),
                ("spec.count", "FieldValueTypeInvalid"),
                ("spec.items[0].x", "FieldValueTypeInvalid"),
                ("spec.labels[a]", "FieldValueTypeInvalid"),
                ("spec.name", "FieldValueInvalid"),
                ("spec.name", "FieldValueTooLong"),
                ("spec.phase", "FieldValueNotSupported"),
                ("spec.when", "FieldValueTypeInvalid"),
            ]
        );
        let missing = validate_resource(&json!({"spec": {}}), &schema());
        assert_eq!(missing, [("spec.name".to_string(), "Required value".to_string())]);
        let no_spec = validate_resource(&json!({"metadata": {}}), &schema());
        assert_eq!(no_spec, [("spec".to_string(), "Required value".to_string())]);
        assert!(preserves_everything(&json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})));
        assert!(!preserves_everything(&schema()));
    }
}
