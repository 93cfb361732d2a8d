//! The `--auth` grammar: `<method>:<config>`, and the `key=value;…` options of `xfcc:` and
//! `spiffe:`.

use std::collections::BTreeMap;

use http::HeaderName;
use mesh::{MeshProfile, PathPattern, SpiffePolicy, TrustDomain, TrustedHops};
use regex::Regex;

use super::{AuthMethodSpec, SPIFFE_JWT_KEYS, SPIFFE_X509_KEYS, SpecError};
use crate::method::mtls::IdentitySource;
use crate::method::spiffe_jwt::{JwtSessionBinding, SpiffeJwtAuthenticator};

const XFCC_KEY_LIST: [&str; 7] =
    ["profile", "trust-domain", "pattern", "namespaces", "denied-namespaces", "trusted-hops", "header"];

const SPIFFE_KEY_LIST: [&str; 6] =
    ["trust-domain", "pattern", "namespaces", "denied-namespaces", "endpoint", "audience"];

const SPIFFE_DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

impl AuthMethodSpec {
    /// Parses an `--auth` value.
    ///
    /// # Errors
    ///
    /// [`SpecError`] naming what is wrong with `spec`.
    pub fn parse(spec: &str) -> Result<Self, SpecError> {
        if spec.is_empty() {
            return Err(SpecError::Empty);
        }
        let Some((method, config)) = spec.split_once(':') else {
            return match spec {
                "xfcc" => Self::parse_xfcc(spec, ""),
                "mtls" | "header" | "userpass" | "spiffe" | "spiffe-jwt" => {
                    Err(SpecError::MissingConfig(spec.to_owned()))
                }
                other => Err(SpecError::UnknownMethod(other.to_owned())),
            };
        };
        match method {
            "mtls" => Self::parse_mtls(spec, config),
            "xfcc" => Self::parse_xfcc(spec, config),
            "header" => Self::parse_header(spec, config),
            // Upstream v0.10: the regex over the JWT-SVID's SPIFFE ID, audience fixed.
            "spiffe-jwt" => Ok(Self::SpiffeJwtRegex {
                regex: agent_regex(spec, config)?,
                audience: SpiffeJwtAuthenticator::DEFAULT_AUDIENCE.to_owned(),
                endpoint: None,
                binding: JwtSessionBinding::EveryCall,
            }),
            "spiffe" => {
                let (kind, options) = config.split_once(':').unwrap_or((config, ""));
                match kind {
                    "x509" => Self::parse_spiffe(spec, "x509", options),
                    "jwt" => Self::parse_spiffe(spec, "jwt", options),
                    _ => Err(SpecError::UnknownMethod(format!("spiffe:{kind}"))),
                }
            }
            "userpass" => Err(SpecError::NotSupportedYet {
                method: method.to_owned(),
                reason: "upstream deprecated userpass; use mtls:subject:<regex> with agent client certificates",
            }),
            other => Err(SpecError::UnknownMethod(other.to_owned())),
        }
    }

    fn parse_mtls(spec: &str, config: &str) -> Result<Self, SpecError> {
        let (source, pattern, deprecated_syntax) = if let Some(p) = config.strip_prefix("subject:") {
            (IdentitySource::Subject, p, false)
        } else if let Some(p) = config.strip_prefix("uri:") {
            (IdentitySource::Uri, p, false)
        } else {
            (IdentitySource::Subject, config, true)
        };
        let regex = agent_regex(spec, pattern)?;
        Ok(Self::Mtls { source, regex, deprecated_syntax })
    }

    fn parse_header(spec: &str, config: &str) -> Result<Self, SpecError> {
        let Some((name, pattern)) = config.split_once(':') else {
            return Err(SpecError::HeaderSyntax { spec: spec.to_owned() });
        };
        if name.is_empty() {
            return Err(SpecError::HeaderSyntax { spec: spec.to_owned() });
        }
        let header = header_name(name)
            .ok_or_else(|| SpecError::BadHeaderName { spec: spec.to_owned(), name: name.to_owned() })?;
        let regex = agent_regex(spec, pattern)?;
        Ok(Self::Header { header, regex, trusted_hops: None })
    }

    fn parse_xfcc(spec: &str, config: &str) -> Result<Self, SpecError> {
        let syntax = |reason: String| SpecError::XfccSyntax { spec: spec.to_owned(), reason };
        let unknown = |key: &str| SpecError::XfccUnknownKey { spec: spec.to_owned(), key: key.to_owned() };
        let items =
            parse_options(config, |k| XFCC_KEY_LIST.iter().copied().find(|known| *known == k), &syntax, &unknown)?;
        let value_error =
            |key: &'static str, reason: String| SpecError::XfccValue { spec: spec.to_owned(), key, reason };
        let list = |key: &'static str| option_list(&items, key);
        let non_empty = |key: &'static str| option_non_empty(&items, key, &value_error);

        let profile = match items.get("profile") {
            Some(name) => name.parse::<MeshProfile>().map_err(|e| value_error("profile", e.to_string()))?,
            None => MeshProfile::Istio,
        };
        let defaults = profile.default_policy();
        let trust_domains = match non_empty("trust-domain")? {
            Some(names) => names
                .into_iter()
                .map(|n| TrustDomain::new(n).map_err(|e| value_error("trust-domain", format!("{n:?}: {e}"))))
                .collect::<Result<Vec<_>, _>>()?,
            None => defaults.trust_domains().to_vec(),
        };
        let patterns = match non_empty("pattern")? {
            Some(patterns) => patterns
                .into_iter()
                .map(|p| PathPattern::new(p).map_err(|e| value_error("pattern", e.to_string())))
                .collect::<Result<Vec<_>, _>>()?,
            None => defaults.patterns().to_vec(),
        };
        let mut policy =
            SpiffePolicy::new(trust_domains, patterns).map_err(|e| value_error("pattern", e.to_string()))?;
        let denied: Vec<String> = match list("denied-namespaces") {
            Some(names) => names.into_iter().map(str::to_owned).collect(),
            None => defaults.denied_namespaces().iter().cloned().collect(),
        };
        if !denied.is_empty() {
            let key = if items.contains_key("denied-namespaces") { "denied-namespaces" } else { "pattern" };
            policy = policy.with_denied_namespaces(denied).map_err(|e| {
                value_error(
                    key,
                    format!(
                        "{e} (the {profile} profile denies its mesh namespace; give denied-namespaces= to deny none)"
                    ),
                )
            })?;
        }
        if let Some(allowed) = non_empty("namespaces")? {
            policy = policy.with_allowed_namespaces(allowed).map_err(|e| value_error("namespaces", e.to_string()))?;
        }
        let trusted_hops = match items.get("trusted-hops") {
            Some(list) => {
                let hops = TrustedHops::parse_list(list).map_err(|e| value_error("trusted-hops", e.to_string()))?;
                if hops.networks().is_empty() {
                    return Err(value_error("trusted-hops", "the list is empty; omit the key for loopback".to_owned()));
                }
                Some(hops)
            }
            None => None,
        };
        let header = match items.get("header") {
            Some(name) => header_name(name)
                .ok_or_else(|| value_error("header", format!("{name:?} is not a valid header name")))?,
            None => HeaderName::from_static(profile.identity_header().name()),
        };
        Ok(Self::Xfcc { profile, header, policy, trusted_hops })
    }

    fn parse_spiffe(spec: &str, kind: &'static str, config: &str) -> Result<Self, SpecError> {
        let keys = if kind == "jwt" { SPIFFE_JWT_KEYS } else { SPIFFE_X509_KEYS };
        let syntax = |reason: String| SpecError::SpiffeSyntax { spec: spec.to_owned(), kind, reason, keys };
        let unknown = |key: &str| syntax(format!("unknown key \"{key}\""));
        let known = |k: &str| {
            SPIFFE_KEY_LIST.iter().copied().find(|known| *known == k && (kind == "jwt" || *known != "audience"))
        };
        let items = parse_options(config, known, &syntax, &unknown)?;
        let value_error =
            |key: &'static str, reason: String| SpecError::SpiffeValue { spec: spec.to_owned(), key, reason };
        let list = |key: &'static str| option_list(&items, key);
        let non_empty = |key: &'static str| option_non_empty(&items, key, &value_error);
        let trust_domains = non_empty("trust-domain")?
            .unwrap_or_else(|| vec![SPIFFE_DEFAULT_TRUST_DOMAIN])
            .into_iter()
            .map(|n| TrustDomain::new(n).map_err(|e| value_error("trust-domain", format!("{n:?}: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let patterns = non_empty("pattern")?
            .unwrap_or_else(|| vec![mesh::policy::KUBERNETES_PATTERN])
            .into_iter()
            .map(|p| PathPattern::new(p).map_err(|e| value_error("pattern", e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let mut policy =
            SpiffePolicy::new(trust_domains, patterns).map_err(|e| value_error("pattern", e.to_string()))?;
        if let Some(denied) = list("denied-namespaces").filter(|d| !d.is_empty()) {
            policy =
                policy.with_denied_namespaces(denied).map_err(|e| value_error("denied-namespaces", e.to_string()))?;
        }
        if let Some(allowed) = non_empty("namespaces")? {
            policy = policy.with_allowed_namespaces(allowed).map_err(|e| value_error("namespaces", e.to_string()))?;
        }
        let endpoint = match items.get("endpoint").copied() {
            Some("") => {
                return Err(value_error("endpoint", "empty; omit the key for SPIFFE_ENDPOINT_SOCKET".to_owned()));
            }
            Some(endpoint) => Some(endpoint.to_owned()),
            None => None,
        };
        if kind == "x509" {
            return Ok(Self::SpiffeX509 { policy, endpoint });
        }
        let audience = match items.get("audience").copied() {
            Some("") => return Err(value_error("audience", "empty; omit the key for the default".to_owned())),
            Some(audience) if audience.contains(',') => {
                return Err(value_error("audience", "give exactly one audience".to_owned()));
            }
            Some(audience) => audience.to_owned(),
            None => SpiffeJwtAuthenticator::DEFAULT_AUDIENCE.to_owned(),
        };
        Ok(Self::SpiffeJwt { policy, audience, endpoint, binding: JwtSessionBinding::EveryCall })
    }
}

/// A compiled agent name regex: not empty, with a capture group.
fn agent_regex(spec: &str, pattern: &str) -> Result<Regex, SpecError> {
    if pattern.is_empty() {
        return Err(SpecError::EmptyRegex { spec: spec.to_owned() });
    }
    let regex = Regex::new(pattern).map_err(|source| SpecError::InvalidRegex { spec: spec.to_owned(), source })?;
    if regex.captures_len() < 2 {
        return Err(SpecError::NoCaptureGroup { spec: spec.to_owned() });
    }
    Ok(regex)
}

/// A header name, lower-cased as upstream does (gRPC metadata keys are lower case).
fn header_name(name: &str) -> Option<HeaderName> {
    HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes()).ok()
}

/// The `key=value;key=value` options of `xfcc:` and `spiffe:` methods: every item non-empty,
/// `key=value`, a key `known` maps to its canonical name, and no key twice.
fn parse_options<'a>(
    config: &'a str,
    known: impl Fn(&str) -> Option<&'static str>,
    syntax: &dyn Fn(String) -> SpecError,
    unknown: &dyn Fn(&str) -> SpecError,
) -> Result<BTreeMap<&'static str, &'a str>, SpecError> {
    let mut items = BTreeMap::new();
    if config.trim().is_empty() {
        return Ok(items);
    }
    for item in config.split(';') {
        let item = item.trim();
        if item.is_empty() {
            return Err(syntax("an item is empty (two ';' in a row, or a trailing ';')".to_owned()));
        }
        let Some((key, value)) = item.split_once('=') else {
            return Err(syntax(format!("\"{item}\" is not key=value")));
        };
        let key = key.trim();
        let Some(known) = known(key) else {
            return Err(unknown(key));
        };
        if items.insert(known, value.trim()).is_some() {
            return Err(syntax(format!("key {known} is given twice")));
        }
    }
    Ok(items)
}

/// An option's comma-separated values, blanks dropped; `None` when the key is absent.
fn option_list<'a>(items: &BTreeMap<&'static str, &'a str>, key: &'static str) -> Option<Vec<&'a str>> {
    items.get(key).map(|v| v.split(',').map(str::trim).filter(|s| !s.is_empty()).collect())
}

/// Like [`option_list`], but a key given with no values is an error (omit it for the default).
fn option_non_empty<'a>(
    items: &BTreeMap<&'static str, &'a str>,
    key: &'static str,
    value_error: &dyn Fn(&'static str, String) -> SpecError,
) -> Result<Option<Vec<&'a str>>, SpecError> {
    match option_list(items, key) {
        Some(values) if values.is_empty() => {
            Err(value_error(key, "the list is empty; omit the key for the default".to_owned()))
        }
        other => Ok(other),
    }
}
