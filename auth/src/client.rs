//! The agent's side: [`Credentials`] holds the session tokens, authenticates and refreshes them,
//! and hands out a tonic interceptor that puts the access token on every call.
//!
//! The token goes into `authorization` as the raw JWT, without `Bearer `, because that is what
//! upstream's principal expects (`principal/auth.go` validates the value as is); ours accepts both.
//!
//! Refresh: upstream refreshes synchronously in its interceptor when the access token expires
//! within 30 s. tonic interceptors are synchronous, so here the agent either calls
//! [`Credentials::refresh_if_due`] before opening a stream, or runs [`Credentials::keep_fresh`]
//! beside its connection; when that returns, the session is over and the agent authenticates
//! again on a new connection.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protocol::pb::authapi::authentication_client::AuthenticationClient;
use protocol::pb::authapi::{AuthRequest, RefreshTokenRequest};
use serde::Deserialize;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::identity::AgentMode;
use crate::layer::AUTHORIZATION;
use crate::session::token::AgentSubject;

/// Refresh the access token when it expires within this (upstream `remote.go`).
pub const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(30);

/// First pause after a failed refresh that may succeed on retry.
const RETRY_INITIAL: Duration = Duration::from_secs(1);

/// Longest pause between refresh retries.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// What the agent sends in `AuthRequest`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthParams {
    /// The method (`mtls`, …); must be one the principal accepts.
    pub method: String,
    /// Method-specific credentials (empty for `mtls`: the certificate is the credential).
    pub credentials: HashMap<String, String>,
    /// The agent's mode.
    pub mode: AgentMode,
    /// The agent's version string (upstream principals require an exact match).
    pub version: String,
    /// The namespace the agent runs in.
    pub agent_namespace: String,
}

/// What the principal said about itself on `Authenticate`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrincipalInfo {
    /// The principal's version.
    pub version: String,
    /// The principal's namespace.
    pub namespace: String,
    /// The agent name the principal authenticated us as (from the token subject).
    pub agent_name: String,
}

/// Why authentication or a refresh failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The principal refused the call.
    #[error("{call} refused by the principal: {} ({:?})", status.message(), status.code())]
    Refused {
        /// `Authenticate` or `RefreshToken`.
        call: &'static str,
        /// The principal's answer.
        status: Status,
    },
    /// A token from the principal could not be read.
    #[error("the principal sent an unreadable {which} token: {reason}")]
    BadToken {
        /// `access` or `refresh`.
        which: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// There are no tokens to refresh or send.
    #[error("not authenticated: call Authenticate first")]
    NotAuthenticated,
}

impl ClientError {
    /// Whether the session is over and the agent must authenticate again: the principal
    /// refused the refresh token, or there are no tokens.
    #[must_use]
    pub fn needs_reauthentication(&self) -> bool {
        match self {
            Self::Refused { status, .. } => {
                matches!(status.code(), Code::Unauthenticated | Code::PermissionDenied | Code::InvalidArgument)
            }
            Self::BadToken { .. } | Self::NotAuthenticated => true,
        }
    }

    /// The principal's retry hint: it refused the call with `RESOURCE_EXHAUSTED` (a login
    /// storm: its signing queue is full) and asked to be called again after this long
    /// ([`crate::admission::RETRY_PUSHBACK_MS`]). Callers wait this (with jitter) instead of
    /// their own backoff.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Refused { status, .. } if status.code() == Code::ResourceExhausted => {
                crate::admission::retry_hint(status)
            }
            _ => None,
        }
    }
}

/// A token and the expiry read from it.
#[derive(Clone)]
struct Token {
    value: AsciiMetadataValue,
    expires_at: Option<SystemTime>,
}

#[derive(Clone)]
struct Tokens {
    access: Token,
    refresh: Token,
}

/// Adds metadata to the agent's `Authenticate` and `RefreshToken` calls (e.g. a fresh JWT-SVID
/// in `x-spiffe-jwt-svid`, which `spiffe:jwt` sessions present on every call).
pub type CallMetadata = Arc<dyn Fn(&mut tonic::metadata::MetadataMap) + Send + Sync>;

/// The agent's session tokens, shared by the interceptors of all its clients. Cheap to clone.
#[derive(Clone, Default)]
pub struct Credentials {
    tokens: Arc<RwLock<Option<Tokens>>>,
    call_metadata: Option<CallMetadata>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tokens = self.read();
        f.debug_struct("Credentials")
            .field("authenticated", &tokens.is_some())
            .field("access_expires_at", &tokens.as_ref().and_then(|t| t.access.expires_at))
            .field("refresh_expires_at", &tokens.as_ref().and_then(|t| t.refresh.expires_at))
            .finish()
    }
}

impl Credentials {
    /// No tokens yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `metadata` to every `Authenticate` and `RefreshToken` call these credentials make.
    #[must_use]
    pub fn with_call_metadata(mut self, metadata: CallMetadata) -> Self {
        self.call_metadata = Some(metadata);
        self
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(add) = &self.call_metadata {
            add(request.metadata_mut());
        }
        request
    }

    /// Calls `Authenticate` and keeps the tokens.
    ///
    /// # Errors
    ///
    /// [`ClientError::Refused`] with the principal's status (e.g. `Unauthenticated` naming what
    /// is wrong with the client certificate, `FailedPrecondition` for a version mismatch), or
    /// [`ClientError::BadToken`].
    pub async fn authenticate(
        &self,
        client: &mut AuthenticationClient<Channel>,
        params: &AuthParams,
    ) -> Result<PrincipalInfo, ClientError> {
        let request = AuthRequest {
            method: params.method.clone(),
            credentials: params.credentials.clone(),
            mode: params.mode.as_str().to_owned(),
            version: params.version.clone(),
            agent_namespace: params.agent_namespace.clone(),
        };
        let response = client
            .authenticate(self.request(request))
            .await
            .map_err(|status| ClientError::Refused { call: "Authenticate", status })?
            .into_inner();
        let access = parse_token(&response.access_token, "access")?;
        let refresh = parse_token(&response.refresh_token, "refresh")?;
        let agent_name = agent_name(&response.access_token).unwrap_or_default();
        *self.write() = Some(Tokens { access, refresh });
        Ok(PrincipalInfo { version: response.version, namespace: response.principal_namespace, agent_name })
    }

    /// Calls `RefreshToken`: a new access token, and a new refresh token when the principal
    /// renews it (an empty one in the answer keeps the current one).
    ///
    /// # Errors
    ///
    /// [`ClientError::NotAuthenticated`] without tokens, [`ClientError::Refused`] with the
    /// principal's status, or [`ClientError::BadToken`].
    pub async fn refresh(&self, client: &mut AuthenticationClient<Channel>) -> Result<(), ClientError> {
        let refresh_token = {
            let tokens = self.read();
            let tokens = tokens.as_ref().ok_or(ClientError::NotAuthenticated)?;
            tokens
                .refresh
                .value
                .to_str()
                .map(str::to_owned)
                .map_err(|e| ClientError::BadToken { which: "refresh", reason: e.to_string() })?
        };
        let response = client
            .refresh_token(self.request(RefreshTokenRequest { refresh_token }))
            .await
            .map_err(|status| ClientError::Refused { call: "RefreshToken", status })?
            .into_inner();
        let access = parse_token(&response.access_token, "access")?;
        let refresh = if response.refresh_token.is_empty() {
            None
        } else {
            Some(parse_token(&response.refresh_token, "refresh")?)
        };
        let mut tokens = self.write();
        let current = tokens.as_mut().ok_or(ClientError::NotAuthenticated)?;
        current.access = access;
        if let Some(refresh) = refresh {
            current.refresh = refresh;
        }
        Ok(())
    }

    /// Refreshes when the access token expires within [`REFRESH_BEFORE_EXPIRY`]; returns whether
    /// it did.
    ///
    /// # Errors
    ///
    /// As [`Credentials::refresh`].
    pub async fn refresh_if_due(&self, client: &mut AuthenticationClient<Channel>) -> Result<bool, ClientError> {
        match self.refresh_due_at() {
            None => Err(ClientError::NotAuthenticated),
            Some(due) if due <= SystemTime::now() => self.refresh(client).await.map(|()| true),
            Some(_) => Ok(false),
        }
    }

    /// Keeps the access token fresh until the session ends: sleeps until it is due, refreshes,
    /// retries transient failures with backoff (1 s doubling to 30 s), and returns the error
    /// that ends the session (see [`ClientError::needs_reauthentication`]).
    pub async fn keep_fresh(&self, client: &mut AuthenticationClient<Channel>) -> ClientError {
        let mut retry = RETRY_INITIAL;
        loop {
            let Some(due) = self.refresh_due_at() else {
                return ClientError::NotAuthenticated;
            };
            if let Ok(wait) = due.duration_since(SystemTime::now()) {
                tokio::time::sleep(wait).await;
            }
            match self.refresh(client).await {
                Ok(()) => retry = RETRY_INITIAL,
                Err(error) if error.needs_reauthentication() => return error,
                Err(error) => match error.retry_after() {
                    // The principal's signing queue is full: back when it says, not sooner.
                    Some(hint) => {
                        let wait = crate::admission::hinted_random(hint);
                        tracing::info!(%error, ?wait, "token refresh deferred by the principal, retrying");
                        tokio::time::sleep(wait).await;
                    }
                    None => {
                        tracing::warn!(%error, ?retry, "token refresh failed, retrying");
                        tokio::time::sleep(retry).await;
                        retry = (retry * 2).min(RETRY_MAX);
                    }
                },
            }
        }
    }

    /// When the access token should be refreshed (`None` without tokens). A token without
    /// expiry is due in a day.
    #[must_use]
    pub fn refresh_due_at(&self) -> Option<SystemTime> {
        let tokens = self.read();
        let access = &tokens.as_ref()?.access;
        let expires_at = access.expires_at.unwrap_or_else(|| SystemTime::now() + Duration::from_secs(24 * 3600));
        Some(expires_at.checked_sub(REFRESH_BEFORE_EXPIRY).unwrap_or(UNIX_EPOCH))
    }

    /// The current access token.
    #[must_use]
    pub fn access_token(&self) -> Option<String> {
        self.read().as_ref().and_then(|t| t.access.value.to_str().ok().map(str::to_owned))
    }

    /// Forgets the tokens (e.g. before authenticating on a new connection).
    pub fn clear(&self) {
        *self.write() = None;
    }

    /// An interceptor adding the access token to every call of a client built with it.
    #[must_use]
    pub fn interceptor(&self) -> AccessTokenInterceptor {
        AccessTokenInterceptor { credentials: self.clone() }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Option<Tokens>> {
        self.tokens.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Option<Tokens>> {
        self.tokens.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Adds `authorization: <access token>` to each call; fails the call locally with
/// `Unauthenticated` when the agent holds no token yet.
#[derive(Clone, Debug)]
pub struct AccessTokenInterceptor {
    credentials: Credentials,
}

impl tonic::service::Interceptor for AccessTokenInterceptor {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let value = self.credentials.read().as_ref().map(|t| t.access.value.clone()).ok_or_else(|| {
            Status::unauthenticated("the agent has no access token: it must authenticate before this call")
        })?;
        request.metadata_mut().insert(AUTHORIZATION, value);
        Ok(request)
    }
}

#[derive(Deserialize)]
struct PeekClaims {
    exp: Option<i64>,
    sub: Option<String>,
}

/// Reads a token's expiry without verifying it: the agent cannot verify (no key) and only needs
/// to know when to refresh.
fn parse_token(token: &str, which: &'static str) -> Result<Token, ClientError> {
    let bad = |reason: String| ClientError::BadToken { which, reason };
    let claims: PeekClaims = jsonwebtoken::dangerous::insecure_decode_claims(token).map_err(|e| bad(e.to_string()))?;
    let value: AsciiMetadataValue = MetadataValue::try_from(token).map_err(|e| bad(e.to_string()))?;
    let expires_at =
        claims.exp.and_then(|exp| u64::try_from(exp).ok()).map(|secs| UNIX_EPOCH + Duration::from_secs(secs));
    Ok(Token { value, expires_at })
}

fn agent_name(token: &str) -> Option<String> {
    let claims: PeekClaims = jsonwebtoken::dangerous::insecure_decode_claims(token).ok()?;
    let subject: AgentSubject = serde_json::from_str(&claims.sub?).ok()?;
    Some(subject.client_id)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tonic::service::Interceptor;

    use super::*;
    use crate::identity::{AgentIdentity, AgentName, Binding};
    use crate::session::{ManualClock, SessionIssuer, SigningKey};

    const KEY_A: &str = include_str!("../tests/fixtures/jwt-key-a.pem");

    #[test]
    fn tokens_are_peeked_and_attached_raw() {
        let now = SystemTime::now();
        let issuer =
            SessionIssuer::new(SigningKey::from_pem(KEY_A).expect("key")).with_clock(Arc::new(ManualClock::new(now)));
        let id = AgentIdentity::new(AgentName::new("agent-1").expect("name"), "mtls", Binding::certificate(b"x"));
        let tokens = issuer.issue(&id, AgentMode::Managed).expect("issue");

        let credentials = Credentials::new();
        assert!(credentials.interceptor().call(Request::new(())).is_err());
        let access = parse_token(&tokens.access_token, "access").expect("access");
        let refresh = parse_token(&tokens.refresh_token, "refresh").expect("refresh");
        *credentials.write() = Some(Tokens { access, refresh });

        let request = credentials.interceptor().call(Request::new(())).expect("attached");
        let sent = request.metadata().get(AUTHORIZATION).and_then(|v| v.to_str().ok());
        assert_eq!(sent, Some(tokens.access_token.as_str()));
        assert_eq!(agent_name(&tokens.access_token).as_deref(), Some("agent-1"));

        let due = credentials.refresh_due_at().expect("due");
        let expected = now + Duration::from_secs(300) - REFRESH_BEFORE_EXPIRY;
        let skew = due.duration_since(expected).or_else(|e| Ok::<_, ()>(e.duration())).unwrap_or_default();
        assert!(skew < Duration::from_secs(1), "{skew:?}");
        credentials.clear();
        assert!(credentials.access_token().is_none());
        assert!(parse_token("garbage", "access").is_err());
    }

    #[test]
    fn only_refused_sessions_need_reauthentication() {
        let refused = ClientError::Refused { call: "RefreshToken", status: Status::unauthenticated("expired") };
        assert!(refused.needs_reauthentication());
        let transient = ClientError::Refused { call: "RefreshToken", status: Status::unavailable("down") };
        assert!(!transient.needs_reauthentication());
    }
}
