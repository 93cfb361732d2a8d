//! Why an `--auth` value was refused: every error names the value and what to write instead.

use mesh::workload::WorkloadError;

use super::{DEFAULT_SUBJECT_REGEX, XFCC_KEYS};

/// Examples the error messages offer.
const XFCC_EXAMPLE: &str = "xfcc:profile=istio;trust-domain=cluster.local;pattern=/ns/{namespace}/sa/{agent}";
const HEADER_EXAMPLE: &str = "header:x-forwarded-client-cert:^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)";

/// Why an `--auth` value was refused, or does not fit the listener.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// Nothing given.
    #[error("--auth is empty: give an authentication method, e.g. --auth 'mtls:subject:{DEFAULT_SUBJECT_REGEX}'")]
    Empty,
    /// No `:` after the method.
    #[error("--auth \"{0}\" is not <method>:<config>, e.g. --auth 'mtls:subject:{DEFAULT_SUBJECT_REGEX}'")]
    MissingConfig(String),
    /// A method neither upstream nor this build knows.
    #[error(
        "--auth method \"{0}\" is unknown: use mtls:subject:<regex>, mtls:uri:<regex>, xfcc:[key=value;...], \
         header:<header-name>:<regex>, spiffe:x509[:key=value;...], spiffe:jwt[:key=value;...] or upstream's \
         spiffe-jwt:<regex> (upstream also knows userpass)"
    )]
    UnknownMethod(String),
    /// A method that is recognised but not implemented yet.
    #[error("--auth method \"{method}\" is recognised but not supported yet: {reason}")]
    NotSupportedYet {
        /// The method as written (`spiffe:x509`, `userpass`, …).
        method: String,
        /// Why, and what to use meanwhile.
        reason: &'static str,
    },
    /// An empty agent name regex.
    #[error(
        "--auth \"{spec}\" has an empty agent name regex: give one whose capture group 1 is the agent \
         name, e.g. mtls:subject:{DEFAULT_SUBJECT_REGEX}"
    )]
    EmptyRegex {
        /// The `--auth` value.
        spec: String,
    },
    /// The regex does not compile.
    #[error("--auth \"{spec}\": the agent name regex does not compile: {source}")]
    InvalidRegex {
        /// The `--auth` value.
        spec: String,
        /// The compiler's complaint.
        #[source]
        source: regex::Error,
    },
    /// The regex has no capture group for the agent name.
    #[error("--auth \"{spec}\": the agent name regex has no capture group; group 1 must capture the agent name")]
    NoCaptureGroup {
        /// The `--auth` value.
        spec: String,
    },
    /// `header:` without a header name or without a regex.
    #[error("--auth \"{spec}\" is not header:<header-name>:<regex>, e.g. --auth '{HEADER_EXAMPLE}'")]
    HeaderSyntax {
        /// The `--auth` value.
        spec: String,
    },
    /// Not a valid HTTP header name.
    #[error("--auth \"{spec}\": \"{name}\" is not a valid header name")]
    BadHeaderName {
        /// The `--auth` value.
        spec: String,
        /// The name as given.
        name: String,
    },
    /// An `xfcc:` item that is not `key=value`, or a key given twice.
    #[error(
        "--auth \"{spec}\": {reason}; the syntax is xfcc:[key=value;...] with keys {XFCC_KEYS}, \
         e.g. --auth '{XFCC_EXAMPLE}'"
    )]
    XfccSyntax {
        /// The `--auth` value.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// An `xfcc:` key that does not exist.
    #[error("--auth \"{spec}\": unknown xfcc key \"{key}\"; valid keys: {XFCC_KEYS}")]
    XfccUnknownKey {
        /// The `--auth` value.
        spec: String,
        /// The unknown key.
        key: String,
    },
    /// An `xfcc:` value that is not valid for its key.
    #[error("--auth \"{spec}\": xfcc key {key}: {reason}")]
    XfccValue {
        /// The `--auth` value.
        spec: String,
        /// The key.
        key: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
    /// Trusted hops set twice (in `xfcc:` and by the caller), or for a method that reads no header.
    #[error("trusted hops cannot be set for --auth \"{spec}\": {reason}")]
    TrustedHopsConflict {
        /// The `--auth` value.
        spec: String,
        /// Why.
        reason: &'static str,
    },
    /// A `spiffe:` item that is not `key=value`, a key given twice, or an unknown key.
    #[error("--auth \"{spec}\": {reason}; the syntax is spiffe:{kind}[:key=value;...] with keys {keys}")]
    SpiffeSyntax {
        /// The `--auth` value.
        spec: String,
        /// `x509` or `jwt`.
        kind: &'static str,
        /// What is wrong.
        reason: String,
        /// The valid keys.
        keys: &'static str,
    },
    /// A `spiffe:` value that is not valid for its key.
    #[error("--auth \"{spec}\": spiffe key {key}: {reason}")]
    SpiffeValue {
        /// The `--auth` value.
        spec: String,
        /// The key.
        key: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
    /// A JWT session binding set on a method that is not `spiffe:jwt` or `spiffe-jwt:`.
    #[error("--auth \"{spec}\": a JWT-SVID session binding applies to spiffe:jwt and spiffe-jwt:<regex> only")]
    NotJwt {
        /// The `--auth` value.
        spec: String,
    },
    /// The SPIFFE Workload API could not be reached for a `spiffe:` method.
    #[error("--auth \"{spec}\": {source}")]
    WorkloadApi {
        /// The `--auth` value.
        spec: String,
        /// What failed.
        #[source]
        source: Box<WorkloadError>,
    },
    /// A header-based method on a TLS listener.
    #[error(
        "--auth \"{spec}\" reads the agent identity a mesh sidecar forwards, so the principal must serve \
         plaintext gRPC behind the sidecar (--insecure-plaintext): TLS and client certificates are the \
         sidecar's job"
    )]
    PlaintextRequired {
        /// The `--auth` value.
        spec: String,
    },
    /// `mtls` on a plaintext listener.
    #[error(
        "--auth \"{spec}\" identifies agents by their TLS client certificate, which a plaintext listener \
         (--insecure-plaintext) never sees: serve TLS, or behind a mesh sidecar use --auth xfcc: or \
         header:<name>:<regex>"
    )]
    TlsRequired {
        /// The `--auth` value.
        spec: String,
    },
    /// Trusted hops that trust every source (a `/0` network) or none.
    #[error(
        "--auth \"{spec}\": trusted hops ({trusted}) {reason}; header-based methods believe the identity header only \
         from the sidecar (loopback, the default) or listed proxy addresses (upstream trusts any caller that \
         reaches the plaintext port; this principal does not)"
    )]
    UnrestrictedTrust {
        /// The `--auth` value.
        spec: String,
        /// The trusted networks.
        trusted: String,
        /// What is wrong with them.
        reason: &'static str,
    },
}
