//! `--auth spiffe:jwt`: the agent is the subject of a JWT-SVID it fetched from its own SPIFFE
//! Workload API for the principal's audience.
//!
//! On `Authenticate` the agent sends the JWT-SVID in `AuthRequest.credentials["token"]` (or in
//! the `x-spiffe-jwt-svid` metadata). The principal verifies it against the JWT bundles its own
//! Workload API streams (kept in memory by [`JwtIdentity`], so no I/O on the request path):
//! signature by a key of the subject's trust domain bundle, `exp`/`nbf` without leeway, and the
//! configured audience. The subject's SPIFFE ID then goes through the [`SpiffePolicy`].
//!
//! # Binding
//!
//! Sessions bind to the SPIFFE ID ([`Binding::SpiffeId`]). Every later call must present the same
//! ID again, either
//! - a currently valid JWT-SVID with that subject in the `x-spiffe-jwt-svid` metadata (verified
//!   in full on each call; JWT-SVIDs are short-lived, so the agent sends a fresh one from its
//!   Workload API, which is why the binding is to the subject and not to one token), or
//! - when no such metadata is sent, over mTLS, a verified client X.509-SVID with that ID (serve
//!   with [`mesh::workload::X509Identity::server_config`]).
//!
//! A session token replayed without either is refused.

use http::HeaderName;
use mesh::workload::JwtIdentity;
use mesh::{AuthorizedAgent, SpiffePolicy};

use super::spiffe_x509::{agent_name, peer_id};
use super::{AuthContext, Authenticator};
use crate::error::AuthError;
use crate::identity::{AgentIdentity, Binding};

/// The `spiffe:jwt` method.
#[derive(Clone, Debug)]
pub struct SpiffeJwtAuthenticator {
    policy: SpiffePolicy,
    audience: String,
    jwt: Option<JwtIdentity>,
}

impl SpiffeJwtAuthenticator {
    /// The method name agents send in `AuthRequest.method`.
    pub const METHOD: &'static str = "spiffe-jwt";
    /// The `AuthRequest.credentials` key holding the JWT-SVID.
    pub const CREDENTIAL: &'static str = "token";
    /// The metadata key holding the JWT-SVID on calls after `Authenticate`.
    pub const HEADER: &'static str = "x-spiffe-jwt-svid";
    /// The audience expected unless configured.
    pub const DEFAULT_AUDIENCE: &'static str = "argocd-agent-principal";

    /// Verifies JWT-SVIDs for `audience` against `jwt`'s bundles and authorizes their subject
    /// with `policy`.
    #[must_use]
    pub fn new(policy: SpiffePolicy, audience: impl Into<String>, jwt: JwtIdentity) -> Self {
        Self { policy, audience: audience.into(), jwt: Some(jwt) }
    }

    /// The method without a Workload API connection: every call is refused with
    /// [`AuthError::WorkloadApiUnavailable`] (what [`super::spec::AuthMethodSpec::authenticator`]
    /// returns; use `connect_authenticator`).
    #[must_use]
    pub fn unconnected(policy: SpiffePolicy, audience: impl Into<String>) -> Self {
        Self { policy, audience: audience.into(), jwt: None }
    }

    /// The audience JWT-SVIDs must carry.
    #[must_use]
    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// The policy deciding which SPIFFE IDs are agents.
    #[must_use]
    pub fn policy(&self) -> &SpiffePolicy {
        &self.policy
    }

    fn missing(&self) -> AuthError {
        AuthError::MissingJwtSvid {
            method: Self::METHOD,
            audience: self.audience.clone(),
            credential: Self::CREDENTIAL,
            header: Self::HEADER,
        }
    }

    /// The JWT-SVID in the metadata, if any.
    fn header_token<'a>(&self, cx: &AuthContext<'a>) -> Result<Option<&'a str>, AuthError> {
        let name = HeaderName::from_static(Self::HEADER);
        let mut values = cx.metadata.get_all(&name).iter();
        let Some(value) = values.next() else { return Ok(None) };
        if values.next().is_some() {
            return Err(AuthError::BadHeader {
                header: Self::HEADER.to_owned(),
                reason: "it appears more than once".into(),
            });
        }
        value.to_str().map(|v| Some(v.trim())).map_err(|_| AuthError::BadHeader {
            header: Self::HEADER.to_owned(),
            reason: "it is not visible ASCII".into(),
        })
    }

    fn verify(&self, token: &str) -> Result<AuthorizedAgent, AuthError> {
        let jwt = self.jwt.as_ref().ok_or(AuthError::WorkloadApiUnavailable { method: Self::METHOD })?;
        let token = token.strip_prefix("Bearer ").unwrap_or(token).trim();
        if token.is_empty() {
            return Err(self.missing());
        }
        let verified = jwt
            .validate(token, &self.audience)
            .map_err(|source| AuthError::JwtSvidRejected { method: Self::METHOD, source })?;
        self.policy
            .authorize(verified.spiffe_id())
            .map_err(|source| AuthError::SpiffePolicy { method: Self::METHOD, source })
    }
}

impl Authenticator for SpiffeJwtAuthenticator {
    fn method(&self) -> &'static str {
        Self::METHOD
    }

    fn authenticate(&self, cx: &AuthContext<'_>) -> Result<AgentIdentity, AuthError> {
        let token = match cx.credentials.and_then(|c| c.get(Self::CREDENTIAL)) {
            Some(token) => token.as_str(),
            None => self.header_token(cx)?.ok_or_else(|| self.missing())?,
        };
        let agent = self.verify(token)?;
        Ok(AgentIdentity::new(agent_name(&agent)?, Self::METHOD, Binding::SpiffeId(agent.spiffe_id().to_string())))
    }

    /// The subject of the JWT-SVID in the metadata (verified in full), or else the SPIFFE ID of
    /// the verified client X.509-SVID; the policy is checked again either way.
    fn presented_binding(&self, cx: &AuthContext<'_>) -> Result<Binding, AuthError> {
        let agent = match self.header_token(cx)? {
            Some(token) => self.verify(token)?,
            None if cx.transport.peer_certificates().is_some() => {
                let id = peer_id(Self::METHOD, cx)?;
                self.policy.authorize(&id).map_err(|source| AuthError::SpiffePolicy { method: Self::METHOD, source })?
            }
            None => return Err(self.missing()),
        };
        Ok(Binding::SpiffeId(agent.spiffe_id().to_string()))
    }
}
