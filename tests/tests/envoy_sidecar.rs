//! The repo's Envoy sidecar configs (`envoy/`) run by the real Envoy 1.40, with an h2c gRPC echo
//! backend standing in for the principal:
//!
//! ```text
//! client ─h2c─► agent sidecar ══mTLS══► principal sidecar ─h2c─► echo backend (records XFCC)
//! ```
//!
//! - the backend sees exactly one XFCC element, naming the client certificate's SPIFFE ID, and a
//!   header the client made up is replaced (`SANITIZE_SET`);
//! - a client without a certificate is refused at TLS, and the agent sidecar refuses a principal
//!   whose certificate does not carry the expected name;
//! - a bidi `Subscribe` stream survives a quiet period longer than the stream idle timeout when
//!   heartbeats flow below it, and Envoy closes it once they stop.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use protocol::pb::cloudevents::CloudEvent;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::pb::eventstreamapi::event_stream_server::{EventStream, EventStreamServer};
use protocol::pb::eventstreamapi::{Event, PingRequest, PongReply, PushSummary};
use rustls_pki_types::{CertificateDer, ServerName};
use tests::envoy::{EnvoySidecar, SidecarKind, SidecarParams, render, template, validate};
use tests::pki::Ca;
use tests::wait_for_async;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Server};
use tonic::{Request, Response, Status, Streaming};

const XFCC: &str = "x-forwarded-client-cert";
const AGENT_ID: &str = "spiffe://cluster.local/ns/argocd/sa/agent-1";
const PRINCIPAL_ID: &str = "spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal";
const SPOOFED: &str = "By=spiffe://evil.example/ns/x/sa/proxy;URI=spiffe://evil.example/ns/argocd/sa/admin";
/// Deadline for a single RPC or message through both sidecars on a busy machine.
const RPC: Duration = Duration::from_secs(15);

// === PKI ===

/// A CA, the principal sidecar's server certificate and agent-1's client certificate (an
/// X.509-SVID), written to a temp dir for Envoy.
struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    agent_cert_pem: String,
    agent_key_pem: String,
}

impl Pki {
    fn new() -> Result<Self> {
        let ca = Ca::generate("envoy-test-ca")?;
        let server = ca.server("argocd-agent-principal", &["localhost", "127.0.0.1"], &[PRINCIPAL_ID])?;
        let agent = ca.client("agent-1", &[AGENT_ID])?;

        let dir = tempfile::Builder::new().prefix("envoy-pki-").tempdir()?;
        let pki = Self { ca_der: ca.der()?, ca_pem: ca.pem, agent_cert_pem: agent.cert, agent_key_pem: agent.key, dir };
        for (name, pem) in [
            ("ca.pem", pki.ca_pem.clone()),
            ("principal.pem", server.cert),
            ("principal-key.pem", server.key),
            ("agent.pem", pki.agent_cert_pem.clone()),
            ("agent-key.pem", pki.agent_key_pem.clone()),
        ] {
            std::fs::write(pki.path(name), pem)?;
        }
        Ok(pki)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn principal_params(&self, backend: SocketAddr) -> SidecarParams {
        SidecarParams::new(backend, self.path("principal.pem"), self.path("principal-key.pem"), self.path("ca.pem"))
    }

    fn agent_params(&self, principal_sidecar: SocketAddr) -> SidecarParams {
        SidecarParams::new(principal_sidecar, self.path("agent.pem"), self.path("agent-key.pem"), self.path("ca.pem"))
    }
}

// === Echo backend (the principal's place) ===

/// Every XFCC header value of every call that reached the backend, one `Vec` per call.
type Seen = Arc<Mutex<Vec<Vec<String>>>>;

#[derive(Clone, Default)]
struct Echo {
    seen: Seen,
}

impl Echo {
    fn record<T>(&self, request: &Request<T>) {
        let values = request
            .metadata()
            .get_all(XFCC)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(values);
        }
    }
}

#[tonic::async_trait]
impl EventStream for Echo {
    /// The echo: every event the client sends comes straight back.
    type SubscribeStream = Streaming<Event>;

    async fn subscribe(&self, request: Request<Streaming<Event>>) -> Result<Response<Self::SubscribeStream>, Status> {
        self.record(&request);
        Ok(Response::new(request.into_inner()))
    }

    async fn push(&self, request: Request<Streaming<Event>>) -> Result<Response<PushSummary>, Status> {
        self.record(&request);
        Err(Status::unimplemented("push"))
    }

    async fn ping(&self, request: Request<PingRequest>) -> Result<Response<PongReply>, Status> {
        self.record(&request);
        Ok(Response::new(PongReply {}))
    }
}

/// The echo server on h2c, 127.0.0.1:0; aborted on drop.
struct Backend {
    addr: SocketAddr,
    seen: Seen,
    task: JoinHandle<()>,
}

impl Backend {
    async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let echo = Echo::default();
        let seen = echo.seen.clone();
        let task = tokio::spawn(async move {
            let served = Server::builder()
                .add_service(EventStreamServer::new(echo))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
            if let Err(e) = served {
                eprintln!("echo backend stopped: {e}");
            }
        });
        Ok(Self { addr, seen, task })
    }

    fn seen(&self) -> Vec<Vec<String>> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// === Clients ===

/// Plaintext h2c, as the agent dials its sidecar (`--insecure-plaintext --server-address 127.0.0.1`).
async fn h2c_client(addr: SocketAddr) -> Result<EventStreamClient<Channel>> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?.connect_timeout(RPC).connect().await?;
    Ok(EventStreamClient::new(channel))
}

/// mTLS straight to the principal sidecar, with agent-1's certificate.
async fn mtls_client(pki: &Pki, addr: SocketAddr) -> Result<EventStreamClient<Channel>> {
    let tls = ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
        .identity(Identity::from_pem(&pki.agent_cert_pem, &pki.agent_key_pem));
    let channel =
        Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls)?.connect_timeout(RPC).connect().await?;
    Ok(EventStreamClient::new(channel))
}

/// A `Ping` carrying a made-up XFCC header.
async fn spoofed_ping(client: &mut EventStreamClient<Channel>) -> Result<(), Status> {
    let mut request = Request::new(PingRequest {});
    request.metadata_mut().insert(XFCC, SPOOFED.parse().map_err(|_| Status::internal("bad header"))?);
    request.set_timeout(RPC);
    client.ping(request).await.map(|_| ())
}

fn event(id: &str) -> Event {
    Event {
        event: Some(CloudEvent {
            id: id.to_string(),
            source: "envoy-sidecar-test".to_string(),
            spec_version: "1.0".to_string(),
            r#type: "io.argoproj.argocd-agent.test".to_string(),
            ..CloudEvent::default()
        }),
    }
}

fn event_id(event: &Event) -> &str {
    event.event.as_ref().map_or("", |e| e.id.as_str())
}

// === XFCC, just enough of Envoy's grammar for the assertions ===

/// Split on `sep` outside double quotes (`\"` escapes a quote).
fn split_unquoted(s: &str, sep: char) -> Vec<&str> {
    let (mut parts, mut start, mut quoted, mut escaped) = (Vec::new(), 0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// The one XFCC element the backend saw in the only call it got, as `(key, value)` pairs.
fn single_element(seen: &[Vec<String>]) -> Result<Vec<(String, String)>> {
    let [call] = seen else { bail!("expected exactly one call at the backend, got {seen:?}") };
    let [header] = call.as_slice() else { bail!("expected exactly one {XFCC} header, got {call:?}") };
    let elements = split_unquoted(header, ',');
    let [element] = elements.as_slice() else { bail!("expected exactly one XFCC element, got {header:?}") };
    split_unquoted(element, ';')
        .into_iter()
        .map(|pair| {
            let (k, v) = pair.split_once('=').with_context(|| format!("no `=` in {pair:?} of {header:?}"))?;
            Ok((k.to_ascii_lowercase(), v.to_string()))
        })
        .collect()
}

fn values<'a>(pairs: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    pairs.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect()
}

fn assert_agent_element(seen: &[Vec<String>]) -> Result<()> {
    let pairs = single_element(seen)?;
    assert_eq!(values(&pairs, "uri"), [AGENT_ID], "URI of the client certificate: {pairs:?}");
    assert_eq!(values(&pairs, "by"), [PRINCIPAL_ID], "By = the principal sidecar's own URI SAN: {pairs:?}");
    assert_eq!(values(&pairs, "subject"), ["\"CN=agent-1\""], "{pairs:?}");
    assert_eq!(values(&pairs, "hash").len(), 1, "{pairs:?}");
    assert!(!format!("{seen:?}").contains("evil"), "the spoofed header leaked through: {seen:?}");
    Ok(())
}

// === Tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xfcc_names_the_agent_svid_and_replaces_a_spoofed_header() -> Result<()> {
    let pki = Pki::new()?;
    let backend = Backend::start().await?;
    let principal = EnvoySidecar::start(SidecarKind::Principal, &pki.principal_params(backend.addr))?;
    let agent = EnvoySidecar::start(SidecarKind::Agent, &pki.agent_params(principal.listen_addr()))?;

    // The agent's path: h2c to its sidecar, which adds mTLS with the SVID.
    let mut client = h2c_client(agent.listen_addr()).await?;
    spoofed_ping(&mut client).await.context("ping through both sidecars")?;
    assert_agent_element(&backend.seen())?;

    // Straight to the principal sidecar over mTLS, so the spoofed header does reach it: SANITIZE_SET
    // (not the agent sidecar's SANITIZE) is what replaces it.
    backend.seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clear();
    let mut direct = mtls_client(&pki, principal.listen_addr()).await?;
    spoofed_ping(&mut direct).await.context("ping straight to the principal sidecar")?;
    assert_agent_element(&backend.seen())?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_is_refused_at_tls() -> Result<()> {
    let pki = Pki::new()?;
    let backend = Backend::start().await?;
    let principal = EnvoySidecar::start(SidecarKind::Principal, &pki.principal_params(backend.addr))?;

    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der.clone())?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(principal.listen_addr()).await?;

    // In TLS 1.3 the client finishes its side of the handshake before the server has checked for a
    // certificate, so the refusal (an alert) may only show on the first read.
    let attempt = async {
        let mut tls =
            connector.connect(ServerName::try_from("localhost").map_err(io::Error::other)?.to_owned(), tcp).await?;
        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
        tls.flush().await?;
        let mut buf = [0_u8; 256];
        tls.read(&mut buf).await
    };
    let outcome = tokio::time::timeout(RPC, attempt).await.context("the TLS attempt hung")?;
    let err = match outcome {
        Ok(n) => bail!("a client without a certificate got {n} bytes of application data"),
        Err(e) => e,
    };
    let alert = err.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>());
    assert!(matches!(alert, Some(rustls::Error::AlertReceived(_))), "expected a TLS alert, got {err:?}");

    // And through tonic, as a gRPC client would see it.
    let tls = ClientTlsConfig::new().domain_name("localhost").ca_certificate(Certificate::from_pem(&pki.ca_pem));
    let rpc = async {
        let channel = Endpoint::from_shared(format!("https://{}", principal.listen_addr()))?
            .tls_config(tls)?
            .connect_timeout(RPC)
            .connect()
            .await?;
        EventStreamClient::new(channel).ping(PingRequest {}).await?;
        anyhow::Ok(())
    };
    assert!(tokio::time::timeout(RPC, rpc).await.context("the tonic attempt hung")?.is_err());
    assert!(backend.seen().is_empty(), "the backend was reached: {:?}", backend.seen());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_sidecar_refuses_a_principal_with_another_name() -> Result<()> {
    let pki = Pki::new()?;
    let backend = Backend::start().await?;
    let principal = EnvoySidecar::start(SidecarKind::Principal, &pki.principal_params(backend.addr))?;
    let params = pki.agent_params(principal.listen_addr()).with_principal_sni("principal.other.example");
    let agent = EnvoySidecar::start(SidecarKind::Agent, &params)?;

    let mut client = h2c_client(agent.listen_addr()).await?;
    let status = spoofed_ping(&mut client).await.err().context("the ping must fail")?;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(backend.seen().is_empty(), "the backend was reached: {:?}", backend.seen());
    let failed = agent.stat("cluster.principal_sidecar.ssl.fail_verify_san")?;
    assert!(failed.is_some_and(|n| n >= 1), "no SAN verification failure counted: {failed:?}");
    Ok(())
}

/// Short, so the test is quick; heartbeats at a sixth of it leave room for a busy machine.
const IDLE: Duration = Duration::from_secs(3);
const HEARTBEAT: Duration = Duration::from_millis(500);
/// Longer than two idle timeouts: without the heartbeats the stream would be gone twice over.
const QUIET: Duration = Duration::from_secs(7);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_quiet_stream_up_and_envoy_closes_it_when_they_stop() -> Result<()> {
    let pki = Pki::new()?;
    let backend = Backend::start().await?;
    let principal = EnvoySidecar::start(
        SidecarKind::Principal,
        &pki.principal_params(backend.addr).with_stream_idle_timeout(IDLE),
    )?;
    let agent = EnvoySidecar::start(
        SidecarKind::Agent,
        &pki.agent_params(principal.listen_addr()).with_stream_idle_timeout(IDLE),
    )?;
    let idle_timeouts = || -> Result<u64> {
        Ok(principal.http_stat("downstream_rq_idle_timeout")? + agent.http_stat("downstream_rq_idle_timeout")?)
    };

    let mut client = h2c_client(agent.listen_addr()).await?;
    let (tx, rx) = mpsc::channel(16);
    // `tx` stays alive to the end: dropping it would half-close the stream, which is not idleness.
    tx.send(event("hello")).await?;
    let mut inbound = tokio::time::timeout(RPC, client.subscribe(ReceiverStream::new(rx))).await??.into_inner();
    let mut next = async || -> Result<Event> {
        let msg = tokio::time::timeout(RPC, inbound.message()).await.context("no echo in time")??;
        msg.context("the stream ended")
    };
    assert_eq!(event_id(&next().await?), "hello");
    assert_agent_element(&backend.seen())?;

    // Quiet period: no events, only heartbeats below the idle timeout, each echoed.
    let quiet = Instant::now();
    let mut beats = 0_u32;
    while quiet.elapsed() < QUIET {
        tokio::time::sleep(HEARTBEAT).await; // the heartbeat interval under test, not a synchronisation
        beats += 1;
        let id = format!("heartbeat-{beats}");
        tx.send(event(&id)).await?;
        assert_eq!(event_id(&next().await.with_context(|| format!("after {:?} of heartbeats", quiet.elapsed()))?), id);
    }
    tx.send(event("after-the-quiet-period")).await?;
    assert_eq!(event_id(&next().await?), "after-the-quiet-period");
    assert_eq!(idle_timeouts()?, 0, "an idle timeout fired while heartbeats flowed");

    // Silence: Envoy must reset the stream after about IDLE.
    let silent = Instant::now();
    let end =
        tokio::time::timeout(IDLE + RPC, inbound.message()).await.context("Envoy did not close the idle stream")?;
    let waited = silent.elapsed();
    match end {
        Ok(Some(e)) => bail!("unexpected message on a silent stream: {e:?}"),
        Ok(None) | Err(_) => eprintln!("silent stream closed after {waited:?}: {end:?}"),
    }
    assert!(waited >= IDLE * 3 / 4, "closed after {waited:?}, before the {IDLE:?} idle timeout could fire");
    wait_for_async(RPC, "Envoy to count the stream idle timeout", || async {
        Ok((idle_timeouts()? >= 1).then_some(()))
    })
    .await?;
    drop(tx);
    Ok(())
}

#[test]
fn the_sds_variant_of_the_principal_sidecar_is_valid() -> Result<()> {
    let values = std::collections::BTreeMap::from([
        ("ADMIN_PORT", "0".to_string()),
        ("LISTEN_ADDRESS", "127.0.0.1".to_string()),
        ("LISTEN_PORT", "0".to_string()),
        ("PRINCIPAL_PORT", "8444".to_string()),
        ("STREAM_IDLE_TIMEOUT", "300s".to_string()),
        ("SPIFFE_ENDPOINT_SOCKET", "/run/spire/sockets/agent.sock".to_string()),
        ("PRINCIPAL_SPIFFE_ID", PRINCIPAL_ID.to_string()),
        ("TRUST_DOMAIN", "cluster.local".to_string()),
    ]);
    validate(&render(&template("principal-sidecar-sds.yaml")?, &values)?)
}

/// More streams than Envoy's default circuit breakers allow to one cluster (1,024 requests):
/// every agent holds a long-lived `Subscribe`, so a principal sidecar with the defaults refuses
/// agent 1,025 (docs/mesh/envoy.md).
const STREAMS_PAST_THE_DEFAULT: usize = 1_100;

/// Opens `n` `Subscribe` streams one after another, each on its own mTLS connection to the
/// principal sidecar (as each agent's sidecar dials it), each echoing one event, and keeps them
/// all open: `Err((opened, why))` at the first stream that fails.
async fn open_streams(
    pki: &Pki,
    sidecar: SocketAddr,
    n: usize,
) -> std::result::Result<Vec<(mpsc::Sender<Event>, Streaming<Event>)>, (usize, String)> {
    let mut open = Vec::with_capacity(n);
    for i in 0..n {
        let (tx, rx) = mpsc::channel(1);
        let id = format!("stream-{i}");
        let echoed = async {
            let mut client = mtls_client(pki, sidecar).await.map_err(|e| format!("{e:#}"))?;
            tx.send(event(&id)).await.map_err(|e| e.to_string())?;
            let mut inbound =
                client.subscribe(ReceiverStream::new(rx)).await.map_err(|s| format!("{s:?}"))?.into_inner();
            match inbound.message().await {
                Ok(Some(e)) if event_id(&e) == id => Ok(inbound),
                other => Err(format!("{other:?}")),
            }
        };
        match tokio::time::timeout(RPC, echoed).await {
            Ok(Ok(inbound)) => open.push((tx, inbound)),
            Ok(Err(why)) => return Err((open.len(), why)),
            Err(_) => return Err((open.len(), "no echo in time".into())),
        }
    }
    Ok(open)
}

/// The rendered principal sidecar without its `circuit_breakers` block: Envoy's defaults.
fn without_circuit_breakers(rendered: String) -> Result<String> {
    let mut out = String::with_capacity(rendered.len());
    let (mut block, mut removed) = (None, false);
    for line in rendered.lines() {
        let indent = line.len() - line.trim_start().len();
        if block.is_some_and(|at| indent > at) {
            continue; // inside the block
        }
        block = None;
        if line.trim_start().starts_with("circuit_breakers:") {
            (block, removed) = (Some(indent), true);
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    if !removed {
        bail!("no circuit_breakers block in the rendered principal sidecar");
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_principal_sidecar_carries_more_agents_than_envoys_default_circuit_breakers() -> Result<()> {
    let pki = Pki::new()?;
    let backend = Backend::start().await?;

    // As shipped: every stream reaches the principal and stays open, none overflows.
    let principal = EnvoySidecar::start(SidecarKind::Principal, &pki.principal_params(backend.addr))?;
    let open = match open_streams(&pki, principal.listen_addr(), STREAMS_PAST_THE_DEFAULT).await {
        Ok(open) => open,
        Err((opened, why)) => {
            let (_, stats) =
                tests::envoy::admin_get(principal.admin_addr(), "/stats?filter=rq_active|cx_active|overflow")?;
            bail!("stream {opened} failed after {opened} were opened through the shipped sidecar: {why}\n{stats}");
        }
    };
    assert_eq!(principal.stat("cluster.principal.upstream_rq_active")?, Some(STREAMS_PAST_THE_DEFAULT as u64));
    assert_eq!(principal.stat("cluster.principal.upstream_rq_active_overflow")?.unwrap_or(0), 0);
    assert_eq!(principal.stat("cluster.principal.upstream_rq_pending_overflow")?.unwrap_or(0), 0);
    drop(open);
    drop(principal);

    // The control: Envoy's defaults refuse the stream past 1,024, so the test above can fail.
    let defaults = EnvoySidecar::start_edited(
        SidecarKind::Principal,
        &pki.principal_params(backend.addr),
        without_circuit_breakers,
    )?;
    match open_streams(&pki, defaults.listen_addr(), STREAMS_PAST_THE_DEFAULT).await {
        Ok(_) => bail!("Envoy's default circuit breakers let {STREAMS_PAST_THE_DEFAULT} streams through"),
        Err((opened, why)) => {
            assert_eq!(opened, 1024, "refused at another stream than Envoy's default 1,024: {why}");
            eprintln!("with Envoy's default circuit breakers, stream {opened} was refused: {why}");
        }
    }
    let overflow = defaults.stat("cluster.principal.upstream_rq_active_overflow")?.unwrap_or(0);
    assert_eq!(overflow, 1, "Envoy counted the refusal as a requests-circuit-breaker overflow");
    Ok(())
}
