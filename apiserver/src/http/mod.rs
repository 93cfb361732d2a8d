//! The HTTP face of the server: routing, authentication and the Kubernetes REST verbs.

mod crud;
mod ctx;
mod fields;
mod list;
pub mod query;
pub mod route;
mod table;
mod watch;

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Method, Request, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::watch as tokio_watch;

use crate::error::{ApiError, ApiResult};
use crate::resource::{Registry, ResourceType};
use crate::store::Store;
use route::{ResourcePath, Route};

/// Shared state of the request handlers.
#[derive(Debug)]
pub struct AppState {
    /// Objects.
    pub store: Arc<Store>,
    /// Served types (replaced whole when a CRD changes).
    pub registry: RwLock<Arc<Registry>>,
    /// Bearer token every API request must carry; `None` disables the check.
    pub token: Option<String>,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// How often watches with `allowWatchBookmarks` get a bookmark.
    pub bookmark_interval: Duration,
    /// Longest watch when the client gives no `timeoutSeconds`.
    pub max_watch: Duration,
    /// `host:port` for `/api` discovery.
    pub address: String,
    /// Flips to true when the server shuts down, so watch streams end.
    pub shutdown: tokio_watch::Receiver<bool>,
    /// The simulated node (`pods/log`, `pods/exec`), when the server runs one.
    pub node: Option<Arc<crate::node::Node>>,
}

impl AppState {
    /// The current registry snapshot.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Change the registry (copy-on-write).
    pub fn update_registry(&self, f: impl FnOnce(&mut Registry)) {
        let mut guard = self.registry.write().unwrap_or_else(PoisonError::into_inner);
        let mut next = (**guard).clone();
        f(&mut next);
        *guard = Arc::new(next);
    }
}

/// A JSON response.
pub(crate) fn json_response(code: StatusCode, body: Vec<u8>) -> Response {
    let mut resp = (code, body).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn json_value(v: &Value) -> Response {
    json_response(StatusCode::OK, serde_json::to_vec(v).unwrap_or_default())
}

fn authorized(state: &AppState, req: &Request<Body>) -> bool {
    let Some(token) = &state.token else { return true };
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .is_some_and(|t| constant_time_eq(t.trim().as_bytes(), token.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Entry point for every request.
pub async fn dispatch(state: Arc<AppState>, req: Request<Body>) -> Response {
    match handle(state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn handle(state: Arc<AppState>, req: Request<Body>) -> ApiResult<Response> {
    let path = req.uri().path().to_string();
    let route = route::parse(&path).map_err(|e| match e {
        route::RouteError::NotFound => ApiError::no_route(&path),
        other => ApiError::bad_request(other.to_string()),
    })?;
    match route {
        Route::Health => return Ok((StatusCode::OK, "ok").into_response()),
        Route::Version => return Ok(json_value(&version())),
        _ => {}
    }
    if !authorized(&state, &req) {
        return Err(ApiError::unauthorized());
    }
    if req.method() != Method::GET && !matches!(route, Route::Resource(_)) {
        return Err(ApiError::method_not_allowed(req.method(), &path));
    }
    let registry = state.registry();
    let req_accept = req.headers().get(header::ACCEPT).and_then(|h| h.to_str().ok()).map(str::to_string);
    match route {
        Route::CoreVersions => Ok(json_value(&registry.core_versions(&state.address))),
        Route::GroupList => Ok(json_value(&registry.group_list())),
        Route::Group(g) => registry.group(&g).map(|v| json_value(&v)).ok_or_else(|| ApiError::no_route(&path)),
        Route::ResourceList { group, version } => {
            let mut list = registry.resource_list(&group, &version).ok_or_else(|| ApiError::no_route(&path))?;
            if state.node.is_some()
                && group.is_empty()
                && version == "v1"
                && let Some(resources) = list["resources"].as_array_mut()
            {
                resources.extend(crate::node::discovery_entries());
            }
            Ok(json_value(&list))
        }
        Route::OpenApiV2 => {
            let accept = req_accept.as_deref().unwrap_or_default();
            if accept.contains("protobuf") {
                let mut resp = (StatusCode::OK, crate::openapi::v2_protobuf()).into_response();
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/com.github.proto-openapi.spec.v2.v1.0+protobuf"),
                );
                Ok(resp)
            } else {
                Ok(json_value(&crate::openapi::v2_json()))
            }
        }
        Route::OpenApiV3 => {
            let rest = path.trim_start_matches("/openapi/v3").trim_matches('/');
            let doc = if rest.is_empty() {
                Some(crate::openapi::root(&registry))
            } else {
                crate::openapi::group_version(&registry, rest)
            };
            doc.map(|d| json_value(&d)).ok_or_else(|| ApiError::no_route(&path))
        }
        Route::Resource(rp) if is_pod_stream(&rp) => {
            let (ns, name, sub) = (rp.namespace.unwrap_or_default(), rp.name.unwrap_or_default(), rp.subresource);
            crate::node::serve(state.node.as_ref(), &ns, &name, sub.as_deref().unwrap_or_default(), req).await
        }
        Route::Resource(rp) => {
            let rtype = resolve(&registry, &rp, &path)?;
            resource(state, rtype, rp, req).await
        }
        Route::Health | Route::Version => Err(ApiError::no_route(&path)),
    }
}

fn version() -> Value {
    json!({
        "major": "1",
        "minor": "37",
        "gitVersion": "v1.37.0+argocd-agent-embedded",
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "n/a (Rust)",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

/// `pods/{name}/log` and `pods/{name}/exec` in a namespace: served by the simulated node.
fn is_pod_stream(rp: &ResourcePath) -> bool {
    rp.group.is_empty()
        && rp.version == "v1"
        && rp.resource == "pods"
        && rp.namespace.is_some()
        && rp.name.is_some()
        && matches!(rp.subresource.as_deref(), Some("log" | "exec"))
}

fn resolve(registry: &Registry, rp: &ResourcePath, path: &str) -> ApiResult<Arc<ResourceType>> {
    let rtype = registry.lookup(&rp.group, &rp.version, &rp.resource).ok_or_else(|| ApiError::no_route(path))?;
    // A namespaced path for a cluster-scoped type (or a named object of a namespaced type
    // without a namespace) names nothing.
    if (!rtype.namespaced && rp.namespace.is_some())
        || (rtype.namespaced && rp.namespace.is_none() && rp.name.is_some())
    {
        return Err(ApiError::no_route(path));
    }
    match rp.subresource.as_deref() {
        None => {}
        Some("status") if rtype.status_subresource => {}
        Some("finalize") if rtype.is_namespace() => {}
        Some(_) => return Err(ApiError::no_route(path)),
    }
    Ok(rtype)
}

async fn read_body(state: &AppState, req: Request<Body>) -> ApiResult<(String, bytes::Bytes)> {
    let ct =
        req.headers().get(header::CONTENT_TYPE).and_then(|h| h.to_str().ok()).unwrap_or_default().to_ascii_lowercase();
    if let Some(len) =
        req.headers().get(header::CONTENT_LENGTH).and_then(|h| h.to_str().ok()).and_then(|s| s.parse::<usize>().ok())
        && len > state.max_body_bytes
    {
        return Err(ApiError::too_large(state.max_body_bytes));
    }
    let body = axum::body::to_bytes(req.into_body(), state.max_body_bytes).await.map_err(|e| {
        let too_large = std::error::Error::source(&e).is_some_and(|s| s.to_string().contains("length limit"))
            || e.to_string().contains("length limit");
        if too_large {
            ApiError::too_large(state.max_body_bytes)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {e}"))
        }
    })?;
    Ok((ct, body))
}

async fn resource(
    state: Arc<AppState>,
    rtype: Arc<ResourceType>,
    rp: ResourcePath,
    req: Request<Body>,
) -> ApiResult<Response> {
    let mut params = query::parse(req.uri().query())?;
    params.selectable = fields::Selectable::of(&rtype);
    // As kube-apiserver: only collection reads and deletes check the selector's fields.
    if let Some(selector) = &params.fields
        && rp.name.is_none()
        && matches!(*req.method(), Method::GET | Method::DELETE)
    {
        params.selectable.check(selector)?;
    }
    let method = req.method().clone();
    let namespace = rp.namespace.clone().unwrap_or_default();
    let ctx = ctx::Ctx {
        state: state.clone(),
        rtype,
        version: rp.version.clone(),
        namespace,
        dry_run: params.dry_run,
        field_validation: params.field_validation,
        warnings: std::sync::Arc::default(),
    };
    match (method.clone(), rp.name.clone(), rp.subresource.as_deref()) {
        (Method::GET, None, _) if params.watch => {
            watch::serve(&ctx, rp.namespace.as_deref(), &params, wants_table(&req))
        }
        (Method::GET, None, _) => list::serve(&ctx, rp.namespace.as_deref(), &params, wants_table(&req)),
        (Method::POST, None, _) => {
            let (ct, body) = read_body(&state, req).await?;
            crud::create(&ctx, &ct, &body).await
        }
        (Method::DELETE, None, _) => {
            let (ct, body) = read_body(&state, req).await?;
            crud::delete_collection(&ctx, rp.namespace.as_deref(), &params, &ct, &body).await
        }
        (Method::GET, Some(name), _) => crud::get(&ctx, &name, wants_table(&req)),
        (Method::PUT, Some(name), sub) => {
            let (ct, body) = read_body(&state, req).await?;
            crud::update(&ctx, &name, sub, &ct, &body).await
        }
        (Method::PATCH, Some(name), sub) => {
            let (ct, body) = read_body(&state, req).await?;
            crud::patch(&ctx, &name, sub, &ct, &body).await
        }
        (Method::DELETE, Some(name), None) => {
            let (ct, body) = read_body(&state, req).await?;
            crud::delete(&ctx, &name, &ct, &body).await
        }
        (m, _, _) => Err(ApiError::method_not_allowed(&m, req.uri().path())),
    }
}

/// Whether the client asked for a `meta.k8s.io` Table (kubectl get).
fn wants_table(req: &Request<Body>) -> bool {
    req.headers()
        .get(header::ACCEPT)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|a| a.split(',').next().is_some_and(|first| first.contains("as=Table")))
}
