//! The Workload API sources against the fake Workload API: SVIDs and bundles arrive, a missing
//! socket fails within the timeout, rustls configs from the sources do mTLS, an X.509 rotation
//! reaches new handshakes while an established connection stays up, and JWT-SVIDs verify.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mesh::workload::testing::{FakeWorkloadApi, JwtMaterial, TestCa, TestJwtAuthority, X509Material};
use mesh::workload::{JwtIdentity, JwtSvidRejection, PeerAuthorization, WorkloadError, X509Identity, peer_spiffe_id};
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::{TlsAcceptor, TlsConnector};

const TD: &str = "cluster.local";
const PRINCIPAL: &str = "spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal";
const AGENT: &str = "spiffe://cluster.local/ns/agents/sa/agent-1";
const SYNC: Duration = Duration::from_secs(10);

async fn x509(api: &FakeWorkloadApi) -> X509Identity {
    X509Identity::connect(Some(&api.endpoint()), SYNC).await.expect("x509 source")
}

#[tokio::test]
async fn source_gets_svid_and_bundle() {
    let ca = TestCa::new(TD).expect("ca");
    let other = TestCa::new("other.example").expect("ca");
    let material = X509Material::new(&ca, AGENT).expect("svid").federate(&other);
    let api = FakeWorkloadApi::start(Some(material.clone()), None).await.expect("fake");
    let identity = x509(&api).await;
    assert_eq!(identity.spiffe_id().expect("id").to_string(), AGENT);
    assert_eq!(api_svid_der(&identity), material.svid.cert_der);
    assert_eq!(identity.endpoint(), api.endpoint());
    let bundles = identity.bundle_set().expect("bundles");
    for td in [TD, "other.example"] {
        let td = spiffe::TrustDomain::new(td).expect("td");
        assert!(bundles.get(&td).is_some(), "bundle for {td}");
    }
    assert!(format!("{identity:?}").contains(AGENT));
    identity.shutdown().await;
}

fn api_svid_der(identity: &X509Identity) -> Vec<u8> {
    identity.svid().expect("svid").leaf().as_ref().to_vec()
}

#[tokio::test]
async fn missing_socket_times_out_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("dir");
    let endpoint = format!("unix:{}", dir.path().join("absent.sock").display());
    let started = std::time::Instant::now();
    let err = X509Identity::connect(Some(&endpoint), Duration::from_millis(300)).await.expect_err("no socket");
    assert!(matches!(err, WorkloadError::InitialSyncTimeout { .. }), "{err}");
    assert!(err.to_string().contains("is the SPIRE agent"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = JwtIdentity::connect(Some(&endpoint), Duration::from_millis(300)).await.expect_err("no socket");
    assert!(matches!(err, WorkloadError::InitialSyncTimeout { what: "JWT bundles", .. }), "{err}");
}

/// A TLS echo server: reports each connection's peer SPIFFE ID, then echoes.
async fn echo_server(config: Arc<rustls::ServerConfig>) -> (u16, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = mpsc::unbounded_channel();
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let peer = tls.get_ref().1.peer_certificates().map(<[CertificateDer<'_>]>::to_vec).unwrap_or_default();
                let _ = tx.send(peer_spiffe_id(&peer).map_or_else(|e| e.to_string(), |id| id.to_string()));
                let mut buf = [0u8; 64];
                while let Ok(n) = tls.read(&mut buf).await {
                    if n == 0 || tls.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, rx)
}

async fn connect(
    port: u16,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    TlsConnector::from(config).connect(ServerName::try_from("localhost").expect("name"), tcp).await
}

fn server_leaf(tls: &tokio_rustls::client::TlsStream<TcpStream>) -> Vec<u8> {
    tls.get_ref().1.peer_certificates().and_then(|c| c.first()).expect("server cert").as_ref().to_vec()
}

async fn echo(tls: &mut tokio_rustls::client::TlsStream<TcpStream>, msg: &[u8]) {
    tls.write_all(msg).await.expect("write");
    let mut buf = vec![0u8; msg.len()];
    tls.read_exact(&mut buf).await.expect("read");
    assert_eq!(buf, msg);
}

#[tokio::test]
async fn mtls_and_rotation_reach_new_handshakes_only() {
    let ca = TestCa::new(TD).expect("ca");
    let principal_api =
        FakeWorkloadApi::start(Some(X509Material::new(&ca, PRINCIPAL).expect("svid")), None).await.expect("fake");
    let agent_api =
        FakeWorkloadApi::start(Some(X509Material::new(&ca, AGENT).expect("svid")), None).await.expect("fake");
    let principal = x509(&principal_api).await;
    let agent = x509(&agent_api).await;

    let (port, mut peers) = echo_server(principal.server_config(&PeerAuthorization::Any).expect("server")).await;
    let pin = PeerAuthorization::Exact(vec![mesh::SpiffeId::parse(PRINCIPAL).expect("id")]);
    let client = agent.client_config(&pin).expect("client");

    let mut first = connect(port, client.clone()).await.expect("handshake");
    echo(&mut first, b"hello").await;
    assert_eq!(peers.recv().await.as_deref(), Some(AGENT), "the server sees the agent's SPIFFE ID");
    let before = server_leaf(&first);
    assert_eq!(before, api_svid_der(&principal));

    // Rotate the principal's SVID (same ID, new key) and wait until the source applied it.
    let mut updates = principal.source().updated();
    principal_api.rotate_x509(X509Material::new(&ca, PRINCIPAL).expect("svid"));
    tokio::time::timeout(Duration::from_secs(10), updates.changed()).await.expect("rotation in time").expect("update");
    let rotated = api_svid_der(&principal);
    assert_ne!(rotated, before);

    let mut second = connect(port, client.clone()).await.expect("handshake after rotation");
    echo(&mut second, b"again").await;
    assert_eq!(server_leaf(&second), rotated, "a new handshake presents the rotated SVID");
    assert_eq!(peers.recv().await.as_deref(), Some(AGENT));
    // The connection made before the rotation is still up and still works.
    echo(&mut first, b"still here").await;
    assert_eq!(server_leaf(&first), before);

    // A client pinning another server ID refuses the handshake.
    let wrong = PeerAuthorization::Exact(vec![mesh::SpiffeId::parse(AGENT).expect("id")]);
    let err = connect(port, agent.client_config(&wrong).expect("client")).await.expect_err("wrong server id");
    assert!(err.to_string().to_lowercase().contains("cert") || err.to_string().contains("SPIFFE"), "{err}");
}

#[tokio::test]
async fn client_from_another_trust_domain_fails_the_handshake() {
    let ca = TestCa::new(TD).expect("ca");
    let foreign = TestCa::new("evil.example").expect("ca");
    let principal_api =
        FakeWorkloadApi::start(Some(X509Material::new(&ca, PRINCIPAL).expect("svid")), None).await.expect("fake");
    // The foreign agent trusts the principal's CA, but the principal does not trust its CA.
    let agent_api = FakeWorkloadApi::start(
        Some(X509Material::new(&foreign, "spiffe://evil.example/ns/agents/sa/agent-1").expect("svid").federate(&ca)),
        None,
    )
    .await
    .expect("fake");
    let principal = x509(&principal_api).await;
    let agent = x509(&agent_api).await;
    let (port, mut peers) = echo_server(principal.server_config(&PeerAuthorization::Any).expect("server")).await;
    let client = agent.client_config(&PeerAuthorization::Any).expect("client");
    // TLS 1.3: the client learns of the refusal on its first read.
    let result = async {
        let mut tls = connect(port, client).await?;
        tls.write_all(b"x").await?;
        let mut buf = [0u8; 1];
        tls.read_exact(&mut buf).await.map(|_| ())
    }
    .await;
    assert!(result.is_err(), "a client SVID from an untrusted trust domain must not get through");
    assert!(tokio::time::timeout(Duration::from_millis(200), peers.recv()).await.is_err(), "no connection served");
}

#[tokio::test]
async fn jwt_svids_are_fetched_and_verified() {
    let signer = TestJwtAuthority::new(TD, "key-1").expect("key");
    let stranger = TestJwtAuthority::new(TD, "key-2").expect("key");
    let api = FakeWorkloadApi::start(None, Some(JwtMaterial::new(AGENT, signer.clone()))).await.expect("fake");
    let jwt = JwtIdentity::connect(Some(&api.endpoint()), SYNC).await.expect("jwt source");

    let svid = jwt.fetch_svid("argocd-agent-principal").await.expect("jwt-svid");
    assert_eq!(svid.spiffe_id().to_string(), AGENT);
    assert!(svid.expires_at() > SystemTime::now());
    assert!(!format!("{svid:?}").contains(svid.token()), "Debug never prints the token");

    let ok = jwt.validate(svid.token(), "argocd-agent-principal").expect("valid");
    assert_eq!(ok.spiffe_id().to_string(), AGENT);

    let err = jwt.validate(svid.token(), "someone-else").expect_err("audience");
    assert!(matches!(err, JwtSvidRejection::WrongAudience { .. }), "{err}");
    let expired =
        signer.sign(AGENT, &["argocd-agent-principal"], SystemTime::now() - Duration::from_secs(60)).expect("jwt");
    let err = jwt.validate(&expired, "argocd-agent-principal").expect_err("expired");
    assert!(matches!(err, JwtSvidRejection::Expired(_)), "{err}");
    let forged =
        stranger.sign(AGENT, &["argocd-agent-principal"], SystemTime::now() + Duration::from_secs(60)).expect("jwt");
    let err = jwt.validate(&forged, "argocd-agent-principal").expect_err("unknown key");
    assert!(matches!(err, JwtSvidRejection::BadSignature(_)), "{err}");
    let err = jwt.validate("not.a.jwt", "argocd-agent-principal").expect_err("garbage");
    assert!(matches!(err, JwtSvidRejection::Malformed(_)), "{err}");

    // Publishing the second key (bundle rotation) makes its tokens valid.
    let mut updates = jwt_updates(&jwt);
    api.rotate_jwt(JwtMaterial::new(AGENT, signer).trust(&stranger));
    tokio::time::timeout(Duration::from_secs(10), updates.changed()).await.expect("in time").expect("update");
    jwt.validate(&forged, "argocd-agent-principal").expect("key now in the bundle");

    // Validations are cached per bundle set: a token that validated (and is cached) is refused
    // as soon as the bundle no longer holds its key.
    jwt.validate(svid.token(), "argocd-agent-principal").expect("still valid, cached");
    jwt.validate(svid.token(), "argocd-agent-principal").expect("a cache hit");
    let mut updates = jwt_updates(&jwt);
    api.rotate_jwt(JwtMaterial::new(AGENT, stranger));
    tokio::time::timeout(Duration::from_secs(10), updates.changed()).await.expect("in time").expect("update");
    let err = jwt.validate(svid.token(), "argocd-agent-principal").expect_err("its key left the bundle");
    assert!(matches!(err, JwtSvidRejection::BadSignature(_)), "{err}");
    let err = jwt.validate(svid.token(), "someone-else").expect_err("audience is part of the key");
    assert!(!matches!(err, JwtSvidRejection::NoBundles(_)), "{err}");
}

fn jwt_updates(jwt: &JwtIdentity) -> spiffe::JwtSourceUpdates {
    jwt.source().updated()
}

#[test]
fn peer_spiffe_id_needs_exactly_one_spiffe_uri_san() {
    use mesh::workload::PeerIdError;
    use rcgen::{CertificateParams, KeyPair, SanType};

    let cert = |uris: &[&str]| {
        let mut params = CertificateParams::default();
        params.subject_alt_names = uris.iter().map(|u| SanType::URI((*u).try_into().expect("ia5"))).collect();
        let key = KeyPair::generate().expect("key");
        CertificateDer::from(params.self_signed(&key).expect("cert").der().to_vec())
    };
    assert_eq!(peer_spiffe_id(&[cert(&[AGENT])]).expect("id").to_string(), AGENT);
    assert_eq!(peer_spiffe_id(&[]), Err(PeerIdError::NoCertificate));
    assert_eq!(peer_spiffe_id(&[cert(&[])]), Err(PeerIdError::UriSanCount(0)));
    assert_eq!(peer_spiffe_id(&[cert(&[AGENT, PRINCIPAL])]), Err(PeerIdError::UriSanCount(2)));
    assert!(matches!(peer_spiffe_id(&[cert(&["https://example.com/x"])]), Err(PeerIdError::NotSpiffeId { .. })));
    assert!(matches!(peer_spiffe_id(&[CertificateDer::from(vec![1, 2, 3])]), Err(PeerIdError::BadCertificate(_))));
}
