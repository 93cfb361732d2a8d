//! A raw tonic peer (no agent library) sends malformed and unknown events: each is answered
//! with an ACK and the stream stays up.

mod common;

use std::time::Duration;

use common::raw;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use principal::{Principal, PrincipalConfig, insecure_metadata_identity};
use protocol::pb::eventstreamapi::Event as WireEvent;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::pb::versionapi::VersionRequest;
use protocol::pb::versionapi::version_client::VersionClient;
use protocol::{Event, EventType, Target};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn malformed_and_unknown_events_are_acked_and_the_stream_stays_up() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let hub = apiserver::ApiServer::start(apiserver::Config::new(dir.path())).await?;
    let client = hub.client().await?;
    for ns in ["argocd", "agent-raw"] {
        let mut n = Namespace::default();
        n.metadata.name = Some(ns.into());
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &n).await?;
    }
    let mut config = PrincipalConfig::new("argocd");
    config.allowed_namespaces = vec!["agent-*".into()];
    let principal = Principal::new(config, client, insecure_metadata_identity()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let cancel = CancellationToken::new();
    let server = tokio::spawn(principal.serve(listener, cancel.clone()));

    let url = format!("http://{addr}");
    let version = VersionClient::connect(url.clone()).await?.version(VersionRequest {}).await?.into_inner();
    assert!(version.version.starts_with("argocd-agent-"));

    // No identity: refused.
    let (_tx0, rx0) = mpsc::channel::<WireEvent>(1);
    let refused = EventStreamClient::connect(url.clone()).await?.subscribe(ReceiverStream::new(rx0)).await;
    assert_eq!(refused.err().map(|s| s.code()), Some(tonic::Code::Unauthenticated));

    let (tx, rx) = mpsc::channel(16);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request.metadata_mut().insert("x-argocd-agent-name", "agent-raw".parse()?);
    request.metadata_mut().insert("x-argocd-agent-mode", "autonomous".parse()?);
    let mut inbound = EventStreamClient::connect(url).await?.subscribe(request).await?.into_inner();

    let app_type = EventType::Create.as_str();
    tx.send(raw("0.3", app_type, "application", "bad-version", "{}")).await?;
    tx.send(raw("1.0", app_type, "frobnicate", "unknown-schema", "{}")).await?;
    tx.send(raw("1.0", "io.argoproj.argocd-agent.event.frobnicate", "application", "unknown-type", "{}")).await?;
    tx.send(raw("1.0", app_type, "application", "bad-payload", "[1, 2, 3]")).await?;
    tx.send(raw("1.0", app_type, "application", "not-json", "{{{")).await?;
    tx.send(Event::heartbeat().to_wire()).await?;

    let mut acked = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while acked.len() < 6 {
        let msg = tokio::time::timeout_at(deadline, inbound.message()).await??;
        let ev = Event::from_wire(msg.ok_or_else(|| anyhow::anyhow!("stream ended"))?)?;
        if ev.event_type == EventType::Processed && ev.target == Target::EventProcessed {
            acked.push(ev.resource_id);
        }
    }
    for id in ["bad-version", "unknown-schema", "unknown-type", "bad-payload", "not-json"] {
        assert!(acked.iter().any(|a| a == id), "{id} was not acknowledged: {acked:?}");
    }
    cancel.cancel();
    drop(tx);
    server.await??;
    hub.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn principal_uid_is_created_once_and_survives_restarts() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let hub = apiserver::ApiServer::start(apiserver::Config::new(dir.path())).await?;
    let client = hub.client().await?;
    let mut n = Namespace::default();
    n.metadata.name = Some("argocd".into());
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &n).await?;
    let first = Principal::new(PrincipalConfig::new("argocd"), client.clone(), insecure_metadata_identity()).await?;
    let second = Principal::new(PrincipalConfig::new("argocd"), client, insecure_metadata_identity()).await?;
    assert!(!first.principal_uid().is_empty());
    assert_eq!(first.principal_uid(), second.principal_uid());
    hub.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_second_stream_of_the_same_agent_replaces_the_first() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let hub = apiserver::ApiServer::start(apiserver::Config::new(dir.path())).await?;
    let client = hub.client().await?;
    for ns in ["argocd", "agent-dup"] {
        let mut n = Namespace::default();
        n.metadata.name = Some(ns.into());
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &n).await?;
    }
    let mut config = PrincipalConfig::new("argocd");
    config.allowed_namespaces = vec!["agent-*".into()];
    let principal = Principal::new(config, client, insecure_metadata_identity()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let cancel = CancellationToken::new();
    let server = tokio::spawn(principal.serve(listener, cancel.clone()));

    let open = |url: String| async move {
        let (tx, rx) = mpsc::channel::<WireEvent>(4);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        request.metadata_mut().insert("x-argocd-agent-name", "agent-dup".parse()?);
        request.metadata_mut().insert("x-argocd-agent-mode", "managed".parse()?);
        let inbound = EventStreamClient::connect(url).await?.subscribe(request).await?.into_inner();
        anyhow::Ok((tx, inbound))
    };
    let (_tx1, mut first) = open(url.clone()).await?;
    let (_tx2, _second) = open(url).await?;
    // The first stream ends (after whatever resync events were already queued for it).
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match first.message().await {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the first stream must end once the second attaches");
    cancel.cancel();
    server.await??;
    hub.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn an_agent_error_marks_the_hub_application_degraded() -> anyhow::Result<()> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let dir = tempfile::tempdir()?;
    let hub = apiserver::ApiServer::start(apiserver::Config::new(dir.path())).await?;
    let client = hub.client().await?;
    for ns in ["argocd", "agent-err"] {
        let mut n = Namespace::default();
        n.metadata.name = Some(ns.into());
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &n).await?;
    }
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    );
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), "agent-err", &ar);
    let app: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "broken", "namespace": "agent-err"},
        "spec": {"project": "default"},
    }))?;
    apps.create(&PostParams::default(), &app).await?;

    let mut config = PrincipalConfig::new("argocd");
    config.allowed_namespaces = vec!["agent-*".into()];
    let principal = Principal::new(config, client, insecure_metadata_identity()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let cancel = CancellationToken::new();
    let server = tokio::spawn(principal.serve(listener, cancel.clone()));

    let (tx, rx) = mpsc::channel(4);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request.metadata_mut().insert("x-argocd-agent-name", "agent-err".parse()?);
    request.metadata_mut().insert("x-argocd-agent-mode", "managed".parse()?);
    let _inbound = EventStreamClient::connect(url).await?.subscribe(request).await?.into_inner();
    let data = protocol::payload::ErrorData {
        resource_name: "broken".into(),
        resource_namespace: "argocd".into(),
        message: "cannot apply".into(),
    };
    let ev = Event::new(EventType::Error, Target::Application, "broken_x", "e1").with_json(&data)?;
    tx.send(ev.to_wire()).await?;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let obj = serde_json::to_value(apps.get("broken").await?)?;
        let degraded = obj.pointer("/status/health/status").and_then(|v| v.as_str()) == Some("Degraded");
        let condition = obj.pointer("/status/conditions/0/type").and_then(|v| v.as_str()) == Some("AgentError");
        if degraded && condition {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "hub app not marked degraded: {obj}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cancel.cancel();
    server.await??;
    hub.shutdown().await;
    Ok(())
}
