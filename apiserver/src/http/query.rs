//! Query parameters of list, watch, write and delete requests.

use crate::error::{ApiError, ApiResult};
use crate::prepare::FieldValidation;
use crate::selector::{FieldSelector, LabelSelector};

/// The parameters this server honours; unknown ones are ignored as Kubernetes does.
#[derive(Debug, Default)]
pub struct Params {
    /// `labelSelector`.
    pub labels: Option<LabelSelector>,
    /// `fieldSelector` (its fields checked against the kind's by the handler).
    pub fields: Option<FieldSelector>,
    /// Which fields `fields` may name and what they read on this kind's objects.
    pub(crate) selectable: super::fields::Selectable,
    /// `watch=true|1`.
    pub watch: bool,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `timeoutSeconds`.
    pub timeout_seconds: Option<u64>,
    /// `allowWatchBookmarks`.
    pub allow_bookmarks: bool,
    /// `sendInitialEvents`.
    pub send_initial_events: bool,
    /// `limit` (0 means none).
    pub limit: usize,
    /// `continue`.
    pub continue_token: Option<String>,
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `fieldValidation` (`Ignore`, `Warn`, `Strict`).
    pub field_validation: FieldValidation,
}

fn boolean(name: &str, v: &str) -> ApiResult<bool> {
    match v {
        "true" | "1" | "True" => Ok(true),
        "false" | "0" | "False" | "" => Ok(false),
        other => Err(ApiError::bad_request(format!(
            "invalid value for query parameter {name}: {other:?}: expected true or false"
        ))),
    }
}

/// Parse a raw query string.
///
/// # Errors
/// 400 naming the parameter that is malformed.
pub fn parse(query: Option<&str>) -> ApiResult<Params> {
    let mut p = Params::default();
    let Some(q) = query else { return Ok(p) };
    for (k, v) in form_urlencoded::parse(q.as_bytes()) {
        match k.as_ref() {
            "labelSelector" if !v.trim().is_empty() => {
                p.labels = Some(
                    LabelSelector::parse(&v)
                        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
                );
            }
            "fieldSelector" if !v.trim().is_empty() => {
                p.fields = Some(FieldSelector::parse_any_field(&v).map_err(|e| ApiError::bad_request(e.to_string()))?);
            }
            "watch" => p.watch = boolean("watch", &v)?,
            "resourceVersion" if !v.is_empty() => p.resource_version = Some(v.into_owned()),
            "timeoutSeconds" => {
                p.timeout_seconds = Some(v.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid timeoutSeconds {v:?}: expected a whole number of seconds"))
                })?);
            }
            "allowWatchBookmarks" => p.allow_bookmarks = boolean("allowWatchBookmarks", &v)?,
            "sendInitialEvents" => p.send_initial_events = boolean("sendInitialEvents", &v)?,
            "limit" => {
                p.limit = v.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid limit {v:?}: expected a non-negative whole number"))
                })?
            }
            "continue" if !v.is_empty() => p.continue_token = Some(v.into_owned()),
            "fieldValidation" => {
                p.field_validation = match v.as_ref() {
                    "Ignore" => FieldValidation::Ignore,
                    "Warn" | "" => FieldValidation::Warn,
                    "Strict" => FieldValidation::Strict,
                    other => {
                        return Err(ApiError::unsupported_parameter(
                            "fieldValidation",
                            other,
                            &["Ignore", "Strict", "Warn"],
                        ));
                    }
                }
            }
            "dryRun" => match v.as_ref() {
                "All" => p.dry_run = true,
                "" => {}
                other => {
                    return Err(ApiError::bad_request(format!(
                        "unsupported dryRun value {other:?}: only \"All\" is supported"
                    )));
                }
            },
            _ => {}
        }
    }
    Ok(p)
}

/// Parse a resourceVersion given by a client.
///
/// # Errors
/// 400 when it is not a number this server issued.
pub fn parse_rv(rv: &str) -> ApiResult<u64> {
    rv.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version {rv:?}: expected a resourceVersion this server returned"
        ))
    })
}
