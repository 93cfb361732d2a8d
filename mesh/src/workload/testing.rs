//! A fake SPIFFE Workload API for tests (feature `testing`): a tonic server built from the
//! Workload API protobuf, on a Unix socket in a temporary directory, serving rcgen-made
//! X.509-SVIDs and bundles and jsonwebtoken-signed JWT-SVIDs with their JWT bundles.
//!
//! It follows the spec where the client can tell: every call must carry `workload.spiffe.io: true`
//! (else `InvalidArgument`), `FetchJWTSVID` needs an audience, and `FetchX509SVID` is a stream on
//! which [`FakeWorkloadApi::rotate_x509`] pushes a complete new response, as an agent does on
//! rotation.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use mesh::workload::testing::{FakeWorkloadApi, JwtMaterial, TestCa, TestJwtAuthority, X509Material};
//! let ca = TestCa::new("cluster.local")?;
//! let signer = TestJwtAuthority::new("cluster.local", "key-1")?;
//! let api = FakeWorkloadApi::start(
//!     Some(X509Material::new(&ca, "spiffe://cluster.local/ns/agents/sa/agent-1")?),
//!     Some(JwtMaterial::new("spiffe://cluster.local/ns/agents/sa/agent-1", signer)),
//! )
//! .await?;
//! let source = mesh::workload::X509Identity::connect(Some(&api.endpoint()), std::time::Duration::from_secs(5)).await?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{UnixListenerStream, WatchStream};
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Response, Status};

/// The Workload API messages and tonic server generated from `workload.proto`.
#[allow(missing_docs, missing_debug_implementations, clippy::all, clippy::pedantic)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/_.rs"));
}

use pb::spiffe_workload_api_server::{SpiffeWorkloadApi, SpiffeWorkloadApiServer};

/// Why test material or the fake server could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestingError {
    /// rcgen refused a certificate or key.
    #[error("rcgen: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// jsonwebtoken refused a key or token.
    #[error("jsonwebtoken: {0}")]
    Jwt(#[from] jsonwebtoken::errors::Error),
    /// The socket or its directory could not be made.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A key is not of the expected kind.
    #[error("{0}")]
    Key(&'static str),
}

// === X.509 material ===

/// An X.509 authority (self-signed CA) for one trust domain.
pub struct TestCa {
    trust_domain: String,
    issuer: Issuer<'static, KeyPair>,
    der: Vec<u8>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").field("trust_domain", &self.trust_domain).finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new CA for `trust_domain` (`spiffe://<td>` URI SAN, CA:true, keyCertSign).
    ///
    /// # Errors
    ///
    /// [`TestingError::Rcgen`].
    pub fn new(trust_domain: &str) -> Result<Self, TestingError> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, format!("{trust_domain} test CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.subject_alt_names = vec![SanType::URI(format!("spiffe://{trust_domain}").try_into()?)];
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self { trust_domain: trust_domain.to_owned(), der: cert.der().to_vec(), issuer: Issuer::new(params, key) })
    }

    /// The trust domain.
    #[must_use]
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// The CA certificate (DER): the trust bundle.
    #[must_use]
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// Issues an X.509-SVID for `spiffe_id` (any string: tests may issue bad IDs): one URI SAN,
    /// explicit CA:false, digitalSignature, serverAuth and clientAuth, valid for an hour.
    ///
    /// # Errors
    ///
    /// [`TestingError::Rcgen`].
    pub fn issue(&self, spiffe_id: &str) -> Result<TestSvid, TestingError> {
        let now = SystemTime::now();
        self.issue_valid(spiffe_id, now - Duration::from_secs(60), now + Duration::from_secs(3600))
    }

    /// As [`Self::issue`], valid from `not_before` to `not_after` (e.g. already expired).
    ///
    /// # Errors
    ///
    /// [`TestingError::Rcgen`].
    pub fn issue_valid(
        &self,
        spiffe_id: &str,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<TestSvid, TestingError> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, "svid");
        params.subject_alt_names = vec![SanType::URI(spiffe_id.try_into()?)];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(TestSvid { spiffe_id: spiffe_id.to_owned(), cert_der: cert.der().to_vec(), key_der: key.serialize_der() })
    }
}

/// An X.509-SVID: leaf certificate and PKCS#8 key (DER).
#[derive(Clone)]
pub struct TestSvid {
    /// The SPIFFE ID in its URI SAN.
    pub spiffe_id: String,
    /// The leaf certificate.
    pub cert_der: Vec<u8>,
    /// Its PKCS#8 private key.
    pub key_der: Vec<u8>,
}

impl std::fmt::Debug for TestSvid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestSvid").field("spiffe_id", &self.spiffe_id).finish_non_exhaustive()
    }
}

/// What `FetchX509SVID` serves: one SVID, its trust domain's bundle and federated bundles.
#[derive(Clone, Debug)]
pub struct X509Material {
    /// The workload's SVID.
    pub svid: TestSvid,
    /// The CA certificates (DER) of the SVID's own trust domain.
    pub bundle: Vec<Vec<u8>>,
    /// Other trust domains' CA certificates, by trust domain name.
    pub federated: BTreeMap<String, Vec<Vec<u8>>>,
}

impl X509Material {
    /// An SVID for `spiffe_id` issued by `ca`, with `ca` as the bundle.
    ///
    /// # Errors
    ///
    /// [`TestingError::Rcgen`].
    pub fn new(ca: &TestCa, spiffe_id: &str) -> Result<Self, TestingError> {
        Ok(Self { svid: ca.issue(spiffe_id)?, bundle: vec![ca.der.clone()], federated: BTreeMap::new() })
    }

    /// Also trusts `ca`'s trust domain (federation).
    #[must_use]
    pub fn federate(mut self, ca: &TestCa) -> Self {
        self.federated.entry(ca.trust_domain.clone()).or_default().push(ca.der.clone());
        self
    }

    fn response(&self) -> pb::X509svidResponse {
        pb::X509svidResponse {
            svids: vec![pb::X509svid {
                spiffe_id: self.svid.spiffe_id.clone(),
                x509_svid: self.svid.cert_der.clone(),
                x509_svid_key: self.svid.key_der.clone(),
                bundle: self.bundle.concat(),
                hint: String::new(),
            }],
            crl: Vec::new(),
            federated_bundles: self.federated.iter().map(|(td, certs)| (td.clone(), certs.concat())).collect(),
        }
    }
}

// === JWT material ===

/// A JWT signing authority (ES256, P-256) of one trust domain.
#[derive(Clone)]
pub struct TestJwtAuthority {
    trust_domain: String,
    kid: String,
    encoding_key: EncodingKey,
    jwk: serde_json::Value,
}

impl std::fmt::Debug for TestJwtAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestJwtAuthority")
            .field("trust_domain", &self.trust_domain)
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl TestJwtAuthority {
    /// A fresh P-256 key for `trust_domain`, published under key id `kid`.
    ///
    /// # Errors
    ///
    /// [`TestingError`] when a key cannot be made.
    pub fn new(trust_domain: &str, kid: &str) -> Result<Self, TestingError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let encoding_key = EncodingKey::from_ec_der(&key.serialize_der());
        let point = key.public_key_raw();
        if point.len() != 65 || point.first() != Some(&4) {
            return Err(TestingError::Key("expected an uncompressed P-256 public point"));
        }
        let jwk = serde_json::json!({
            "kty": "EC",
            "crv": "P-256",
            "kid": kid,
            "use": "jwt-svid",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        });
        Ok(Self { trust_domain: trust_domain.to_owned(), kid: kid.to_owned(), encoding_key, jwk })
    }

    /// The trust domain.
    #[must_use]
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// Signs a JWT-SVID (`sub`, `aud`, `exp`, `iat`; header `alg` ES256, `kid`, `typ` JWT).
    ///
    /// # Errors
    ///
    /// [`TestingError::Jwt`].
    pub fn sign(&self, subject: &str, audience: &[&str], expires_at: SystemTime) -> Result<String, TestingError> {
        let seconds = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let claims = serde_json::json!({
            "sub": subject,
            "aud": audience,
            "exp": seconds(expires_at),
            "iat": seconds(SystemTime::now()),
        });
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        header.typ = Some("JWT".to_owned());
        Ok(jsonwebtoken::encode(&header, &claims, &self.encoding_key)?)
    }
}

/// What the JWT calls serve: JWT-SVIDs for `spiffe_id` signed by `signer`, and JWT bundles.
#[derive(Clone, Debug)]
pub struct JwtMaterial {
    /// The workload's SPIFFE ID (`sub` of the JWT-SVIDs handed out).
    pub spiffe_id: String,
    /// The key JWT-SVIDs are signed with.
    pub signer: TestJwtAuthority,
    /// How long handed-out JWT-SVIDs live.
    pub ttl: Duration,
    bundles: BTreeMap<String, Vec<serde_json::Value>>,
}

impl JwtMaterial {
    /// JWT-SVIDs for `spiffe_id` signed by `signer` (5 minutes), whose key is in the bundle.
    #[must_use]
    pub fn new(spiffe_id: &str, signer: TestJwtAuthority) -> Self {
        let material = Self {
            spiffe_id: spiffe_id.to_owned(),
            signer: signer.clone(),
            ttl: Duration::from_secs(300),
            bundles: BTreeMap::new(),
        };
        material.trust(&signer)
    }

    /// Also publishes `authority`'s key in the bundle of its trust domain.
    #[must_use]
    pub fn trust(mut self, authority: &TestJwtAuthority) -> Self {
        self.bundles.entry(authority.trust_domain.clone()).or_default().push(authority.jwk.clone());
        self
    }

    fn bundles_response(&self) -> pb::JwtBundlesResponse {
        let bundles = self
            .bundles
            .iter()
            .map(|(td, keys)| (td.clone(), serde_json::json!({ "keys": keys }).to_string().into_bytes()))
            .collect::<HashMap<_, _>>();
        pb::JwtBundlesResponse { bundles }
    }
}

// === The server ===

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[derive(Clone)]
struct Service {
    x509: watch::Receiver<Option<X509Material>>,
    jwt: Arc<Mutex<Option<JwtMaterial>>>,
    jwt_bundles: watch::Receiver<Option<pb::JwtBundlesResponse>>,
}

fn check_header<T>(request: &Request<T>) -> Result<(), Status> {
    match request.metadata().get("workload.spiffe.io").map(|v| v.to_str()) {
        Some(Ok("true")) => Ok(()),
        _ => Err(Status::invalid_argument("security header missing from request")),
    }
}

#[tonic::async_trait]
impl SpiffeWorkloadApi for Service {
    type FetchX509SVIDStream = BoxStream<pb::X509svidResponse>;
    type FetchX509BundlesStream = BoxStream<pb::X509BundlesResponse>;
    type FetchJWTBundlesStream = BoxStream<pb::JwtBundlesResponse>;

    async fn fetch_x509svid(
        &self,
        request: Request<pb::X509svidRequest>,
    ) -> Result<Response<Self::FetchX509SVIDStream>, Status> {
        check_header(&request)?;
        let stream = WatchStream::new(self.x509.clone()).filter_map(|m| m.map(|m| Ok(m.response())));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn fetch_x509_bundles(
        &self,
        request: Request<pb::X509BundlesRequest>,
    ) -> Result<Response<Self::FetchX509BundlesStream>, Status> {
        check_header(&request)?;
        let stream = WatchStream::new(self.x509.clone()).filter_map(|m| {
            m.map(|m| {
                let mut bundles: HashMap<String, Vec<u8>> =
                    m.federated.iter().map(|(td, certs)| (td.clone(), certs.concat())).collect();
                let own = m.svid.spiffe_id.trim_start_matches("spiffe://").split('/').next().unwrap_or_default();
                bundles.insert(own.to_owned(), m.bundle.concat());
                Ok(pb::X509BundlesResponse { crl: Vec::new(), bundles })
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn fetch_jwtsvid(
        &self,
        request: Request<pb::JwtsvidRequest>,
    ) -> Result<Response<pb::JwtsvidResponse>, Status> {
        check_header(&request)?;
        let audience = &request.get_ref().audience;
        if audience.is_empty() {
            return Err(Status::invalid_argument("audience must be specified"));
        }
        let material = self.jwt.lock().map_err(|_| Status::internal("lock poisoned"))?.clone();
        let Some(material) = material else {
            return Err(Status::permission_denied("no identity issued"));
        };
        let audience: Vec<&str> = audience.iter().map(String::as_str).collect();
        let token = material
            .signer
            .sign(&material.spiffe_id, &audience, SystemTime::now() + material.ttl)
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(pb::JwtsvidResponse {
            svids: vec![pb::Jwtsvid { spiffe_id: material.spiffe_id, svid: token, hint: String::new() }],
        }))
    }

    async fn fetch_jwt_bundles(
        &self,
        request: Request<pb::JwtBundlesRequest>,
    ) -> Result<Response<Self::FetchJWTBundlesStream>, Status> {
        check_header(&request)?;
        let stream = WatchStream::new(self.jwt_bundles.clone()).filter_map(|m| m.map(Ok));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn validate_jwtsvid(
        &self,
        request: Request<pb::ValidateJwtsvidRequest>,
    ) -> Result<Response<pb::ValidateJwtsvidResponse>, Status> {
        check_header(&request)?;
        Err(Status::unimplemented("ValidateJWTSVID is not implemented by the fake Workload API"))
    }
}

/// A running fake Workload API on a Unix socket in its own temporary directory. Dropping it stops
/// the server and removes the directory.
pub struct FakeWorkloadApi {
    socket: PathBuf,
    x509: watch::Sender<Option<X509Material>>,
    jwt: Arc<Mutex<Option<JwtMaterial>>>,
    jwt_bundles: watch::Sender<Option<pb::JwtBundlesResponse>>,
    server: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for FakeWorkloadApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeWorkloadApi").field("socket", &self.socket).finish_non_exhaustive()
    }
}

impl FakeWorkloadApi {
    /// Serves `x509` (none: `FetchX509SVID` never answers) and `jwt` (none: `FetchJWTSVID` is
    /// refused and `FetchJWTBundles` never answers).
    ///
    /// # Errors
    ///
    /// [`TestingError::Io`] when the socket cannot be bound.
    pub async fn start(x509: Option<X509Material>, jwt: Option<JwtMaterial>) -> Result<Self, TestingError> {
        let dir = tempfile::Builder::new().prefix("spiffe-wl").tempdir()?;
        let socket = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&socket)?;
        let (x509_tx, x509_rx) = watch::channel(x509);
        let (bundles_tx, bundles_rx) = watch::channel(jwt.as_ref().map(JwtMaterial::bundles_response));
        let jwt = Arc::new(Mutex::new(jwt));
        let service = Service { x509: x509_rx, jwt: jwt.clone(), jwt_bundles: bundles_rx };
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(SpiffeWorkloadApiServer::new(service))
                .serve_with_incoming(UnixListenerStream::new(listener))
                .await;
            if let Err(error) = result {
                tracing::warn!(%error, "fake Workload API stopped");
            }
        });
        Ok(Self { socket, x509: x509_tx, jwt, jwt_bundles: bundles_tx, server, _dir: dir })
    }

    /// The endpoint URI, `unix:<socket path>`, for `X509Identity::connect` and
    /// `SPIFFE_ENDPOINT_SOCKET`.
    #[must_use]
    pub fn endpoint(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    /// The socket path.
    #[must_use]
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Rotates the X.509 material: pushes a complete new response on every open
    /// `FetchX509SVID` stream (and `FetchX509Bundles`).
    pub fn rotate_x509(&self, material: X509Material) {
        self.x509.send_replace(Some(material));
    }

    /// Replaces the JWT material: later `FetchJWTSVID` calls use it, and its bundles are pushed
    /// on every open `FetchJWTBundles` stream.
    pub fn rotate_jwt(&self, material: JwtMaterial) {
        self.jwt_bundles.send_replace(Some(material.bundles_response()));
        if let Ok(mut jwt) = self.jwt.lock() {
            *jwt = Some(material);
        }
    }
}

impl Drop for FakeWorkloadApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}
