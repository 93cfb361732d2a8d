//! SPIFFE Workload API sources (`standards/SPIFFE_Workload_API.md`): X.509-SVIDs for mTLS and
//! JWT-SVIDs with their JWT bundles, fetched from the local Workload API (a SPIRE agent, or the
//! Istio/ztunnel node agent) over its Unix socket.
//!
//! - [`X509Identity`] wraps a [`::spiffe::X509Source`] and builds rustls configs with
//!   `spiffe-rustls`: [`X509Identity::server_config`] for the principal (requires and verifies
//!   client X.509-SVIDs against the trust bundles) and [`X509Identity::client_config`] for the
//!   agent. [`peer_spiffe_id`] reads the verified peer's SPIFFE ID from its leaf certificate.
//! - [`JwtIdentity`] wraps a [`::spiffe::JwtSource`]: [`JwtIdentity::fetch_svid`] gets a JWT-SVID
//!   for an audience (agent side), [`JwtIdentity::validate`] checks one against the JWT bundles
//!   kept in memory (principal side, no I/O on the request path).
//!
//! # Rotation
//!
//! The Workload API streams a complete new set of SVIDs and bundles whenever they rotate; the
//! sources apply it in the background. The rustls configs built here do not hold a certificate:
//! `spiffe-rustls` installs a certificate *resolver* and a peer *verifier* that read the source's
//! current material on every handshake. A rotated SVID or bundle is therefore used by the **next**
//! handshake, while connections already established keep the keys they negotiated and are not
//! dropped (TLS never re-authenticates an established connection). Session resumption is disabled
//! on the server so a resumed handshake cannot skip the verifier.
//!
//! # Endpoint
//!
//! The endpoint is given explicitly (`unix:/run/spire/agent.sock`, `unix:///…`, `tcp://ip:port`)
//! or read from `SPIFFE_ENDPOINT_SOCKET`. The first synchronisation is bounded by a timeout: the
//! `spiffe` sources otherwise retry an absent socket forever.
//!
//! # Crypto
//!
//! ring only: `spiffe-rustls` is built with its `ring` feature and the JWT verification with
//! RustCrypto (`jwt-verify-rust-crypto`), so no `aws-lc-sys` is linked.

#[cfg(feature = "testing")]
pub mod testing;

mod jwt;
mod x509;

use std::time::Duration;

pub use jwt::{FetchedJwtSvid, JwtIdentity, JwtSvidRejection, VerifiedJwtSvid, verify_jwt_svid};
pub use x509::{PeerAuthorization, PeerIdError, UNRESOLVED_WARN_EVERY, X509Identity, peer_spiffe_id};

use crate::spiffe::SpiffeIdError;

/// The environment variable naming the Workload API endpoint.
pub const ENDPOINT_ENV: &str = "SPIFFE_ENDPOINT_SOCKET";

/// How long the first synchronisation with the Workload API may take unless configured.
pub const DEFAULT_INITIAL_SYNC_TIMEOUT: Duration = Duration::from_secs(15);

/// The ALPN protocol gRPC speaks, set on both configs.
const ALPN_H2: &[u8] = b"h2";

/// Why the Workload API material could not be obtained or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    /// No endpoint given and `SPIFFE_ENDPOINT_SOCKET` is unset or empty.
    #[error(
        "no SPIFFE Workload API endpoint: set {ENDPOINT_ENV} (e.g. unix:///run/spire/sockets/agent.sock) or give the \
         endpoint explicitly"
    )]
    NoEndpoint,
    /// The first synchronisation did not finish in time.
    #[error(
        "the SPIFFE Workload API at {endpoint} gave no {what} within {timeout:?}: is the SPIRE agent (or the mesh node \
         agent) running, is the socket mounted into this pod, and is this workload registered?"
    )]
    InitialSyncTimeout {
        /// The endpoint.
        endpoint: String,
        /// X.509-SVID or JWT bundles.
        what: &'static str,
        /// The timeout.
        timeout: Duration,
    },
    /// The X.509 source failed.
    #[error("SPIFFE Workload API at {endpoint}: X.509 source: {source}")]
    X509Source {
        /// The endpoint.
        endpoint: String,
        /// What the `spiffe` crate said.
        #[source]
        source: ::spiffe::X509SourceError,
    },
    /// The JWT source failed.
    #[error("SPIFFE Workload API at {endpoint}: JWT source: {source}")]
    JwtSource {
        /// The endpoint.
        endpoint: String,
        /// What the `spiffe` crate said.
        #[source]
        source: ::spiffe::JwtSourceError,
    },
    /// The rustls config could not be built from the source.
    #[error("cannot build the SPIFFE mTLS config: {0}")]
    Tls(#[from] spiffe_rustls::Error),
    /// The Workload API handed out an identity that is not a valid SPIFFE ID here.
    #[error("the Workload API SVID {id:?} is not a valid SPIFFE ID: {source}")]
    BadSpiffeId {
        /// The ID as received.
        id: String,
        /// Which rule it breaks.
        #[source]
        source: SpiffeIdError,
    },
}

/// The endpoint to use: `explicit`, else `SPIFFE_ENDPOINT_SOCKET`.
///
/// # Errors
///
/// [`WorkloadError::NoEndpoint`] when neither is set.
pub fn resolve_endpoint(explicit: Option<&str>) -> Result<String, WorkloadError> {
    if let Some(endpoint) = explicit.map(str::trim).filter(|e| !e.is_empty()) {
        return Ok(endpoint.to_owned());
    }
    std::env::var(ENDPOINT_ENV)
        .ok()
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .ok_or(WorkloadError::NoEndpoint)
}

/// Waits for a Workload API source's first synchronisation, at most `timeout`, and names the
/// endpoint and what was awaited when it fails. The outer timeout is a backstop: the builders'
/// own cover the synchronisation.
async fn first_sync<S, E>(
    endpoint: &str,
    what: &'static str,
    timeout: Duration,
    build: impl Future<Output = Result<S, E>>,
    is_timeout: impl FnOnce(&E) -> bool,
    wrap: impl FnOnce(String, E) -> WorkloadError,
) -> Result<S, WorkloadError> {
    let timed_out = || WorkloadError::InitialSyncTimeout { endpoint: endpoint.to_owned(), what, timeout };
    match tokio::time::timeout(timeout + Duration::from_secs(1), build).await {
        Err(_) => Err(timed_out()),
        Ok(Err(e)) if is_timeout(&e) => Err(timed_out()),
        Ok(Err(e)) => Err(wrap(endpoint.to_owned(), e)),
        Ok(Ok(source)) => Ok(source),
    }
}
