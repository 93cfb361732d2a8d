//! From a forwarded identity header to an agent: XFCC (Istio, Envoy) and `l5d-client-id`
//! (Linkerd), checked against a [`SpiffePolicy`].
//!
//! XFCC rule (docs/mesh/envoy.md): hops append in order, so the **last** element is the one our own
//! sidecar added, describing the peer it verified; earlier elements are history written by other hops and
//! never identity. That element must carry exactly one non-empty `URI` (an X.509-SVID has exactly
//! one URI SAN) that parses as a SPIFFE ID and passes the policy. Behind an ingress gateway that
//! URI is the gateway's, which the profiles' policies deny.

use crate::policy::{AuthorizedAgent, PolicyError, SpiffePolicy};
use crate::spiffe::{SpiffeId, SpiffeIdError, TrustDomain};
use crate::xfcc::{self, XfccElement, XfccError};

/// Why a forwarded identity header does not name an agent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The XFCC header does not parse.
    #[error(transparent)]
    Xfcc(#[from] XfccError),
    /// The last XFCC element has no `URI` key.
    #[error(
        "the last x-forwarded-client-cert element (added by our sidecar) has no URI: the sidecar must set URI details"
    )]
    NoUri,
    /// The last XFCC element has `URI=` with no value: the peer certificate has no URI SAN.
    #[error("the client certificate has no URI SAN (empty URI= in the last x-forwarded-client-cert element)")]
    EmptyUri,
    /// The last XFCC element has several `URI` keys: not an X.509-SVID.
    #[error("the client certificate has {count} URI SANs; an X.509-SVID has exactly one")]
    MultipleUris {
        /// How many `URI` keys the element has.
        count: usize,
    },
    /// The URI is not a SPIFFE ID.
    #[error("the client URI SAN {uri:?} is not a SPIFFE ID: {source}")]
    NotSpiffe {
        /// The URI.
        uri: String,
        /// Why it is not a SPIFFE ID.
        #[source]
        source: SpiffeIdError,
    },
    /// The `l5d-client-id` value is not a Linkerd identity name.
    #[error(
        "l5d-client-id {value:?} is not <sa>.<ns>.serviceaccount.identity.<control-plane-ns>.<trust-domain>: {reason}"
    )]
    BadLinkerdId {
        /// The header value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The SPIFFE ID is not an agent under the policy.
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// The agent an XFCC header identifies: the last element's single URI SAN, as a SPIFFE ID,
/// authorized by `policy`. The header must come from a trusted hop (see [`crate::trust`]).
///
/// # Errors
///
/// [`IdentityError`]: the header does not parse, the last element has no, an empty or several
/// URIs, the URI is not a SPIFFE ID, or the policy rejects it.
pub fn identity_from_xfcc(header: &str, policy: &SpiffePolicy) -> Result<AuthorizedAgent, IdentityError> {
    let elements = xfcc::parse(header)?;
    // parse() never returns an empty list; an empty header is XfccError::EmptyHeader.
    let last = elements.last().ok_or(XfccError::EmptyHeader)?;
    identity_from_element(last, policy)
}

/// The agent one XFCC element identifies (callers with their own [`xfcc::XfccParser`] pass the
/// last element here).
///
/// # Errors
///
/// As [`identity_from_xfcc`], without the parse errors.
pub fn identity_from_element(element: &XfccElement, policy: &SpiffePolicy) -> Result<AuthorizedAgent, IdentityError> {
    let uri = match element.uris.as_slice() {
        [] => return Err(IdentityError::NoUri),
        [uri] if uri.is_empty() => return Err(IdentityError::EmptyUri),
        [uri] => uri,
        many => return Err(IdentityError::MultipleUris { count: many.len() }),
    };
    let id = SpiffeId::parse(uri).map_err(|source| IdentityError::NotSpiffe { uri: uri.clone(), source })?;
    Ok(policy.authorize(&id)?)
}

/// Maps Linkerd's `l5d-client-id` (`<sa>.<ns>.serviceaccount.identity.<cp-ns>.<trust-domain>`,
/// set by the Linkerd proxy from the verified TLS identity) to the SPIFFE ID of the same
/// workload under the Kubernetes convention, `spiffe://<trust-domain>/ns/<ns>/sa/<sa>`, so one
/// policy serves every mesh.
///
/// # Errors
///
/// [`IdentityError::BadLinkerdId`] if the value does not have that shape or its parts are not
/// valid SPIFFE trust domain and path segments.
pub fn spiffe_id_from_linkerd(value: &str) -> Result<SpiffeId, IdentityError> {
    let bad = |reason: String| IdentityError::BadLinkerdId { value: value.to_owned(), reason };
    let mut labels = value.splitn(6, '.');
    let mut next = || labels.next().unwrap_or_default();
    let (sa, ns, kind, identity, _control_plane_ns, trust_domain) = (next(), next(), next(), next(), next(), next());
    if kind != "serviceaccount" || identity != "identity" {
        return Err(bad("the third and fourth labels must be \"serviceaccount.identity\"".to_owned()));
    }
    let trust_domain = TrustDomain::new(trust_domain).map_err(|e| bad(e.to_string()))?;
    SpiffeId::from_segments(&trust_domain, ["ns", ns, "sa", sa]).map_err(|e| bad(e.to_string()))
}

/// The agent a Linkerd `l5d-client-id` header identifies, via [`spiffe_id_from_linkerd`].
///
/// # Errors
///
/// [`IdentityError::BadLinkerdId`] or [`IdentityError::Policy`].
pub fn identity_from_linkerd(value: &str, policy: &SpiffePolicy) -> Result<AuthorizedAgent, IdentityError> {
    Ok(policy.authorize(&spiffe_id_from_linkerd(value)?)?)
}
