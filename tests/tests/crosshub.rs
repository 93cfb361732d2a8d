//! Cross-hub disaster recovery as an operator runs it (docs/ha.md, "Cross-hub disaster
//! recovery"): two `argocd-agent principal` processes, each on its own embedded hub API server,
//! sharing a CA and a JWT key; replication over mTLS on the agents' port; `argocd-agentctl ha`
//! over mTLS with an admin certificate; an agent (a raw mTLS gRPC client, so every ACK is seen)
//! behind a load balancer standing in for the GSLB name.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use protocol::pb::authapi::AuthRequest;
use protocol::pb::authapi::authentication_client::AuthenticationClient;
use protocol::pb::eventstreamapi::Event as WireEvent;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::{Event, EventType, Target};
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyUsagePurpose};
use tests::apiserver::ApiServerProcess;
use tests::bin_path::{workspace_binary, workspace_root};
use tests::pki::Ca;
use tests::process::ChildProcess;
use tests::replicas::LoadBalancer;
use tests::wait_until_async;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const WAIT: Duration = Duration::from_secs(60);

/// A free port on 127.0.0.1 (the peers must know each other's ports before either starts).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

/// A principal certificate usable both ways: server for agents, client for replication.
fn principal_cert(ca: &Ca, cn: &str, dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let issued = ca.issue(params)?;
    Ok((write(dir, &format!("{cn}.crt"), &issued.cert)?, write(dir, &format!("{cn}.key"), &issued.key)?))
}

struct Hub {
    api: ApiServerProcess,
    principal: ChildProcess,
    agents: SocketAddr,
    admin: SocketAddr,
}

impl Hub {
    /// Where the principal's `kind` endpoint (`metrics`, `healthz`) listens, from its startup line.
    fn endpoint(&self, kind: &str) -> Result<SocketAddr> {
        let prefix = format!("principal {kind} listening on ");
        let line = self.principal.stdout();
        let addr = line.lines().find_map(|l| l.strip_prefix(&prefix)).with_context(|| format!("no {kind} address"))?;
        Ok(addr.trim().parse()?)
    }

    fn apps(&self) -> Api<DynamicObject> {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
            "applications",
        );
        Api::namespaced_with(self.api.client(), "agent-a", &ar)
    }

    async fn has_app(&self, name: &str) -> Result<bool> {
        Ok(self.apps().get_opt(name).await?.is_some())
    }
}

struct Pki {
    dir: tempfile::TempDir,
    ca: PathBuf,
    ca_pem: String,
    agent: (String, String),
    admin: (PathBuf, PathBuf),
    outsider: (PathBuf, PathBuf),
}

fn pki() -> Result<(Ca, Pki)> {
    let dir = tempfile::tempdir()?;
    let ca = Ca::generate("crosshub-test-ca")?;
    let ca_path = write(dir.path(), "ca.crt", &ca.pem)?;
    let agent = ca.client("agent-a", &[])?;
    let admin = ca.client("ha-admin", &[])?;
    let outsider = ca.client("not-an-admin", &[])?;
    let admin = (write(dir.path(), "admin.crt", &admin.cert)?, write(dir.path(), "admin.key", &admin.key)?);
    let outsider =
        (write(dir.path(), "outsider.crt", &outsider.cert)?, write(dir.path(), "outsider.key", &outsider.key)?);
    let ca_pem = ca.pem.clone();
    Ok((ca, Pki { dir, ca: ca_path, ca_pem, agent: (agent.cert, agent.key), admin, outsider }))
}

async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let mut ns = Namespace::default();
    ns.metadata.name = Some(name.to_owned());
    match Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Starts a principal of the pair on its own hub.
#[allow(clippy::too_many_arguments)]
async fn start_hub(
    name: &str,
    role: &str,
    ports: (u16, u16),
    peer: (u16, &str),
    cert: &(PathBuf, PathBuf),
    pki: &Pki,
    agent_namespace: bool,
) -> Result<Hub> {
    let api = ApiServerProcess::start().await?;
    ensure_namespace(&api.client(), "argocd").await?;
    if agent_namespace {
        ensure_namespace(&api.client(), "agent-a").await?;
    }
    let jwt = workspace_root().join("auth/tests/fixtures/jwt-key-a.pem");
    let mut cmd = Command::new(workspace_binary("argocd-agent")?);
    cmd.args(["principal", "--namespace", "argocd", "--allowed-namespaces", "*", "--auth", "mtls:subject:CN=([^,]+)"])
        .args(["--listen-host", "127.0.0.1", "--listen-port", &ports.0.to_string()])
        .arg("--tls-cert")
        .arg(&cert.0)
        .arg("--tls-key")
        .arg(&cert.1)
        .arg("--root-ca-path")
        .arg(&pki.ca)
        .arg("--jwt-key")
        .arg(&jwt)
        .arg("--kubeconfig")
        .arg(api.kubeconfig_path())
        .args(["--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"])
        .args(["--enable-resource-proxy=false", "--agent-version-check", "skip", "--log-level", "info"])
        .args(["--ha-enabled", "--ha-preferred-role", role])
        .args(["--ha-peer-address", &format!("127.0.0.1:{}", peer.0)])
        .args(["--ha-allowed-replication-clients", peer.1])
        .args(["--ha-admin-port", &ports.1.to_string(), "--ha-admin-auth", "mtls:subject:^CN=ha-admin$"])
        .env("NO_COLOR", "1");
    let mut principal = ChildProcess::spawn(name, cmd)?;
    wait_until_async(WAIT, &format!("{name} listens"), || {
        let up = principal.is_running()
            && principal.stdout().contains("HA admin listening on")
            && principal.stdout().contains("principal listening on");
        async move { up }
    })
    .await
    .with_context(|| principal.log_tail(40))?;
    Ok(Hub {
        api,
        principal,
        agents: SocketAddr::from(([127, 0, 0, 1], ports.0)),
        admin: SocketAddr::from(([127, 0, 0, 1], ports.1)),
    })
}

/// `argocd-agentctl ha <args> -a <hub admin> --tls-*` with `cert`, answering a prompt with
/// `answer`; (success, stdout + stderr).
fn ctl_answering(
    hub: &Hub,
    cert: &(PathBuf, PathBuf),
    pki: &Pki,
    args: &[&str],
    answer: &str,
) -> Result<(bool, String)> {
    use std::io::Write as _;
    let mut child = Command::new(workspace_binary("argocd-agentctl")?)
        .arg("ha")
        .args(args)
        .args(["-a", &hub.admin.to_string()])
        .arg("--tls-cert")
        .arg(&cert.0)
        .arg("--tls-key")
        .arg(&cert.1)
        .arg("--tls-ca")
        .arg(&pki.ca)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(answer.as_bytes())?;
    }
    let out = tokio::task::block_in_place(|| child.wait_with_output())?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), text))
}

fn ctl(hub: &Hub, cert: &(PathBuf, PathBuf), pki: &Pki, args: &[&str]) -> Result<(bool, String)> {
    ctl_answering(hub, cert, pki, args, "")
}

/// The state `argocd-agentctl ha status -o json` reports.
fn state(hub: &Hub, pki: &Pki) -> Result<String> {
    let (ok, text) = ctl(hub, &pki.admin, pki, &["status", "-o", "json"])?;
    ensure!(ok, "ha status: {text}");
    let json: serde_json::Value = serde_json::from_str(&text).with_context(|| text.clone())?;
    Ok(json["state"].as_str().unwrap_or_default().to_owned())
}

async fn wait_state(hub: &Hub, pki: &Pki, want: &str) -> Result<()> {
    let mut last = String::new();
    let waited = wait_until_async(WAIT, &format!("{} is {want}", hub.admin), || {
        last = state(hub, pki).unwrap_or_else(|e| format!("{e:#}"));
        let done = last == want;
        async move { done }
    })
    .await;
    waited.with_context(|| format!("last state: {last}"))
}

/// The agent: authenticated over mTLS as `agent-a`, one `Subscribe` stream.
struct RawAgent {
    tx: mpsc::Sender<WireEvent>,
    inbound: tonic::Streaming<WireEvent>,
}

async fn channel(addr: SocketAddr, pki: &Pki) -> Result<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
        .identity(Identity::from_pem(&pki.agent.0, &pki.agent.1));
    Ok(Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls)?.connect().await?)
}

/// Connects as the agent; the principal's refusal is the inner error.
async fn connect_agent(addr: SocketAddr, pki: &Pki) -> Result<std::result::Result<RawAgent, tonic::Status>> {
    let channel = channel(addr, pki).await?;
    let auth =
        AuthRequest { method: "mtls".into(), mode: "autonomous".into(), version: "test".into(), ..Default::default() };
    let token = match AuthenticationClient::new(channel.clone()).authenticate(auth).await {
        Ok(r) => r.into_inner().access_token,
        Err(status) => return Ok(Err(status)),
    };
    let (tx, rx) = mpsc::channel(16);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request.metadata_mut().insert("authorization", token.parse()?);
    Ok(EventStreamClient::new(channel).subscribe(request).await.map(|r| RawAgent { tx, inbound: r.into_inner() }))
}

fn app_event(name: &str) -> Result<Event> {
    let app = serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}"), "resourceVersion": "1"},
        "spec": {"project": "default"},
    });
    let ev = Event::new(EventType::Create, Target::Application, format!("{name}_uid-{name}"), format!("{name}-1"))
        .with_json(&app)?;
    Ok(Event { subject: Some(format!("argocd/{name}")), ..ev })
}

/// Sends `count` Applications; after each ACK, checks at once that it is on `replica`'s hub.
async fn write_acked(agent: &mut RawAgent, prefix: &str, count: usize, replica: &Hub) -> Result<Vec<String>> {
    let mut acked = Vec::new();
    for i in 0..count {
        let name = format!("{prefix}-{i}");
        let ev = app_event(&name)?;
        let id = ev.resource_id.clone();
        agent.tx.send(ev.to_wire()).await?;
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let msg = tokio::time::timeout_at(deadline, agent.inbound.message())
                .await
                .with_context(|| format!("no ACK of {name}"))??
                .with_context(|| format!("the stream ended before the ACK of {name}"))?;
            let ev = Event::from_wire(msg)?;
            if ev.event_type == EventType::Processed && ev.resource_id == id {
                break;
            }
        }
        ensure!(replica.has_app(&name).await?, "{name} was ACKed before it reached the replica's hub");
        acked.push(name);
    }
    Ok(acked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_switches_hubs_with_agentctl_and_no_acked_event_is_lost() -> Result<()> {
    let (ca, pki) = pki()?;
    let cert_a = principal_cert(&ca, "principal-a", pki.dir.path())?;
    let cert_b = principal_cert(&ca, "principal-b", pki.dir.path())?;
    let (a_ports, b_ports) = ((free_port()?, free_port()?), (free_port()?, free_port()?));
    let a = start_hub("principal-a", "primary", a_ports, (b_ports.0, "principal-b"), &cert_a, &pki, true).await?;
    let b = start_hub("principal-b", "replica", b_ports, (a_ports.0, "principal-a"), &cert_b, &pki, false).await?;
    wait_state(&a, &pki, "active").await?;
    wait_state(&b, &pki, "replicating").await?;

    // Health answers 200 on the active hub only; metrics say who is what.
    let (code, _) = tests::http::get(a.endpoint("healthz")?, "/healthz").await?;
    ensure!(code == 200, "a /healthz: {code}");
    let (code, body) = tests::http::get(b.endpoint("healthz")?, "/healthz").await?;
    ensure!(code == 503 && body.contains("HA state: replicating"), "b /healthz: {code} {body}");
    let (_, metrics) = tests::http::get(a.endpoint("metrics")?, "/metrics").await?;
    let sample = |name, labels| tests::http::sample(&metrics, name, labels);
    ensure!(sample("argocd_agent_ha_state", "state=\"active\"") == Some(1.0), "{metrics}");
    ensure!(sample("argocd_agent_replication_replicas_in_sync", "") == Some(1.0), "{metrics}");

    // The admin endpoint: only the admin's certificate is allowed.
    let (ok, denied) = ctl(&a, &pki.outsider, &pki, &["status"])?;
    ensure!(!ok && denied.contains("PermissionDenied") && denied.contains("--ha-admin-auth"), "{denied}");
    let (ok, text) = ctl(&a, &pki.admin, &pki, &["status"])?;
    ensure!(ok && text.contains("State:             active") && text.contains("Connected Replicas: 1"), "{text}");

    // The agent reaches the hubs through one name; the replica refuses it.
    let lb = LoadBalancer::start(&[a.agents, b.agents]).await?;
    lb.only(1);
    let refused = connect_agent(lb.addr(), &pki).await?.err().context("the replica took the agent")?;
    ensure!(refused.code() == tonic::Code::Unavailable, "{refused:?}");
    lb.only(0);
    let mut agent = connect_agent(lb.addr(), &pki).await?.map_err(|s| anyhow::anyhow!("agent refused: {s:?}"))?;
    let mut acked = write_acked(&mut agent, "before", 10, &b).await?;

    // Switchover with argocd-agentctl: demote a, then promote b.
    let (ok, text) = ctl(&a, &pki.admin, &pki, &["demote", "--force"])?;
    ensure!(ok && text.contains("Demoted. State is now: replicating"), "{text}");
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match agent.inbound.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await
    .context("the demoted principal kept the agent's stream")?;
    ensure!(ended.as_ref().map(tonic::Status::code) == Some(tonic::Code::Unavailable), "{ended:?}");
    wait_state(&b, &pki, "disconnected").await?;
    // Without --force: the prompt (an empty answer cancels), and the safety checks (the peer
    // is no longer active, this replica completed its snapshot) pass.
    let (ok, text) = ctl(&b, &pki.admin, &pki, &["promote"])?;
    ensure!(ok && text.contains("Proceed? [y/N]: Operation cancelled."), "{text}");
    let (ok, text) = ctl_answering(&b, &pki.admin, &pki, &["promote"], "y\n")?;
    ensure!(ok && text.contains("Promoted. State is now: active"), "{text}");
    wait_state(&a, &pki, "replicating").await?;

    // The agent reconnects through the same name to the new active hub: everything the old
    // primary ACKed is there, and new writes reach the old primary's hub before their ACK.
    lb.only(1);
    for name in &acked {
        ensure!(b.has_app(name).await?, "{name} was ACKed by the old primary and is missing after the switchover");
    }
    let mut agent = connect_agent(lb.addr(), &pki).await?.map_err(|s| anyhow::anyhow!("agent refused: {s:?}"))?;
    acked.extend(write_acked(&mut agent, "after", 10, &a).await?);
    for name in &acked {
        ensure!(a.has_app(name).await? && b.has_app(name).await?, "{name} is missing on a hub");
    }
    // Promoting the old primary back without --force is refused while it follows b.
    let (ok, text) = ctl_answering(&a, &pki.admin, &pki, &["promote"], "y\n")?;
    ensure!(!ok && text.contains("promote failed") && text.contains("still replicating from peer"), "{text}");
    ensure!(state(&b, &pki)? == "active", "b stays active");
    drop(agent);
    drop(lb);
    for hub in [a, b] {
        let Hub { mut principal, api, .. } = hub;
        principal.sigterm_and_wait_async(Duration::from_secs(30)).await?;
        drop(api);
    }
    Ok(())
}
