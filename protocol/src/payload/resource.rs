//! Resource-proxy requests and responses (target `resource`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A Kubernetes API request forwarded from the principal's resource proxy to an agent. The
/// event type is the HTTP method.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ResourceRequest {
    /// The request's UUID; the response's `eventid` and `uuid` repeat it.
    pub uuid: String,
    /// Namespace of the resource; empty for cluster-scoped requests.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Name of the resource; empty for lists.
    pub name: String,
    /// Subresource (`status`, `scale`, `log`, ...).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
    /// HTTP method.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub method: String,
    /// Body of write requests (base64 in JSON).
    #[serde(with = "super::go_bytes::vec", skip_serializing_if = "Vec::is_empty")]
    pub body: Vec<u8>,
    /// Query parameters, first value of each key.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
    /// API group (empty for core).
    pub group: String,
    /// API version.
    pub version: String,
    /// Resource (plural), empty for discovery requests.
    pub resource: String,
}

impl ResourceRequest {
    /// A list request: neither resource nor name.
    #[must_use]
    pub fn is_list(&self) -> bool {
        self.resource.is_empty() && self.name.is_empty()
    }

    /// A request for one named resource.
    #[must_use]
    pub fn is_resource(&self) -> bool {
        !self.resource.is_empty() && !self.name.is_empty()
    }

    /// Upstream's validity rule: a single resource or a list.
    #[must_use]
    pub fn is_valid(&self) -> bool {
        self.is_resource() || self.is_list()
    }
}

/// The agent's answer to a [`ResourceRequest`] (type `.response`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ResourceResponse {
    /// The request's UUID.
    pub uuid: String,
    /// HTTP status code.
    pub status: i64,
    /// JSON text of the object or list.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource: String,
}

/// Query parameters of a proxied request that reach the agent's API server: what the verbs
/// the resource proxy serves understand (list options, and write options).
pub const QUERY_PARAMS: [&str; 12] = [
    "fieldSelector",
    "labelSelector",
    "resourceVersion",
    "resourceVersionMatch",
    "continue",
    "limit",
    "dryRun",
    "fieldValidation",
    "fieldManager",
    "force",
    "propagationPolicy",
    "gracePeriodSeconds",
];

/// The `reason` Kubernetes gives HTTP status `code` in a `Status` object.
#[must_use]
pub fn status_reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Gone",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        501 => "NotImplemented",
        502 => "BadGateway",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// A Kubernetes `Status` object (`metav1.Status`, failure) for `code` saying `message`, as JSON
/// text: what clients such as kubectl and Argo CD read an error from.
#[must_use]
pub fn status_body(code: u16, message: &str) -> String {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": status_reason(code),
        "code": code,
    })
    .to_string()
}

/// Whether `text` is a Kubernetes `Status` object (an error answer to pass on as it is).
#[must_use]
pub fn is_status(text: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(text)
        .is_ok_and(|v| v.get("kind").and_then(|k| k.as_str()) == Some("Status"))
}

/// What a Kubernetes API path names, as the resource proxy takes it (upstream's route regexp,
/// `principal/resource.go`, plus the group discovery upstream answers with 400, #1001).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiPath {
    /// `/version`.
    Version,
    /// `/api`: the legacy group's versions (only `v1` exists).
    LegacyVersions,
    /// Discovery: `/apis` (no group), `/apis/<group>` (no version), `/api/v1` or
    /// `/apis/<group>/<version>` (the resources of that group version).
    Discovery {
        /// API group, empty for `/apis` and the legacy group.
        group: String,
        /// API version, empty for `/apis` and `/apis/<group>`.
        version: String,
    },
    /// A resource, a list of resources, or a subresource.
    Resource(ApiResource),
}

/// The resource part of an [`ApiPath`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiResource {
    /// API group (empty for the legacy core group).
    pub group: String,
    /// API version.
    pub version: String,
    /// Namespace, empty for cluster-scoped requests and for lists across namespaces.
    pub namespace: String,
    /// Resource, plural.
    pub resource: String,
    /// Object name, empty for lists.
    pub name: String,
    /// Subresource (`status`, `scale`, `log`, `exec`, ...).
    pub subresource: String,
}

/// Why a path is not one the resource proxy serves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiPathError {
    /// Not under `/api` or `/apis` (and not `/version`).
    #[error("{0:?} is not a Kubernetes API path (expected /version, /api/... or /apis/...)")]
    NotApi(String),
    /// More segments than a subresource path has.
    #[error("{0:?} has more segments than /apis/<group>/<version>/namespaces/<ns>/<resource>/<name>/<subresource>")]
    TooLong(String),
    /// A segment that is empty, `.` or `..`, or decodes to something with `/` or a control
    /// character in it.
    #[error("{path:?}: segment {segment:?} is not a valid name")]
    BadSegment {
        /// The path.
        path: String,
        /// The offending segment as sent.
        segment: String,
    },
    /// A version segment that does not start with `v`.
    #[error("{path:?}: {segment:?} is not an API version (versions start with \"v\")")]
    BadVersion {
        /// The path.
        path: String,
        /// The offending segment.
        segment: String,
    },
}

impl ApiPath {
    /// Parses the path part of a request URI (no query). Segments are percent-decoded and
    /// checked: none may be empty, `.`, `..`, or contain `/` or control characters once decoded.
    ///
    /// # Errors
    ///
    /// An [`ApiPathError`] naming what is wrong.
    pub fn parse(path: &str) -> Result<Self, ApiPathError> {
        let trimmed = path.strip_suffix('/').filter(|p| !p.is_empty()).unwrap_or(path);
        let Some(rest) = trimmed.strip_prefix('/') else {
            return Err(ApiPathError::NotApi(path.to_owned()));
        };
        let mut segments = Vec::new();
        for raw in rest.split('/') {
            segments.push(decode_segment(path, raw)?);
        }
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        let (group, tail) = match segments.as_slice() {
            ["version"] => return Ok(Self::Version),
            ["api"] => return Ok(Self::LegacyVersions),
            ["apis"] => return Ok(Self::Discovery { group: String::new(), version: String::new() }),
            ["apis", group] => return Ok(Self::Discovery { group: (*group).to_owned(), version: String::new() }),
            ["api", tail @ ..] => ("", tail),
            ["apis", group, tail @ ..] => (*group, tail),
            _ => return Err(ApiPathError::NotApi(path.to_owned())),
        };
        let Some((version, tail)) = tail.split_first() else {
            return Err(ApiPathError::NotApi(path.to_owned()));
        };
        if !version.starts_with('v') {
            return Err(ApiPathError::BadVersion { path: path.to_owned(), segment: (*version).to_owned() });
        }
        let mut target =
            ApiResource { group: group.to_owned(), version: (*version).to_owned(), ..ApiResource::default() };
        let tail = match tail {
            [] => return Ok(Self::Discovery { group: target.group, version: target.version }),
            // `namespaces/<ns>/<resource>...`; `namespaces/<ns>` alone is the Namespace object.
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => {
                target.namespace = (*ns).to_owned();
                rest
            }
            other => other,
        };
        match tail {
            [resource] => target.resource = (*resource).to_owned(),
            [resource, name] => {
                target.resource = (*resource).to_owned();
                target.name = (*name).to_owned();
            }
            [resource, name, sub] => {
                target.resource = (*resource).to_owned();
                target.name = (*name).to_owned();
                target.subresource = (*sub).to_owned();
            }
            _ => return Err(ApiPathError::TooLong(path.to_owned())),
        }
        Ok(Self::Resource(target))
    }
}

fn decode_segment(path: &str, raw: &str) -> Result<String, ApiPathError> {
    let bad = || ApiPathError::BadSegment { path: path.to_owned(), segment: raw.to_owned() };
    let decoded = percent_encoding::percent_decode_str(raw).decode_utf8().map_err(|_| bad())?;
    if decoded.is_empty()
        || decoded == "."
        || decoded == ".."
        || decoded.contains('/')
        || decoded.chars().any(char::is_control)
    {
        return Err(bad());
    }
    Ok(decoded.into_owned())
}

/// Characters escaped in a rendered path segment: everything but RFC 3986 unreserved
/// characters and `:` (Kubernetes names such as `system:node` keep it).
const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b':');

impl ApiResource {
    /// The discovery path of this target's group and version, for a request without a
    /// resource: `/apis`, `/apis/<group>`, `/api/<version>` or `/apis/<group>/<version>`, every
    /// segment checked and escaped.
    ///
    /// # Errors
    ///
    /// An [`ApiPathError`] naming the segment that cannot be part of a path.
    pub fn discovery_path(&self) -> Result<String, ApiPathError> {
        Ok(match (self.group.as_str(), self.version.as_str()) {
            ("", "") => "/apis".to_owned(),
            (group, "") => format!("/apis/{}", self.checked(group)?),
            ("", version) => format!("/api/{}", self.checked(version)?),
            (group, version) => format!("/apis/{}/{}", self.checked(group)?, self.checked(version)?),
        })
    }

    /// `segment` escaped for a path, or the error naming it: empty, `.`, `..`, or with `/` or a
    /// control character in it.
    fn checked(&self, segment: &str) -> Result<String, ApiPathError> {
        if segment.is_empty()
            || segment == "."
            || segment == ".."
            || segment.contains('/')
            || segment.chars().any(char::is_control)
        {
            return Err(ApiPathError::BadSegment { path: format!("{self:?}"), segment: segment.to_owned() });
        }
        Ok(percent_encoding::utf8_percent_encode(segment, SEGMENT).to_string())
    }

    /// The target of a resource request.
    #[must_use]
    pub fn of(req: &ResourceRequest) -> Self {
        Self {
            group: req.group.clone(),
            version: req.version.clone(),
            namespace: req.namespace.clone(),
            resource: req.resource.clone(),
            name: req.name.clone(),
            subresource: req.subresource.clone(),
        }
    }

    /// The API path of this target, every segment checked and escaped. A subresource needs a
    /// name, a name needs a resource, and every target needs a version.
    ///
    /// # Errors
    ///
    /// An [`ApiPathError`] naming the segment that cannot be part of a path.
    pub fn path(&self) -> Result<String, ApiPathError> {
        let describe = || format!("{self:?}");
        let check = |segment: &str| self.checked(segment);
        if !self.version.starts_with('v') {
            return Err(ApiPathError::BadVersion { path: describe(), segment: self.version.clone() });
        }
        let mut out = if self.group.is_empty() {
            format!("/api/{}", check(&self.version)?)
        } else {
            format!("/apis/{}/{}", check(&self.group)?, check(&self.version)?)
        };
        if !self.namespace.is_empty() {
            out.push_str("/namespaces/");
            out.push_str(&check(&self.namespace)?);
        }
        out.push('/');
        out.push_str(&check(&self.resource)?);
        if !self.name.is_empty() {
            out.push('/');
            out.push_str(&check(&self.name)?);
        }
        if !self.subresource.is_empty() {
            if self.name.is_empty() {
                return Err(ApiPathError::BadSegment { path: describe(), segment: String::new() });
            }
            out.push('/');
            out.push_str(&check(&self.subresource)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(group: &str, version: &str, namespace: &str, resource: &str, name: &str, sub: &str) -> ApiPath {
        ApiPath::Resource(ApiResource {
            group: group.into(),
            version: version.into(),
            namespace: namespace.into(),
            resource: resource.into(),
            name: name.into(),
            subresource: sub.into(),
        })
    }

    /// Paths Argo CD's server and kubectl 1.37 send (taken from their request logs), and what
    /// each names.
    #[test]
    fn paths_clients_send_parse_as_the_api_server_reads_them() {
        let d = |g: &str, v: &str| ApiPath::Discovery { group: g.into(), version: v.into() };
        let cases = [
            ("/version", ApiPath::Version),
            ("/api", ApiPath::LegacyVersions),
            ("/apis", d("", "")),
            ("/apis/", d("", "")),
            ("/apis/apps", d("apps", "")),
            ("/api/v1", d("", "v1")),
            ("/apis/apps/v1", d("apps", "v1")),
            ("/api/v1/namespaces", res("", "v1", "", "namespaces", "", "")),
            ("/api/v1/namespaces/guestbook", res("", "v1", "", "namespaces", "guestbook", "")),
            ("/api/v1/namespaces/guestbook/pods", res("", "v1", "guestbook", "pods", "", "")),
            ("/api/v1/namespaces/guestbook/pods/web-0", res("", "v1", "guestbook", "pods", "web-0", "")),
            ("/api/v1/namespaces/guestbook/pods/web-0/log", res("", "v1", "guestbook", "pods", "web-0", "log")),
            ("/apis/apps/v1/namespaces/gb/deployments/ui/scale", res("apps", "v1", "gb", "deployments", "ui", "scale")),
            ("/apis/apps/v1/deployments", res("apps", "v1", "", "deployments", "", "")),
            (
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/applications.argoproj.io",
                res("apiextensions.k8s.io", "v1", "", "customresourcedefinitions", "applications.argoproj.io", ""),
            ),
            (
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/system%3Aaggregate-to-view",
                res("rbac.authorization.k8s.io", "v1", "", "clusterroles", "system:aggregate-to-view", ""),
            ),
            ("/api/v1/namespaces/gb/events", res("", "v1", "gb", "events", "", "")),
        ];
        for (path, want) in cases {
            assert_eq!(ApiPath::parse(path).unwrap_or_else(|e| panic!("{path}: {e}")), want, "{path}");
        }
    }

    #[test]
    fn paths_that_are_not_api_paths_or_try_to_escape_are_refused_by_name() {
        for path in [
            "",
            "/",
            "/healthz",
            "/apis/apps/1",
            "/api/v1/namespaces/a/pods/b/log/extra",
            "/api/v1/namespaces/../pods",
            "/api/v1/namespaces/a/pods/%2e%2e",
            "/api/v1/namespaces/a/pods/a%2Fb",
            "/api/v1//pods",
            "/api/v1/pods/%00",
            "/api/v1/pods/%ff",
            "relative/api",
        ] {
            let err = ApiPath::parse(path).expect_err(path);
            assert!(!err.to_string().is_empty(), "{path}");
        }
    }

    #[test]
    fn a_parsed_target_renders_back_to_the_same_path() {
        for path in [
            "/api/v1/namespaces/guestbook/pods/web-0/log",
            "/apis/apps/v1/namespaces/gb/deployments/ui/scale",
            "/apis/apps/v1/deployments",
            "/api/v1/namespaces/guestbook",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/system:aggregate-to-view",
            "/api/v1/namespaces/a/configmaps/with%20space",
        ] {
            let ApiPath::Resource(target) = ApiPath::parse(path).expect(path) else { panic!("{path}") };
            assert_eq!(target.path().expect(path), path);
        }
    }

    #[test]
    fn discovery_paths_render_checked() {
        let at = |group: &str, version: &str| {
            ApiResource { group: group.into(), version: version.into(), ..ApiResource::default() }.discovery_path()
        };
        assert_eq!(at("", "").unwrap(), "/apis");
        assert_eq!(at("apps", "").unwrap(), "/apis/apps");
        assert_eq!(at("", "v1").unwrap(), "/api/v1");
        assert_eq!(at("argoproj.io", "v1alpha1").unwrap(), "/apis/argoproj.io/v1alpha1");
        for (group, version) in [("..", ""), ("a/b", "v1"), ("apps", ".."), ("", "v1/x")] {
            assert!(at(group, version).is_err(), "{group:?} {version:?}");
        }
    }

    #[test]
    fn a_request_from_the_wire_cannot_render_a_path_outside_its_target() {
        let req = ResourceRequest {
            version: "v1".into(),
            namespace: "../../apis".into(),
            resource: "secrets".into(),
            name: "x".into(),
            ..ResourceRequest::default()
        };
        assert!(ApiResource::of(&req).path().is_err());
        let req = ResourceRequest { version: "v1".into(), resource: "pods".into(), subresource: "exec".into(), ..req };
        assert!(ApiResource::of(&req).path().is_err(), "a subresource without a name");
        let req = ResourceRequest { version: "x1".into(), resource: "pods".into(), ..ResourceRequest::default() };
        assert!(ApiResource::of(&req).path().is_err(), "not a version");
    }

    #[test]
    fn api_path_fuzz_logic_over_sample_inputs() {
        for input in [
            "/api/v1/namespaces/guestbook/pods/web-0/log",
            "/api/v1/namespaces/x/status",
            "/apis/a%2Fb/v1/x",
            "/apis/apps/v1/namespaces/gb/deployments/ui/scale/extra",
            "apps\u{1f}v1\u{1f}\u{1f}namespaces\u{1f}x\u{1f}status",
            "\u{1f}v1\u{1f}..\u{1f}pods",
            "\u{1f}v1\u{1f}a b\u{1f}pods\u{1f}%2e%2e",
            "\u{1f}v1\u{1f}ns\u{1f}namespaces",
        ] {
            crate::fuzzing::check_api_path(input.as_bytes()).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        }
        crate::fuzzing::check_api_path(&[0xff, 0xfe]).expect("not UTF-8: ignored");
    }
}
