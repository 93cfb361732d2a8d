//! [`Istiod`] and [`MeshWorkload`]: a real Istio control plane (`pilot-discovery`, built from the
//! `istio.io/istio` Go module pinned in `tests/tools/istio` by `scripts/install-test-deps`) against
//! a [`RealCluster`], and a workload outside Kubernetes joined to its mesh the way Istio's VM docs
//! prescribe: a WorkloadGroup, a ServiceAccount token from the TokenRequest API (audience
//! `istio-ca`) as bootstrap credential, `pilot-agent proxy sidecar` with `PROV_CERT` /
//! `OUTPUT_CERTS`, and the test venv's Envoy started by pilot-agent.
//!
//! - istiod runs its own CA (self-signed root in Secret `istio-system/istio-ca-secret`, published
//!   as ConfigMap `istio-ca-root-cert`) and signs workload certificates after validating the
//!   bootstrap token through the API server's TokenReview (`JWT_POLICY=third-party-jwt`). Its
//!   `serverca` scope logs at debug, so its log says `CSR successfully signed, sans [...]`.
//! - Every listener is on loopback with a free port, except pilot-agent's status port, which
//!   Istio always binds on the wildcard address (`:PORT`). istiod's serving certificate names
//!   `localhost` (`ISTIOD_CUSTOM_HOST`), so the workload reaches it as `localhost:PORT` and
//!   verifies it against the root from `istio-ca-root-cert`.
//! - No iptables: `ISTIO_META_INTERCEPTION_MODE=NONE`, and a `Sidecar` resource gives the
//!   workload an explicit inbound listener on `127.0.0.1` and no outbound listeners.
//! - Envoy is upstream Envoy (the venv's), not Istio's proxy build, which has extensions upstream
//!   lacks. istiod is started without them: `PILOT_ENABLE_METADATA_EXCHANGE=false` (the
//!   `istio.metadata_exchange` upstream filter on every cluster), `PILOT_ENABLE_ALPN_FILTER=false`
//!   (the `istio.alpn` HTTP filter on outbound listeners), `PILOT_DISABLE_MX_ALPN=true`, and a mesh
//!   config without the Prometheus stats provider (the `istio.stats` filter). With any of them,
//!   upstream Envoy rejects the pushed clusters or listeners (`Didn't find a registered
//!   implementation for 'istio.metadata_exchange'`).
//! - pilot-agent's bootstrap template is Istio's own (`tools/packaging/common/envoy_bootstrap.json`
//!   in the module cache, never copied into this repository), rendered with its wildcard addresses
//!   replaced by loopback ones; Envoy runs under `setpriv --pdeathsig KILL`, so it dies with
//!   pilot-agent even when pilot-agent is SIGKILLed (pilot-agent sets no parent-death signal).
//!
//! Both stop on drop.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::apiserver::ApiServerProcess;
use crate::bin_path::{envoy_path, venv_tool, workspace_root};
use crate::process::ChildProcess;
use crate::realkube::{RealCluster, free_port};
use crate::topology::{Mode, merged_kubeconfig};
use crate::wait::Poller;

/// How long istiod, or a workload's first certificate and configuration, may take on two busy
/// cores.
const START: Duration = Duration::from_secs(120);

/// The mesh's trust domain (Istio's default).
pub const TRUST_DOMAIN: &str = "cluster.local";

/// istiod's namespace.
pub const ISTIO_NAMESPACE: &str = "istio-system";

/// istiod's cluster ID (Istio's default), which workloads must name too.
pub const CLUSTER_ID: &str = "Kubernetes";

/// The audience istiod's CA requires of a third-party ServiceAccount token.
pub const CA_AUDIENCE: &str = "istio-ca";

/// The Go module of istiod and pilot-agent, pinned by `tests/tools/istio/go.mod`.
pub const ISTIO_MODULE: &str = "istio.io/istio";

/// The mesh config istiod runs with: Istio's defaults, minus the Prometheus stats provider (its
/// `istio.stats` filter is not in upstream Envoy), plus an access log.
///
/// Envoy's access log goes to its stdout (pilot-agent's log), one line per request with the
/// `x-forwarded-client-cert` the sidecar forwarded and the peer's verified SPIFFE ID.
const MESH_CONFIG: &str = "\
trustDomain: cluster.local
rootNamespace: istio-system
enablePrometheusMerge: false
defaultProviders:
  metrics: []
accessLogFile: /dev/stdout
accessLogFormat: \"istio-access %DOWNSTREAM_LOCAL_ADDRESS% %REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% \
peer=%DOWNSTREAM_PEER_URI_SAN% xfcc=%REQ(X-FORWARDED-CLIENT-CERT)%\\n\"
";

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// The directory of `istio.io/istio` in the Go module cache, at the version `tests/tools/istio`
/// pins (`go list -m -json istio.io/istio` there).
///
/// # Errors
/// `go` is missing, or the module is not downloaded (run `scripts/install-test-deps`).
pub fn istio_module_dir() -> anyhow::Result<PathBuf> {
    let tools = workspace_root().join("tests").join("tools").join("istio");
    let out = Command::new("go")
        .args(["list", "-m", "-json", ISTIO_MODULE])
        .current_dir(&tools)
        .output()
        .context("cannot run `go list -m -json istio.io/istio`")?;
    if !out.status.success() {
        bail!(
            "(cd {} && go list -m -json {ISTIO_MODULE}) failed: {}",
            tools.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let module: Value = serde_json::from_slice(&out.stdout).context("`go list -m -json` printed no JSON")?;
    match module["Dir"].as_str().map(PathBuf::from) {
        Some(dir) if dir.is_dir() => Ok(dir),
        _ => bail!(
            "{ISTIO_MODULE} {} is not in the Go module cache: run scripts/install-test-deps",
            module["Version"].as_str().unwrap_or("?")
        ),
    }
}

/// Istio's CRDs (all of them, as its `base` chart installs them), from the module cache.
///
/// # Errors
/// As [`istio_module_dir`], or the file is not where Istio keeps it.
pub fn istio_crds_file() -> anyhow::Result<PathBuf> {
    let file = istio_module_dir()?.join("manifests").join("charts").join("base").join("files").join("crd-all.gen.yaml");
    if !file.is_file() {
        bail!("Istio's CRDs are not at {}", file.display());
    }
    Ok(file)
}

/// Install Istio's CRDs and wait until the kinds the mesh tests use are served.
///
/// # Errors
/// The CRDs are missing, refused, or not served in time.
pub async fn install_istio_crds(cluster: &RealCluster) -> anyhow::Result<()> {
    cluster.apply_file(&istio_crds_file()?)?;
    let served = [
        ("networking.istio.io/v1", &["workloadgroups", "workloadentries", "sidecars", "destinationrules"][..]),
        ("security.istio.io/v1", &["peerauthentications", "authorizationpolicies"][..]),
    ];
    crate::install::wait_served(cluster, &served, START).await
}

/// Apply `manifest` (YAML, one or more documents) as the cluster's admin.
fn apply_yaml(cluster: &RealCluster, name: &str, manifest: &str) -> anyhow::Result<()> {
    let file = cluster.work_dir().join(format!("{name}.yaml"));
    std::fs::write(&file, manifest).with_context(|| format!("cannot write {}", file.display()))?;
    cluster.apply_file(&file)
}

/// The ports istiod listens on (all on `127.0.0.1`).
#[derive(Debug, Clone, Copy)]
pub struct IstiodPorts {
    /// `--httpAddr`: `/ready`, `/debug/...`.
    pub http: u16,
    /// `--grpcAddr`: plaintext XDS.
    pub grpc: u16,
    /// `--secureGRPCAddr`: XDS and the CA over TLS (Istio's 15012).
    pub secure_grpc: u16,
    /// `--httpsAddr`: webhooks (Istio's 15017).
    pub https: u16,
    /// `--monitoringAddr`: `/metrics`.
    pub monitoring: u16,
}

impl IstiodPorts {
    fn pick() -> anyhow::Result<Self> {
        Ok(Self {
            http: free_port()?,
            grpc: free_port()?,
            secure_grpc: free_port()?,
            https: free_port()?,
            monitoring: free_port()?,
        })
    }
}

/// A running istiod (`pilot-discovery discovery`) against a [`RealCluster`]; stopped on drop.
pub struct Istiod {
    // Dropped before its directory.
    process: ChildProcess,
    ports: IstiodPorts,
    root_cert_pem: String,
    dir: TempDir,
}

impl std::fmt::Debug for Istiod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Istiod")
            .field("pid", &self.process.pid())
            .field("ports", &self.ports)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl Istiod {
    /// Install Istio's CRDs, create `istio-system`, start istiod with the admin kubeconfig and wait
    /// for its `/ready` and for its CA's root in ConfigMap `istio-system/istio-ca-root-cert`.
    ///
    /// # Errors
    /// A binary or the module is missing (run `scripts/install-test-deps`), or istiod does not
    /// become ready in time (the error has its log tail).
    pub async fn start(cluster: &RealCluster) -> anyhow::Result<Self> {
        Self::start_with(cluster, &[]).await
    }

    /// [`Self::start`] with extra environment (e.g. `MAX_WORKLOAD_CERT_TTL`).
    ///
    /// # Errors
    /// As [`Self::start`].
    pub async fn start_with(cluster: &RealCluster, env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let bin = venv_tool("pilot-discovery")?;
        install_istio_crds(cluster).await?;
        cluster.ensure_namespace(ISTIO_NAMESPACE).await?;
        let dir = tempfile::Builder::new().prefix("istiod-").tempdir().context("cannot create a temp dir")?;
        std::fs::write(dir.path().join("mesh.yaml"), MESH_CONFIG)?;
        std::fs::write(dir.path().join("meshNetworks.yaml"), "{}\n")?;

        let mut last_error = None;
        for attempt in 1..=3 {
            let ports = IstiodPorts::pick()?;
            let mut cmd = Command::new(&bin);
            cmd.current_dir(dir.path())
                .arg("discovery")
                .arg("--kubeconfig")
                .arg(cluster.kubeconfig_path())
                .args(["--meshConfig", "mesh.yaml", "--networksConfig", "meshNetworks.yaml"])
                .args(["--domain", TRUST_DOMAIN, "--clusterID", CLUSTER_ID])
                .arg(format!("--httpAddr=127.0.0.1:{}", ports.http))
                .arg(format!("--grpcAddr=127.0.0.1:{}", ports.grpc))
                .arg(format!("--secureGRPCAddr=127.0.0.1:{}", ports.secure_grpc))
                .arg(format!("--httpsAddr=127.0.0.1:{}", ports.https))
                .arg(format!("--monitoringAddr=127.0.0.1:{}", ports.monitoring))
                .arg("--ctrlz_port=0")
                // `serverca` at debug logs every signed CSR with its SANs.
                .args(["--log_output_level", "default:info,serverca:debug"])
                .env_remove("KUBECONFIG")
                .env("POD_NAMESPACE", ISTIO_NAMESPACE)
                .env("POD_NAME", "istiod-0")
                .env("REVISION", "default")
                .env("JWT_POLICY", "third-party-jwt")
                .env("PILOT_CERT_PROVIDER", "istiod")
                // istiod's serving certificate also names `localhost`, which is how workloads here
                // reach it.
                .env("ISTIOD_CUSTOM_HOST", "localhost")
                .env("PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION", "true")
                .env("PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS", "true")
                // Istio-only Envoy extensions upstream Envoy rejects (see the module docs).
                .env("PILOT_ENABLE_METADATA_EXCHANGE", "false")
                .env("PILOT_DISABLE_MX_ALPN", "true")
                .env("PILOT_ENABLE_ALPN_FILTER", "false")
                .envs(env.iter().copied());
            let mut process = ChildProcess::spawn(&format!("istiod#{attempt}"), cmd)?;
            match wait_ready(&mut process, loopback(ports.http)).await {
                Ok(()) => {
                    let root_cert_pem = wait_root_cert(cluster, &mut process).await?;
                    return Ok(Self { process, ports, root_cert_pem, dir });
                }
                Err(e) => {
                    let _ = process.sigkill();
                    last_error = Some(e.context(format!("istiod did not become ready\n{}", process.log_tail(40))));
                }
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("istiod did not start")))
    }

    /// The ports it listens on.
    #[must_use]
    pub fn ports(&self) -> IstiodPorts {
        self.ports
    }

    /// Where workloads reach its XDS and CA: `localhost:PORT` (its certificate names `localhost`).
    #[must_use]
    pub fn discovery_address(&self) -> String {
        format!("localhost:{}", self.ports.secure_grpc)
    }

    /// Its CA's root certificate (PEM), as published in `istio-ca-root-cert`.
    #[must_use]
    pub fn root_cert_pem(&self) -> &str {
        &self.root_cert_pem
    }

    /// Its log so far (stdout: Istio logs there).
    #[must_use]
    pub fn log(&self) -> String {
        self.process.stdout()
    }

    /// The process (log tail, signals).
    #[must_use]
    pub fn process(&self) -> &ChildProcess {
        &self.process
    }

    /// Fail (with its log tail) if istiod has exited.
    ///
    /// # Errors
    /// It is no longer running.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        self.process.ensure_running()
    }
}

async fn wait_ready(process: &mut ChildProcess, http: SocketAddr) -> anyhow::Result<()> {
    let mut poll = Poller::new(START, format!("{} to answer /ready", process.name()));
    loop {
        process.ensure_running()?;
        let last = match crate::http::get(http, "/ready").await {
            Ok((200, _)) => return Ok(()),
            Ok((status, body)) => format!("{status} {}", body.trim()),
            Err(e) => e.to_string(),
        };
        poll.tick().await.with_context(|| format!("/ready: {last}"))?;
    }
}

async fn wait_root_cert(cluster: &RealCluster, process: &mut ChildProcess) -> anyhow::Result<String> {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(cluster.client(), ISTIO_NAMESPACE);
    let mut poll = Poller::new(START, "ConfigMap istio-system/istio-ca-root-cert");
    loop {
        process.ensure_running()?;
        if let Some(pem) = api
            .get_opt("istio-ca-root-cert")
            .await?
            .and_then(|cm| cm.data)
            .and_then(|mut data| data.remove("root-cert.pem"))
        {
            return Ok(pem);
        }
        poll.tick().await.with_context(|| process.log_tail(20))?;
    }
}

/// The Kubernetes objects [`MeshWorkload::join`] applies for a workload besides its ServiceAccount
/// and WorkloadGroup.
#[derive(Debug, Clone)]
pub enum WorkloadResources {
    /// A Service named after the workload and a `Sidecar` with an explicit inbound listener on
    /// `127.0.0.1` ([`WorkloadPorts::inbound`]) to its application, and no outbound listeners.
    Inbound,
    /// These (YAML, possibly empty), applied as given: e.g. our `istio/` manifests, or a
    /// `Sidecar` with an egress listener ([`client_sidecar`]).
    Given(String),
}

/// A workload to join to the mesh.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    /// Its namespace (created if missing).
    pub namespace: String,
    /// Its ServiceAccount (created if missing): its identity is
    /// `spiffe://cluster.local/ns/<namespace>/sa/<service_account>`.
    pub service_account: String,
    /// The WorkloadGroup name (and, with [`WorkloadResources::Inbound`], the Service and Sidecar
    /// name).
    pub name: String,
    /// The workload's labels (WorkloadGroup, proxy metadata): what Services, `Sidecar`s and
    /// policies select it by. `app: <name>` unless set.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Its address (`INSTANCE_IP`, the auto-registered WorkloadEntry's address): a loopback
    /// address, `127.0.0.1` unless set.
    pub address: Ipv4Addr,
    /// Where the application listens (`127.0.0.1`); the inbound listener of
    /// [`WorkloadResources::Inbound`] forwards there.
    pub app_port: u16,
    /// Lifetime of the bootstrap token.
    pub token_ttl: Duration,
    /// What else to apply.
    pub resources: WorkloadResources,
    /// Extra environment of pilot-agent (e.g. `SECRET_TTL`).
    pub env: Vec<(String, String)>,
    /// Extra fields of its ProxyConfig (`PROXY_CONFIG`), e.g. `connectionSettings`.
    pub proxy_config: serde_json::Map<String, Value>,
}

impl WorkloadSpec {
    /// `name` in `namespace`, running as ServiceAccount `name`, its application on `app_port`.
    #[must_use]
    pub fn new(namespace: &str, name: &str, app_port: u16) -> Self {
        Self {
            namespace: namespace.to_string(),
            service_account: name.to_string(),
            name: name.to_string(),
            labels: [("app".to_string(), name.to_string())].into(),
            address: Ipv4Addr::LOCALHOST,
            app_port,
            token_ttl: Duration::from_secs(3600),
            resources: WorkloadResources::Inbound,
            env: Vec::new(),
            proxy_config: serde_json::Map::new(),
        }
    }

    /// The SPIFFE ID istiod must give it.
    #[must_use]
    pub fn spiffe_id(&self) -> String {
        format!("spiffe://{TRUST_DOMAIN}/ns/{}/sa/{}", self.namespace, self.service_account)
    }

    /// The proxy's node name (`POD_NAME`); its XDS node ID is `<this>.<namespace>`.
    #[must_use]
    pub fn node_name(&self) -> String {
        format!("{}-vm", self.name)
    }
}

/// The ports of a [`MeshWorkload`]'s proxy.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadPorts {
    /// Envoy's admin (`127.0.0.1`).
    pub envoy_admin: u16,
    /// pilot-agent's status port (`/healthz/ready`; bound on the wildcard address by Istio).
    pub agent_status: u16,
    /// Envoy's readiness listener (Istio's 15021).
    pub envoy_status: u16,
    /// Envoy's Prometheus listener (Istio's 15090).
    pub envoy_prometheus: u16,
    /// The inbound listener from the `Sidecar` resource (`127.0.0.1`; Istio mTLS from peers).
    pub inbound: u16,
}

/// A workload outside Kubernetes joined to the mesh: pilot-agent with a bootstrap token, and
/// the Envoy it starts. Stopped on drop (Envoy dies with pilot-agent).
pub struct MeshWorkload {
    agent: ChildProcess,
    spec: WorkloadSpec,
    ports: WorkloadPorts,
    certs_dir: PathBuf,
    dir: TempDir,
}

impl std::fmt::Debug for MeshWorkload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshWorkload")
            .field("spec", &self.spec)
            .field("pid", &self.agent.pid())
            .field("ports", &self.ports)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl MeshWorkload {
    /// Join `spec`'s workload the way Istio's VM onboarding does: namespace, ServiceAccount,
    /// WorkloadGroup (auto-registration creates its WorkloadEntry), a Service and a `Sidecar`
    /// (explicit inbound listener on `127.0.0.1`, no outbound listeners: no iptables), a bootstrap
    /// token from TokenRequest (audience `istio-ca`), istiod's root in `PROV_CERT`; then start
    /// `pilot-agent proxy sidecar` and wait until its certificate is written to `OUTPUT_CERTS`
    /// and pilot-agent reports Envoy ready (it received its configuration).
    ///
    /// # Errors
    /// A binary is missing, a resource is refused, or the proxy is not ready in time (the error
    /// has pilot-agent's log tail, which includes Envoy's).
    pub async fn join(cluster: &RealCluster, istiod: &Istiod, spec: WorkloadSpec) -> anyhow::Result<Self> {
        let agent_bin = venv_tool("pilot-agent")?;
        let envoy = envoy_path()?;
        let template = std::fs::read_to_string(
            istio_module_dir()?.join("tools").join("packaging").join("common").join("envoy_bootstrap.json"),
        )
        .context("cannot read Istio's Envoy bootstrap template from the module cache")?;
        let ports = WorkloadPorts {
            envoy_admin: free_port()?,
            agent_status: free_port()?,
            envoy_status: free_port()?,
            envoy_prometheus: free_port()?,
            inbound: free_port()?,
        };
        let WorkloadSpec { namespace: ns, service_account: sa, name, .. } = &spec;
        let labels = serde_json::to_string(&spec.labels)?;

        cluster.ensure_namespace(ns).await?;
        let extra = match &spec.resources {
            WorkloadResources::Given(yaml) => yaml.clone(),
            WorkloadResources::Inbound => format!(
                "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {ns}}}
spec:
  selector: {labels}
  ports:
  - {{name: http, port: {inbound}, targetPort: {inbound}}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: {name}, namespace: {ns}}}
spec:
  workloadSelector:
    labels: {labels}
  ingress:
  - port: {{number: {inbound}, protocol: HTTP, name: http}}
    bind: 127.0.0.1
    defaultEndpoint: 127.0.0.1:{app}
  egress:
  - hosts: [\"{ISTIO_NAMESPACE}/*\"]
",
                inbound = ports.inbound,
                app = spec.app_port,
            ),
        };
        let mut manifest = format!(
            "apiVersion: v1
kind: ServiceAccount
metadata: {{name: {sa}, namespace: {ns}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {{name: {name}, namespace: {ns}}}
spec:
  metadata:
    labels: {labels}
  template:
    serviceAccount: {sa}
"
        );
        if !extra.trim().is_empty() {
            manifest.push_str("---\n");
            manifest.push_str(&extra);
        }
        apply_yaml(cluster, &format!("mesh-{ns}-{name}"), &manifest)?;
        let token = istio_ca_token(cluster, ns, sa, spec.token_ttl).await?;

        let dir =
            tempfile::Builder::new().prefix(&format!("mesh-{name}-")).tempdir().context("cannot create a temp dir")?;
        let certs_dir = dir.path().join("certs");
        // pilot-agent reads the token from `./var/run/secrets/tokens/istio-token` (relative to its
        // working directory), as a VM's `/var/run/secrets/tokens/istio-token`.
        let token_dir = dir.path().join("var").join("run").join("secrets").join("tokens");
        std::fs::create_dir_all(&certs_dir)?;
        std::fs::create_dir_all(&token_dir)?;
        std::fs::write(token_dir.join("istio-token"), &token)?;
        std::fs::write(certs_dir.join("root-cert.pem"), istiod.root_cert_pem())?;
        let bootstrap = dir.path().join("envoy_bootstrap_tmpl.json");
        std::fs::write(
            &bootstrap,
            template
                .replace("{{ .wildcard }}", "{{ .localhost }}")
                .replace("{{ .additional_wildcard }}", "{{ .additional_localhost }}"),
        )?;
        let envoy_wrapper = dir.path().join("envoy");
        write_envoy_wrapper(&envoy_wrapper, &envoy)?;

        let mut proxy_config = json!({
            "discoveryAddress": istiod.discovery_address(),
            "binaryPath": envoy_wrapper,
            "configPath": dir.path().join("etc").join("istio").join("proxy"),
            "proxyAdminPort": ports.envoy_admin,
            "statusPort": ports.agent_status,
            "drainDuration": "1s",
            "terminationDrainDuration": "1s",
            "concurrency": 1,
            // Istio's bootstrap keeps few stats; the tests read the listeners' and the RBAC
            // filter's.
            "proxyStatsMatcher": {"inclusionPrefixes": ["listener.", "http.", "cluster.outbound", "cluster.inbound"]},
        });
        if let Some(config) = proxy_config.as_object_mut() {
            config.extend(spec.proxy_config.clone());
        }
        let mut cmd = Command::new(&agent_bin);
        cmd.current_dir(dir.path())
            .args(["proxy", "sidecar", "--proxyLogLevel", "info", "--templateFile"])
            .arg(&bootstrap)
            .env_remove("KUBECONFIG")
            .env("PROXY_CONFIG", proxy_config.to_string())
            .env("POD_NAME", spec.node_name())
            .env("POD_NAMESPACE", ns)
            .env("SERVICE_ACCOUNT", sa)
            .env("INSTANCE_IP", spec.address.to_string())
            .env("CANONICAL_SERVICE", name)
            .env("TRUST_DOMAIN", TRUST_DOMAIN)
            .env("ISTIO_METAJSON_LABELS", &labels)
            .env("ISTIO_META_CLUSTER_ID", CLUSTER_ID)
            .env("ISTIO_META_WORKLOAD_NAME", name)
            .env("ISTIO_META_AUTO_REGISTER_GROUP", name)
            // No traffic capture (no iptables) and no DNS capture (no :53).
            .env("ISTIO_META_INTERCEPTION_MODE", "NONE")
            .env("ISTIO_META_DNS_CAPTURE", "false")
            .env("ENVOY_STATUS_PORT", ports.envoy_status.to_string())
            .env("ENVOY_PROMETHEUS_PORT", ports.envoy_prometheus.to_string())
            .env("JWT_POLICY", "third-party-jwt")
            .env("PILOT_CERT_PROVIDER", "istiod")
            .env("CA_ADDR", istiod.discovery_address())
            .env("PROV_CERT", &certs_dir)
            .env("OUTPUT_CERTS", &certs_dir)
            .envs(spec.env.iter().map(|(k, v)| (k, v)));
        let mut agent = ChildProcess::spawn(&format!("pilot-agent {ns}/{name}"), cmd)?;
        let ready = wait_proxy_ready(&mut agent, &certs_dir, ports.agent_status).await;
        match ready {
            Ok(()) => Ok(Self { agent, spec, ports, certs_dir, dir }),
            Err(e) => Err(e.context(format!("the workload's proxy did not become ready\n{}", agent.log_tail(60)))),
        }
    }

    /// What it was joined with.
    #[must_use]
    pub fn spec(&self) -> &WorkloadSpec {
        &self.spec
    }

    /// Its ports.
    #[must_use]
    pub fn ports(&self) -> WorkloadPorts {
        self.ports
    }

    /// `OUTPUT_CERTS`: `cert-chain.pem`, `key.pem`, `root-cert.pem`.
    #[must_use]
    pub fn certs_dir(&self) -> &Path {
        &self.certs_dir
    }

    /// The certificate chain istiod signed (PEM, leaf first).
    ///
    /// # Errors
    /// It is not there.
    pub fn cert_chain_pem(&self) -> anyhow::Result<String> {
        let path = self.certs_dir.join("cert-chain.pem");
        std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
    }

    /// `GET path` on Envoy's admin; the body of a 200.
    ///
    /// # Errors
    /// No answer, or not 200.
    pub async fn envoy_admin(&self, path: &str) -> anyhow::Result<String> {
        let (status, body) = crate::http::get_decoded(loopback(self.ports.envoy_admin), path)
            .await
            .with_context(|| format!("Envoy admin {path}"))?;
        if status != 200 {
            bail!("Envoy admin {path}: {status} {}", body.trim());
        }
        Ok(body)
    }

    /// Envoy's `/config_dump` (JSON).
    ///
    /// # Errors
    /// No answer, or not JSON.
    pub async fn config_dump(&self) -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&self.envoy_admin("/config_dump").await?)?)
    }

    /// The SPIFFE IDs (URI SANs) of the certificates Envoy holds (`/certs`): what its SDS got from
    /// pilot-agent.
    ///
    /// # Errors
    /// No answer, or not JSON.
    pub async fn envoy_cert_uris(&self) -> anyhow::Result<Vec<String>> {
        let certs: Value = serde_json::from_str(&self.envoy_admin("/certs").await?)?;
        let mut uris: Vec<String> = certs["certificates"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["cert_chain"].as_array().into_iter().flatten())
            .flat_map(|c| c["subject_alt_names"].as_array().into_iter().flatten())
            .filter_map(|san| san["uri"].as_str().map(str::to_string))
            .collect();
        uris.sort();
        uris.dedup();
        Ok(uris)
    }

    /// pilot-agent's log so far (Envoy's is in it).
    #[must_use]
    pub fn log(&self) -> String {
        self.agent.stdout()
    }

    /// The pilot-agent process.
    #[must_use]
    pub fn process(&self) -> &ChildProcess {
        &self.agent
    }

    /// Fail (with its log tail) if pilot-agent has exited.
    ///
    /// # Errors
    /// It is no longer running.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        self.agent.ensure_running()
    }
}

/// A token for ServiceAccount `namespace/name` with audience `istio-ca` (TokenRequest), as the
/// projected `istio-token` of a pod or the bootstrap token of a VM.
///
/// # Errors
/// The request is refused.
pub async fn istio_ca_token(
    cluster: &RealCluster,
    namespace: &str,
    name: &str,
    ttl: Duration,
) -> anyhow::Result<String> {
    cluster.service_account_token_for(namespace, name, ttl, &[CA_AUDIENCE]).await
}

/// pilot-agent's `binaryPath`: the venv's Envoy under `setpriv --pdeathsig KILL`, so that Envoy
/// never outlives pilot-agent (which sets no parent-death signal itself).
fn write_envoy_wrapper(path: &Path, envoy: &Path) -> anyhow::Result<()> {
    let setpriv = Command::new("setpriv").arg("--help").output();
    if !setpriv.is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("--pdeathsig")) {
        bail!("setpriv with --pdeathsig (util-linux) is needed to tie Envoy's life to pilot-agent's");
    }
    let quoted = envoy.display().to_string().replace('\'', r"'\''");
    std::fs::write(path, format!("#!/bin/sh\nexec setpriv --pdeathsig KILL '{quoted}' \"$@\"\n"))?;
    let mut perms = std::fs::metadata(path)?.permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(path, perms)?;
    Ok(())
}

async fn wait_proxy_ready(agent: &mut ChildProcess, certs_dir: &Path, status_port: u16) -> anyhow::Result<()> {
    let mut poll = Poller::new(START, format!("{} to write its certificate and report Envoy ready", agent.name()));
    loop {
        agent.ensure_running()?;
        let cert = certs_dir.join("cert-chain.pem").is_file();
        let last = match crate::http::get(loopback(status_port), "/healthz/ready").await {
            Ok((200, _)) if cert => return Ok(()),
            Ok((status, body)) => format!("certificate written: {cert}; /healthz/ready: {status} {}", body.trim()),
            Err(e) => format!("certificate written: {cert}; /healthz/ready: {e}"),
        };
        poll.tick().await.with_context(|| last)?;
    }
}

// === The principal and its agents behind Istio-programmed sidecars ===

/// The principal's gRPC port everywhere on the mesh path, as in `istio/`: the Service's `port`
/// and `targetPort`, the `Sidecar`'s inbound port, the DestinationRule's and the
/// AuthorizationPolicy's port, every client's egress listener, and the principal's own
/// `--listen-port`. Each listener has its own loopback address ([`LoopbackNet`]).
pub const PRINCIPAL_PORT: u16 = 8443;

/// The principal's Service (and ServiceAccount, and `app.kubernetes.io/name`).
pub const PRINCIPAL_SERVICE: &str = "argocd-agent-principal";

/// The principal's Service's host name, which the DestinationRule names.
pub const PRINCIPAL_HOST: &str = "argocd-agent-principal.argocd.svc.cluster.local";

/// Namespace of the principal, of the agents' workloads and of Argo CD on the spokes.
pub const ARGOCD_NS: &str = crate::topology::ARGOCD_NS;

/// The agents' `--heartbeat-interval`, as `istio/components/agent` sets it.
pub const HEARTBEAT: &str = "30s";

/// A `/24` of loopback addresses for one mesh, `127.a.b.0/24`, so that every listener can use
/// [`PRINCIPAL_PORT`] on an address of its own, and two meshes on one host do not meet (Envoy
/// binds with `SO_REUSEPORT`: two Envoys on one address and port would share its connections).
///
/// The principal itself listens on `127.0.0.1:8443`, as in `istio/` (the `Sidecar`'s
/// `defaultEndpoint` can only be `127.0.0.1`, `0.0.0.0` or their IPv6 forms: istiod sends
/// anything else to an original-destination cluster, which without iptables has no upstream);
/// [`IstioMesh`] holds a file lock for that port. In the `/24`, `.2` is the principal's workload
/// (its sidecar's inbound listener), `.10` and up the clients (each its workload address and
/// egress listener).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopbackNet([u8; 2]);

impl LoopbackNet {
    /// A `/24` whose first hosts have [`PRINCIPAL_PORT`] free.
    ///
    /// # Errors
    /// None found.
    pub fn pick() -> anyhow::Result<Self> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let mut seed = u64::from(std::process::id()).wrapping_mul(2_654_435_761) ^ u64::from(nanos);
        for _ in 0..64 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let [a, b, ..] = (seed >> 32).to_le_bytes();
            let net = Self([a.clamp(2, 254), b.clamp(1, 254)]);
            if [2, 10, 11, 12, 13, 14, 15, 16].iter().all(|&h| TcpListener::bind((net.host(h), PRINCIPAL_PORT)).is_ok())
            {
                return Ok(net);
            }
        }
        bail!("no loopback /24 with port {PRINCIPAL_PORT} free")
    }

    /// `127.a.b.host`.
    #[must_use]
    pub fn host(self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, self.0[0], self.0[1], host)
    }

    /// Where the principal listens (h2c): `127.0.0.1:8443`, the `Sidecar`'s `defaultEndpoint`.
    #[must_use]
    pub fn principal(self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, PRINCIPAL_PORT))
    }

    /// The principal's workload address: its sidecar's inbound listener (Istio mTLS).
    #[must_use]
    pub fn principal_inbound(self) -> SocketAddr {
        SocketAddr::from((self.host(2), PRINCIPAL_PORT))
    }

    /// Client number `n`'s workload address and egress listener (h2c from the client).
    #[must_use]
    pub fn client(self, n: u8) -> SocketAddr {
        SocketAddr::from((self.host(10 + n), PRINCIPAL_PORT))
    }
}

/// A client's `Sidecar` for a workload outside Kubernetes without iptables: one egress listener
/// on `bind:8443` for the principal's Service only. The port has no protocol, so istiod sniffs
/// it and routes every request on it to that one Service whatever its `:authority` (with
/// `protocol: GRPC` the route matches the Service's host names only, which the client, dialling
/// an address, does not send).
#[must_use]
pub fn client_sidecar(
    namespace: &str,
    name: &str,
    labels: &std::collections::BTreeMap<String, String>,
    bind: Ipv4Addr,
) -> String {
    let labels = serde_json::to_string(labels).unwrap_or_default();
    format!(
        "apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  workloadSelector:
    labels: {labels}
  egress:
  - port: {{number: {PRINCIPAL_PORT}, name: grpc}}
    bind: {bind}
    hosts: [\"{ARGOCD_NS}/{PRINCIPAL_HOST}\"]
"
    )
}

/// `kubectl kustomize istio/<overlay>` as JSON documents.
///
/// # Errors
/// kubectl fails or prints no YAML.
pub fn render_istio_overlay(overlay: &str) -> anyhow::Result<Vec<Value>> {
    let dir = workspace_root().join("istio").join(overlay);
    let out = Command::new(crate::bin_path::kubectl_path()?)
        .arg("kustomize")
        .arg(&dir)
        .output()
        .context("cannot run kubectl kustomize")?;
    if !out.status.success() {
        bail!("kubectl kustomize {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    }
    crate::install::documents(&String::from_utf8(out.stdout)?)
}

/// What [`adapt_principal_overlay`] takes from `istio/principal`, adapted.
#[derive(Debug, Clone)]
pub struct PrincipalOverlay {
    /// The objects applied to the hub, in order.
    pub objects: Vec<Value>,
    /// The principal's `--auth` (`principal.auth` of `argocd-agent-params`).
    pub auth: String,
    /// Its `--allowed-namespaces` (`principal.allowed-namespaces`, plus the agents).
    pub allowed_namespaces: String,
    /// The agents' identities in the AuthorizationPolicy (without `spiffe://`).
    pub principals: Vec<String>,
    /// Every change made to our manifests, for the record.
    pub changes: Vec<String>,
}

/// The Istio objects of `istio/principal` and the principal's Service, taken verbatim except:
///
/// - `Sidecar`: the inbound listener gets `bind: <workload address>` (a VM without iptables:
///   with interception `NONE` the listener really binds, and without `bind` istiod binds it on
///   the wildcard address, where it would meet the principal's own `127.0.0.1:8443`); and
///   `egress` is limited to `istio-system/*` (without iptables every outbound listener istiod
///   programs really binds, e.g. `127.0.0.1:443` for the `kubernetes` Service).
/// - `AuthorizationPolicy`: one principal per agent (as the policy's comment prescribes), and
///   `allowed-namespaces` likewise.
///
/// # Errors
/// An object the mesh needs is missing from the overlay.
pub fn adapt_principal_overlay(docs: &[Value], net: LoopbackNet, agents: &[&str]) -> anyhow::Result<PrincipalOverlay> {
    use crate::install::find;
    let mut changes = Vec::new();
    let params = find(docs, "ConfigMap", "argocd-agent-params")?;
    let param = |k: &str| -> anyhow::Result<String> {
        params["data"][k].as_str().map(str::to_string).with_context(|| format!("argocd-agent-params has no {k}"))
    };
    let auth = param("principal.auth")?;
    let listen = (param("principal.listen.host")?, param("principal.listen.port")?);
    if listen != ("127.0.0.1".to_string(), PRINCIPAL_PORT.to_string())
        || param("principal.tls.insecure-plaintext")? != "true"
    {
        bail!("istio/principal no longer serves h2c on 127.0.0.1:{PRINCIPAL_PORT}: {listen:?}");
    }
    let mut allowed: Vec<String> = param("principal.allowed-namespaces")?.split(',').map(str::to_string).collect();
    for agent in agents {
        if !allowed.iter().any(|a| a == agent) {
            allowed.push((*agent).to_string());
            changes.push(format!("ConfigMap argocd-agent-params: principal.allowed-namespaces += {agent}"));
        }
    }

    let mut objects = vec![
        find(docs, "Namespace", ARGOCD_NS)?.clone(),
        find(docs, "ServiceAccount", PRINCIPAL_SERVICE)?.clone(),
        find(docs, "Service", PRINCIPAL_SERVICE)?.clone(),
        find(docs, "PeerAuthentication", "default")?.clone(),
        find(docs, "DestinationRule", PRINCIPAL_SERVICE)?.clone(),
    ];

    let mut sidecar = find(docs, "Sidecar", PRINCIPAL_SERVICE)?.clone();
    let ingress = sidecar["spec"]["ingress"].get_mut(0).context("the principal's Sidecar has no ingress")?;
    let endpoint = ingress["defaultEndpoint"].as_str().unwrap_or_default().to_string();
    if endpoint != format!("127.0.0.1:{PRINCIPAL_PORT}") {
        bail!("the principal's Sidecar forwards to {endpoint:?}, not 127.0.0.1:{PRINCIPAL_PORT}");
    }
    ingress["bind"] = json!(net.host(2).to_string());
    changes.push(format!("Sidecar {PRINCIPAL_SERVICE}: ingress bind {} (VM, no iptables)", net.host(2)));
    if sidecar["spec"].get("egress").is_some() {
        bail!("the principal's Sidecar now has egress: {}", sidecar["spec"]["egress"]);
    }
    sidecar["spec"]["egress"] = json!([{ "hosts": [format!("{ISTIO_NAMESPACE}/*")] }]);
    changes.push(format!("Sidecar {PRINCIPAL_SERVICE}: egress hosts [{ISTIO_NAMESPACE}/*] (VM, no iptables)"));
    objects.push(sidecar);

    let mut policy = find(docs, "AuthorizationPolicy", PRINCIPAL_SERVICE)?.clone();
    let listed = policy["spec"]["rules"][0]["from"][0]["source"]["principals"]
        .as_array_mut()
        .context("the AuthorizationPolicy's first rule lists no principals")?;
    for agent in agents {
        let id = format!("{TRUST_DOMAIN}/ns/{ARGOCD_NS}/sa/{agent}");
        if !listed.iter().any(|p| p == &json!(id)) {
            listed.push(json!(id));
            changes.push(format!("AuthorizationPolicy {PRINCIPAL_SERVICE}: principals += {id}"));
        }
    }
    let principals = listed.iter().filter_map(|p| p.as_str().map(str::to_string)).collect();
    objects.push(policy);
    Ok(PrincipalOverlay { objects, auth, allowed_namespaces: allowed.join(","), principals, changes })
}

/// One mesh at a time per host: the principal listens on `127.0.0.1:8443`. Waits for the lock
/// (another test's mesh) up to 15 minutes, then for the port itself.
async fn lock_principal_port() -> anyhow::Result<std::fs::File> {
    let path = std::env::temp_dir().join(format!("argocd-agent-istio-mesh-{PRINCIPAL_PORT}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let mut poll = Poller::new(Duration::from_secs(900), format!("the lock {} (another Istio mesh)", path.display()));
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) => poll.tick().await?,
            Err(std::fs::TryLockError::Error(e)) => return Err(e).context("cannot lock the mesh's port lock"),
        }
    }
    let mut poll = Poller::new(START, format!("127.0.0.1:{PRINCIPAL_PORT} to be free for the principal"));
    while TcpListener::bind((Ipv4Addr::LOCALHOST, PRINCIPAL_PORT)).is_err() {
        poll.tick().await?;
    }
    Ok(file)
}

/// One agent of an [`IstioMesh`].
struct MeshAgent {
    mode: Mode,
    // Dropped before its sidecar and spoke.
    process: Option<ChildProcess>,
    sidecar: MeshWorkload,
    spoke: ApiServerProcess,
    egress: SocketAddr,
}

/// Knobs of an [`IstioMesh`].
#[derive(Debug, Clone, Default)]
pub struct IstioMeshOptions {
    /// Extra environment of istiod (e.g. `DEFAULT_WORKLOAD_CERT_TTL`).
    pub istiod_env: Vec<(String, String)>,
    /// Extra environment of every pilot-agent (e.g. `SECRET_TTL`).
    pub proxy_env: Vec<(String, String)>,
    /// Extra ProxyConfig fields of every sidecar (e.g. `connectionSettings`).
    pub proxy_config: serde_json::Map<String, Value>,
    /// `--heartbeat-interval` per agent, instead of [`HEARTBEAT`].
    pub heartbeats: std::collections::BTreeMap<String, String>,
}

/// The hub (a [`RealCluster`] with Argo CD's CRDs and istiod) with our `istio/principal`
/// manifests applied ([`adapt_principal_overlay`]), the principal behind its Istio sidecar, and
/// one agent per embedded spoke, each behind a sidecar of its own with its own ServiceAccount
/// (`argocd/<agent>`) dialling the principal's Service through its egress listener:
///
/// ```text
/// agent ─h2c─► 127.a.b.1x:8443 sidecar ══ Istio mTLS ══► 127.a.b.2:8443 sidecar ─h2c─► 127.a.b.1:8443 principal
/// ```
///
/// Every certificate comes from istiod, every Envoy listener and cluster from its XDS. Dropping
/// it stops every process.
pub struct IstioMesh {
    // Dropped first: the agents, the principal, the sidecars, istiod, the hub.
    agents: std::collections::BTreeMap<String, MeshAgent>,
    principal: Option<ChildProcess>,
    principal_sidecar: MeshWorkload,
    istiod: Istiod,
    hub: RealCluster,
    net: LoopbackNet,
    overlay: PrincipalOverlay,
    options: IstioMeshOptions,
    dir: TempDir,
    // Held for the principal's 127.0.0.1:8443; released last.
    _port_lock: std::fs::File,
}

impl std::fmt::Debug for IstioMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IstioMesh")
            .field("net", &self.net)
            .field("agents", &self.agents.keys())
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

fn to_yaml(objects: &[Value]) -> anyhow::Result<String> {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(o)?);
    }
    Ok(out)
}

impl IstioMesh {
    /// Start it with `agents` (names are DNS labels; each is also its ServiceAccount) and wait
    /// until every agent is connected.
    ///
    /// # Errors
    /// Any part fails to start.
    pub async fn start(agents: &[(&str, Mode)]) -> anyhow::Result<Self> {
        Self::start_with(agents, IstioMeshOptions::default()).await
    }

    /// [`Self::start`] with knobs.
    ///
    /// # Errors
    /// Any part fails to start.
    pub async fn start_with(agents: &[(&str, Mode)], options: IstioMeshOptions) -> anyhow::Result<Self> {
        let port_lock = lock_principal_port().await?;
        let dir = tempfile::Builder::new().prefix("istio-mesh-").tempdir().context("cannot create a temp dir")?;
        let net = LoopbackNet::pick()?;
        let hub = RealCluster::start().await?;
        hub.install_argocd_crds().await?;
        hub.ensure_namespace(ARGOCD_NS).await?;
        hub.apply_file(&workspace_root().join("install").join("rbac").join("principal.yaml"))?;
        let env: Vec<(&str, &str)> = options.istiod_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let istiod = Istiod::start_with(&hub, &env).await?;

        // Our manifests, as istiod sees them.
        let names: Vec<&str> = agents.iter().map(|(n, _)| *n).collect();
        let overlay = adapt_principal_overlay(&render_istio_overlay("principal")?, net, &names)?;
        apply_yaml(&hub, "istio-principal", &to_yaml(&overlay.objects)?)?;

        let principal_kubeconfig = hub
            .service_account_kubeconfig(
                ARGOCD_NS,
                PRINCIPAL_SERVICE,
                Duration::from_secs(24 * 3600),
                &dir.path().join("principal.kubeconfig"),
            )
            .await?;
        let mut spokes = Vec::new();
        for (name, mode) in agents {
            crate::topology::ensure_namespace(&hub.client(), name).await?;
            let spoke = ApiServerProcess::start().await?;
            crate::topology::ensure_namespace(&spoke.client(), ARGOCD_NS).await?;
            spokes.push(((*name).to_string(), *mode, spoke));
        }
        let mut admin: Vec<(&str, &Path)> = vec![("hub", hub.kubeconfig_path())];
        let mut process: Vec<(&str, &Path)> = vec![("hub", &principal_kubeconfig)];
        for (name, _, spoke) in &spokes {
            admin.push((name, spoke.kubeconfig_path()));
            process.push((name, spoke.kubeconfig_path()));
        }
        std::fs::write(dir.path().join("kubeconfig"), merged_kubeconfig(&admin)?)?;
        std::fs::write(dir.path().join("process-kubeconfig"), merged_kubeconfig(&process)?)?;

        // The JWT signing key, as docs/mesh/istio.md step 2 says; no TLS Secrets.
        let out = Command::new(crate::bin_path::workspace_binary("argocd-agentctl")?)
            .arg("--kubeconfig")
            .arg(dir.path().join("kubeconfig"))
            .args(["--principal-context", "hub", "jwt", "create-key"])
            .output()
            .context("cannot run argocd-agentctl")?;
        if !out.status.success() {
            bail!("argocd-agentctl jwt create-key: {}", String::from_utf8_lossy(&out.stderr));
        }

        // The principal's workload: labels of its Service's selector, address .2.
        let service = crate::install::find(&overlay.objects, "Service", PRINCIPAL_SERVICE)?;
        let labels: std::collections::BTreeMap<String, String> =
            serde_json::from_value(service["spec"]["selector"].clone())?;
        let mut spec = WorkloadSpec::new(ARGOCD_NS, PRINCIPAL_SERVICE, PRINCIPAL_PORT);
        spec.labels = labels;
        spec.address = net.host(2);
        spec.resources = WorkloadResources::Given(String::new());
        spec.env.clone_from(&options.proxy_env);
        spec.proxy_config.clone_from(&options.proxy_config);
        let principal_sidecar = MeshWorkload::join(&hub, &istiod, spec).await?;

        let mut mesh = Self {
            agents: std::collections::BTreeMap::new(),
            principal: None,
            principal_sidecar,
            istiod,
            hub,
            net,
            overlay,
            options,
            dir,
            _port_lock: port_lock,
        };
        mesh.start_principal()?;
        for (i, (name, mode, spoke)) in spokes.into_iter().enumerate() {
            let n = u8::try_from(i).context("too many agents")?;
            let sidecar = mesh.join_client(ARGOCD_NS, &name, &name, n).await?;
            let egress = mesh.net.client(n);
            mesh.agents.insert(name.clone(), MeshAgent { mode, process: None, sidecar, spoke, egress });
            mesh.start_agent(&name)?;
        }
        for (name, _) in agents {
            mesh.wait_connected(name, 1).await?;
        }
        Ok(mesh)
    }

    /// Join a client workload (ServiceAccount `namespace/service_account`, label `app: name`,
    /// address and egress listener [`LoopbackNet::client`]`(n)`) to the mesh.
    ///
    /// # Errors
    /// As [`MeshWorkload::join`].
    pub async fn join_client(
        &self,
        namespace: &str,
        service_account: &str,
        name: &str,
        n: u8,
    ) -> anyhow::Result<MeshWorkload> {
        let egress = self.net.client(n);
        let mut spec = WorkloadSpec::new(namespace, name, 0);
        spec.service_account = service_account.to_string();
        spec.address = self.net.host(10 + n);
        spec.resources = WorkloadResources::Given(client_sidecar(namespace, name, &spec.labels, self.net.host(10 + n)));
        spec.env.clone_from(&self.options.proxy_env);
        spec.proxy_config.clone_from(&self.options.proxy_config);
        let workload = MeshWorkload::join(&self.hub, &self.istiod, spec).await?;
        // Ready means Envoy has its configuration, but the egress listener may come in a later
        // push; wait until it is there.
        let listener = format!("{}_{}", egress.ip(), egress.port());
        let mut poll = Poller::new(START, format!("the egress listener {listener} of {namespace}/{name}"));
        loop {
            if workload.envoy_admin("/listeners").await.is_ok_and(|l| l.lines().any(|l| l.starts_with(&listener))) {
                break;
            }
            poll.tick().await.with_context(|| workload.process().log_tail(30))?;
        }
        Ok(workload)
    }

    fn start_principal(&mut self) -> anyhow::Result<()> {
        let mut cmd = Command::new(crate::bin_path::workspace_binary("argocd-agent")?);
        let listen = self.net.principal();
        cmd.args(["principal", "--namespace", ARGOCD_NS, "--insecure-plaintext"])
            .args(["--listen-host", &listen.ip().to_string(), "--listen-port", &listen.port().to_string()])
            .args(["--auth", &self.overlay.auth, "--allowed-namespaces", &self.overlay.allowed_namespaces])
            .args(["--kubecontext", "hub", "--log-level", "debug"])
            .arg("--kubeconfig")
            .arg(self.dir.path().join("process-kubeconfig"))
            .args(["--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"])
            .env("NO_COLOR", "1");
        let mut child = ChildProcess::spawn("principal", cmd)?;
        let want = format!("principal listening on {}", self.net.principal());
        crate::wait::wait_until(START, "the principal to listen", || {
            child.is_running() && child.stdout().lines().any(|l| l.trim() == want)
        })
        .with_context(|| child.log_tail(30))?;
        self.principal = Some(child);
        Ok(())
    }

    /// Start (or restart) agent `name`: plaintext to its sidecar's egress listener, `--creds
    /// header:`, its name, heartbeats every [`HEARTBEAT`] (`istio/components/agent`).
    ///
    /// # Errors
    /// No such agent, or it cannot be spawned.
    pub fn start_agent(&mut self, name: &str) -> anyhow::Result<()> {
        let kubeconfig = self.dir.path().join("process-kubeconfig");
        let heartbeat = self.options.heartbeats.get(name).map_or(HEARTBEAT, String::as_str).to_string();
        let agent = self.agents.get_mut(name).with_context(|| format!("no agent {name}"))?;
        let mode = match agent.mode {
            Mode::Managed => "managed",
            Mode::Autonomous => "autonomous",
        };
        let mut cmd = Command::new(crate::bin_path::workspace_binary("argocd-agent")?);
        cmd.args(["agent", "--agent-mode", mode, "--insecure-plaintext"])
            .args([
                "--server-address",
                &agent.egress.ip().to_string(),
                "--server-port",
                &agent.egress.port().to_string(),
            ])
            .args(["--creds", "header:", "--agent-name", name, "--heartbeat-interval", &heartbeat])
            .args(["--namespace", ARGOCD_NS, "--kubecontext", name, "--log-level", "debug"])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"])
            .env("NO_COLOR", "1");
        agent.process = Some(ChildProcess::spawn(&format!("agent-{name}"), cmd)?);
        Ok(())
    }

    /// SIGKILL agent `name` (its sidecar stays).
    ///
    /// # Errors
    /// No such agent, or it is not running.
    pub fn kill_agent(&mut self, name: &str) -> anyhow::Result<()> {
        let agent = self.agents.get_mut(name).with_context(|| format!("no agent {name}"))?;
        agent.process.take().with_context(|| format!("agent {name} is not running"))?.sigkill()?;
        Ok(())
    }

    /// Wait until the principal has logged `agent connected` for `agent` at least `count` times.
    ///
    /// # Errors
    /// Not in time (the error has the logs).
    pub async fn wait_connected(&self, agent: &str, count: usize) -> anyhow::Result<()> {
        let mut poll = Poller::new(START, format!("agent {agent} to connect through the mesh"));
        while self.principal_connects(agent) < count {
            poll.tick().await.with_context(|| self.logs())?;
        }
        Ok(())
    }

    /// The hub's admin client.
    #[must_use]
    pub fn hub(&self) -> kube::Client {
        self.hub.client()
    }

    /// The hub.
    #[must_use]
    pub fn hub_cluster(&self) -> &RealCluster {
        &self.hub
    }

    /// Agent `name`'s spoke (admin client).
    ///
    /// # Errors
    /// No such agent.
    pub fn spoke(&self, name: &str) -> anyhow::Result<kube::Client> {
        Ok(self.agents.get(name).with_context(|| format!("no agent {name}"))?.spoke.client())
    }

    /// istiod.
    #[must_use]
    pub fn istiod(&self) -> &Istiod {
        &self.istiod
    }

    /// The principal's sidecar.
    #[must_use]
    pub fn principal_sidecar(&self) -> &MeshWorkload {
        &self.principal_sidecar
    }

    /// Agent `name`'s sidecar.
    ///
    /// # Errors
    /// No such agent.
    pub fn agent_sidecar(&self, name: &str) -> anyhow::Result<&MeshWorkload> {
        Ok(&self.agents.get(name).with_context(|| format!("no agent {name}"))?.sidecar)
    }

    /// The loopback addresses of this mesh.
    #[must_use]
    pub fn net(&self) -> LoopbackNet {
        self.net
    }

    /// What was applied from `istio/principal`, and how it was changed.
    #[must_use]
    pub fn overlay(&self) -> &PrincipalOverlay {
        &self.overlay
    }

    /// Replace the AuthorizationPolicy's principals by the agents' and `extra` (as an operator
    /// would by patching it).
    ///
    /// # Errors
    /// The policy is refused.
    pub fn set_policy_principals(&self, extra: &[&str]) -> anyhow::Result<()> {
        let mut policy = crate::install::find(&self.overlay.objects, "AuthorizationPolicy", PRINCIPAL_SERVICE)?.clone();
        let mut principals = self.overlay.principals.clone();
        principals.extend(extra.iter().map(|p| (*p).to_string()));
        policy["spec"]["rules"][0]["from"][0]["source"]["principals"] = json!(principals);
        apply_yaml(&self.hub, "istio-principal-policy", &to_yaml(&[policy])?)
    }

    /// The principal's log (stderr) so far.
    #[must_use]
    pub fn principal_log(&self) -> String {
        self.principal.as_ref().map(ChildProcess::stderr).unwrap_or_default()
    }

    /// Where the principal serves `/metrics`.
    #[must_use]
    pub fn principal_metrics_addr(&self) -> Option<SocketAddr> {
        let stdout = self.principal.as_ref()?.stdout();
        stdout
            .lines()
            .filter_map(|l| l.strip_prefix("principal metrics listening on "))
            .next_back()?
            .trim()
            .parse()
            .ok()
    }

    /// The principal's `/metrics`.
    ///
    /// # Errors
    /// Not serving.
    pub async fn principal_metrics(&self) -> anyhow::Result<String> {
        let addr = self.principal_metrics_addr().context("the principal serves no metrics")?;
        let (status, body) = crate::http::get(addr, "/metrics").await?;
        if status != 200 {
            bail!("principal /metrics: {status}");
        }
        Ok(body)
    }

    /// How many times the principal has logged `agent connected` for `agent`.
    #[must_use]
    pub fn principal_connects(&self, agent: &str) -> usize {
        let needle = format!("agent connected agent={agent} ");
        self.principal_log().lines().filter(|l| l.contains(&needle)).count()
    }

    /// Agent `name`'s log (stderr) so far.
    #[must_use]
    pub fn agent_log(&self, name: &str) -> String {
        self.agents.get(name).and_then(|a| a.process.as_ref()).map(ChildProcess::stderr).unwrap_or_default()
    }

    /// The names of the processes that are not running.
    #[must_use]
    pub fn not_running(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.principal.as_mut().is_some_and(ChildProcess::is_running) {
            out.push("principal".to_string());
        }
        if self.principal_sidecar.ensure_running().is_err() {
            out.push("principal sidecar".to_string());
        }
        if self.istiod.ensure_running().is_err() {
            out.push("istiod".to_string());
        }
        for (name, agent) in &mut self.agents {
            if !agent.process.as_mut().is_some_and(ChildProcess::is_running) {
                out.push(format!("agent {name}"));
            }
            if agent.sidecar.ensure_running().is_err() {
                out.push(format!("agent {name}'s sidecar"));
            }
        }
        out
    }

    /// The recent logs of the principal, the agents and the sidecars, for failure messages.
    #[must_use]
    pub fn logs(&self) -> String {
        let mut out = String::new();
        if let Some(p) = &self.principal {
            out.push_str(&format!("--- principal\n{}\n", p.log_tail(30)));
        }
        out.push_str(&format!("--- principal sidecar\n{}\n", self.principal_sidecar.process().log_tail(20)));
        for (name, agent) in &self.agents {
            if let Some(p) = &agent.process {
                out.push_str(&format!("--- agent {name}\n{}\n", p.log_tail(30)));
            }
            out.push_str(&format!("--- agent {name}'s sidecar\n{}\n", agent.sidecar.process().log_tail(20)));
        }
        out
    }
}
