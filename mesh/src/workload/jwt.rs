//! JWT-SVIDs: fetched for an audience (agent side) and validated against the JWT bundles kept in
//! memory (principal side).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ::spiffe::{JwtBundleSet, JwtSource, JwtSvid, JwtSvidError, JwtVerificationErrorKind};

use super::{WorkloadError, first_sync, resolve_endpoint};
use crate::spiffe::SpiffeId;

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
        let build = JwtSource::builder().endpoint(&endpoint).initial_sync_timeout(initial_sync_timeout).build();
        let source = first_sync(
            &endpoint,
            "JWT bundles",
            initial_sync_timeout,
            build,
            |e| matches!(e, ::spiffe::JwtSourceError::InitialSyncTimeout),
            |endpoint, source| WorkloadError::JwtSource { endpoint, source },
        )
        .await?;
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
