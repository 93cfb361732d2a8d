//! Who is calling: the seam through which the auth layer hands the principal an agent's
//! authenticated name and mode.

use std::sync::Arc;
use std::time::SystemTime;

use tonic::metadata::MetadataMap;

use crate::config::AgentMode;

/// Who is calling, as the identity seam reads it from the request (not yet authorized: see
/// [`crate::access::authz`], which turns it into a [`crate::Permit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The agent's name (= its namespace on the hub).
    pub name: String,
    /// The mode the agent announced when it authenticated (upstream carries it in the access
    /// token's `sub` claim, §3.3-3.6).
    pub mode: AgentMode,
}

/// Reads the caller's identity from a request: the auth layer puts its identity type into the
/// request extensions; this function turns it into an [`Caller`]. `None` rejects the call
/// with `Unauthenticated`.
pub type IdentityFn = Arc<dyn Fn(&http::Extensions, &MetadataMap) -> Option<Caller> + Send + Sync>;

/// Metadata key read by [`insecure_metadata_identity`] for the agent name.
pub const INSECURE_AGENT_NAME_HEADER: &str = "x-argocd-agent-name";
/// Metadata key read by [`insecure_metadata_identity`] for the agent mode.
pub const INSECURE_AGENT_MODE_HEADER: &str = "x-argocd-agent-mode";

/// An identity taken verbatim from request metadata (`x-argocd-agent-name`,
/// `x-argocd-agent-mode`). **Anyone can claim any agent**: for tests and trusted loopback
/// setups only; production uses the auth crate's layer.
#[must_use]
pub fn insecure_metadata_identity() -> IdentityFn {
    Arc::new(|_ext, md| {
        let name = md.get(INSECURE_AGENT_NAME_HEADER)?.to_str().ok()?.to_owned();
        let mode = md.get(INSECURE_AGENT_MODE_HEADER)?.to_str().ok()?.parse().ok()?;
        Some(Caller { name, mode })
    })
}

/// The identity [`auth::AuthLayer`] established: the [`auth::AgentSession`] it put into the
/// request extensions. What the `argocd-agent principal` binary serves behind the auth layer.
#[must_use]
pub fn auth_layer_identity() -> IdentityFn {
    Arc::new(|ext, _md| {
        let session = ext.get::<auth::AgentSession>()?;
        Some(Caller { name: session.identity.name().to_string(), mode: session.mode })
    })
}

/// What the auth layer established about the access token a call carries: its id and expiry.
/// Empty when the call did not pass through [`auth::AuthLayer`] (e.g. with
/// [`insecure_metadata_identity`]); such streams never expire and cannot be revoked by token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamGrant {
    /// The access token's `jti`.
    pub token_id: Option<String>,
    /// When the access token expires: the stream is closed then, unless the agent refreshed
    /// its session before (see [`crate::Principal::session_hook`]).
    pub expires_at: Option<SystemTime>,
    /// The transport identity the token is bound to: only a refresh of a session with the same
    /// binding extends the stream.
    pub binding: Option<auth::Binding>,
}

impl StreamGrant {
    /// The grant of a call by `agent`: read from the [`auth::AgentSession`] in the request
    /// extensions when it names the same agent, else empty.
    #[must_use]
    pub fn of(extensions: &http::Extensions, agent: &str) -> Self {
        extensions
            .get::<auth::AgentSession>()
            .filter(|s| s.identity.name().as_str() == agent)
            .map(|s| Self {
                token_id: Some(s.token_id.clone()),
                expires_at: Some(s.expires_at),
                binding: Some(s.identity.binding().clone()),
            })
            .unwrap_or_default()
    }
}

/// Reads the agent name from a client certificate's CN as upstream does (`CN=([^,]+)` over the
/// subject rendered as Go renders it): the resource proxy's callers, `--client-cert-subject-match`.
/// `None` only if that constant regex did not compile.
pub(crate) fn cn_reader() -> Option<auth::MtlsAuthenticator> {
    regex::Regex::new(auth::DEFAULT_SUBJECT_REGEX)
        .ok()
        .map(|regex| auth::MtlsAuthenticator::new(auth::IdentitySource::Subject, regex))
}
