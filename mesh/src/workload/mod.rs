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

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ::spiffe::{JwtBundleSet, JwtSource, JwtSvid, JwtSvidError, JwtVerificationErrorKind, X509Source};
use rustls::{ClientConfig, ServerConfig};
use rustls_pki_types::CertificateDer;
use spiffe_rustls::{Authorizer, mtls_client, mtls_server};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::spiffe::{SpiffeId, SpiffeIdError, TrustDomain};

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

/// Why a peer certificate carries no usable SPIFFE ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerIdError {
    /// No certificate was presented.
    #[error("the peer presented no certificate")]
    NoCertificate,
    /// The leaf does not parse.
    #[error("the peer certificate cannot be parsed: {0}")]
    BadCertificate(String),
    /// An X.509-SVID has exactly one URI SAN; this one has none or several.
    #[error("an X.509-SVID carries exactly one URI SAN, the peer certificate has {0}")]
    UriSanCount(usize),
    /// The URI SAN is not a SPIFFE ID.
    #[error("the peer certificate URI SAN {uri:?} is not a SPIFFE ID: {source}")]
    NotSpiffeId {
        /// The URI SAN.
        uri: String,
        /// Which rule it breaks.
        #[source]
        source: SpiffeIdError,
    },
}

/// The SPIFFE ID of a TLS peer: the single URI SAN of its leaf certificate (`certs[0]`).
///
/// Call it on certificates the TLS layer verified (a server from
/// [`X509Identity::server_config`] verifies every client chain against the trust bundles).
///
/// # Errors
///
/// [`PeerIdError`]: no certificate, unparsable, not exactly one URI SAN, or not a SPIFFE ID.
pub fn peer_spiffe_id(certs: &[CertificateDer<'_>]) -> Result<SpiffeId, PeerIdError> {
    let leaf = certs.first().ok_or(PeerIdError::NoCertificate)?;
    let (_, cert) = X509Certificate::from_der(leaf).map_err(|e| PeerIdError::BadCertificate(e.to_string()))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| PeerIdError::BadCertificate(format!("subject alternative name extension: {e}")))?;
    let uris: Vec<&str> = san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(uri) => Some(*uri),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    match uris.as_slice() {
        [uri] => SpiffeId::parse(uri).map_err(|source| PeerIdError::NotSpiffeId { uri: (*uri).to_owned(), source }),
        other => Err(PeerIdError::UriSanCount(other.len())),
    }
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

/// Which peer SPIFFE IDs a TLS config accepts once the chain verified against the bundles.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PeerAuthorization {
    /// Any ID whose chain verifies against a bundle the source holds. The principal uses this and
    /// leaves the decision to the auth layer's [`crate::SpiffePolicy`], which explains a refusal
    /// in a gRPC status instead of a bare TLS alert.
    #[default]
    Any,
    /// Only IDs in these trust domains.
    TrustDomains(Vec<TrustDomain>),
    /// Only these IDs (e.g. the agent pinning the principal's SPIFFE ID).
    Exact(Vec<SpiffeId>),
}

impl PeerAuthorization {
    fn authorizer(&self) -> Arc<dyn Authorizer> {
        match self {
            Self::Any => Arc::new(spiffe_rustls::authorizer::Any),
            Self::TrustDomains(domains) => {
                let domains: Vec<String> = domains.iter().map(ToString::to_string).collect();
                Arc::new(move |peer: &::spiffe::SpiffeId| domains.iter().any(|d| d == peer.trust_domain().as_str()))
            }
            Self::Exact(ids) => {
                let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
                Arc::new(move |peer: &::spiffe::SpiffeId| ids.iter().any(|id| *id == peer.to_string()))
            }
        }
    }
}

// === X509Identity ===

/// This workload's X.509-SVID and trust bundles, kept current by the Workload API stream.
///
/// Cloning shares the source.
#[derive(Clone)]
pub struct X509Identity {
    source: X509Source,
    endpoint: String,
}

impl fmt::Debug for X509Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("X509Identity")
            .field("endpoint", &self.endpoint)
            .field("spiffe_id", &self.source.try_svid().map(|s| s.spiffe_id().to_string()))
            .finish()
    }
}

impl X509Identity {
    /// Connects to the Workload API at `endpoint` (or `SPIFFE_ENDPOINT_SOCKET` when `None`) and
    /// waits at most `initial_sync_timeout` for the first X.509-SVID.
    ///
    /// # Errors
    ///
    /// [`WorkloadError::NoEndpoint`], [`WorkloadError::InitialSyncTimeout`] or
    /// [`WorkloadError::X509Source`] (bad endpoint syntax, no usable SVID).
    pub async fn connect(endpoint: Option<&str>, initial_sync_timeout: Duration) -> Result<Self, WorkloadError> {
        let endpoint = resolve_endpoint(endpoint)?;
        let timed_out = || WorkloadError::InitialSyncTimeout {
            endpoint: endpoint.clone(),
            what: "X.509-SVID",
            timeout: initial_sync_timeout,
        };
        let build = X509Source::builder().endpoint(&endpoint).initial_sync_timeout(initial_sync_timeout).build();
        // The outer timeout is a backstop: the builder's own covers the synchronisation.
        let source = match tokio::time::timeout(initial_sync_timeout + Duration::from_secs(1), build).await {
            Err(_) => return Err(timed_out()),
            Ok(Err(::spiffe::X509SourceError::InitialSyncTimeout)) => return Err(timed_out()),
            Ok(Err(source)) => return Err(WorkloadError::X509Source { endpoint, source }),
            Ok(Ok(source)) => source,
        };
        let identity = Self { source, endpoint };
        let id = identity.spiffe_id()?;
        tracing::info!(endpoint = %identity.endpoint, spiffe_id = %id, "SPIFFE X.509-SVID source ready");
        Ok(identity)
    }

    /// The endpoint this source reads.
    #[must_use]
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The underlying `spiffe` source (its `updated()` stream reports rotations).
    #[must_use]
    pub fn source(&self) -> &X509Source {
        &self.source
    }

    /// This workload's current SPIFFE ID.
    ///
    /// # Errors
    ///
    /// [`WorkloadError::X509Source`] when the source holds no SVID (closed or withdrawn), or
    /// [`WorkloadError::BadSpiffeId`].
    pub fn spiffe_id(&self) -> Result<SpiffeId, WorkloadError> {
        let svid = self.svid()?;
        let id = svid.spiffe_id().to_string();
        SpiffeId::parse(&id).map_err(|source| WorkloadError::BadSpiffeId { id, source })
    }

    /// The current X.509-SVID.
    ///
    /// # Errors
    ///
    /// [`WorkloadError::X509Source`] when the source holds no SVID.
    pub fn svid(&self) -> Result<Arc<::spiffe::X509Svid>, WorkloadError> {
        self.source.svid().map_err(|source| WorkloadError::X509Source { endpoint: self.endpoint.clone(), source })
    }

    /// The current X.509 trust bundles, by trust domain (local and federated).
    ///
    /// # Errors
    ///
    /// [`WorkloadError::X509Source`] when the source holds no material.
    pub fn bundle_set(&self) -> Result<Arc<::spiffe::X509BundleSet>, WorkloadError> {
        self.source.bundle_set().map_err(|source| WorkloadError::X509Source { endpoint: self.endpoint.clone(), source })
    }

    /// The principal's rustls server config: presents the current SVID, **requires** a client
    /// X.509-SVID whose chain verifies against the bundle of its trust domain and whose ID
    /// `peers` accepts, ALPN `h2`. Read the client's ID from the connection's peer certificates
    /// with [`peer_spiffe_id`]. Rotation: see the module documentation.
    ///
    /// # Errors
    ///
    /// [`WorkloadError::Tls`] when the source holds no SVID.
    pub fn server_config(&self, peers: &PeerAuthorization) -> Result<Arc<ServerConfig>, WorkloadError> {
        let config =
            mtls_server(self.source.clone()).authorize(peers.authorizer()).with_alpn_protocols([ALPN_H2]).build()?;
        Ok(Arc::new(config))
    }

    /// The agent's rustls client config: presents the current SVID as client certificate and
    /// verifies the server's X.509-SVID against the bundles (the SPIFFE ID, not the host name, is
    /// the server's identity), accepting the IDs `peers` accepts; ALPN `h2`.
    ///
    /// # Errors
    ///
    /// [`WorkloadError::Tls`] when the source holds no SVID.
    pub fn client_config(&self, peers: &PeerAuthorization) -> Result<Arc<ClientConfig>, WorkloadError> {
        let config =
            mtls_client(self.source.clone()).authorize(peers.authorizer()).with_alpn_protocols([ALPN_H2]).build()?;
        Ok(Arc::new(config))
    }

    /// Stops the background stream.
    pub async fn shutdown(&self) {
        self.source.shutdown().await;
    }
}

// === JwtIdentity ===

/// A JWT-SVID fetched from the Workload API.
#[derive(Clone)]
pub struct FetchedJwtSvid {
    token: String,
    spiffe_id: SpiffeId,
    expires_at: SystemTime,
}

impl fmt::Debug for FetchedJwtSvid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a bearer credential: never print it.
        f.debug_struct("FetchedJwtSvid")
            .field("spiffe_id", &self.spiffe_id)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

impl FetchedJwtSvid {
    /// The compact JWS to send.
    #[must_use]
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Its subject.
    #[must_use]
    pub fn spiffe_id(&self) -> &SpiffeId {
        &self.spiffe_id
    }

    /// Its expiry (`exp`): fetch a new one before then.
    #[must_use]
    pub fn expires_at(&self) -> SystemTime {
        self.expires_at
    }
}

/// A JWT-SVID that verified: its subject and expiry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedJwtSvid {
    spiffe_id: SpiffeId,
    expires_at: SystemTime,
}

impl VerifiedJwtSvid {
    /// The subject (`sub`), the caller's SPIFFE ID.
    #[must_use]
    pub fn spiffe_id(&self) -> &SpiffeId {
        &self.spiffe_id
    }

    /// The expiry (`exp`).
    #[must_use]
    pub fn expires_at(&self) -> SystemTime {
        self.expires_at
    }
}

/// Why a JWT-SVID was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JwtSvidRejection {
    /// Not a JWT-SVID: structure, header, claims, or a `sub` that is not a SPIFFE ID.
    #[error("the token is not a well-formed JWT-SVID: {0}")]
    Malformed(String),
    /// `exp` has passed (or `nbf` is in the future).
    #[error("the JWT-SVID has expired or is not valid yet: {0}")]
    Expired(String),
    /// The audience is not ours.
    #[error("the JWT-SVID audience does not include {expected:?}: {detail}")]
    WrongAudience {
        /// The audience expected.
        expected: String,
        /// The verifier's message.
        detail: String,
    },
    /// No JWT bundle for the subject's trust domain.
    #[error("no JWT bundle for trust domain {0:?}: the Workload API does not federate with it")]
    UnknownTrustDomain(String),
    /// The signing key is not in the bundle, or the signature does not verify.
    #[error(
        "the JWT-SVID signature does not verify with the JWT bundle of its trust domain (signed by a key not in the \
         bundle): {0}"
    )]
    BadSignature(String),
    /// The in-memory bundles are unavailable (source closed or never synced).
    #[error("no JWT bundles available from the Workload API: {0}")]
    NoBundles(String),
}

/// Verifies `token` against `bundles` for `audience` (signature with the authority of the
/// subject's trust domain named by `kid`, `exp`, `nbf`, audience; no clock leeway).
///
/// # Errors
///
/// [`JwtSvidRejection`] saying what failed.
pub fn verify_jwt_svid(
    token: &str,
    bundles: &JwtBundleSet,
    audience: &str,
) -> Result<VerifiedJwtSvid, JwtSvidRejection> {
    let svid = JwtSvid::parse_and_validate(token, bundles, &[audience]).map_err(|e| reject(e, audience))?;
    let id = svid.spiffe_id().to_string();
    let spiffe_id = SpiffeId::parse(&id).map_err(|e| JwtSvidRejection::Malformed(format!("subject {id:?}: {e}")))?;
    Ok(VerifiedJwtSvid { spiffe_id, expires_at: unix_time(svid.expiry().unix_timestamp()) })
}

/// A Unix timestamp (`exp`) as a `SystemTime`; times before the epoch read as the epoch.
fn unix_time(seconds: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

fn reject(error: JwtSvidError, audience: &str) -> JwtSvidRejection {
    let detail = error.to_string();
    match &error {
        JwtSvidError::BundleNotFound(td) => JwtSvidRejection::UnknownTrustDomain(td.to_string()),
        JwtSvidError::AuthorityNotFound(kid) => {
            JwtSvidRejection::BadSignature(format!("no authority with key id {kid:?} in the bundle"))
        }
        JwtSvidError::InvalidAudience(..) => JwtSvidRejection::WrongAudience { expected: audience.to_owned(), detail },
        JwtSvidError::InvalidToken(e) => match e.kind() {
            JwtVerificationErrorKind::Expired | JwtVerificationErrorKind::NotYetValid => {
                JwtSvidRejection::Expired(detail)
            }
            JwtVerificationErrorKind::AudienceMismatch => {
                JwtSvidRejection::WrongAudience { expected: audience.to_owned(), detail }
            }
            JwtVerificationErrorKind::InvalidSignature => JwtSvidRejection::BadSignature(detail),
            _ => JwtSvidRejection::Malformed(detail),
        },
        JwtSvidError::BundleSourceError(_) => JwtSvidRejection::NoBundles(detail),
        _ => JwtSvidRejection::Malformed(detail),
    }
}

/// JWT-SVIDs and JWT bundles from the Workload API; the bundles are streamed and kept in memory.
///
/// Cloning shares the source.
#[derive(Clone)]
pub struct JwtIdentity {
    source: JwtSource,
    endpoint: String,
    validated: Arc<ValidatedCache>,
}

/// JWT-SVIDs that validated, by token, with the bundle set and audience they validated against:
/// an agent presents the same JWT-SVID on every call until it refreshes it, and an ES256
/// verification costs about half a millisecond. A hit needs the very same bundle set (any bundle
/// update, e.g. a removed key, invalidates every entry), the same audience and an unexpired
/// token. Bounded: when full, expired entries go, and if none have, the cache starts over.
#[derive(Default)]
struct ValidatedCache {
    entries: std::sync::Mutex<std::collections::HashMap<String, Validated>>,
}

/// What a cached JWT-SVID validated against (bundle set, audience) and what it gave.
type Validated = (Arc<JwtBundleSet>, String, VerifiedJwtSvid);

impl ValidatedCache {
    const CAPACITY: usize = 16_384;

    fn get(&self, token: &str, bundles: &Arc<JwtBundleSet>, audience: &str) -> Option<VerifiedJwtSvid> {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (b, a, verified) = entries.get(token)?;
        (Arc::ptr_eq(b, bundles) && a == audience && verified.expires_at > SystemTime::now()).then(|| verified.clone())
    }

    fn insert(&self, token: &str, bundles: Arc<JwtBundleSet>, audience: &str, verified: VerifiedJwtSvid) {
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.len() >= Self::CAPACITY {
            let now = SystemTime::now();
            entries.retain(|_, (_, _, v)| v.expires_at > now);
            if entries.len() >= Self::CAPACITY {
                entries.clear();
            }
        }
        entries.insert(token.to_owned(), (bundles, audience.to_owned(), verified));
    }
}

impl fmt::Debug for JwtIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtIdentity").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

impl JwtIdentity {
    /// Connects to the Workload API at `endpoint` (or `SPIFFE_ENDPOINT_SOCKET` when `None`) and
    /// waits at most `initial_sync_timeout` for the first JWT bundles.
    ///
    /// # Errors
    ///
    /// [`WorkloadError::NoEndpoint`], [`WorkloadError::InitialSyncTimeout`] or
    /// [`WorkloadError::JwtSource`].
    pub async fn connect(endpoint: Option<&str>, initial_sync_timeout: Duration) -> Result<Self, WorkloadError> {
        let endpoint = resolve_endpoint(endpoint)?;
        let timed_out = || WorkloadError::InitialSyncTimeout {
            endpoint: endpoint.clone(),
            what: "JWT bundles",
            timeout: initial_sync_timeout,
        };
        let build = JwtSource::builder().endpoint(&endpoint).initial_sync_timeout(initial_sync_timeout).build();
        let source = match tokio::time::timeout(initial_sync_timeout + Duration::from_secs(1), build).await {
            Err(_) => return Err(timed_out()),
            Ok(Err(::spiffe::JwtSourceError::InitialSyncTimeout)) => return Err(timed_out()),
            Ok(Err(source)) => return Err(WorkloadError::JwtSource { endpoint, source }),
            Ok(Ok(source)) => source,
        };
        tracing::info!(%endpoint, "SPIFFE JWT bundle source ready");
        Ok(Self { source, endpoint, validated: Arc::default() })
    }

    /// The endpoint this source reads.
    #[must_use]
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The underlying `spiffe` source (its `updated()` stream reports bundle changes).
    #[must_use]
    pub fn source(&self) -> &JwtSource {
        &self.source
    }

    /// Fetches a JWT-SVID for `audience` (agent side; one Workload API call).
    ///
    /// # Errors
    ///
    /// [`WorkloadError::JwtSource`] or [`WorkloadError::BadSpiffeId`].
    pub async fn fetch_svid(&self, audience: &str) -> Result<FetchedJwtSvid, WorkloadError> {
        let svid = self
            .source
            .fetch_jwt_svid([audience])
            .await
            .map_err(|source| WorkloadError::JwtSource { endpoint: self.endpoint.clone(), source })?;
        let id = svid.spiffe_id().to_string();
        let spiffe_id = SpiffeId::parse(&id).map_err(|source| WorkloadError::BadSpiffeId { id, source })?;
        Ok(FetchedJwtSvid {
            token: svid.token().to_owned(),
            spiffe_id,
            expires_at: unix_time(svid.expiry().unix_timestamp()),
        })
    }

    /// The current JWT bundles, by trust domain.
    ///
    /// # Errors
    ///
    /// [`WorkloadError::JwtSource`] when the source holds none (closed).
    pub fn bundle_set(&self) -> Result<Arc<JwtBundleSet>, WorkloadError> {
        self.source.bundle_set().map_err(|source| WorkloadError::JwtSource { endpoint: self.endpoint.clone(), source })
    }

    /// Verifies a JWT-SVID presented by a peer against the in-memory bundles (no I/O).
    ///
    /// # Errors
    ///
    /// [`JwtSvidRejection`] saying what failed.
    pub fn validate(&self, token: &str, audience: &str) -> Result<VerifiedJwtSvid, JwtSvidRejection> {
        let bundles = self.bundle_set().map_err(|e| JwtSvidRejection::NoBundles(e.to_string()))?;
        if let Some(verified) = self.validated.get(token, &bundles, audience) {
            return Ok(verified);
        }
        let verified = verify_jwt_svid(token, &bundles, audience)?;
        self.validated.insert(token, bundles, audience, verified.clone());
        Ok(verified)
    }

    /// Stops the background stream.
    pub async fn shutdown(&self) {
        self.source.shutdown().await;
    }
}
