//! get, create, update, patch, delete and deletecollection of single objects.

use std::sync::{Arc, PoisonError};

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use super::ctx::Ctx;
use super::json_response;
use super::query::Params;
use crate::error::{ApiError, ApiResult};
use crate::jsonpatch;
use crate::object::{is_deleting, meta_str};
use crate::prepare::{self, FieldValidation, Part, Target};
use crate::resource::{GroupResource, ResourceType};
use crate::store::{Applied, Change};
use crate::strategic_merge;

pub(crate) fn get(ctx: &Ctx, name: &str, table: bool) -> ApiResult<Response> {
    let obj = ctx.state.store.get(&ctx.gr(), &ctx.namespace, name).ok_or_else(|| ctx.not_found(name))?;
    if table {
        let rv = meta_str(&obj, "resourceVersion").to_string();
        return Ok(json_response(StatusCode::OK, super::table::table(&ctx.rtype, &[obj], &rv, None)));
    }
    Ok(ctx.respond(StatusCode::OK, &obj))
}

pub(crate) async fn create(ctx: &Ctx, content_type: &str, body: &[u8]) -> ApiResult<Response> {
    let obj = prepare::decode_body(body, content_type)?;
    let (obj, name) = prepare::create(ctx.target(), obj)?;
    if ctx.rtype.namespaced {
        check_namespace_open(ctx, &name)?;
    }
    let (group, resource) = (ctx.rtype.group.clone(), ctx.rtype.plural.clone());
    let n = name.clone();
    let applied = ctx
        .write(ctx.gr(), ctx.namespace.clone(), name, move |cur| {
            if cur.is_some() {
                return Err(ApiError::already_exists(&group, &resource, &n));
            }
            Ok(Change::Put(obj))
        })
        .await?;
    after_write(ctx, &applied).await;
    Ok(ctx.respond(StatusCode::CREATED, applied.object()))
}

fn check_namespace_open(ctx: &Ctx, name: &str) -> ApiResult<()> {
    let ns_gr = GroupResource::new("", "namespaces");
    match ctx.state.store.get(&ns_gr, "", &ctx.namespace) {
        None => Err(ApiError::not_found("", "namespaces", &ctx.namespace)),
        Some(ns) if is_deleting(&ns) => {
            Err(ApiError::namespace_terminating(&ctx.rtype.group, &ctx.rtype.plural, name, &ctx.namespace))
        }
        Some(_) => Ok(()),
    }
}

fn part(sub: Option<&str>) -> Part {
    if sub == Some("status") { Part::Status } else { Part::Main }
}

pub(crate) async fn update(
    ctx: &Ctx,
    name: &str,
    sub: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> ApiResult<Response> {
    let obj = prepare::decode_body(body, content_type)?;
    let c = ctx.clone();
    let part = part(sub);
    let not_found = ctx.not_found(name);
    let applied = ctx
        .write(ctx.gr(), ctx.namespace.clone(), name.to_string(), move |cur| {
            let existing = cur.ok_or(not_found)?;
            prepare::update(c.target(), existing, obj, part)
        })
        .await?;
    after_write(ctx, &applied).await;
    Ok(ctx.respond(StatusCode::OK, applied.object()))
}

/// Kinds for which strategic merge patch is defined (built-in types).
fn strategic_kind(rtype: &ResourceType) -> Option<&str> {
    let builtin = rtype.group.is_empty() || rtype.group == "coordination.k8s.io";
    builtin.then_some(rtype.kind.as_str())
}

fn apply_patch(target: Target<'_>, existing: &Value, content_type: &str, body: &[u8]) -> ApiResult<Value> {
    let rtype = target.rtype;
    let media = content_type.split(';').next().unwrap_or_default().trim();
    let parse = |what: &str| -> ApiResult<Value> {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the {what} patch is not valid JSON: {e}")))
    };
    let mut doc = existing.clone();
    match media {
        "application/merge-patch+json" => {
            let p = parse("merge")?;
            if !p.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(&mut doc, &p);
        }
        "application/json-patch+json" => {
            // As kube-apiserver applies it (evanphx/json-patch v4), not by the letter of RFC 6902.
            let p = jsonpatch::decode(body, target.field_validation)?;
            jsonpatch::apply(&mut doc, &p.operations)?;
            if !p.strict_errors.is_empty() {
                match target.field_validation {
                    FieldValidation::Strict => {
                        let why = format!(
                            "Invalid value: the JSON patch: strict decoding error: {}",
                            p.strict_errors.join(", ")
                        );
                        return Err(ApiError::invalid("", "", "", vec![("patch".into(), why)]));
                    }
                    FieldValidation::Warn => {
                        if let Some(w) = target.warnings {
                            w.lock().unwrap_or_else(PoisonError::into_inner).extend(p.strict_errors);
                        }
                    }
                    FieldValidation::Ignore => {}
                }
            }
        }
        "application/strategic-merge-patch+json" => {
            let Some(kind) = strategic_kind(rtype) else {
                return Err(ApiError::unsupported_media_type(format!(
                    "strategic merge patch is not supported for {}.{}: use application/merge-patch+json",
                    rtype.plural, rtype.group
                )));
            };
            doc = strategic_merge::apply(existing, &parse("strategic merge")?, kind)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
        }
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
            return Err(ApiError::unsupported_media_type(
                "server-side apply is not supported by the embedded API server: use a merge or JSON patch",
            ));
        }
        other => {
            return Err(ApiError::unsupported_media_type(format!(
                "the patch content type {other:?} is not supported: use application/merge-patch+json, application/json-patch+json or application/strategic-merge-patch+json"
            )));
        }
    }
    if !doc.is_object() {
        return Err(ApiError::bad_request("the patch turned the object into something that is not an object"));
    }
    Ok(doc)
}

pub(crate) async fn patch(
    ctx: &Ctx,
    name: &str,
    sub: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> ApiResult<Response> {
    let c = ctx.clone();
    let part = part(sub);
    let not_found = ctx.not_found(name);
    let (ct, body) = (content_type.to_string(), body.to_vec());
    let applied = ctx
        .write(ctx.gr(), ctx.namespace.clone(), name.to_string(), move |cur| {
            let existing = cur.ok_or(not_found)?;
            let patched = apply_patch(c.target(), existing, &ct, &body)?;
            prepare::update(c.target(), existing, patched, part)
        })
        .await?;
    after_write(ctx, &applied).await;
    Ok(ctx.respond(StatusCode::OK, applied.object()))
}

/// The request's context as DeleteOptions amend it: a body's `dryRun` replaces the query's.
fn delete_ctx(ctx: &Ctx, pre: &prepare::DeletePreconditions) -> Ctx {
    let mut c = ctx.clone();
    if let Some(dry_run) = pre.dry_run {
        c.dry_run = dry_run;
    }
    c
}

pub(crate) async fn delete(ctx: &Ctx, name: &str, content_type: &str, body: &[u8]) -> ApiResult<Response> {
    let pre = prepare::delete_options(body, content_type)?;
    let ctx = &delete_ctx(ctx, &pre);
    let applied = delete_one(ctx, name, pre).await?;
    // Kubernetes answers an immediate delete with a Success Status, except for the kinds whose
    // storage returns the deleted object (pods, services); a delete that only marks the object
    // (finalizers, namespaces) answers with the object. A dry run answers as the delete would.
    let returns_object = ctx.rtype.group.is_empty() && matches!(ctx.rtype.plural.as_str(), "pods" | "services");
    if let Applied::Deleted(obj) = &applied
        && !returns_object
    {
        let mut details = json!({"name": name, "kind": ctx.rtype.plural, "uid": meta_str(obj, "uid")});
        if !ctx.rtype.group.is_empty() {
            details["group"] = json!(ctx.rtype.group);
        }
        let status =
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details});
        return Ok(json_response(StatusCode::OK, serde_json::to_vec(&status).unwrap_or_default()));
    }
    Ok(ctx.respond(StatusCode::OK, applied.object()))
}

async fn delete_one(ctx: &Ctx, name: &str, pre: prepare::DeletePreconditions) -> ApiResult<Applied> {
    let c = ctx.clone();
    let not_found = ctx.not_found(name);
    let applied = ctx
        .write(ctx.gr(), ctx.namespace.clone(), name.to_string(), move |cur| {
            let existing = cur.ok_or(not_found)?;
            prepare::delete(c.target(), existing, &pre)
        })
        .await?;
    after_write(ctx, &applied).await;
    Ok(applied)
}

pub(crate) async fn delete_collection(
    ctx: &Ctx,
    namespace: Option<&str>,
    params: &Params,
    content_type: &str,
    body: &[u8],
) -> ApiResult<Response> {
    let pre = prepare::delete_options(body, content_type)?;
    let ctx = &delete_ctx(ctx, &pre);
    let (items, rv) = ctx.state.store.list(&ctx.gr(), namespace, None);
    let mut deleted = Vec::new();
    for (_, obj) in items {
        if !super::list::matches(params, &obj) {
            continue;
        }
        let mut c = ctx.clone();
        c.namespace = meta_str(&obj, "namespace").to_string();
        match delete_one(&c, meta_str(&obj, "name"), pre.clone()).await {
            Ok(a) => deleted.push(a.object().clone()),
            // Deleted concurrently: nothing left to do for it.
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let list = json!({
        "kind": ctx.rtype.list_kind,
        "apiVersion": ctx.rtype.api_version(&ctx.version),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": deleted.iter().map(|o| (**o).clone()).collect::<Vec<_>>(),
    });
    Ok(json_response(StatusCode::OK, serde_json::to_vec(&list).unwrap_or_default()))
}

/// Consequences of a write beyond the object itself: CRDs change what is served, namespaces
/// cascade, and a namespace being deleted goes once it is empty.
async fn after_write(ctx: &Ctx, applied: &Applied) {
    if ctx.dry_run {
        return;
    }
    let obj = applied.object().clone();
    if ctx.rtype.is_crd() {
        match applied {
            Applied::Written(_) => {
                if let Ok(t) = ResourceType::from_crd(&obj) {
                    ctx.state.update_registry(|r| r.insert(t));
                }
            }
            Applied::Deleted(_) => {
                if let Ok(t) = ResourceType::from_crd(&obj) {
                    remove_type(ctx, t).await;
                }
            }
            Applied::Unchanged(_) => {}
        }
    }
    if ctx.rtype.is_namespace() && is_deleting(&obj) && !matches!(applied, Applied::Deleted(_)) {
        empty_namespace(ctx, meta_str(&obj, "name")).await;
    }
    if ctx.rtype.namespaced && matches!(applied, Applied::Deleted(_)) {
        finish_namespace_if_empty(ctx, &ctx.namespace).await;
    }
}

fn namespace_ctx(ctx: &Ctx) -> Option<Ctx> {
    let rtype = ctx.state.registry().lookup("", "v1", "namespaces")?;
    Some(Ctx::internal(ctx.state.clone(), rtype, "v1".into(), String::new()))
}

/// Delete every object in a terminating namespace, then the namespace when nothing is left.
async fn empty_namespace(ctx: &Ctx, ns: &str) {
    let registry = ctx.state.registry();
    for (gr, name) in ctx.state.store.keys_in_namespace(ns) {
        let Some(rtype) = registry.get(&gr) else { continue };
        let version = rtype.versions[0].clone();
        let c = Ctx::internal(ctx.state.clone(), rtype, version, ns.to_string());
        if let Err(e) = Box::pin(delete_one(&c, &name, prepare::DeletePreconditions::default())).await
            && e.code != 404
        {
            tracing::warn!(namespace = ns, name, error = %e, "deleting an object of a terminating namespace failed");
        }
    }
    finish_namespace_if_empty(ctx, ns).await;
}

async fn finish_namespace_if_empty(ctx: &Ctx, ns: &str) {
    if ns.is_empty() || ctx.state.store.count_in_namespace(ns) > 0 {
        return;
    }
    let Some(c) = namespace_ctx(ctx) else { return };
    let result = c
        .write(c.gr(), String::new(), ns.to_string(), |cur| match cur {
            Some(n) if is_deleting(n) && crate::object::finalizers(n).is_empty() => Ok(Change::Delete((**n).clone())),
            _ => Ok(Change::Unchanged),
        })
        .await;
    if let Err(e) = result
        && e.code != 404
    {
        tracing::warn!(namespace = ns, error = %e, "removing an emptied namespace failed");
    }
}

/// A CRD was deleted: its objects go and the type is no longer served.
async fn remove_type(ctx: &Ctx, t: ResourceType) {
    let gr = t.gr();
    let rtype = Arc::new(t);
    for (ns, name) in ctx.state.store.names_of(&gr) {
        let c = Ctx::internal(ctx.state.clone(), rtype.clone(), rtype.versions[0].clone(), ns);
        let result = c
            .write(gr.clone(), c.namespace.clone(), name.clone(), |cur| match cur {
                Some(o) => Ok(Change::Delete((**o).clone())),
                None => Ok(Change::Unchanged),
            })
            .await;
        if let Err(e) = result
            && e.code != 404
        {
            tracing::warn!(resource = %gr.resource, name, error = %e, "removing an object of a deleted CRD failed");
        }
    }
    ctx.state.update_registry(|r| r.remove(&gr));
}
