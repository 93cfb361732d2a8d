//! What the component tests share: the principal's services around the auth layer (`Version`,
//! a protected `EventStream` that records every call reaching it), a session hook recording every
//! session created, and call and assertion helpers.

// Each test binary uses a part of this module; harness failures are test failures.
#![allow(dead_code, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use auth::{
    AgentSession, AuthLayer, AuthMethodSpec, AuthMethods, AuthService, AuthServiceConfig, NewSession, SessionHook,
    SessionIssuer, Sessions, SigningKey, VersionCheck,
};
use protocol::pb::authapi::AuthRequest;
use protocol::pb::authapi::authentication_server::AuthenticationServer;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::pb::eventstreamapi::event_stream_server::{EventStream, EventStreamServer};
use protocol::pb::eventstreamapi::{Event, PingRequest, PongReply, PushSummary};
use protocol::pb::versionapi::version_server::{Version, VersionServer};
use protocol::pb::versionapi::{VersionRequest, VersionResponse};
use tonic::transport::Channel;
use tonic::transport::server::Router;
use tonic::{Code, Request, Response, Status, Streaming};
use tower::layer::util::{Identity, Stack};

pub const KEY_A: &str = include_str!("../fixtures/jwt-key-a.pem");
pub const KEY_B: &str = include_str!("../fixtures/jwt-key-b.pem");
pub const VERSION: &str = "0.1.0-test";
pub const PRINCIPAL_NAMESPACE: &str = "argocd";

// === Services ===

/// Records every session `Authenticate` creates.
#[derive(Clone, Default)]
pub struct RecordingHook(pub Arc<Mutex<Vec<NewSession>>>);

impl SessionHook for RecordingHook {
    async fn on_authenticated(&self, session: &NewSession) -> Result<(), Status> {
        self.0.lock().expect("lock").push(session.clone());
        Ok(())
    }
}

/// The public `Version` service.
pub struct TestVersion;

#[tonic::async_trait]
impl Version for TestVersion {
    async fn version(&self, _: Request<VersionRequest>) -> Result<Response<VersionResponse>, Status> {
        Ok(Response::new(VersionResponse { version: format!("argocd-agent-{VERSION}") }))
    }
}

/// The protected service: records the session of every call that reaches it.
#[derive(Clone, Default)]
pub struct TestEvents(pub Arc<Mutex<Vec<AgentSession>>>);

#[tonic::async_trait]
impl EventStream for TestEvents {
    type SubscribeStream = tokio_stream::Empty<Result<Event, Status>>;

    async fn subscribe(&self, request: Request<Streaming<Event>>) -> Result<Response<Self::SubscribeStream>, Status> {
        self.0.lock().expect("lock").push(AgentSession::from_request(&request)?.clone());
        Ok(Response::new(tokio_stream::empty()))
    }

    async fn push(&self, _: Request<Streaming<Event>>) -> Result<Response<PushSummary>, Status> {
        Err(Status::unimplemented("push"))
    }

    async fn ping(&self, request: Request<PingRequest>) -> Result<Response<PongReply>, Status> {
        self.0.lock().expect("lock").push(AgentSession::from_request(&request)?.clone());
        Ok(Response::new(PongReply {}))
    }
}

// === Principal ===

/// What reached the principal: sessions created and protected calls served.
#[derive(Clone, Default)]
pub struct Recorders {
    pub sessions_created: RecordingHook,
    pub protected_calls: TestEvents,
}

impl Recorders {
    pub fn sessions(&self) -> usize {
        self.sessions_created.0.lock().expect("lock").len()
    }

    pub fn protected(&self) -> usize {
        self.protected_calls.0.lock().expect("lock").len()
    }

    pub fn assert_nothing_created(&self) {
        assert_eq!(self.sessions(), 0, "no session may be created");
        assert_eq!(self.protected(), 0, "the protected service must not run");
    }
}

/// Sessions signed with [`KEY_A`], authenticated by `spec`'s method.
pub fn sessions(spec: &AuthMethodSpec) -> Sessions {
    let issuer = SessionIssuer::new(SigningKey::from_pem(KEY_A).expect("jwt key"));
    Sessions::new(issuer, AuthMethods::single(spec.authenticator())).with_principal_namespace(PRINCIPAL_NAMESPACE)
}

/// The principal's router: the auth layer in front of `Authentication`, `Version` and the
/// protected `EventStream`.
pub fn router(sessions: Sessions, recorders: &Recorders) -> Router<Stack<AuthLayer, Identity>> {
    let config = AuthServiceConfig {
        principal_version: VERSION.to_owned(),
        principal_namespace: PRINCIPAL_NAMESPACE.to_owned(),
        version_check: VersionCheck::Exact,
    };
    tonic::transport::Server::builder()
        .layer(AuthLayer::new(sessions.clone()))
        .add_service(AuthenticationServer::new(AuthService::new(sessions, config, recorders.sessions_created.clone())))
        .add_service(VersionServer::new(TestVersion))
        .add_service(EventStreamServer::new(recorders.protected_calls.clone()))
}

// === Calls ===

pub fn auth_request(method: &str) -> AuthRequest {
    AuthRequest {
        method: method.to_owned(),
        credentials: HashMap::new(),
        mode: "managed".to_owned(),
        version: VERSION.to_owned(),
        agent_namespace: "argocd".to_owned(),
    }
}

/// `Ping` with `token` (if any) and extra metadata.
pub async fn ping_with_metadata(
    channel: &Channel,
    token: Option<&str>,
    metadata: &[(&'static str, &str)],
) -> Result<PongReply, Status> {
    let mut request = Request::new(PingRequest {});
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", token.parse().expect("ascii"));
    }
    for (key, value) in metadata {
        request.metadata_mut().insert(*key, value.parse().expect("ascii"));
    }
    EventStreamClient::new(channel.clone()).ping(request).await.map(Response::into_inner)
}

pub async fn ping_with(channel: &Channel, token: Option<&str>) -> Result<PongReply, Status> {
    ping_with_metadata(channel, token, &[]).await
}

pub fn assert_unauthenticated(status: &Status, needle: &str) {
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains(needle), "expected {needle:?} in {:?}", status.message());
}
