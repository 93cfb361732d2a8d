//! Who is calling: the agent's name and mode, the transport identity of its connection, and the
//! binding that ties a session token to that transport identity.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::SystemTime;

use rustls_pki_types::CertificateDer;
use sha2::{Digest, Sha256};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

// === AgentName ===

/// An agent's name: a DNS-1123 label, as upstream requires of every extracted agent ID
/// (`k8s.io/apimachinery` `NameIsDNSLabel`, `internal/auth/mtls/mtls.go`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentName(String);

/// Why a string is not a valid agent name (a DNS-1123 label).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidAgentName {
    /// The name is empty.
    #[error("the name is empty")]
    Empty,
    /// The name is longer than a DNS label may be.
    #[error("\"{name}\" is {len} characters long, a DNS-1123 label has at most {max}", max = AgentName::MAX_LEN)]
    TooLong {
        /// The rejected name.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The name holds a character outside `a-z`, `0-9` and `-`.
    #[error("\"{name}\" has {ch:?} at position {position}: a DNS-1123 label holds only a-z, 0-9 and '-'")]
    BadCharacter {
        /// The rejected name.
        name: String,
        /// The first offending character.
        ch: char,
        /// Its character position, from 0.
        position: usize,
    },
    /// The name starts or ends with `-`.
    #[error("\"{name}\" starts or ends with '-': a DNS-1123 label starts and ends with a-z or 0-9")]
    BadEdge {
        /// The rejected name.
        name: String,
    },
}

impl AgentName {
    /// The longest agent name: a DNS label has at most 63 characters.
    pub const MAX_LEN: usize = 63;

    /// Validates `name` as a DNS-1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters).
    ///
    /// # Errors
    ///
    /// [`InvalidAgentName`] naming the rule `name` breaks.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidAgentName> {
        let name = name.into();
        if name.is_empty() {
            return Err(InvalidAgentName::Empty);
        }
        if name.len() > Self::MAX_LEN {
            let len = name.len();
            return Err(InvalidAgentName::TooLong { name, len });
        }
        if let Some((position, ch)) =
            name.chars().enumerate().find(|(_, c)| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
        {
            return Err(InvalidAgentName::BadCharacter { name, ch, position });
        }
        if name.starts_with('-') || name.ends_with('-') {
            return Err(InvalidAgentName::BadEdge { name });
        }
        Ok(Self(name))
    }

    /// The name as a string slice.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for AgentName {
    type Err = InvalidAgentName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

// === AgentMode ===

/// The agent's mode, as sent in `AuthRequest.mode` and kept in the token subject.
pub use protocol::mode::{AgentMode, InvalidAgentMode};

// === Binding ===

/// The transport identity a session token is bound to: a token is accepted only on a connection
/// (or, behind a mesh, a request) that presents the same identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Binding {
    /// SHA-256 of the DER of the client's leaf certificate (native mTLS).
    CertificateSha256([u8; 32]),
    /// A SPIFFE ID (mesh methods: forwarded XFCC, X.509 or JWT SVIDs). SVIDs rotate often, so
    /// mesh sessions bind to the ID rather than to one certificate.
    SpiffeId(String),
    /// SHA-256 of a forwarded identity header's raw value (`header:<name>:<regex>` when the agent
    /// name does not come from a SPIFFE ID, e.g. Linkerd's `l5d-client-id`): the token is valid
    /// only while the trusted proxy forwards exactly the same value.
    HeaderSha256([u8; 32]),
}

impl Binding {
    /// Binds to the SHA-256 of a certificate's DER.
    #[must_use]
    pub fn certificate(der: &[u8]) -> Self {
        Self::CertificateSha256(Sha256::digest(der).into())
    }

    /// Binds to the SHA-256 of a forwarded header's raw value.
    #[must_use]
    pub fn header_value(value: &[u8]) -> Self {
        Self::HeaderSha256(Sha256::digest(value).into())
    }

    /// The upper-case hex SHA-256 fingerprint, the form upstream's TLS blocklist uses, or `None`
    /// for the other bindings.
    #[must_use]
    pub fn fingerprint(&self) -> Option<String> {
        match self {
            Self::CertificateSha256(hash) => Some(hex::encode_upper(hash)),
            Self::SpiffeId(_) | Self::HeaderSha256(_) => None,
        }
    }
}

impl fmt::Display for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CertificateSha256(hash) => {
                write!(f, "client certificate SHA-256 {}", hex::encode_upper(hash))
            }
            Self::SpiffeId(id) => write!(f, "SPIFFE ID {id}"),
            Self::HeaderSha256(hash) => write!(f, "forwarded header value SHA-256 {}", hex::encode_upper(hash)),
        }
    }
}

// === TransportIdentity ===

/// What the connection itself tells about the caller: its address and, over TLS, the client
/// certificate chain the TLS layer verified (leaf first).
///
/// The chain is only as trustworthy as the server's client-certificate verifier: serve with
/// [`crate::tls::server_config`], which verifies every presented chain against the configured CA.
#[derive(Clone, Debug, Default)]
pub struct TransportIdentity {
    remote_addr: Option<SocketAddr>,
    tls: bool,
    peer_certificates: Option<Arc<Vec<CertificateDer<'static>>>>,
}

impl TransportIdentity {
    /// A plaintext connection (no TLS, so no client certificate).
    #[must_use]
    pub fn plaintext(remote_addr: Option<SocketAddr>) -> Self {
        Self { remote_addr, tls: false, peer_certificates: None }
    }

    /// A TLS connection; `peer_certificates` is the verified client chain, leaf first, or `None`
    /// when the client presented no certificate.
    #[must_use]
    pub fn tls(remote_addr: Option<SocketAddr>, peer_certificates: Option<Arc<Vec<CertificateDer<'static>>>>) -> Self {
        Self { remote_addr, tls: true, peer_certificates: peer_certificates.filter(|c| !c.is_empty()) }
    }

    /// Reads the identity tonic's server put into the request extensions: `TlsConnectInfo` for
    /// TLS connections (tonic's own TLS or [`crate::tls::TlsIncoming`]), `TcpConnectInfo` for
    /// plaintext ones. Neither present (e.g. an in-memory transport) reads as plaintext with no
    /// address.
    #[must_use]
    pub fn from_extensions(extensions: &http::Extensions) -> Self {
        if let Some(info) = extensions.get::<TlsConnectInfo<TcpConnectInfo>>() {
            return Self::tls(info.get_ref().remote_addr(), info.peer_certs());
        }
        let remote_addr = extensions.get::<TcpConnectInfo>().and_then(TcpConnectInfo::remote_addr);
        Self::plaintext(remote_addr)
    }

    /// The caller's address, when the transport knows it.
    #[must_use]
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.remote_addr
    }

    /// Whether the connection is TLS.
    #[must_use]
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The client certificate chain, leaf first, if the client presented one.
    #[must_use]
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        self.peer_certificates.as_deref().map(Vec::as_slice)
    }

    /// The client's leaf certificate, if it presented one.
    #[must_use]
    pub fn leaf_certificate(&self) -> Option<&CertificateDer<'static>> {
        self.peer_certificates().and_then(<[_]>::first)
    }
}

// === AgentIdentity ===

/// An authenticated agent: its name and how that was established.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentIdentity {
    name: AgentName,
    method: &'static str,
    binding: Binding,
}

impl AgentIdentity {
    /// An identity established by `method` (e.g. `mtls`) and bound to `binding`.
    #[must_use]
    pub fn new(name: AgentName, method: &'static str, binding: Binding) -> Self {
        Self { name, method, binding }
    }

    /// The agent's name.
    #[must_use]
    pub fn name(&self) -> &AgentName {
        &self.name
    }

    /// The authentication method that established the identity (`AuthRequest.method`).
    #[must_use]
    pub fn method(&self) -> &'static str {
        self.method
    }

    /// The transport identity the agent's tokens are bound to.
    #[must_use]
    pub fn binding(&self) -> &Binding {
        &self.binding
    }
}

// === AgentSession ===

/// A verified access token on a call: the agent, its mode and the token's id and expiry.
///
/// [`crate::AuthLayer`] puts one into the request extensions of every authenticated call;
/// services read it with [`AgentSession::from_request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentSession {
    /// Who is calling.
    pub identity: AgentIdentity,
    /// The mode the agent authenticated with.
    pub mode: AgentMode,
    /// The access token's `jti`.
    pub token_id: String,
    /// When the access token expires.
    pub expires_at: SystemTime,
}

impl AgentSession {
    /// The session the auth layer attached to `request`.
    ///
    /// # Errors
    ///
    /// `Unauthenticated` when there is none: the call did not pass through [`crate::AuthLayer`]
    /// (a wiring error) or the path is one the layer lets through without a token.
    pub fn from_request<T>(request: &tonic::Request<T>) -> Result<&Self, tonic::Status> {
        request.extensions().get::<Self>().ok_or_else(|| {
            tonic::Status::unauthenticated(
                "no authenticated agent on this call: the principal's AuthLayer did not run on it",
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_names_follow_dns_1123_labels() {
        for ok in ["agent-1", "a", "0", "a-b-c", &"a".repeat(63)] {
            assert!(AgentName::new(ok).is_ok(), "{ok}");
        }
        assert_eq!(AgentName::new(""), Err(InvalidAgentName::Empty));
        assert!(matches!(AgentName::new("a".repeat(64)), Err(InvalidAgentName::TooLong { len: 64, .. })));
        assert!(matches!(AgentName::new("Agent_1"), Err(InvalidAgentName::BadCharacter { ch: 'A', position: 0, .. })));
        assert!(matches!(AgentName::new("agent.1"), Err(InvalidAgentName::BadCharacter { ch: '.', .. })));
        assert!(matches!(AgentName::new("-agent"), Err(InvalidAgentName::BadEdge { .. })));
        assert!(matches!(AgentName::new("agent-"), Err(InvalidAgentName::BadEdge { .. })));
    }

    #[test]
    fn modes_parse_from_the_wire_form() {
        assert_eq!("managed".parse(), Ok(AgentMode::Managed));
        assert_eq!("autonomous".parse(), Ok(AgentMode::Autonomous));
        assert!("Managed".parse::<AgentMode>().is_err());
        assert!("".parse::<AgentMode>().is_err());
    }

    #[test]
    fn certificate_binding_prints_upstream_fingerprint() {
        let binding = Binding::certificate(b"der");
        let fingerprint = binding.fingerprint().unwrap_or_default();
        assert_eq!(fingerprint.len(), 64);
        assert_eq!(fingerprint, fingerprint.to_uppercase());
        assert!(binding.to_string().contains(&fingerprint));
    }

    #[test]
    fn transport_without_connect_info_is_plaintext() {
        let t = TransportIdentity::from_extensions(&http::Extensions::new());
        assert!(!t.is_tls());
        assert!(t.leaf_certificate().is_none());
        let empty = TransportIdentity::tls(None, Some(Arc::new(Vec::new())));
        assert!(empty.peer_certificates().is_none());
    }
}
