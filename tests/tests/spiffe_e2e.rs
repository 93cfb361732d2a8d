//! `--auth spiffe:x509` and `--auth spiffe:jwt` end to end: the principal and an agent as spawned
//! binaries on embedded API servers, each with its own SPIFFE Workload API (the fake one from
//! `mesh::workload::testing`, served by this test process on a Unix socket; no SPIRE exists
//! here). Applications sync both ways; SVID rotation mid-stream keeps the stream and reaches the
//! next handshake; an expired SVID, an SVID from an untrusted CA and a JWT-SVID for another
//! audience are refused until the Workload API serves a good one.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use mesh::workload::testing::{FakeWorkloadApi, JwtMaterial, TestCa, TestJwtAuthority, X509Material};
use serde_json::{Value, json};
use tests::apiserver::ApiServerProcess;
use tests::fixtures::application_resource;
use tests::process::ChildProcess;
use tests::topology::ARGOCD_NS;
use tests::{wait_for_async, wait_until_async, workspace_binary};

const TD: &str = "cluster.local";
const PRINCIPAL_ID: &str = "spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal";
const AUDIENCE: &str = "argocd-agent-principal";
const CONVERGE: Duration = Duration::from_secs(45);
const START: Duration = Duration::from_secs(60);

fn agent_id(name: &str) -> String {
    format!("spiffe://{TD}/ns/agents/sa/{name}")
}

/// Hub, spoke, and the principal and agent processes.
struct Setup {
    hub: ApiServerProcess,
    spoke: ApiServerProcess,
    principal: ChildProcess,
    principal_port: u16,
    agent: Option<ChildProcess>,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// Starts hub and spoke and the principal with `--auth <auth>`.
    async fn start(agent: &str, auth: &str, plaintext: bool) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("spiffe-e2e-").tempdir()?;
        let hub = ApiServerProcess::start_on(dir.path().join("hub")).await?;
        let spoke = ApiServerProcess::start_on(dir.path().join("spoke")).await?;
        for (client, ns) in [(hub.client(), ARGOCD_NS), (hub.client(), agent), (spoke.client(), ARGOCD_NS)] {
            let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
            api.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}}))?).await?;
        }
        let mut cmd = Command::new(workspace_binary("argocd-agent")?);
        cmd.args(["principal", "--allowed-namespaces", "*", "--namespace", ARGOCD_NS, "--auth", auth])
            .args(["--listen-host", "127.0.0.1", "--listen-port", "0", "--log-level", "debug"])
            // Free loopback ports: the defaults (8000, 0.0.0.0:8003) collide between tests.
            .args(["--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"])
            .arg("--insecure-jwt-generate")
            .arg("--kubeconfig")
            .arg(hub.kubeconfig_path())
            .env("NO_COLOR", "1")
            .env_remove("SPIFFE_ENDPOINT_SOCKET");
        if plaintext {
            cmd.arg("--insecure-plaintext");
        }
        let mut principal = ChildProcess::spawn("principal", cmd)?;
        let addr = wait_for_async(START, "the principal to listen", || {
            let running = principal.ensure_running();
            let addr = principal
                .stdout()
                .lines()
                .find_map(|l| l.strip_prefix("principal listening on ").map(|a| a.trim().to_string()));
            async move { running.map(|()| addr) }
        })
        .await?;
        let principal_port = addr.rsplit(':').next().and_then(|p| p.parse().ok()).context("principal address")?;
        Ok(Self { hub, spoke, principal, principal_port, agent: None, _dir: dir })
    }

    /// Starts (or restarts) the managed agent with `--creds <creds>`.
    fn start_agent(&mut self, creds: &str, plaintext: bool) -> Result<()> {
        let mut cmd = Command::new(workspace_binary("argocd-agent")?);
        cmd.args(["agent", "--agent-mode", "managed", "--server-address", "127.0.0.1"])
            .args(["--server-port", &self.principal_port.to_string(), "--creds", creds])
            .args(["--namespace", ARGOCD_NS, "--log-level", "debug"])
            .args(["--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"])
            .arg("--kubeconfig")
            .arg(self.spoke.kubeconfig_path())
            .env("NO_COLOR", "1")
            .env_remove("SPIFFE_ENDPOINT_SOCKET");
        if plaintext {
            cmd.arg("--insecure-plaintext");
        }
        self.agent = Some(ChildProcess::spawn("agent", cmd)?);
        Ok(())
    }

    fn kill_agent(&mut self) -> Result<()> {
        if let Some(mut agent) = self.agent.take() {
            agent.sigkill()?;
        }
        Ok(())
    }

    fn connects(&self, agent: &str) -> usize {
        let needle = format!("agent connected agent={agent} ");
        self.principal.stderr().lines().filter(|l| l.contains(&needle)).count()
    }

    fn agent_log_count(&self, needle: &str) -> usize {
        self.agent.as_ref().map_or(0, |a| a.stderr().lines().filter(|l| l.contains(needle)).count())
    }

    fn logs(&self) -> String {
        let mut out = format!("--- principal\n{}\n", self.principal.log_tail(40));
        if let Some(agent) = &self.agent {
            out.push_str(&format!("--- agent\n{}\n", agent.log_tail(40)));
        }
        out
    }

    async fn wait_connects(&self, agent: &str, count: usize) -> Result<()> {
        wait_until_async(CONVERGE, &format!("{count} connect(s) of agent {agent}"), || async {
            self.connects(agent) >= count
        })
        .await
        .with_context(|| self.logs())
    }

    /// Waits until the agent has logged `needle` at least `count` times.
    async fn wait_agent_log(&self, needle: &str, count: usize) -> Result<()> {
        wait_until_async(CONVERGE, &format!("the agent to log {needle:?} {count} time(s)"), || async {
            self.agent_log_count(needle) >= count
        })
        .await
        .with_context(|| self.logs())
    }

    /// An Application created on the hub reaches the spoke, and status written on the spoke
    /// comes back to the hub.
    async fn sync_both_ways(&self, agent: &str, app: &str) -> Result<()> {
        let hub: Api<DynamicObject> = Api::namespaced_with(self.hub.client(), agent, &application_resource());
        let spoke: Api<DynamicObject> = Api::namespaced_with(self.spoke.client(), ARGOCD_NS, &application_resource());
        hub.create(&PostParams::default(), &application(app, agent)?).await?;
        wait_until_async(CONVERGE, &format!("{app} reaches the spoke"), || async {
            spoke.get_opt(app).await.ok().flatten().is_some()
        })
        .await
        .with_context(|| self.logs())?;
        let status = json!({"status": {"health": {"status": "Healthy"}, "sync": {"status": "Synced"}}});
        spoke.patch(app, &PatchParams::default(), &Patch::Merge(status)).await?;
        wait_until_async(CONVERGE, &format!("{app}'s status reaches the hub"), || async {
            hub.get_opt(app)
                .await
                .ok()
                .flatten()
                .and_then(|o| serde_json::to_value(o).ok())
                .is_some_and(|o: Value| o["status"]["health"]["status"] == "Healthy")
        })
        .await
        .with_context(|| self.logs())
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.kill_agent();
    }
}

fn application(name: &str, ns: &str) -> Result<DynamicObject> {
    tests::fixtures::app_with_path(name, ns, name)
}

fn endpoint_of(api: &FakeWorkloadApi) -> String {
    api.endpoint()
}

fn socket_exists(api: &FakeWorkloadApi) -> bool {
    Path::new(api.socket_path()).exists()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spiffe_x509_syncs_both_ways_and_rotation_keeps_the_stream() -> Result<()> {
    let agent = "sx";
    let ca = TestCa::new(TD)?;
    let principal_api = FakeWorkloadApi::start(Some(X509Material::new(&ca, PRINCIPAL_ID)?), None).await?;
    let agent_api = FakeWorkloadApi::start(Some(X509Material::new(&ca, &agent_id(agent))?), None).await?;
    assert!(socket_exists(&principal_api) && socket_exists(&agent_api));
    let auth = format!("spiffe:x509:trust-domain={TD};namespaces=agents;endpoint={}", endpoint_of(&principal_api));
    let mut s = Setup::start(agent, &auth, false).await?;
    s.start_agent(&format!("spiffe:x509:endpoint={};principal-id={PRINCIPAL_ID}", endpoint_of(&agent_api)), false)?;
    s.wait_connects(agent, 1).await?;
    s.sync_both_ways(agent, "before-rotation").await?;

    // Rotate both SVIDs: the live stream stays up and keeps carrying events.
    principal_api.rotate_x509(X509Material::new(&ca, PRINCIPAL_ID)?);
    agent_api.rotate_x509(X509Material::new(&ca, &agent_id(agent))?);
    s.sync_both_ways(agent, "after-rotation").await?;
    assert_eq!(s.connects(agent), 1, "rotation must not drop the stream\n{}", s.logs());

    // A new handshake (agent restarted) presents the rotated SVIDs and is accepted.
    s.kill_agent()?;
    s.start_agent(&format!("spiffe:x509:endpoint={}", endpoint_of(&agent_api)), false)?;
    s.wait_connects(agent, 2).await?;
    s.sync_both_ways(agent, "after-restart").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spiffe_x509_refuses_expired_and_untrusted_svids_until_a_good_one_arrives() -> Result<()> {
    let agent = "sx-bad";
    let ca = TestCa::new(TD)?;
    let rogue = TestCa::new(TD)?; // same trust domain, key not in the principal's bundle
    let principal_api = FakeWorkloadApi::start(Some(X509Material::new(&ca, PRINCIPAL_ID)?), None).await?;
    let now = SystemTime::now();
    let expired = ca.issue_valid(&agent_id(agent), now - Duration::from_secs(7200), now - Duration::from_secs(3600))?;
    let agent_api = FakeWorkloadApi::start(
        Some(X509Material { svid: expired, bundle: vec![ca.der().to_vec()], federated: Default::default() }),
        None,
    )
    .await?;
    let auth = format!("spiffe:x509:trust-domain={TD};endpoint={}", endpoint_of(&principal_api));
    let mut s = Setup::start(agent, &auth, false).await?;
    let creds = format!("spiffe:x509:endpoint={}", endpoint_of(&agent_api));

    // An expired SVID is never used: the agent stops, naming the Workload API.
    s.start_agent(&creds, false)?;
    let status = s.agent.as_mut().context("agent")?.wait_exit_async(START).await?;
    assert!(!status.success(), "an agent with only an expired SVID must not run\n{}", s.logs());
    let log = s.agent.as_ref().map(ChildProcess::stderr).unwrap_or_default();
    assert!(log.contains("no X.509-SVID from the SPIFFE Workload API"), "{log}");
    assert_eq!(s.connects(agent), 0);

    // An SVID from a CA the principal does not trust (e.g. a revoked signing key): the handshake
    // fails and the agent keeps retrying.
    let mut untrusted = X509Material::new(&rogue, &agent_id(agent))?;
    untrusted.bundle = vec![ca.der().to_vec()];
    agent_api.rotate_x509(untrusted);
    s.start_agent(&creds, false)?;
    s.wait_agent_log("authentication failed", 2).await?;
    assert_eq!(s.connects(agent), 0, "an SVID from an untrusted CA must not connect\n{}", s.logs());

    // A good SVID arrives from the Workload API: the running agent connects without a restart.
    agent_api.rotate_x509(X509Material::new(&ca, &agent_id(agent))?);
    s.wait_connects(agent, 1).await?;
    s.sync_both_ways(agent, "recovered").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spiffe_jwt_syncs_both_ways_with_short_lived_svids_and_key_rotation() -> Result<()> {
    let agent = "sj";
    let signer = TestJwtAuthority::new(TD, "key-1")?;
    let principal_api = FakeWorkloadApi::start(None, Some(JwtMaterial::new(PRINCIPAL_ID, signer.clone()))).await?;
    let mut material = JwtMaterial::new(&agent_id(agent), signer.clone());
    material.ttl = Duration::from_secs(4);
    let agent_api = FakeWorkloadApi::start(None, Some(material)).await?;
    let auth = format!(
        "spiffe:jwt:audience={AUDIENCE};trust-domain={TD};namespaces=agents;endpoint={}",
        endpoint_of(&principal_api)
    );
    let mut s = Setup::start(agent, &auth, true).await?;

    // A JWT-SVID for another audience is refused, with the reason in the agent's log.
    s.start_agent(&format!("spiffe:jwt:audience=someone-else;endpoint={}", endpoint_of(&agent_api)), true)?;
    s.wait_agent_log("authentication failed", 1).await?;
    assert_eq!(s.connects(agent), 0, "a JWT-SVID for another audience must not connect\n{}", s.logs());
    s.kill_agent()?;

    let creds = format!("spiffe:jwt:endpoint={}", endpoint_of(&agent_api));
    s.start_agent(&creds, true)?;
    s.wait_connects(agent, 1).await?;
    s.sync_both_ways(agent, "first").await?;

    // The 4 s SVIDs are refreshed in the background; the signing key rotates (the principal's
    // bundle trusts both keys first, as SPIRE publishes a new key before using it).
    s.wait_agent_log("JWT-SVID refreshed", 2).await?;
    let next = TestJwtAuthority::new(TD, "key-2")?;
    principal_api.rotate_jwt(JwtMaterial::new(PRINCIPAL_ID, signer.clone()).trust(&next));
    let mut rotated = JwtMaterial::new(&agent_id(agent), next.clone()).trust(&signer);
    rotated.ttl = Duration::from_secs(4);
    agent_api.rotate_jwt(rotated);
    let refreshed = s.agent_log_count("JWT-SVID refreshed");
    s.wait_agent_log("JWT-SVID refreshed", refreshed + 1).await?;

    // After the first SVID expired, a restarted agent authenticates with a fresh one signed
    // by the new key.
    s.kill_agent()?;
    s.start_agent(&creds, true)?;
    s.wait_connects(agent, 2).await?;
    s.sync_both_ways(agent, "second").await?;
    Ok(())
}
