//! What the auth layer costs per call, for every `--auth` method, beside the same server without it.
//!
//! For each method a real tonic principal on 127.0.0.1 (port 0) serves `authapi.Authentication`
//! and a protected `EventStream.Ping` behind [`auth::AuthLayer`]; a real tonic client runs one
//! `Authenticate` (then a few more for a median), and then sequential authenticated `Ping` calls
//! on one connection. The baseline is the same router without the layer on the same transport
//! (h2c, or the same TLS config for `mtls` and `spiffe:x509`, so TLS is not counted as auth cost),
//! receiving the very same requests (token and forwarded headers included), in the same run:
//! both servers run at once and the calls alternate between them in rounds, so load from other
//! processes on this shared machine falls on both.
//!
//! | row | transport | per call |
//! |---|---|---|
//! | `mtls:subject` | mTLS, rcgen certificates | token + certificate binding |
//! | `mtls:uri` | mTLS, client certificate with a SPIFFE URI SAN | token + certificate binding |
//! | `xfcc:` | h2c from loopback (a trusted hop), `x-forwarded-client-cert` as Istio's sidecar sends it | token + XFCC parsed and checked |
//! | `header:…` | h2c, the same header, upstream's regex | token + regex over the header |
//! | `spiffe:x509` | mTLS with X.509-SVIDs from the fake SPIFFE Workload API | token + SVID's SPIFFE ID |
//! | `spiffe:jwt` | h2c, a JWT-SVID from the fake Workload API in `x-spiffe-jwt-svid` | token + JWT-SVID verified |
//!
//! Session tokens are signed with an RSA-4096 key, the size `argocd-agentctl jwt create-key` makes.
//!
//! Run: `cargo bench -p auth --bench auth`. Sizes: `BENCH_AUTH_CALLS` (10000 calls per method and
//! per baseline), `BENCH_AUTH_AUTHENTICATES` (21), `BENCH_AUTH_ROUNDS` (10); `BENCH_QUICK=1` for a
//! smoke run. Figures are printed, never asserted.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use auth::tls::{ServerTlsSettings, TlsIncoming};
use auth::tls_policy::{TlsPolicy, TlsVersion};
use auth::{
    AgentIdentity, AgentMode, AgentName, AgentSession, AuthLayer, AuthMethodSpec, AuthMethods, AuthService,
    AuthServiceConfig, Binding, SessionIssuer, Sessions, SigningKey, TokenKind, VersionCheck,
};
use hyper_util::rt::TokioIo;
use mesh::SpiffeId;
use mesh::workload::testing::{FakeWorkloadApi, JwtMaterial, TestCa, TestJwtAuthority, X509Material};
use mesh::workload::{JwtIdentity, PeerAuthorization, X509Identity};
use protocol::pb::authapi::AuthRequest;
use protocol::pb::authapi::authentication_client::AuthenticationClient;
use protocol::pb::authapi::authentication_server::AuthenticationServer;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::pb::eventstreamapi::event_stream_server::{EventStream, EventStreamServer};
use protocol::pb::eventstreamapi::{Event, PingRequest, PongReply, PushSummary};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::StreamExt as _;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::server::Router;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Response, Status, Streaming};
use tower::layer::util::{Identity as NoLayer, Stack};
use tower::util::Either;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// RSA-4096, as `argocd-agentctl jwt create-key` makes (bench-only key, see fixtures/README.md).
const JWT_KEY: &str = include_str!("fixtures/jwt-key-rsa4096.pem");
/// RSA-2048, the auth tests' key (upstream's `jwt.key` size), for the in-process comparison only.
const JWT_KEY_2048: &str = include_str!("../tests/fixtures/jwt-key-a.pem");
const VERSION: &str = "0.1.0-bench";
const NAMESPACE: &str = "argocd";
const TD: &str = "cluster.local";
const PRINCIPAL_ID: &str = "spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal";
const AGENT_ID: &str = "spiffe://cluster.local/ns/agents/sa/agent-1";
const AUDIENCE: &str = "argocd-agent-principal";
const XFCC: &str = "x-forwarded-client-cert";
const JWT_SVID: &str = "x-spiffe-jwt-svid";
const SYNC: Duration = Duration::from_secs(10);

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 { format!("{:.2} ms", us / 1000.0) } else { format!("{us:.0} µs") }
}

// === The principal's services ===

/// The protected service. Behind the layer it requires the session the layer puts in the
/// extensions, so a call that was not authenticated fails the benchmark.
#[derive(Clone, Copy)]
struct Pong {
    authenticated: bool,
}

#[tonic::async_trait]
impl EventStream for Pong {
    type SubscribeStream = tokio_stream::Empty<Result<Event, Status>>;

    async fn subscribe(&self, _: Request<Streaming<Event>>) -> Result<Response<Self::SubscribeStream>, Status> {
        Err(Status::unimplemented("subscribe"))
    }

    async fn push(&self, _: Request<Streaming<Event>>) -> Result<Response<PushSummary>, Status> {
        Err(Status::unimplemented("push"))
    }

    async fn ping(&self, request: Request<PingRequest>) -> Result<Response<PongReply>, Status> {
        if self.authenticated {
            AgentSession::from_request(&request)?;
        }
        Ok(Response::new(PongReply {}))
    }
}

type BenchRouter = Router<Stack<Either<AuthLayer, NoLayer>, NoLayer>>;

/// The same router with or without the auth layer.
fn router(sessions: &Sessions, with_auth: bool) -> BenchRouter {
    let config = AuthServiceConfig {
        principal_version: VERSION.to_owned(),
        principal_namespace: NAMESPACE.to_owned(),
        version_check: VersionCheck::Exact,
    };
    tonic::transport::Server::builder()
        .layer(tower::util::option_layer(with_auth.then(|| AuthLayer::new(sessions.clone()))))
        .add_service(AuthenticationServer::new(AuthService::new(sessions.clone(), config, ())))
        .add_service(EventStreamServer::new(Pong { authenticated: with_auth }))
}

/// How the principal listens.
#[derive(Clone)]
enum Serve {
    /// h2c, as behind a sidecar.
    Plain,
    /// TLS with this config (client certificates requested and verified).
    Tls(Arc<rustls::ServerConfig>),
}

/// A running server; dropping it stops it.
struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(router: BenchRouter, how: &Serve) -> Res<Server> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let how = how.clone();
    let task = tokio::spawn(async move {
        let _ = match how {
            Serve::Tls(config) => router.serve_with_incoming(TlsIncoming::new(listener, config)).await,
            // TCP_NODELAY as on the TLS listener, so the two baselines differ only by TLS.
            Serve::Plain => {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
                    if let Ok(tcp) = &conn {
                        let _ = tcp.set_nodelay(true);
                    }
                    conn
                });
                router.serve_with_incoming(incoming).await
            }
        };
    });
    Ok(Server { addr, task })
}

/// How the agent dials.
#[derive(Clone)]
enum Dial {
    Plain,
    /// tonic's TLS client (mtls methods).
    Tls(ClientTlsConfig),
    /// A rustls config from the Workload API (spiffe:x509).
    Rustls(Arc<rustls::ClientConfig>),
}

async fn connect(how: &Dial, addr: SocketAddr) -> Res<Channel> {
    let channel = match how {
        Dial::Plain => Endpoint::from_shared(format!("http://{addr}"))?.connect().await?,
        Dial::Tls(tls) => Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls.clone())?.connect().await?,
        Dial::Rustls(config) => {
            let config = config.clone();
            let connector = tower::service_fn(move |_: http::Uri| {
                let config = config.clone();
                async move {
                    let tcp = TcpStream::connect(addr).await?;
                    tcp.set_nodelay(true)?;
                    let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
                    let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(tls))
                }
            });
            Endpoint::from_shared(format!("http://{addr}"))?.connect_with_connector(connector).await?
        }
    };
    Ok(channel)
}

// === PKI for the mtls methods ===

struct Pki {
    ca_pem: String,
    server_config: Arc<rustls::ServerConfig>,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Res<Self> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, "argocd-agent-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let ca_der = cert.der().clone();
        let issuer = Issuer::new(params, key);

        let mut server = CertificateParams::new(vec!["localhost".to_owned()])?;
        server.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse()?));
        server.distinguished_name.push(DnType::CommonName, "argocd-agent-principal");
        let server_key = KeyPair::generate()?;
        let server_cert = server.signed_by(&server_key, &issuer)?;
        let server_config = auth::tls::server_config(ServerTlsSettings {
            require_client_cert: false,
            cert_chain: vec![server_cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
            client_ca: Some(vec![CertificateDer::from(ca_der.to_vec())]),
            policy: TlsPolicy { min: Some(TlsVersion::Tls13), ..TlsPolicy::default() },
        })?;
        Ok(Self { ca_pem: cert.pem(), server_config, issuer })
    }

    /// The agent's client TLS config with a certificate for CN `agent-1`, or with only `uri`.
    fn client(&self, uri: Option<&str>) -> Res<ClientTlsConfig> {
        let mut params = CertificateParams::default();
        match uri {
            None => {
                params.distinguished_name.push(DnType::CommonName, "agent-1");
                params.distinguished_name.push(DnType::OrganizationName, "argocd-agent");
            }
            Some(uri) => params.subject_alt_names.push(SanType::URI(uri.try_into()?)),
        }
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .domain_name("localhost")
            .identity(Identity::from_pem(cert.pem(), key.serialize_pem())))
    }
}

// === The cases ===

/// One row: a method, how both sides are set up, and what every call carries.
struct Case {
    label: &'static str,
    transport: &'static str,
    method: &'static str,
    sessions: Sessions,
    serve: Serve,
    dial: Dial,
    /// `AuthRequest.credentials`.
    credentials: HashMap<String, String>,
    /// Metadata on `Authenticate` and on every call (what the sidecar or the agent adds).
    metadata: Vec<(&'static str, String)>,
    /// Workload API connections and fakes, kept alive for the case and shut down after.
    x509: Vec<X509Identity>,
    jwt: Vec<JwtIdentity>,
    apis: Vec<FakeWorkloadApi>,
    /// In-process figures measured while setting the case up, printed after the table.
    notes: Vec<String>,
}

impl Case {
    fn new(label: &'static str, transport: &'static str, spec: &AuthMethodSpec, sessions: Sessions) -> Self {
        Self {
            label,
            transport,
            method: spec.method(),
            sessions,
            serve: Serve::Plain,
            dial: Dial::Plain,
            credentials: HashMap::new(),
            metadata: Vec::new(),
            x509: Vec::new(),
            jwt: Vec::new(),
            apis: Vec::new(),
            notes: Vec::new(),
        }
    }

    async fn shutdown(self) {
        for identity in &self.x509 {
            identity.shutdown().await;
        }
        for identity in &self.jwt {
            identity.shutdown().await;
        }
    }
}

fn sessions(authenticator: Arc<dyn auth::Authenticator>) -> Res<Sessions> {
    let issuer = SessionIssuer::new(SigningKey::from_pem(JWT_KEY)?);
    Ok(Sessions::new(issuer, AuthMethods::single(authenticator)).with_principal_namespace(NAMESPACE))
}

fn parse(spec: &str, plaintext: bool) -> Res<AuthMethodSpec> {
    let spec = AuthMethodSpec::parse(spec)?;
    spec.check_listener(plaintext)?;
    Ok(spec)
}

/// What an Istio sidecar forwards for a client presenting `uri`.
fn sidecar_xfcc(uri: &str) -> String {
    format!(
        "By={PRINCIPAL_ID};Hash=4c8fb1f1a2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9;Subject=\"\";URI={uri}"
    )
}

async fn mtls_case(pki: &Pki, label: &'static str, spec: &str, uri: Option<&str>) -> Res<Case> {
    let spec = parse(spec, false)?;
    let mut case = Case::new(label, "mTLS", &spec, sessions(spec.authenticator())?);
    case.serve = Serve::Tls(pki.server_config.clone());
    case.dial = Dial::Tls(pki.client(uri)?);
    Ok(case)
}

fn header_case(label: &'static str, spec: &str) -> Res<Case> {
    let spec = parse(spec, true)?;
    let mut case = Case::new(label, "h2c", &spec, sessions(spec.authenticator())?);
    case.metadata.push((XFCC, sidecar_xfcc(AGENT_ID)));
    Ok(case)
}

async fn spiffe_x509_case() -> Res<Case> {
    let ca = TestCa::new(TD)?;
    let principal_api = FakeWorkloadApi::start(Some(X509Material::new(&ca, PRINCIPAL_ID)?), None).await?;
    let spec = parse(&format!("spiffe:x509:trust-domain={TD};endpoint={}", principal_api.endpoint()), false)?;
    let principal = X509Identity::connect(spec.workload_endpoint(), SYNC).await?;
    let server_config = principal.server_config(&PeerAuthorization::Any)?;
    let authenticator = spec.connect_authenticator(SYNC).await?;

    let agent_api = FakeWorkloadApi::start(Some(X509Material::new(&ca, AGENT_ID)?), None).await?;
    let agent = X509Identity::connect(Some(&agent_api.endpoint()), SYNC).await?;
    let client_config = agent.client_config(&PeerAuthorization::Exact(vec![SpiffeId::parse(PRINCIPAL_ID)?]))?;

    let mut case = Case::new("spiffe:x509", "mTLS (SVIDs)", &spec, sessions(authenticator)?);
    case.serve = Serve::Tls(server_config);
    case.dial = Dial::Rustls(client_config);
    case.x509 = vec![principal, agent];
    case.apis = vec![principal_api, agent_api];
    Ok(case)
}

async fn spiffe_jwt_case(in_process: usize) -> Res<Case> {
    let signer = TestJwtAuthority::new(TD, "td-key-1")?;
    let principal_api = FakeWorkloadApi::start(None, Some(JwtMaterial::new(PRINCIPAL_ID, signer.clone()))).await?;
    let spec = parse(
        &format!(
            "spiffe:jwt:audience={AUDIENCE};trust-domain={TD};namespaces=agents;endpoint={}",
            principal_api.endpoint()
        ),
        true,
    )?;
    let authenticator = spec.connect_authenticator(SYNC).await?;

    let agent_api = FakeWorkloadApi::start(None, Some(JwtMaterial::new(AGENT_ID, signer))).await?;
    let agent = JwtIdentity::connect(Some(&agent_api.endpoint()), SYNC).await?;
    let svid = agent.fetch_svid(AUDIENCE).await?;

    // What the principal does with it on every call, in process: the JWT-SVID against its bundles.
    let principal = JwtIdentity::connect(Some(&principal_api.endpoint()), SYNC).await?;
    // Uncached: the signature check itself; cached: what a repeated presentation costs.
    let bundles = principal.bundle_set()?;
    let (mut times, mut cached) = (Vec::with_capacity(in_process), Vec::with_capacity(in_process));
    for _ in 0..in_process.max(1) {
        let start = Instant::now();
        mesh::workload::verify_jwt_svid(svid.token(), &bundles, AUDIENCE).map_err(|e| e.to_string())?;
        times.push(start.elapsed());
        let start = Instant::now();
        principal.validate(svid.token(), AUDIENCE).map_err(|e| e.to_string())?;
        cached.push(start.elapsed());
    }
    times.sort();
    cached.sort();

    let mut case = Case::new("spiffe:jwt", "h2c", &spec, sessions(authenticator)?);
    case.credentials.insert("token".to_owned(), svid.token().to_owned());
    case.metadata.push((JWT_SVID, svid.token().to_owned()));
    case.notes.push(format!(
        "spiffe:jwt: one JWT-SVID validation (ES256, against the Workload API's JWT bundles), in process: p50 {}, \
         cached (the same JWT-SVID again, same bundles) p50 {}",
        fmt_dur(percentile(&times, 0.5)),
        fmt_dur(percentile(&cached, 0.5))
    ));
    case.jwt = vec![agent, principal];
    case.apis = vec![principal_api, agent_api];
    Ok(case)
}

// === Measuring ===

/// Session tokens signed and verified in process with `pem`, no network: p50 of issuing an access
/// and a refresh token (two RS512 signatures, what `Authenticate` adds to the method), and p50 of
/// verifying an access token (what the layer does on every call before the binding check).
/// The first verification of a token checks its signature; later ones of the same token hit the
/// issuer's cache of verified access tokens.
fn token_costs(pem: &str, n: usize) -> Res<(Duration, Duration, Duration)> {
    let issuer = SessionIssuer::new(SigningKey::from_pem(pem)?);
    let identity = AgentIdentity::new(AgentName::new("agent-1")?, "mtls", Binding::certificate(b"bench"));
    let (mut issue, mut first, mut cached) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n.max(1) {
        let start = Instant::now();
        let token = issuer.issue(&identity, AgentMode::Managed)?.access_token;
        issue.push(start.elapsed());
        let start = Instant::now();
        issuer.verify(&token, TokenKind::Access)?;
        first.push(start.elapsed());
        let start = Instant::now();
        issuer.verify(&token, TokenKind::Access)?;
        cached.push(start.elapsed());
    }
    for v in [&mut issue, &mut first, &mut cached] {
        v.sort();
    }
    Ok((percentile(&issue, 0.5), percentile(&first, 0.5), percentile(&cached, 0.5)))
}

/// Baseline for [`token_costs`]' issue: the same two RS512 signatures by jsonwebtoken's
/// RustCrypto backend (the pure-Rust `rsa` crate; what signed sessions before `ring` did), p50.
fn rustcrypto_issue_cost(pem: &str, n: usize) -> Res<Duration> {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    use rsa::pkcs1::EncodeRsaPrivateKey as _;
    use rsa::pkcs8::DecodePrivateKey as _;
    let pkcs8 = SigningKey::from_pem(pem)?.to_pkcs8_pem()?;
    let pkcs1 = rsa::RsaPrivateKey::from_pkcs8_pem(&pkcs8)?.to_pkcs1_der()?;
    let key = EncodingKey::from_rsa_der(pkcs1.as_bytes());
    let claims = serde_json::json!({"sub": "agent-1", "aud": ["bench"], "exp": 4_000_000_000_u64});
    let mut issue = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        let start = Instant::now();
        for _ in 0..2 {
            std::hint::black_box(jsonwebtoken::encode(&Header::new(Algorithm::RS512), &claims, &key)?);
        }
        issue.push(start.elapsed());
    }
    issue.sort();
    Ok(percentile(&issue, 0.5))
}

struct Sizes {
    calls: usize,
    authenticates: usize,
    rounds: usize,
    warmup: usize,
}

struct Calls {
    rate: f64,
    p50: Duration,
    p99: Duration,
}

impl Calls {
    fn of(mut times: Vec<Duration>) -> Self {
        let total: Duration = times.iter().sum();
        times.sort();
        Self {
            rate: times.len() as f64 / total.as_secs_f64().max(1e-9),
            p50: percentile(&times, 0.5),
            p99: percentile(&times, 0.99),
        }
    }
}

struct Row {
    label: &'static str,
    transport: &'static str,
    authenticate_first: Duration,
    authenticate_p50: Duration,
    auth: Calls,
    baseline: Calls,
}

fn metadata_map(entries: &[(&'static str, String)]) -> Res<MetadataMap> {
    let mut map = MetadataMap::new();
    for (key, value) in entries {
        map.insert(*key, MetadataValue::try_from(value.as_str())?);
    }
    Ok(map)
}

/// `count` sequential pings carrying `metadata`, each timed.
async fn pings(
    client: &mut EventStreamClient<Channel>,
    metadata: &MetadataMap,
    count: usize,
    times: &mut Vec<Duration>,
) -> Res<()> {
    for _ in 0..count {
        let mut request = Request::new(PingRequest {});
        *request.metadata_mut() = metadata.clone();
        let start = Instant::now();
        client.ping(request).await?;
        times.push(start.elapsed());
    }
    Ok(())
}

async fn run(case: &Case, sizes: &Sizes) -> Res<Row> {
    let with_auth = serve(router(&case.sessions, true), &case.serve).await?;
    let without = serve(router(&case.sessions, false), &case.serve).await?;
    let auth_channel = connect(&case.dial, with_auth.addr).await?;
    let base_channel = connect(&case.dial, without.addr).await?;

    let mut authenticate = AuthenticationClient::new(auth_channel.clone());
    let mut times = Vec::with_capacity(sizes.authenticates);
    let mut token = String::new();
    for _ in 0..sizes.authenticates.max(1) {
        let mut request = Request::new(AuthRequest {
            method: case.method.to_owned(),
            credentials: case.credentials.clone(),
            mode: "managed".to_owned(),
            version: VERSION.to_owned(),
            agent_namespace: NAMESPACE.to_owned(),
        });
        *request.metadata_mut() = metadata_map(&case.metadata)?;
        let start = Instant::now();
        let response = authenticate.authenticate(request).await?;
        times.push(start.elapsed());
        token = response.into_inner().access_token;
    }
    let authenticate_first = times[0];
    times.sort();
    let authenticate_p50 = percentile(&times, 0.5);

    let mut metadata = metadata_map(&case.metadata)?;
    metadata.insert("authorization", MetadataValue::try_from(token.as_str())?);
    let mut auth_client = EventStreamClient::new(auth_channel);
    let mut base_client = EventStreamClient::new(base_channel);
    let mut discard = Vec::new();
    pings(&mut auth_client, &metadata, sizes.warmup, &mut discard).await?;
    pings(&mut base_client, &metadata, sizes.warmup, &mut discard).await?;

    // Alternate in rounds, each side first in every other round.
    let (mut auth_times, mut base_times) = (Vec::with_capacity(sizes.calls), Vec::with_capacity(sizes.calls));
    let rounds = sizes.rounds.clamp(1, sizes.calls.max(1));
    for round in 0..rounds {
        let share = sizes.calls / rounds + usize::from(round < sizes.calls % rounds);
        if round % 2 == 0 {
            pings(&mut base_client, &metadata, share, &mut base_times).await?;
            pings(&mut auth_client, &metadata, share, &mut auth_times).await?;
        } else {
            pings(&mut auth_client, &metadata, share, &mut auth_times).await?;
            pings(&mut base_client, &metadata, share, &mut base_times).await?;
        }
    }
    drop((auth_client, base_client, authenticate));
    drop((with_auth, without));
    Ok(Row {
        label: case.label,
        transport: case.transport,
        authenticate_first,
        authenticate_p50,
        auth: Calls::of(auth_times),
        baseline: Calls::of(base_times),
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let sizes = Sizes {
        calls: env("BENCH_AUTH_CALLS", if quick { 200 } else { 10_000 }),
        authenticates: env("BENCH_AUTH_AUTHENTICATES", if quick { 1 } else { 21 }),
        rounds: env("BENCH_AUTH_ROUNDS", if quick { 2 } else { 10 }),
        warmup: if quick { 10 } else { 200 },
    };
    let in_process = if quick { 2 } else { 100 };
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    println!(
        "auth layer benchmarks ({cores} cores): per method {} sequential authenticated Ping calls on one connection, \
         and the same calls to the same server without the auth layer, interleaved in {} rounds; \
         session tokens RS512 with an RSA-4096 key",
        sizes.calls, sizes.rounds
    );

    let pki = Pki::new()?;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let cases: Vec<Case> = vec![
        mtls_case(&pki, "mtls:subject", "mtls:subject:CN=([^,]+)", None).await?,
        mtls_case(&pki, "mtls:uri", "mtls:uri:^spiffe://[^/]+/ns/[^/]+/sa/([^/]+)$", Some(AGENT_ID)).await?,
        header_case("xfcc:", "xfcc:")?,
        header_case(
            "header:x-forwarded-client-cert:<regex>",
            "header:x-forwarded-client-cert:^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)",
        )?,
        spiffe_x509_case().await?,
        spiffe_jwt_case(in_process).await?,
    ];
    for case in cases {
        let row = run(&case, &sizes).await.map_err(|e| format!("{}: {e}", case.label))?;
        notes.extend(case.notes.iter().cloned());
        case.shutdown().await;
        rows.push(row);
    }

    println!();
    println!(
        "| {:<40} | {:<12} | {:>21} | {:>8} | {:>9} | {:>9} | {:>17} | {:>12} | {:>6} |",
        "method",
        "transport",
        "Authenticate 1st/p50",
        "calls/s",
        "p50",
        "p99",
        "baseline calls/s",
        "baseline p50",
        "ratio"
    );
    println!(
        "|{:-<42}|{:-<14}|{:-<23}|{:-<10}|{:-<11}|{:-<11}|{:-<19}|{:-<14}|{:-<8}|",
        "", "", "", "", "", "", "", "", ""
    );
    for row in &rows {
        println!(
            "| {:<40} | {:<12} | {:>21} | {:>8.0} | {:>9} | {:>9} | {:>17.0} | {:>12} | {:>5.2}x |",
            row.label,
            row.transport,
            format!("{} / {}", fmt_dur(row.authenticate_first), fmt_dur(row.authenticate_p50)),
            row.auth.rate,
            fmt_dur(row.auth.p50),
            fmt_dur(row.auth.p99),
            row.baseline.rate,
            fmt_dur(row.baseline.p50),
            row.auth.rate / row.baseline.rate.max(1e-9),
        );
    }
    println!();
    for (bits, pem) in [(4096, JWT_KEY), (2048, JWT_KEY_2048)] {
        let (issue, first, cached) = token_costs(pem, in_process)?;
        let baseline = rustcrypto_issue_cost(pem, in_process)?;
        println!(
            "session tokens, RS512 with RSA-{bits}, in process: issue access + refresh p50 {} (ring; the same two \
             signatures by RustCrypto, baseline: {}, {:.2}x), verify access p50 {} (first time: the signature), {} \
             (again: the verified-token cache)",
            fmt_dur(issue),
            fmt_dur(baseline),
            issue.as_secs_f64() / baseline.as_secs_f64().max(1e-12),
            fmt_dur(first),
            fmt_dur(cached)
        );
    }
    for note in &notes {
        println!("{note}");
    }
    println!(
        "baseline: the same router without the auth layer on the same transport (h2c, or the same TLS config), \
         the same requests; ratio = calls/s with auth / baseline calls/s"
    );
    Ok(())
}
