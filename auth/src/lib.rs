//! Which agent is calling: authenticators, session tokens, the tower auth layer.
//!
//! On the principal:
//! 1. parse `--auth` with [`AuthMethodSpec::parse`] and build [`AuthMethods`];
//! 2. load the JWT key ([`SigningKey`]) and make a [`SessionIssuer`], then [`Sessions`];
//! 3. serve TLS with [`tls::server_config`] and [`tls::TlsIncoming`] (presented client chains
//!    are verified; a missing certificate is left for the auth layer to explain);
//! 4. put [`AuthLayer`] in front of the router and serve [`AuthService`] as
//!    `authapi.Authentication`; services read the caller from [`AgentSession::from_request`].
//!
//! On the agent: [`Credentials`] authenticates, keeps the tokens fresh and provides the
//! interceptor for every other client; [`JwtSvidSource`] keeps a JWT-SVID for `spiffe:jwt`.
//!
//! Every session token is bound to the transport identity it was issued on (the client
//! certificate's SHA-256 for native mTLS, a SPIFFE ID for the mesh methods), and refused on a
//! connection or call presenting another.
//!
//! Behind a mesh (`--auth xfcc:…` or upstream's `--auth header:<name>:<regex>`) the principal
//! serves plaintext behind its sidecar and reads the identity the sidecar forwards, only from
//! trusted hops; check the listener with [`check_listener`] at startup.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod client;
pub mod error;
pub mod identity;
pub mod jwt_svid;
pub mod layer;
pub mod method;
pub mod roles;
pub mod service;
pub mod session;
pub mod tls;
pub mod tls_policy;
pub mod version;

pub use admission::{Overloaded, RETRY_PUSHBACK_MS, SigningAdmission, SigningLimits, retry_hint};
pub use client::{AccessTokenInterceptor, AuthParams, CallMetadata, ClientError, Credentials, PrincipalInfo};
pub use error::AuthError;
pub use identity::{AgentIdentity, AgentMode, AgentName, AgentSession, Binding, InvalidAgentName, TransportIdentity};
pub use jwt_svid::JwtSvidSource;
pub use layer::{Auth, AuthLayer, PUBLIC_PATHS};
pub use mesh::{MeshProfile, TrustedHops};
pub use method::header::HeaderAuthenticator;
pub use method::mtls::{IdentitySource, MtlsAuthenticator};
pub use method::spec::{AuthMethodSpec, DEFAULT_SUBJECT_REGEX, SpecError, XFCC_KEYS, check_listener};
pub use method::xfcc::XfccAuthenticator;
pub use method::{AuthContext, AuthMethods, Authenticator};
pub use service::{AuthObserver, AuthService, AuthServiceConfig, NewSession, SessionHook, VersionCheck};
pub use session::{AccessLifetimeOutOfRange, SessionIssuer, Sessions, SigningKey, TokenKind, TokenLifetimes};
pub use version::{DEFAULT_MIN_AGENT_VERSION, ReleaseVersion};
