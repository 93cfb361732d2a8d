//! What a write does to an object: defaulting, validation, preserved fields and preconditions.
//!
//! These functions are pure (no storage, no I/O), so the rules can be tested and fuzzed alone.

use base64::Engine as _;
use rand::Rng as _;
use std::sync::{Mutex, PoisonError};

use serde_json::{Map, Value, json};

use crate::error::{ApiError, ApiResult};
use crate::object::{
    finalizers, is_deleting, meta_mut, meta_str, now_rfc3339, resource_version, spec_changed, validate_dns1123_label,
    validate_dns1123_subdomain, validate_labels_and_annotations,
};
use crate::resource::ResourceType;
use crate::store::Change;

/// Server-managed metadata a client may not set.
const SERVER_FIELDS: &[&str] =
    &["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation", "selfLink"];

/// Decode a request body (JSON, YAML when the content type says so, or Kubernetes protobuf for
/// the kinds [`crate::protobuf`] knows) into an object.
///
/// # Errors
/// 400 naming what is wrong with the body; 415 for a media type (or protobuf kind) not served.
pub fn decode_body(body: &[u8], content_type: &str) -> ApiResult<Value> {
    let v: Value = if crate::protobuf::is_protobuf(content_type) {
        crate::protobuf::decode(body)?
    } else if content_type.contains("yaml") {
        serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid YAML: {e}")))?
    } else if content_type.is_empty() || content_type.contains("json") {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?
    } else {
        return Err(ApiError::unsupported_media_type(format!(
            "the content type {content_type:?} is not supported: send application/json"
        )));
    };
    if !v.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object (a Kubernetes object)"));
    }
    if v.get("metadata").is_some_and(|m| !m.is_object() && !m.is_null()) {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    Ok(v)
}

/// What to do with fields a custom resource's schema does not know (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and say so in a `Warning` header (Kubernetes' default).
    #[default]
    Warn,
    /// Refuse the request (400), as `kubectl` asks by default.
    Strict,
}

/// The target of a write: type, served version and namespace from the URL.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// Resource type.
    pub rtype: &'a ResourceType,
    /// Version in the URL.
    pub version: &'a str,
    /// Namespace in the URL ("" for cluster-scoped).
    pub namespace: &'a str,
    /// `fieldValidation` of the request.
    pub field_validation: FieldValidation,
    /// Where `Warning`s for the response go (unknown fields dropped under `Warn`).
    pub warnings: Option<&'a Mutex<Vec<String>>>,
}

impl<'a> Target<'a> {
    /// A target with Kubernetes' default `fieldValidation` and no warnings collected.
    #[must_use]
    pub fn new(rtype: &'a ResourceType, version: &'a str, namespace: &'a str) -> Self {
        Self { rtype, version, namespace, field_validation: FieldValidation::default(), warnings: None }
    }

    /// Prune, drop disallowed nulls and default by the version's structural schema, if it has
    /// one. `existing` is the stored object of an update: unknown fields it already has are not
    /// the request's doing.
    fn apply_schema(&self, obj: &mut Value, existing: Option<&Value>) -> ApiResult<()> {
        let Some(schema) = self.rtype.schema(self.version) else { return Ok(()) };
        let mut unknown = crate::schema::prune_resource(obj, schema);
        if !unknown.is_empty()
            && self.field_validation != FieldValidation::Ignore
            && let Some(old) = existing
        {
            let had = crate::schema::prune_resource(&mut old.clone(), schema);
            unknown.retain(|u| !had.contains(u));
        }
        unknown.sort();
        if !unknown.is_empty() {
            let each = unknown.iter().map(|u| format!("unknown field \"{u}\"")).collect::<Vec<_>>();
            match self.field_validation {
                FieldValidation::Strict => {
                    let kind = &self.rtype.kind;
                    return Err(ApiError::bad_request(format!(
                        "{kind} in version \"{}\" cannot be handled as a {kind}: strict decoding error: {}",
                        self.version,
                        each.join(", ")
                    )));
                }
                FieldValidation::Warn => {
                    if let Some(w) = self.warnings {
                        w.lock().unwrap_or_else(PoisonError::into_inner).extend(each);
                    }
                }
                FieldValidation::Ignore => {}
            }
        }
        crate::schema::drop_disallowed_nulls(obj, schema);
        crate::schema::apply_defaults(obj, schema);
        Ok(())
    }

    fn check_type(&self, obj: &mut Value) -> ApiResult<()> {
        let want_av = self.rtype.api_version(self.version);
        // A custom resource of another kind is a 422 naming `kind`, as the CRD handler answers
        // (another apiVersion, or any mismatch for built-in kinds, fails to decode: 400).
        if self.rtype.is_custom()
            && obj.get("apiVersion").and_then(Value::as_str) == Some(want_av.as_str())
            && let Some(have) =
                obj.get("kind").and_then(Value::as_str).filter(|k| !k.is_empty() && *k != self.rtype.kind)
        {
            let cause = format!("Invalid value: \"{have}\": must be {}", self.rtype.kind);
            return Err(self.invalid(meta_str(obj, "name"), vec![("kind".to_string(), cause)]));
        }
        match obj.get("apiVersion").and_then(Value::as_str) {
            None | Some("") => obj["apiVersion"] = json!(want_av),
            Some(av) if av == want_av => {}
            Some(av) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({want_av})"
                )));
            }
        }
        match obj.get("kind").and_then(Value::as_str) {
            None | Some("") => obj["kind"] = json!(self.rtype.kind),
            Some(k) if k == self.rtype.kind => {}
            Some(k) => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({}) for {}",
                    self.rtype.kind, self.rtype.plural
                )));
            }
        }
        let ns = meta_str(obj, "namespace").to_string();
        if self.rtype.namespaced {
            if ns.is_empty() {
                meta_mut(obj).insert("namespace".into(), json!(self.namespace));
            } else if ns != self.namespace {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the provided object ({ns}) does not match the namespace sent on the request ({})",
                    self.namespace
                )));
            }
        } else {
            meta_mut(obj).remove("namespace");
        }
        Ok(())
    }

    fn invalid(&self, name: &str, causes: Vec<(String, String)>) -> ApiError {
        ApiError::invalid(&self.rtype.group, &self.rtype.kind, name, causes)
    }

    fn validate(&self, obj: &Value) -> ApiResult<()> {
        let name = meta_str(obj, "name");
        let mut causes = Vec::new();
        let check =
            if self.rtype.is_namespace() { validate_dns1123_label(name) } else { validate_dns1123_subdomain(name) };
        if let Err(e) = check {
            causes.push(("metadata.name".to_string(), e));
        }
        causes.extend(validate_labels_and_annotations(obj));
        if let Some(f) = obj["metadata"].get("finalizers")
            && !f.is_null()
            && !f.as_array().is_some_and(|a| a.iter().all(Value::is_string))
        {
            causes.push(("metadata.finalizers".into(), "Invalid value: must be a list of strings".into()));
        }
        if self.rtype.is_crd()
            && let Err(c) = ResourceType::from_crd(obj)
        {
            causes.extend(c);
        }
        if self.rtype.group.is_empty() && self.rtype.plural == "secrets" {
            causes.extend(normalize_secret_errors(obj));
        }
        if let Some(schema) = self.rtype.schema(self.version) {
            causes.extend(crate::schema::validate_resource(obj, schema));
        }
        if causes.is_empty() { Ok(()) } else { Err(self.invalid(name, causes)) }
    }
}

fn normalize_secret_errors(obj: &Value) -> Vec<(String, String)> {
    let mut causes = Vec::new();
    if let Some(data) = obj.get("data").and_then(Value::as_object) {
        for (k, v) in data {
            let ok = v.as_str().is_some_and(|s| base64::engine::general_purpose::STANDARD.decode(s).is_ok());
            if !ok {
                causes.push((format!("data[{k}]"), "Invalid value: must be base64-encoded bytes".into()));
            }
        }
    }
    causes
}

/// `stringData` is write-only: merge it into `data` as base64, as Kubernetes does.
fn fold_string_data(obj: &mut Value) {
    let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|o| o.remove("stringData")) else { return };
    if !obj.get("data").is_some_and(Value::is_object) {
        obj["data"] = json!({});
    }
    for (k, v) in sd {
        let text = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
        obj["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(text));
    }
}

fn generated_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
}

/// Status a CRD gets once accepted: its names, Established and NamesAccepted.
fn crd_status(obj: &Value) -> Value {
    let now = now_rfc3339();
    let cond = |t: &str, reason: &str| json!({"type": t, "status": "True", "lastTransitionTime": now, "reason": reason, "message": ""});
    json!({
        "acceptedNames": obj["spec"]["names"].clone(),
        "storedVersions": obj["spec"]["versions"].as_array().map(|vs| vs.iter().filter(|v| v["storage"].as_bool() == Some(true)).map(|v| v["name"].clone()).collect::<Vec<_>>()).unwrap_or_default(),
        "conditions": [cond("NamesAccepted", "NoConflicts"), cond("Established", "InitialNamesAccepted")],
    })
}

/// Prepare a new object for create. Returns the object and its (maybe generated) name.
///
/// # Errors
/// 400 for a body that does not fit the URL, 422 for invalid names or fields.
pub fn create(t: Target<'_>, mut obj: Value) -> ApiResult<(Value, String)> {
    t.check_type(&mut obj)?;
    t.apply_schema(&mut obj, None)?;
    let mut name = meta_str(&obj, "name").to_string();
    if name.is_empty() {
        let prefix = meta_str(&obj, "generateName").to_string();
        if prefix.is_empty() {
            return Err(t.invalid(
                "",
                vec![("metadata.name".into(), "Required value: name or generateName is required".into())],
            ));
        }
        name = format!("{prefix}{}", generated_suffix());
        meta_mut(&mut obj).insert("name".into(), json!(name));
    }
    {
        let meta = meta_mut(&mut obj);
        for f in SERVER_FIELDS.iter().chain(&["resourceVersion", "managedFields"]) {
            meta.remove(*f);
        }
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    }
    if t.rtype.group.is_empty() && t.rtype.plural == "secrets" {
        fold_string_data(&mut obj);
        if obj.get("type").and_then(Value::as_str).is_none_or(str::is_empty) {
            obj["type"] = json!("Opaque");
        }
    }
    t.validate(&obj)?;
    if !t.rtype.is_namespace() && !matches!(t.rtype.plural.as_str(), "secrets" | "configmaps" | "events" | "leases") {
        meta_mut(&mut obj).insert("generation".into(), json!(1));
    }
    if t.rtype.is_namespace() {
        namespace_defaults(&mut obj, &name);
    }
    if let Some(root) = obj.as_object_mut() {
        if t.rtype.is_namespace() {
            root.insert("status".into(), json!({"phase": "Active"}));
        } else if t.rtype.is_crd() {
            let status = crd_status(&Value::Object(root.clone()));
            root.insert("status".into(), status);
        } else if t.rtype.status_subresource {
            // Status is written through /status only; a create cannot set it.
            root.remove("status");
        }
    }
    Ok((obj, name))
}

/// What kube-apiserver adds to every Namespace: the `kubernetes.io/metadata.name` label (always
/// its name) and the `kubernetes` finalizer in `spec` (the namespace controller's).
fn namespace_defaults(obj: &mut Value, name: &str) {
    let meta = meta_mut(obj);
    if !meta.get("labels").is_some_and(Value::is_object) {
        meta.insert("labels".into(), json!({}));
    }
    meta["labels"]["kubernetes.io/metadata.name"] = json!(name);
    if !obj["spec"]["finalizers"].is_array() {
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        obj["spec"]["finalizers"] = json!(["kubernetes"]);
    }
}

/// Which part of the object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The main resource: status is preserved when the type has a status subresource.
    Main,
    /// `/status`: only status changes.
    Status,
}

fn preserve_server_fields(existing: &Value, new: &mut Value) {
    let old_meta = existing.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
    let meta = meta_mut(new);
    meta.remove("managedFields");
    for f in SERVER_FIELDS {
        match old_meta.get(*f) {
            Some(v) => meta.insert((*f).to_string(), v.clone()),
            None => meta.remove(*f),
        };
    }
    meta.insert("name".into(), old_meta.get("name").cloned().unwrap_or(Value::Null));
    if let Some(ns) = old_meta.get("namespace") {
        meta.insert("namespace".into(), ns.clone());
    }
}

fn without_rv(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    v
}

/// Prepare a replacement (PUT, or the result of a PATCH) of `existing`.
///
/// # Errors
/// 400 for a body that does not fit the URL, 409 for a stale resourceVersion, 422 for invalid fields.
pub fn update(t: Target<'_>, existing: &Value, mut obj: Value, part: Part) -> ApiResult<Change> {
    t.check_type(&mut obj)?;
    t.apply_schema(&mut obj, Some(existing))?;
    let name = meta_str(existing, "name").to_string();
    let body_name = meta_str(&obj, "name");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    if let Some(rv) = resource_version(&obj)
        && Some(rv) != resource_version(existing)
    {
        return Err(ApiError::conflict(
            &t.rtype.group,
            &t.rtype.plural,
            &name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    let mut new = match part {
        Part::Status => {
            let mut n = existing.clone();
            match obj.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(root) = n.as_object_mut() {
                        root.remove("status");
                    }
                }
            }
            n
        }
        Part::Main => {
            preserve_server_fields(existing, &mut obj);
            if t.rtype.status_subresource || t.rtype.is_namespace() {
                let root = obj.as_object_mut().map(std::mem::take).unwrap_or_default();
                let mut root: Map<String, Value> = root;
                match existing.get("status") {
                    Some(s) => root.insert("status".into(), s.clone()),
                    None => root.remove("status"),
                };
                obj = Value::Object(root);
            }
            if t.rtype.group.is_empty() && t.rtype.plural == "secrets" {
                fold_string_data(&mut obj);
            }
            obj
        }
    };
    if t.rtype.is_namespace() && part == Part::Main {
        namespace_defaults(&mut new, &name);
    }
    if is_deleting(existing) {
        let old = finalizers(existing);
        let added: Vec<String> = finalizers(&new).into_iter().filter(|f| !old.contains(f)).collect();
        if !added.is_empty() {
            return Err(t.invalid(
                &name,
                vec![(
                    "metadata.finalizers".into(),
                    format!("Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"),
                )],
            ));
        }
    }
    t.validate(&new)?;
    // Without a status subresource, kube-apiserver counts a change of status as a change of the
    // object: Argo CD's Applications (whose status Argo CD and upstream's principal write through
    // the main resource) bump `generation` on every status write.
    let changed =
        spec_changed(existing, &new) || (!t.rtype.status_subresource && existing.get("status") != new.get("status"));
    if part == Part::Main
        && changed
        && let Some(g) = existing["metadata"]["generation"].as_i64()
    {
        meta_mut(&mut new).insert("generation".into(), json!(g + 1));
    }
    if t.rtype.is_crd() && part == Part::Main {
        new["status"] = crd_status(&new);
    }
    if without_rv(&new) == without_rv(existing) {
        return Ok(Change::Unchanged);
    }
    if is_deleting(&new) && finalizers(&new).is_empty() && !t.rtype.is_namespace() {
        return Ok(Change::Delete(new));
    }
    Ok(Change::Put(new))
}

/// Preconditions of a DeleteOptions body.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeletePreconditions {
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// The body's `dryRun` says `All`; `None` when there was no body. kube-apiserver reads
    /// DeleteOptions from the body when there is one, and from the query only when there is
    /// none, so a body's `dryRun` (client-go and kubectl send it there) decides alone.
    pub dry_run: Option<bool>,
}

/// Parse an optional DeleteOptions body: JSON, or Kubernetes protobuf (what client-go's typed
/// clients send for built-in kinds), checked as kube-apiserver's `ValidateDeleteOptions` does.
///
/// # Errors
/// 400 when the body is not a DeleteOptions object; 422 (`meta.k8s.io` DeleteOptions Invalid)
/// for a `propagationPolicy` other than `Foreground`, `Background` or `Orphan`, one set together
/// with `orphanDependents`, or a `dryRun` other than `All`.
pub fn delete_options(body: &[u8], content_type: &str) -> ApiResult<DeletePreconditions> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(DeletePreconditions::default());
    }
    let v: Value = if crate::protobuf::is_protobuf(content_type) {
        crate::protobuf::options::delete_options_json(body)?
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the DeleteOptions body is not valid JSON: {e}")))?
    };
    if !v.is_object() {
        return Err(ApiError::bad_request("the DeleteOptions body must be a JSON object"));
    }
    let dry_run = match &v["dryRun"] {
        Value::Null => Vec::new(),
        Value::Array(a) if a.iter().all(Value::is_string) => a.iter().filter_map(Value::as_str).collect(),
        _ => return Err(ApiError::bad_request("DeleteOptions.dryRun must be a list of strings")),
    };
    let policy = &v["propagationPolicy"];
    if !policy.is_null() && !policy.is_string() {
        return Err(ApiError::bad_request("DeleteOptions.propagationPolicy must be a string"));
    }
    let mut causes = Vec::new();
    if !policy.is_null() && !v["orphanDependents"].is_null() {
        causes.push((
            "propagationPolicy".to_string(),
            format!("Invalid value: {policy}: orphanDependents and deletionPropagation cannot be both set"),
        ));
    }
    if let Some(p) = policy.as_str().filter(|p| !matches!(*p, "Foreground" | "Background" | "Orphan")) {
        causes.push((
            "propagationPolicy".to_string(),
            format!(
                "Unsupported value: \"{p}\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
            ),
        ));
    }
    if dry_run.iter().any(|d| *d != "All") {
        causes.push(("dryRun".to_string(), format!("Unsupported value: {dry_run:?}: supported values: \"All\"")));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid("meta.k8s.io", "DeleteOptions", "", causes));
    }
    let s = |k: &str| v["preconditions"][k].as_str().filter(|s| !s.is_empty()).map(str::to_string);
    Ok(DeletePreconditions {
        uid: s("uid"),
        resource_version: s("resourceVersion"),
        dry_run: Some(!dry_run.is_empty()),
    })
}

/// Decide a delete: mark it (finalizers pending, or a namespace to empty first) or remove it.
///
/// # Errors
/// 409 when a precondition does not hold.
pub fn delete(t: Target<'_>, existing: &Value, pre: &DeletePreconditions) -> ApiResult<Change> {
    let name = meta_str(existing, "name");
    let failed = |what: &str, want: &str, have: &str| {
        ApiError::conflict(
            &t.rtype.group,
            &t.rtype.plural,
            name,
            &format!("Precondition failed: {what}: {want}, {what} in object meta: {have}"),
        )
    };
    if let Some(uid) = &pre.uid {
        let have = meta_str(existing, "uid");
        if uid != have {
            return Err(failed("UID", uid, have));
        }
    }
    if let Some(rv) = &pre.resource_version {
        let have = meta_str(existing, "resourceVersion");
        if rv != have {
            return Err(failed("ResourceVersion", rv, have));
        }
    }
    if t.rtype.is_namespace() || !finalizers(existing).is_empty() {
        if is_deleting(existing) {
            return Ok(Change::Unchanged);
        }
        let mut marked = existing.clone();
        let meta = meta_mut(&mut marked);
        meta.insert("deletionTimestamp".into(), json!(now_rfc3339()));
        if !t.rtype.is_namespace() {
            meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
        // Setting deletionTimestamp is a change of the object's desired state.
        if let Some(g) = meta.get("generation").and_then(Value::as_i64).filter(|g| *g > 0) {
            meta.insert("generation".into(), json!(g + 1));
        }
        if t.rtype.is_namespace() {
            marked["status"] = json!({"phase": "Terminating"});
        }
        return Ok(Change::Put(marked));
    }
    Ok(Change::Delete(existing.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builtin::builtin_types;

    fn app_type() -> ResourceType {
        ResourceType::from_crd(&crate::builtin::argocd_crds()[0]).unwrap_or_else(|c| panic!("{c:?}"))
    }

    fn target(t: &ResourceType) -> Target<'_> {
        Target::new(t, t.versions[0].as_str(), "argocd")
    }

    #[test]
    fn create_sets_server_fields_and_checks_the_body() {
        let t = app_type();
        let (obj, name) = create(target(&t), json!({"metadata": {"generateName": "app-", "uid": "mine"}, "spec": {}}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(name.starts_with("app-") && name.len() == 9);
        assert_eq!(obj["kind"], "Application");
        assert_eq!(obj["metadata"]["namespace"], "argocd");
        assert_ne!(obj["metadata"]["uid"], "mine");
        assert_eq!(obj["metadata"]["generation"], 1);
        let wrong_kind = create(
            target(&t),
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject", "metadata": {"name": "a"}}),
        );
        assert_eq!(wrong_kind.err().map(|e| e.code), Some(422), "a custom resource of another kind is Invalid");
        let wrong_ns = create(target(&t), json!({"metadata": {"name": "a", "namespace": "other"}}));
        assert_eq!(wrong_ns.err().map(|e| e.code), Some(400));
        let bad_name = create(target(&t), json!({"metadata": {"name": "Not_Valid"}}));
        assert_eq!(bad_name.err().map(|e| e.code), Some(422));
        let no_name = create(target(&t), json!({"metadata": {}}));
        assert_eq!(no_name.err().map(|e| e.code), Some(422));
    }

    #[test]
    fn update_conflicts_preserves_and_bumps_generation() {
        let t = app_type();
        let (mut existing, _) =
            create(target(&t), json!({"metadata": {"name": "a"}, "spec": {"x": 1}})).unwrap_or_else(|e| panic!("{e}"));
        existing["metadata"]["resourceVersion"] = json!("5");
        let stale = update(
            target(&t),
            &existing,
            json!({"metadata": {"name": "a", "resourceVersion": "4"}, "spec": {"x": 2}}),
            Part::Main,
        );
        assert_eq!(stale.err().map(|e| e.code), Some(409));
        let Ok(Change::Put(new)) =
            update(target(&t), &existing, json!({"metadata": {"name": "a"}, "spec": {"x": 2}}), Part::Main)
        else {
            panic!("expected a put")
        };
        assert_eq!(new["metadata"]["generation"], 2);
        assert_eq!(new["metadata"]["uid"], existing["metadata"]["uid"]);
        let same = update(target(&t), &existing, existing.clone(), Part::Main);
        assert!(matches!(same, Ok(Change::Unchanged)));
    }

    #[test]
    fn status_subresource_separates_writes() {
        let types = builtin_types();
        let Some(pod) = types.iter().find(|t| t.plural == "pods") else { panic!("pods") };
        let t = Target::new(pod, "v1", "argocd");
        let (mut existing, _) =
            create(t, json!({"metadata": {"name": "p"}, "spec": {"a": 1}, "status": {"phase": "X"}}))
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(existing.get("status").is_none(), "create cannot set status");
        existing["status"] = json!({"phase": "Running"});
        let Ok(Change::Put(main)) = update(
            t,
            &existing,
            json!({"metadata": {"name": "p"}, "spec": {"a": 2}, "status": {"phase": "Evil"}}),
            Part::Main,
        ) else {
            panic!("put")
        };
        assert_eq!(main["status"]["phase"], "Running");
        let Ok(Change::Put(st)) = update(
            t,
            &existing,
            json!({"metadata": {"name": "p"}, "spec": {"a": 3}, "status": {"phase": "Done"}}),
            Part::Status,
        ) else {
            panic!("put")
        };
        assert_eq!(st["status"]["phase"], "Done");
        assert_eq!(st["spec"]["a"], 1);
    }

    #[test]
    fn delete_with_finalizers_marks_then_removing_the_last_one_deletes() {
        let t = app_type();
        let (existing, _) = create(target(&t), json!({"metadata": {"name": "a", "finalizers": ["f"]}}))
            .unwrap_or_else(|e| panic!("{e}"));
        let Ok(Change::Put(marked)) = delete(target(&t), &existing, &DeletePreconditions::default()) else {
            panic!("mark")
        };
        assert!(is_deleting(&marked));
        let mut cleared = marked.clone();
        cleared["metadata"]["finalizers"] = json!([]);
        assert!(matches!(update(target(&t), &marked, cleared, Part::Main), Ok(Change::Delete(_))));
        let pre = DeletePreconditions { uid: Some("other".into()), ..DeletePreconditions::default() };
        assert_eq!(delete(target(&t), &existing, &pre).err().map(|e| e.code), Some(409));
    }

    #[test]
    fn bodies() {
        assert_eq!(decode_body(b"{", "application/json").err().map(|e| e.code), Some(400));
        assert_eq!(decode_body(b"[]", "application/json").err().map(|e| e.code), Some(400));
        // Protobuf without the k8s\0 magic is malformed (400); other media types are not served (415).
        assert_eq!(decode_body(b"{}", "application/vnd.kubernetes.protobuf").err().map(|e| e.code), Some(400));
        assert_eq!(decode_body(b"{}", "application/cbor").err().map(|e| e.code), Some(415));
        assert!(decode_body(b"kind: Application\nmetadata: {name: a}\n", "application/yaml").is_ok());
    }
}
