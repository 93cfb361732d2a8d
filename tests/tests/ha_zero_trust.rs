//! Zero trust on the cross-hub HA replication service (issue #31, item 5; docs/ha.md). The
//! `Replication` service rides on the agents' gRPC port and its identities come from the same
//! `--auth mtls:` method, so an agent's certificate is accepted by the method: only
//! `--ha-allowed-replication-clients` keeps an agent from reading every agent's Applications
//! (`GetSnapshot`), following every change (`Subscribe`) or probing the pair (`Status`). Denied
//! by default: with the flag unset, every replication call is refused with `PermissionDenied`
//! naming the identity and the flag, logged and counted; the listed peer identity still
//! replicates.
//!
//! One `argocd-agent principal` (HA primary, no peer) over mTLS on an embedded hub API server;
//! the callers are raw `Replication` clients with certificates of the principal's CA.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use protocol::pb::replicationapi::replication_client::ReplicationClient;
use protocol::pb::replicationapi::{ReplicationAck, SnapshotRequest, StatusRequest};
use tests::apiserver::ApiServerProcess;
use tests::bin_path::{workspace_binary, workspace_root};
use tests::pki::{Ca, Issued};
use tests::process::ChildProcess;
use tests::wait_until_async;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const WAIT: Duration = Duration::from_secs(30);

/// The flag every refusal must name.
const FLAG: &str = "--ha-allowed-replication-clients";

struct Pki {
    dir: tempfile::TempDir,
    ca: Ca,
    agent: Issued,
    peer: Issued,
}

fn pki() -> Result<Pki> {
    let ca = Ca::generate("ha-zero-trust-ca")?;
    let agent = ca.client("agent-a", &[])?;
    let peer = ca.client("principal-b", &[])?;
    Ok(Pki { dir: tempfile::tempdir()?, ca, agent, peer })
}

fn write(dir: &Path, name: &str, text: &str) -> Result<std::path::PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A running HA principal and where it listens.
struct Principal {
    process: ChildProcess,
    agents: SocketAddr,
}

impl Principal {
    fn endpoint(&self, kind: &str) -> Result<SocketAddr> {
        let prefix = format!("principal {kind} listening on ");
        let out = self.process.stdout();
        let addr = out.lines().find_map(|l| l.strip_prefix(&prefix)).with_context(|| format!("no {kind} address"))?;
        Ok(addr.trim().parse()?)
    }

    async fn metric(&self, name: &str, labels: &str) -> Result<Option<f64>> {
        let (_, text) = tests::http::get(self.endpoint("metrics")?, "/metrics").await?;
        Ok(tests::http::sample(&text, name, labels))
    }
}

/// `argocd-agent principal --ha-enabled` (primary, no peer) on `api`, with `extra` flags; ready
/// once it answers `/healthz` 200 (active).
async fn start_principal(api: &ApiServerProcess, pki: &Pki, extra: &[&str]) -> Result<Principal> {
    let dir = pki.dir.path();
    let server = pki.ca.server("principal-a", &["127.0.0.1", "localhost"], &[])?;
    let (cert, key) = (write(dir, "principal.crt", &server.cert)?, write(dir, "principal.key", &server.key)?);
    let ca = write(dir, "ca.crt", &pki.ca.pem)?;
    let port = free_port()?;
    let mut cmd = Command::new(workspace_binary("argocd-agent")?);
    cmd.args(["principal", "--namespace", "argocd", "--allowed-namespaces", "agent-*"])
        .args(["--auth", "mtls:subject:CN=([^,]+)"])
        .args(["--listen-host", "127.0.0.1", "--listen-port", &port.to_string()])
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .arg("--root-ca-path")
        .arg(&ca)
        .arg("--jwt-key")
        .arg(workspace_root().join("auth/tests/fixtures/jwt-key-a.pem"))
        .arg("--kubeconfig")
        .arg(api.kubeconfig_path())
        .args(["--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"])
        .args(["--enable-resource-proxy=false", "--agent-version-check", "skip", "--log-level", "info"])
        .args(["--ha-enabled", "--ha-preferred-role", "primary", "--ha-admin-port", &free_port()?.to_string()])
        .args(extra)
        .env("NO_COLOR", "1");
    let mut process = ChildProcess::spawn("principal", cmd)?;
    wait_until_async(WAIT, "the principal listens", || {
        let out = process.stdout();
        let up = process.is_running()
            && ["principal listening on", "principal healthz listening on", "principal metrics listening on"]
                .iter()
                .all(|line| out.contains(line));
        async move { up }
    })
    .await
    .with_context(|| process.log_tail(40))?;
    let principal = Principal { process, agents: SocketAddr::from(([127, 0, 0, 1], port)) };
    let healthz = principal.endpoint("healthz")?;
    wait_until_async(WAIT, "the principal is active", || async move {
        tests::http::get(healthz, "/healthz").await.is_ok_and(|(code, _)| code == 200)
    })
    .await
    .with_context(|| principal.process.log_tail(40))?;
    Ok(principal)
}

/// A `Replication` client presenting `who`'s certificate.
async fn replication(addr: SocketAddr, pki: &Pki, who: &Issued) -> Result<ReplicationClient<Channel>> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca.pem))
        .identity(Identity::from_pem(&who.cert, &who.key));
    let channel = Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls)?.connect().await?;
    Ok(ReplicationClient::new(channel))
}

/// Every `Replication` call `who` can make, with what each was answered: `Ok` or the status.
async fn every_call(
    addr: SocketAddr,
    pki: &Pki,
    who: &Issued,
) -> Result<Vec<(&'static str, Result<String, tonic::Status>)>> {
    let mut rpc = replication(addr, pki, who).await?;
    // The Applications the snapshot names (an agent's are principal-scoped while it is not
    // connected).
    let snapshot = rpc.get_snapshot(SnapshotRequest { since_sequence_num: 0 }).await.map(|r| {
        let snap = r.into_inner();
        let agents = snap.agents.iter().flat_map(|a| a.resources.iter());
        let names: Vec<String> = agents.chain(snap.principal_resources.iter()).map(|r| r.name.clone()).collect();
        names.join(",")
    });
    let status = rpc.status(StatusRequest {}).await.map(|r| format!("{:?}", r.into_inner()));
    let acks = futures::stream::iter(Vec::<ReplicationAck>::new());
    let subscribe = rpc.subscribe(acks).await.map(|_| "subscribed".to_owned());
    Ok(vec![("GetSnapshot", snapshot), ("Status", status), ("Subscribe", subscribe)])
}

fn is_refusal_naming(answer: &Result<String, tonic::Status>, identity: &str) -> bool {
    matches!(answer, Err(s) if s.code() == tonic::Code::PermissionDenied
        && s.message().contains(&format!("identity {identity:?}"))
        && s.message().contains(FLAG))
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

/// Default configuration: an agent's certificate (accepted by `--auth mtls:`) reads nothing:
/// `GetSnapshot`, `Status` and `Subscribe` are refused with `PermissionDenied` naming the agent
/// and the flag, as is the would-be peer's (nobody is listed); the refusals are counted. With
/// the peer listed, the peer gets the snapshot (the agent's Application in it) and the agent is
/// still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_is_refused_to_an_agent_certificate_and_allowed_to_the_listed_peer() -> Result<()> {
    let pki = pki()?;
    let api = ApiServerProcess::start().await?;
    for ns in ["argocd", "agent-a"] {
        ensure_namespace(&api.client(), ns).await?;
    }
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    );
    let app = serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "payments", "namespace": "agent-a"}, "spec": {"project": "default"},
    });
    let apps: Api<DynamicObject> = Api::namespaced_with(api.client(), "agent-a", &ar);
    apps.create(&PostParams::default(), &serde_json::from_value(app)?).await?;

    // Unset: nobody may replicate.
    let mut principal = start_principal(&api, &pki, &[]).await?;
    let logs = || principal.process.log_tail(40);
    for (call, answer) in every_call(principal.agents, &pki, &pki.agent).await? {
        ensure!(
            is_refusal_naming(&answer, "agent-a"),
            "{call} with agent-a's certificate: {answer:?} (expected PermissionDenied naming agent-a and {FLAG})\n{}",
            logs()
        );
    }
    let (_, peer) = every_call(principal.agents, &pki, &pki.peer).await?.remove(0);
    ensure!(is_refusal_naming(&peer, "principal-b"), "GetSnapshot by an unlisted peer: {peer:?}");
    let refused = principal.metric("argocd_agent_replication_requests_refused_total", "reason=\"not_allowed\"").await?;
    ensure!(refused == Some(6.0), "refusals counted: {refused:?}");
    ensure!(
        principal.process.stderr().contains("replication call refused")
            || principal.process.stdout().contains("replication call refused"),
        "the refusals are not logged\n{}",
        logs()
    );
    principal.process.sigterm_and_wait(WAIT)?;

    // Listed: the peer replicates, the agent still does not.
    let mut principal = start_principal(&api, &pki, &[FLAG, "principal-b"]).await?;
    let answers = every_call(principal.agents, &pki, &pki.peer).await?;
    for (call, answer) in &answers {
        ensure!(answer.is_ok(), "{call} by the listed peer: {answer:?}\n{}", principal.process.log_tail(40));
    }
    ensure!(matches!(&answers[0].1, Ok(names) if names == "payments"), "the peer's snapshot: {:?}", answers[0].1);
    let (_, agent) = every_call(principal.agents, &pki, &pki.agent).await?.remove(0);
    ensure!(is_refusal_naming(&agent, "agent-a"), "GetSnapshot by agent-a with a peer listed: {agent:?}");
    principal.process.sigterm_and_wait(WAIT)?;
    Ok(())
}
