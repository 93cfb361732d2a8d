//! [`RealCluster`]: a real Kubernetes control plane on loopback, the way controller-runtime's
//! envtest runs one: etcd, then kube-apiserver (built from `k8s.io/kubernetes` by
//! `scripts/install-test-deps`), with serving certificates from a CA made here, an admin client
//! certificate (`system:masters`), a ServiceAccount token issuer and `--authorization-mode=RBAC`.
//!
//! A bare control plane is not a cluster: there is no kube-controller-manager (no garbage
//! collector, no namespace controller: a deleted namespace stays `Terminating`), no scheduler
//! and no kubelet. Tests here only rely on what the API server itself does.
//!
//! Argo CD's own CRDs (v3.5.1 and v3.6.1, [`ArgoCdRelease`]) are installed from
//! `../shared/data/argocd-crds-v<version>/` at run time ([`RealCluster::install_argocd_crds_of`]);
//! our least-privilege RBAC from `install/rbac/`
//! ([`RealCluster::apply_file`]), and [`RealCluster::service_account_kubeconfig`] mints a
//! ServiceAccount token (TokenRequest) for the principal or an agent to run with.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use base64::Engine as _;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};
use serde_json::json;
use tempfile::TempDir;

use crate::apiserver::client_from_kubeconfig;
use crate::bin_path::{venv_tool, workspace_root};
use crate::kubectl::Kubectl;
use crate::process::ChildProcess;
use crate::wait::Poller;

/// How long etcd and kube-apiserver may take to become ready on two busy cores.
const START: Duration = Duration::from_secs(90);

/// Where Argo CD's CRDs are read from (never copied into this repository): a directory holding
/// one `argocd-crds-v<version>/` directory per [`ArgoCdRelease`].
pub const ARGOCD_CRDS_DIR_ENV: &str = "ARGOCD_CRDS_DIR";

/// An Argo CD release whose CRDs the real-control-plane tests install. Both are tested:
/// the differential conformance suite runs once per release, and the topologies pick one
/// ([`crate::topology::StartOptions::argocd`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ArgoCdRelease {
    /// v3.5.1, the release the suite's real Argo CD binaries are built from.
    #[default]
    V3_5_1,
    /// v3.6.1, the newest line.
    V3_6_1,
}

impl ArgoCdRelease {
    /// Every release tested, oldest first.
    pub const ALL: [Self; 2] = [Self::V3_5_1, Self::V3_6_1];

    /// `3.5.1`, `3.6.1`.
    #[must_use]
    pub const fn version(self) -> &'static str {
        match self {
            Self::V3_5_1 => "3.5.1",
            Self::V3_6_1 => "3.6.1",
        }
    }
}

/// Argo CD v3.5.1's CRDs ([`argocd_crds_dir_of`] the default release).
///
/// # Errors
/// As [`argocd_crds_dir_of`].
pub fn argocd_crds_dir() -> anyhow::Result<PathBuf> {
    argocd_crds_dir_of(ArgoCdRelease::default())
}

/// The CRDs of `release`: `argocd-crds-v<version>` in `$ARGOCD_CRDS_DIR`, else in
/// `shared/data/` of the nearest directory above the workspace that has it
/// (`../shared/data/...` for a clone beside the shared data).
///
/// # Errors
/// The directory does not exist (the message says where it was looked for).
pub fn argocd_crds_dir_of(release: ArgoCdRelease) -> anyhow::Result<PathBuf> {
    let name = format!("argocd-crds-v{}", release.version());
    if let Some(dir) = std::env::var_os(ARGOCD_CRDS_DIR_ENV) {
        let dir = PathBuf::from(dir).join(&name);
        if !dir.is_dir() {
            bail!("{} is not a directory ({ARGOCD_CRDS_DIR_ENV} must hold {name}/)", dir.display());
        }
        return Ok(dir);
    }
    let root = workspace_root();
    let tail = Path::new("shared").join("data").join(&name);
    root.ancestors().skip(1).map(|a| a.join(&tail)).find(|d| d.is_dir()).with_context(|| {
        format!(
            "Argo CD v{}'s CRDs are not in {} or any directory above it (set {ARGOCD_CRDS_DIR_ENV} to the directory holding {name}/)",
            release.version(),
            root.join("..").join(&tail).display()
        )
    })
}

/// A free loopback port (bound and released; a start that loses the race is retried).
pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("cannot bind a loopback port")?.local_addr()?.port())
}

/// The PKI of one control plane, written as PEM files under `dir`.
#[derive(Debug, Clone)]
struct Pki {
    ca_crt: PathBuf,
    serving_crt: PathBuf,
    serving_key: PathBuf,
    admin_crt: PathBuf,
    admin_key: PathBuf,
    sa_key: PathBuf,
    sa_pub: PathBuf,
}

impl Pki {
    fn create(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let ca = crate::pki::Ca::generate("realkube test CA")?;
        let serving = ca.server("kube-apiserver", &["127.0.0.1", "localhost", "kubernetes"], &[])?;
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name.push(DnType::CommonName, "realkube-admin");
        admin.distinguished_name.push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin = ca.issue(admin)?;

        let sa_key = KeyPair::generate()?;

        let pki = Self {
            ca_crt: dir.join("ca.crt"),
            serving_crt: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            admin_crt: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
        };
        std::fs::write(&pki.ca_crt, &ca.pem)?;
        std::fs::write(&pki.serving_crt, &serving.cert)?;
        std::fs::write(&pki.serving_key, &serving.key)?;
        std::fs::write(&pki.admin_crt, &admin.cert)?;
        std::fs::write(&pki.admin_key, &admin.key)?;
        std::fs::write(&pki.sa_key, sa_key.serialize_pem())?;
        std::fs::write(&pki.sa_pub, sa_key.public_key_pem())?;
        Ok(pki)
    }
}

/// Knobs of a [`RealCluster`].
#[derive(Debug, Clone, Default)]
pub struct RealClusterOptions {
    /// Extra kube-apiserver flags (e.g. a shorter `--watch-cache-sizes` or
    /// `--etcd-compaction-interval`).
    pub apiserver_args: Vec<String>,
}

/// etcd and kube-apiserver on loopback; both stopped on drop (the API server first).
pub struct RealCluster {
    // Dropped in this order: the API server, then etcd, then the directory.
    apiserver: ChildProcess,
    etcd: ChildProcess,
    launch: Launch,
    url: String,
    kubeconfig: PathBuf,
    ca_pem: String,
    dir: TempDir,
}

impl std::fmt::Debug for RealCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealCluster")
            .field("url", &self.url)
            .field("apiserver", &self.apiserver.pid())
            .field("etcd", &self.etcd.pid())
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl RealCluster {
    /// Start etcd and kube-apiserver, wait for `/readyz`, write an admin kubeconfig.
    ///
    /// # Errors
    /// A binary is missing (run `scripts/install-test-deps`), or a process does not become ready
    /// in time (the error has its log tail).
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(RealClusterOptions::default()).await
    }

    /// [`Self::start`] with options.
    ///
    /// # Errors
    /// As [`Self::start`].
    pub async fn start_with(options: RealClusterOptions) -> anyhow::Result<Self> {
        let etcd_bin = venv_tool("etcd")?;
        let apiserver_bin = venv_tool("kube-apiserver")?;
        let dir = tempfile::Builder::new().prefix("realkube-").tempdir().context("cannot create a temp dir")?;
        let pki = Pki::create(&dir.path().join("pki"))?;
        let ca_pem = std::fs::read_to_string(&pki.ca_crt)?;

        // A port taken between picking and binding is retried with new ports.
        let mut last_error = None;
        for attempt in 1..=3 {
            let etcd = match start_etcd(&etcd_bin, dir.path(), attempt).await {
                Ok(etcd) => etcd,
                Err(e) => {
                    last_error = Some(e);
                    continue;
                }
            };
            let (mut etcd, etcd_url) = etcd;
            // The admin kubeconfig first: the readiness probe and the tests use the same client.
            let port = free_port()?;
            let url = format!("https://127.0.0.1:{port}");
            let kubeconfig = dir.path().join("admin.kubeconfig");
            write_kubeconfig(
                &kubeconfig,
                &url,
                &ca_pem,
                &json!({
                    "client-certificate-data": b64(&std::fs::read(&pki.admin_crt)?),
                    "client-key-data": b64(&std::fs::read(&pki.admin_key)?),
                }),
            )?;
            let (_, client) = client_from_kubeconfig(&kubeconfig).await?;
            let launch = Launch {
                bin: apiserver_bin.clone(),
                dir: dir.path().to_path_buf(),
                pki: pki.clone(),
                etcd_url,
                options: options.clone(),
                port,
                client,
                starts: attempt,
            };
            match launch.start().await {
                Ok(apiserver) => {
                    return Ok(Self { apiserver, etcd, launch, url, kubeconfig, ca_pem, dir });
                }
                Err(e) => {
                    etcd.sigkill().ok();
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("the control plane did not start")))
    }

    /// `https://127.0.0.1:PORT`.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The admin (`system:masters`) kubeconfig.
    #[must_use]
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The admin client.
    #[must_use]
    pub fn client(&self) -> kube::Client {
        self.launch.client.clone()
    }

    /// A scratch directory living as long as the cluster.
    #[must_use]
    pub fn work_dir(&self) -> &Path {
        self.dir.path()
    }

    /// kubectl as admin.
    ///
    /// # Errors
    /// kubectl is not installed (run `scripts/install-test-deps`).
    pub fn kubectl(&self) -> anyhow::Result<Kubectl> {
        Kubectl::new(&self.kubeconfig)
    }

    /// The kube-apiserver process (logs, signals).
    #[must_use]
    pub fn apiserver_process(&self) -> &ChildProcess {
        &self.apiserver
    }

    /// The etcd process.
    #[must_use]
    pub fn etcd_process(&self) -> &ChildProcess {
        &self.etcd
    }

    /// `kubectl apply --server-side` of a file or directory, as admin.
    ///
    /// # Errors
    /// kubectl fails (its stderr is in the error).
    pub fn apply_file(&self, path: &Path) -> anyhow::Result<()> {
        let out = Command::new(crate::bin_path::kubectl_path()?)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["apply", "--server-side", "--force-conflicts", "-f"])
            .arg(path)
            .output()
            .context("cannot run kubectl")?;
        if !out.status.success() {
            bail!("kubectl apply -f {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// Install Argo CD v3.5.1's own CRDs and wait until each is `Established`.
    ///
    /// # Errors
    /// As [`Self::install_argocd_crds_of`].
    pub async fn install_argocd_crds(&self) -> anyhow::Result<()> {
        self.install_argocd_crds_of(ArgoCdRelease::default()).await
    }

    /// Install the CRDs of `release` ([`argocd_crds_dir_of`]) and wait until each is
    /// `Established` and served.
    ///
    /// # Errors
    /// The CRDs are missing, rejected, or not established in time.
    pub async fn install_argocd_crds_of(&self, release: ArgoCdRelease) -> anyhow::Result<()> {
        let dir = argocd_crds_dir_of(release)?;
        self.apply_file(&dir)?;
        let crds: kube::Api<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        > = kube::Api::all(self.client());
        for name in ["applications.argoproj.io", "appprojects.argoproj.io"] {
            let mut poll = Poller::new(START, format!("CRD {name} to be Established"));
            loop {
                let established = crds.get_opt(name).await?.and_then(|c| c.status).is_some_and(|s| {
                    s.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Established" && c.status == "True")
                });
                if established {
                    break;
                }
                poll.tick().await?;
            }
        }
        // Discovery catches up a little after Established: wait until the resources are served.
        let mut poll = Poller::new(START, "argoproj.io/v1alpha1 to be served");
        loop {
            let req = http::Request::get("/apis/argoproj.io/v1alpha1").body(Vec::new())?;
            if let Ok(text) = self.launch.client.request_text(req).await
                && text.contains("\"applications\"")
                && text.contains("\"appprojects\"")
            {
                break;
            }
            poll.tick().await?;
        }
        Ok(())
    }

    /// Create namespace `name` unless it exists.
    ///
    /// # Errors
    /// The API server refuses.
    pub async fn ensure_namespace(&self, name: &str) -> anyhow::Result<()> {
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(self.client());
        if api.get_opt(name).await?.is_none() {
            api.create(
                &kube::api::PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}}))?,
            )
            .await?;
        }
        Ok(())
    }

    /// A kubeconfig at `out` that authenticates as ServiceAccount `namespace/name` with a token
    /// from the TokenRequest API (valid `ttl`), as a pod's projected token would. The
    /// ServiceAccount must exist (e.g. from the RBAC manifests).
    ///
    /// # Errors
    /// The TokenRequest is refused, or the file cannot be written.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        ttl: Duration,
        out: &Path,
    ) -> anyhow::Result<PathBuf> {
        let token = self.service_account_token(namespace, name, ttl).await?;
        write_kubeconfig(out, &self.url, &self.ca_pem, &json!({ "token": token }))?;
        Ok(out.to_path_buf())
    }

    /// A token for ServiceAccount `namespace/name` from the TokenRequest API.
    ///
    /// # Errors
    /// The request is refused or the answer has no token.
    pub async fn service_account_token(&self, namespace: &str, name: &str, ttl: Duration) -> anyhow::Result<String> {
        self.service_account_token_for(namespace, name, ttl, &[]).await
    }

    /// [`Self::service_account_token`] for `audiences` (none: the API server's own).
    ///
    /// # Errors
    /// As [`Self::service_account_token`].
    pub(crate) async fn service_account_token_for(
        &self,
        namespace: &str,
        name: &str,
        ttl: Duration,
        audiences: &[&str],
    ) -> anyhow::Result<String> {
        let mut body = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": ttl.as_secs()},
        });
        if !audiences.is_empty() {
            body["spec"]["audiences"] = json!(audiences);
        }
        let req = http::Request::post(format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body)?)?;
        let answer: serde_json::Value = self
            .launch
            .client
            .request(req)
            .await
            .with_context(|| format!("TokenRequest for ServiceAccount {namespace}/{name}"))?;
        answer["status"]["token"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("TokenRequest for {namespace}/{name} answered without a token: {answer}"))
    }

    /// SIGKILL kube-apiserver (etcd keeps the state), e.g. to start it again with
    /// [`Self::restart_apiserver`].
    ///
    /// # Errors
    /// Killing failed.
    pub fn kill_apiserver(&mut self) -> anyhow::Result<()> {
        self.apiserver.sigkill()?;
        Ok(())
    }

    /// Start kube-apiserver again after [`Self::kill_apiserver`], on the same port and etcd,
    /// and wait for `/readyz`. Every credential stays valid.
    ///
    /// # Errors
    /// It still runs, or the new process is not ready in time.
    pub async fn restart_apiserver(&mut self) -> anyhow::Result<()> {
        if self.apiserver.is_running() {
            bail!("kube-apiserver pid {} still runs; kill it first", self.apiserver.pid());
        }
        self.launch.starts += 1;
        self.apiserver = self.launch.start().await?;
        Ok(())
    }

    /// Whether both etcd and kube-apiserver run.
    pub fn is_running(&mut self) -> bool {
        self.apiserver.is_running() && self.etcd.is_running()
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn write_kubeconfig(path: &Path, url: &str, ca_pem: &str, user: &serde_json::Value) -> anyhow::Result<()> {
    let kc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "realkube", "cluster": {"server": url, "certificate-authority-data": b64(ca_pem.as_bytes())}}],
        "users": [{"name": "realkube", "user": user}],
        "contexts": [{"name": "realkube", "context": {"cluster": "realkube", "user": "realkube"}}],
        "current-context": "realkube",
    });
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, serde_yaml::to_string(&kc)?).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

async fn start_etcd(bin: &Path, dir: &Path, attempt: u32) -> anyhow::Result<(ChildProcess, String)> {
    let (client_port, peer_port) = (free_port()?, free_port()?);
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let data = dir.join(format!("etcd-{attempt}"));
    let mut cmd = Command::new(bin);
    cmd.arg("--data-dir")
        .arg(&data)
        .args(["--name", "realkube"])
        .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("realkube={peer_url}")])
        // As envtest: tests do not need etcd to survive a power cut.
        .arg("--unsafe-no-fsync")
        .args(["--log-level", "warn"]);
    let mut etcd = ChildProcess::spawn(&format!("etcd#{attempt}"), cmd)?;
    let ready = async {
        let mut poll = Poller::new(START, "etcd to answer /health");
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, client_port));
        loop {
            etcd.ensure_running()?;
            if let Ok((200, body)) = crate::http::get(addr, "/health").await
                && body.contains("\"health\":\"true\"")
            {
                return anyhow::Ok(());
            }
            poll.tick().await?;
        }
    }
    .await;
    match ready {
        Ok(()) => Ok((etcd, client_url)),
        Err(e) => Err(e.context(format!("etcd did not start\n{}", etcd.log_tail(30)))),
    }
}

/// How kube-apiserver is started, kept to start it again on the same port.
struct Launch {
    bin: PathBuf,
    dir: PathBuf,
    pki: Pki,
    etcd_url: String,
    options: RealClusterOptions,
    port: u16,
    /// The admin client of this port (the readiness probe's and the tests').
    client: kube::Client,
    starts: u32,
}

impl Launch {
    async fn start(&self) -> anyhow::Result<ChildProcess> {
        let (pki, port) = (&self.pki, self.port);
        let issuer = format!("https://127.0.0.1:{port}");
        let mut cmd = Command::new(&self.bin);
        cmd.args(["--etcd-servers", &self.etcd_url])
            .args(["--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1"])
            // The `kubernetes` Service's endpoints may not be a loopback address; nothing here
            // reaches the API server through that Service (as envtest).
            .args(["--endpoint-reconciler-type", "none"])
            .args(["--secure-port", &port.to_string()])
            .arg("--cert-dir")
            .arg(self.dir.join("apiserver-certs"))
            .arg(format!("--tls-cert-file={}", pki.serving_crt.display()))
            .arg(format!("--tls-private-key-file={}", pki.serving_key.display()))
            .arg(format!("--client-ca-file={}", pki.ca_crt.display()))
            .args(["--service-cluster-ip-range", "10.0.0.0/24"])
            .args(["--service-account-issuer", &issuer])
            .arg(format!("--service-account-key-file={}", pki.sa_pub.display()))
            .arg(format!("--service-account-signing-key-file={}", pki.sa_key.display()))
            .args(["--authorization-mode", "RBAC"])
            .arg("--allow-privileged=true")
            .args(&self.options.apiserver_args);
        let mut apiserver = ChildProcess::spawn(&format!("kube-apiserver#{}", self.starts), cmd)?;
        match wait_readyz(&mut apiserver, &self.client).await {
            Ok(()) => Ok(apiserver),
            Err(e) => Err(e.context(format!("kube-apiserver did not become ready\n{}", apiserver.log_tail(40)))),
        }
    }
}

/// Polls `/readyz` with the admin client until it answers `ok`.
async fn wait_readyz(process: &mut ChildProcess, client: &kube::Client) -> anyhow::Result<()> {
    let mut poll = Poller::new(START, format!("{} to answer /readyz", process.name()));
    loop {
        process.ensure_running()?;
        let req = http::Request::get("/readyz").body(Vec::new())?;
        let last = match tokio::time::timeout(Duration::from_secs(5), client.request_text(req)).await {
            Ok(Ok(text)) if text.trim() == "ok" => return Ok(()),
            Ok(Ok(text)) => text,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        poll.tick().await.with_context(|| format!("/readyz: {last}"))?;
    }
}
