//! Errors as Kubernetes `Status` objects.
//!
//! Every failure the server returns is a `metav1.Status` with the HTTP code, the `reason` and a
//! message that says what to fix, exactly as kube-rs and kubectl expect to decode them.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

/// A request that failed, rendered as a Kubernetes `Status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message naming what is wrong.
    pub message: String,
    /// `details` of the Status: the object the error is about.
    pub details: Option<Box<Details>>,
}

/// The `details` stanza of a `Status`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Details {
    /// Object name.
    pub name: String,
    /// API group of the object.
    pub group: String,
    /// Resource (plural) of the object.
    pub kind: String,
    /// Field-level causes, as `(field, message)`.
    pub causes: Vec<(String, String)>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into(), details: None }
    }

    /// 400: the request could not be understood (malformed JSON, mismatched kind, ...).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401: no or a wrong bearer token.
    pub fn unauthorized() -> Self {
        Self::new(
            401,
            "Unauthorized",
            "Unauthorized: a valid bearer token is required (see the kubeconfig this server wrote)",
        )
    }

    /// 403: the request is understood but refused.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 404 for a named object of a resource.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found")).with_details(name, group, resource)
    }

    /// 404 for a path that names no resource.
    pub fn no_route(path: &str) -> Self {
        Self::new(404, "NotFound", format!("the server could not find the requested resource ({path})"))
    }

    /// 405: the verb is not supported on this path.
    pub fn method_not_allowed(method: &http::Method, what: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource: {method} {what}"),
        )
    }

    /// 409 AlreadyExists on create.
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(409, "AlreadyExists", format!("{qualified} \"{name}\" already exists"))
            .with_details(name, group, resource)
    }

    /// 409 Conflict on a stale `resourceVersion` or a failed precondition.
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(409, "Conflict", format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"))
            .with_details(name, group, resource)
    }

    /// 410 Gone: the requested resourceVersion is older than the retained history.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 413: the request body is larger than the server accepts.
    pub fn too_large(limit: usize) -> Self {
        Self::new(413, "RequestEntityTooLarge", format!("Request entity too large: limit is {limit} bytes"))
    }

    /// 413 for a request that is within the body limit but asks for too much (a JSON patch
    /// with more operations than kube-apiserver applies).
    pub fn entity_too_large(message: impl Into<String>) -> Self {
        Self::new(413, "RequestEntityTooLarge", message)
    }

    /// 415: a patch type this resource does not support.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 422 Invalid with field causes.
    pub fn invalid(group: &str, resource_kind: &str, name: &str, causes: Vec<(String, String)>) -> Self {
        let what = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect::<Vec<_>>().join(", ");
        let subject = if group.is_empty() { resource_kind.to_string() } else { format!("{resource_kind}.{group}") };
        let mut e = Self::new(422, "Invalid", format!("{subject} \"{name}\" is invalid: {what}"));
        e.details = Some(Box::new(Details {
            name: name.to_string(),
            group: group.to_string(),
            kind: resource_kind.to_string(),
            causes,
        }));
        e
    }

    /// 422 Invalid without field causes (a JSON patch that cannot be applied), as Kubernetes
    /// answers it.
    pub fn invalid_patch(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 422 Invalid for a query parameter out of its allowed values.
    pub fn unsupported_parameter(param: &str, value: &str, supported: &[&str]) -> Self {
        let listed = supported.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ");
        let cause = format!("Unsupported value: \"{value}\": supported values: {listed}");
        let mut e = Self::new(422, "Invalid", format!("{param}: {cause}"));
        e.details = Some(Box::new(Details { causes: vec![(param.to_string(), cause)], ..Details::default() }));
        e
    }

    /// 403 for a create in a namespace being deleted, with Kubernetes' `NamespaceTerminating`
    /// cause.
    pub fn namespace_terminating(group: &str, resource: &str, name: &str, namespace: &str) -> Self {
        let mut e = Self::new(
            403,
            "Forbidden",
            format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                qualified(group, resource)
            ),
        );
        e.details = Some(Box::new(Details {
            name: name.to_string(),
            group: group.to_string(),
            kind: resource.to_string(),
            causes: vec![("metadata.namespace".into(), format!("namespace {namespace} is being terminated"))],
        }));
        e
    }

    /// 500: something broke inside the server (storage I/O). Never used for bad input.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    fn with_details(mut self, name: &str, group: &str, kind: &str) -> Self {
        self.details = Some(Box::new(Details {
            name: name.to_string(),
            group: group.to_string(),
            kind: kind.to_string(),
            causes: vec![],
        }));
        self
    }

    /// The `Status` object for this error.
    #[must_use]
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            let mut details = json!({});
            if !d.name.is_empty() {
                details["name"] = json!(d.name);
            }
            if !d.kind.is_empty() {
                details["kind"] = json!(d.kind);
            }
            if !d.group.is_empty() {
                details["group"] = json!(d.group);
            }
            if !d.causes.is_empty() {
                details["causes"] = d
                    .causes
                    .iter()
                    .map(|(field, message)| json!({"reason": crate::schema::cause_reason(message), "message": message, "field": field}))
                    .collect();
            }
            status["details"] = details;
        }
        status
    }
}

fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.to_status().to_string();
        let mut resp = (code, body).into_response();
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        resp
    }
}

/// Result type of request handling.
pub type ApiResult<T> = Result<T, ApiError>;
