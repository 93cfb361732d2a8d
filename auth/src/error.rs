//! Why a caller was not authenticated, worded so the operator knows what to fix.

use crate::identity::{Binding, InvalidAgentName};
use crate::session::TokenKind;

/// An authentication failure. Every variant but [`AuthError::TokenIssue`] answers the caller with
/// gRPC `Unauthenticated` and this message (see [`AuthError::to_status`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The connection is plaintext, so there is no client certificate to identify the agent by.
    #[error(
        "no client certificate: the connection is plaintext, and method \"{method}\" identifies \
         agents by their TLS client certificate (serve TLS, or use a mesh method)"
    )]
    NotTls {
        /// The method that needed a certificate.
        method: &'static str,
    },
    /// The agent connected over TLS without a client certificate.
    #[error(
        "no client certificate: the agent connected over TLS without one, and method \"{method}\" \
         identifies agents by their client certificate (agent --tls-client-cert/--tls-client-key \
         or secret argocd-agent-client-tls)"
    )]
    NoClientCertificate {
        /// The method that needed a certificate.
        method: &'static str,
    },
    /// The client certificate could not be parsed.
    #[error("client certificate cannot be parsed: {reason}")]
    BadCertificate {
        /// What the parser said.
        reason: String,
    },
    /// The subject does not match the `mtls:subject:<regex>` regex.
    #[error(
        "client certificate subject \"{subject}\" does not match the agent name regex `{regex}` \
         (--auth mtls:subject:<regex>)"
    )]
    SubjectMismatch {
        /// The subject, rendered as upstream does (`CN=agent-1,O=...`).
        subject: String,
        /// The configured regex.
        regex: String,
    },
    /// `mtls:uri:<regex>` but the certificate has no URI SAN.
    #[error("client certificate has no URI SAN, and --auth mtls:uri:<regex> takes the agent name from one")]
    NoUriSan,
    /// No URI SAN matches the `mtls:uri:<regex>` regex.
    #[error(
        "no URI SAN of the client certificate ({uris}) matches the agent name regex `{regex}` \
         (--auth mtls:uri:<regex>)"
    )]
    UriMismatch {
        /// The certificate's URI SANs, comma separated.
        uris: String,
        /// The configured regex.
        regex: String,
    },
    /// The regex matched but capture group 1 is empty or did not take part.
    #[error("capture group 1 of the agent name regex `{regex}` is empty for {field} \"{value}\"")]
    EmptyAgentName {
        /// Where the name was taken from (`subject`, `URI SAN`).
        field: &'static str,
        /// The text the regex matched.
        value: String,
        /// The configured regex.
        regex: String,
    },
    /// The extracted name is not a DNS-1123 label.
    #[error("agent name taken from the client certificate {field} is not a valid DNS-1123 label: {reason}")]
    InvalidAgentName {
        /// Where the name was taken from (`subject`, `URI SAN`).
        field: &'static str,
        /// Which rule it breaks.
        reason: InvalidAgentName,
    },
    /// A header-based method refused to read the identity header: the connection does not come
    /// from a trusted hop (the local sidecar or a configured proxy address).
    #[error(
        "the connection comes from {source_addr}, which is not a trusted hop (trusted: {trusted}): method \"{method}\" \
         reads the identity header {header} only from the local sidecar or a configured proxy, so it was not read"
    )]
    UntrustedHop {
        /// The method.
        method: &'static str,
        /// The identity header the method reads.
        header: String,
        /// The connection's source address, or `unknown`.
        source_addr: String,
        /// The trusted networks, comma separated.
        trusted: String,
    },
    /// The identity header is absent.
    #[error(
        "no {header} header: method \"{method}\" takes the agent identity from the header the mesh sidecar \
         forwards (is the agent's traffic going through the mesh with mTLS?)"
    )]
    MissingHeader {
        /// The method.
        method: &'static str,
        /// The header name.
        header: String,
    },
    /// The identity header appears more than once, or is not visible ASCII text.
    #[error("the {header} header is unusable: {reason}")]
    BadHeader {
        /// The header name.
        header: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The forwarded identity header does not name an agent (parse, SPIFFE ID or policy failure).
    #[error("the {header} header does not identify an agent: {source}")]
    MeshIdentity {
        /// The header name.
        header: String,
        /// What the mesh identity check said.
        #[source]
        source: mesh::IdentityError,
    },
    /// The header does not match the `header:<name>:<regex>` regex.
    #[error(
        "the {header} header value {value:?} does not match the agent name regex `{regex}` (--auth header:<name>:<regex>)"
    )]
    HeaderMismatch {
        /// The header name.
        header: String,
        /// The header value (shortened if long).
        value: String,
        /// The configured regex.
        regex: String,
    },
    /// The header regex matched, but the agent name it captured is empty or not a DNS-1123 label.
    #[error(
        "the agent name captured from the {header} header by the regex `{regex}` is not a valid DNS-1123 label: {reason}"
    )]
    HeaderAgentName {
        /// The header name.
        header: String,
        /// The configured regex.
        regex: String,
        /// Which rule the captured name breaks.
        reason: InvalidAgentName,
    },
    /// `spiffe:x509`: the verified client certificate carries no usable SPIFFE ID.
    #[error("method \"{method}\": the client X.509-SVID does not carry a usable SPIFFE ID: {source}")]
    SvidPeerId {
        /// The method.
        method: &'static str,
        /// What is wrong with the certificate.
        #[source]
        source: mesh::workload::PeerIdError,
    },
    /// A SPIFFE method's policy refused the caller's SPIFFE ID.
    #[error("method \"{method}\": the SPIFFE ID is not an agent: {source}")]
    SpiffePolicy {
        /// The method.
        method: &'static str,
        /// Which policy rule the ID breaks.
        #[source]
        source: mesh::PolicyError,
    },
    /// `spiffe:jwt`: the call carries no JWT-SVID.
    #[error(
        "no JWT-SVID: method \"{method}\" identifies agents by a JWT-SVID for audience \"{audience}\" from their \
         SPIFFE Workload API, sent in AuthRequest.credentials[\"{credential}\"] on Authenticate and in the \
         `{header}` metadata on later calls"
    )]
    MissingJwtSvid {
        /// The method.
        method: &'static str,
        /// The audience the principal expects.
        audience: String,
        /// The `AuthRequest.credentials` key.
        credential: &'static str,
        /// The metadata key.
        header: &'static str,
    },
    /// `spiffe-jwt:<regex>` (upstream's form): the JWT-SVID's subject does not match the regex.
    #[error(
        "the JWT-SVID's SPIFFE ID \"{subject}\" does not match the agent name regex `{regex}` (--auth spiffe-jwt:<regex>)"
    )]
    JwtSubjectMismatch {
        /// The verified subject.
        subject: String,
        /// The configured regex.
        regex: String,
    },
    /// `spiffe:jwt`: the JWT-SVID was refused.
    #[error("method \"{method}\": JWT-SVID refused: {source}")]
    JwtSvidRejected {
        /// The method.
        method: &'static str,
        /// Why.
        #[source]
        source: mesh::workload::JwtSvidRejection,
    },
    /// `spiffe:jwt` was built without a Workload API connection.
    #[error(
        "method \"{method}\" has no SPIFFE Workload API connection for its JWT bundles: the principal must build it \
         with AuthMethodSpec::connect_authenticator"
    )]
    WorkloadApiUnavailable {
        /// The method.
        method: &'static str,
    },
    /// The agent's name is the principal's namespace, which upstream reserves.
    #[error(
        "agent name \"{name}\" is the principal's namespace, which cannot be an agent name: give the \
         agent another name"
    )]
    ReservedAgentName {
        /// The rejected name.
        name: String,
    },
    /// `AuthRequest.method` names a method this principal does not accept.
    #[error("unknown authentication method \"{requested}\": this principal accepts {accepted}")]
    UnknownMethod {
        /// The requested method.
        requested: String,
        /// The configured methods, quoted and comma separated.
        accepted: String,
    },
    /// A protected call carried no token.
    #[error(
        "no access token: call /authapi.Authentication/Authenticate first, then send the access \
         token in the `authorization` metadata"
    )]
    MissingToken,
    /// The token is not a well-formed JWT of ours.
    #[error("{kind} token is malformed: {reason}")]
    MalformedToken {
        /// The kind of token expected.
        kind: TokenKind,
        /// What is wrong with it.
        reason: String,
    },
    /// The token is signed with an algorithm other than RS512.
    #[error("{kind} token is signed with {found}, but this principal accepts only RS512")]
    TokenAlgorithm {
        /// The kind of token expected.
        kind: TokenKind,
        /// The `alg` of the token header.
        found: String,
    },
    /// The signature does not verify with the principal's key.
    #[error(
        "{kind} token signature does not verify: it was signed with another key than this \
         principal's JWT signing key (authenticate again)"
    )]
    TokenSignature {
        /// The kind of token expected.
        kind: TokenKind,
    },
    /// Wrong `iss`.
    #[error("{kind} token issuer is \"{found}\", expected \"{expected}\"")]
    TokenIssuer {
        /// The kind of token expected.
        kind: TokenKind,
        /// The token's `iss`.
        found: String,
        /// This principal's issuer name.
        expected: String,
    },
    /// Wrong `aud`: e.g. a refresh token sent as an access token.
    #[error("{kind} token expected, but the token's audience is {found:?} instead of \"{expected}\"")]
    TokenAudience {
        /// The kind of token expected.
        kind: TokenKind,
        /// The token's `aud` values.
        found: Vec<String>,
        /// The audience of that kind.
        expected: String,
    },
    /// The token has expired.
    #[error("{kind} token expired at {expired_at} (now {now}): refresh it or authenticate again")]
    TokenExpired {
        /// The kind of token.
        kind: TokenKind,
        /// Its `exp`, RFC 3339.
        expired_at: String,
        /// The principal's clock, RFC 3339.
        now: String,
    },
    /// The token is not valid yet.
    #[error("{kind} token is not valid before {not_before} (now {now})")]
    TokenNotYetValid {
        /// The kind of token.
        kind: TokenKind,
        /// Its `nbf`, RFC 3339.
        not_before: String,
        /// The principal's clock, RFC 3339.
        now: String,
    },
    /// An access or refresh token without `exp`.
    #[error("{kind} token has no expiry (exp)")]
    TokenWithoutExpiry {
        /// The kind of token.
        kind: TokenKind,
    },
    /// The `sub` is not `{"clientID":…,"mode":…}` with a valid name and mode.
    #[error("{kind} token subject is invalid: {reason}")]
    TokenSubject {
        /// The kind of token.
        kind: TokenKind,
        /// What is wrong with it.
        reason: String,
    },
    /// The token has no transport binding (`cnf`), so it was not issued by our Authenticate.
    #[error(
        "{kind} token is not bound to a transport identity (no cnf claim): it was not issued by this \
         principal's Authenticate; authenticate again"
    )]
    TokenUnbound {
        /// The kind of token.
        kind: TokenKind,
    },
    /// The token names an authentication method this principal no longer accepts.
    #[error(
        "{kind} token was issued by authentication method \"{method}\", which this principal does \
         not accept; authenticate again"
    )]
    TokenMethod {
        /// The kind of token.
        kind: TokenKind,
        /// The `amr` method of the token.
        method: String,
    },
    /// The connection presents another transport identity than the token is bound to.
    #[error(
        "{kind} token is bound to {bound}, but this connection presents {presented}: a token is only \
         valid on a connection with the identity it was issued for"
    )]
    BindingMismatch {
        /// The kind of token.
        kind: TokenKind,
        /// The token's binding.
        bound: Binding,
        /// What the connection presents.
        presented: Binding,
    },
    /// The connection presents no transport identity at all.
    #[error("{kind} token is bound to {bound}, but this connection presents none ({reason})")]
    BindingAbsent {
        /// The kind of token.
        kind: TokenKind,
        /// The token's binding.
        bound: Binding,
        /// Why the connection has none.
        reason: Box<AuthError>,
    },
    /// The principal could not sign a token (a server fault, not the caller's).
    #[error("could not sign a session token: {reason}")]
    TokenIssue {
        /// What the signer said.
        reason: String,
    },
}

impl AuthError {
    /// The gRPC status for the caller: `Internal` for [`AuthError::TokenIssue`], else
    /// `Unauthenticated`, each with this error's message.
    #[must_use]
    pub fn to_status(&self) -> tonic::Status {
        match self {
            Self::TokenIssue { .. } => tonic::Status::internal(self.to_string()),
            _ => tonic::Status::unauthenticated(self.to_string()),
        }
    }
}

impl From<AuthError> for tonic::Status {
    fn from(error: AuthError) -> Self {
        error.to_status()
    }
}
