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
//!
//! **Login-only binding** ([`JwtSessionBinding::LoginOnly`], an explicit opt-in): upstream
//! v0.10's agents send the JWT-SVID only on `Authenticate` and then only the session token (no
//! JWT-SVID metadata, no client certificate). With this binding a call that presents neither is
//! accepted on its session token alone, as upstream's principal does; a call that does present a
//! JWT-SVID or a client SVID must still present the bound SPIFFE ID. What it gives up: a stolen
//! session token is usable from anywhere until it expires (the access token's lifetime, the
//! refresh token's for refreshes), instead of being useless without the workload's SVID.
//!
//! # Agents by regex (upstream's `spiffe-jwt:<regex>`)
//!
//! Besides a [`SpiffePolicy`] the agents may be given as upstream does: a regex over the whole
//! SPIFFE ID whose capture group 1 is the agent name ([`JwtSubjects::Regex`]); any trust domain
//! whose JWT bundle the Workload API gives is then accepted, as upstream.

use http::HeaderName;
use mesh::workload::JwtIdentity;
use mesh::{SpiffeId, SpiffePolicy};
use regex::Regex;

use super::spiffe_x509::{agent_name, peer_id};
use super::{AuthContext, Authenticator};
use crate::error::AuthError;
use crate::identity::{AgentIdentity, AgentName, Binding};

/// Which JWT-SVID subjects are agents, and their names.
#[derive(Clone, Debug)]
pub enum JwtSubjects {
    /// `spiffe:jwt`: trust domains, path patterns and namespaces.
    Policy(SpiffePolicy),
    /// Upstream's `spiffe-jwt:<regex>`: capture group 1 of a regex over the whole SPIFFE ID.
    Regex(Regex),
}

/// What later calls of a `spiffe:jwt` session must present besides the session token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JwtSessionBinding {
    /// The bound SPIFFE ID on every call (a fresh JWT-SVID or the client X.509-SVID): ours.
    #[default]
    EveryCall,
    /// Upstream's: the JWT-SVID at `Authenticate` only; a later call presenting no SVID passes on
    /// its session token alone (an explicit opt-in; see the module documentation).
    LoginOnly,
}

/// The `spiffe:jwt` method.
#[derive(Clone, Debug)]
pub struct SpiffeJwtAuthenticator {
    subjects: JwtSubjects,
    audience: String,
    jwt: Option<JwtIdentity>,
    binding: JwtSessionBinding,
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
        Self::with_subjects(JwtSubjects::Policy(policy), audience, Some(jwt))
    }

    /// Verifies JWT-SVIDs for `audience` against `jwt`'s bundles (`None`: every call refused)
    /// and names agents by `subjects`; sessions bound on every call.
    #[must_use]
    pub fn with_subjects(subjects: JwtSubjects, audience: impl Into<String>, jwt: Option<JwtIdentity>) -> Self {
        Self { subjects, audience: audience.into(), jwt, binding: JwtSessionBinding::EveryCall }
    }

    /// Sets what later calls must present ([`JwtSessionBinding`]).
    #[must_use]
    pub fn with_binding(mut self, binding: JwtSessionBinding) -> Self {
        self.binding = binding;
        self
    }

    /// What later calls must present.
    #[must_use]
    pub fn binding(&self) -> JwtSessionBinding {
        self.binding
    }

    /// The method without a Workload API connection: every call is refused with
    /// [`AuthError::WorkloadApiUnavailable`] (what [`super::spec::AuthMethodSpec::authenticator`]
    /// returns; use `connect_authenticator`).
    #[must_use]
    pub fn unconnected(policy: SpiffePolicy, audience: impl Into<String>) -> Self {
        Self::with_subjects(JwtSubjects::Policy(policy), audience, None)
    }

    /// The audience JWT-SVIDs must carry.
    #[must_use]
    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// Which SPIFFE IDs are agents.
    #[must_use]
    pub fn subjects(&self) -> &JwtSubjects {
        &self.subjects
    }

    /// The agent a verified SPIFFE ID names, by [`JwtSubjects`].
    fn name_agent(&self, id: &SpiffeId) -> Result<AgentName, AuthError> {
        match &self.subjects {
            JwtSubjects::Policy(policy) => {
                let agent =
                    policy.authorize(id).map_err(|source| AuthError::SpiffePolicy { method: Self::METHOD, source })?;
                agent_name(&agent)
            }
            JwtSubjects::Regex(regex) => {
                let subject = id.to_string();
                let mismatch = || AuthError::JwtSubjectMismatch { subject: subject.clone(), regex: regex.to_string() };
                let captures = regex.captures(&subject).ok_or_else(mismatch)?;
                let name = captures.get(1).map(|m| m.as_str()).filter(|n| !n.is_empty()).ok_or_else(|| {
                    AuthError::EmptyAgentName { field: "SPIFFE ID", value: subject.clone(), regex: regex.to_string() }
                })?;
                AgentName::new(name).map_err(|reason| AuthError::InvalidAgentName { field: "SPIFFE ID", reason })
            }
        }
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

    /// The verified subject of `token` and the agent it names.
    fn verify(&self, token: &str) -> Result<(SpiffeId, AgentName), AuthError> {
        let jwt = self.jwt.as_ref().ok_or(AuthError::WorkloadApiUnavailable { method: Self::METHOD })?;
        let token = token.strip_prefix("Bearer ").unwrap_or(token).trim();
        if token.is_empty() {
            return Err(self.missing());
        }
        let verified = jwt
            .validate(token, &self.audience)
            .map_err(|source| AuthError::JwtSvidRejected { method: Self::METHOD, source })?;
        let name = self.name_agent(verified.spiffe_id())?;
        Ok((verified.spiffe_id().clone(), name))
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
        let (id, name) = self.verify(token)?;
        Ok(AgentIdentity::new(name, Self::METHOD, Binding::SpiffeId(id.to_string())))
    }

    /// The subject of the JWT-SVID in the metadata (verified in full), or else the SPIFFE ID of
    /// the verified client X.509-SVID; the agent rule is checked again either way.
    fn presented_binding(&self, cx: &AuthContext<'_>) -> Result<Binding, AuthError> {
        let id = match self.header_token(cx)? {
            Some(token) => self.verify(token)?.0,
            None if cx.transport.peer_certificates().is_some() => {
                let id = peer_id(Self::METHOD, cx)?;
                self.name_agent(&id)?;
                id
            }
            None => return Err(self.missing()),
        };
        Ok(Binding::SpiffeId(id.to_string()))
    }

    /// With [`JwtSessionBinding::LoginOnly`], a call presenting neither a JWT-SVID nor a client
    /// certificate.
    fn accepts_token_alone(&self, cx: &AuthContext<'_>) -> bool {
        self.binding == JwtSessionBinding::LoginOnly
            && cx.metadata.get(Self::HEADER).is_none()
            && cx.transport.peer_certificates().is_none()
    }
}
