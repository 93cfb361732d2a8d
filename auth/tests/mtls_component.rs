//! Component test: a real tonic server over real TLS on 127.0.0.1, with the auth layer, the
//! `Authentication` service, the (public) `Version` service and a protected `EventStream` service;
//! real tonic clients with rcgen certificates. Every refused call must leave no session: the
//! session hook is not called and the protected service never runs.

// Harness helpers outside `#[test]` fns set up fixtures; a failure there is a test failure.
#![allow(clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use auth::session::ManualClock;
use auth::tls::{ServerTlsSettings, TlsIncoming};
use auth::tls_policy::{TlsPolicy, TlsVersion};
use auth::{
    AgentIdentity, AgentMode, AgentName, AuthMethodSpec, AuthParams, Binding, Credentials, SessionIssuer, SigningKey,
};
use common::{KEY_A, KEY_B, PRINCIPAL_NAMESPACE, Recorders, VERSION, assert_unauthenticated, ping_with};
use protocol::pb::authapi::authentication_client::AuthenticationClient;
use protocol::pb::authapi::{AuthRequest, RefreshTokenRequest};
use protocol::pb::eventstreamapi::PingRequest;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::pb::versionapi::VersionRequest;
use protocol::pb::versionapi::version_client::VersionClient;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

// === PKI ===

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
    der: CertificateDer<'static>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("ca key");
        let cert = params.self_signed(&key).expect("ca cert");
        Self { pem: cert.pem(), der: cert.der().clone(), issuer: Issuer::new(params, key) }
    }

    fn leaf(&self, params: &CertificateParams) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("leaf cert");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        }
    }

    fn server(&self) -> Leaf {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
        params.distinguished_name.push(DnType::CommonName, "argocd-agent-principal");
        self.leaf(&params)
    }

    fn client(&self, cn: &str) -> Leaf {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.distinguished_name.push(DnType::OrganizationName, "argocd-agent");
        self.leaf(&params)
    }
}

struct Leaf {
    cert_pem: String,
    key_pem: String,
    der: Vec<u8>,
    key_der: Vec<u8>,
}

// === Harness ===

struct Principal {
    port: u16,
    ca: Ca,
    recorded: Recorders,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Principal {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Principal {
    async fn start() -> Self {
        let ca = Ca::new("argocd-agent-ca");
        let server_leaf = ca.server();
        let tls = auth::tls::server_config(ServerTlsSettings {
            require_client_cert: false,
            cert_chain: vec![CertificateDer::from(server_leaf.der.clone())],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_leaf.key_der.clone())),
            client_ca: Some(vec![ca.der.clone()]),
            policy: TlsPolicy { min: Some(TlsVersion::Tls13), ..TlsPolicy::default() },
        })
        .expect("tls config");

        let spec = AuthMethodSpec::parse("mtls:subject:CN=([^,]+)").expect("--auth");
        spec.check_listener(false).expect("mtls serves TLS");
        let recorded = Recorders::default();
        let router = common::router(common::sessions(&spec), &recorded);

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = tokio::spawn(async move {
            let _ = router.serve_with_incoming(TlsIncoming::new(listener, tls)).await;
        });
        Self { port, ca, recorded, server }
    }

    /// A connection presenting `client` (or no certificate), trusting `self.ca` for the server.
    async fn connect(&self, client: Option<&Leaf>) -> Result<Channel, tonic::transport::Error> {
        let mut tls =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca.pem)).domain_name("localhost");
        if let Some(client) = client {
            tls = tls.identity(Identity::from_pem(&client.cert_pem, &client.key_pem));
        }
        Endpoint::from_shared(format!("https://127.0.0.1:{}", self.port))?
            .tls_config(tls)?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
    }

    async fn channel(&self, client: Option<&Leaf>) -> Channel {
        self.connect(client).await.expect("connect")
    }

    fn sessions(&self) -> usize {
        self.recorded.sessions()
    }

    fn protected(&self) -> usize {
        self.recorded.protected()
    }

    fn assert_nothing_created(&self) {
        self.recorded.assert_nothing_created();
    }
}

fn params(mode: AgentMode) -> AuthParams {
    AuthParams {
        method: "mtls".to_owned(),
        credentials: HashMap::new(),
        mode,
        version: VERSION.to_owned(),
        agent_namespace: "argocd".to_owned(),
    }
}

fn auth_request() -> AuthRequest {
    common::auth_request("mtls")
}

/// A token for `leaf` minted outside the principal (another key, another time).
fn minted_token(pem: &str, now: SystemTime, leaf: &Leaf) -> String {
    let issuer =
        SessionIssuer::new(SigningKey::from_pem(pem).expect("key")).with_clock(Arc::new(ManualClock::new(now)));
    let identity =
        AgentIdentity::new(AgentName::new("agent-1").expect("name"), "mtls", Binding::certificate(&leaf.der));
    issuer.issue(&identity, AgentMode::Managed).expect("issue").access_token
}

// === Tests ===

#[tokio::test]
async fn valid_certificate_authenticates_and_calls_protected_services() {
    let p = Principal::start().await;
    let agent = p.ca.client("agent-1");
    let channel = p.channel(Some(&agent)).await;

    let credentials = Credentials::new();
    let mut auth_client = AuthenticationClient::new(channel.clone());
    let info = credentials.authenticate(&mut auth_client, &params(AgentMode::Managed)).await.expect("authenticate");
    assert_eq!((info.version.as_str(), info.namespace.as_str()), (VERSION, PRINCIPAL_NAMESPACE));
    assert_eq!(info.agent_name, "agent-1");
    assert_eq!(p.sessions(), 1);
    let created = p.recorded.sessions_created.0.lock().expect("lock")[0].clone();
    assert_eq!(created.identity.name().as_str(), "agent-1");
    assert_eq!(created.identity.binding(), &Binding::certificate(&agent.der));
    assert_eq!(created.mode, AgentMode::Managed);

    // Version is public.
    let version = VersionClient::new(channel.clone()).version(VersionRequest {}).await.expect("version");
    assert_eq!(version.into_inner().version, format!("argocd-agent-{VERSION}"));

    // Protected unary call and stream open, with the interceptor.
    let mut events = EventStreamClient::with_interceptor(channel.clone(), credentials.interceptor());
    events.ping(PingRequest {}).await.expect("ping");
    events.subscribe(tokio_stream::empty()).await.expect("subscribe");
    {
        let calls = p.recorded.protected_calls.0.lock().expect("lock");
        assert_eq!(calls.len(), 2);
        assert!(calls.iter().all(|s| s.identity.name().as_str() == "agent-1" && s.mode == AgentMode::Managed));
    }

    // Without a token the same connection is refused, on unary calls and stream opens.
    let status = ping_with(&channel, None).await.expect_err("no token");
    assert_unauthenticated(&status, "no access token");
    let status = EventStreamClient::new(channel.clone()).subscribe(tokio_stream::empty()).await.expect_err("no token");
    assert_unauthenticated(&status, "no access token");

    // Refresh, then the new access token works; a `Bearer ` prefix is accepted too.
    let before = credentials.access_token();
    credentials.refresh(&mut auth_client).await.expect("refresh");
    assert_ne!(credentials.access_token(), before);
    let bearer = format!("Bearer {}", credentials.access_token().expect("token"));
    ping_with(&channel, Some(&bearer)).await.expect("bearer");

    // The binding is to the certificate, not the TCP connection: a new connection with the same
    // certificate may use the token.
    let again = p.channel(Some(&agent)).await;
    ping_with(&again, credentials.access_token().as_deref()).await.expect("same certificate");
    assert_eq!(p.sessions(), 1);
}

#[tokio::test]
async fn no_client_certificate_is_unauthenticated_naming_it() {
    let p = Principal::start().await;
    let channel = p.channel(None).await;
    let status = AuthenticationClient::new(channel.clone()).authenticate(auth_request()).await.expect_err("no cert");
    assert_unauthenticated(&status, "no client certificate: the agent connected over TLS without one");

    // A valid token of agent-1 does not help a connection without its certificate.
    let agent = p.ca.client("agent-1");
    let token = minted_token(KEY_A, SystemTime::now(), &agent);
    let status = ping_with(&channel, Some(&token)).await.expect_err("no cert");
    assert_unauthenticated(&status, "presents none");
    p.assert_nothing_created();
}

#[tokio::test]
async fn certificate_from_another_ca_fails() {
    let p = Principal::start().await;
    let rogue = Ca::new("rogue-ca").client("agent-1");
    // TLS 1.3 clients finish their side before the server checks their certificate, so the
    // refusal may surface at connect or at the first call.
    let refusal = match p.connect(Some(&rogue)).await {
        Err(error) => format!("{error:?}"),
        Ok(channel) => {
            let status = AuthenticationClient::new(channel).authenticate(auth_request()).await.expect_err("rogue");
            assert_ne!(status.code(), Code::Ok);
            format!("{status:?}")
        }
    };
    assert!(refusal.contains("UnknownCA") || refusal.to_lowercase().contains("certificate"), "{refusal}");
    p.assert_nothing_created();
}

#[tokio::test]
async fn common_name_that_is_not_a_dns_label_is_unauthenticated() {
    let p = Principal::start().await;
    let agent = p.ca.client("Agent_1");
    let channel = p.channel(Some(&agent)).await;
    let status = AuthenticationClient::new(channel).authenticate(auth_request()).await.expect_err("bad name");
    assert_unauthenticated(&status, "not a valid DNS-1123 label");
    assert!(status.message().contains("Agent_1"), "{}", status.message());
    p.assert_nothing_created();
}

#[tokio::test]
async fn expired_token_is_unauthenticated() {
    let p = Principal::start().await;
    let agent = p.ca.client("agent-1");
    let channel = p.channel(Some(&agent)).await;
    let token = minted_token(KEY_A, SystemTime::now() - Duration::from_secs(3600), &agent);
    let status = ping_with(&channel, Some(&token)).await.expect_err("expired");
    assert_unauthenticated(&status, "expired");
    p.assert_nothing_created();
}

#[tokio::test]
async fn token_signed_with_another_key_is_unauthenticated() {
    let p = Principal::start().await;
    let agent = p.ca.client("agent-1");
    let channel = p.channel(Some(&agent)).await;
    let token = minted_token(KEY_B, SystemTime::now(), &agent);
    let status = ping_with(&channel, Some(&token)).await.expect_err("other key");
    assert_unauthenticated(&status, "signed with another key");
    p.assert_nothing_created();
}

#[tokio::test]
async fn token_used_over_a_connection_with_another_certificate_is_unauthenticated() {
    let p = Principal::start().await;
    let agent_1 = p.ca.client("agent-1");
    let agent_2 = p.ca.client("agent-2");
    let first = p.channel(Some(&agent_1)).await;
    let second = p.channel(Some(&agent_2)).await;

    let response = AuthenticationClient::new(first).authenticate(auth_request()).await.expect("authenticate");
    let tokens = response.into_inner();
    assert_eq!(p.sessions(), 1);

    let status = ping_with(&second, Some(&tokens.access_token)).await.expect_err("other certificate");
    assert_unauthenticated(&status, "bound to client certificate");
    let request = RefreshTokenRequest { refresh_token: tokens.refresh_token.clone() };
    let status = AuthenticationClient::new(second.clone()).refresh_token(request).await.expect_err("refresh elsewhere");
    assert_unauthenticated(&status, "bound to client certificate");

    // A refresh token is not an access token.
    let status = ping_with(&second, Some(&tokens.refresh_token)).await.expect_err("refresh as access");
    assert_unauthenticated(&status, "argocd-agent-server-refresh");

    assert_eq!(p.sessions(), 1, "no further session");
    assert_eq!(p.protected(), 0);
}

#[tokio::test]
async fn authenticate_checks_mode_method_version_and_reserved_names() {
    let p = Principal::start().await;
    let agent = p.ca.client("agent-1");
    let mut client = AuthenticationClient::new(p.channel(Some(&agent)).await);

    let status = client.authenticate(AuthRequest { mode: "bogus".into(), ..auth_request() }).await.expect_err("mode");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = client.authenticate(AuthRequest { method: "userpass".into(), ..auth_request() }).await.expect_err("m");
    assert_unauthenticated(&status, "accepts \"mtls\"");
    let status = client.authenticate(AuthRequest { version: String::new(), ..auth_request() }).await.expect_err("v");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = client.authenticate(AuthRequest { version: "9.9.9".into(), ..auth_request() }).await.expect_err("v");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("version mismatch"), "{status:?}");

    let reserved = p.ca.client(PRINCIPAL_NAMESPACE);
    let status = AuthenticationClient::new(p.channel(Some(&reserved)).await)
        .authenticate(auth_request())
        .await
        .expect_err("reserved");
    assert_unauthenticated(&status, "principal's namespace");
    p.assert_nothing_created();
}
