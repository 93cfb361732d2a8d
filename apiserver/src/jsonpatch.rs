//! RFC 6902 JSON patches, applied exactly as kube-apiserver applies them.
//!
//! kube-apiserver does not apply JSON patches by the letter of RFC 6902: it uses
//! `gopkg.in/evanphx/json-patch.v4` (v4.13.0 in Kubernetes v1.37), whose behaviour Go clients
//! rely on without knowing it. Upstream argocd-agent's principal, for one, writes a managed
//! agent's first status with `replace /status` on an Application that has none, which the RFC
//! (and the `json-patch` crate) refuse and kube-apiserver accepts. So this module reimplements
//! that library's rules rather than the RFC's:
//!
//! - a body of `null` is an empty patch (no-op); any other non-array is malformed (400);
//! - `replace` of a member an object does not have adds it (only array indexes must exist);
//! - negative array indexes count from the end (`-1` is the last element; for `add`, `-1` is
//!   after the last one, like `-`); leading `+` and zeros are accepted, as Go's `strconv.Atoi`;
//! - a `null` member counts as missing when a path walks through it or `test`s it, and an
//!   absent `value` is `null`;
//! - `copy` from a member that does not exist copies `null`;
//! - the text before a path's first `/` is ignored (`a/b` means `/b`), and `~1`/`~0` are
//!   unescaped in one left-to-right pass;
//! - an unknown `op` or an operation without a `path` fails the patch (422), as any operation that
//!   does not apply; an element that is not an object (or `null`) is malformed (400).
//!
//! kube-apiserver's own bounds are kept: at most [`MAX_OPERATIONS`] operations (413), and `copy`
//! may add at most [`MAX_COPY_BYTES`] in total (422), so a short patch cannot double an object
//! into gigabytes. Under `fieldValidation=Warn` (the default) or `Strict`, kube-apiserver first
//! decodes the patch strictly: `op`, `path` and `from` of another type than string are malformed
//! (400), and unknown members of an operation are warned about (`Warn`) or refused (`Strict`,
//! 422). Where the Go library would panic (a root `replace` without a value), this module
//! refuses with a 422.

use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};
use crate::prepare::FieldValidation;

/// The most operations kube-apiserver applies from one JSON patch (`maxJSONPatchOperations`).
pub const MAX_OPERATIONS: usize = 10_000;

/// The most bytes `copy` operations may add in one patch (kube-apiserver's
/// `JSONPatchMaxCopyBytes`, set as json-patch's `AccumulatedCopySizeLimit`).
pub const MAX_COPY_BYTES: usize = 3 * 1024 * 1024;

/// One operation as decoded: its members, or `None` for a `null` element.
pub type Operation = Option<Map<String, Value>>;

/// The members kube-apiserver's strict decoding knows in an operation.
const KNOWN_MEMBERS: [&str; 4] = ["op", "path", "from", "value"];

/// A decoded JSON patch, with what strict decoding found to warn about.
#[derive(Debug, Clone, Default)]
pub struct Patch {
    /// The operations in order.
    pub operations: Vec<Operation>,
    /// Unknown members, as kube-apiserver words them (`json patch unknown field "[0].x"`).
    pub strict_errors: Vec<String>,
}

/// Decode a JSON patch body as kube-apiserver does.
///
/// # Errors
/// 400 for a body that is not JSON, not an array (or `null`), has an element that is not an
/// object (or `null`), or (unless `fieldValidation=Ignore`) an `op`, `path` or `from` that is
/// not a string; 413 for more than [`MAX_OPERATIONS`] operations.
pub fn decode(body: &[u8], validation: FieldValidation) -> ApiResult<Patch> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the JSON patch is not valid JSON: {e}")))?;
    let elements = match v {
        Value::Null => Vec::new(),
        Value::Array(a) => a,
        other => {
            return Err(ApiError::bad_request(format!(
                "a JSON patch must be an array of operations (or null), not {}",
                type_name(&other)
            )));
        }
    };
    let mut patch = Patch::default();
    for (i, e) in elements.into_iter().enumerate() {
        let op = match e {
            Value::Null => None,
            Value::Object(m) => Some(m),
            other => {
                return Err(ApiError::bad_request(format!(
                    "JSON patch operation {i} must be an object, not {}",
                    type_name(&other)
                )));
            }
        };
        if validation != FieldValidation::Ignore
            && let Some(m) = &op
        {
            for member in ["op", "path", "from"] {
                if let Some(v) = m.get(member).filter(|v| !v.is_string() && !v.is_null()) {
                    return Err(ApiError::bad_request(format!(
                        "error decoding patch: operation {i}: {member:?} must be a string, not {}",
                        type_name(v)
                    )));
                }
            }
            for k in m.keys().filter(|k| !KNOWN_MEMBERS.contains(&k.as_str())) {
                // sigs.k8s.io/json stops collecting after 100.
                if patch.strict_errors.len() < 100 {
                    patch.strict_errors.push(format!("json patch unknown field \"[{i}].{k}\""));
                }
            }
        }
        patch.operations.push(op);
    }
    if patch.operations.len() > MAX_OPERATIONS {
        return Err(ApiError::entity_too_large(format!(
            "The allowed maximum operations in a JSON patch is {MAX_OPERATIONS}, got {}",
            patch.operations.len()
        )));
    }
    Ok(patch)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Apply decoded operations to `doc`, in order; on error `doc` may be partly patched (callers
/// patch a copy).
///
/// # Errors
/// 422 Invalid when an operation does not apply, naming it and why.
pub fn apply(doc: &mut Value, operations: &[Operation]) -> ApiResult<()> {
    let mut copied = 0usize;
    for (i, op) in operations.iter().enumerate() {
        let empty = Map::new();
        let op = op.as_ref().unwrap_or(&empty);
        apply_one(doc, op, &mut copied)
            .map_err(|e| ApiError::invalid_patch(format!("the JSON patch cannot be applied: operation {i}: {e}")))?;
    }
    Ok(())
}

/// Go's `Operation.Kind`: the `op` string, or "unknown".
fn kind(op: &Map<String, Value>) -> &str {
    op.get("op").and_then(Value::as_str).unwrap_or("unknown")
}

/// Go's `Operation.Path`/`From`: a present, non-null string member.
fn member<'a>(op: &'a Map<String, Value>, name: &str) -> Result<&'a str, String> {
    match op.get(name) {
        None | Some(Value::Null) => Err(format!("operation missing {name} field")),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!("{name} must be a string, not {}", type_name(other))),
    }
}

/// An absent `value` is `null`.
fn value(op: &Map<String, Value>) -> Value {
    op.get("value").cloned().unwrap_or(Value::Null)
}

fn apply_one(doc: &mut Value, op: &Map<String, Value>, copied: &mut usize) -> Result<(), String> {
    match kind(op) {
        "add" => {
            let path = member(op, "path")?;
            let (con, key) = find_object(doc, path).ok_or_else(|| missing("add", path))?;
            add(con, &key, value(op))
        }
        "remove" => {
            let path = member(op, "path")?;
            let (con, key) = find_object(doc, path).ok_or_else(|| missing("remove", path))?;
            remove(con, &key).map(drop)
        }
        "replace" => {
            let path = member(op, "path")?;
            if path.is_empty() {
                let v = value(op);
                if !v.is_object() && !v.is_array() {
                    return Err("replace operation value must be object or array".into());
                }
                *doc = v;
                return Ok(());
            }
            let (con, key) = find_object(doc, path).ok_or_else(|| missing("replace", path))?;
            // Only arrays check that the member exists: a missing object member is added.
            if let Value::Array(a) = con {
                let i = array_index(&key, a.len())?;
                a[i] = value(op);
            } else if let Value::Object(m) = con {
                m.insert(key, value(op));
            }
            Ok(())
        }
        "move" => {
            let from = member(op, "from")?;
            let (con, key) = find_object(doc, from).ok_or_else(|| missing("move", from))?;
            get(con, &key)?;
            let val = remove(con, &key)?;
            let path = member(op, "path")?;
            let (con, key) = find_object(doc, path).ok_or_else(|| missing("move", path))?;
            add(con, &key, val)
        }
        "test" => {
            let path = member(op, "path")?;
            let want = op.get("value");
            let ok = if path.is_empty() {
                want.is_some_and(|w| w == doc)
            } else {
                let (con, key) = find_object(doc, path).ok_or_else(|| missing("test", path))?;
                match get(con, &key)?.filter(|v| !v.is_null()) {
                    None => want.is_none_or(Value::is_null),
                    Some(have) => want.is_some_and(|w| w == have),
                }
            };
            if ok { Ok(()) } else { Err(format!("testing value {path} failed: test failed")) }
        }
        "copy" => {
            let from = member(op, "from")?;
            let (con, key) = find_object(doc, from).ok_or_else(|| missing("copy", from))?;
            let val = get(con, &key)?.cloned().unwrap_or(Value::Null);
            let path = member(op, "path")?;
            let (con, key) = find_object(doc, path).ok_or_else(|| missing("copy", path))?;
            if !val.is_null() {
                *copied = copied.saturating_add(serde_json::to_vec(&val).map_or(usize::MAX, |b| b.len()));
            }
            if *copied > MAX_COPY_BYTES {
                return Err(format!(
                    "Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the limit {MAX_COPY_BYTES}"
                ));
            }
            add(con, &key, val)
        }
        other => Err(format!("Unexpected kind: {other}")),
    }
}

fn missing(what: &str, path: &str) -> String {
    format!("{what} operation does not apply: doc is missing path: \"{path}\": missing value")
}

/// RFC 6901 unescaping as json-patch v4 does it: one pass, `~1` before `~0` at each position.
fn decode_key(k: &str) -> String {
    let mut out = String::with_capacity(k.len());
    let mut rest = k;
    while let Some(i) = rest.find('~') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(t) = tail.strip_prefix("~1") {
            out.push('/');
            rest = t;
        } else if let Some(t) = tail.strip_prefix("~0") {
            out.push('~');
            rest = t;
        } else {
            out.push('~');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The container a path's last token lives in, and that token. `None` when the path has no `/`,
/// or a token before the last does not lead to an object or array (missing, `null`, a scalar, a
/// bad index).
fn find_object<'a>(doc: &'a mut Value, path: &str) -> Option<(&'a mut Value, String)> {
    let split: Vec<&str> = path.split('/').collect();
    let (last, parts) = split.split_last()?;
    let parts = parts.get(1..)?;
    let mut cur = doc;
    for part in parts {
        let key = decode_key(part);
        let next = match cur {
            Value::Object(m) => m.get_mut(&key)?,
            Value::Array(a) => {
                let i = array_index(&key, a.len()).ok()?;
                &mut a[i]
            }
            _ => return None,
        };
        if !next.is_object() && !next.is_array() {
            return None;
        }
        cur = next;
    }
    Some((cur, decode_key(last)))
}

/// Go's `strconv.Atoi`: optional sign, decimal digits, 64-bit range.
fn atoi(key: &str) -> Result<i64, String> {
    key.parse::<i64>().map_err(|_| format!("value was not a proper array index: '{key}'"))
}

/// An existing element's index (negative counts from the end).
fn array_index(key: &str, len: usize) -> Result<usize, String> {
    let n = i64::try_from(len).unwrap_or(i64::MAX);
    let mut idx = atoi(key)?;
    if idx < 0 {
        if idx < -n {
            return Err(format!("Unable to access invalid index: {idx}: invalid index referenced"));
        }
        idx += n;
    }
    if idx >= n {
        return Err(format!("Unable to access invalid index: {idx}: invalid index referenced"));
    }
    usize::try_from(idx).map_err(|_| format!("Unable to access invalid index: {idx}: invalid index referenced"))
}

/// A member or element, `None` when an object lacks it; a bad array index is an error.
fn get<'a>(con: &'a Value, key: &str) -> Result<Option<&'a Value>, String> {
    match con {
        Value::Object(m) => Ok(m.get(key)),
        Value::Array(a) => array_index(key, a.len()).map(|i| a.get(i)),
        _ => Ok(None),
    }
}

fn add(con: &mut Value, key: &str, val: Value) -> Result<(), String> {
    match con {
        Value::Object(m) => {
            m.insert(key.to_string(), val);
            Ok(())
        }
        Value::Array(a) => {
            if key == "-" {
                a.push(val);
                return Ok(());
            }
            let size = i64::try_from(a.len()).unwrap_or(i64::MAX).saturating_add(1);
            let mut idx = atoi(key).map_err(|e| format!("error in add for path: '{key}': {e}"))?;
            if idx >= size || idx < -size {
                return Err(format!("Unable to access invalid index: {idx}: invalid index referenced"));
            }
            if idx < 0 {
                idx += size;
            }
            let i = usize::try_from(idx).map_err(|_| format!("Unable to access invalid index: {idx}"))?;
            a.insert(i, val);
            Ok(())
        }
        _ => Err("the target is not an object or array".into()),
    }
}

fn remove(con: &mut Value, key: &str) -> Result<Value, String> {
    match con {
        Value::Object(m) => {
            m.shift_remove(key).ok_or_else(|| format!("Unable to remove nonexistent key: {key}: missing value"))
        }
        Value::Array(a) => {
            let i = array_index(key, a.len())?;
            Ok(a.remove(i))
        }
        _ => Err("the target is not an object or array".into()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{MAX_COPY_BYTES, MAX_OPERATIONS, apply, decode};
    use crate::prepare::FieldValidation;

    fn run(doc: Value, patch: Value) -> Result<Value, u16> {
        let p = decode(&serde_json::to_vec(&patch).unwrap(), FieldValidation::Warn).map_err(|e| e.code)?;
        let mut d = doc;
        apply(&mut d, &p.operations).map_err(|e| e.code)?;
        Ok(d)
    }

    /// (document, patch, what gopkg.in/evanphx/json-patch.v4 v4.13.0 answers): its output, or
    /// `DecodePatch` failing (400 here) or `Apply` failing (422 here). Generated by running the
    /// Go library on each row; rows where it panics are left out (see the module docs).
    const GO_LIBRARY: &[(&str, &str, Result<&str, u16>)] = &[
        (
            r#"{"metadata":{"name":"a"},"spec":{}}"#,
            r#"[{"op":"replace","path":"/status","value":{"health":{"status":"Healthy"}}}]"#,
            Ok(r#"{"metadata":{"name":"a"},"spec":{},"status":{"health":{"status":"Healthy"}}}"#),
        ),
        (r#"{}"#, r#"[{"op":"replace","path":"/a/b","value":1}]"#, Err(422)),
        (r#"{"a":[1]}"#, r#"[{"op":"replace","path":"/a/1","value":2}]"#, Err(422)),
        (r#"{"a":1}"#, r#"null"#, Ok(r#"{"a":1}"#)),
        (r#"{}"#, r#"{}"#, Err(400)),
        (r#"{}"#, r#""x""#, Err(400)),
        (r#"{}"#, r#"[1]"#, Err(400)),
        (r#"{"a":[1,2,3]}"#, r#"[{"op":"replace","path":"/a/-1","value":9}]"#, Ok(r#"{"a":[1,2,9]}"#)),
        (r#"{"a":[1,2,3]}"#, r#"[{"op":"remove","path":"/a/-3"}]"#, Ok(r#"{"a":[2,3]}"#)),
        (r#"{"a":[1,2,3]}"#, r#"[{"op":"add","path":"/a/-1","value":4}]"#, Ok(r#"{"a":[1,2,3,4]}"#)),
        (r#"{"a":[1,2,3]}"#, r#"[{"op":"add","path":"/a/-","value":4}]"#, Ok(r#"{"a":[1,2,3,4]}"#)),
        (r#"{"a":[1,2,3]}"#, r#"[{"op":"add","path":"/a/+01","value":0}]"#, Ok(r#"{"a":[1,0,2,3]}"#)),
        (r#"{"a":[1,2,3]}"#, r#"[{"op":"remove","path":"/a/-4"}]"#, Err(422)),
        (r#"{"a":[1,2,3]}"#, r#"[{"op":"add","path":"/a/4","value":0}]"#, Err(422)),
        (r#"{"a":[1,2,3]}"#, r#"[{"op":"add","path":"/a/-4","value":0}]"#, Ok(r#"{"a":[0,1,2,3]}"#)),
        (r#"{"a":[1,2,3]}"#, r#"[{"op":"add","path":"/a/-5","value":0}]"#, Err(422)),
        (r#"{"a":[1,2,3]}"#, r#"[{"op":"remove","path":"/a/x"}]"#, Err(422)),
        (r#"{"a":{"b":null},"c":1}"#, r#"[{"op":"remove","path":"/x"}]"#, Err(422)),
        (r#"{"a":{"b":null},"c":1}"#, r#"[{"op":"move","from":"/x","path":"/y"}]"#, Err(422)),
        (r#"{}"#, r#"[{"op":"copy","from":"/x","path":"/y"}]"#, Ok(r#"{"y":null}"#)),
        (r#"{"a":{"b":null},"c":1}"#, r#"[{"op":"test","path":"/a/b","value":null}]"#, Ok(r#"{"a":{"b":null},"c":1}"#)),
        (r#"{"a":{"b":null},"c":1}"#, r#"[{"op":"test","path":"/a/z"}]"#, Ok(r#"{"a":{"b":null},"c":1}"#)),
        (r#"{"a":{"b":null},"c":1}"#, r#"[{"op":"test","path":"/c","value":2}]"#, Err(422)),
        (r#"{"a":{"b":null},"c":1}"#, r#"[{"op":"test","path":"/c","value":null}]"#, Err(422)),
        (r#"{"a":{"b":null},"c":1}"#, r#"[{"op":"test","path":"/c"}]"#, Err(422)),
        (r#"{"a":{"b":null},"c":1}"#, r#"[{"op":"add","path":"/a/b/c","value":1}]"#, Err(422)),
        (r#"{}"#, r#"[{"op":"add","path":"/n"}]"#, Ok(r#"{"n":null}"#)),
        (r#"{}"#, r#"[{"op":"add","path":"x/n","value":1}]"#, Ok(r#"{"n":1}"#)),
        (r#"{}"#, r#"[{"op":"add","path":"/a~1b~01","value":1}]"#, Ok(r#"{"a/b~1":1}"#)),
        (r#"{}"#, r#"[{"op":"merge","path":"/a"}]"#, Err(422)),
        (r#"{}"#, r#"[null]"#, Err(422)),
        (r#"{}"#, r#"[{"op":"add","value":1}]"#, Err(422)),
        (r#"{}"#, r#"[{"op":1,"path":"/a"}]"#, Err(422)),
        (r#"{"a":1}"#, r#"[{"op":"replace","path":"","value":{"b":2}}]"#, Ok(r#"{"b":2}"#)),
        (r#"{"a":1}"#, r#"[{"op":"replace","path":"","value":null}]"#, Err(422)),
        (r#"{"a":[1,null,2]}"#, r#"[{"op":"test","path":"/a/1","value":null}]"#, Ok(r#"{"a":[1,null,2]}"#)),
        (r#"{"a":[1,null,2]}"#, r#"[{"op":"replace","path":"/a/1","value":5}]"#, Ok(r#"{"a":[1,5,2]}"#)),
        (r#"{"a":1}"#, r#"[{"op":"test","path":"","value":{"a":1}}]"#, Ok(r#"{"a":1}"#)),
        (r#"{"a":{"x":1}}"#, r#"[{"op":"move","from":"/a","path":"/a/y"}]"#, Err(422)),
        (r#"{"a":{"x":1}}"#, r#"[{"op":"move","from":"/a/x","path":"/b"}]"#, Ok(r#"{"a":{},"b":1}"#)),
        (r#"{"a":[1,2]}"#, r#"[{"op":"move","from":"/a/-1","path":"/a/0"}]"#, Ok(r#"{"a":[2,1]}"#)),
        (r#"{"a":[1,2]}"#, r#"[{"op":"copy","from":"/a/5","path":"/b"}]"#, Err(422)),
        (r#"{"a":[1,2]}"#, r#"[{"op":"add","path":"/a/01","value":9}]"#, Ok(r#"{"a":[1,9,2]}"#)),
        (r#"{"a":[1,2]}"#, r#"[{"op":"add","path":"/a/ 1","value":9}]"#, Err(422)),
        (r#"{"a":[1,2]}"#, r#"[{"op":"add","path":"/a/1.0","value":9}]"#, Err(422)),
        (r#"{"a":1}"#, r#"[{"op":"add","path":"/","value":9}]"#, Ok(r#"{"":9,"a":1}"#)),
        (r#"{"a":"s"}"#, r#"[{"op":"add","path":"/a/b","value":9}]"#, Err(422)),
        (r#"{"a":{"b":1}}"#, r#"[{"op":"remove","path":"a"}]"#, Err(422)),
        (r#"{"a":{"b":1}}"#, r#"[{"op":"replace","path":"/a/b","value":2,"op":"remove"}]"#, Ok(r#"{"a":{}}"#)),
        (r#"{"a":1}"#, r#"[{"op":"test","path":"/a","value":1.0}]"#, Err(422)),
        (r#"{"a":[]}"#, r#"[{"op":"remove","path":"/a/-0"}]"#, Err(422)),
        (r#"{"a":[]}"#, r#"[{"op":"add","path":"/a/-0","value":1}]"#, Ok(r#"{"a":[1]}"#)),
        (r#"{"a":{"~":1}}"#, r#"[{"op":"test","path":"/a/~","value":1}]"#, Ok(r#"{"a":{"~":1}}"#)),
        (r#"{"a":{"~2":1}}"#, r#"[{"op":"test","path":"/a/~2","value":1}]"#, Ok(r#"{"a":{"~2":1}}"#)),
    ];

    #[test]
    fn answers_as_the_go_library_does() {
        for (doc, patch, want) in GO_LIBRARY {
            let got = decode(patch.as_bytes(), FieldValidation::Ignore).map_err(|e| e.code).and_then(|p| {
                let mut d: Value = serde_json::from_str(doc).unwrap();
                apply(&mut d, &p.operations).map(|()| d).map_err(|e| e.code)
            });
            let want = want.map(|w| serde_json::from_str::<Value>(w).unwrap());
            assert_eq!(got, want, "{doc} patched with {patch}");
        }
    }

    #[test]
    fn replace_of_a_missing_member_adds_it() {
        let doc = json!({"metadata": {"name": "a"}, "spec": {}});
        let out = run(doc, json!([{"op": "replace", "path": "/status", "value": {"health": {"status": "Healthy"}}}]));
        assert_eq!(out.unwrap()["status"]["health"]["status"], "Healthy");
        // Its parent must exist, and array elements must exist.
        assert_eq!(run(json!({}), json!([{"op": "replace", "path": "/a/b", "value": 1}])), Err(422));
        assert_eq!(run(json!({"a": [1]}), json!([{"op": "replace", "path": "/a/1", "value": 2}])), Err(422));
    }

    #[test]
    fn null_patch_is_a_no_op() {
        let doc = json!({"a": 1});
        assert_eq!(run(doc.clone(), Value::Null), Ok(doc.clone()));
        assert_eq!(run(doc.clone(), json!([])), Ok(doc));
        assert_eq!(run(json!({}), json!({})), Err(400));
        assert_eq!(run(json!({}), json!("x")), Err(400));
        assert_eq!(run(json!({}), json!([1])), Err(400));
        assert_eq!(decode(b"", FieldValidation::Warn).err().map(|e| e.code), Some(400));
    }

    #[test]
    fn negative_indexes_count_from_the_end() {
        let doc = json!({"a": [1, 2, 3]});
        assert_eq!(
            run(doc.clone(), json!([{"op": "replace", "path": "/a/-1", "value": 9}])),
            Ok(json!({"a": [1, 2, 9]}))
        );
        assert_eq!(run(doc.clone(), json!([{"op": "remove", "path": "/a/-3"}])), Ok(json!({"a": [2, 3]})));
        assert_eq!(
            run(doc.clone(), json!([{"op": "add", "path": "/a/-1", "value": 4}])),
            Ok(json!({"a": [1, 2, 3, 4]}))
        );
        assert_eq!(
            run(doc.clone(), json!([{"op": "add", "path": "/a/-", "value": 4}])),
            Ok(json!({"a": [1, 2, 3, 4]}))
        );
        assert_eq!(
            run(doc.clone(), json!([{"op": "add", "path": "/a/+01", "value": 0}])),
            Ok(json!({"a": [1, 0, 2, 3]}))
        );
        assert_eq!(run(doc.clone(), json!([{"op": "remove", "path": "/a/-4"}])), Err(422));
        assert_eq!(run(doc.clone(), json!([{"op": "add", "path": "/a/4", "value": 0}])), Err(422));
        assert_eq!(run(doc, json!([{"op": "remove", "path": "/a/x"}])), Err(422));
    }

    #[test]
    fn the_libraries_other_rules() {
        let doc = json!({"a": {"b": null}, "c": 1});
        // Remove and move need the member; copy of a missing one copies null.
        assert_eq!(run(doc.clone(), json!([{"op": "remove", "path": "/x"}])), Err(422));
        assert_eq!(run(doc.clone(), json!([{"op": "move", "from": "/x", "path": "/y"}])), Err(422));
        assert_eq!(run(json!({}), json!([{"op": "copy", "from": "/x", "path": "/y"}])), Ok(json!({"y": null})));
        // A null member is missing for test, and cannot be walked through.
        assert_eq!(run(doc.clone(), json!([{"op": "test", "path": "/a/b", "value": null}])), Ok(doc.clone()));
        assert_eq!(run(doc.clone(), json!([{"op": "test", "path": "/a/z"}])), Ok(doc.clone()));
        assert_eq!(run(doc.clone(), json!([{"op": "test", "path": "/c", "value": 2}])), Err(422));
        assert_eq!(run(doc.clone(), json!([{"op": "add", "path": "/a/b/c", "value": 1}])), Err(422));
        // No value is null; text before the first slash is ignored; ~1 and ~0 unescape.
        assert_eq!(run(json!({}), json!([{"op": "add", "path": "/n"}])), Ok(json!({"n": null})));
        assert_eq!(run(json!({}), json!([{"op": "add", "path": "x/n", "value": 1}])), Ok(json!({"n": 1})));
        assert_eq!(run(json!({}), json!([{"op": "add", "path": "/a~1b~01", "value": 1}])), Ok(json!({"a/b~1": 1})));
        // Unknown kinds and missing paths fail the patch; a type error is malformed.
        assert_eq!(run(json!({}), json!([{"op": "merge", "path": "/a"}])), Err(422));
        assert_eq!(run(json!({}), json!([null])), Err(422));
        assert_eq!(run(json!({}), json!([{"op": "add", "value": 1}])), Err(422));
        assert_eq!(run(json!({}), json!([{"op": 1, "path": "/a"}])), Err(400));
        let p = decode(br#"[{"op": 1, "path": "/a"}]"#, FieldValidation::Ignore).unwrap();
        assert_eq!(apply(&mut json!({}), &p.operations).err().map(|e| e.code), Some(422));
        // Root replace takes an object or array only.
        assert_eq!(
            run(json!({"a": 1}), json!([{"op": "replace", "path": "", "value": {"b": 2}}])),
            Ok(json!({"b": 2}))
        );
        assert_eq!(run(json!({"a": 1}), json!([{"op": "replace", "path": ""}])), Err(422));
    }

    #[test]
    fn unknown_members_are_reported() {
        let p = decode(br#"[{"op": "add", "path": "/a", "value": 1, "extra": 2}]"#, FieldValidation::Warn).unwrap();
        assert_eq!(p.strict_errors, vec![r#"json patch unknown field "[0].extra""#.to_string()]);
        let p = decode(br#"[{"op": "add", "path": "/a", "extra": 2}]"#, FieldValidation::Ignore).unwrap();
        assert!(p.strict_errors.is_empty());
    }

    #[test]
    fn bounds() {
        let ops: Vec<Value> = (0..=MAX_OPERATIONS).map(|_| json!({"op": "test", "path": "/a"})).collect();
        assert_eq!(run(json!({}), Value::Array(ops)), Err(413));
        // Doubling by copy stops at the limit instead of exhausting memory.
        let mut ops = vec![json!({"op": "add", "path": "/a", "value": "x".repeat(1024)})];
        ops.extend((0..40).map(|i| json!({"op": "copy", "from": "", "path": format!("/c{i}")})));
        let mut ops2 = vec![json!({"op": "add", "path": "/a", "value": ["x".repeat(1024)]})];
        ops2.extend((0..40).map(|_| json!({"op": "copy", "from": "/a", "path": "/a/0"})));
        assert_eq!(run(json!({}), Value::Array(ops2)), Err(422));
        let big = "y".repeat(MAX_COPY_BYTES);
        let ops3 = json!([{"op": "add", "path": "/a", "value": big}, {"op": "copy", "from": "/a", "path": "/b"}]);
        assert_eq!(run(json!({}), ops3), Err(422));
        // Copying the root is not possible (no key): the patch fails cleanly.
        assert_eq!(run(json!({}), Value::Array(ops)), Err(422));
    }
}
