//! list with selectors and `limit`/`continue` paging, and `meta.k8s.io` Tables for kubectl.

use std::sync::Arc;

use axum::response::Response;
use base64::Engine as _;
use http::StatusCode;
use serde_json::{Value, json};

use super::crud::Ctx;
use super::json_response;
use super::query::Params;
use crate::error::{ApiError, ApiResult};
use crate::object::meta_str;
use crate::resource::ResourceType;

/// Whether an object passes the request's label and field selectors.
pub(crate) fn matches(params: &Params, obj: &Value) -> bool {
    let labels = obj.get("metadata").and_then(|m| m.get("labels")).and_then(Value::as_object);
    params.labels.as_ref().is_none_or(|s| s.matches(labels)) && params.fields.as_ref().is_none_or(|s| s.matches(obj))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    rv: u64,
    start: String,
}

fn decode_continue(token: &str) -> ApiResult<ContinueToken> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).map_err(|_| {
        ApiError::bad_request(
            "the continue token is invalid: pass the value from the previous list's metadata.continue",
        )
    })?;
    serde_json::from_slice(&bytes).map_err(|_| {
        ApiError::bad_request(
            "the continue token is invalid: pass the value from the previous list's metadata.continue",
        )
    })
}

fn encode_continue(t: &ContinueToken) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(t).unwrap_or_default())
}

pub(crate) fn serve(ctx: &Ctx, namespace: Option<&str>, params: &Params, as_table: bool) -> ApiResult<Response> {
    let store = &ctx.state.store;
    let (start, token_rv) = match &params.continue_token {
        Some(t) => {
            let t = decode_continue(t)?;
            if t.rv < store.floor() {
                return Err(ApiError::gone(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            (Some(t.start), Some(t.rv))
        }
        None => (None, None),
    };
    let (items, rv) = store.list(&ctx.gr(), namespace, start.as_deref());
    // Pages after the first report the first page's version, so a watch started from the last
    // page replays whatever changed while paging.
    let rv = token_rv.unwrap_or(rv);
    let mut selected: Vec<Arc<Value>> = Vec::new();
    let mut next = None;
    let mut remaining = 0usize;
    for (key, obj) in items {
        if !matches(params, &obj) {
            continue;
        }
        if params.limit > 0 && selected.len() == params.limit {
            if next.is_none() {
                next = selected
                    .last()
                    .map(|o: &Arc<Value>| crate::store::key(&ctx.gr(), meta_str(o, "namespace"), meta_str(o, "name")));
            }
            remaining += 1;
            let _ = key;
            continue;
        }
        selected.push(obj);
    }
    let continue_token = next.map(|start| encode_continue(&ContinueToken { rv, start }));
    if as_table {
        return Ok(json_response(
            StatusCode::OK,
            table(&ctx.rtype, &selected, &rv.to_string(), continue_token.as_deref()),
        ));
    }
    let mut out = Vec::with_capacity(256 + selected.len() * 512);
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = &continue_token {
        meta["continue"] = json!(c);
        // As Kubernetes: a selected list cannot know how many of the rest match, so no count.
        if params.labels.is_none() && params.fields.is_none() {
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    out.extend_from_slice(
        format!(
            "{{\"kind\":{},\"apiVersion\":{},\"metadata\":{},\"items\":[",
            json!(ctx.rtype.list_kind),
            json!(ctx.rtype.api_version(&ctx.version)),
            meta
        )
        .as_bytes(),
    );
    for (i, obj) in selected.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&ctx.encode(obj));
    }
    out.extend_from_slice(b"]}");
    Ok(json_response(StatusCode::OK, out))
}

/// A simple JSONPath (`.a.b.c`, as CRD printer columns use) evaluated on an object.
fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.').split('.').filter(|s| !s.is_empty()).try_fold(obj, |v, seg| v.get(seg))
}

/// Age as kubectl prints it.
fn age(created: &str) -> String {
    let Ok(t) = chrono::DateTime::parse_from_rfc3339(created) else { return "<unknown>".into() };
    let secs = (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds().max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    match () {
        () if secs < 120 => format!("{secs}s"),
        () if m < 10 && secs % 60 != 0 => format!("{m}m{}s", secs % 60),
        () if h < 3 => format!("{m}m"),
        () if h < 48 => format!("{h}h"),
        () => format!("{d}d"),
    }
}

fn columns(rtype: &ResourceType) -> Vec<Value> {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name of the object", "priority": 0}),
    ];
    if rtype.is_namespace() {
        cols.push(json!({"name": "Status", "type": "string", "format": "", "description": "Phase", "priority": 0}));
    }
    for (name, _) in &rtype.printer_columns {
        cols.push(json!({"name": name, "type": "string", "format": "", "description": "", "priority": 0}));
    }
    cols.push(
        json!({"name": "Age", "type": "string", "format": "", "description": "Time since creation", "priority": 0}),
    );
    cols
}

/// One Table row for an object.
pub(crate) fn row(rtype: &ResourceType, obj: &Value) -> Value {
    let mut cells = vec![json!(meta_str(obj, "name"))];
    if rtype.is_namespace() {
        cells.push(obj["status"]["phase"].clone());
    }
    for (_, path) in &rtype.printer_columns {
        cells.push(json_path(obj, path).cloned().unwrap_or(Value::Null));
    }
    cells.push(json!(age(meta_str(obj, "creationTimestamp"))));
    json!({
        "cells": cells,
        "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"].clone()},
    })
}

/// A Table of objects, with or without its column definitions.
pub(crate) fn table_value(
    rtype: &ResourceType,
    objs: &[Arc<Value>],
    rv: &str,
    cont: Option<&str>,
    with_columns: bool,
) -> Value {
    let mut meta = json!({"resourceVersion": rv});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": if with_columns { columns(rtype) } else { vec![] },
        "rows": objs.iter().map(|o| row(rtype, o)).collect::<Vec<_>>(),
    })
}

/// A Table as bytes.
pub(crate) fn table(rtype: &ResourceType, objs: &[Arc<Value>], rv: &str, cont: Option<&str>) -> Vec<u8> {
    serde_json::to_vec(&table_value(rtype, objs, rv, cont, true)).unwrap_or_default()
}
