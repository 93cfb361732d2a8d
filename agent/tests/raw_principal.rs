//! A fake principal (a bare tonic EventStream server) sends the agent malformed and unknown
//! events: each is acknowledged, the stream stays up, and a valid event after them applies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use agent::{Agent, AgentConfig, AgentMode};
use common::*;
use protocol::argocd::Application;
use protocol::pb::cloudevents::CloudEvent;
use protocol::pb::cloudevents::cloud_event::cloud_event_attribute_value::Attr;
use protocol::pb::cloudevents::cloud_event::{CloudEventAttributeValue, Data};
use protocol::pb::eventstreamapi::event_stream_server::{EventStream, EventStreamServer};
use protocol::pb::eventstreamapi::{Event as WireEvent, PingRequest, PongReply, PushSummary};
use protocol::{Event, EventType, Target};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

struct FakePrincipal {
    to_agent: Mutex<Option<mpsc::Receiver<Result<WireEvent, Status>>>>,
    from_agent: mpsc::UnboundedSender<WireEvent>,
}

#[tonic::async_trait]
impl EventStream for FakePrincipal {
    type SubscribeStream = ReceiverStream<Result<WireEvent, Status>>;

    async fn subscribe(&self, req: Request<Streaming<WireEvent>>) -> Result<Response<Self::SubscribeStream>, Status> {
        let rx = self.to_agent.lock().unwrap().take().ok_or_else(|| Status::unavailable("one stream only"))?;
        let mut inbound = req.into_inner();
        let fwd = self.from_agent.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                let _ = fwd.send(m);
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn push(&self, _req: Request<Streaming<WireEvent>>) -> Result<Response<PushSummary>, Status> {
        Err(Status::unimplemented("push"))
    }

    async fn ping(&self, _req: Request<PingRequest>) -> Result<Response<PongReply>, Status> {
        Err(Status::unimplemented("ping"))
    }
}

fn attr(s: &str) -> CloudEventAttributeValue {
    CloudEventAttributeValue { attr: Some(Attr::CeString(s.to_owned())) }
}

fn raw(spec_version: &str, ty: &str, schema: &str, resource_id: &str, data: &str) -> WireEvent {
    let attributes = HashMap::from([
        ("dataschema".to_owned(), attr(schema)),
        ("resourceid".to_owned(), attr(resource_id)),
        ("eventid".to_owned(), attr(&format!("{resource_id}-1"))),
    ]);
    WireEvent {
        event: Some(CloudEvent {
            id: String::new(),
            source: String::new(),
            spec_version: spec_version.into(),
            r#type: ty.into(),
            attributes,
            data: Some(Data::BinaryData(data.as_bytes().to_vec().into())),
        }),
    }
}

#[tokio::test]
async fn agent_acks_malformed_and_unknown_events_and_keeps_the_stream() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let spoke = apiserver::ApiServer::start(apiserver::Config::new(dir.path())).await.unwrap();
    let client = spoke.client().await.unwrap();
    let (to_agent, rx) = mpsc::channel(16);
    let (from_agent, mut agent_events) = mpsc::unbounded_channel();
    let fake = FakePrincipal { to_agent: Mutex::new(Some(rx)), from_agent };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(EventStreamServer::new(fake))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), cancel.clone().cancelled_owned()),
    );

    let mut config = AgentConfig::new(format!("http://{addr}"), AGENT, AgentMode::Managed);
    config.namespace = "default".into();
    let agent = Agent::new(config, client.clone()).unwrap();
    let agent_task = tokio::spawn({
        let cancel = cancel.clone();
        async move { agent.run(cancel).await }
    });

    let create = EventType::Create.as_str();
    to_agent.send(Ok(raw("0.3", create, "application", "bad-version", "{}"))).await.unwrap();
    to_agent.send(Ok(raw("1.0", create, "frobnicate", "unknown-schema", "{}"))).await.unwrap();
    to_agent
        .send(Ok(raw("1.0", "io.argoproj.argocd-agent.event.frobnicate", "application", "unknown-type", "{}")))
        .await
        .unwrap();
    to_agent.send(Ok(raw("1.0", create, "application", "bad-payload", "[1]"))).await.unwrap();
    let app: Application = serde_json::from_value(app_json("after", "hub-ns", "guestbook")).unwrap();
    let mut app = app;
    app.metadata.uid = Some("uid-1".into());
    app.metadata.resource_version = Some("1".into());
    let valid = Event::for_object(EventType::Create, Target::Application, &app.metadata, &app).unwrap();
    to_agent.send(Ok(valid.to_wire())).await.unwrap();
    // set-operation for an Application the spoke does not have: ACKed, and reported as `.error`.
    let mut ghost = app.clone();
    ghost.metadata.name = Some("ghost".into());
    ghost.metadata.uid = Some("uid-2".into());
    ghost.operation = Some(serde_json::json!({"sync": {}}));
    let set_op = Event::for_object(EventType::SetOperation, Target::Application, &ghost.metadata, &ghost).unwrap();
    to_agent.send(Ok(set_op.to_wire())).await.unwrap();

    let mut acked = Vec::new();
    let mut error_reported = false;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !error_reported
        || !["bad-version", "unknown-schema", "unknown-type", "bad-payload", "after_uid-1", "ghost_uid-2"]
            .iter()
            .all(|id| acked.iter().any(|a: &String| a == id))
    {
        let msg = tokio::time::timeout_at(deadline, agent_events.recv()).await.expect("acks in time").unwrap();
        let ev = Event::from_wire(msg).unwrap();
        if ev.is_ack() {
            acked.push(ev.resource_id);
        } else if ev.event_type == EventType::Error {
            let data: protocol::payload::ErrorData = ev.data_as().unwrap();
            assert_eq!(data.resource_name, "ghost");
            error_reported = true;
        }
    }
    let spoke_app =
        wait_obj(&apps(&client, "default"), "after", "valid event applied after the bad ones", |_| true).await;
    assert_eq!(
        spoke_app.pointer("/metadata/annotations/argocd.argoproj.io~1source-uid").and_then(|v| v.as_str()),
        Some("uid-1")
    );
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(10), agent_task).await.unwrap().unwrap();
    spoke.shutdown().await;
}

/// A principal replica that hands the agent over on its first stream (ends it with the reconnect
/// trailer), then keeps the next one.
struct HandingOver {
    subscribes: std::sync::atomic::AtomicUsize,
    kept: Mutex<Vec<mpsc::Sender<Result<WireEvent, Status>>>>,
}

#[tonic::async_trait]
impl EventStream for HandingOver {
    type SubscribeStream = ReceiverStream<Result<WireEvent, Status>>;

    async fn subscribe(&self, _req: Request<Streaming<WireEvent>>) -> Result<Response<Self::SubscribeStream>, Status> {
        let n = self.subscribes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (tx, rx) = mpsc::channel(4);
        if n == 0 {
            let mut status = Status::unavailable("the principal is shutting down");
            status.metadata_mut().insert("x-argocd-agent-reconnect", "immediately".parse().unwrap());
            tx.send(Err(status)).await.unwrap();
        } else {
            self.kept.lock().unwrap().push(tx);
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn push(&self, _req: Request<Streaming<WireEvent>>) -> Result<Response<PushSummary>, Status> {
        Err(Status::unimplemented("push"))
    }

    async fn ping(&self, _req: Request<PingRequest>) -> Result<Response<PongReply>, Status> {
        Err(Status::unimplemented("ping"))
    }
}

#[tokio::test]
async fn a_stream_ended_with_the_reconnect_trailer_is_reopened_without_backoff() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let spoke = apiserver::ApiServer::start(apiserver::Config::new(dir.path())).await.unwrap();
    let client = spoke.client().await.unwrap();
    let fake = std::sync::Arc::new(HandingOver {
        subscribes: std::sync::atomic::AtomicUsize::new(0),
        kept: Mutex::new(Vec::new()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(EventStreamServer::from_arc(fake.clone()))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), cancel.clone().cancelled_owned()),
    );
    let mut config = AgentConfig::new(format!("http://{addr}"), AGENT, AgentMode::Managed);
    config.namespace = "default".into();
    // A backoff no test waits out: only the trailer can bring the second stream in time.
    config.backoff.initial = Duration::from_secs(3600);
    config.backoff.max = Duration::from_secs(3600);
    let agent = Agent::new(config, client).unwrap();
    let agent_task = tokio::spawn({
        let cancel = cancel.clone();
        async move { agent.run(cancel).await }
    });
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while fake.subscribes.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "the agent did not reconnect at once after the handover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(10), agent_task).await.unwrap().unwrap();
    spoke.shutdown().await;
}
