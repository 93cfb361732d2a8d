//! The structural mesh method (`--auth xfcc:…`): the agent is the SPIFFE ID the local sidecar
//! verified, forwarded in `x-forwarded-client-cert` (Istio, Envoy) or `l5d-client-id` (Linkerd),
//! checked against a [`SpiffePolicy`].
//!
//! On every call (`Authenticate`, and every protected call through [`crate::AuthLayer`]):
//! 1. the connection must come from a trusted hop, else the header is not read at all
//!    (the `forwarded` module);
//! 2. the header must appear exactly once; for XFCC the **last** element (the one our sidecar
//!    appended) must carry exactly one non-empty `URI` that is a valid SPIFFE ID; for Linkerd the
//!    value `<sa>.<ns>.serviceaccount.identity.<cp-ns>.<td>` maps to
//!    `spiffe://<td>/ns/<ns>/sa/<sa>` ([`mesh::identity`]);
//! 3. the policy decides whether the ID is an agent, and which ([`SpiffePolicy::authorize`]).
//!
//! Sessions bind to the SPIFFE ID ([`Binding::SpiffeId`]), re-derived from the header on every
//! call: a token issued to one workload is refused on a call forwarded for another.
//!
//! The method answers to `AuthRequest.method = "header"`, what agents configured with
//! `--creds header:` (upstream's and ours) send: `xfcc:` changes how the principal reads the
//! header, not what the agent does.

use http::HeaderName;
use mesh::{AuthorizedAgent, IdentityHeader, MeshProfile, SpiffePolicy, TrustedHops};

use super::forwarded::trusted_header_value;
use super::{AuthContext, Authenticator};
use crate::error::AuthError;
use crate::identity::{AgentIdentity, AgentName, Binding};

/// The `xfcc:` method.
#[derive(Clone, Debug)]
pub struct XfccAuthenticator {
    format: IdentityHeader,
    header: HeaderName,
    policy: SpiffePolicy,
    trusted_hops: TrustedHops,
}

impl XfccAuthenticator {
    /// The method name agents send in `AuthRequest.method` (upstream's `--creds header:`).
    pub const METHOD: &'static str = "header";

    /// Reads the identity header of `profile` (`x-forwarded-client-cert` for Istio and Envoy,
    /// `l5d-client-id` for Linkerd) from `trusted_hops` only, and authorizes it with `policy`.
    #[must_use]
    pub fn new(profile: MeshProfile, policy: SpiffePolicy, trusted_hops: TrustedHops) -> Self {
        let format = profile.identity_header();
        let header = match format {
            IdentityHeader::Xfcc => HeaderName::from_static("x-forwarded-client-cert"),
            IdentityHeader::LinkerdClientId => HeaderName::from_static("l5d-client-id"),
        };
        Self { format, header, policy, trusted_hops }
    }

    /// Reads the identity from `header` instead of the profile's header (same format).
    #[must_use]
    pub fn with_header(mut self, header: HeaderName) -> Self {
        self.header = header;
        self
    }

    /// The header read.
    #[must_use]
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// The policy deciding which SPIFFE IDs are agents.
    #[must_use]
    pub fn policy(&self) -> &SpiffePolicy {
        &self.policy
    }

    /// The hops the header is believed from.
    #[must_use]
    pub fn trusted_hops(&self) -> &TrustedHops {
        &self.trusted_hops
    }

    fn identify(&self, cx: &AuthContext<'_>) -> Result<AuthorizedAgent, AuthError> {
        let value = trusted_header_value(cx, Self::METHOD, &self.header, &self.trusted_hops)?;
        self.format
            .identify(value, &self.policy)
            .map_err(|source| AuthError::MeshIdentity { header: self.header.to_string(), source })
    }
}

impl Authenticator for XfccAuthenticator {
    fn method(&self) -> &'static str {
        Self::METHOD
    }

    fn authenticate(&self, cx: &AuthContext<'_>) -> Result<AgentIdentity, AuthError> {
        let agent = self.identify(cx)?;
        let name = AgentName::new(agent.agent()).map_err(|reason| AuthError::HeaderAgentName {
            header: self.header.to_string(),
            regex: self.policy.patterns().iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
            reason,
        })?;
        Ok(AgentIdentity::new(name, Self::METHOD, Binding::SpiffeId(agent.spiffe_id().to_string())))
    }

    /// Re-derives the SPIFFE ID from this call's header (trusted hop, parse and policy again).
    fn presented_binding(&self, cx: &AuthContext<'_>) -> Result<Binding, AuthError> {
        self.identify(cx).map(|agent| Binding::SpiffeId(agent.spiffe_id().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::identity::TransportIdentity;

    const AGENT_1: &str = "By=spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal;Hash=ab;Subject=\"\";URI=spiffe://cluster.local/ns/agents/sa/agent-1";

    fn headers(name: &str, values: &[&str]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for v in values {
            h.append(HeaderName::from_bytes(name.as_bytes()).expect("name"), v.parse().expect("value"));
        }
        h
    }

    fn from(addr: &str) -> TransportIdentity {
        TransportIdentity::plaintext(Some(addr.parse::<SocketAddr>().expect("addr")))
    }

    fn istio() -> XfccAuthenticator {
        XfccAuthenticator::new(MeshProfile::Istio, MeshProfile::Istio.default_policy(), TrustedHops::loopback())
    }

    #[test]
    fn last_element_names_the_agent_and_binds_its_spiffe_id() {
        let h = headers("x-forwarded-client-cert", &[&format!("URI=spiffe://cluster.local/ns/x/sa/other,{AGENT_1}")]);
        let t = from("127.0.0.6:41000");
        let cx = AuthContext::new(&t, &h);
        let id = istio().authenticate(&cx).expect("identity");
        assert_eq!(id.name().as_str(), "agent-1");
        assert_eq!(id.method(), "header");
        let bound = Binding::SpiffeId("spiffe://cluster.local/ns/agents/sa/agent-1".into());
        assert_eq!(id.binding(), &bound);
        assert_eq!(istio().presented_binding(&cx).expect("binding"), bound);
    }

    #[test]
    fn untrusted_source_is_refused_before_reading_the_header() {
        let h = headers("x-forwarded-client-cert", &["not xfcc at all"]);
        for t in [from("10.1.2.3:5000"), TransportIdentity::plaintext(None)] {
            let err = istio().authenticate(&AuthContext::new(&t, &h)).expect_err("untrusted");
            assert!(matches!(err, AuthError::UntrustedHop { .. }), "{err}");
            assert!(err.to_string().contains("not a trusted hop"), "{err}");
            let err = istio().presented_binding(&AuthContext::new(&t, &h)).expect_err("untrusted");
            assert!(matches!(err, AuthError::UntrustedHop { .. }), "{err}");
        }
    }

    #[test]
    fn missing_repeated_and_bad_headers_are_explained() {
        let t = from("127.0.0.1:1");
        let err = istio().authenticate(&AuthContext::new(&t, &http::HeaderMap::new())).expect_err("none");
        assert!(matches!(err, AuthError::MissingHeader { .. }), "{err}");
        let h = headers("x-forwarded-client-cert", &[AGENT_1, AGENT_1]);
        let err = istio().authenticate(&AuthContext::new(&t, &h)).expect_err("twice");
        assert!(err.to_string().contains("appears 2 times"), "{err}");
        let h =
            headers("x-forwarded-client-cert", &["URI=spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway"]);
        let err = istio().authenticate(&AuthContext::new(&t, &h)).expect_err("gateway");
        assert!(matches!(err, AuthError::MeshIdentity { .. }), "{err}");
        assert!(err.to_string().contains("is denied"), "{err}");
    }

    #[test]
    fn linkerd_reads_l5d_client_id_and_custom_headers() {
        let linkerd = XfccAuthenticator::new(
            MeshProfile::Linkerd,
            MeshProfile::Linkerd.default_policy(),
            TrustedHops::loopback(),
        );
        assert_eq!(linkerd.header().as_str(), "l5d-client-id");
        let h = headers("l5d-client-id", &["agent-2.agents.serviceaccount.identity.linkerd.cluster.local"]);
        let t = from("[::1]:4143");
        let id = linkerd.authenticate(&AuthContext::new(&t, &h)).expect("identity");
        assert_eq!(id.name().as_str(), "agent-2");
        assert_eq!(id.binding(), &Binding::SpiffeId("spiffe://cluster.local/ns/agents/sa/agent-2".into()));

        let custom = istio().with_header(HeaderName::from_static("x-client-cert"));
        let h = headers("x-client-cert", &[AGENT_1]);
        assert_eq!(custom.authenticate(&AuthContext::new(&t, &h)).expect("identity").name().as_str(), "agent-1");
    }
}
