//! Component test of the header-based mesh methods: a real tonic server in plaintext h2c on
//! 127.0.0.1, with the auth layer, the `Authentication` service and a protected `EventStream`
//! service; the test client plays the sidecar and sets the forwarded identity header itself.
//! Every refused call must leave no session: the session hook is not called and the protected
//! service never runs.

// Harness helpers outside `#[test]` fns set up fixtures; a failure there is a test failure.
#![allow(clippy::expect_used)]

mod common;

use std::time::Duration;

use auth::{
    AgentIdentity, AgentMode, AgentName, AuthMethodSpec, Binding, SessionIssuer, SigningKey, SpecError, TrustedHops,
    check_listener,
};
use common::{KEY_A, Recorders, assert_unauthenticated, ping_with_metadata};
use protocol::pb::authapi::authentication_client::AuthenticationClient;
use protocol::pb::authapi::{AuthResponse, RefreshTokenRequest};
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

const XFCC: &str = "x-forwarded-client-cert";
const ISTIO_REGEX_SPEC: &str = "header:x-forwarded-client-cert:^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)";

/// What an Istio sidecar forwards for a client presenting `uri`.
fn sidecar_xfcc(uri: &str) -> String {
    format!(
        "By=spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal;\
         Hash=4c8fb1f1a2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9;Subject=\"\";URI={uri}"
    )
}

struct Principal {
    port: u16,
    recorded: Recorders,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Principal {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Principal {
    /// A plaintext principal with `--auth spec`, trusting `trusted_hops` if given (else loopback).
    async fn start(spec: &str, trusted_hops: Option<&str>) -> Self {
        let mut spec = AuthMethodSpec::parse(spec).expect("--auth");
        if let Some(hops) = trusted_hops {
            spec = spec.with_trusted_hops(TrustedHops::parse_list(hops).expect("hops")).expect("trusted hops");
        }
        spec.check_listener(true).expect("plaintext behind a sidecar");
        let recorded = Recorders::default();
        let router = common::router(common::sessions(&spec), &recorded);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = tokio::spawn(async move {
            let _ = router.serve_with_incoming(TcpListenerStream::new(listener)).await;
        });
        Self { port, recorded, server }
    }

    async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://127.0.0.1:{}", self.port))
            .expect("endpoint")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect")
    }
}

/// `Authenticate` as a `--creds header:` agent, with `header: value` added by "the sidecar".
async fn authenticate(channel: &Channel, header: &'static str, value: Option<&str>) -> Result<AuthResponse, Status> {
    let mut request = Request::new(common::auth_request("header"));
    if let Some(value) = value {
        request.metadata_mut().insert(header, value.parse().expect("ascii"));
    }
    AuthenticationClient::new(channel.clone()).authenticate(request).await.map(tonic::Response::into_inner)
}

async fn refresh(channel: &Channel, token: &str, header: &'static str, value: &str) -> Result<AuthResponse, Status> {
    let mut request = Request::new(RefreshTokenRequest { refresh_token: token.to_owned() });
    request.metadata_mut().insert(header, value.parse().expect("ascii"));
    AuthenticationClient::new(channel.clone()).refresh_token(request).await.map(tonic::Response::into_inner)
}

/// An access token for `spiffe_id` signed with the principal's key, minted outside it.
fn minted_token(name: &str, spiffe_id: &str) -> String {
    let issuer = SessionIssuer::new(SigningKey::from_pem(KEY_A).expect("key"));
    let identity =
        AgentIdentity::new(AgentName::new(name).expect("name"), "header", Binding::SpiffeId(spiffe_id.to_owned()));
    issuer.issue(&identity, AgentMode::Managed).expect("issue").access_token
}

#[tokio::test]
async fn xfcc_from_the_sidecar_authenticates_and_calls_protected_services() {
    let p = Principal::start("xfcc:", None).await;
    let channel = p.channel().await;
    let id = "spiffe://cluster.local/ns/agents/sa/agent-1";
    // Earlier elements (another hop's) are history; the last one is our sidecar's.
    let xfcc = format!("URI=spiffe://cluster.local/ns/other/sa/someone-else,{}", sidecar_xfcc(id));

    let tokens = authenticate(&channel, XFCC, Some(&xfcc)).await.expect("authenticate");
    assert_eq!(p.recorded.sessions(), 1);
    let created = p.recorded.sessions_created.0.lock().expect("lock")[0].clone();
    assert_eq!(created.identity.name().as_str(), "agent-1");
    assert_eq!(created.identity.method(), "header");
    assert_eq!(created.identity.binding(), &Binding::SpiffeId(id.to_owned()));

    // Protected unary call and stream open, with the token and the sidecar's header.
    ping_with_metadata(&channel, Some(&tokens.access_token), &[(XFCC, &xfcc)]).await.expect("ping");
    let mut open = Request::new(tokio_stream::empty());
    open.metadata_mut().insert("authorization", tokens.access_token.parse().expect("ascii"));
    open.metadata_mut().insert(XFCC, xfcc.parse().expect("ascii"));
    EventStreamClient::new(channel.clone()).subscribe(open).await.expect("subscribe");
    {
        let calls = p.recorded.protected_calls.0.lock().expect("lock");
        assert_eq!(calls.len(), 2);
        assert!(calls.iter().all(|s| s.identity.name().as_str() == "agent-1" && s.mode == AgentMode::Managed));
    }

    // Refresh with the same identity works; the token alone, without the header, does not.
    let refreshed = refresh(&channel, &tokens.refresh_token, XFCC, &xfcc).await.expect("refresh");
    ping_with_metadata(&channel, Some(&refreshed.access_token), &[(XFCC, &xfcc)]).await.expect("ping");
    let status = ping_with_metadata(&channel, Some(&refreshed.access_token), &[]).await.expect_err("no header");
    assert_unauthenticated(&status, "no x-forwarded-client-cert header");
    assert_eq!(p.recorded.sessions(), 1);
    assert_eq!(p.recorded.protected(), 3);
}

#[tokio::test]
async fn header_from_an_untrusted_hop_is_never_read() {
    let p = Principal::start("xfcc:trusted-hops=10.9.9.9/32", None).await;
    let channel = p.channel().await;
    let id = "spiffe://cluster.local/ns/agents/sa/agent-1";
    for value in [sidecar_xfcc(id), "not;;an xfcc header\"".to_owned()] {
        let status = authenticate(&channel, XFCC, Some(&value)).await.expect_err("untrusted");
        assert_unauthenticated(&status, "127.0.0.1, which is not a trusted hop (trusted: 10.9.9.9/32)");
        assert!(status.message().contains("it was not read"), "{}", status.message());
        assert!(!status.message().contains("byte"), "the header must not be parsed: {}", status.message());
    }
    // A valid token of that identity does not help either.
    let token = minted_token("agent-1", id);
    let status = ping_with_metadata(&channel, Some(&token), &[(XFCC, &sidecar_xfcc(id))]).await.expect_err("untrusted");
    assert_unauthenticated(&status, "not a trusted hop");
    p.recorded.assert_nothing_created();
}

#[tokio::test]
async fn forwarded_identities_that_are_not_agents_are_refused_with_the_reason() {
    let p = Principal::start("xfcc:", None).await;
    let channel = p.channel().await;
    let by = "By=spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal;Hash=ab;Subject=\"\"";
    for (value, needle) in [
        (
            sidecar_xfcc("spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account"),
            "namespace \"istio-system\" is denied (a mesh gateway or control plane is never an agent)",
        ),
        (sidecar_xfcc("spiffe://evil.example/ns/agents/sa/agent-1"), "trust domain \"evil.example\" is not allowed"),
        (
            format!(
                "{by};URI=spiffe://cluster.local/ns/agents/sa/agent-1;URI=spiffe://cluster.local/ns/agents/sa/agent-2"
            ),
            "the client certificate has 2 URI SANs; an X.509-SVID has exactly one",
        ),
        (format!("{by};URI="), "the client certificate has no URI SAN"),
        (format!("{by};DNS=agent-1.example"), "has no URI"),
        (sidecar_xfcc("https://cluster.local/ns/agents/sa/agent-1"), "is not a SPIFFE ID"),
        ("URI=\"unterminated".to_owned(), "unterminated quote"),
    ] {
        let status = authenticate(&channel, XFCC, Some(&value)).await.expect_err(needle);
        assert_unauthenticated(&status, "the x-forwarded-client-cert header does not identify an agent");
        assert_unauthenticated(&status, needle);
    }
    let status = authenticate(&channel, XFCC, None).await.expect_err("no header");
    assert_unauthenticated(&status, "no x-forwarded-client-cert header");
    p.recorded.assert_nothing_created();
}

#[tokio::test]
async fn token_of_one_spiffe_identity_is_refused_with_another() {
    let p = Principal::start("xfcc:", None).await;
    let channel = p.channel().await;
    let agent_1 = sidecar_xfcc("spiffe://cluster.local/ns/a/sa/agent-1");
    let agent_2 = sidecar_xfcc("spiffe://cluster.local/ns/a/sa/agent-2");
    let tokens = authenticate(&channel, XFCC, Some(&agent_1)).await.expect("authenticate");
    assert_eq!(p.recorded.sessions(), 1);

    let status =
        ping_with_metadata(&channel, Some(&tokens.access_token), &[(XFCC, &agent_2)]).await.expect_err("other");
    assert_unauthenticated(
        &status,
        "bound to SPIFFE ID spiffe://cluster.local/ns/a/sa/agent-1, but this connection presents SPIFFE ID \
         spiffe://cluster.local/ns/a/sa/agent-2",
    );
    let status = refresh(&channel, &tokens.refresh_token, XFCC, &agent_2).await.expect_err("refresh as another");
    assert_unauthenticated(&status, "bound to SPIFFE ID spiffe://cluster.local/ns/a/sa/agent-1");
    assert_eq!(p.recorded.sessions(), 1, "no further session");
    assert_eq!(p.recorded.protected(), 0);
}

#[tokio::test]
async fn upstream_header_regex_mode_works_from_loopback() {
    let p = Principal::start(ISTIO_REGEX_SPEC, None).await;
    let channel = p.channel().await;
    let id = "spiffe://cluster.local/ns/agents/sa/agent-1";
    let tokens = authenticate(&channel, XFCC, Some(&sidecar_xfcc(id))).await.expect("authenticate");
    let created = p.recorded.sessions_created.0.lock().expect("lock")[0].clone();
    assert_eq!(created.identity.name().as_str(), "agent-1");
    assert_eq!(created.identity.binding(), &Binding::SpiffeId(id.to_owned()));
    ping_with_metadata(&channel, Some(&tokens.access_token), &[(XFCC, &sidecar_xfcc(id))]).await.expect("ping");
    let other = sidecar_xfcc("spiffe://cluster.local/ns/agents/sa/agent-2");
    let status = ping_with_metadata(&channel, Some(&tokens.access_token), &[(XFCC, &other)]).await.expect_err("other");
    assert_unauthenticated(&status, "bound to SPIFFE ID");
    let status = authenticate(&channel, XFCC, Some("Hash=ab;Subject=\"\"")).await.expect_err("no match");
    assert_unauthenticated(&status, "does not match the agent name regex");
    assert_eq!((p.recorded.sessions(), p.recorded.protected()), (1, 1));
}

#[tokio::test]
async fn upstream_linkerd_regex_binds_to_the_header_value() {
    let p = Principal::start(r"header:l5d-client-id:^([^.]+)\..*", None).await;
    let channel = p.channel().await;
    let value = "agent-1.agents.serviceaccount.identity.linkerd.cluster.local";
    let tokens = authenticate(&channel, "l5d-client-id", Some(value)).await.expect("authenticate");
    let created = p.recorded.sessions_created.0.lock().expect("lock")[0].clone();
    assert_eq!(created.identity.binding(), &Binding::header_value(value.as_bytes()));
    ping_with_metadata(&channel, Some(&tokens.access_token), &[("l5d-client-id", value)]).await.expect("ping");
    // The same agent name from another workload is another identity.
    let other = "agent-1.elsewhere.serviceaccount.identity.linkerd.cluster.local";
    let status =
        ping_with_metadata(&channel, Some(&tokens.access_token), &[("l5d-client-id", other)]).await.expect_err("other");
    assert_unauthenticated(&status, "bound to forwarded header value SHA-256");
    assert_eq!((p.recorded.sessions(), p.recorded.protected()), (1, 1));
}

#[tokio::test]
async fn upstream_header_regex_mode_is_refused_from_untrusted_hops() {
    let p = Principal::start(ISTIO_REGEX_SPEC, Some("10.9.9.9/32")).await;
    let channel = p.channel().await;
    let xfcc = sidecar_xfcc("spiffe://cluster.local/ns/agents/sa/agent-1");
    let status = authenticate(&channel, XFCC, Some(&xfcc)).await.expect_err("untrusted");
    assert_unauthenticated(&status, "127.0.0.1, which is not a trusted hop");
    let token = minted_token("agent-1", "spiffe://cluster.local/ns/agents/sa/agent-1");
    let status = ping_with_metadata(&channel, Some(&token), &[(XFCC, &xfcc)]).await.expect_err("untrusted");
    assert_unauthenticated(&status, "not a trusted hop");
    p.recorded.assert_nothing_created();
}

#[test]
fn listeners_that_do_not_fit_the_method_are_refused_at_startup() {
    let loopback = TrustedHops::loopback();
    for spec in ["xfcc:", ISTIO_REGEX_SPEC] {
        let spec = AuthMethodSpec::parse(spec).expect("--auth");
        assert!(matches!(check_listener(&spec, false, &loopback), Err(SpecError::PlaintextRequired { .. })));
        let everyone = TrustedHops::parse_list("0.0.0.0/0,::/0").expect("hops");
        assert!(matches!(check_listener(&spec, true, &everyone), Err(SpecError::UnrestrictedTrust { .. })));
        assert!(check_listener(&spec, true, &loopback).is_ok());
    }
    let mtls = AuthMethodSpec::parse("mtls:subject:CN=([^,]+)").expect("--auth");
    let err = check_listener(&mtls, true, &loopback).expect_err("mtls on plaintext");
    assert!(err.to_string().contains("a plaintext listener (--insecure-plaintext) never sees"), "{err}");
}
