//! Certificates rotated while 100 agents stream (the issue's requirement: "zero streams dropped,
//! new handshakes use the new certificate"). `tls_reload.rs` proves the reload with one agent;
//! this does it under load, once with the principal's TLS in Secrets (what operators use:
//! `argocd-agentctl pki issue principal --upsert` rewrites `argocd-agent-principal-tls`) and once
//! with it in files, projected as the kubelet projects a mounted Secret (a `..data` symlink swapped
//! atomically).
//!
//! Setup: the spawned `argocd-agent principal` on 127.0.0.1 with mTLS
//! (`--auth mtls:subject:CN=([^,]+)`) and `--tls-reload-interval 1s`, its PKI made by
//! `argocd-agentctl`; `CERT_ROTATION_AGENTS` (100) agents simulated by `tests::loadgen` in this
//! process, each with its own client certificate (CN `agent-<n>`, issued here by the same CA), its
//! own TLS connection, session and stream (heartbeats and keepalive PINGs every 30 s).
//!
//! 1. The principal's server certificate is reissued. Measured: the time from the write to the
//!    first new TLS handshake presenting the new leaf (a raw TLS client, polled every 20 ms). Then:
//!    no stream ended (the load generator's count and the principal's
//!    `argocd_principal_agent_disconnects_total`), no agent reconnected
//!    (`argocd_principal_agent_connections_total`), every stream still carries events (an AppProject
//!    change reaches every agent), and new agents connect, verifying the new certificate.
//! 2. A new CA: an agent with a certificate from it is refused; the principal's CA becomes the
//!    bundle (old CA + new CA) (in Secret `argocd-agent-ca`, field `ca.crt`, which the principal
//!    prefers over `tls.crt`; or the projected file); the refused agent then connects, the old
//!    streams stay, and agents with old-CA certificates still connect.
//!
//! Figures are printed (`--nocapture`); the drops and reconnects are asserted to be zero.
//! Run: `cargo build -p cli && cargo test -p tests --test cert_rotation_load -- --nocapture`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent::transport::AgentTls;
use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use serde_json::json;
use tests::loadgen::{ClientTls, LoadConfig, LoadGen, Snapshot, procstat};
use tests::pki::{Ca, Issued};
use tests::topology::{ARGOCD_NS, StartOptions, Topology};

const RELOAD: &str = "1s";
/// Agents started after the server certificate's rotation (old CA), and after the CA's.
const FRESH: usize = 5;
/// Connecting 100+ agents, resyncs and fan-outs on a busy 2-core machine.
const SLOW: Duration = Duration::from_secs(120);
/// The new certificate must be served within a few reload intervals.
const ROTATION: Duration = Duration::from_secs(30);
const PROJECT: &str = "rotation";

/// Where the principal reads its TLS material.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// `argocd-agent-principal-tls` and `argocd-agent-ca` on the hub (the default flags).
    Secret,
    /// `--tls-cert`, `--tls-key`, `--root-ca-path`: a directory projected as the kubelet does.
    Files,
}

/// Both runs share the machine's two cores: one at a time, so neither's figures include the other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principal_certificate_and_ca_rotated_in_secrets_while_100_agents_stream() -> Result<()> {
    let _one = SERIAL.lock().await;
    run(Source::Secret).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principal_certificate_and_ca_rotated_in_mounted_files_while_100_agents_stream() -> Result<()> {
    let _one = SERIAL.lock().await;
    run(Source::Files).await
}

fn agents() -> usize {
    std::env::var("CERT_ROTATION_AGENTS").ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(100)
}

/// Agent TLS: the client certificate `issued` and `server_ca` to verify the principal with.
fn client_tls(server_ca: &CertificateDer<'static>, issued: &Issued) -> Result<AgentTls> {
    Ok(AgentTls::Rustls { config: Arc::new(issued.client_config(server_ca)?), server_name: "127.0.0.1".to_owned() })
}

/// Load configuration for agents `agent-<first>`.. with client certificates from `ca`.
fn mtls_load(
    addr: SocketAddr,
    first: usize,
    count: usize,
    ca: &Ca,
    server_ca: &CertificateDer<'static>,
) -> Result<LoadConfig> {
    let mut tls = BTreeMap::new();
    for n in first..first + count {
        let issued = ca.client(&format!("agent-{n}"), &[])?;
        tls.insert(n, client_tls(server_ca, &issued)?);
    }
    let mut config = LoadConfig::new(format!("https://{addr}"), count);
    config.first = first;
    config.mtls = Some(ClientTls(Arc::new(move |n| tls.get(&n).cloned().context("no certificate for this agent"))));
    Ok(config)
}

fn leaf_in(path: &Path) -> Result<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .with_context(|| format!("{}", path.display()))?
        .next()
        .context("no certificate")?
        .context("not PEM")
}

/// A directory projected as the kubelet projects a Secret volume: each version in its own
/// directory, `..data` pointing at the current one (swapped by one `rename`), and each file a
/// symlink through `..data`; readers never see a certificate without its key.
struct Projected {
    dir: PathBuf,
    version: usize,
}

impl Projected {
    const FILES: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];

    fn new(dir: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir, version: 0 })
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Makes `(cert, key, ca)` the current content.
    fn write(&mut self, cert: &str, key: &str, ca: &str) -> Result<()> {
        self.version += 1;
        let version = format!("..v{}", self.version);
        let vdir = self.dir.join(&version);
        std::fs::create_dir(&vdir)?;
        for (name, text) in Self::FILES.iter().zip([cert, key, ca]) {
            std::fs::write(vdir.join(name), text)?;
        }
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &tmp)?;
        std::fs::rename(&tmp, self.dir.join("..data"))?;
        if self.version == 1 {
            for name in Self::FILES {
                std::os::unix::fs::symlink(format!("..data/{name}"), self.dir.join(name))?;
            }
        }
        Ok(())
    }
}

/// The sum of a principal counter over its series whose labels contain `filter`.
async fn principal_counter(t: &Topology, name: &str, filter: &str) -> Result<f64> {
    let addr = t.principal_metrics_addr().context("the principal's metrics address")?;
    let (status, text) = tests::http::get(addr, "/metrics").await?;
    ensure!(status == 200, "/metrics answered {status}");
    let prefix = format!("{name}{{");
    Ok(text
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Connections and disconnects the principal counted, over every agent.
async fn principal_streams(t: &Topology) -> Result<(f64, f64)> {
    Ok((
        principal_counter(t, "argocd_principal_agent_connections_total", "").await?,
        principal_counter(t, "argocd_principal_agent_disconnects_total", "").await?,
    ))
}

fn sum(loads: &[&LoadGen]) -> Snapshot {
    loads.iter().map(|l| l.snapshot()).fold(Snapshot::default(), |a, s| Snapshot {
        connected: a.connected + s.connected,
        subscribed: a.subscribed + s.subscribed,
        streams_ended: a.streams_ended + s.streams_ended,
        dial_failed: a.dial_failed + s.dial_failed,
        auth_failed: a.auth_failed + s.auth_failed,
        subscribe_refused: a.subscribe_refused + s.subscribe_refused,
        authenticated: a.authenticated + s.authenticated,
        ..a
    })
}

/// No stream of `loads` ended and each agent opened exactly one; the principal agrees
/// (`agents` streams opened, none ended).
async fn no_stream_dropped(t: &Topology, loads: &[&LoadGen], when: &str) -> Result<()> {
    let agents: usize = loads.iter().map(|l| l.agents()).sum();
    let s = sum(loads);
    let (connections, disconnects) = principal_streams(t).await?;
    ensure!(
        s.streams_ended == 0 && s.subscribed == agents as u64 && s.connected == agents,
        "{when}: the agents' streams: {s:?} (expected {agents} opened, none ended)\n{}",
        t.logs()
    );
    ensure!(
        disconnects == 0.0 && connections == agents as f64,
        "{when}: the principal counted {connections} stream connections and {disconnects} disconnects for {agents} agents\n{}",
        t.logs()
    );
    Ok(())
}

fn projects(t: &Topology) -> Api<kube::api::DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AppProject");
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, "appprojects");
    Api::namespaced_with(t.hub(), ARGOCD_NS, &ar)
}

/// One AppProject change every agent must apply: each stream still carries events.
async fn fan_out(t: &Topology, loads: &[&LoadGen], marker: &str) -> Result<Duration> {
    for l in loads {
        l.expect_marker(marker);
    }
    let started = Instant::now();
    let patch = Patch::Merge(json!({"spec": {"description": marker}}));
    projects(t).patch(PROJECT, &PatchParams::default(), &patch).await?;
    let mut last = Duration::ZERO;
    for l in loads {
        last = last.max(l.wait_all_marked(started, SLOW).await.with_context(|| format!("fan-out {marker:?}"))?.1);
    }
    Ok(last)
}

/// Polls new handshakes (every 20 ms) until one presents `want`; when, and how many presented
/// the old leaf meanwhile.
async fn until_presented(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
    want: &CertificateDer<'static>,
) -> Result<(Instant, usize)> {
    let deadline = Instant::now() + ROTATION;
    let mut old = 0;
    loop {
        match tests::http::presented_certificate(addr, ca).await {
            Ok(c) if c == *want => return Ok((Instant::now(), old)),
            Ok(_) => old += 1,
            Err(e) => bail!("a TLS handshake with the principal failed during the rotation: {e:#}"),
        }
        if Instant::now() >= deadline {
            bail!("the principal did not present its new certificate within {ROTATION:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn cpu_secs(pid: u32, hz: f64) -> Result<f64> {
    Ok(procstat::cpu_ticks(pid)? as f64 / hz)
}

async fn run(source: Source) -> Result<()> {
    let n = agents();
    let options =
        StartOptions { principal_args: vec!["--tls-reload-interval".into(), RELOAD.into()], ..StartOptions::default() };
    let mut t = Topology::start_with_options(&[], options).await?;
    let pki = t.pki_dir();
    let old_ca = t.hub_ca().await?;
    let old_ca_der = old_ca.der()?;
    ensure!(old_ca_der == leaf_in(&pki.join("ca.crt"))?, "the hub's CA is the one in the PKI directory");
    let mut projected = None;
    if source == Source::Files {
        // The same material as the Secrets, from a projected directory: restart the principal on it.
        let mut p = Projected::new(t.pki_dir().with_file_name("served"))?;
        let read = |f: &str| std::fs::read_to_string(pki.join(f)).with_context(|| f.to_owned());
        p.write(&read("principal.crt")?, &read("principal.key")?, &old_ca.pem)?;
        let paths = [p.path("tls.crt"), p.path("tls.key"), p.path("ca.crt")].map(|p| p.display().to_string());
        t.set_principal_args(&[
            "--tls-reload-interval",
            RELOAD,
            "--tls-cert",
            &paths[0],
            "--tls-key",
            &paths[1],
            "--root-ca-path",
            &paths[2],
        ]);
        t.stop_principal(Duration::from_secs(30))?;
        t.start_principal().await?;
        projected = Some(p);
    }
    let addr = t.principal_addr().context("principal address")?;
    let pid = t.principal_pid().context("principal pid")?;
    let hz = procstat::clock_ticks_per_second() as f64;
    let project = tests::fixtures::dynamic(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AppProject",
        "metadata": {"name": PROJECT, "namespace": ARGOCD_NS},
        "spec": {"description": "before", "sourceRepos": ["*"], "sourceNamespaces": ["*"],
                 "destinations": [{"name": "*", "namespace": "*"}]},
    }))?;
    projects(&t).create(&PostParams::default(), &project).await?;

    // 100 agents with their own client certificates, each with a stream open and resynced.
    let started = Instant::now();
    let load = LoadGen::start(mtls_load(addr, 1, n, &old_ca, &old_ca_der)?);
    let connected_in = load
        .wait_all_resynced(started, SLOW, |_, _| {})
        .await
        .with_context(|| format!("{:?}\n{}", load.snapshot(), t.logs()))?;
    fan_out(&t, &[&load], "connected").await?;
    no_stream_dropped(&t, &[&load], "before any rotation").await?;
    let old_leaf = tests::http::presented_certificate(addr, &old_ca_der).await?;
    ensure!(old_leaf == leaf_in(&pki.join("principal.crt"))?, "the principal presents the issued certificate");

    // Idle CPU for comparison (a measurement window, not synchronisation).
    let (c0, w0) = (cpu_secs(pid, hz)?, Instant::now());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_cpu = (cpu_secs(pid, hz)? - c0) / w0.elapsed().as_secs_f64();

    // 1. The server certificate, reissued.
    let cpu0 = cpu_secs(pid, hz)?;
    let issuing = Instant::now();
    t.issue_principal_certificate(true)?; // the Secret, and principal.{crt,key} in the PKI directory
    let issued = Instant::now();
    let new_leaf = leaf_in(&pki.join("principal.crt"))?;
    ensure!(new_leaf != old_leaf, "reissuing makes a new certificate");
    let written = match projected.as_mut() {
        None => issued,
        Some(p) => {
            let key = std::fs::read_to_string(pki.join("principal.key"))?;
            p.write(&std::fs::read_to_string(pki.join("principal.crt"))?, &key, &old_ca.pem)?;
            Instant::now()
        }
    };
    let (served_at, old_handshakes) = until_presented(addr, &old_ca_der, &new_leaf).await.with_context(|| t.logs())?;
    let rotation_cpu = cpu_secs(pid, hz)? - cpu0;
    let rotation_wall = served_at.duration_since(issuing).as_secs_f64();
    let to_new_handshake = served_at.duration_since(written);
    no_stream_dropped(&t, &[&load], "after the server certificate's rotation").await?;
    let fanout_after_cert = fan_out(&t, &[&load], "after the certificate").await?;
    // New agents verify the new certificate (the old CA's) and connect.
    let started = Instant::now();
    let fresh = LoadGen::start(mtls_load(addr, n + 1, FRESH, &old_ca, &old_ca_der)?);
    let fresh_in = fresh
        .wait_all_resynced(started, SLOW, |_, _| {})
        .await
        .with_context(|| format!("new agents after the rotation: {:?}\n{}", fresh.snapshot(), t.logs()))?;
    ensure!(
        tests::http::presented_certificate(addr, &old_ca_der).await? == new_leaf,
        "handshakes keep presenting the new certificate"
    );
    no_stream_dropped(&t, &[&load, &fresh], "after new agents joined").await?;

    // 2. A new CA. An agent with its certificate is refused while the principal trusts the old CA only.
    let new_ca = Ca::generate("argocd-agent-ca rotated")?;
    let newca = {
        let mut c = mtls_load(addr, n + FRESH + 1, 1, &new_ca, &old_ca_der)?;
        c.backoff = agent::backoff::BackoffConfig {
            initial: Duration::from_millis(100),
            factor: 2.0,
            max: Duration::from_millis(400),
            jitter: 0.2,
        };
        LoadGen::start(c)
    };
    tests::wait_until_async(SLOW, "the new CA's agent to be refused twice", || async {
        let s = newca.snapshot();
        s.dial_failed + s.auth_failed + s.subscribe_refused >= 2
    })
    .await?;
    ensure!(newca.snapshot().subscribed == 0, "an agent of an untrusted CA opened a stream: {:?}", newca.snapshot());
    let handshake_refusals = t.principal_log_lines("TLS handshake failed");
    let refusal = handshake_refusals.last().context("the principal logged no refused handshake")?;
    ensure!(refusal.contains("UnknownIssuer"), "the principal refused the handshake for another reason: {refusal}");
    let bundle = format!("{}\n{}", old_ca.pem.trim_end(), new_ca.pem);
    let ca_written = match projected.as_mut() {
        None => {
            use base64::Engine as _;
            let encoded = base64::engine::general_purpose::STANDARD.encode(&bundle);
            let patch = Patch::Merge(json!({"data": {"ca.crt": encoded}}));
            Api::<Secret>::namespaced(t.hub(), ARGOCD_NS)
                .patch("argocd-agent-ca", &PatchParams::default(), &patch)
                .await?;
            Instant::now()
        }
        Some(p) => {
            let key = std::fs::read_to_string(pki.join("principal.key"))?;
            p.write(&std::fs::read_to_string(pki.join("principal.crt"))?, &key, &bundle)?;
            Instant::now()
        }
    };
    let newca_in = newca
        .wait_all_resynced(ca_written, SLOW, |_, _| {})
        .await
        .with_context(|| format!("the new CA's agent: {:?}\n{}", newca.snapshot(), t.logs()))?;
    // Attempts refused until the principal had read the bundle (TLS alerts surface as failed
    // dials or failed `Authenticate` calls).
    let refused = {
        let s = newca.snapshot();
        format!("{} dials, {} authentications", s.dial_failed, s.auth_failed + s.subscribe_refused)
    };
    // Old-CA agents still connect, the server certificate is unchanged, nothing dropped.
    let started = Instant::now();
    let old_after = LoadGen::start(mtls_load(addr, n + FRESH + 2, 1, &old_ca, &old_ca_der)?);
    old_after.wait_all_resynced(started, SLOW, |_, _| {}).await.with_context(|| t.logs())?;
    ensure!(
        tests::http::presented_certificate(addr, &old_ca_der).await? == new_leaf,
        "the CA's rotation left the server certificate alone"
    );
    let all = [&load, &fresh, &old_after];
    let fanout_after_ca = fan_out(&t, &[&load, &fresh, &newca, &old_after], "after the CA").await?;
    let s = sum(&all);
    ensure!(s.streams_ended == 0 && s.subscribed == (n + FRESH + 1) as u64, "after the CA's rotation: {s:?}");
    let (connections, disconnects) = principal_streams(&t).await?;
    let agents_seen = (n + FRESH + 2) as f64;
    ensure!(
        disconnects == 0.0 && connections == agents_seen,
        "after the CA's rotation the principal counted {connections} connections and {disconnects} disconnects for {agents_seen} agents"
    );
    let reloads = t.principal_log_lines("TLS material changed").len();
    let reload_errors = t.principal_log_lines("cannot reload the TLS material").len();
    ensure!(reloads >= 2, "the principal logged {reloads} reloads, expected the certificate's and the CA's");
    let reconnects = sum(&[&load, &fresh, &newca, &old_after]).subscribed - (n + FRESH + 2) as u64;

    println!(
        "certificate rotation under load ({source:?}, reload every {RELOAD}): {n} agents connected in {:.2} s; \
         server certificate: `pki issue principal --upsert` took {:.2} s, first handshake presenting the new \
         leaf {:.3} s after the write ({old_handshakes} probes still saw the old one); streams dropped 0 \
         (agents' count and principal's disconnects), reconnects {reconnects}; fan-out to all {n} after it {:.3} s; \
         {FRESH} new agents connected with the new certificate in {:.2} s; principal CPU during the rotation \
         {:.2} s over {:.2} s ({:.0}% of a core, idle {:.0}%); CA bundle (old + new): the new CA's agent, \
         refused until the reload ({refused} failed), connected {:.2} s after the write; fan-out to all {} after it \
         {:.3} s; principal logged {reloads} reloads, {reload_errors} reload errors",
        connected_in.as_secs_f64(),
        issued.duration_since(issuing).as_secs_f64(),
        to_new_handshake.as_secs_f64(),
        fanout_after_cert.as_secs_f64(),
        fresh_in.as_secs_f64(),
        rotation_cpu,
        rotation_wall,
        rotation_cpu / rotation_wall * 100.0,
        idle_cpu * 100.0,
        newca_in.as_secs_f64(),
        n + FRESH + 2,
        fanout_after_ca.as_secs_f64(),
    );
    for l in [load, fresh, newca, old_after] {
        l.stop().await;
    }
    Ok(())
}
