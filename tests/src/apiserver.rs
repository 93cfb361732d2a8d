//! [`ApiServerProcess`]: `argocd-agent apiserver` as a child process.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tempfile::TempDir;

use crate::bin_path::workspace_binary;
use crate::kubectl::Kubectl;
use crate::process::ChildProcess;
use crate::wait::{DEFAULT_TIMEOUT, Poller};

/// What the server prints on stdout once it is listening, followed by its URL.
pub const LISTENING_MESSAGE: &str = "embedded API server listening on ";

/// A running `argocd-agent apiserver --listen 127.0.0.1:0`, ready to serve (kubeconfig written,
/// `/readyz` answered). Killed on drop. Its data dir is a temp dir it owns, or one the test gives
/// (to restart on, or to share with a second process).
pub struct ApiServerProcess {
    // Dropped first: the process stops before its directories are removed.
    process: ChildProcess,
    client: kube::Client,
    url: String,
    data_dir: PathBuf,
    kubeconfig: PathBuf,
    starts: u32,
    /// Flags added to every start (e.g. `--simulate-pods`).
    extra_args: Vec<String>,
    work: TempDir,
}

impl std::fmt::Debug for ApiServerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServerProcess")
            .field("process", &self.process)
            .field("url", &self.url)
            .field("data_dir", &self.data_dir)
            .field("kubeconfig", &self.kubeconfig)
            .field("starts", &self.starts)
            .finish_non_exhaustive()
    }
}

impl ApiServerProcess {
    /// The command line of a server on `data_dir`, free loopback port, writing `kubeconfig_out`.
    /// For tests that need the raw process (e.g. one expected to fail).
    ///
    /// # Errors
    /// `argocd-agent` has not been built.
    pub fn command(data_dir: &Path, kubeconfig_out: &Path) -> anyhow::Result<Command> {
        let mut cmd = Command::new(workspace_binary("argocd-agent")?);
        cmd.arg("apiserver")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--kubeconfig-out")
            .arg(kubeconfig_out)
            .arg("--log-format")
            .arg("text")
            // Plain log files (tracing-subscriber honours NO_COLOR).
            .env("NO_COLOR", "1");
        Ok(cmd)
    }

    /// Start a server on a fresh data dir (removed when this is dropped).
    ///
    /// # Errors
    /// It cannot be spawned or is not ready within [`DEFAULT_TIMEOUT`] (the error has its log tail).
    pub async fn start() -> anyhow::Result<Self> {
        let work = new_work_dir()?;
        let data_dir = work.path().join("data");
        Self::start_in(work, data_dir).await
    }

    /// Start a server on `data_dir` (created if missing; kept when this is dropped).
    ///
    /// # Errors
    /// It cannot be spawned or is not ready within [`DEFAULT_TIMEOUT`] (the error has its log tail).
    pub async fn start_on(data_dir: impl Into<PathBuf>) -> anyhow::Result<Self> {
        Self::start_in(new_work_dir()?, data_dir.into()).await
    }

    /// Start a server on a fresh data dir with extra flags (kept for restarts), e.g.
    /// `["--simulate-pods"]`.
    ///
    /// # Errors
    /// It cannot be spawned or is not ready within [`DEFAULT_TIMEOUT`] (the error has its log tail).
    pub async fn start_with(args: &[&str]) -> anyhow::Result<Self> {
        let work = new_work_dir()?;
        let data_dir = work.path().join("data");
        Self::start_in_with(work, data_dir, args.iter().map(|a| (*a).to_string()).collect()).await
    }

    /// Start a server on a fresh data dir with the simulated node on (`--simulate-pods`): Pods'
    /// commands run as local processes, `kubectl logs` and `kubectl exec` work. Dropping it
    /// stops the server with SIGTERM first, so those processes go with it.
    ///
    /// # Errors
    /// It cannot be spawned or is not ready within [`DEFAULT_TIMEOUT`] (the error has its log tail).
    pub async fn start_simulating_pods() -> anyhow::Result<Self> {
        Self::start_with(&["--simulate-pods"]).await
    }

    async fn start_in(work: TempDir, data_dir: PathBuf) -> anyhow::Result<Self> {
        Self::start_in_with(work, data_dir, Vec::new()).await
    }

    async fn start_in_with(work: TempDir, data_dir: PathBuf, extra_args: Vec<String>) -> anyhow::Result<Self> {
        let kubeconfig = work.path().join("kubeconfig");
        let (process, url, client) = launch(&data_dir, &kubeconfig, 1, &extra_args).await?;
        Ok(Self { process, client, url, data_dir, kubeconfig, starts: 1, extra_args, work })
    }

    /// `https://127.0.0.1:PORT` of the current process (the port changes on restart).
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The kubeconfig the server wrote. Same path across restarts (rewritten by each start), so
    /// a [`Kubectl`] made from it keeps working after a restart.
    #[must_use]
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The data dir (the server's only state).
    #[must_use]
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// A scratch dir living as long as this server (for manifests, second kubeconfigs, ...).
    #[must_use]
    pub fn work_dir(&self) -> &Path {
        self.work.path()
    }

    /// A client built from the kubeconfig of the current process (shares its connection pool).
    #[must_use]
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A client with its own connection pool, built from the kubeconfig file.
    ///
    /// # Errors
    /// The kubeconfig cannot be read or turned into a client.
    pub async fn new_client(&self) -> anyhow::Result<kube::Client> {
        Ok(client_from_kubeconfig(&self.kubeconfig).await?.1)
    }

    /// kubectl pointed at this server.
    ///
    /// # Errors
    /// kubectl is not installed (run `scripts/install-test-deps`).
    pub fn kubectl(&self) -> anyhow::Result<Kubectl> {
        Kubectl::new(&self.kubeconfig)
    }

    /// The process (pid, signals, logs).
    #[must_use]
    pub fn process(&self) -> &ChildProcess {
        &self.process
    }

    /// The process, mutably (to signal it or wait on it).
    pub fn process_mut(&mut self) -> &mut ChildProcess {
        &mut self.process
    }

    /// SIGKILL the process (no shutdown at all: a crash).
    ///
    /// # Errors
    /// Killing failed.
    pub fn sigkill(&mut self) -> anyhow::Result<ExitStatus> {
        self.process.sigkill()
    }

    /// SIGTERM and require a clean exit (status 0) within [`DEFAULT_TIMEOUT`].
    ///
    /// # Errors
    /// It did not exit in time, or exited non-zero.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let status = self.process.sigterm_and_wait_async(DEFAULT_TIMEOUT).await?;
        if !status.success() {
            bail!("apiserver exited with {status} after SIGTERM, expected 0\n{}", self.process.log_tail(40));
        }
        Ok(())
    }

    /// Stop the process if it still runs (SIGTERM, clean exit required), then start a new one on
    /// the same data dir and wait until it is ready. URL and client change; the kubeconfig path
    /// does not.
    ///
    /// # Errors
    /// The old process did not stop cleanly, or the new one is not ready in time.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if self.process.is_running() {
            self.stop().await?;
        }
        self.start_again().await
    }

    /// Start a new process on the same data dir after the previous one exited (e.g. after
    /// [`Self::sigkill`]). Fails if the previous one still runs.
    ///
    /// # Errors
    /// The previous process still runs, or the new one is not ready in time.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        if self.process.is_running() {
            bail!("apiserver pid {} still runs; stop or kill it first", self.process.pid());
        }
        self.starts += 1;
        let (process, url, client) = launch(&self.data_dir, &self.kubeconfig, self.starts, &self.extra_args).await?;
        self.process = process;
        self.url = url;
        self.client = client;
        Ok(())
    }
}

impl Drop for ApiServerProcess {
    fn drop(&mut self) {
        // A server with the simulated node has children in their own process groups: a SIGKILL
        // (the process's own drop) would leave them running, so ask it to stop them first.
        if self.extra_args.iter().any(|a| a == "--simulate-pods")
            && self.process.is_running()
            && self.process.signal("TERM").is_ok()
        {
            let _ = self.process.wait_exit(DEFAULT_TIMEOUT);
        }
    }
}

fn new_work_dir() -> anyhow::Result<TempDir> {
    tempfile::Builder::new().prefix("apiserver-").tempdir().context("cannot create a temp dir")
}

/// Spawn a server and wait until it is ready: kubeconfig written, `/readyz` answered, URL printed.
async fn launch(
    data_dir: &Path,
    kubeconfig: &Path,
    start: u32,
    extra_args: &[String],
) -> anyhow::Result<(ChildProcess, String, kube::Client)> {
    // A kubeconfig left by an earlier process would make us talk to a dead port.
    match std::fs::remove_file(kubeconfig) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove stale {}", kubeconfig.display())),
    }
    let mut cmd = ApiServerProcess::command(data_dir, kubeconfig)?;
    cmd.args(extra_args);
    let mut process = ChildProcess::spawn(&format!("apiserver#{start}"), cmd)?;
    let ready = wait_ready(&mut process, kubeconfig).await;
    match ready {
        Ok((url, client)) => Ok((process, url, client)),
        Err(e) => {
            let tail = process.log_tail(40);
            Err(e.context(format!("apiserver on {} did not become ready\n{tail}", data_dir.display())))
        }
    }
}

async fn wait_ready(process: &mut ChildProcess, kubeconfig: &Path) -> anyhow::Result<(String, kube::Client)> {
    let mut poll = Poller::new(DEFAULT_TIMEOUT, format!("{} to be ready", process.name()));
    // 1. The kubeconfig appears (written atomically, only once listening).
    while !kubeconfig.exists() {
        process.ensure_running()?;
        poll.tick().await.with_context(|| format!("no kubeconfig at {}", kubeconfig.display()))?;
    }
    let (url, client) = client_from_kubeconfig(kubeconfig).await?;
    // 2. /readyz answers over TLS with the bearer token.
    loop {
        process.ensure_running()?;
        let req = http::Request::get("/readyz").body(Vec::new()).context("cannot build a /readyz request")?;
        let last_error = match tokio::time::timeout(Duration::from_secs(5), client.request_text(req)).await {
            Ok(Ok(_)) => break,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "GET /readyz timed out".to_string(),
        };
        poll.tick().await.with_context(|| format!("/readyz on {url}: {last_error}"))?;
    }
    // 3. The URL is announced on stdout (printed after the kubeconfig is written).
    let line = format!("{LISTENING_MESSAGE}{url}");
    while !process.stdout().lines().any(|l| l.trim() == line) {
        process.ensure_running()?;
        poll.tick().await.with_context(|| format!("stdout never said {line:?}"))?;
    }
    Ok((url, client))
}

/// Read a kubeconfig and build a client from it; also returns its server URL.
///
/// # Errors
/// The file cannot be read or parsed, or has no server URL.
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<(String, kube::Client)> {
    let kc = kube::config::Kubeconfig::read_from(path).with_context(|| format!("cannot read {}", path.display()))?;
    let url = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .with_context(|| format!("{} has no cluster server URL", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("cannot load {}", path.display()))?;
    let client = kube::Client::try_from(config).context("cannot build a kube client")?;
    Ok((url, client))
}
