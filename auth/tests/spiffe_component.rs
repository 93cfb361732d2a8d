//! Component tests of `--auth spiffe:x509` and `--auth spiffe:jwt`: a real tonic principal on
//! 127.0.0.1 with the auth layer, real tonic clients, and both sides' identities from their own
//! fake SPIFFE Workload API (`mesh::workload::testing`). `spiffe:x509` runs over real mTLS with
//! rustls configs from the Workload API sources; `spiffe:jwt` over plaintext gRPC (as behind a
//! mesh sidecar). Every refusal must be `Unauthenticated` with a reason, and leave no session.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use auth::tls::TlsIncoming;
use auth::{AuthMethodSpec, Binding};
use common::{Recorders, assert_unauthenticated, ping_with, ping_with_metadata};
use hyper_util::rt::TokioIo;
use mesh::SpiffeId;
use mesh::workload::testing::{FakeWorkloadApi, JwtMaterial, TestCa, TestJwtAuthority, X509Material};
use mesh::workload::{JwtIdentity, PeerAuthorization, X509Identity};
use protocol::pb::authapi::AuthResponse;
use protocol::pb::authapi::authentication_client::AuthenticationClient;
use rustls_pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

const TD: &str = "cluster.local";
const PRINCIPAL: &str = "spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal";
const AGENT: &str = "spiffe://cluster.local/ns/agents/sa/agent-1";
const AGENT_2: &str = "spiffe://cluster.local/ns/agents/sa/agent-2";
const AUDIENCE: &str = "argocd-agent-principal";
const SYNC: Duration = Duration::from_secs(10);

// === Harness ===

struct Principal {
    port: u16,
    recorded: Recorders,
    server: tokio::task::JoinHandle<()>,
    _api: FakeWorkloadApi,
}

impl Drop for Principal {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Principal {
    /// `spiffe:x509` over mTLS: the principal's SVID and bundles (its trust domain, federated
    /// with `federate`) from its own Workload API.
    async fn x509(ca: &TestCa, federate: &[&TestCa]) -> Self {
        let mut material = X509Material::new(ca, PRINCIPAL).expect("svid");
        for other in federate {
            material = material.federate(other);
        }
        let api = FakeWorkloadApi::start(Some(material), None).await.expect("fake workload api");
        let spec = AuthMethodSpec::parse(&format!("spiffe:x509:trust-domain={TD};endpoint={}", api.endpoint()))
            .expect("--auth");
        spec.check_listener(false).expect("spiffe:x509 serves TLS");
        let identity = X509Identity::connect(spec.workload_endpoint(), SYNC).await.expect("principal svid");
        let tls = identity.server_config(&PeerAuthorization::Any).expect("server config");
        let authenticator = spec.connect_authenticator(SYNC).await.expect("authenticator");
        Self::serve(authenticator, api, |listener, router| {
            tokio::spawn(async move {
                let _ = router.serve_with_incoming(TlsIncoming::new(listener, tls)).await;
            })
        })
        .await
    }

    /// `spiffe:jwt` over plaintext: JWT bundles (the `trusted` authorities) from its own Workload API.
    async fn jwt(signer: &TestJwtAuthority) -> Self {
        Self::jwt_with(signer, |endpoint| {
            AuthMethodSpec::parse(&format!(
                "spiffe:jwt:audience={AUDIENCE};trust-domain={TD};namespaces=agents;endpoint={endpoint}"
            ))
            .expect("--auth")
        })
        .await
    }

    /// A JWT-SVID method `spec` builds from the Workload API endpoint, over plaintext.
    async fn jwt_with(signer: &TestJwtAuthority, spec: impl FnOnce(String) -> AuthMethodSpec) -> Self {
        let api = FakeWorkloadApi::start(None, Some(JwtMaterial::new(PRINCIPAL, signer.clone())))
            .await
            .expect("fake workload api");
        let spec = spec(api.endpoint());
        spec.check_listener(true).expect("spiffe:jwt may serve plaintext");
        let authenticator = spec.connect_authenticator(SYNC).await.expect("authenticator");
        Self::serve(authenticator, api, |listener, router| {
            tokio::spawn(async move {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let _ = router.serve_with_incoming(incoming).await;
            })
        })
        .await
    }

    async fn serve(
        authenticator: Arc<dyn auth::Authenticator>,
        api: FakeWorkloadApi,
        spawn: impl FnOnce(
            TcpListener,
            tonic::transport::server::Router<tower::layer::util::Stack<auth::AuthLayer, tower::layer::util::Identity>>,
        ) -> tokio::task::JoinHandle<()>,
    ) -> Self {
        let issuer = auth::SessionIssuer::new(auth::SigningKey::from_pem(common::KEY_A).expect("jwt key"));
        let sessions = auth::Sessions::new(issuer, auth::AuthMethods::single(authenticator))
            .with_principal_namespace(common::PRINCIPAL_NAMESPACE);
        let recorded = Recorders::default();
        let router = common::router(sessions, &recorded);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = spawn(listener, router);
        Self { port, recorded, server, _api: api }
    }

    /// A plaintext channel (spiffe:jwt).
    async fn plain_channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://127.0.0.1:{}", self.port))
            .expect("uri")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect")
    }

    /// An mTLS channel with the agent's rustls config (its SVID from its Workload API).
    async fn tls_channel(&self, config: Arc<rustls::ClientConfig>) -> Result<Channel, tonic::transport::Error> {
        let port = self.port;
        let connector = tower::service_fn(move |_: http::Uri| {
            let config = config.clone();
            async move {
                let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
                let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
                let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        });
        Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("uri")
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector(connector)
            .await
    }
}

/// The agent's mTLS client config from its own Workload API serving `material`.
async fn agent_tls(material: X509Material) -> (Arc<rustls::ClientConfig>, FakeWorkloadApi) {
    let api = FakeWorkloadApi::start(Some(material), None).await.expect("fake workload api");
    let identity = X509Identity::connect(Some(&api.endpoint()), SYNC).await.expect("agent svid");
    let pin = PeerAuthorization::Exact(vec![SpiffeId::parse(PRINCIPAL).expect("id")]);
    (identity.client_config(&pin).expect("client config"), api)
}

async fn authenticate(
    channel: &Channel,
    method: &str,
    credentials: HashMap<String, String>,
    metadata: &[(&'static str, &str)],
) -> Result<AuthResponse, Status> {
    let mut request = tonic::Request::new(auth_request(method, credentials));
    for (key, value) in metadata {
        request.metadata_mut().insert(*key, value.parse().expect("ascii"));
    }
    AuthenticationClient::new(channel.clone()).authenticate(request).await.map(tonic::Response::into_inner)
}

fn auth_request(method: &str, credentials: HashMap<String, String>) -> protocol::pb::authapi::AuthRequest {
    protocol::pb::authapi::AuthRequest { credentials, ..common::auth_request(method) }
}

fn token(jwt: &str) -> HashMap<String, String> {
    HashMap::from([("token".to_owned(), jwt.to_owned())])
}

// === spiffe:x509 ===

#[tokio::test]
async fn x509_valid_agent_svid_authenticates_and_binds_its_spiffe_id() {
    let ca = TestCa::new(TD).expect("ca");
    let p = Principal::x509(&ca, &[]).await;
    let (config, _agent_api) = agent_tls(X509Material::new(&ca, AGENT).expect("svid")).await;
    let channel = p.tls_channel(config).await.expect("mTLS");

    let response = authenticate(&channel, "spiffe-x509", HashMap::new(), &[]).await.expect("authenticate");
    assert_eq!(p.recorded.sessions(), 1);
    let created = p.recorded.sessions_created.0.lock().expect("lock")[0].clone();
    assert_eq!(created.identity.name().as_str(), "agent-1");
    assert_eq!(created.identity.method(), "spiffe-x509");
    assert_eq!(created.identity.binding(), &Binding::SpiffeId(AGENT.to_owned()));
    ping_with(&channel, Some(&response.access_token)).await.expect("protected call");
    assert_eq!(p.recorded.protected(), 1);

    // The token is bound to agent-1's SPIFFE ID: another agent's connection cannot use it.
    let (other, _other_api) = agent_tls(X509Material::new(&ca, AGENT_2).expect("svid")).await;
    let other = p.tls_channel(other).await.expect("mTLS");
    let status = ping_with(&other, Some(&response.access_token)).await.expect_err("other connection");
    assert_unauthenticated(&status, "is bound to SPIFFE ID spiffe://cluster.local/ns/agents/sa/agent-1");
    assert_eq!(p.recorded.protected(), 1);
}

#[tokio::test]
async fn x509_wrong_trust_domain_is_unauthenticated() {
    let ca = TestCa::new(TD).expect("ca");
    let other = TestCa::new("other.example").expect("ca");
    // Federated: the TLS layer verifies the chain, the policy then refuses the trust domain.
    let p = Principal::x509(&ca, &[&other]).await;
    let material =
        X509Material::new(&other, "spiffe://other.example/ns/agents/sa/agent-1").expect("svid").federate(&ca);
    let (config, _agent_api) = agent_tls(material).await;
    let channel = p.tls_channel(config).await.expect("mTLS");
    let status = authenticate(&channel, "spiffe-x509", HashMap::new(), &[]).await.expect_err("wrong trust domain");
    assert_unauthenticated(&status, "trust domain \"other.example\" is not allowed");
    p.recorded.assert_nothing_created();
}

#[tokio::test]
async fn x509_wrong_path_is_unauthenticated() {
    let ca = TestCa::new(TD).expect("ca");
    let p = Principal::x509(&ca, &[]).await;
    let (config, _agent_api) =
        agent_tls(X509Material::new(&ca, "spiffe://cluster.local/workloads/agent-1").expect("svid")).await;
    let channel = p.tls_channel(config).await.expect("mTLS");
    let status = authenticate(&channel, "spiffe-x509", HashMap::new(), &[]).await.expect_err("wrong path");
    assert_unauthenticated(&status, "matches none of the patterns");
    p.recorded.assert_nothing_created();
}

#[tokio::test]
async fn x509_svid_from_an_untrusted_ca_never_reaches_the_principal() {
    let ca = TestCa::new(TD).expect("ca");
    let rogue = TestCa::new(TD).expect("rogue ca for the same trust domain");
    let p = Principal::x509(&ca, &[]).await;
    let (config, _agent_api) = agent_tls(X509Material::new(&rogue, AGENT).expect("svid").federate(&ca)).await;
    // TLS 1.3 reports the refused client certificate after the handshake: connect or the call fails.
    let result = match p.tls_channel(config).await {
        Ok(channel) => authenticate(&channel, "spiffe-x509", HashMap::new(), &[]).await.map(|_| ()),
        Err(e) => Err(Status::unavailable(e.to_string())),
    };
    assert!(result.is_err(), "a client SVID not signed by the bundle must fail the TLS handshake");
    p.recorded.assert_nothing_created();
}

// === spiffe:jwt ===

struct JwtSetup {
    principal: Principal,
    signer: TestJwtAuthority,
    agent: JwtIdentity,
    _agent_api: FakeWorkloadApi,
}

async fn jwt_setup() -> JwtSetup {
    let signer = TestJwtAuthority::new(TD, "td-key-1").expect("key");
    let principal = Principal::jwt(&signer).await;
    let agent_api =
        FakeWorkloadApi::start(None, Some(JwtMaterial::new(AGENT, signer.clone()))).await.expect("fake workload api");
    let agent = JwtIdentity::connect(Some(&agent_api.endpoint()), SYNC).await.expect("agent jwt source");
    JwtSetup { principal, signer, agent, _agent_api: agent_api }
}

#[tokio::test]
async fn jwt_valid_svid_authenticates_and_later_calls_present_it() {
    let s = jwt_setup().await;
    let p = &s.principal;
    let channel = p.plain_channel().await;
    let svid = s.agent.fetch_svid(AUDIENCE).await.expect("jwt-svid");

    let response = authenticate(&channel, "spiffe-jwt", token(svid.token()), &[]).await.expect("authenticate");
    assert_eq!(p.recorded.sessions(), 1);
    let created = p.recorded.sessions_created.0.lock().expect("lock")[0].clone();
    assert_eq!(created.identity.name().as_str(), "agent-1");
    assert_eq!(created.identity.binding(), &Binding::SpiffeId(AGENT.to_owned()));

    // Later calls present a (fresh) JWT-SVID of the same subject.
    let fresh = s.agent.fetch_svid(AUDIENCE).await.expect("jwt-svid");
    ping_with_metadata(&channel, Some(&response.access_token), &[("x-spiffe-jwt-svid", fresh.token())])
        .await
        .expect("protected call");
    assert_eq!(p.recorded.protected(), 1);

    // Without it, or with another agent's, the session token is refused.
    let status = ping_with(&channel, Some(&response.access_token)).await.expect_err("no jwt-svid");
    assert_unauthenticated(&status, "no JWT-SVID");
    let other = s.signer.sign(AGENT_2, &[AUDIENCE], SystemTime::now() + Duration::from_secs(60)).expect("jwt");
    let status = ping_with_metadata(&channel, Some(&response.access_token), &[("x-spiffe-jwt-svid", &other)])
        .await
        .expect_err("other subject");
    assert_unauthenticated(&status, "is bound to SPIFFE ID spiffe://cluster.local/ns/agents/sa/agent-1");
    assert_eq!(p.recorded.protected(), 1);

    // The JWT-SVID may also come in the metadata on Authenticate.
    authenticate(&channel, "spiffe-jwt", HashMap::new(), &[("x-spiffe-jwt-svid", fresh.token())])
        .await
        .expect("authenticate via metadata");
}

#[tokio::test]
async fn jwt_wrong_audience_is_unauthenticated() {
    let s = jwt_setup().await;
    let channel = s.principal.plain_channel().await;
    let svid = s.agent.fetch_svid("some-other-service").await.expect("jwt-svid");
    let status = authenticate(&channel, "spiffe-jwt", token(svid.token()), &[]).await.expect_err("audience");
    assert_unauthenticated(&status, "audience does not include \"argocd-agent-principal\"");
    s.principal.recorded.assert_nothing_created();
}

#[tokio::test]
async fn jwt_expired_is_unauthenticated() {
    let s = jwt_setup().await;
    let channel = s.principal.plain_channel().await;
    let expired = s.signer.sign(AGENT, &[AUDIENCE], SystemTime::now() - Duration::from_secs(30)).expect("jwt");
    let status = authenticate(&channel, "spiffe-jwt", token(&expired), &[]).await.expect_err("expired");
    assert_unauthenticated(&status, "expired");
    s.principal.recorded.assert_nothing_created();
}

#[tokio::test]
async fn jwt_signed_by_a_key_not_in_the_bundle_is_unauthenticated() {
    let s = jwt_setup().await;
    let channel = s.principal.plain_channel().await;
    for kid in ["td-key-1", "td-key-2"] {
        // Same kid as the real key, or an unknown kid: either way not the bundle's key.
        let stranger = TestJwtAuthority::new(TD, kid).expect("key");
        let forged = stranger.sign(AGENT, &[AUDIENCE], SystemTime::now() + Duration::from_secs(60)).expect("jwt");
        let status = authenticate(&channel, "spiffe-jwt", token(&forged), &[]).await.expect_err("forged");
        assert_unauthenticated(&status, "signature does not verify");
    }
    s.principal.recorded.assert_nothing_created();
}

#[tokio::test]
async fn jwt_missing_or_unauthorized_is_unauthenticated() {
    let s = jwt_setup().await;
    let channel = s.principal.plain_channel().await;
    let status = authenticate(&channel, "spiffe-jwt", HashMap::new(), &[]).await.expect_err("no token");
    assert_unauthenticated(&status, "no JWT-SVID");
    // Valid signature, but the policy allows only namespace `agents`.
    let outsider = s
        .signer
        .sign("spiffe://cluster.local/ns/default/sa/agent-1", &[AUDIENCE], SystemTime::now() + Duration::from_secs(60))
        .expect("jwt");
    let status = authenticate(&channel, "spiffe-jwt", token(&outsider), &[]).await.expect_err("namespace");
    assert_unauthenticated(&status, "not in the allowed namespaces");
    let status = authenticate(&channel, "spiffe-jwt", token("garbage"), &[]).await.expect_err("garbage");
    assert_unauthenticated(&status, "not a well-formed JWT-SVID");
    s.principal.recorded.assert_nothing_created();
}

// === upstream v0.10's spiffe-jwt:<regex> and its login-only binding ===

/// Upstream's `--spire-auth-method jwt` default with the socket as endpoint, and the binding.
async fn upstream_jwt_principal(
    signer: &TestJwtAuthority,
    binding: auth::method::spec::JwtSessionBinding,
) -> Principal {
    Principal::jwt_with(signer, |endpoint| {
        AuthMethodSpec::spire_default(auth::method::spec::SpireAuthMethod::Jwt, Some(&endpoint))
            .expect("upstream default")
            .with_jwt_binding(binding)
            .expect("a jwt method")
    })
    .await
}

#[tokio::test]
async fn upstream_jwt_agent_needs_the_login_only_opt_in_for_calls_after_authenticate() {
    let signer = TestJwtAuthority::new(TD, "td-key-1").expect("key");
    // Upstream's regex takes the whole path: an agent named by a one-segment SPIFFE path.
    const UPSTREAM_AGENT: &str = "spiffe://cluster.local/agent-1";
    let fresh = || signer.sign(UPSTREAM_AGENT, &[AUDIENCE], SystemTime::now() + Duration::from_secs(60)).expect("jwt");

    // Default (ours): the session token alone is refused after Authenticate, as a v0.10 Go
    // agent sends it.
    let strict = upstream_jwt_principal(&signer, auth::method::spec::JwtSessionBinding::EveryCall).await;
    let channel = strict.plain_channel().await;
    let response = authenticate(&channel, "spiffe-jwt", token(&fresh()), &[]).await.expect("authenticate");
    let created = strict.recorded.sessions_created.0.lock().expect("lock")[0].clone();
    assert_eq!(created.identity.name().as_str(), "agent-1");
    assert_eq!(created.identity.binding(), &Binding::SpiffeId(UPSTREAM_AGENT.to_owned()));
    let status = ping_with(&channel, Some(&response.access_token)).await.expect_err("token alone");
    assert_unauthenticated(&status, "no JWT-SVID");
    assert_eq!(strict.recorded.protected(), 0);

    // Opted in: the token alone passes, as with upstream's principal ...
    let login_only = upstream_jwt_principal(&signer, auth::method::spec::JwtSessionBinding::LoginOnly).await;
    let channel = login_only.plain_channel().await;
    let response = authenticate(&channel, "spiffe-jwt", token(&fresh()), &[]).await.expect("authenticate");
    ping_with(&channel, Some(&response.access_token)).await.expect("token alone, login-only");
    assert_eq!(login_only.recorded.protected(), 1);
    // ... but a call presenting another workload's JWT-SVID is still refused.
    let other = signer.sign("spiffe://cluster.local/agent-2", &[AUDIENCE], SystemTime::now() + Duration::from_secs(60));
    let status =
        ping_with_metadata(&channel, Some(&response.access_token), &[("x-spiffe-jwt-svid", &other.expect("jwt"))])
            .await
            .expect_err("other subject");
    assert_unauthenticated(&status, "is bound to SPIFFE ID spiffe://cluster.local/agent-1");
    // The regex still decides who is an agent: a multi-segment path is no agent name.
    let status = authenticate(
        &channel,
        "spiffe-jwt",
        token(&signer.sign(AGENT, &[AUDIENCE], SystemTime::now() + Duration::from_secs(60)).expect("jwt")),
        &[],
    )
    .await
    .expect_err("not a DNS label");
    assert_unauthenticated(&status, "not a valid DNS-1123 label");
    assert_eq!(login_only.recorded.protected(), 1);
}
