//! The principal's session authority: runs the configured methods on `Authenticate`, issues bound
//! tokens, and on every other call verifies the token and that the call presents the transport
//! identity the token was issued for. Shared by [`crate::AuthLayer`] and [`crate::AuthService`].

use std::sync::Arc;

use super::issuer::SessionIssuer;
use super::token::{IssuedTokens, RefreshedTokens, TokenKind};
use crate::admission::{SigningAdmission, SigningLimits};
use crate::error::AuthError;
use crate::identity::{AgentIdentity, AgentMode, AgentSession};
use crate::method::{AuthContext, AuthMethods};

/// Authentication and session verification for one principal. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Sessions {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    issuer: SessionIssuer,
    methods: AuthMethods,
    reserved_name: Option<String>,
    signing: SigningAdmission,
}

impl Sessions {
    /// Sessions issued and verified by `issuer`, authenticated by `methods`.
    #[must_use]
    pub fn new(issuer: SessionIssuer, methods: AuthMethods) -> Self {
        Self { inner: Arc::new(Inner { issuer, methods, reserved_name: None, signing: SigningAdmission::default() }) }
    }

    /// Refuses agents named like the principal's namespace (upstream refuses them on every call
    /// after issuing tokens; here `Authenticate` refuses them too).
    #[must_use]
    pub fn with_principal_namespace(self, namespace: impl Into<String>) -> Self {
        let inner = Inner {
            issuer: self.inner.issuer.clone(),
            methods: self.inner.methods.clone(),
            reserved_name: Some(namespace.into()).filter(|n| !n.is_empty()),
            signing: self.inner.signing.clone(),
        };
        Self { inner: Arc::new(inner) }
    }

    /// Bounds how many `Authenticate` calls sign tokens at once and how many wait; the rest are
    /// refused with `RESOURCE_EXHAUSTED` and a retry hint (see [`crate::admission`]). The
    /// default: one per core, [`crate::admission::DEFAULT_SIGNING_QUEUE`] waiting.
    #[must_use]
    pub fn with_signing_limits(self, limits: SigningLimits) -> Self {
        let inner = Inner {
            issuer: self.inner.issuer.clone(),
            methods: self.inner.methods.clone(),
            reserved_name: self.inner.reserved_name.clone(),
            signing: SigningAdmission::new(limits),
        };
        Self { inner: Arc::new(inner) }
    }

    /// The gate on token signing.
    #[must_use]
    pub fn signing(&self) -> &SigningAdmission {
        &self.inner.signing
    }

    /// The token issuer.
    #[must_use]
    pub fn issuer(&self) -> &SessionIssuer {
        &self.inner.issuer
    }

    /// The accepted methods.
    #[must_use]
    pub fn methods(&self) -> &AuthMethods {
        &self.inner.methods
    }

    /// Runs method `method` (`AuthRequest.method`) on the call.
    ///
    /// # Errors
    ///
    /// [`AuthError::UnknownMethod`], the method's own errors, or
    /// [`AuthError::ReservedAgentName`].
    pub fn authenticate(&self, method: &str, cx: &AuthContext<'_>) -> Result<AgentIdentity, AuthError> {
        let identity = self.inner.methods.require(method)?.authenticate(cx)?;
        self.check_name(identity.name().as_str())?;
        Ok(identity)
    }

    /// Issues access and refresh tokens for an authenticated agent.
    ///
    /// # Errors
    ///
    /// [`AuthError::TokenIssue`] if signing fails.
    pub fn issue(&self, identity: &AgentIdentity, mode: AgentMode) -> Result<IssuedTokens, AuthError> {
        self.inner.issuer.issue(identity, mode)
    }

    /// Verifies the access token of a protected call, and that the call presents the transport
    /// identity the token is bound to.
    ///
    /// # Errors
    ///
    /// The [`AuthError`] of the first check that fails.
    pub fn verify_access(&self, token: &str, cx: &AuthContext<'_>) -> Result<AgentSession, AuthError> {
        let verified = self.inner.issuer.verify(token, TokenKind::Access)?;
        let identity = self.check_binding(&verified, cx)?;
        let (Some(mode), Some(expires_at)) = (verified.mode, verified.expires_at) else {
            return Err(AuthError::TokenWithoutExpiry { kind: TokenKind::Access });
        };
        Ok(AgentSession { identity, mode, token_id: verified.claims.jti, expires_at })
    }

    /// Exchanges a refresh token presented on this call for new tokens (`RefreshToken`), after
    /// checking the call presents the identity the refresh token is bound to: a stolen refresh
    /// token is useless without the agent's private key.
    ///
    /// # Errors
    ///
    /// The [`AuthError`] of the first check that fails.
    pub fn refresh(&self, refresh_token: &str, cx: &AuthContext<'_>) -> Result<RefreshedTokens, AuthError> {
        self.sign_refresh(&self.verify_refresh(refresh_token, cx)?)
    }

    /// The first half of [`Self::refresh`]: checks the refresh token and that this call
    /// presents the identity it is bound to, and signs nothing. The service signs with
    /// [`Self::sign_refresh`] through the signing gate, so a refresh storm queues like a login
    /// storm (see [`crate::admission`]).
    ///
    /// # Errors
    ///
    /// As [`Self::refresh`].
    pub fn verify_refresh(&self, refresh_token: &str, cx: &AuthContext<'_>) -> Result<VerifiedRefresh, AuthError> {
        let token = self.inner.issuer.verify(refresh_token, TokenKind::Refresh)?;
        let identity = self.check_binding(&token, cx)?;
        Ok(VerifiedRefresh { token, identity })
    }

    /// The second half of [`Self::refresh`]: signs the new tokens for a verified refresh token.
    ///
    /// # Errors
    ///
    /// [`AuthError`] if signing fails.
    pub fn sign_refresh(&self, verified: &VerifiedRefresh) -> Result<RefreshedTokens, AuthError> {
        self.inner.issuer.refresh(&verified.token)
    }

    fn check_name(&self, name: &str) -> Result<(), AuthError> {
        if self.inner.reserved_name.as_deref() == Some(name) {
            return Err(AuthError::ReservedAgentName { name: name.to_owned() });
        }
        Ok(())
    }

    fn check_binding(
        &self,
        verified: &super::issuer::VerifiedToken,
        cx: &AuthContext<'_>,
    ) -> Result<AgentIdentity, AuthError> {
        let kind = verified.kind;
        let Some(bound) = verified.binding.clone() else {
            return Err(AuthError::TokenUnbound { kind });
        };
        let Some(method_name) = verified.method.as_deref() else {
            return Err(AuthError::TokenUnbound { kind });
        };
        let Some(method) = self.inner.methods.get(method_name) else {
            return Err(AuthError::TokenMethod { kind, method: method_name.to_owned() });
        };
        self.check_name(verified.agent.as_str())?;
        // A method's login-only opt-in: a call presenting no transport identity is bound by its
        // token alone (one that presents an identity must still present the bound one).
        let presented = if method.accepts_token_alone(cx) {
            bound.clone()
        } else {
            method.presented_binding(cx).map_err(|reason| AuthError::BindingAbsent {
                kind,
                bound: bound.clone(),
                reason: Box::new(reason),
            })?
        };
        if presented != bound {
            return Err(AuthError::BindingMismatch { kind, bound, presented });
        }
        Ok(AgentIdentity::new(verified.agent.clone(), method.method(), bound))
    }
}

/// A refresh token that passed every check of [`Sessions::verify_refresh`], not yet
/// exchanged for new tokens.
#[derive(Debug, Clone)]
pub struct VerifiedRefresh {
    token: super::issuer::VerifiedToken,
    identity: AgentIdentity,
}

impl VerifiedRefresh {
    /// The identity the refresh token is bound to (and this call presented).
    #[must_use]
    pub fn identity(&self) -> &AgentIdentity {
        &self.identity
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use regex::Regex;
    use rustls_pki_types::CertificateDer;

    use super::*;
    use crate::identity::{Binding, TransportIdentity};
    use crate::method::mtls::{IdentitySource, MtlsAuthenticator};
    use crate::session::SigningKey;

    const KEY_A: &str = include_str!("../../tests/fixtures/jwt-key-a.pem");

    fn sessions() -> Sessions {
        let method = MtlsAuthenticator::new(IdentitySource::Subject, Regex::new("CN=([^,]+)").expect("regex"));
        Sessions::new(
            SessionIssuer::new(SigningKey::from_pem(KEY_A).expect("key")),
            AuthMethods::single(Arc::new(method)),
        )
        .with_principal_namespace("argocd")
    }

    fn transport(cn: &str) -> TransportIdentity {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().expect("key");
        let der = params.self_signed(&key).expect("cert").der().to_vec();
        TransportIdentity::tls(None, Some(Arc::new(vec![CertificateDer::from(der)])))
    }

    #[test]
    fn tokens_are_valid_only_on_the_connection_identity_they_were_issued_for() {
        let s = sessions();
        let headers = http::HeaderMap::new();
        let one = transport("agent-1");
        let cx = AuthContext::new(&one, &headers);
        let identity = s.authenticate("mtls", &cx).expect("authenticate");
        let tokens = s.issue(&identity, AgentMode::Managed).expect("issue");

        let session = s.verify_access(&tokens.access_token, &cx).expect("same connection");
        assert_eq!(session.identity, identity);
        assert_eq!(session.mode, AgentMode::Managed);

        // Another certificate, even one with the same name, is another identity.
        let other = transport("agent-1");
        let err = s.verify_access(&tokens.access_token, &AuthContext::new(&other, &headers)).expect_err("other cert");
        assert!(matches!(err, AuthError::BindingMismatch { .. }), "{err}");
        assert!(err.to_string().contains(&identity.binding().fingerprint().unwrap_or_default()), "{err}");
        let err = s.refresh(&tokens.refresh_token, &AuthContext::new(&other, &headers)).expect_err("refresh elsewhere");
        assert!(matches!(err, AuthError::BindingMismatch { .. }), "{err}");

        let none = TransportIdentity::tls(None, None);
        let err = s.verify_access(&tokens.access_token, &AuthContext::new(&none, &headers)).expect_err("no cert");
        assert!(matches!(err, AuthError::BindingAbsent { .. }), "{err}");
        assert!(err.to_string().contains("no client certificate"), "{err}");

        let refreshed = s.refresh(&tokens.refresh_token, &cx).expect("refresh");
        assert!(s.verify_access(&refreshed.access_token, &cx).is_ok());
    }

    #[test]
    fn unbound_tokens_and_reserved_names_are_refused() {
        let s = sessions();
        let headers = http::HeaderMap::new();
        let t = transport("argocd");
        let err = s.authenticate("mtls", &AuthContext::new(&t, &headers)).expect_err("reserved");
        assert!(matches!(err, AuthError::ReservedAgentName { .. }), "{err}");
        let err = s.authenticate("userpass", &AuthContext::new(&t, &headers)).expect_err("unknown");
        assert!(err.to_string().contains("\"mtls\""), "{err}");

        // A resource-proxy token is neither an access token nor bound.
        let agent = crate::AgentName::new("agent-1").expect("name");
        let proxy = s.issuer().issue_resource_proxy_token(&agent).expect("issue");
        assert!(s.verify_access(&proxy, &AuthContext::new(&t, &headers)).is_err());

        // A token bound to a SPIFFE ID by a method this principal does not run.
        let spiffe = AgentIdentity::new(agent, "xfcc", Binding::SpiffeId("spiffe://td/ns/a/sa/agent-1".into()));
        let tokens = s.issue(&spiffe, AgentMode::Managed).expect("issue");
        let err = s.verify_access(&tokens.access_token, &AuthContext::new(&t, &headers)).expect_err("method");
        assert!(matches!(err, AuthError::TokenMethod { .. }), "{err}");
    }
}
