//! The request context every REST handler gets: the resource type, version, namespace, dry-run
//! and field validation, and the writes and responses made under them.

use std::sync::{Arc, Mutex, PoisonError};

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use super::{AppState, json_response};
use crate::error::{ApiError, ApiResult};
use crate::prepare::{FieldValidation, Target};
use crate::resource::{GroupResource, ResourceType};
use crate::store::{Applied, Change};

/// Everything a handler needs about the request target.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub state: Arc<AppState>,
    pub rtype: Arc<ResourceType>,
    pub version: String,
    pub namespace: String,
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    /// `Warning` headers for the response.
    pub warnings: Arc<Mutex<Vec<String>>>,
}

impl Ctx {
    pub fn target(&self) -> Target<'_> {
        Target {
            rtype: &self.rtype,
            version: &self.version,
            namespace: &self.namespace,
            field_validation: self.field_validation,
            warnings: Some(&self.warnings),
        }
    }

    /// A context for the server's own writes (cascades): no warnings, Kubernetes' defaults.
    pub fn internal(state: Arc<AppState>, rtype: Arc<ResourceType>, version: String, namespace: String) -> Self {
        Self {
            state,
            rtype,
            version,
            namespace,
            dry_run: false,
            field_validation: FieldValidation::Ignore,
            warnings: Arc::default(),
        }
    }

    pub fn gr(&self) -> GroupResource {
        self.rtype.gr()
    }

    pub(crate) fn not_found(&self, name: &str) -> ApiError {
        ApiError::not_found(&self.rtype.group, &self.rtype.plural, name)
    }

    /// Encode an object as served under the request's version.
    pub fn encode(&self, obj: &Value) -> Vec<u8> {
        let want = self.rtype.api_version(&self.version);
        if obj.get("apiVersion").and_then(Value::as_str) == Some(want.as_str()) {
            serde_json::to_vec(obj).unwrap_or_default()
        } else {
            let mut o = obj.clone();
            o["apiVersion"] = json!(want);
            serde_json::to_vec(&o).unwrap_or_default()
        }
    }

    pub(crate) fn respond(&self, code: StatusCode, obj: &Value) -> Response {
        let mut resp = json_response(code, self.encode(obj));
        for w in self.warnings.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            // RFC 7234 warn-text: a quoted string.
            let text = w.replace('\\', "\\\\").replace('"', "\\\"");
            if let Ok(v) = http::HeaderValue::from_str(&format!("299 - \"{text}\"")) {
                resp.headers_mut().append(http::header::WARNING, v);
            }
        }
        resp
    }

    /// Run a store write on the blocking pool (commits fsync).
    pub(crate) async fn write(
        &self,
        gr: GroupResource,
        namespace: String,
        name: String,
        decide: impl FnOnce(Option<&Arc<Value>>) -> ApiResult<Change> + Send + 'static,
    ) -> ApiResult<Applied> {
        let store = self.state.store.clone();
        let dry_run = self.dry_run;
        tokio::task::spawn_blocking(move || store.write(&gr, &namespace, &name, dry_run, decide))
            .await
            .map_err(|e| ApiError::internal(format!("write task failed: {e}")))?
    }
}
