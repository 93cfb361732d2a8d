//! The blocklist end to end, with spawned binaries: an entry added with `argocd-agentctl
//! blocklist` ends the agent's live stream within seconds with `Unauthenticated` naming the entry,
//! its `RefreshToken` is refused (`Unauthenticated`) and its `Authenticate` too
//! (`PermissionDenied`), each naming the entry, a new stream with the token it had is refused, the
//! real agent is kept out for as long as the entry is listed, and removing the entry lets it
//! reconnect and sync again. Both forms of entry over native mTLS (upstream's certificate
//! fingerprint and our agent name), and the agent-name form with forwarded-header auth (Envoy in
//! front of the principal, `--auth xfcc:`, the agent's `--creds header:`).
//!
//! The stream and the auth calls are made by the test itself, as the agent: with the agent's own
//! certificate (from its secrets on the spoke) to where the agent dials, with the agent's client
//! code for the session ([`auth::Credentials`]), so each refusal's status code and message are
//! read as the principal sent them, not from a log. The real agent is stopped meanwhile (the
//! principal keeps one stream per agent: the two would replace each other).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use auth::{AgentMode, AuthParams, ClientError, Credentials};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, PostParams};
use protocol::pb::authapi::authentication_client::AuthenticationClient;
use protocol::pb::eventstreamapi::Event as WireEvent;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use tests::fixtures::{application_without_finalizers, applications, dynamic};
use tests::http::get;
use tests::topology::{ARGOCD_NS, Mode, Topology};
use tests::{wait_for_async, wait_until_async, workspace_binary};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const AGENT: &str = "blocked-1";
/// How long anything but the disconnection may take on a busy machine.
const WAIT: Duration = Duration::from_secs(60);
/// How long an unblocked agent may take to reconnect: its `Authenticate` retries and its stream
/// reconnects back off (up to 30 s each) while it is refused.
const RECONNECT: Duration = Duration::from_secs(120);
/// How soon a blocklisted live agent must be disconnected: the principal applies the list on
/// the ConfigMap's watch event.
const DISCONNECT_WITHIN: Duration = Duration::from_secs(15);
const CONFIG_MAP: &str = "argocd-agent-tls-blocklist";

/// The agent's `/healthz` status: 200 while connected to the principal, 503 otherwise.
async fn health(addr: SocketAddr) -> Option<u16> {
    get(addr, "/healthz").await.ok().map(|(status, _)| status)
}

async fn wait_health(t: &Topology, addr: SocketAddr, want: u16, within: Duration, what: &str) -> Result<()> {
    wait_until_async(within, what, || async { health(addr).await == Some(want) }).await.with_context(|| t.logs())
}

/// Authentications with `method` the principal refused because of the blocklist (its
/// SessionHook).
async fn refusals(t: &Topology, method: Method) -> Result<u64> {
    let addr = t.principal_metrics_addr().context("the principal's metrics address")?;
    let (status, text) = get(addr, "/metrics").await?;
    ensure!(status == 200, "GET /metrics: {status}");
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(tests::http::sample(&text, "argocd_principal_auth_failures_total", &refusal_labels(method))
        .map_or(0, |v| v as u64))
}

fn refusal_labels(method: Method) -> String {
    format!("method=\"{}\",reason=\"not_admitted\"", method.name())
}

/// Where the running agent serves `/healthz`, once it has bound it.
async fn healthz_addr(t: &Topology) -> Result<SocketAddr> {
    wait_for_async(WAIT, "the agent's healthz address", || async { Ok(t.agent_healthz_addr(AGENT)) })
        .await
        .with_context(|| t.logs())
}

/// The tail of the agent's log (its section of [`Topology::logs`], the last one).
fn agent_log(t: &Topology) -> String {
    let logs = t.logs();
    let header = format!("--- agent {AGENT}\n");
    logs.split_once(&header).map(|(_, rest)| rest.to_owned()).unwrap_or_default()
}

/// `argocd-agentctl` against the hub, as an operator runs it.
fn ctl(t: &Topology, args: &[&str]) -> Result<String> {
    let out = Command::new(workspace_binary("argocd-agentctl")?)
        .arg("--kubeconfig")
        .arg(t.kubeconfig())
        .args(["--principal-context", "hub"])
        .args(args)
        .output()
        .context("cannot run argocd-agentctl")?;
    if !out.status.success() {
        bail!("argocd-agentctl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The upper-case hex SHA-256 of the agent's client certificate, from its secret on the spoke.
async fn client_cert_fingerprint(t: &Topology) -> Result<String> {
    let secrets: Api<Secret> = Api::namespaced(t.spoke(AGENT)?, ARGOCD_NS);
    let secret = secrets.get("argocd-agent-client-tls").await?;
    let pem = secret.data.as_ref().and_then(|d| d.get("tls.crt")).context("no tls.crt in the client secret")?;
    let leaf = CertificateDer::pem_slice_iter(&pem.0).next().context("no certificate in tls.crt")??;
    auth::Binding::certificate(&leaf).fingerprint().context("a certificate binding has a fingerprint")
}

fn app(name: &str) -> Result<DynamicObject> {
    dynamic(application_without_finalizers(name, AGENT, "HEAD"))
}

async fn wait_on_spoke(t: &Topology, spoke: &Api<DynamicObject>, name: &str) -> Result<()> {
    wait_until_async(WAIT, &format!("Application {name} to reach the spoke"), || async {
        spoke.get_opt(name).await.ok().flatten().is_some()
    })
    .await
    .with_context(|| t.logs())
}

/// How the test, playing the agent, authenticates: as the topology's agents do.
#[derive(Clone, Copy, Debug)]
enum Method {
    /// Native mTLS to the principal (`--auth mtls:`).
    Mtls,
    /// mTLS to the principal's Envoy sidecar, which forwards the certificate's SPIFFE ID in
    /// `x-forwarded-client-cert` (`--auth xfcc:`; the agent's `--creds header:`).
    Header,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Self::Mtls => auth::MtlsAuthenticator::METHOD,
            Self::Header => auth::XfccAuthenticator::METHOD,
        }
    }
}

/// The test in the agent's place: a channel to where the agent dials, with the agent's
/// certificate, and the agent's session client.
struct AgentClient {
    channel: Channel,
    creds: Credentials,
    params: AuthParams,
}

/// The `Unauthenticated`, `PermissionDenied`, … status of a refused call, or why there is none.
fn refused<T>(call: &str, result: Result<T, ClientError>) -> Result<tonic::Status> {
    match result {
        Ok(_) => bail!("{call} of the blocklisted agent succeeded"),
        Err(ClientError::Refused { status, .. }) => Ok(status),
        Err(e) => bail!("{call} of the blocklisted agent failed, but not as a refusal: {e}"),
    }
}

impl AgentClient {
    async fn connect(t: &Topology, method: Method) -> Result<Self> {
        let secrets: Api<Secret> = Api::namespaced(t.spoke(AGENT)?, ARGOCD_NS);
        let field = |secret: &Secret, keys: &[&str]| {
            let data = secret.data.as_ref();
            keys.iter().find_map(|k| data.and_then(|d| d.get(*k)).map(|v| v.0.clone()))
        };
        let ca = secrets.get("argocd-agent-ca").await?;
        let ca = field(&ca, &["ca.crt", "tls.crt"]).context("no CA certificate in argocd-agent-ca")?;
        let client = secrets.get("argocd-agent-client-tls").await?;
        let cert = field(&client, &["tls.crt"]).context("no tls.crt in argocd-agent-client-tls")?;
        let key = field(&client, &["tls.key"]).context("no tls.key in argocd-agent-client-tls")?;
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name("localhost")
            .identity(Identity::from_pem(cert, key));
        let addr = t.principal_addr().context("the principal's address")?;
        let channel = agent::transport::connect(&format!("https://{addr}"), Some(&tls.into()), None).await?;
        let params = AuthParams {
            method: method.name().to_owned(),
            credentials: HashMap::new(),
            mode: AgentMode::Managed,
            version: tests::loadgen::VERSION.to_owned(),
            agent_namespace: ARGOCD_NS.to_owned(),
        };
        Ok(Self { channel, creds: Credentials::new(), params })
    }

    fn auth(&self) -> AuthenticationClient<Channel> {
        AuthenticationClient::new(self.channel.clone())
    }

    async fn authenticate(&self) -> Result<auth::PrincipalInfo, ClientError> {
        self.creds.authenticate(&mut self.auth(), &self.params).await
    }

    async fn refresh(&self) -> Result<(), ClientError> {
        self.creds.refresh(&mut self.auth()).await
    }

    /// Opens the event stream with the current access token. The returned sender keeps the
    /// agent's half of the stream open.
    async fn subscribe(&self) -> Result<(Streaming<WireEvent>, mpsc::Sender<WireEvent>), tonic::Status> {
        let (tx, rx) = mpsc::channel(1);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        let token = self.creds.access_token();
        agent::credentials::bearer_token(move || token.clone())(request.metadata_mut());
        let stream = EventStreamClient::new(self.channel.clone()).subscribe(request).await?.into_inner();
        Ok((stream, tx))
    }
}

/// Reads the principal's half of a stream until it ends: the status it ended with (`None`: it
/// closed without an error).
async fn stream_end(mut stream: Streaming<WireEvent>) -> Option<tonic::Status> {
    loop {
        match stream.message().await {
            Ok(Some(_)) => {}
            Ok(None) => return None,
            Err(status) => return Some(status),
        }
    }
}

/// Whether `status` is `code` with a message that names the entry and the ConfigMap.
fn names_the_entry(status: &tonic::Status, code: tonic::Code, entry: &str) -> bool {
    let m = status.message();
    status.code() == code && m.contains("is blocklisted") && m.contains(entry) && m.contains(CONFIG_MAP)
}

/// Blocks with `block` and checks everything the principal refuses, as the agent sees it; then
/// that the real agent is kept out, and comes back once `unblock` removed the entry.
async fn block_and_unblock(
    t: &mut Topology,
    method: Method,
    block: &[&str],
    entry: &str,
    unblock: &[&str],
) -> Result<()> {
    // The test takes the agent's place: a live stream opened with a session of the agent's own.
    t.kill_agent(AGENT)?;
    let client = AgentClient::connect(t, method).await?;
    let info = client.authenticate().await.with_context(|| t.logs())?;
    ensure!(info.agent_name == AGENT, "authenticated as {:?}, not {AGENT}", info.agent_name);
    let (stream, _keep_open) = client.subscribe().await.with_context(|| t.logs())?;
    let live = tokio::spawn(stream_end(stream));

    let blocked_at = Instant::now();
    let out = ctl(t, block)?;
    ensure!(out.contains("Added to blocklist"), "{out}");

    // 1. The live stream ends with Unauthenticated naming the entry, within seconds.
    let end = tokio::time::timeout(DISCONNECT_WITHIN, live).await.with_context(|| {
        format!(
            "the blocklisted agent's live stream still runs {DISCONNECT_WITHIN:?} after the entry was added\n{}",
            t.logs()
        )
    })??;
    let status = end.with_context(|| format!("the live stream closed without a status\n{}", t.logs()))?;
    ensure!(
        names_the_entry(&status, tonic::Code::Unauthenticated, entry),
        "the live stream should end with Unauthenticated naming entry {entry:?} and {CONFIG_MAP}, got {status:?}"
    );
    eprintln!("live stream ended {:?} after the entry was added: {}", blocked_at.elapsed(), status.message());

    // 2. RefreshToken is refused with Unauthenticated, naming the entry.
    let status = refused("RefreshToken", client.refresh().await)?;
    ensure!(
        names_the_entry(&status, tonic::Code::Unauthenticated, entry),
        "RefreshToken should be refused with Unauthenticated naming entry {entry:?}, got {status:?}"
    );
    // 3. A new stream with the access token the agent had is refused.
    match client.subscribe().await {
        Ok(_) => bail!("a new stream with the blocklisted agent's access token was accepted\n{}", t.logs()),
        Err(status) => ensure!(
            status.code() == tonic::Code::Unauthenticated,
            "a new stream with the old access token should be refused with Unauthenticated, got {status:?}"
        ),
    }
    // 4. Authenticate is refused with PermissionDenied, naming the entry.
    let status = refused("Authenticate", client.authenticate().await.map(|_| ()))?;
    ensure!(
        names_the_entry(&status, tonic::Code::PermissionDenied, entry),
        "Authenticate should be refused with PermissionDenied naming entry {entry:?}, got {status:?}"
    );
    drop(client);

    // The real agent, started again, is kept out: it logs the refusal at every retry.
    let refused_before = refusals(t, method).await?;
    let connects_before = t.principal_connects(AGENT);
    t.start_agent(AGENT).await?;
    let health_addr = healthz_addr(t).await?;
    wait_until_async(WAIT, "the agent to log the principal's refusal", || async {
        let log = agent_log(t);
        log.contains("authentication failed")
            && log.contains("is blocklisted")
            && log.contains(entry)
            && log.contains(CONFIG_MAP)
    })
    .await
    .with_context(|| t.logs())?;
    wait_until_async(WAIT, "the principal to refuse two authentications", || async {
        refusals(t, method).await.is_ok_and(|n| n >= refused_before + 2)
    })
    .await
    .with_context(|| t.logs())?;
    ensure!(health(health_addr).await == Some(503), "the blocklisted agent connected:\n{}", t.logs());
    ensure!(
        t.principal_connects(AGENT) == connects_before,
        "the principal accepted a stream of the blocklisted agent:\n{}",
        t.logs()
    );

    let out = ctl(t, unblock)?;
    ensure!(out.contains("Removed from blocklist"), "{out}");
    let unblocked_at = Instant::now();
    wait_health(t, health_addr, 200, RECONNECT, "the agent to reconnect once unblocked").await?;
    eprintln!("agent reconnected {:?} after the entry was removed", unblocked_at.elapsed());
    Ok(())
}

/// A topology with the agent connected and syncing: an Application created on the hub reaches
/// the spoke.
async fn connected(t: &Topology) -> Result<(Api<DynamicObject>, Api<DynamicObject>)> {
    let health_addr = healthz_addr(t).await?;
    wait_health(t, health_addr, 200, WAIT, "the agent to connect").await?;
    let hub = applications(t.hub(), AGENT);
    let spoke = applications(t.spoke(AGENT)?, ARGOCD_NS);
    hub.create(&PostParams::default(), &app("before")?).await?;
    wait_on_spoke(t, &spoke, "before").await?;
    Ok((hub, spoke))
}

/// Upstream's form: the client certificate's fingerprint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocklist_entry_disconnects_a_live_agent_and_prevents_its_reconnection() -> Result<()> {
    let mut t = Topology::start(&[(AGENT, Mode::Managed)]).await?;
    let (hub, spoke) = connected(&t).await?;
    // Given as `openssl x509 -fingerprint -sha256` prints it (here lower-cased).
    let fingerprint = client_cert_fingerprint(&t).await?;
    let openssl_form = fingerprint
        .as_bytes()
        .chunks(2)
        .map(|c| String::from_utf8_lossy(c).to_lowercase())
        .collect::<Vec<_>>()
        .join(":");
    block_and_unblock(
        &mut t,
        Method::Mtls,
        &["blocklist", "tls", "add", &openssl_form, "--reason", "e2e: key leaked"],
        &fingerprint,
        &["blocklist", "tls", "remove", &fingerprint],
    )
    .await?;
    // Synced again: an Application created on the hub after the reconnect reaches the spoke.
    hub.create(&PostParams::default(), &app("after")?).await?;
    wait_on_spoke(&t, &spoke, "after").await?;
    ensure!(ctl(&t, &["blocklist", "list"])?.contains("No entries"), "the blocklist is empty again");
    Ok(())
}

/// Ours: by agent name, whatever its certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_name_entry_disconnects_and_keeps_out_the_agent() -> Result<()> {
    let t = Topology::start(&[(AGENT, Mode::Managed)]).await?;
    name_entry_keeps_out(t, Method::Mtls).await
}

/// Every auth method, not only mTLS: an agent identified by the SPIFFE ID its certificate
/// carries, forwarded by Envoy in front of the principal (`--auth xfcc:`, `--creds header:`),
/// has no certificate at the principal; its name entry disconnects it and keeps it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_name_entry_disconnects_and_keeps_out_an_agent_with_forwarded_header_auth() -> Result<()> {
    let t = Topology::start_principal_sidecar_only(&[(AGENT, Mode::Managed)]).await?;
    name_entry_keeps_out(t, Method::Header).await
}

/// An agent-name entry added and removed: the agent is kept out meanwhile and syncs again after.
async fn name_entry_keeps_out(mut t: Topology, method: Method) -> Result<()> {
    let (hub, spoke) = connected(&t).await?;
    let key = format!("agent.{AGENT}");
    block_and_unblock(
        &mut t,
        method,
        &["blocklist", "agent", "add", AGENT, "--reason", "e2e: decommissioned"],
        &key,
        &["blocklist", "agent", "remove", AGENT],
    )
    .await?;
    hub.create(&PostParams::default(), &app("after")?).await?;
    wait_on_spoke(&t, &spoke, "after").await?;
    Ok(())
}
