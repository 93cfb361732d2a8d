//! Authentication methods: how the principal decides which agent is calling.
//!
//! A method ([`Authenticator`]) turns what a call presents (its transport identity, metadata and
//! `AuthRequest.credentials`) into an [`AgentIdentity`]. It also says which transport identity a
//! call presents ([`Authenticator::presented_binding`]), so session tokens issued on one
//! connection are refused on another.
//!
//! Native mTLS is [`mtls`]. The header-based mesh methods read `metadata` instead of the peer
//! certificate, and only on connections from a trusted hop (the `forwarded` module): [`xfcc`] parses the
//! forwarded identity structurally and binds to a SPIFFE ID ([`crate::Binding::SpiffeId`]);
//! [`header`] is upstream's regex mode. SPIFFE SVIDs from the Workload API: [`spiffe_x509`] (the
//! verified client X.509-SVID) and [`spiffe_jwt`] (a JWT-SVID for the principal's audience), both
//! binding to the SPIFFE ID.

pub mod dn;
pub(crate) mod forwarded;
pub mod header;
pub mod mtls;
pub mod spec;
pub mod spiffe_jwt;
pub mod spiffe_x509;
pub mod xfcc;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::error::AuthError;
use crate::identity::{AgentIdentity, Binding, TransportIdentity};

/// What a call presents to an authenticator.
#[derive(Clone, Copy, Debug)]
pub struct AuthContext<'a> {
    /// The connection's identity (address, verified client certificates).
    pub transport: &'a TransportIdentity,
    /// The call's gRPC metadata (HTTP/2 headers).
    pub metadata: &'a http::HeaderMap,
    /// `AuthRequest.credentials` on `Authenticate`; `None` on every other call.
    pub credentials: Option<&'a HashMap<String, String>>,
}

impl<'a> AuthContext<'a> {
    /// The context of a call that is not `Authenticate` (no credentials).
    #[must_use]
    pub fn new(transport: &'a TransportIdentity, metadata: &'a http::HeaderMap) -> Self {
        Self { transport, metadata, credentials: None }
    }
}

/// One authentication method.
///
/// Methods run on the request path and must not block or do I/O: a method that needs remote
/// state (trust bundles, blocklists) keeps it in memory, refreshed by a background task.
pub trait Authenticator: Send + Sync + fmt::Debug + 'static {
    /// The method's name, as agents send it in `AuthRequest.method` (e.g. `mtls`).
    fn method(&self) -> &'static str;

    /// Establishes who is calling.
    ///
    /// # Errors
    ///
    /// [`AuthError`] saying what the call lacks or what does not match.
    fn authenticate(&self, cx: &AuthContext<'_>) -> Result<AgentIdentity, AuthError>;

    /// The transport identity this call presents, compared with a token's binding on every call.
    /// Cheaper than [`Authenticator::authenticate`]: it extracts, it does not match.
    ///
    /// # Errors
    ///
    /// [`AuthError`] when the call presents no identity this method understands.
    fn presented_binding(&self, cx: &AuthContext<'_>) -> Result<Binding, AuthError>;

    /// Whether this call may pass on its session token alone, presenting no transport identity
    /// (a method's explicit opt-in to login-only binding, e.g. `spiffe:jwt` for upstream's
    /// agents). Default: never.
    fn accepts_token_alone(&self, _cx: &AuthContext<'_>) -> bool {
        false
    }
}

/// The methods a principal accepts, by name. Upstream configures exactly one (`--auth`); several
/// are allowed here so a fleet can move between methods.
#[derive(Clone, Debug, Default)]
pub struct AuthMethods {
    methods: Vec<Arc<dyn Authenticator>>,
}

/// Two methods with the same name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("authentication method \"{0}\" is configured twice")]
pub struct DuplicateMethod(pub &'static str);

impl AuthMethods {
    /// No methods (every `Authenticate` fails).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Exactly one method, as upstream's `--auth`.
    #[must_use]
    pub fn single(method: Arc<dyn Authenticator>) -> Self {
        Self { methods: vec![method] }
    }

    /// Adds a method.
    ///
    /// # Errors
    ///
    /// [`DuplicateMethod`] when a method of that name is already registered.
    pub fn register(&mut self, method: Arc<dyn Authenticator>) -> Result<(), DuplicateMethod> {
        if self.get(method.method()).is_some() {
            return Err(DuplicateMethod(method.method()));
        }
        self.methods.push(method);
        Ok(())
    }

    /// The method called `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Authenticator>> {
        self.methods.iter().find(|m| m.method() == name)
    }

    /// The method called `name`, or an error listing the accepted ones.
    ///
    /// # Errors
    ///
    /// [`AuthError::UnknownMethod`].
    pub fn require(&self, name: &str) -> Result<&Arc<dyn Authenticator>, AuthError> {
        self.get(name).ok_or_else(|| AuthError::UnknownMethod { requested: name.to_owned(), accepted: self.accepted() })
    }

    /// The names of the configured methods.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.methods.iter().map(|m| m.method())
    }

    fn accepted(&self) -> String {
        if self.methods.is_empty() {
            return "no method (check --auth)".to_owned();
        }
        self.names().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ")
    }
}
