//! Request paths: what a URL names, parsed without trusting it.

use percent_encoding::percent_decode_str;

/// What a request path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/api`.
    CoreVersions,
    /// `/apis`.
    GroupList,
    /// `/apis/{group}`.
    Group(String),
    /// `/api/v1`, `/apis/{group}/{version}`.
    ResourceList {
        /// API group ("" for core).
        group: String,
        /// Version.
        version: String,
    },
    /// `/version`.
    Version,
    /// `/healthz`, `/livez`, `/readyz` (and their `/...` sub-checks).
    Health,
    /// `/openapi/v2`.
    OpenApiV2,
    /// `/openapi/v3` and below.
    OpenApiV3,
    /// A resource collection or object.
    Resource(ResourcePath),
}

/// A path below a group/version that names a resource, maybe an object and a subresource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    /// API group ("" for core).
    pub group: String,
    /// Version.
    pub version: String,
    /// Plural resource name.
    pub resource: String,
    /// Namespace from the path, if any.
    pub namespace: Option<String>,
    /// Object name, if any.
    pub name: Option<String>,
    /// Subresource (`status`), if any.
    pub subresource: Option<String>,
}

/// Why a path names nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No such path.
    #[error("the server could not find the requested resource")]
    NotFound,
    /// A segment is not valid UTF-8 after percent-decoding, or is empty.
    #[error("invalid path segment {0:?}")]
    BadSegment(String),
}

fn decode(seg: &str) -> Result<String, RouteError> {
    let s = percent_decode_str(seg).decode_utf8().map_err(|_| RouteError::BadSegment(seg.to_string()))?;
    if s.is_empty() || s.contains('/') || s == "." || s == ".." {
        return Err(RouteError::BadSegment(seg.to_string()));
    }
    Ok(s.into_owned())
}

/// Parse a request path (without the query string).
///
/// # Errors
/// `NotFound` when the path names nothing this server serves, `BadSegment` for undecodable parts.
pub fn parse(path: &str) -> Result<Route, RouteError> {
    let trimmed = path.trim_end_matches('/');
    let segs: Vec<&str> = trimmed.split('/').skip(1).collect();
    match segs.as_slice() {
        ["api"] => Ok(Route::CoreVersions),
        ["apis"] => Ok(Route::GroupList),
        ["version"] => Ok(Route::Version),
        ["healthz" | "livez" | "readyz", ..] => Ok(Route::Health),
        ["openapi", "v2"] => Ok(Route::OpenApiV2),
        ["openapi", "v3", ..] => Ok(Route::OpenApiV3),
        ["apis", group] => Ok(Route::Group(decode(group)?)),
        ["api", version] => Ok(Route::ResourceList { group: String::new(), version: decode(version)? }),
        ["apis", group, version] => Ok(Route::ResourceList { group: decode(group)?, version: decode(version)? }),
        ["api", version, rest @ ..] => resource(String::new(), decode(version)?, rest),
        ["apis", group, version, rest @ ..] => resource(decode(group)?, decode(version)?, rest),
        _ => Err(RouteError::NotFound),
    }
}

fn resource(group: String, version: String, rest: &[&str]) -> Result<Route, RouteError> {
    let mk =
        |namespace: Option<&str>, resource: &str, name: Option<&str>, sub: Option<&str>| -> Result<Route, RouteError> {
            Ok(Route::Resource(ResourcePath {
                group: group.clone(),
                version: version.clone(),
                resource: decode(resource)?,
                namespace: namespace.map(decode).transpose()?,
                name: name.map(decode).transpose()?,
                subresource: sub.map(decode).transpose()?,
            }))
        };
    let core = group.is_empty();
    match rest {
        // Subresources of a Namespace object itself.
        ["namespaces", ns, sub @ ("status" | "finalize")] if core => mk(None, "namespaces", Some(ns), Some(sub)),
        ["namespaces", ns, resource] => mk(Some(ns), resource, None, None),
        ["namespaces", ns, resource, name] => mk(Some(ns), resource, Some(name), None),
        ["namespaces", ns, resource, name, sub] => mk(Some(ns), resource, Some(name), Some(sub)),
        [resource] => mk(None, resource, None, None),
        [resource, name] => mk(None, resource, Some(name), None),
        [resource, name, sub] => mk(None, resource, Some(name), Some(sub)),
        _ => Err(RouteError::NotFound),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rp(group: &str, resource: &str, ns: Option<&str>, name: Option<&str>, sub: Option<&str>) -> Route {
        Route::Resource(ResourcePath {
            group: group.into(),
            version: if group.is_empty() { "v1".into() } else { "v1alpha1".into() },
            resource: resource.into(),
            namespace: ns.map(Into::into),
            name: name.map(Into::into),
            subresource: sub.map(Into::into),
        })
    }

    #[test]
    fn paths() {
        assert_eq!(parse("/api"), Ok(Route::CoreVersions));
        assert_eq!(parse("/apis/"), Ok(Route::GroupList));
        assert_eq!(parse("/readyz"), Ok(Route::Health));
        assert_eq!(parse("/api/v1"), Ok(Route::ResourceList { group: String::new(), version: "v1".into() }));
        assert_eq!(parse("/api/v1/namespaces"), Ok(rp("", "namespaces", None, None, None)));
        assert_eq!(parse("/api/v1/namespaces/argocd"), Ok(rp("", "namespaces", None, Some("argocd"), None)));
        assert_eq!(
            parse("/api/v1/namespaces/argocd/status"),
            Ok(rp("", "namespaces", None, Some("argocd"), Some("status")))
        );
        assert_eq!(parse("/api/v1/namespaces/argocd/secrets"), Ok(rp("", "secrets", Some("argocd"), None, None)));
        assert_eq!(
            parse("/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/guestbook/status"),
            Ok(rp("argoproj.io", "applications", Some("argocd"), Some("guestbook"), Some("status")))
        );
        assert_eq!(
            parse("/apis/argoproj.io/v1alpha1/applications"),
            Ok(rp("argoproj.io", "applications", None, None, None))
        );
        assert_eq!(parse("/nope"), Err(RouteError::NotFound));
        assert_eq!(parse("/api/v1/a/b/c/d/e/f/g"), Err(RouteError::NotFound));
        assert!(matches!(parse("/api/v1/namespaces/%ff/secrets"), Err(RouteError::BadSegment(_))));
        assert!(matches!(parse("/api/v1/namespaces/a%2Fb/secrets"), Err(RouteError::BadSegment(_))));
    }
}
