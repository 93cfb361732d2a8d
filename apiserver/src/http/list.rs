//! list with selectors and `limit`/`continue` paging.

use std::sync::Arc;

use axum::response::Response;
use base64::Engine as _;
use http::StatusCode;
use serde_json::{Value, json};

use super::ctx::Ctx;
use super::json_response;
use super::query::Params;
use super::table::table;
use crate::error::{ApiError, ApiResult};
use crate::object::meta_str;

/// Whether an object passes the request's label and field selectors.
pub(crate) fn matches(params: &Params, obj: &Value) -> bool {
    let labels = obj.get("metadata").and_then(|m| m.get("labels")).and_then(Value::as_object);
    params.labels.as_ref().is_none_or(|s| s.matches(labels))
        && params.fields.as_ref().is_none_or(|s| params.selectable.matches(s, obj))
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
