//! A hub and its spokes as real processes: one API server per cluster (the embedded one, or a
//! real etcd + kube-apiserver with Argo CD's own CRDs, see [`Clusters`]), the PKI made with
//! `argocd-agentctl` (as upstream's secrets), a principal over mTLS and one agent per spoke,
//! each of which can be stopped, killed and started again.
//!
//! On a real API server the principal and the agents run as ServiceAccounts bound to the
//! least-privilege RBAC in `install/rbac/`, with tokens from the TokenRequest API, so a missing
//! permission fails the test; the test itself and `argocd-agentctl` act as cluster admin.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::apiserver::ApiServerProcess;
use crate::bin_path::{workspace_binary, workspace_root};
use crate::process::ChildProcess;
use crate::realkube::{ArgoCdRelease, RealCluster};
use crate::wait::wait_for;

/// Namespace of the principal on the hub and of Argo CD on the spokes.
pub const ARGOCD_NS: &str = "argocd";

/// How long process start-ups may take on a busy machine.
const START: Duration = Duration::from_secs(60);

/// An agent's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The hub owns the Applications.
    Managed,
    /// The spoke owns the Applications.
    Autonomous,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Managed => "managed",
            Self::Autonomous => "autonomous",
        }
    }
}

/// Which API server a cluster of the topology runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClusterKind {
    /// `argocd-agent apiserver` (fast, our own implementation).
    #[default]
    Embedded,
    /// etcd + kube-apiserver built from Kubernetes' Go modules, Argo CD's CRDs
    /// ([`StartOptions::argocd`]),
    /// processes bound to our least-privilege RBAC.
    Real,
}

/// Which API servers the hub and the spokes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Clusters {
    /// The hub's.
    pub hub: ClusterKind,
    /// Every spoke's.
    pub spokes: ClusterKind,
}

impl Clusters {
    /// Every cluster on a real kube-apiserver.
    pub const REAL: Self = Self { hub: ClusterKind::Real, spokes: ClusterKind::Real };
    /// A real hub with embedded spokes.
    pub const REAL_HUB: Self = Self { hub: ClusterKind::Real, spokes: ClusterKind::Embedded };
}

/// How [`Topology::start_with_options`] starts a topology.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// Which API servers run.
    pub clusters: Clusters,
    /// Start the agents (else start each with [`Topology::start_agent`]).
    pub start_agents: bool,
    /// Create each agent's namespace on the hub beforehand (as an operator would); without it
    /// the principal must create them (`--namespace-create-enable`).
    pub hub_agent_namespaces: bool,
    /// Extra flags for the principal from its first start.
    pub principal_args: Vec<String>,
    /// Extra flags for every agent from its first start.
    pub agent_args: Vec<String>,
    /// Serve the resource proxy: its server certificate is issued (for 127.0.0.1) before the
    /// principal starts, which listens for it on a free loopback port
    /// ([`Topology::resource_proxy_addr`]).
    pub resource_proxy: bool,
    /// `--auth` of the principal instead of the transport's default (with native mTLS:
    /// `mtls:subject:CN=([^,]+)`); agent certificates then also carry the SPIFFE URI SAN
    /// `spiffe://cluster.local/ns/argocd/sa/<agent>`, for `mtls:uri:` methods.
    pub auth: Option<String>,
    /// Start the spokes' embedded API servers with the simulated node
    /// (`argocd-agent apiserver --simulate-pods`): Pods' commands run as local processes, so
    /// `kubectl logs` and `kubectl exec` work against them.
    pub simulate_pods: bool,
    /// Extra flags for the hub's kube-apiserver when it is a real one (e.g. an audit policy).
    pub hub_apiserver_args: Vec<String>,
    /// Run the principal with this open-file limit (`RLIMIT_NOFILE`, soft and hard, set by
    /// util-linux's `prlimit`): for tests of what it does when descriptors run short.
    pub principal_open_files: Option<u64>,
    /// Whose CRDs a real kube-apiserver serves (an embedded one has its own).
    pub argocd: ArgoCdRelease,
}

impl Default for StartOptions {
    fn default() -> Self {
        Self {
            clusters: Clusters::default(),
            start_agents: true,
            hub_agent_namespaces: true,
            principal_args: Vec::new(),
            agent_args: Vec::new(),
            resource_proxy: false,
            auth: None,
            simulate_pods: false,
            hub_apiserver_args: Vec::new(),
            principal_open_files: None,
            argocd: ArgoCdRelease::default(),
        }
    }
}

/// Set to a directory holding other RBAC files than `install/rbac/` (to check by hand that
/// removing a rule fails a test, without touching the shipped files).
pub const RBAC_DIR_ENV: &str = "TESTS_RBAC_DIR";

fn rbac_dir() -> PathBuf {
    std::env::var_os(RBAC_DIR_ENV).map_or_else(|| workspace_root().join("install").join("rbac"), PathBuf::from)
}

/// ServiceAccount tokens minted for the processes outlive any test.
const PROCESS_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);

/// One cluster: an embedded API server, or a real control plane (with the kubeconfig of the
/// ServiceAccount the principal or agent runs as).
enum Cluster {
    Embedded(Box<ApiServerProcess>),
    Real { cluster: Box<RealCluster>, process_kubeconfig: PathBuf },
}

impl Cluster {
    /// Start one. `role` is `principal` or `agent`: which RBAC from `install/rbac/` the
    /// process gets on a real server.
    /// `extra_rbac` names more files of `install/rbac/` (optional features).
    /// `simulate_pods`: an embedded server runs with `--simulate-pods` (on its own data dir).
    async fn start(
        kind: ClusterKind,
        data_dir: PathBuf,
        role: &str,
        extra_rbac: &[&str],
        simulate_pods: bool,
        argocd: ArgoCdRelease,
    ) -> anyhow::Result<Self> {
        Self::start_with_args(kind, data_dir, role, extra_rbac, simulate_pods, argocd, &[]).await
    }

    /// [`Self::start`]; a real kube-apiserver also gets `apiserver_args`.
    async fn start_with_args(
        kind: ClusterKind,
        data_dir: PathBuf,
        role: &str,
        extra_rbac: &[&str],
        simulate_pods: bool,
        argocd: ArgoCdRelease,
        apiserver_args: &[String],
    ) -> anyhow::Result<Self> {
        match kind {
            ClusterKind::Embedded if simulate_pods => {
                Ok(Self::Embedded(Box::new(ApiServerProcess::start_simulating_pods().await?)))
            }
            ClusterKind::Embedded => Ok(Self::Embedded(Box::new(ApiServerProcess::start_on(data_dir).await?))),
            ClusterKind::Real => {
                let options = crate::realkube::RealClusterOptions { apiserver_args: apiserver_args.to_vec() };
                let cluster = RealCluster::start_with(options).await?;
                cluster.install_argocd_crds_of(argocd).await?;
                cluster.ensure_namespace(ARGOCD_NS).await?;
                let rbac = rbac_dir();
                cluster.apply_file(&rbac.join(format!("{role}.yaml")))?;
                for file in extra_rbac {
                    cluster.apply_file(&rbac.join(file))?;
                }
                let out = cluster.work_dir().join(format!("{role}.kubeconfig"));
                let sa = format!("argocd-agent-{role}");
                let process_kubeconfig =
                    cluster.service_account_kubeconfig(ARGOCD_NS, &sa, PROCESS_TOKEN_TTL, &out).await?;
                Ok(Self::Real { cluster: Box::new(cluster), process_kubeconfig })
            }
        }
    }

    fn client(&self) -> kube::Client {
        match self {
            Self::Embedded(s) => s.client(),
            Self::Real { cluster, .. } => cluster.client(),
        }
    }

    /// The admin kubeconfig (tests, argocd-agentctl).
    fn kubeconfig_path(&self) -> &Path {
        match self {
            Self::Embedded(s) => s.kubeconfig_path(),
            Self::Real { cluster, .. } => cluster.kubeconfig_path(),
        }
    }

    /// The kubeconfig the principal or agent runs with.
    fn process_kubeconfig_path(&self) -> &Path {
        match self {
            Self::Embedded(s) => s.kubeconfig_path(),
            Self::Real { process_kubeconfig, .. } => process_kubeconfig,
        }
    }
}

struct AgentSlot {
    mode: Mode,
    spoke: Cluster,
    process: Option<ChildProcess>,
    /// Mesh transport: the agent's sidecar, which the agent dials in plaintext.
    sidecar: Option<crate::envoy::EnvoySidecar>,
    /// Where the agent dials instead of the principal (see [`Topology::start_agent_via`]).
    server: Option<std::net::SocketAddr>,
}

/// Knobs of the mesh transport.
#[derive(Debug, Clone, Copy)]
pub struct MeshOptions {
    /// The sidecars' stream idle timeout (`None`: the production default).
    pub stream_idle_timeout: Option<Duration>,
    /// The agents' `--heartbeat-interval` (`None`: the agent's own default behind a mesh).
    pub heartbeat: Option<Duration>,
}

impl Default for MeshOptions {
    fn default() -> Self {
        Self { stream_idle_timeout: None, heartbeat: Some(Duration::from_secs(30)) }
    }
}

/// How agents reach the principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Native mTLS (`--auth mtls:subject:...`).
    Mtls,
    /// Envoy sidecars terminate mTLS; the principal listens in plaintext on loopback and
    /// identifies agents from `x-forwarded-client-cert` (`--auth xfcc:`).
    Mesh,
    /// Envoy in front of the principal only: agents outside the mesh do mTLS with their own
    /// certificates straight to the principal's sidecar (`--creds header:` over TLS).
    PrincipalSidecarOnly,
}

impl Transport {
    /// Whether the principal listens in plaintext behind its Envoy sidecar.
    fn principal_sidecar(self) -> bool {
        matches!(self, Self::Mesh | Self::PrincipalSidecarOnly)
    }
}

/// The running topology. Dropping it stops every process.
pub struct Topology {
    transport: Transport,
    mesh_options: MeshOptions,
    principal_sidecar: Option<crate::envoy::EnvoySidecar>,
    dir: tempfile::TempDir,
    hub: Cluster,
    agents: BTreeMap<String, AgentSlot>,
    principal: Option<ChildProcess>,
    principal_port: Option<u16>,
    /// Extra flags for the next principal start ([`Self::set_principal_args`]).
    principal_args: Vec<String>,
    /// The principal's `--auth`, when not the transport's default.
    auth: Option<String>,
    /// Extra flags for the next agent starts ([`Self::set_agent_args`]).
    agent_args: Vec<String>,
    /// [`StartOptions::principal_open_files`].
    principal_open_files: Option<u64>,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("dir", &self.dir.path())
            .field("agents", &self.agents.keys())
            .finish_non_exhaustive()
    }
}

/// The address on the last stdout line starting with `prefix`.
fn listening_on(stdout: &str, prefix: &str) -> Option<std::net::SocketAddr> {
    stdout.lines().filter_map(|l| l.strip_prefix(prefix)).next_back().and_then(|a| a.trim().parse().ok())
}

/// One kubeconfig with a context per `(name, kubeconfig)`, each in namespace `argocd`; `hub` is
/// the current context.
pub(crate) fn merged_kubeconfig(parts: &[(impl AsRef<str>, &Path)]) -> anyhow::Result<String> {
    let (mut clusters, mut users, mut contexts) = (vec![], vec![], vec![]);
    for (name, path) in parts {
        let name = name.as_ref();
        let kc: Value = serde_yaml::from_str(&std::fs::read_to_string(path)?)?;
        clusters.push(json!({"name": name, "cluster": kc["clusters"][0]["cluster"]}));
        users.push(json!({"name": name, "user": kc["users"][0]["user"]}));
        contexts.push(json!({"name": name, "context": {"cluster": name, "user": name, "namespace": ARGOCD_NS}}));
    }
    Ok(serde_yaml::to_string(&json!({
        "apiVersion": "v1", "kind": "Config", "clusters": clusters, "users": users, "contexts": contexts, "current-context": "hub",
    }))?)
}

/// Creates namespace `name` unless it exists.
///
/// # Errors
///
/// The API call fails.
pub async fn ensure_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    use kube::api::{Api, PostParams};
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    if api.get_opt(name).await?.is_none() {
        api.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}}))?).await?;
    }
    Ok(())
}

impl Topology {
    /// Start the hub, one spoke per agent, the PKI, the principal and every agent, and wait
    /// until every agent is connected.
    ///
    /// # Errors
    /// Any part fails to start.
    pub async fn start(agents: &[(&str, Mode)]) -> anyhow::Result<Self> {
        Self::start_with(agents, Transport::Mtls, MeshOptions::default()).await
    }

    /// Like [`Self::start`] (mTLS) but without starting the agents: start each with
    /// [`Self::start_agent`] or [`Self::start_agent_via`] (e.g. behind a fault proxy).
    ///
    /// # Errors
    /// Any part fails to start.
    pub async fn start_without_agents(agents: &[(&str, Mode)]) -> anyhow::Result<Self> {
        let options = StartOptions { start_agents: false, ..StartOptions::default() };
        Self::start_parts(agents, Transport::Mtls, MeshOptions::default(), options).await
    }

    /// The same behind Envoy sidecars (see [`Transport::Mesh`]).
    ///
    /// # Errors
    /// Any part fails to start.
    pub async fn start_mesh(agents: &[(&str, Mode)]) -> anyhow::Result<Self> {
        Self::start_with(agents, Transport::Mesh, MeshOptions::default()).await
    }

    /// Mesh transport with explicit sidecar and heartbeat settings.
    ///
    /// # Errors
    /// Any part fails to start.
    pub async fn start_mesh_with(agents: &[(&str, Mode)], options: MeshOptions) -> anyhow::Result<Self> {
        Self::start_with(agents, Transport::Mesh, options).await
    }

    /// Envoy in front of the principal only (see [`Transport::PrincipalSidecarOnly`]).
    ///
    /// # Errors
    /// Any part fails to start.
    pub async fn start_principal_sidecar_only(agents: &[(&str, Mode)]) -> anyhow::Result<Self> {
        Self::start_with(agents, Transport::PrincipalSidecarOnly, MeshOptions::default()).await
    }

    /// mTLS on the given API servers (e.g. [`Clusters::REAL`]); agents started when
    /// `start_agents`.
    ///
    /// # Errors
    /// Any part fails to start.
    pub async fn start_on(agents: &[(&str, Mode)], clusters: Clusters, start_agents: bool) -> anyhow::Result<Self> {
        Self::start_with_options(agents, StartOptions { clusters, start_agents, ..StartOptions::default() }).await
    }

    /// mTLS with every knob of [`StartOptions`].
    ///
    /// # Errors
    /// Any part fails to start.
    pub async fn start_with_options(agents: &[(&str, Mode)], options: StartOptions) -> anyhow::Result<Self> {
        Self::start_parts(agents, Transport::Mtls, MeshOptions::default(), options).await
    }

    /// Any transport with every knob of [`StartOptions`] (e.g. a mesh without starting the
    /// agents).
    ///
    /// # Errors
    /// Any part fails to start.
    pub async fn start_with_transport(
        agents: &[(&str, Mode)],
        transport: Transport,
        mesh_options: MeshOptions,
        options: StartOptions,
    ) -> anyhow::Result<Self> {
        Self::start_parts(agents, transport, mesh_options, options).await
    }

    async fn start_with(
        agents: &[(&str, Mode)],
        transport: Transport,
        mesh_options: MeshOptions,
    ) -> anyhow::Result<Self> {
        Self::start_parts(agents, transport, mesh_options, StartOptions::default()).await
    }

    async fn start_parts(
        agents: &[(&str, Mode)],
        transport: Transport,
        mesh_options: MeshOptions,
        options: StartOptions,
    ) -> anyhow::Result<Self> {
        let clusters = options.clusters;
        let dir = tempfile::Builder::new().prefix("topology-").tempdir()?;
        // RBAC for the principal's optional features, as an operator would grant it.
        let mut hub_rbac = Vec::new();
        if options.principal_args.iter().any(|a| a == "--namespace-create-enable") {
            hub_rbac.push("principal-namespace-create.yaml");
        }
        if options.principal_args.iter().any(|a| a == "--enable-self-cluster-registration") {
            hub_rbac.push("principal-self-registration.yaml");
        }
        let hub = Cluster::start_with_args(
            clusters.hub,
            dir.path().join("hub"),
            "principal",
            &hub_rbac,
            false,
            options.argocd,
            &options.hub_apiserver_args,
        )
        .await?;
        let mut spoke_rbac = Vec::new();
        if options.agent_args.iter().any(|a| a == "--destination-based-mapping") {
            spoke_rbac.push("agent-destination-mapping.yaml");
        }
        if options.resource_proxy {
            spoke_rbac.push("agent-resource-proxy.yaml");
        }
        let mut slots = BTreeMap::new();
        for (name, mode) in agents {
            let spoke_dir = dir.path().join(format!("spoke-{name}"));
            let spoke =
                Cluster::start(clusters.spokes, spoke_dir, "agent", &spoke_rbac, options.simulate_pods, options.argocd)
                    .await?;
            slots.insert(
                (*name).to_string(),
                AgentSlot { mode: *mode, spoke, process: None, sidecar: None, server: None },
            );
        }
        let mut parts = vec![("hub".to_string(), hub.kubeconfig_path())];
        parts.extend(slots.iter().map(|(n, s)| (n.clone(), s.spoke.kubeconfig_path())));
        std::fs::write(dir.path().join("kubeconfig"), merged_kubeconfig(&parts)?)?;
        let mut parts = vec![("hub".to_string(), hub.process_kubeconfig_path())];
        parts.extend(slots.iter().map(|(n, s)| (n.clone(), s.spoke.process_kubeconfig_path())));
        std::fs::write(dir.path().join("process-kubeconfig"), merged_kubeconfig(&parts)?)?;
        let mut t = Self {
            transport,
            mesh_options,
            principal_sidecar: None,
            dir,
            hub,
            agents: slots,
            principal: None,
            principal_port: None,
            principal_args: options.principal_args.clone(),
            auth: options.auth.clone(),
            agent_args: options.agent_args.clone(),
            principal_open_files: options.principal_open_files,
        };

        ensure_namespace(&t.hub.client(), ARGOCD_NS).await?;
        for (name, slot) in &t.agents {
            if options.hub_agent_namespaces {
                ensure_namespace(&t.hub.client(), name).await?;
            }
            ensure_namespace(&slot.spoke.client(), ARGOCD_NS).await?;
        }
        t.ctl(&["pki", "init", "--key-algorithm", "ecdsa-p256"])?;
        t.issue_principal_certificate(false)?;
        t.ctl(&["jwt", "create-key"])?;
        if options.resource_proxy {
            t.ctl(&["pki", "issue", "resource-proxy", "--ip", "127.0.0.1", "--key-algorithm", "ecdsa-p256"])?;
            t.principal_args.extend(["--resource-proxy-listen-address".to_owned(), "127.0.0.1:0".to_owned()]);
        }
        let names: Vec<String> = t.agents.keys().cloned().collect();
        for name in &names {
            let pki = t.pki_dir().display().to_string();
            let mut args =
                vec!["--agent-context", name, "pki", "issue", "agent", name, "--key-algorithm", "ecdsa-p256"];
            args.extend(["--out-dir", &pki]);
            if transport.principal_sidecar() || t.auth.is_some() {
                // The agent's SVID: spiffe://cluster.local/ns/argocd/sa/<name>.
                args.extend(["--spiffe-trust-domain", "cluster.local"]);
            }
            t.ctl(&args)?;
            t.ctl(&["--agent-context", name, "pki", "propagate"])?;
        }
        t.start_principal().await?;
        if options.start_agents {
            for name in &names {
                t.start_agent(name).await?;
            }
        }
        Ok(t)
    }

    /// The merged kubeconfig (contexts `hub` and one per agent name), as cluster admin.
    #[must_use]
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The merged kubeconfig the principal and agents run with: on a real API server, the
    /// tokens of their ServiceAccounts (least-privilege RBAC); on the embedded one, as
    /// [`Self::kubeconfig`].
    #[must_use]
    pub fn process_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("process-kubeconfig")
    }

    /// Runs `argocd-agentctl` as cluster admin with the principal context `hub` (`--agent-context
    /// <name>` picks an agent's cluster), as an operator would.
    ///
    /// # Errors
    /// It fails; the error holds its stderr.
    pub fn ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = Command::new(workspace_binary("argocd-agentctl")?)
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["--principal-context", "hub"])
            .args(args)
            .output()
            .context("cannot run argocd-agentctl")?;
        if !out.status.success() {
            bail!("argocd-agentctl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// The hub's kube client.
    #[must_use]
    pub fn hub(&self) -> kube::Client {
        self.hub.client()
    }

    /// An agent's spoke kube client.
    ///
    /// # Errors
    /// No such agent.
    pub fn spoke(&self, agent: &str) -> anyhow::Result<kube::Client> {
        Ok(self.agents.get(agent).with_context(|| format!("no agent {agent}"))?.spoke.client())
    }

    /// Start (or restart) the principal; after the first start it keeps its port, so agents
    /// reconnect to the same address.
    ///
    /// # Errors
    /// It does not report listening in time.
    pub async fn start_principal(&mut self) -> anyhow::Result<()> {
        let cmd = self.principal_command(self.principal_port.unwrap_or(0), &self.process_kubeconfig(), &[])?;
        let mut child = ChildProcess::spawn("principal", cmd)?;
        let addr = wait_for(START, "the principal to listen", || {
            child.ensure_running()?;
            Ok(child
                .stdout()
                .lines()
                .find_map(|l| l.strip_prefix("principal listening on ").map(|a| a.trim().to_string())))
        })?;
        let port: u16 = addr.rsplit(':').next().and_then(|p| p.parse().ok()).context("principal address")?;
        self.principal_port = Some(port);
        self.principal = Some(child);
        if self.transport.principal_sidecar() && self.principal_sidecar.is_none() {
            let pki = self.pki_dir();
            let params = crate::envoy::SidecarParams::new(
                std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                pki.join("principal.crt"),
                pki.join("principal.key"),
                pki.join("ca.crt"),
            );
            let params = match self.mesh_options.stream_idle_timeout {
                Some(t) => params.with_stream_idle_timeout(t),
                None => params,
            };
            let sidecar = tokio::task::block_in_place(|| {
                crate::envoy::EnvoySidecar::start(crate::envoy::SidecarKind::Principal, &params)
            })?;
            self.principal_sidecar = Some(sidecar);
        }
        Ok(())
    }

    /// The command line [`Self::start_principal`] runs, listening on `listen_port` (0: a free
    /// port) with `kubeconfig` (context `hub`), the topology's extra principal flags and then
    /// `extra`: for more principals on the same hub (replicas, [`crate::replicas`]).
    ///
    /// # Errors
    /// The binary is missing.
    pub fn principal_command(&self, listen_port: u16, kubeconfig: &Path, extra: &[String]) -> anyhow::Result<Command> {
        let mut cmd = match self.principal_open_files {
            None => Command::new(workspace_binary("argocd-agent")?),
            Some(n) => {
                // prlimit sets the limit on itself and execs the principal (same process id).
                let mut cmd = Command::new("prlimit");
                cmd.arg(format!("--nofile={n}:{n}")).arg(workspace_binary("argocd-agent")?);
                cmd
            }
        };
        let auth = match (&self.auth, self.transport) {
            (Some(auth), _) => auth.as_str(),
            (None, Transport::Mtls) => "mtls:subject:CN=([^,]+)",
            (None, Transport::Mesh | Transport::PrincipalSidecarOnly) => "xfcc:",
        };
        cmd.args(["principal", "--allowed-namespaces", "*", "--namespace", ARGOCD_NS, "--auth", auth])
            .args(["--listen-host", "127.0.0.1"]);
        if self.transport.principal_sidecar() {
            cmd.arg("--insecure-plaintext");
        }
        cmd.args(["--listen-port", &listen_port.to_string(), "--kubecontext", "hub", "--log-level", "debug"])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("NO_COLOR", "1")
            .args(["--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"])
            .args(&self.principal_args)
            .args(extra);
        Ok(cmd)
    }

    /// How agents reach the principal.
    #[must_use]
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// A client certificate issued by the hub's CA (`argocd-agent-ca`), as `argocd-agentctl` would
    /// but with any CN and URI SANs: `(cert PEM, key PEM, CA PEM)`.
    ///
    /// # Errors
    /// The CA cannot be read or used.
    pub async fn issue_client_cert(&self, cn: &str, uris: &[&str]) -> anyhow::Result<(String, String, String)> {
        let ca = self.hub_ca().await?;
        let issued = ca.client(cn, uris)?;
        Ok((issued.cert, issued.key, ca.pem))
    }

    /// The CA `argocd-agentctl pki init` stored in the hub's `argocd-agent-ca` Secret
    /// (`tls.crt`, `tls.key`).
    ///
    /// # Errors
    /// The Secret cannot be read or holds no usable CA.
    pub async fn hub_ca(&self) -> anyhow::Result<crate::pki::Ca> {
        let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::namespaced(self.hub(), ARGOCD_NS);
        let ca = secrets.get("argocd-agent-ca").await?.data.context("CA secret without data")?;
        let text = |k: &str| -> anyhow::Result<String> {
            Ok(String::from_utf8(ca.get(k).with_context(|| format!("argocd-agent-ca has no {k}"))?.0.clone())?)
        };
        crate::pki::Ca::from_pem(&text("tls.crt")?, &text("tls.key")?)
    }

    /// Where the principal's resource proxy listens, if it serves one (from its startup line).
    #[must_use]
    pub fn resource_proxy_addr(&self) -> Option<std::net::SocketAddr> {
        let child = self.principal.as_ref()?;
        let stdout = child.stdout();
        stdout.lines().filter_map(|l| l.strip_prefix("resource proxy listening on ")).next_back()?.trim().parse().ok()
    }

    /// Where agents reach the principal: its listener with mTLS, the principal's sidecar behind
    /// a mesh. `None` before the principal has first started.
    #[must_use]
    pub fn principal_addr(&self) -> Option<std::net::SocketAddr> {
        match self.transport {
            Transport::Mtls => self.principal_port.map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p))),
            Transport::Mesh | Transport::PrincipalSidecarOnly => {
                self.principal_sidecar.as_ref().map(crate::envoy::EnvoySidecar::listen_addr)
            }
        }
    }

    /// Start (or restart) an agent that dials `addr` (on 127.0.0.1, e.g. a
    /// [`crate::faultproxy::FaultProxy`] in front of [`Self::principal_addr`]) instead of the
    /// principal; later [`Self::start_agent`] restarts keep dialling `addr`. Behind a mesh,
    /// `addr` is where the agent's sidecar goes (the sidecar is restarted).
    ///
    /// # Errors
    /// As [`Self::start_agent`].
    pub async fn start_agent_via(&mut self, name: &str, addr: std::net::SocketAddr) -> anyhow::Result<()> {
        if addr.ip() != std::net::Ipv4Addr::LOCALHOST {
            bail!("agents dial 127.0.0.1 only, not {addr}");
        }
        let slot = self.agents.get_mut(name).with_context(|| format!("no agent {name}"))?;
        slot.server = Some(addr);
        slot.sidecar = None;
        self.start_agent(name).await
    }

    /// Issues the principal's certificate (127.0.0.1, localhost) with `argocd-agentctl pki
    /// issue principal`, into its Secret and [`Self::pki_dir`]; `upsert` reissues it.
    ///
    /// # Errors
    /// `argocd-agentctl` fails.
    pub fn issue_principal_certificate(&self, upsert: bool) -> anyhow::Result<()> {
        let out_dir = self.pki_dir().display().to_string();
        let mut args = vec!["pki", "issue", "principal", "--ip", "127.0.0.1", "--dns", "localhost"];
        args.extend(["--key-algorithm", "ecdsa-p256", "--out-dir", &out_dir]);
        if upsert {
            args.push("--upsert");
        }
        self.ctl(&args)
    }

    /// Where `argocd-agentctl pki ... --out-dir` wrote the CA and every certificate and key
    /// (`ca.crt`, `principal.crt`, `<agent>.crt`, `<agent>.key`).
    #[must_use]
    pub fn pki_dir(&self) -> PathBuf {
        self.dir.path().join("pki")
    }

    /// SIGKILL the principal.
    ///
    /// # Errors
    /// It is not running.
    pub fn kill_principal(&mut self) -> anyhow::Result<()> {
        let mut p = self.principal.take().context("the principal is not running")?;
        p.sigkill()?;
        Ok(())
    }

    /// SIGTERM the principal and require a clean exit within `grace`.
    ///
    /// # Errors
    /// It is not running, does not exit in time, or exits non-zero.
    pub fn stop_principal(&mut self, grace: Duration) -> anyhow::Result<()> {
        let mut p = self.principal.take().context("the principal is not running")?;
        let status = p.sigterm_and_wait(grace)?;
        if !status.success() {
            bail!("the principal exited with {status} on SIGTERM:\n{}", p.log_tail(30));
        }
        Ok(())
    }

    /// Start (or restart) an agent and wait until the principal has it connected.
    ///
    /// # Errors
    /// No such agent, or it does not connect in time.
    pub async fn start_agent(&mut self, name: &str) -> anyhow::Result<()> {
        let mut port = self.principal_port.context("start the principal first")?.to_string();
        let kubeconfig = self.process_kubeconfig();
        let pki = self.pki_dir();
        let principal_sidecar = self.principal_sidecar.as_ref().map(crate::envoy::EnvoySidecar::listen_addr);
        let transport = self.transport;
        let mesh_options = self.mesh_options;
        let slot = self.agents.get_mut(name).with_context(|| format!("no agent {name}"))?;
        if transport == Transport::Mesh {
            if slot.sidecar.is_none() {
                let upstream = match slot.server {
                    Some(addr) => addr,
                    None => principal_sidecar.context("the principal sidecar is not running")?,
                };
                let params = crate::envoy::SidecarParams::new(
                    upstream,
                    pki.join(format!("{name}.crt")),
                    pki.join(format!("{name}.key")),
                    pki.join("ca.crt"),
                );
                let params = match mesh_options.stream_idle_timeout {
                    Some(t) => params.with_stream_idle_timeout(t),
                    None => params,
                };
                let sidecar = tokio::task::block_in_place(|| {
                    crate::envoy::EnvoySidecar::start(crate::envoy::SidecarKind::Agent, &params)
                })?;
                slot.sidecar = Some(sidecar);
            }
            let sidecar = slot.sidecar.as_ref().context("agent sidecar")?;
            port = sidecar.listen_addr().port().to_string();
        } else if transport == Transport::PrincipalSidecarOnly {
            let target = match slot.server {
                Some(addr) => addr,
                None => principal_sidecar.context("the principal sidecar is not running")?,
            };
            port = target.port().to_string();
        } else if let Some(addr) = slot.server {
            port = addr.port().to_string();
        }
        let mut cmd = Command::new(workspace_binary("argocd-agent")?);
        cmd.args([
            "agent",
            "--agent-mode",
            slot.mode.as_str(),
            "--server-address",
            "127.0.0.1",
            "--server-port",
            &port,
        ])
        .args(["--kubecontext", name, "--log-level", "debug"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"])
        .env("NO_COLOR", "1");
        // The agent's namespace, unless its extra flags name another.
        if !self.agent_args.iter().any(|a| a == "--namespace") {
            cmd.args(["--namespace", ARGOCD_NS]);
        }
        if transport == Transport::Mesh {
            // Plaintext to its own sidecar, identity from the SVID the sidecar presents.
            let heartbeat = mesh_options.heartbeat.map_or_else(|| "0".to_string(), |d| format!("{}ms", d.as_millis()));
            cmd.args([
                "--insecure-plaintext",
                "--creds",
                "header:",
                "--agent-name",
                name,
                "--heartbeat-interval",
                &heartbeat,
            ]);
        } else if transport == Transport::PrincipalSidecarOnly {
            // mTLS with its own certificate (from the spoke's secrets) to the principal's sidecar,
            // which forwards the identity; heartbeats from the mesh profile.
            cmd.args(["--creds", "header:", "--mesh-profile", "envoy"]);
        }
        cmd.args(&self.agent_args);
        let child = ChildProcess::spawn(&format!("agent-{name}"), cmd)?;
        slot.process = Some(child);
        Ok(())
    }

    /// Extra flags for the principal from its next start on (e.g. after [`Self::stop_principal`]).
    pub fn set_principal_args(&mut self, args: &[&str]) {
        self.principal_args = args.iter().map(|a| (*a).to_string()).collect();
    }

    /// Extra flags for every agent from its next start on (e.g. with [`Self::start_without_agents`]).
    pub fn set_agent_args(&mut self, args: &[&str]) {
        self.agent_args = args.iter().map(|a| (*a).to_string()).collect();
    }

    /// The running principal's process id.
    #[must_use]
    pub fn principal_pid(&self) -> Option<u32> {
        self.principal.as_ref().map(ChildProcess::pid)
    }

    /// Agent `name`'s process id (`None`: no such agent, or not running).
    #[must_use]
    pub fn agent_pid(&self, name: &str) -> Option<u32> {
        self.agents.get(name)?.process.as_ref().map(ChildProcess::pid)
    }

    /// Where the running principal serves `/metrics` (`None`: not running or not yet bound).
    #[must_use]
    pub fn principal_metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.principal.as_ref().and_then(|p| listening_on(&p.stdout(), "principal metrics listening on "))
    }

    /// Where the running principal serves `/healthz` and `/readyz`.
    #[must_use]
    pub fn principal_healthz_addr(&self) -> Option<std::net::SocketAddr> {
        self.principal.as_ref().and_then(|p| listening_on(&p.stdout(), "principal healthz listening on "))
    }

    /// Where agent `name` serves `/metrics` (`None`: no such agent, not running or not yet bound).
    #[must_use]
    pub fn agent_metrics_addr(&self, name: &str) -> Option<std::net::SocketAddr> {
        let p = self.agents.get(name)?.process.as_ref()?;
        listening_on(&p.stdout(), "agent metrics listening on ")
    }

    /// Where agent `name` serves `/healthz` and `/readyz`.
    #[must_use]
    pub fn agent_healthz_addr(&self, name: &str) -> Option<std::net::SocketAddr> {
        let p = self.agents.get(name)?.process.as_ref()?;
        listening_on(&p.stdout(), "agent healthz listening on ")
    }

    /// SIGKILL an agent.
    ///
    /// # Errors
    /// No such agent or it is not running.
    pub fn kill_agent(&mut self, name: &str) -> anyhow::Result<()> {
        let slot = self.agents.get_mut(name).with_context(|| format!("no agent {name}"))?;
        let mut p = slot.process.take().with_context(|| format!("agent {name} is not running"))?;
        p.sigkill()?;
        Ok(())
    }
    /// Where the principal serves the Redis proxy, from its log (`None`: not said yet).
    #[must_use]
    pub fn redis_proxy_addr(&self) -> Option<std::net::SocketAddr> {
        redis_proxy_listening(&self.principal_log_lines(REDIS_PROXY_LISTENING))
    }

    /// The running principal's log lines (stderr) containing `needle`.
    #[must_use]
    pub fn principal_log_lines(&self, needle: &str) -> Vec<String> {
        self.principal
            .as_ref()
            .map(|p| p.stderr().lines().filter(|l| l.contains(needle)).map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// Agent `name`'s log lines (stderr) containing `needle`, while it runs.
    #[must_use]
    pub fn agent_log_lines(&self, name: &str, needle: &str) -> Vec<String> {
        self.agents
            .get(name)
            .and_then(|s| s.process.as_ref())
            .map(|p| p.stderr().lines().filter(|l| l.contains(needle)).map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// Whether the running principal's or any running agent's whole output (stdout and stderr)
    /// contains `needle`.
    #[must_use]
    pub fn any_log_contains(&self, needle: &str) -> bool {
        let shows = |p: &ChildProcess| p.stderr().contains(needle) || p.stdout().contains(needle);
        self.principal.as_ref().is_some_and(shows) || self.agents.values().filter_map(|s| s.process.as_ref()).any(shows)
    }

    /// How many times the principal has logged `agent connected` for `agent`.
    #[must_use]
    pub fn principal_connects(&self, agent: &str) -> usize {
        let needle = format!("agent connected agent={agent} ");
        self.principal.as_ref().map_or(0, |p| p.stderr().lines().filter(|l| l.contains(&needle)).count())
    }

    /// SIGKILL the hub's API server (a crash: no shutdown; on a real control plane etcd keeps
    /// running). The principal loses its API until [`Self::restart_hub`].
    ///
    /// # Errors
    /// Killing failed.
    pub fn kill_hub(&mut self) -> anyhow::Result<()> {
        match &mut self.hub {
            Cluster::Embedded(hub) => {
                hub.sigkill()?;
            }
            Cluster::Real { cluster, .. } => cluster.kill_apiserver()?,
        }
        Ok(())
    }

    /// Start the hub's API server again after [`Self::kill_hub`], on the same data (the data dir,
    /// or etcd) and the same port, and wait until it is ready. The credentials stay valid, so
    /// the principal's kubeconfig and every client from [`Self::hub`] keep working.
    ///
    /// # Errors
    /// It still runs, or the new process is not ready in time (e.g. the port was taken).
    pub async fn restart_hub(&mut self) -> anyhow::Result<()> {
        let hub = match &mut self.hub {
            Cluster::Real { cluster, .. } => return cluster.restart_apiserver().await,
            Cluster::Embedded(hub) => hub,
        };
        if hub.process_mut().is_running() {
            bail!("the hub's API server still runs; kill it first");
        }
        let listen = hub.url().trim_start_matches("https://").to_string();
        let kubeconfig = hub.kubeconfig_path().to_path_buf();
        let mut cmd = Command::new(workspace_binary("argocd-agent")?);
        cmd.arg("apiserver")
            .arg("--data-dir")
            .arg(hub.data_dir())
            .args(["--listen", &listen])
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .args(["--log-format", "text"])
            .env("NO_COLOR", "1");
        match std::fs::remove_file(&kubeconfig) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot remove {}", kubeconfig.display())),
        }
        let mut child = ChildProcess::spawn("hub-apiserver", cmd)?;
        let line = format!("{}https://{listen}", crate::apiserver::LISTENING_MESSAGE);
        let client = hub.client();
        let mut poll = crate::wait::Poller::new(START, "the hub's API server to be ready again");
        loop {
            child.ensure_running()?;
            if child.stdout().lines().any(|l| l.trim() == line) {
                let req = http::Request::get("/readyz").body(Vec::new()).context("a /readyz request")?;
                if matches!(tokio::time::timeout(Duration::from_secs(5), client.request_text(req)).await, Ok(Ok(_))) {
                    break;
                }
            }
            poll.tick().await.with_context(|| child.log_tail(20))?;
        }
        // The dead process's guard goes (printing its log tail); the live one takes its place.
        *hub.process_mut() = child;
        Ok(())
    }

    /// Whether the principal, each agent and the hub's API server are running; the names of
    /// those that are not.
    #[must_use]
    pub fn not_running(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.principal.as_mut().is_some_and(ChildProcess::is_running) {
            out.push("principal".to_string());
        }
        for (name, slot) in &mut self.agents {
            if !slot.process.as_mut().is_some_and(ChildProcess::is_running) {
                out.push(format!("agent {name}"));
            }
        }
        let hub_running = match &mut self.hub {
            Cluster::Embedded(hub) => hub.process_mut().is_running(),
            Cluster::Real { cluster, .. } => cluster.is_running(),
        };
        if !hub_running {
            out.push("hub".to_string());
        }
        out
    }

    /// The recent logs of every process, for failure messages.
    #[must_use]
    pub fn logs(&self) -> String {
        let mut out = String::new();
        if let Some(p) = &self.principal {
            out.push_str(&format!("--- principal\n{}\n", p.log_tail(40)));
        }
        for (name, slot) in &self.agents {
            if let Some(p) = &slot.process {
                out.push_str(&format!("--- agent {name}\n{}\n", p.log_tail(40)));
            }
        }
        out
    }
}

/// The principal's log line saying where the Redis proxy listens (`addr=` field).
pub(crate) const REDIS_PROXY_LISTENING: &str = "redis proxy listening";

/// The address in the last of a principal's "redis proxy listening" log lines.
pub(crate) fn redis_proxy_listening(lines: &[String]) -> Option<std::net::SocketAddr> {
    let addr = lines.last()?.split_whitespace().find_map(|w| w.strip_prefix("addr="))?;
    addr.trim_matches('"').parse().ok()
}
