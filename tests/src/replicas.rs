//! Principal replicas sharing one hub's agents (`argocd-agent principal --agent-leases`), as real
//! processes behind a small L4 load balancer that stands in for the Kubernetes Service.
//!
//! - [`LoadBalancer`]: accepts on `127.0.0.1:0` and dials a backend round robin, skipping the
//!   ones marked down (as kube-proxy drops a not-ready endpoint) and the ones that refuse the
//!   connection (a dead pod); bytes are copied both ways until either side closes.
//! - [`Replicas`]: N principals started with the topology's flags (its transport, auth and
//!   kubeconfig, [`Topology::principal_command`]) plus `--agent-leases --replica-name <name>
//!   --agent-lease-duration <d>`, each behind its own Envoy principal sidecar on a mesh
//!   topology; the load balancer in front of them. A replica may run with its own kubeconfig
//!   (e.g. through a [`crate::faultproxy::FaultProxy`] to the hub API, or as its own
//!   ServiceAccount so an audit log tells the replicas apart).
//! - [`owner`]: who holds an agent's owner Lease (`argocd-agent-owner-<agent>`) in the hub.
//! - [`Churn`]: a stream of changes on both sides with every acknowledged write recorded, and
//!   [`Churn::converged`]: every change reached the other side.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::envoy::{EnvoySidecar, SidecarKind, SidecarParams};
use crate::process::ChildProcess;
use crate::topology::{ARGOCD_NS, MeshOptions, Mode, StartOptions, Topology, Transport};
use crate::wait::{Poller, wait_for_async};

/// How long a replica may take to start and report ready on a busy machine.
const START: Duration = Duration::from_secs(60);
/// How long the load balancer waits for a backend to accept.
const DIAL: Duration = Duration::from_secs(2);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// === The load balancer ===

#[derive(Debug, Clone)]
struct Backend {
    addr: SocketAddr,
    down: bool,
}

#[derive(Debug, Default)]
struct LbShared {
    backends: Mutex<Vec<Backend>>,
    next: AtomicUsize,
    /// Live connections per backend index.
    live: Mutex<HashMap<usize, u64>>,
    /// Backend index of every connection made, in order.
    picks: Mutex<Vec<usize>>,
    /// Dials a backend refused (or did not answer in time).
    refused: AtomicU64,
    /// Clients closed because no backend took them.
    unserved: AtomicU64,
}

/// An L4 round-robin load balancer on `127.0.0.1:0` (a Kubernetes Service's place). Dropping it
/// stops accepting and closes every connection.
#[derive(Debug)]
pub struct LoadBalancer {
    addr: SocketAddr,
    shared: Arc<LbShared>,
    stop: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl LoadBalancer {
    /// Listen and forward to `backends`, round robin.
    ///
    /// # Errors
    /// The listener cannot be bound.
    pub async fn start(backends: &[SocketAddr]) -> anyhow::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(LbShared::default());
        *lock(&shared.backends) = backends.iter().map(|a| Backend { addr: *a, down: false }).collect();
        let (stop, stopped) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(listener, shared.clone(), stopped));
        Ok(Self { addr, shared, stop, accept })
    }

    /// Where clients connect.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Mark backend `index` down (no new connections go to it; live ones stay, as with
    /// kube-proxy) or up again.
    pub fn set_down(&self, index: usize, down: bool) {
        if let Some(b) = lock(&self.shared.backends).get_mut(index) {
            b.down = down;
        }
    }

    /// Only backend `index` takes new connections (to steer agents to one replica).
    pub fn only(&self, index: usize) {
        for (i, b) in lock(&self.shared.backends).iter_mut().enumerate() {
            b.down = i != index;
        }
    }

    /// Every backend takes new connections.
    pub fn all_up(&self) {
        for b in lock(&self.shared.backends).iter_mut() {
            b.down = false;
        }
    }

    /// Live connections to backend `index`.
    #[must_use]
    pub fn live(&self, index: usize) -> u64 {
        lock(&self.shared.live).get(&index).copied().unwrap_or(0)
    }

    /// Backend index of every connection made so far.
    #[must_use]
    pub fn picks(&self) -> Vec<usize> {
        lock(&self.shared.picks).clone()
    }

    /// Dials refused by a backend so far.
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// Clients closed because no backend took them.
    #[must_use]
    pub fn unserved(&self) -> u64 {
        self.shared.unserved.load(Ordering::Relaxed)
    }
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<LbShared>, stopped: watch::Receiver<bool>) {
    loop {
        let Ok((client, _)) = listener.accept().await else { continue };
        tokio::spawn(serve(client, shared.clone(), stopped.clone()));
    }
}

/// Dial the backends from the next in turn; the first that accepts takes the client.
async fn pick(shared: &LbShared) -> Option<(usize, TcpStream)> {
    let backends = lock(&shared.backends).clone();
    let n = backends.len();
    let start = shared.next.fetch_add(1, Ordering::Relaxed);
    for i in 0..n {
        let index = (start + i) % n;
        let Some(backend) = backends.get(index).filter(|b| !b.down) else { continue };
        match tokio::time::timeout(DIAL, TcpStream::connect(backend.addr)).await {
            Ok(Ok(stream)) => return Some((index, stream)),
            _ => {
                shared.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    None
}

async fn serve(mut client: TcpStream, shared: Arc<LbShared>, mut stopped: watch::Receiver<bool>) {
    let Some((index, mut upstream)) = pick(&shared).await else {
        shared.unserved.fetch_add(1, Ordering::Relaxed);
        // An RST, as a Service without endpoints answers.
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    lock(&shared.picks).push(index);
    *lock(&shared.live).entry(index).or_default() += 1;
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
        _ = stopped.wait_for(|s| *s) => {}
    }
    if let Some(n) = lock(&shared.live).get_mut(&index) {
        *n = n.saturating_sub(1);
    }
}

// === Replicas ===

/// One principal replica (and its Envoy sidecar on a mesh).
#[derive(Debug)]
pub struct Replica {
    name: String,
    // Killed before its sidecar when dropped.
    process: Option<ChildProcess>,
    sidecar: Option<EnvoySidecar>,
    listen: SocketAddr,
    frontend: SocketAddr,
}

/// The address on the last stdout line starting with `prefix`.
fn listening_on(stdout: &str, prefix: &str) -> Option<SocketAddr> {
    stdout.lines().filter_map(|l| l.strip_prefix(prefix)).next_back().and_then(|a| a.trim().parse().ok())
}

impl Replica {
    /// Its `--replica-name`.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the principal itself listens.
    #[must_use]
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// What the load balancer dials: the sidecar on a mesh, else the principal.
    #[must_use]
    pub fn frontend(&self) -> SocketAddr {
        self.frontend
    }

    /// Whether the principal process runs.
    pub fn is_running(&mut self) -> bool {
        self.process.as_mut().is_some_and(ChildProcess::is_running)
    }

    /// The principal process (signals, logs); `None` once killed.
    pub fn process_mut(&mut self) -> Option<&mut ChildProcess> {
        self.process.as_mut()
    }

    /// Where its resource proxy listens, once it has said so (`--resource-proxy-listen-address`).
    #[must_use]
    pub fn resource_proxy_addr(&self) -> Option<SocketAddr> {
        listening_on(&self.stdout(), "resource proxy listening on ")
    }

    fn stdout(&self) -> String {
        self.process.as_ref().map(ChildProcess::stdout).unwrap_or_default()
    }

    /// Its stderr (the log).
    #[must_use]
    pub fn stderr(&self) -> String {
        self.process.as_ref().map(ChildProcess::stderr).unwrap_or_default()
    }

    /// Where it serves the Redis proxy, from its log (`None`: not said yet).
    #[must_use]
    pub fn redis_proxy_addr(&self) -> Option<SocketAddr> {
        crate::topology::redis_proxy_listening(&self.log_lines(crate::topology::REDIS_PROXY_LISTENING))
    }

    /// Where it serves `/metrics`.
    #[must_use]
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        listening_on(&self.stdout(), "principal metrics listening on ")
    }

    /// Where it serves `/healthz` and `/readyz`.
    #[must_use]
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        listening_on(&self.stdout(), "principal healthz listening on ")
    }

    /// The `/readyz` status code (`None`: not reachable).
    pub async fn readyz(&self) -> Option<u16> {
        let addr = self.healthz_addr()?;
        crate::http::get(addr, "/readyz").await.ok().map(|(code, _)| code)
    }

    /// One sample of its `/metrics` (`None`: absent or not reachable).
    pub async fn metric(&self, name: &str, labels: &str) -> Option<f64> {
        let addr = self.metrics_addr()?;
        let (_, body) = crate::http::get(addr, "/metrics").await.ok()?;
        crate::http::sample(&body, name, labels)
    }

    /// How many times it logged `agent connected` for `agent`.
    #[must_use]
    pub fn connects(&self, agent: &str) -> usize {
        let needle = format!("agent connected agent={agent} ");
        self.stderr().lines().filter(|l| l.contains(&needle)).count()
    }

    /// Its log lines containing `needle`.
    #[must_use]
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.stderr().lines().filter(|l| l.contains(needle)).map(str::to_owned).collect()
    }

    /// SIGKILL the principal and then its sidecar: the pod is gone (its connections are closed).
    ///
    /// # Errors
    /// It is not running.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        let mut p = self.process.take().with_context(|| format!("replica {} is not running", self.name))?;
        p.sigkill()?;
        if let Some(mut sidecar) = self.sidecar.take() {
            sidecar.process_mut().sigkill()?;
        }
        Ok(())
    }

    /// SIGTERM the principal and its sidecar, and wait up to `grace` for both; the principal
    /// must exit cleanly. `sidecar_outlives`: the sidecar gets SIGTERM once the principal has
    /// exited, after draining it first (Istio's drain, or a `preStop` hook on the sidecar that
    /// posts `/drain_listeners?graceful`); else both at once, as the
    /// kubelet stops a deleted pod's containers (plain Envoy exits at once on SIGTERM).
    ///
    /// # Errors
    /// It is not running, does not exit in time, or exits non-zero.
    pub async fn terminate_pod(&mut self, grace: Duration, sidecar_outlives: bool) -> anyhow::Result<()> {
        if let Some(sidecar) = self.sidecar.as_mut() {
            if sidecar_outlives {
                // The sidecar's preStop hook: drain first, so the agents' sidecars stop sending
                // new streams down their pooled connections to this pod (docs/ha.md).
                sidecar.drain()?;
            } else {
                sidecar.process_mut().signal("TERM")?;
            }
        }
        self.terminate(grace).await?;
        if let Some(mut sidecar) = self.sidecar.take() {
            sidecar.process_mut().sigterm_and_wait_async(grace).await?;
        }
        Ok(())
    }

    /// SIGTERM the principal and wait up to `grace` for a clean exit (the sidecar stays).
    ///
    /// # Errors
    /// It is not running, does not exit in time, or exits non-zero.
    pub async fn terminate(&mut self, grace: Duration) -> anyhow::Result<()> {
        let p = self.process.as_mut().with_context(|| format!("replica {} is not running", self.name))?;
        let status = p.sigterm_and_wait_async(grace).await?;
        if !status.success() {
            bail!("replica {} exited with {status} on SIGTERM:\n{}", self.name, p.log_tail(30));
        }
        Ok(())
    }
}

/// How a replica reaches the hub API and as whom.
#[derive(Debug, Clone, Default)]
pub struct HubAccess {
    /// The hub API server's URL for this replica (e.g. a fault proxy's); `None`: the topology's.
    pub server: Option<String>,
    /// A bearer token to use instead of the topology's credentials.
    pub token: Option<String>,
}

/// Principal replicas of one topology's hub behind a [`LoadBalancer`].
#[derive(Debug)]
pub struct Replicas {
    /// In front of the replicas' frontends, in the order of [`Self::replica`].
    pub lb: LoadBalancer,
    replicas: Vec<Replica>,
    duration: Duration,
    dir: tempfile::TempDir,
}

/// A kubeconfig like `base` with the `hub` cluster's server and the `hub` user changed.
fn hub_kubeconfig(base: &Path, access: &HubAccess) -> anyhow::Result<String> {
    let mut kc: Value = serde_yaml::from_str(&std::fs::read_to_string(base)?)?;
    if let Some(server) = &access.server {
        let clusters = kc["clusters"].as_array_mut().context("kubeconfig without clusters")?;
        let hub = clusters.iter_mut().find(|c| c["name"] == "hub").context("no hub cluster")?;
        hub["cluster"]["server"] = json!(server);
    }
    if let Some(token) = &access.token {
        let users = kc["users"].as_array_mut().context("kubeconfig without users")?;
        let hub = users.iter_mut().find(|u| u["name"] == "hub").context("no hub user")?;
        hub["user"] = json!({"token": token});
    }
    Ok(serde_yaml::to_string(&kc)?)
}
/// Readies `t` for replicas that forward to each other: stops its lone principal, issues the
/// replicas' client certificate as an operator does (`argocd-agentctl pki issue replica`), and
/// sets the principal flags: `extra`, the resource proxy on loopback, and where and under which
/// name the replicas reach each other's (the test topology's proxy certificate carries
/// 127.0.0.1).
///
/// # Errors
/// The principal does not stop, or the certificate cannot be issued.
pub fn prepare_forwarding(t: &mut Topology, extra: &[&str]) -> anyhow::Result<()> {
    t.stop_principal(Duration::from_secs(30))?;
    t.ctl(&["pki", "issue", "replica", "--key-algorithm", "ecdsa-p256"])?;
    let mut args = extra.to_vec();
    args.extend([
        "--resource-proxy-listen-address",
        "127.0.0.1:0",
        "--replica-proxy-host",
        "127.0.0.1",
        "--replica-proxy-server-name",
        "127.0.0.1",
    ]);
    t.set_principal_args(&args);
    Ok(())
}

/// The hub API server's URL in a merged kubeconfig of the topology.
///
/// # Errors
/// The file has no `hub` cluster.
pub fn hub_server(kubeconfig: &Path) -> anyhow::Result<String> {
    let kc: Value = serde_yaml::from_str(&std::fs::read_to_string(kubeconfig)?)?;
    let clusters = kc["clusters"].as_array().context("kubeconfig without clusters")?;
    let hub = clusters.iter().find(|c| c["name"] == "hub").context("no hub cluster")?;
    hub["cluster"]["server"].as_str().map(str::to_owned).context("hub cluster without server")
}

impl Replicas {
    /// Start a replica per entry of `replicas` (its name and how it reaches the hub) with
    /// `--agent-lease-duration duration`, wait until each is ready (its own Lease renewed), and
    /// put the load balancer in front of them.
    ///
    /// # Errors
    /// A replica or sidecar does not start or become ready in time.
    pub async fn start(t: &Topology, replicas: &[(&str, HubAccess)], duration: Duration) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("replicas-").tempdir()?;
        let mut started = Vec::new();
        for (name, access) in replicas {
            let kubeconfig = if access.server.is_none() && access.token.is_none() {
                t.process_kubeconfig()
            } else {
                let path = dir.path().join(format!("{name}.kubeconfig"));
                std::fs::write(&path, hub_kubeconfig(&t.process_kubeconfig(), access)?)?;
                path
            };
            started.push(Self::spawn(t, name, &kubeconfig, duration)?);
        }
        for r in &mut started {
            let listen = wait_for_async(START, &format!("replica {} to listen", r.name), || {
                let running = r.process.as_mut().map(ChildProcess::ensure_running);
                let addr = listening_on(&r.stdout(), "principal listening on ");
                async move {
                    running.transpose()?;
                    Ok(addr)
                }
            })
            .await?;
            r.listen = listen;
            r.frontend = listen;
            if t.transport() != Transport::Mtls {
                let pki = t.pki_dir();
                let params = SidecarParams::new(
                    listen,
                    pki.join("principal.crt"),
                    pki.join("principal.key"),
                    pki.join("ca.crt"),
                );
                let sidecar = tokio::task::block_in_place(|| EnvoySidecar::start(SidecarKind::Principal, &params))?;
                r.frontend = sidecar.listen_addr();
                r.sidecar = Some(sidecar);
            }
        }
        for r in &mut started {
            wait_ready(r).await?;
        }
        let lb = LoadBalancer::start(&started.iter().map(Replica::frontend).collect::<Vec<_>>()).await?;
        Ok(Self { lb, replicas: started, duration, dir })
    }

    fn spawn(t: &Topology, name: &str, kubeconfig: &Path, duration: Duration) -> anyhow::Result<Replica> {
        let extra = [
            "--agent-leases".to_owned(),
            "--replica-name".to_owned(),
            name.to_owned(),
            "--agent-lease-duration".to_owned(),
            format!("{}ms", duration.as_millis()),
        ];
        let cmd = t.principal_command(0, kubeconfig, &extra)?;
        let process = ChildProcess::spawn(&format!("principal-{name}"), cmd)?;
        let unbound = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        Ok(Replica { name: name.to_owned(), process: Some(process), sidecar: None, listen: unbound, frontend: unbound })
    }

    /// `--agent-lease-duration`.
    #[must_use]
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// Replica `index`.
    ///
    /// # Panics
    /// No such replica (a test bug).
    #[must_use]
    pub fn replica(&self, index: usize) -> &Replica {
        &self.replicas[index]
    }

    /// Replica `index`, mutable.
    ///
    /// # Panics
    /// No such replica (a test bug).
    pub fn replica_mut(&mut self, index: usize) -> &mut Replica {
        &mut self.replicas[index]
    }

    /// The index of the replica named `name`.
    ///
    /// # Errors
    /// No such replica.
    pub fn index_of(&self, name: &str) -> anyhow::Result<usize> {
        self.replicas.iter().position(|r| r.name == name).with_context(|| format!("no replica {name}"))
    }

    /// Every replica.
    #[must_use]
    pub fn all(&self) -> &[Replica] {
        &self.replicas
    }

    /// Where the replicas' kubeconfigs are written.
    #[must_use]
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// The recent logs of every replica, for failure messages.
    #[must_use]
    pub fn logs(&self) -> String {
        let mut out = format!(
            "--- load balancer: picks {:?}, refused dials {}, unserved {}\n",
            self.lb.picks(),
            self.lb.refused(),
            self.lb.unserved()
        );
        for r in &self.replicas {
            if let Some(p) = &r.process {
                out.push_str(&format!("--- replica {}\n{}\n", r.name, p.log_tail(40)));
            }
        }
        out
    }
}

/// Wait until `r` answers `/readyz` 200 (hub listed, own Lease renewed).
async fn wait_ready(r: &mut Replica) -> anyhow::Result<()> {
    let mut poll = Poller::new(START, format!("replica {} to be ready", r.name));
    loop {
        if let Some(p) = r.process.as_mut() {
            p.ensure_running()?;
        }
        if r.readyz().await == Some(200) {
            return Ok(());
        }
        poll.tick().await.with_context(|| r.process.as_ref().map(|p| p.log_tail(20)).unwrap_or_default())?;
    }
}

// === Leases ===

/// Who holds `agent`'s owner Lease: `(holderIdentity, leaseTransitions)`; `None` when there is
/// no Lease yet.
///
/// # Errors
/// The hub cannot be read.
pub async fn owner(hub: &kube::Client, agent: &str) -> anyhow::Result<Option<(String, i32)>> {
    let api: Api<Lease> = Api::namespaced(hub.clone(), ARGOCD_NS);
    let name = principal::lease::agent_lease_name(agent);
    Ok(api
        .get_opt(&name)
        .await?
        .and_then(|l| l.spec)
        .map(|s| (s.holder_identity.unwrap_or_default(), s.lease_transitions.unwrap_or(0))))
}

/// Whether replica `replica`'s own Lease exists in the hub.
///
/// # Errors
/// The hub cannot be read.
pub async fn replica_lease_exists(hub: &kube::Client, replica: &str) -> anyhow::Result<bool> {
    let api: Api<Lease> = Api::namespaced(hub.clone(), ARGOCD_NS);
    Ok(api.get_opt(&principal::lease::replica_lease_name(replica)).await?.is_some())
}

/// Wait until `agent`'s Lease is held by a replica `accept` allows; its holder and transitions.
///
/// # Errors
/// It is not in time.
pub async fn wait_owner(
    hub: &kube::Client,
    agent: &str,
    timeout: Duration,
    what: &str,
    accept: impl Fn(&str, i32) -> bool,
) -> anyhow::Result<(String, i32)> {
    wait_for_async(timeout, what, || async {
        Ok(owner(hub, agent).await.ok().flatten().filter(|(h, n)| accept(h, *n)))
    })
    .await
}

// === A stream of changes ===

/// Which field of an Application a [`Churn`] target changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `spec.source.path` (`w-<n>`).
    Path,
    /// `status.sync.revision` (`s-<n>`), with a schema-valid status.
    Revision,
}

impl Field {
    fn read(self, obj: &Value) -> Option<String> {
        let v = match self {
            Self::Path => &obj["spec"]["source"]["path"],
            Self::Revision => &obj["status"]["sync"]["revision"],
        };
        v.as_str().map(str::to_owned)
    }

    fn patch(self, value: &str) -> Value {
        match self {
            Self::Path => json!({"spec": {"source": {"path": value}}}),
            Self::Revision => json!({"status": {"sync": {"status": "Synced", "revision": value},
                "health": {"status": "Healthy"}}}),
        }
    }
}

/// One Application field changed on its owner side (`write`) and expected on the other (`read`).
#[derive(Clone, Debug)]
pub struct Target {
    /// A label for messages (`m1/app-0 status`).
    pub label: String,
    /// Where it is written.
    pub write: Api<DynamicObject>,
    /// Where the change must arrive.
    pub read: Api<DynamicObject>,
    /// The Application's name on both sides.
    pub name: String,
    /// The field.
    pub field: Field,
}

/// One acknowledged write.
#[derive(Debug, Clone)]
pub struct Write {
    /// Index of the target.
    pub target: usize,
    /// The value written.
    pub value: String,
    /// When the write was sent (test clock).
    pub sent: Instant,
    /// When it was sent, wall clock (to compare with an audit log).
    pub sent_wall: chrono::DateTime<chrono::Utc>,
}

#[derive(Default)]
struct ChurnLog {
    writes: Vec<Write>,
    errors: Vec<String>,
}

/// Numbers of the values [`Churn`]s write: unique in the test process, so a value names one write.
static NEXT_VALUE: AtomicU64 = AtomicU64::new(0);

/// Changes one target after another, `every` apart, until stopped; every acknowledged write is
/// recorded.
pub struct Churn {
    targets: Vec<Target>,
    log: Arc<Mutex<ChurnLog>>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Churn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Churn")
            .field("targets", &self.targets.len())
            .field("writes", &self.count())
            .finish_non_exhaustive()
    }
}

impl Churn {
    /// Start changing `targets` round robin, one write every `every`.
    #[must_use]
    pub fn start(targets: Vec<Target>, every: Duration) -> Self {
        let log = Arc::new(Mutex::new(ChurnLog::default()));
        let (stop, mut stopped) = watch::channel(false);
        let task = {
            let (targets, log) = (targets.clone(), log.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                for index in (0..targets.len()).cycle() {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = stopped.wait_for(|s| *s) => return,
                    }
                    let t = &targets[index];
                    let n = NEXT_VALUE.fetch_add(1, Ordering::Relaxed) + 1;
                    let value = match t.field {
                        Field::Path => format!("w-{n}"),
                        Field::Revision => format!("s-{n}"),
                    };
                    let (sent, sent_wall) = (Instant::now(), chrono::Utc::now());
                    let r = t.write.patch(&t.name, &PatchParams::default(), &Patch::Merge(t.field.patch(&value))).await;
                    let mut log = lock(&log);
                    match r {
                        Ok(_) => log.writes.push(Write { target: index, value, sent, sent_wall }),
                        Err(e) => log.errors.push(format!("{} {value}: {e}", t.label)),
                    }
                }
            })
        };
        Self { targets, log, stop, task: Some(task) }
    }

    /// Writes acknowledged so far.
    #[must_use]
    pub fn writes(&self) -> Vec<Write> {
        lock(&self.log).writes.clone()
    }

    /// How many writes were acknowledged.
    #[must_use]
    pub fn count(&self) -> usize {
        lock(&self.log).writes.len()
    }

    /// Stop writing (after the write in progress).
    ///
    /// # Errors
    /// A write was refused (the owner sides' API servers stay up in these tests).
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            task.await?;
        }
        let errors = lock(&self.log).errors.clone();
        anyhow::ensure!(errors.is_empty(), "writes refused by their owner's API server: {errors:?}");
        Ok(())
    }

    /// The last acknowledged value of each target (`None`: never written).
    #[must_use]
    pub fn last_values(&self) -> Vec<Option<String>> {
        let log = lock(&self.log);
        (0..self.targets.len())
            .map(|i| log.writes.iter().rev().find(|w| w.target == i).map(|w| w.value.clone()))
            .collect()
    }

    /// Wait until every target shows its last acknowledged value on its other side.
    ///
    /// # Errors
    /// Some did not in time: the error lists each target's expected and seen values and
    /// `context()`.
    pub async fn converged(&self, timeout: Duration, context: impl FnOnce() -> String) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let expected = self.last_values();
        let mut poll = Poller::new(timeout, "every change to reach the other side");
        loop {
            let mut behind = Vec::new();
            for (t, want) in self.targets.iter().zip(&expected) {
                let Some(want) = want else { continue };
                let seen = match t.read.get_opt(&t.name).await {
                    Ok(Some(o)) => t.field.read(&serde_json::to_value(o)?),
                    Ok(None) => Some("<missing>".to_owned()),
                    Err(e) => Some(format!("<{e}>")),
                };
                if seen.as_deref() != Some(want.as_str()) {
                    behind.push(format!("{}: want {want}, see {seen:?}", t.label));
                }
            }
            if behind.is_empty() {
                return Ok(started.elapsed());
            }
            if poll.tick().await.is_err() {
                bail!("not converged after {timeout:?}:\n  {}\n{}", behind.join("\n  "), context());
            }
        }
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The time at the start of a log line (`2026-11-28T11:21:28.123456Z  INFO ...`).
#[must_use]
pub fn log_time(line: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let first = line.split_whitespace().next()?;
    chrono::DateTime::parse_from_rfc3339(first).ok().map(|t| t.with_timezone(&chrono::Utc))
}

/// The Lease duration of [`replicas_on`]'s replicas: short, so a takeover after a lapse fits a
/// test's time (renewals every 2 s).
pub const TEST_LEASE: Duration = Duration::from_secs(6);
/// Convergence and re-attach deadlines of the replica tests on two busy cores.
pub const TEST_CONVERGE: Duration = Duration::from_secs(60);

/// Flags of the topology's own (bootstrap) principal: it creates the principal's identity
/// ConfigMap as the first replica of a hub would, then stops; the replicas share it.
pub fn bootstrap_args() -> Vec<String> {
    ["--agent-leases", "--replica-name", "bootstrap", "--agent-lease-duration", "6s"].map(str::to_owned).to_vec()
}

/// A topology on `transport` whose principal is replaced by replicas `names` behind the load
/// balancer; no agent started yet. Replicas hold Leases of [`TEST_LEASE`].
///
/// # Errors
/// A process does not start.
pub async fn replicas_on(
    agents: &[(&str, Mode)],
    transport: Transport,
    mut options: StartOptions,
    names: &[&str],
) -> anyhow::Result<(Topology, Replicas)> {
    options.start_agents = false;
    options.principal_args = bootstrap_args();
    let mut t = Topology::start_with_transport(agents, transport, MeshOptions::default(), options).await?;
    t.stop_principal(Duration::from_secs(30))?;
    t.set_principal_args(&[]);
    let plain: Vec<(&str, HubAccess)> = names.iter().map(|n| (*n, HubAccess::default())).collect();
    let r = Replicas::start(&t, &plain, TEST_LEASE).await?;
    Ok((t, r))
}

/// Start `agents` through the load balancer with only replica `index` taking connections, and
/// wait until that replica owns and serves each; then every replica takes connections again.
///
/// # Errors
/// An agent is not served by that replica within [`TEST_CONVERGE`].
pub async fn attach_to(t: &mut Topology, r: &Replicas, agents: &[&str], index: usize) -> anyhow::Result<()> {
    r.lb.only(index);
    let name = r.replica(index).name().to_owned();
    for agent in agents {
        t.start_agent_via(agent, r.lb.addr()).await?;
    }
    for agent in agents {
        let what = format!("agent {agent} to be owned and served by replica {name}");
        let served = crate::wait_until_async(TEST_CONVERGE, &what, || async {
            r.replica(index).connects(agent) >= 1
                && owner(&t.hub(), agent).await.ok().flatten().is_some_and(|(h, _)| h == name)
        })
        .await;
        served.with_context(|| format!("{}\n{}", r.logs(), t.logs()))?;
    }
    r.lb.all_up();
    Ok(())
}
