//! The `authapi.Authentication` service: `Authenticate` runs the configured method on the call
//! and hands out bound tokens; `RefreshToken` exchanges a refresh token presented on a connection
//! with the same transport identity (upstream `principal/apis/auth/auth.go`).
//!
//! `Authenticate`, in upstream's order:
//! 1. `mode` must be `managed` or `autonomous` (else `InvalidArgument`);
//! 2. the method named by `method` runs (unknown method or failure: `Unauthenticated`);
//! 3. version handshake ([`VersionCheck`]): an empty `version` is `InvalidArgument`, one outside
//!    the policy `FailedPrecondition` (upstream compares strings exactly; by default we accept
//!    upstream releases from a minimum on, see [`crate::version`]);
//! 4. admission ([`SessionHook::admit`]): the principal's own rules (which agents it serves,
//!    which certificates are not agents', the blocklist) decide, before anything is signed or
//!    written; a refusal is returned as is (`PermissionDenied`);
//! 5. tokens are signed, then [`SessionHook::on_authenticated`] creates the principal's session
//!    (self-registration); its error is returned as is;
//! 6. the response carries the tokens, the version answered (ours, or an upstream agent's own)
//!    and the principal's namespace.
//!
//! Nothing reaches the hook's side effects unless every check, admission included, passed, so
//! a refused agent leaves no session, no token and no cluster secret.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use protocol::pb::authapi::authentication_server::Authentication;
use protocol::pb::authapi::{AuthRequest, AuthResponse, RefreshTokenRequest};
use tonic::{Request, Response, Status};

use crate::error::AuthError;
use crate::identity::{AgentIdentity, AgentMode, TransportIdentity};
use crate::method::AuthContext;
use crate::session::Sessions;
pub use crate::version::VersionCheck;

/// What the principal learns when an agent authenticates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewSession {
    /// Who authenticated, and how.
    pub identity: AgentIdentity,
    /// The mode it asked for.
    pub mode: AgentMode,
    /// `AuthRequest.agentNamespace`, as reported (unverified).
    pub agent_namespace: String,
    /// `AuthRequest.version`.
    pub agent_version: String,
    /// The caller's address.
    pub remote_addr: Option<SocketAddr>,
}

/// The principal's reaction to a successful `Authenticate` (create queues, self-register the
/// cluster, record the certificate fingerprint for the blocklist).
pub trait SessionHook: Send + Sync + 'static {
    /// Whether the principal admits `identity` in `mode` on a call with this transport
    /// identity, decided once, before any token is signed or anything is written: the same
    /// rules the principal applies to every later call. The default admits everyone.
    ///
    /// # Errors
    ///
    /// The status `Authenticate` fails with (`PermissionDenied` naming what to fix).
    fn admit(&self, identity: &AgentIdentity, mode: AgentMode, transport: &TransportIdentity) -> Result<(), Status> {
        let _ = (identity, mode, transport);
        Ok(())
    }

    /// Called after every check passed and the tokens are signed, before they are returned.
    ///
    /// # Errors
    ///
    /// A status for the agent; `Authenticate` then fails with it and no tokens are returned.
    fn on_authenticated(&self, session: &NewSession) -> impl Future<Output = Result<(), Status>> + Send;

    /// Called after `RefreshToken` verified the refresh token for `identity` (bound to the same
    /// transport identity as before) and signed a new access token expiring at
    /// `access_expires_at`, before it is returned. The principal refuses a blocked agent here,
    /// and otherwise extends the live stream of that identity to the new expiry, so an agent that
    /// keeps its session fresh keeps its stream, and one that stops refreshing loses it when its
    /// token expires.
    ///
    /// # Errors
    ///
    /// A status for the agent; `RefreshToken` then fails with it and no token is returned.
    fn on_refreshed(&self, identity: &AgentIdentity, access_expires_at: SystemTime) -> Result<(), Status> {
        let _ = (identity, access_expires_at);
        Ok(())
    }
}

/// No reaction.
impl SessionHook for () {
    async fn on_authenticated(&self, _session: &NewSession) -> Result<(), Status> {
        Ok(())
    }
}

/// The principal facts `Authenticate` reports and checks against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthServiceConfig {
    /// The principal's version string (`AuthResponse.version` for our own agents).
    pub principal_version: String,
    /// The principal's namespace (`AuthResponse.principalNamespace`).
    pub principal_namespace: String,
    /// The version handshake.
    pub version_check: VersionCheck,
}

/// Told about every refused authentication or call, for metrics; it cannot change the outcome.
/// Arguments: the method (the `Authenticate` method when configured, else `unknown`;
/// `access_token` for calls [`crate::AuthLayer`] refused; `refresh_token` for `RefreshToken`)
/// and a short reason ([`failure_reason`], or `invalid_mode`, `no_version`, `version_mismatch`,
/// `not_admitted`, `refused_by_principal`, `missing_token`, `overloaded`: the signing queue was
/// full, see [`crate::admission`]).
#[derive(Clone)]
pub struct AuthObserver(Arc<RefusalFn>);

/// `f(method, reason)`, see [`AuthObserver`].
type RefusalFn = dyn Fn(&str, &str) + Send + Sync;

impl AuthObserver {
    /// An observer calling `f(method, reason)`.
    pub fn new(f: impl Fn(&str, &str) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Reports a refusal.
    pub fn refused(&self, method: &str, reason: &str) {
        (self.0)(method, reason);
    }
}

impl std::fmt::Debug for AuthObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthObserver")
    }
}

/// A short, stable label for why authentication failed (the variant in snake case).
#[must_use]
pub fn failure_reason(error: &AuthError) -> &'static str {
    match error {
        AuthError::NotTls { .. } => "not_tls",
        AuthError::NoClientCertificate { .. } => "no_client_certificate",
        AuthError::BadCertificate { .. } => "bad_certificate",
        AuthError::SubjectMismatch { .. } => "subject_mismatch",
        AuthError::NoUriSan => "no_uri_san",
        AuthError::UriMismatch { .. } => "uri_mismatch",
        AuthError::EmptyAgentName { .. } => "empty_agent_name",
        AuthError::InvalidAgentName { .. } => "invalid_agent_name",
        AuthError::UntrustedHop { .. } => "untrusted_hop",
        AuthError::MissingHeader { .. } => "missing_header",
        AuthError::BadHeader { .. } => "bad_header",
        AuthError::MeshIdentity { .. } => "mesh_identity",
        AuthError::HeaderMismatch { .. } => "header_mismatch",
        AuthError::HeaderAgentName { .. } => "header_agent_name",
        AuthError::SvidPeerId { .. } => "svid_peer_id",
        AuthError::SpiffePolicy { .. } => "spiffe_policy",
        AuthError::MissingJwtSvid { .. } => "missing_jwt_svid",
        AuthError::JwtSvidRejected { .. } => "jwt_svid_rejected",
        AuthError::WorkloadApiUnavailable { .. } => "workload_api_unavailable",
        AuthError::ReservedAgentName { .. } => "reserved_agent_name",
        AuthError::UnknownMethod { .. } => "unknown_method",
        AuthError::MissingToken => "missing_token",
        AuthError::MalformedToken { .. } => "malformed_token",
        AuthError::TokenAlgorithm { .. } => "token_algorithm",
        AuthError::TokenSignature { .. } => "token_signature",
        AuthError::TokenIssuer { .. } => "token_issuer",
        AuthError::TokenAudience { .. } => "token_audience",
        AuthError::TokenExpired { .. } => "token_expired",
        AuthError::TokenNotYetValid { .. } => "token_not_yet_valid",
        AuthError::TokenWithoutExpiry { .. } => "token_without_expiry",
        AuthError::TokenSubject { .. } => "token_subject",
        AuthError::TokenUnbound { .. } => "token_unbound",
        AuthError::TokenMethod { .. } => "token_method",
        AuthError::BindingMismatch { .. } => "binding_mismatch",
        AuthError::BindingAbsent { .. } => "binding_absent",
        AuthError::TokenIssue { .. } => "token_issue",
        #[allow(unreachable_patterns)]
        _ => "other",
    }
}

/// The `authapi.Authentication` service.
#[derive(Debug)]
pub struct AuthService<H = ()> {
    sessions: Sessions,
    config: AuthServiceConfig,
    hook: H,
    observer: Option<AuthObserver>,
}

impl<H: SessionHook> AuthService<H> {
    /// A service authenticating with `sessions` and reporting to `hook`.
    #[must_use]
    pub fn new(sessions: Sessions, config: AuthServiceConfig, hook: H) -> Self {
        Self { sessions, config, hook, observer: None }
    }

    /// Reports every refusal to `observer` (metrics).
    #[must_use]
    pub fn with_observer(mut self, observer: AuthObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    fn refused(&self, method: &str, reason: &str) {
        if let Some(observer) = &self.observer {
            let method = self.sessions.methods().names().find(|m| *m == method).unwrap_or("unknown");
            observer.refused(method, reason);
        }
    }

    /// Counts a refused `RefreshToken` call by `reason`.
    fn refused_refresh(&self, reason: &str) {
        if let Some(observer) = &self.observer {
            observer.refused("refresh_token", reason);
        }
    }

    /// Runs `sign` (RSA signatures take milliseconds) off the async workers once the signing
    /// gate admits it: queued in order, or refused at once with `RESOURCE_EXHAUSTED` and a retry
    /// hint when the queue is full. Refusals are counted through `refused` by reason.
    async fn sign<T: Send + 'static>(
        &self,
        identity: &AgentIdentity,
        what: &str,
        refused: impl Fn(&'static str),
        sign: impl FnOnce() -> Result<T, AuthError> + Send + 'static,
    ) -> Result<T, Status> {
        let slot = self.sessions.signing().acquire().await.map_err(|overloaded| {
            refused("overloaded");
            overloaded.to_status()
        })?;
        let signed = tokio::task::spawn_blocking(move || {
            let signed = sign();
            slot.done();
            signed
        })
        .await;
        signed
            .map_err(|join| {
                tracing::error!(agent = %identity.name(), error = %join, "signing {what} failed");
                refused("signing_failed");
                Status::internal(format!("signing {what} failed: {join}"))
            })?
            .map_err(|error| {
                tracing::error!(agent = %identity.name(), %error, "cannot sign {what}");
                refused("signing_failed");
                error.to_status()
            })
    }
}

#[tonic::async_trait]
impl<H: SessionHook> Authentication for AuthService<H> {
    async fn authenticate(&self, request: Request<AuthRequest>) -> Result<Response<AuthResponse>, Status> {
        let transport = TransportIdentity::from_extensions(request.extensions());
        let remote_addr = transport.remote_addr();
        let req = request.get_ref();
        let mode: AgentMode = req.mode.parse().map_err(|e: crate::identity::InvalidAgentMode| {
            tracing::info!(?remote_addr, error = %e, "authentication refused");
            self.refused(&req.method, "invalid_mode");
            Status::invalid_argument(e.to_string())
        })?;
        let cx = AuthContext {
            transport: &transport,
            metadata: request.metadata().as_ref(),
            credentials: Some(&req.credentials),
        };
        let identity = self.sessions.authenticate(&req.method, &cx).map_err(|error| {
            tracing::info!(method = %req.method, ?remote_addr, %error, "authentication refused");
            self.refused(&req.method, failure_reason(&error));
            error.to_status()
        })?;
        let answer_version = self.config.version_check.judge(&req.version, &self.config.principal_version);
        let answer_version = answer_version.inspect_err(|status| {
            tracing::info!(agent = %identity.name(), ?remote_addr, error = status.message(), "authentication refused");
            let no_version = status.code() == tonic::Code::InvalidArgument;
            self.refused(&req.method, if no_version { "no_version" } else { "version_mismatch" });
        })?;
        self.hook.admit(&identity, mode, &transport).inspect_err(|status| {
            tracing::warn!(agent = %identity.name(), binding = %identity.binding(), ?remote_addr,
                reason = status.message(), "authentication refused: not admitted");
            self.refused(&req.method, "not_admitted");
        })?;
        // Two RSA signatures (tens of ms with RSA-4096): off the async workers, so a reconnect
        // storm does not stall the heartbeats and streams of agents already connected, and no
        // more at once than the signing gate allows (one per core by default): a storm waits in
        // its bounded queue, and beyond it is refused with RESOURCE_EXHAUSTED and a retry hint
        // (logged once a second, counted as `overloaded`), never starving the workers.
        let tokens = {
            let (sessions, id) = (self.sessions.clone(), identity.clone());
            self.sign(
                &identity,
                "the session tokens",
                |reason| self.refused(&req.method, reason),
                move || sessions.issue(&id, mode),
            )
            .await?
        };
        let session = NewSession {
            identity,
            mode,
            agent_namespace: req.agent_namespace.clone(),
            agent_version: req.version.clone(),
            remote_addr,
        };
        self.hook
            .on_authenticated(&session)
            .await
            .inspect_err(|_| self.refused(&req.method, "refused_by_principal"))?;
        tracing::info!(
            agent = %session.identity.name(),
            method = session.identity.method(),
            %mode,
            binding = %session.identity.binding(),
            ?remote_addr,
            "agent authenticated"
        );
        Ok(Response::new(AuthResponse {
            access_token: tokens.access_token,
            refresh_token: tokens.refresh_token,
            version: answer_version,
            principal_namespace: self.config.principal_namespace.clone(),
        }))
    }

    async fn refresh_token(&self, request: Request<RefreshTokenRequest>) -> Result<Response<AuthResponse>, Status> {
        let transport = TransportIdentity::from_extensions(request.extensions());
        let token = &request.get_ref().refresh_token;
        if token.is_empty() {
            self.refused_refresh("missing_token");
            return Err(Status::unauthenticated("no refresh token in the RefreshTokenRequest"));
        }
        let cx = AuthContext::new(&transport, request.metadata().as_ref());
        let verified = self.sessions.verify_refresh(token, &cx).map_err(|error| {
            tracing::info!(remote_addr = ?transport.remote_addr(), %error, "token refresh refused");
            self.refused_refresh(failure_reason(&error));
            error.to_status()
        })?;
        // Signed as `Authenticate` signs: through the signing gate, off the async workers, so
        // agents refreshing together (they logged in together) queue, or are told when to come
        // back, instead of taking every worker.
        let identity = verified.identity().clone();
        let refreshed = {
            let sessions = self.sessions.clone();
            self.sign(
                &identity,
                "the refreshed token",
                |reason| self.refused_refresh(reason),
                move || sessions.sign_refresh(&verified),
            )
            .await?
        };
        self.hook.on_refreshed(&identity, refreshed.access_expires_at).inspect_err(|status| {
            tracing::info!(agent = %identity.name(), reason = status.message(), "token refresh refused");
        })?;
        // Upstream leaves version and principalNamespace empty here, and the refresh token empty
        // unless it was renewed.
        Ok(Response::new(AuthResponse {
            access_token: refreshed.access_token,
            refresh_token: refreshed.refresh_token.unwrap_or_default(),
            version: String::new(),
            principal_namespace: String::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// An observer that records each refusal as `<method>/<reason>`.
    fn recording_observer() -> (Arc<Mutex<Vec<String>>>, AuthObserver) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let observer = {
            let seen = seen.clone();
            AuthObserver::new(move |method, reason| seen.lock().unwrap().push(format!("{method}/{reason}")))
        };
        (seen, observer)
    }

    #[tokio::test]
    async fn a_full_signing_queue_refuses_with_resource_exhausted_and_a_hint() {
        let key = crate::SigningKey::from_pem(include_str!("../tests/fixtures/jwt-key-a.pem")).unwrap();
        let spec = crate::AuthMethodSpec::parse("header:x-agent-id:^([a-z0-9-]+)$").unwrap();
        let sessions = Sessions::new(crate::SessionIssuer::new(key), crate::AuthMethods::single(spec.authenticator()))
            .with_signing_limits(crate::SigningLimits { concurrent: 1, queue: 0 });
        let (seen, observer) = recording_observer();
        let config = AuthServiceConfig {
            principal_version: "v1".into(),
            principal_namespace: "argocd".into(),
            version_check: VersionCheck::Skip,
        };
        let service = AuthService::new(sessions.clone(), config, ()).with_observer(observer);
        let request = || {
            let mut r = Request::new(AuthRequest {
                method: "header".into(),
                mode: "managed".into(),
                version: "v1".into(),
                ..Default::default()
            });
            r.metadata_mut().insert("x-agent-id", "agent-a".parse().unwrap());
            // From the local sidecar: the header method reads the header from a trusted hop only.
            let from = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 40000)));
            r.extensions_mut().insert(tonic::transport::server::TcpConnectInfo { local_addr: None, remote_addr: from });
            r
        };
        // Another call holds the only slot, and nothing may wait.
        let held = sessions.signing().acquire().await.unwrap();
        let status = service.authenticate(request()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        let hint = crate::retry_hint(&status).expect("a retry hint in grpc-retry-pushback-ms");
        assert!(hint > std::time::Duration::ZERO);
        let client_side = crate::ClientError::Refused { call: "Authenticate", status };
        assert_eq!(client_side.retry_after(), Some(hint), "the agent reads the hint");
        assert!(!client_side.needs_reauthentication());
        assert_eq!(*seen.lock().unwrap(), ["header/overloaded"]);
        // The slot is free again: the next call is admitted and signed.
        held.done();
        let answer = service.authenticate(request()).await.unwrap().into_inner();
        assert!(!answer.access_token.is_empty());

        // A refresh signs through the same gate: refused with the hint while the slot is held,
        // after the token and the binding were checked (a bad token is refused as such).
        let refresh = |token: &str| {
            let mut r = Request::new(RefreshTokenRequest { refresh_token: token.to_owned() });
            r.metadata_mut().insert("x-agent-id", "agent-a".parse().unwrap());
            let from = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 40000)));
            r.extensions_mut().insert(tonic::transport::server::TcpConnectInfo { local_addr: None, remote_addr: from });
            r
        };
        let held = sessions.signing().acquire().await.unwrap();
        let status = service.refresh_token(refresh(&answer.refresh_token)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(crate::retry_hint(&status).is_some(), "{status:?}");
        let status = service.refresh_token(refresh("not.a.token")).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "checked before the gate: {status:?}");
        held.done();
        let refreshed = service.refresh_token(refresh(&answer.refresh_token)).await.unwrap().into_inner();
        assert!(!refreshed.access_token.is_empty());
        assert_eq!(seen.lock().unwrap()[1], "refresh_token/overloaded");
    }

    #[tokio::test]
    async fn refusals_are_reported_to_the_observer_with_bounded_labels() {
        let key = crate::SigningKey::from_pem(include_str!("../tests/fixtures/jwt-key-a.pem")).unwrap();
        let sessions = Sessions::new(crate::SessionIssuer::new(key), crate::AuthMethods::new());
        let (seen, observer) = recording_observer();
        let config = AuthServiceConfig {
            principal_version: "v1".into(),
            principal_namespace: "argocd".into(),
            version_check: VersionCheck::Exact,
        };
        let service = AuthService::new(sessions, config, ()).with_observer(observer);
        let request = |method: &str, mode: &str| {
            Request::new(AuthRequest { method: method.into(), mode: mode.into(), ..Default::default() })
        };
        assert!(service.authenticate(request("attacker-chosen", "managed")).await.is_err());
        assert!(service.authenticate(request("mtls", "bogus")).await.is_err());
        let refresh = Request::new(RefreshTokenRequest::default());
        assert!(service.refresh_token(refresh).await.is_err());
        assert_eq!(
            *seen.lock().unwrap(),
            ["unknown/unknown_method", "unknown/invalid_mode", "refresh_token/missing_token"],
            "a method that is not configured is never used as a label value"
        );
    }
}
