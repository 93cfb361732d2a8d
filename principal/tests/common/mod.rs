//! What the principal's integration tests share: an embedded hub API server with a principal
//! serving on 127.0.0.1:0 (plain, or behind the auth crate's layer), raw tonic streams playing
//! the agent, raw CloudEvents, and waits on conditions with deadlines.

// Each test binary uses a part of this module; harness failures are test failures.
#![allow(dead_code, clippy::expect_used)]

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use principal::{IdentityFn, Principal, PrincipalConfig, insecure_metadata_identity};
use protocol::pb::authapi::authentication_client::AuthenticationClient;
use protocol::pb::authapi::authentication_server::AuthenticationServer;
use protocol::pb::authapi::{AuthRequest, AuthResponse, RefreshTokenRequest};
use protocol::pb::cloudevents::CloudEvent;
use protocol::pb::cloudevents::cloud_event::cloud_event_attribute_value::Attr;
use protocol::pb::cloudevents::cloud_event::{CloudEventAttributeValue, Data};
use protocol::pb::eventstreamapi::Event as WireEvent;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::{Event, EventType, Target};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

/// How long any single wait in these tests may take before it fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// The JWT signing key of the auth crate's fixtures.
pub const JWT_KEY: &str = include_str!("../../../auth/tests/fixtures/jwt-key-a.pem");

/// The forwarded identity header of the `header:` auth method the auth tests use.
pub const AGENT_HEADER: &str = "x-agent-id";

// === Raw events ===

pub fn attr(s: &str) -> CloudEventAttributeValue {
    CloudEventAttributeValue { attr: Some(Attr::CeString(s.to_owned())) }
}

/// A raw CloudEvent: spec version, type, `dataschema`, `resourceid` (event id
/// `<resourceid>-1`) and JSON text as data.
pub fn raw(spec_version: &str, ty: &str, schema: &str, resource_id: &str, data: &str) -> WireEvent {
    let attributes = HashMap::from([
        ("dataschema".to_owned(), attr(schema)),
        ("resourceid".to_owned(), attr(resource_id)),
        ("eventid".to_owned(), attr(&format!("{resource_id}-1"))),
        ("datacontenttype".to_owned(), attr("application/json")),
    ]);
    WireEvent {
        event: Some(CloudEvent {
            id: "x".into(),
            source: "raw".into(),
            spec_version: spec_version.into(),
            r#type: ty.into(),
            attributes,
            data: Some(Data::BinaryData(data.as_bytes().to_vec().into())),
        }),
    }
}

/// An autonomous agent's `create` of Application `name` (spoke namespace `argocd`), with
/// `filler` bytes in an annotation to make it as large as wanted.
pub fn autonomous_create(name: &str, filler: usize) -> anyhow::Result<Event> {
    let app = serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}"), "resourceVersion": "1",
            "annotations": {"filler": "x".repeat(filler)}},
        "spec": {"project": "default"},
    });
    let ev = Event::new(EventType::Create, Target::Application, format!("{name}_uid-{name}"), format!("{name}-1"))
        .with_json(&app)?;
    Ok(Event { subject: Some(format!("argocd/{name}")), ..ev })
}

/// Whether `ev` is the ACK of `resource_id`.
pub fn is_ack_of(ev: &Event, resource_id: &str) -> bool {
    ev.event_type == EventType::Processed && ev.target == Target::EventProcessed && ev.resource_id == resource_id
}

// === Hub and principal ===

/// An embedded hub with a principal serving agents on 127.0.0.1:0.
pub struct Harness {
    pub hub: apiserver::ApiServer,
    pub client: kube::Client,
    pub principal: Principal,
    pub url: String,
    /// The proxies between the principal and the hub ([`Harness::start_behind_proxies`]).
    pub proxies: Option<HubProxies>,
    cancel: CancellationToken,
    server: JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// A principal admitting `agent-*`, with namespaces `argocd` and `agents`, identifying
    /// callers from metadata ([`insecure_metadata_identity`]).
    pub async fn start(agents: &[&str], configure: impl FnOnce(&mut PrincipalConfig)) -> anyhow::Result<Self> {
        Self::start_inner(agents, configure, None, false).await
    }

    /// As [`Self::start`], with the principal reaching the hub through [`HubProxies`]: its
    /// watches through one proxy, every other request through another, so a test can hold back
    /// what the principal's watch cache sees, or make the hub unavailable to it.
    pub async fn start_behind_proxies(
        agents: &[&str],
        configure: impl FnOnce(&mut PrincipalConfig),
    ) -> anyhow::Result<Self> {
        Self::start_inner(agents, configure, None, true).await
    }

    /// The same behind the auth crate's layer verifying tokens of `sessions`, identifying
    /// callers from the session it establishes ([`principal::auth_layer_identity`]).
    pub async fn start_with_auth(
        agents: &[&str],
        configure: impl FnOnce(&mut PrincipalConfig),
        sessions: auth::Sessions,
    ) -> anyhow::Result<Self> {
        Self::start_inner(agents, configure, Some(sessions), false).await
    }

    async fn start_inner(
        agents: &[&str],
        configure: impl FnOnce(&mut PrincipalConfig),
        sessions: Option<auth::Sessions>,
        behind_proxies: bool,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let hub = apiserver::ApiServer::start(apiserver::Config::new(dir.path())).await?;
        let client = hub.client().await?;
        for ns in std::iter::once(&"argocd").chain(agents) {
            let mut n = Namespace::default();
            n.metadata.name = Some((*ns).into());
            Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &n).await?;
        }
        let mut config = PrincipalConfig::new("argocd");
        config.allowed_namespaces = vec!["agent-*".into()];
        configure(&mut config);
        let identity: IdentityFn =
            if sessions.is_some() { principal::auth_layer_identity() } else { insecure_metadata_identity() };
        let (principal_client, proxies) = if behind_proxies {
            let proxies = HubProxies::start(hub.addr()).await?;
            (proxies.client(&hub).await?, Some(proxies))
        } else {
            (client.clone(), None)
        };
        let principal = Principal::new(config, principal_client, identity).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let cancel = CancellationToken::new();
        let server = match sessions {
            None => {
                let serving = principal.clone().serve(listener, cancel.clone());
                tokio::spawn(async move { Ok(serving.await?) })
            }
            Some(sessions) => {
                let p = principal.clone();
                let cancel = cancel.clone();
                tokio::spawn(async move {
                    let watchers = tokio::spawn({
                        let (p, cancel) = (p.clone(), cancel.clone());
                        async move { p.run_watchers(cancel).await }
                    });
                    let shutdown = {
                        let (p, cancel) = (p.clone(), cancel.clone());
                        async move {
                            cancel.cancelled().await;
                            p.disconnect_all();
                        }
                    };
                    // As `argocd-agent principal` serves it: the auth layer in front of every
                    // call, and `Authenticate`/`RefreshToken` reporting to the principal's hook.
                    let auth_service = AuthenticationServer::new(auth::AuthService::new(
                        sessions.clone(),
                        auth::AuthServiceConfig {
                            principal_version: "test".into(),
                            principal_namespace: "argocd".into(),
                            version_check: auth::VersionCheck::Skip,
                        },
                        p.session_hook(),
                    ));
                    tonic::transport::Server::builder()
                        .layer(auth::AuthLayer::new(sessions))
                        .add_service(auth_service)
                        .add_service(p.event_stream_service())
                        .add_service(p.version_service())
                        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
                        .await?;
                    cancel.cancel();
                    watchers.await?;
                    Ok(())
                })
            }
        };
        Ok(Self { hub, client, principal, url, proxies, cancel, server, _dir: dir })
    }

    /// Applications in hub namespace `ns`.
    pub fn apps(&self, ns: &str) -> Api<DynamicObject> {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
            "applications",
        );
        Api::namespaced_with(self.client.clone(), ns, &ar)
    }

    /// Stops the principal (its streams end) and the hub.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.cancel.cancel();
        self.server.await??;
        self.hub.shutdown().await;
        Ok(())
    }
}

/// Sessions signed with [`JWT_KEY`] whose access tokens live `access`, authenticated by
/// `header:x-agent-id:<agent name>[;<instance>]` (a plaintext sidecar method, so the tests need
/// no TLS). The binding is the whole header value, so `agent-a;other` is another workload
/// claiming agent `agent-a`.
pub fn header_sessions(access: Duration) -> auth::Sessions {
    let spec =
        auth::AuthMethodSpec::parse(&format!("header:{AGENT_HEADER}:^([a-z0-9-]+)(;[a-z0-9=-]+)?$")).expect("--auth");
    spec.check_listener(true).expect("plaintext behind a sidecar");
    let lifetimes = auth::TokenLifetimes { access, ..auth::TokenLifetimes::default() };
    let issuer =
        auth::SessionIssuer::new(auth::SigningKey::from_pem(JWT_KEY).expect("jwt key")).with_lifetimes(lifetimes);
    auth::Sessions::new(issuer, auth::AuthMethods::single(spec.authenticator())).with_principal_namespace("argocd")
}

/// An access token for `agent` from `sessions`, bound to the header value the "sidecar" sends
/// for it (as `Authenticate` would issue it).
pub fn access_token(sessions: &auth::Sessions, agent: &str, mode: auth::AgentMode) -> String {
    let name = auth::AgentName::new(agent).expect("agent name");
    let identity = auth::AgentIdentity::new(name, "header", auth::Binding::header_value(agent.as_bytes()));
    sessions.issue(&identity, mode).expect("issue").access_token
}

/// Calls `Authenticate` (method `header`) as the workload whose sidecar forwards
/// `x-agent-id: <header>`.
pub async fn authenticate(url: &str, header: &str, mode: &str) -> anyhow::Result<AuthResponse> {
    let mut request = tonic::Request::new(AuthRequest {
        method: "header".into(),
        mode: mode.into(),
        version: "test".into(),
        ..Default::default()
    });
    request.metadata_mut().insert(AGENT_HEADER, header.parse()?);
    Ok(AuthenticationClient::connect(url.to_owned()).await?.authenticate(request).await?.into_inner())
}

/// Calls `RefreshToken` with `refresh_token` as the workload forwarding `x-agent-id: <header>`;
/// the principal's refusal is the inner error.
pub async fn refresh(url: &str, header: &str, refresh_token: &str) -> anyhow::Result<Result<AuthResponse, Status>> {
    let mut request = tonic::Request::new(RefreshTokenRequest { refresh_token: refresh_token.to_owned() });
    request.metadata_mut().insert(AGENT_HEADER, header.parse()?);
    let mut client = AuthenticationClient::connect(url.to_owned()).await?;
    Ok(client.refresh_token(request).await.map(tonic::Response::into_inner))
}

// === Raw agent streams ===

/// An open `Subscribe` stream: what the agent sends, what the principal sends.
pub struct RawStream {
    pub tx: mpsc::Sender<WireEvent>,
    pub inbound: Streaming<WireEvent>,
}

/// Opens `Subscribe` with `metadata`; the principal's refusal is the inner error.
pub async fn open_with(url: &str, metadata: &[(&'static str, &str)]) -> anyhow::Result<Result<RawStream, Status>> {
    let (tx, rx) = mpsc::channel::<WireEvent>(16);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    for (key, value) in metadata {
        request.metadata_mut().insert(*key, value.parse()?);
    }
    let mut client = EventStreamClient::connect(url.to_owned()).await?;
    Ok(client.subscribe(request).await.map(|r| RawStream { tx, inbound: r.into_inner() }))
}

/// Opens `Subscribe` as `agent` in `mode` through [`insecure_metadata_identity`].
pub async fn open_insecure(url: &str, agent: &str, mode: &str) -> anyhow::Result<RawStream> {
    Ok(open_with(url, &[("x-argocd-agent-name", agent), ("x-argocd-agent-mode", mode)]).await??)
}

/// Opens `Subscribe` as `agent` with access token `token`, the "sidecar" adding the agent's
/// identity header.
pub async fn open_with_token(url: &str, agent: &str, token: &str) -> anyhow::Result<Result<RawStream, Status>> {
    open_with(url, &[("authorization", token), (AGENT_HEADER, agent)]).await
}

/// The next event from the principal, decoded; fails when the stream ends or at `deadline`.
pub async fn next_event(inbound: &mut Streaming<WireEvent>, deadline: Instant) -> anyhow::Result<Event> {
    let msg = tokio::time::timeout_at(deadline, inbound.message())
        .await
        .map_err(|_| anyhow::anyhow!("no event from the principal before the deadline"))??;
    Ok(Event::from_wire(msg.ok_or_else(|| anyhow::anyhow!("the principal ended the stream"))?)?)
}

/// Reads events until `pred` holds for one (returned with everything read before it).
pub async fn read_until(
    inbound: &mut Streaming<WireEvent>,
    what: &str,
    mut pred: impl FnMut(&Event) -> bool,
) -> anyhow::Result<Vec<Event>> {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        let ev = next_event(inbound, deadline).await.map_err(|e| anyhow::anyhow!("waiting for {what}: {e}"))?;
        let done = pred(&ev);
        seen.push(ev);
        if done {
            return Ok(seen);
        }
    }
}

/// Reads the stream to its end: the events before it and the final status (`None`: a clean
/// end). Fails if it has not ended by the deadline.
pub async fn read_to_end(inbound: &mut Streaming<WireEvent>) -> anyhow::Result<(Vec<Event>, Option<Status>)> {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, inbound.message()).await {
            Err(_) => anyhow::bail!("the stream did not end before the deadline"),
            Ok(Ok(Some(msg))) => seen.extend(Event::from_wire(msg).ok()),
            Ok(Ok(None)) => return Ok((seen, None)),
            Ok(Err(status)) => return Ok((seen, Some(status))),
        }
    }
}

/// Polls `cond` until it holds; fails with `what` at the deadline.
pub async fn wait_until<F, Fut>(what: &str, mut cond: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if cond().await? {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// === The principal's way to the hub ===

/// What a [`Proxy`] does with the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forwards both ways.
    Open,
    /// Holds back what the hub sends (requests still go through) until the mode changes.
    Hold,
    /// The hub is unavailable: open connections are closed, new ones closed at once.
    Down,
}

/// A TCP proxy in front of the hub API server (TLS passes through untouched).
pub struct Proxy {
    pub addr: SocketAddr,
    mode: Arc<watch::Sender<ProxyMode>>,
    task: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// A proxy on 127.0.0.1:0 forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let mode = Arc::new(watch::Sender::new(ProxyMode::Open));
        let task = tokio::spawn({
            let mode = mode.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    if *mode.borrow() == ProxyMode::Down {
                        continue; // dropped: closed at once
                    }
                    tokio::spawn(Self::carry(client, upstream, mode.subscribe()));
                }
            }
        });
        Ok(Self { addr, mode, task })
    }

    /// Switches the proxy to `mode`.
    pub fn set(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    async fn carry(client: tokio::net::TcpStream, upstream: SocketAddr, mode: watch::Receiver<ProxyMode>) {
        let Ok(server) = tokio::net::TcpStream::connect(upstream).await else { return };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let (client_rx, client_tx) = client.into_split();
        let (server_rx, server_tx) = server.into_split();
        tokio::join!(
            Self::pump(client_rx, server_tx, mode.clone(), false),
            Self::pump(server_rx, client_tx, mode, true),
        );
    }

    /// Copies `from` to `to` until either ends or the proxy goes down; with `holds`, waits
    /// while the proxy holds (the bytes read so far wait with it).
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut mode: watch::Receiver<ProxyMode>,
        holds: bool,
    ) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = tokio::select! {
                read = from.read(&mut buf) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                },
                _ = mode.wait_for(|m| *m == ProxyMode::Down) => return,
            };
            let now =
                if holds { mode.wait_for(|m| *m != ProxyMode::Hold).await.map(|m| *m) } else { Ok(*mode.borrow()) };
            if matches!(now, Ok(ProxyMode::Down) | Err(_)) || to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    }
}

/// The principal's way to the hub: watches (`?watch=true`) through [`Self::watches`], every
/// other request through [`Self::requests`].
pub struct HubProxies {
    pub watches: Proxy,
    pub requests: Proxy,
}

impl HubProxies {
    async fn start(hub: SocketAddr) -> anyhow::Result<Self> {
        Ok(Self { watches: Proxy::start(hub).await?, requests: Proxy::start(hub).await? })
    }

    /// A client of `hub` sending watches and other requests through their proxies.
    async fn client(&self, hub: &apiserver::ApiServer) -> anyhow::Result<kube::Client> {
        let via = |proxy: SocketAddr| async move {
            let kc = kube::config::Kubeconfig::from_yaml(&hub.kubeconfig())?;
            let mut config =
                kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
            // The serving certificate names 127.0.0.1, which the proxy's address is too.
            config.cluster_url = format!("https://{proxy}").parse()?;
            anyhow::Ok(kube::Client::try_from(config)?)
        };
        let (watches, requests) = (via(self.watches.addr).await?, via(self.requests.addr).await?);
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let is_watch =
                request.uri().query().is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
            let client = if is_watch { watches.clone() } else { requests.clone() };
            async move { client.send(request).await }
        });
        Ok(kube::Client::new(service, "default"))
    }
}

// === Logs ===

/// Captures what the principal logs (warnings and above) on this thread while the guard lives:
/// a `#[tokio::test]` runs the harness's tasks on its one thread.
pub struct CapturedLogs {
    buf: Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    pub fn start() -> Self {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || LogWriter(writer.clone()))
            .finish();
        Self { buf, _guard: tracing::subscriber::set_default(subscriber) }
    }

    /// The lines logged so far.
    pub fn lines(&self) -> Vec<String> {
        let buf = self.buf.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&buf).lines().map(str::to_owned).collect()
    }
}
