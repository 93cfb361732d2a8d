//! `--auth spiffe:x509`: the agent is the SPIFFE ID of its X.509-SVID, presented as the TLS
//! client certificate and verified by the TLS layer against the trust bundles of the principal's
//! own SPIFFE Workload API.
//!
//! Serve TLS with [`mesh::workload::X509Identity::server_config`]: it presents the principal's
//! SVID, requires a client SVID and verifies its chain against the bundle of the client's trust
//! domain (federated bundles included), with rotation applied to new handshakes. This method then
//! reads the single URI SAN of the verified leaf ([`mesh::workload::peer_spiffe_id`]), and the
//! [`SpiffePolicy`] decides whether it is an agent and which (trust domain, path pattern,
//! namespaces), so a refusal is an `Unauthenticated` status with the reason rather than a TLS
//! alert.
//!
//! Sessions bind to the SPIFFE ID ([`Binding::SpiffeId`]), re-read from the connection's peer
//! SVID on every call: SVIDs rotate (every hour or less with SPIRE), and a connection made with a
//! rotated SVID of the same workload keeps its session, while one of another workload does not.

use mesh::{AuthorizedAgent, SpiffePolicy};

use super::{AuthContext, Authenticator};
use crate::error::AuthError;
use crate::identity::{AgentIdentity, AgentName, Binding};

/// The `spiffe:x509` method.
#[derive(Clone, Debug)]
pub struct SpiffeX509Authenticator {
    policy: SpiffePolicy,
}

impl SpiffeX509Authenticator {
    /// The method name agents send in `AuthRequest.method`.
    pub const METHOD: &'static str = "spiffe-x509";

    /// Authorizes the verified peer SVID's SPIFFE ID with `policy`.
    #[must_use]
    pub fn new(policy: SpiffePolicy) -> Self {
        Self { policy }
    }

    /// The policy deciding which SPIFFE IDs are agents.
    #[must_use]
    pub fn policy(&self) -> &SpiffePolicy {
        &self.policy
    }

    fn identify(&self, cx: &AuthContext<'_>) -> Result<AuthorizedAgent, AuthError> {
        let id = peer_id(Self::METHOD, cx)?;
        self.policy.authorize(&id).map_err(|source| AuthError::SpiffePolicy { method: Self::METHOD, source })
    }
}

/// The SPIFFE ID of the connection's verified client certificate.
pub(crate) fn peer_id(method: &'static str, cx: &AuthContext<'_>) -> Result<mesh::SpiffeId, AuthError> {
    if !cx.transport.is_tls() {
        return Err(AuthError::NotTls { method });
    }
    let certs = cx.transport.peer_certificates().ok_or(AuthError::NoClientCertificate { method })?;
    mesh::workload::peer_spiffe_id(certs).map_err(|source| AuthError::SvidPeerId { method, source })
}

/// The agent name a policy extracted (a DNS-1123 label by the policy's own check).
pub(crate) fn agent_name(agent: &AuthorizedAgent) -> Result<AgentName, AuthError> {
    AgentName::new(agent.agent()).map_err(|reason| AuthError::InvalidAgentName { field: "SPIFFE ID", reason })
}

impl Authenticator for SpiffeX509Authenticator {
    fn method(&self) -> &'static str {
        Self::METHOD
    }

    fn authenticate(&self, cx: &AuthContext<'_>) -> Result<AgentIdentity, AuthError> {
        let agent = self.identify(cx)?;
        Ok(AgentIdentity::new(agent_name(&agent)?, Self::METHOD, Binding::SpiffeId(agent.spiffe_id().to_string())))
    }

    /// Re-reads the SPIFFE ID from this connection's peer SVID and checks the policy again.
    fn presented_binding(&self, cx: &AuthContext<'_>) -> Result<Binding, AuthError> {
        self.identify(cx).map(|agent| Binding::SpiffeId(agent.spiffe_id().to_string()))
    }
}
