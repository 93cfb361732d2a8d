//! This workload's X.509-SVID and bundles, the rustls configs built on them, and the SPIFFE ID
//! of a verified TLS peer.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::spiffe::X509Source;
use rustls::{ClientConfig, ServerConfig};
use rustls_pki_types::CertificateDer;
use spiffe_rustls::{Authorizer, mtls_client, mtls_server};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{ALPN_H2, WorkloadError, first_sync, resolve_endpoint};
use crate::spiffe::{SpiffeId, SpiffeIdError, TrustDomain};

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
        let build = X509Source::builder().endpoint(&endpoint).initial_sync_timeout(initial_sync_timeout).build();
        let source = first_sync(
            &endpoint,
            "X.509-SVID",
            initial_sync_timeout,
            build,
            |e| matches!(e, ::spiffe::X509SourceError::InitialSyncTimeout),
            |endpoint, source| WorkloadError::X509Source { endpoint, source },
        )
        .await?;
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
        let mut config =
            mtls_server(self.source.clone()).authorize(peers.authorizer()).with_alpn_protocols([ALPN_H2]).build()?;
        config.cert_resolver = self.warn_when_unresolved(config.cert_resolver.clone());
        Ok(Arc::new(config))
    }

    /// `inner` (a resolver presenting this source's SVID), saying at WARN when it has nothing to
    /// present: the server's own identity is gone (the Workload API withdrew it, e.g. SPIRE's "no
    /// identity issued", or it expired), so every new handshake fails, which the failed
    /// handshakes alone only show at DEBUG and from the client's side. At most one warning per
    /// [`UNRESOLVED_WARN_EVERY`] with the handshakes refused since; one INFO when it is back.
    #[must_use]
    pub fn warn_when_unresolved(
        &self,
        inner: Arc<dyn rustls::server::ResolvesServerCert>,
    ) -> Arc<dyn rustls::server::ResolvesServerCert> {
        Arc::new(WarnWhenUnresolved {
            inner,
            source: self.source.clone(),
            endpoint: self.endpoint.clone(),
            down: std::sync::atomic::AtomicBool::new(false),
            outage: std::sync::Mutex::new(None),
        })
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

/// How often a server without an SVID to present says so.
pub const UNRESOLVED_WARN_EVERY: Duration = Duration::from_secs(10);

/// See [`X509Identity::warn_when_unresolved`].
struct WarnWhenUnresolved {
    inner: Arc<dyn rustls::server::ResolvesServerCert>,
    source: X509Source,
    endpoint: String,
    /// Whether `outage` is set: the handshakes that succeed take no lock.
    down: std::sync::atomic::AtomicBool,
    outage: std::sync::Mutex<Option<Outage>>,
}

/// Since when the server has had nothing to present, and what it has said about it.
struct Outage {
    since: std::time::Instant,
    warned: std::time::Instant,
    refused: u64,
    refused_since_warned: u64,
}

impl fmt::Debug for WarnWhenUnresolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WarnWhenUnresolved").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

impl WarnWhenUnresolved {
    /// Why the source has no SVID to present, as far as it says.
    fn reason(&self) -> String {
        match self.source.state().svid() {
            Err(e) => e.to_string(),
            Ok(_) => "the latest material from the Workload API is not usable for TLS yet".to_owned(),
        }
    }

    fn unresolved(&self) {
        let now = std::time::Instant::now();
        let mut outage = self.outage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.down.store(true, std::sync::atomic::Ordering::Release);
        let first = outage.is_none();
        let o = outage.get_or_insert(Outage { since: now, warned: now, refused: 0, refused_since_warned: 0 });
        o.refused += 1;
        o.refused_since_warned += 1;
        if !first && now.duration_since(o.warned) < UNRESOLVED_WARN_EVERY {
            return;
        }
        o.warned = now;
        let refused = std::mem::take(&mut o.refused_since_warned);
        tracing::warn!(
            endpoint = %self.endpoint,
            reason = %self.reason(),
            refused,
            for_secs = now.duration_since(o.since).as_secs(),
            "no X.509-SVID to present: new TLS handshakes are refused until the Workload API issues one \
             (with SPIRE: is SPIRE Agent up, and does this workload still match its registration entry?)"
        );
    }

    fn resolved(&self) {
        // A load first: a successful handshake (the usual case) writes nothing shared.
        if !self.down.load(std::sync::atomic::Ordering::Acquire)
            || !self.down.swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        let mut outage = self.outage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(o) = outage.take() {
            tracing::info!(
                endpoint = %self.endpoint,
                refused = o.refused,
                after_ms = u64::try_from(o.since.elapsed().as_millis()).unwrap_or(u64::MAX),
                "an X.509-SVID to present again: new TLS handshakes succeed"
            );
        }
    }
}

impl rustls::server::ResolvesServerCert for WarnWhenUnresolved {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let resolved = self.inner.resolve(hello);
        if resolved.is_some() {
            self.resolved();
        } else {
            self.unresolved();
        }
        resolved
    }

    fn only_raw_public_keys(&self) -> bool {
        self.inner.only_raw_public_keys()
    }
}
