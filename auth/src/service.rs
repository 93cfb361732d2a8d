//! The `authapi.Authentication` service: `Authenticate` runs the configured method on the call
//! and hands out bound tokens; `RefreshToken` exchanges a refresh token presented on a connection
//! with the same transport identity (upstream `principal/apis/auth/auth.go`).
//!
//! `Authenticate`, in upstream's order:
//! 1. `mode` must be `managed` or `autonomous` (else `InvalidArgument`);
//! 2. the method named by `method` runs (unknown method or failure: `Unauthenticated`);
//! 3. version handshake: empty `version` is `InvalidArgument`, a different one
//!    `FailedPrecondition` (upstream compares strings exactly);
//! 4. tokens are signed, then the [`SessionHook`] creates the principal's session (queues,
//!    self-registration); its error is returned as is;
//! 5. the response carries the tokens, the principal's version and namespace.
//!
//! Nothing reaches the hook unless every check passed, so a refused agent leaves no session.

use std::future::Future;
use std::net::SocketAddr;

use protocol::pb::authapi::authentication_server::Authentication;
use protocol::pb::authapi::{AuthRequest, AuthResponse, RefreshTokenRequest};
use tonic::{Request, Response, Status};

use crate::identity::{AgentIdentity, AgentMode, TransportIdentity};
use crate::method::AuthContext;
use crate::session::Sessions;

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
    /// Called after every check passed and the tokens are signed, before they are returned.
    ///
    /// # Errors
    ///
    /// A status for the agent; `Authenticate` then fails with it and no tokens are returned.
    fn on_authenticated(&self, session: &NewSession) -> impl Future<Output = Result<(), Status>> + Send;
}

/// No reaction.
impl SessionHook for () {
    async fn on_authenticated(&self, _session: &NewSession) -> Result<(), Status> {
        Ok(())
    }
}

/// How `Authenticate` compares the agent's version with the principal's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VersionCheck {
    /// Exact string equality, as upstream (an empty version is refused).
    #[default]
    Exact,
    /// No check.
    Skip,
}

/// The principal facts `Authenticate` reports and checks against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthServiceConfig {
    /// The principal's version string (`AuthResponse.version`).
    pub principal_version: String,
    /// The principal's namespace (`AuthResponse.principalNamespace`).
    pub principal_namespace: String,
    /// The version handshake.
    pub version_check: VersionCheck,
}

/// The `authapi.Authentication` service.
#[derive(Debug)]
pub struct AuthService<H = ()> {
    sessions: Sessions,
    config: AuthServiceConfig,
    hook: H,
}

impl<H: SessionHook> AuthService<H> {
    /// A service authenticating with `sessions` and reporting to `hook`.
    #[must_use]
    pub fn new(sessions: Sessions, config: AuthServiceConfig, hook: H) -> Self {
        Self { sessions, config, hook }
    }

    fn check_version(&self, agent: &str) -> Result<(), Status> {
        if self.config.version_check == VersionCheck::Skip {
            return Ok(());
        }
        if agent.is_empty() {
            return Err(Status::invalid_argument(format!(
                "the agent sent no version; this principal is version {}",
                self.config.principal_version
            )));
        }
        if agent != self.config.principal_version {
            return Err(Status::failed_precondition(format!(
                "version mismatch: agent is {agent}, principal is {}",
                self.config.principal_version
            )));
        }
        Ok(())
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
            Status::invalid_argument(e.to_string())
        })?;
        let cx = AuthContext {
            transport: &transport,
            metadata: request.metadata().as_ref(),
            credentials: Some(&req.credentials),
        };
        let identity = self.sessions.authenticate(&req.method, &cx).map_err(|error| {
            tracing::info!(method = %req.method, ?remote_addr, %error, "authentication refused");
            error.to_status()
        })?;
        self.check_version(&req.version).inspect_err(|status| {
            tracing::info!(agent = %identity.name(), ?remote_addr, error = status.message(), "authentication refused");
        })?;
        let tokens = self.sessions.issue(&identity, mode).map_err(|error| {
            tracing::error!(agent = %identity.name(), %error, "cannot sign session tokens");
            error.to_status()
        })?;
        let session = NewSession {
            identity,
            mode,
            agent_namespace: req.agent_namespace.clone(),
            agent_version: req.version.clone(),
            remote_addr,
        };
        self.hook.on_authenticated(&session).await?;
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
            version: self.config.principal_version.clone(),
            principal_namespace: self.config.principal_namespace.clone(),
        }))
    }

    async fn refresh_token(&self, request: Request<RefreshTokenRequest>) -> Result<Response<AuthResponse>, Status> {
        let transport = TransportIdentity::from_extensions(request.extensions());
        let token = &request.get_ref().refresh_token;
        if token.is_empty() {
            return Err(Status::unauthenticated("no refresh token in the RefreshTokenRequest"));
        }
        let cx = AuthContext::new(&transport, request.metadata().as_ref());
        let refreshed = self.sessions.refresh(token, &cx).map_err(|error| {
            tracing::info!(remote_addr = ?transport.remote_addr(), %error, "token refresh refused");
            error.to_status()
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
