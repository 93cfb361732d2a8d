//! Upstream's header method (`--auth header:<name>:<regex>`, `internal/auth/header/header.go`),
//! kept for compatibility: the regex runs over the header's value and capture group 1 is the
//! agent name (a DNS-1123 label). Prefer [`super::xfcc`], which parses XFCC structurally and
//! checks trust domain and namespace; upstream's Istio regex
//! `^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)` accepts any trust domain and namespace.
//!
//! Differences from upstream:
//! * the header is read only from a trusted hop (loopback by default, see the `forwarded` module);
//!   upstream trusts any caller that reaches the plaintext port;
//! * a header that appears more than once is refused (upstream takes the first value);
//! * sessions are bound. When capture group 1 lies inside a `spiffe://` URI of the value (the
//!   run of characters around it free of `, ; = "` and whitespace, e.g. the XFCC `URI=` value)
//!   and that URI is a valid SPIFFE ID, the binding is [`Binding::SpiffeId`]; otherwise (e.g.
//!   Linkerd's `l5d-client-id`) it is [`Binding::HeaderSha256`], the SHA-256 of the raw header
//!   value, so the token is valid only while the proxy forwards exactly that value. Upstream
//!   checks only the token.

use http::HeaderName;
use mesh::{SpiffeId, TrustedHops};
use regex::Regex;

use super::forwarded::trusted_header_value;
use super::{AuthContext, Authenticator};
use crate::error::AuthError;
use crate::identity::{AgentIdentity, AgentName, Binding, InvalidAgentName};

/// How much of a header value an error message quotes.
const QUOTED_VALUE_CHARS: usize = 256;

/// The `header:<name>:<regex>` method.
#[derive(Clone, Debug)]
pub struct HeaderAuthenticator {
    header: HeaderName,
    regex: Regex,
    trusted_hops: TrustedHops,
}

impl HeaderAuthenticator {
    /// The method name agents send in `AuthRequest.method` (upstream's `--creds header:`).
    pub const METHOD: &'static str = "header";

    /// Reads `header` from `trusted_hops` only; `regex`'s capture group 1 is the agent name.
    /// Build it from `--auth` with [`super::spec::AuthMethodSpec::parse`], which also checks the
    /// regex has a capture group.
    #[must_use]
    pub fn new(header: HeaderName, regex: Regex, trusted_hops: TrustedHops) -> Self {
        Self { header, regex, trusted_hops }
    }

    /// The header read.
    #[must_use]
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// The agent name regex.
    #[must_use]
    pub fn regex(&self) -> &Regex {
        &self.regex
    }

    /// The hops the header is believed from.
    #[must_use]
    pub fn trusted_hops(&self) -> &TrustedHops {
        &self.trusted_hops
    }

    /// The agent name and session binding a header value yields.
    ///
    /// # Errors
    ///
    /// [`AuthError::HeaderMismatch`] when the regex does not match;
    /// [`AuthError::HeaderAgentName`] when capture group 1 is empty or not a DNS-1123 label.
    pub fn extract(&self, value: &str) -> Result<(AgentName, Binding), AuthError> {
        let Some(captures) = self.regex.captures(value) else {
            let mut quoted: String = value.chars().take(QUOTED_VALUE_CHARS).collect();
            if quoted.len() < value.len() {
                quoted.push('…');
            }
            return Err(AuthError::HeaderMismatch {
                header: self.header.to_string(),
                value: quoted,
                regex: self.regex.to_string(),
            });
        };
        let name_error = |reason| AuthError::HeaderAgentName {
            header: self.header.to_string(),
            regex: self.regex.to_string(),
            reason,
        };
        let capture = captures.get(1).filter(|m| !m.is_empty()).ok_or_else(|| name_error(InvalidAgentName::Empty))?;
        let name = AgentName::new(capture.as_str()).map_err(name_error)?;
        let binding = spiffe_id_around(value, capture.start(), capture.end())
            .map_or_else(|| Binding::header_value(value.as_bytes()), Binding::SpiffeId);
        Ok((name, binding))
    }
}

/// The SPIFFE ID enclosing `value[start..end]`: the run of characters around `start` free of
/// `, ; = "` and whitespace, if it holds the whole capture and is a valid SPIFFE ID.
fn spiffe_id_around(value: &str, start: usize, end: usize) -> Option<String> {
    let is_delimiter = |c: char| matches!(c, ',' | ';' | '=' | '"') || c.is_ascii_whitespace();
    let token_start = value.get(..start)?.rfind(is_delimiter).map_or(0, |i| i + 1);
    let token_end = value.get(start..)?.find(is_delimiter).map_or(value.len(), |i| start + i);
    if end > token_end {
        return None;
    }
    SpiffeId::parse(value.get(token_start..token_end)?).ok().map(|id| id.to_string())
}

impl Authenticator for HeaderAuthenticator {
    fn method(&self) -> &'static str {
        Self::METHOD
    }

    fn authenticate(&self, cx: &AuthContext<'_>) -> Result<AgentIdentity, AuthError> {
        let value = trusted_header_value(cx, Self::METHOD, &self.header, &self.trusted_hops)?;
        let (name, binding) = self.extract(value)?;
        Ok(AgentIdentity::new(name, Self::METHOD, binding))
    }

    /// Re-derives the binding from this call's header (trusted hop and regex again).
    fn presented_binding(&self, cx: &AuthContext<'_>) -> Result<Binding, AuthError> {
        let value = trusted_header_value(cx, Self::METHOD, &self.header, &self.trusted_hops)?;
        self.extract(value).map(|(_, binding)| binding)
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::identity::TransportIdentity;

    const ISTIO_REGEX: &str = "^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)";
    const LINKERD_REGEX: &str = r"^([^.]+)\..*";

    fn method(header: &'static str, regex: &str) -> HeaderAuthenticator {
        HeaderAuthenticator::new(
            HeaderName::from_static(header),
            Regex::new(regex).expect("regex"),
            TrustedHops::loopback(),
        )
    }

    fn call(header: &'static str, value: &str, addr: &str) -> (TransportIdentity, http::HeaderMap) {
        let mut h = http::HeaderMap::new();
        h.insert(HeaderName::from_static(header), value.parse().expect("value"));
        (TransportIdentity::plaintext(Some(addr.parse::<SocketAddr>().expect("addr"))), h)
    }

    #[test]
    fn upstream_istio_regex_binds_to_the_spiffe_id_it_read() {
        let m = method("x-forwarded-client-cert", ISTIO_REGEX);
        let (t, h) =
            call("x-forwarded-client-cert", "Hash=ab;URI=spiffe://cluster.local/ns/agents/sa/agent-1", "127.0.0.1:9");
        let id = m.authenticate(&AuthContext::new(&t, &h)).expect("identity");
        assert_eq!(id.name().as_str(), "agent-1");
        let bound = Binding::SpiffeId("spiffe://cluster.local/ns/agents/sa/agent-1".into());
        assert_eq!(id.binding(), &bound);
        assert_eq!(m.presented_binding(&AuthContext::new(&t, &h)).expect("binding"), bound);
    }

    #[test]
    fn non_spiffe_values_bind_to_the_value_hash() {
        let m = method("l5d-client-id", LINKERD_REGEX);
        let value = "agent-1.agents.serviceaccount.identity.linkerd.cluster.local";
        let (t, h) = call("l5d-client-id", value, "127.0.0.1:9");
        let id = m.authenticate(&AuthContext::new(&t, &h)).expect("identity");
        assert_eq!(id.name().as_str(), "agent-1");
        assert_eq!(id.binding(), &Binding::header_value(value.as_bytes()));
    }

    #[test]
    fn spiffe_detection_needs_the_whole_capture_inside_one_valid_id() {
        assert_eq!(spiffe_id_around("URI=\"spiffe://td/sa/a\";x", 20, 21), Some("spiffe://td/sa/a".into()));
        assert_eq!(spiffe_id_around("URI=spiffe://td/sa/a;DNS=b", 19, 26), None);
        assert_eq!(spiffe_id_around("x=https://td/sa/a", 16, 17), None);
        assert_eq!(spiffe_id_around("spiffe://td/sa/a", 0, 16), Some("spiffe://td/sa/a".into()));
    }

    #[test]
    fn failures_are_explained() {
        let m = method("x-forwarded-client-cert", ISTIO_REGEX);
        let (t, h) = call("x-forwarded-client-cert", "URI=spiffe://td/ns/a/sa/agent-1", "192.0.2.1:9");
        let err = m.authenticate(&AuthContext::new(&t, &h)).expect_err("untrusted");
        assert!(err.to_string().contains("192.0.2.1, which is not a trusted hop"), "{err}");
        let (t, h) = call("x-forwarded-client-cert", "Hash=ab", "127.0.0.1:9");
        let err = m.authenticate(&AuthContext::new(&t, &h)).expect_err("mismatch");
        assert!(matches!(err, AuthError::HeaderMismatch { .. }), "{err}");
        let (t, h) = call("x-forwarded-client-cert", "URI=spiffe://td/ns/a/sa/Agent_1", "127.0.0.1:9");
        let err = m.authenticate(&AuthContext::new(&t, &h)).expect_err("name");
        assert!(err.to_string().contains("DNS-1123"), "{err}");
        let m = method("x-forwarded-client-cert", "URI=()");
        let (t, h) = call("x-forwarded-client-cert", "URI=", "127.0.0.1:9");
        let err = m.authenticate(&AuthContext::new(&t, &h)).expect_err("empty");
        assert!(matches!(err, AuthError::HeaderAgentName { reason: InvalidAgentName::Empty, .. }), "{err}");
    }
}
