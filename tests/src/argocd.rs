//! Real Argo CD around a [`crate::topology::Topology`]: its components as processes on loopback,
//! built from Argo CD's Go module by `scripts/install-test-deps` (`tests/tools/argocd/`, one
//! `argocd` binary that runs as `argocd-server`, `argocd-application-controller` or
//! `argocd-repo-server` by the name it is started under), a real `redis-server` per cluster, a
//! git repository served by `git daemon`, the settings Argo CD reads (`argocd-cm`,
//! `argocd-secret`), the argocd CLI, and Argo CD's REST API for what the CLI has no command for.
//!
//! Everything listens on 127.0.0.1 on a free port; every process is a [`ChildProcess`], stopped
//! when dropped. A missing binary fails with the command that builds it.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::bin_path::workspace_root;
use crate::process::ChildProcess;
use crate::realkube::free_port;
use crate::wait::Poller;

/// The Argo CD release `scripts/install-test-deps` builds (`tests/tools/argocd/go.mod`).
pub const ARGOCD_VERSION: &str = "v3.5.1";

/// How long an Argo CD component may take to listen on two busy cores.
const START: Duration = Duration::from_secs(90);

/// How long one argocd CLI call may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(90);

/// The Argo CD binary `name` (`argocd`, `argocd-server`, `argocd-application-controller`,
/// `argocd-repo-server`) from the test venv.
///
/// # Errors
/// It is missing: the message names `scripts/install-test-deps`, which builds it.
pub fn argocd_binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = workspace_root().join(".venv").join("bin").join(name);
    if path.is_file() {
        return Ok(path);
    }
    bail!(
        "Argo CD {ARGOCD_VERSION}'s `{name}` is missing at {}: run scripts/install-test-deps (it builds Argo CD from tests/tools/argocd/go.mod)",
        path.display()
    )
}

/// Fails unless every tool the Argo CD tests start is installed: the Argo CD binaries,
/// `redis-server` and `git`.
///
/// # Errors
/// The first missing one, with what installs it.
pub fn require_tools() -> anyhow::Result<()> {
    for name in ["argocd", "argocd-server", "argocd-application-controller", "argocd-repo-server"] {
        argocd_binary(name)?;
    }
    for (tool, package) in [("redis-server", "redis-server"), ("git", "git")] {
        let found = Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
        ensure!(found, "`{tool}` is missing (Debian package {package}): run scripts/install-test-deps");
    }
    Ok(())
}

/// Starts a process that listens on a port it is given, retrying with another free port when
/// it exits before listening (a port taken between picking and binding).
async fn start_listening(
    name: &str,
    mut command: impl FnMut(u16) -> anyhow::Result<Command>,
) -> anyhow::Result<(ChildProcess, u16)> {
    let mut last = None;
    for attempt in 1..=3 {
        let port = free_port()?;
        let mut process = ChildProcess::spawn(&format!("{name}#{attempt}"), command(port)?)?;
        let mut poll = Poller::new(START, format!("{name} to listen on 127.0.0.1:{port}"));
        loop {
            if !process.is_running() {
                last = Some(anyhow::anyhow!("{name} exited before listening\n{}", process.log_tail(30)));
                break;
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return Ok((process, port));
            }
            if let Err(e) = poll.tick().await {
                return Err(e.context(process.log_tail(30)));
            }
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("{name} did not start")))
}

/// One `redis-server` on a free loopback port, saving nothing.
#[derive(Debug)]
pub struct Redis {
    process: ChildProcess,
    port: u16,
}

impl Redis {
    /// Starts one and waits until it accepts connections.
    ///
    /// # Errors
    /// redis-server is missing or does not start.
    pub async fn start(name: &str) -> anyhow::Result<Self> {
        let (process, port) = start_listening(name, |port| {
            let mut cmd = Command::new("redis-server");
            cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"]);
            Ok(cmd)
        })
        .await
        .context("redis-server (Debian package redis-server, installed by scripts/install-test-deps)")?;
        Ok(Self { process, port })
    }

    /// `127.0.0.1:PORT`.
    #[must_use]
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The process (logs).
    #[must_use]
    pub fn process(&self) -> &ChildProcess {
        &self.process
    }

    /// The channels someone is subscribed to (`PUBSUB CHANNELS`, by `redis-cli`).
    ///
    /// # Errors
    /// redis-cli is missing or fails.
    pub fn channels(&self) -> anyhow::Result<Vec<String>> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "PUBSUB", "CHANNELS"])
            .output()
            .context("redis-cli is missing (Debian package redis-tools)")?;
        ensure!(out.status.success(), "redis-cli PUBSUB CHANNELS: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect())
    }
}

/// Runs `git` in `dir` with a private configuration; its stdout.
fn git(dir: &Path, home: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .current_dir(dir)
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args([
            "-c",
            "user.name=argocd-e2e",
            "-c",
            "user.email=argocd-e2e@example.invalid",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .context("cannot run git (Debian package git)")?;
    ensure!(out.status.success(), "git {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A git repository served read-only by `git daemon` on loopback (`git://127.0.0.1:PORT/repo.git`),
/// with a working copy to commit to.
#[derive(Debug)]
pub struct GitServer {
    daemon: ChildProcess,
    port: u16,
    work: PathBuf,
    dir: TempDir,
}

impl GitServer {
    /// A repository whose first commit on `main` holds `files` (`(path, content)`), served on a
    /// free port.
    ///
    /// # Errors
    /// git fails, or the daemon does not serve the repository in time.
    pub async fn start(files: &[(&str, &str)]) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("argocd-git-").tempdir()?;
        let (root, work, home) = (dir.path().join("srv"), dir.path().join("work"), dir.path().join("home"));
        for d in [&root, &work, &home] {
            std::fs::create_dir_all(d)?;
        }
        git(&root, &home, &["init", "--bare", "repo.git"])?;
        git(&work, &home, &["init"])?;
        let bare = root.join("repo.git").display().to_string();
        git(&work, &home, &["remote", "add", "origin", &bare])?;
        let root_arg = root.display().to_string();
        // `git daemon` runs `git-daemon` as a child that outlives a kill of its parent: run the
        // server itself, so stopping the test stops it.
        let daemon_bin = PathBuf::from(git(&work, &home, &["--exec-path"])?.trim()).join("git-daemon");
        anyhow::ensure!(daemon_bin.is_file(), "git has no git-daemon at {} (Debian package git)", daemon_bin.display());
        let (daemon, port) = start_listening("git-daemon", |port| {
            let mut cmd = Command::new(&daemon_bin);
            cmd.env("HOME", &home)
                .args(["--reuseaddr", "--listen=127.0.0.1", "--export-all", "--informative-errors"])
                .arg(format!("--port={port}"))
                .arg(format!("--base-path={root_arg}"))
                .arg(&root_arg);
            Ok(cmd)
        })
        .await?;
        let server = Self { daemon, port, work, dir };
        server.commit(files, "first")?;
        Ok(server)
    }

    /// `git://127.0.0.1:PORT/repo.git`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("git://127.0.0.1:{}/repo.git", self.port)
    }

    /// Writes `files` into the working copy, commits them and pushes `main`; the new commit's SHA.
    ///
    /// # Errors
    /// git fails.
    pub fn commit(&self, files: &[(&str, &str)], message: &str) -> anyhow::Result<String> {
        let home = self.dir.path().join("home");
        for (path, content) in files {
            let path = self.work.join(path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, content)?;
        }
        git(&self.work, &home, &["add", "-A"])?;
        git(&self.work, &home, &["commit", "-q", "-m", message])?;
        git(&self.work, &home, &["push", "-q", "origin", "HEAD:refs/heads/main"])?;
        git(&self.work, &home, &["rev-parse", "HEAD"])
    }

    /// The daemon process (logs).
    #[must_use]
    pub fn process(&self) -> &ChildProcess {
        &self.daemon
    }
}

/// What every Argo CD settings object carries: Argo CD's settings manager watches only objects
/// labelled `app.kubernetes.io/part-of: argocd`.
fn part_of_argocd() -> Value {
    json!({"app.kubernetes.io/part-of": "argocd"})
}

/// Writes `argocd-cm` (with `cm_data`) and `argocd-secret` (a fresh `server.secretkey`, and the
/// admin password's bcrypt hash when given) into namespace `ns`.
///
/// # Errors
/// The API server refuses.
pub async fn install_settings(
    client: &kube::Client,
    ns: &str,
    cm_data: &Value,
    admin_password_bcrypt: Option<&str>,
) -> anyhow::Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = json!({"metadata": {"name": "argocd-cm", "labels": part_of_argocd()}, "data": cm_data});
    cms.create(&PostParams::default(), &serde_json::from_value(cm)?).await.context("argocd-cm")?;
    let key: String = random_bytes::<32>()?.iter().map(|b| format!("{b:02x}")).collect();
    let mut data = json!({"server.secretkey": key});
    if let Some(hash) = admin_password_bcrypt {
        data["admin.password"] = json!(hash);
        data["admin.passwordMtime"] = json!(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    }
    let secret = json!({"metadata": {"name": "argocd-secret", "labels": part_of_argocd()}, "stringData": data});
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &serde_json::from_value(secret)?)
        .await
        .context("argocd-secret")?;
    Ok(())
}

/// `N` bytes from the kernel's randomness (for `server.secretkey`, which signs session tokens).
fn random_bytes<const N: usize>() -> anyhow::Result<[u8; N]> {
    use std::io::Read as _;
    let mut out = [0u8; N];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut out)).context("/dev/urandom")?;
    Ok(out)
}

/// The scratch directory of the Argo CD processes: a `PATH` directory with
/// `git-verify-wrapper.sh` (the repo-server runs it on every revision it renders), and one
/// `TMPDIR` and `HOME` per component.
#[derive(Debug)]
pub struct Scratch {
    dir: TempDir,
}

/// Our stand-in for the `git-verify-wrapper.sh` Argo CD's images ship: it reports the signature
/// check git makes of a revision. The test repository's commits are unsigned and no GnuPG
/// keys are configured, so there is nothing to report.
const GIT_VERIFY_WRAPPER: &str = "#!/bin/sh\n# Argo CD's repo-server asks for the signature of revision $1: the test commits are unsigned.\ntest -n \"$1\" || { echo 'usage: git-verify-wrapper.sh REVISION' >&2; exit 1; }\nexit 0\n";

impl Scratch {
    /// Creates it.
    ///
    /// # Errors
    /// It cannot be written.
    pub fn new() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("argocd-e2e-").tempdir()?;
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin)?;
        let wrapper = bin.join("git-verify-wrapper.sh");
        std::fs::write(&wrapper, GIT_VERIFY_WRAPPER)?;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        Ok(Self { dir })
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A command running Argo CD's `name` with its own `TMPDIR` and `HOME` under `label`, our
    /// `bin/` first on `PATH`, GnuPG off and plain-text logs.
    fn command(&self, name: &str, label: &str) -> anyhow::Result<Command> {
        let home = self.dir.path().join(label);
        let tmp = home.join("tmp");
        std::fs::create_dir_all(&tmp)?;
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.dir.path().join("bin")];
        paths.extend(std::env::split_paths(&path));
        let mut cmd = Command::new(argocd_binary(name)?);
        cmd.env("PATH", std::env::join_paths(paths)?)
            .env("HOME", &home)
            .env("TMPDIR", &tmp)
            .env("ARGOCD_GPG_ENABLED", "false")
            .env("GIT_CONFIG_NOSYSTEM", "1");
        Ok(cmd)
    }
}

/// An Argo CD component listening on loopback.
#[derive(Debug)]
pub struct Component {
    process: ChildProcess,
    port: u16,
}

impl Component {
    /// `127.0.0.1:PORT`.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The process (logs).
    #[must_use]
    pub fn process(&self) -> &ChildProcess {
        &self.process
    }

    /// Fails with its log tail if it has exited.
    ///
    /// # Errors
    /// It is not running.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        self.process.ensure_running()
    }
}

/// `argocd-repo-server` in plaintext on loopback, caching in `redis`.
///
/// # Errors
/// The binary is missing or it does not listen in time.
pub async fn start_repo_server(scratch: &Scratch, label: &str, redis: &str) -> anyhow::Result<Component> {
    let name = format!("{label}-repo-server");
    let (process, port) = start_listening(&name, |port| {
        let mut cmd = scratch.command("argocd-repo-server", &name)?;
        cmd.args(["--address", "127.0.0.1", "--port", &port.to_string(), "--disable-tls", "--client-ca-path", ""])
            .args(["--metrics-address", "127.0.0.1", "--metrics-port", &free_port()?.to_string()])
            .args(["--redis", redis, "--loglevel", "info"]);
        Ok(cmd)
    })
    .await?;
    Ok(Component { process, port })
}

/// `argocd-application-controller` for the cluster of `kubeconfig` (its in-cluster cluster,
/// [`cluster_kubeconfig`]), namespace `argocd`, with its Redis and repo-server. It has no
/// listener of its own but its metrics, which it binds on every address: a free port.
///
/// # Errors
/// The binary is missing or it exits at once.
pub fn start_application_controller(
    scratch: &Scratch,
    label: &str,
    kubeconfig: &Path,
    redis: &str,
    repo_server: SocketAddr,
) -> anyhow::Result<ChildProcess> {
    let name = format!("{label}-application-controller");
    let mut cmd = scratch.command("argocd-application-controller", &name)?;
    in_cluster(&mut cmd, kubeconfig);
    cmd.args(["--namespace", crate::topology::ARGOCD_NS])
        .args(["--redis", redis, "--repo-server", &repo_server.to_string(), "--repo-server-plaintext"])
        .args(["--metrics-port", &free_port()?.to_string()])
        .args(["--status-processors", "2", "--operation-processors", "2", "--loglevel", "info"]);
    ChildProcess::spawn(&name, cmd)
}

/// Runs an Argo CD component as if in the cluster of `kubeconfig`: `--kubeconfig` for its own
/// clients, and Argo CD's `ARGOCD_FAKE_IN_CLUSTER` with `KUBECONFIG` for its in-cluster cluster
/// (`https://kubernetes.default.svc`), which otherwise needs a pod's service-account mount.
fn in_cluster(cmd: &mut Command, kubeconfig: &Path) {
    cmd.arg("--kubeconfig").arg(kubeconfig).env("ARGOCD_FAKE_IN_CLUSTER", "true").env("KUBECONFIG", kubeconfig);
}

/// Writes the context `context` of `kubeconfig` as the current one into `out` (Argo CD's
/// in-cluster configuration reads the current context).
///
/// # Errors
/// The file cannot be read or written.
pub fn cluster_kubeconfig(kubeconfig: &Path, context: &str, out: &Path) -> anyhow::Result<PathBuf> {
    let mut kc: Value = serde_yaml::from_str(&std::fs::read_to_string(kubeconfig)?)?;
    ensure!(
        kc["contexts"].as_array().is_some_and(|c| c.iter().any(|c| c["name"] == context)),
        "{} has no context {context}",
        kubeconfig.display()
    );
    kc["current-context"] = json!(context);
    std::fs::write(out, serde_yaml::to_string(&kc)?)?;
    Ok(out.to_path_buf())
}

/// `argocd-server` on the hub of `kubeconfig` ([`cluster_kubeconfig`]) in plaintext
/// (`--insecure`) on loopback, for the Applications of
/// namespace `argocd` and of `application_namespaces`, with `redis` (our principal's Redis
/// proxy) and the hub's repo-server; ready once `/healthz` answers.
///
/// # Errors
/// The binary is missing or it is not ready in time.
pub async fn start_server(
    scratch: &Scratch,
    kubeconfig: &Path,
    redis: &str,
    repo_server: SocketAddr,
    application_namespaces: &[&str],
) -> anyhow::Result<Component> {
    let namespaces = application_namespaces.join(",");
    let (mut process, port) = start_listening("argocd-server", |port| {
        let mut cmd = scratch.command("argocd-server", "argocd-server")?;
        in_cluster(&mut cmd, kubeconfig);
        cmd.args(["--namespace", crate::topology::ARGOCD_NS])
            .args(["--insecure", "--address", "127.0.0.1", "--port", &port.to_string()])
            .args(["--metrics-address", "127.0.0.1", "--metrics-port", &free_port()?.to_string()])
            .args(["--redis", redis, "--repo-server", &repo_server.to_string(), "--repo-server-plaintext"])
            .args(["--application-namespaces", &namespaces, "--loglevel", "info"]);
        Ok(cmd)
    })
    .await?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut poll = Poller::new(START, "argocd-server to answer /healthz");
    loop {
        process.ensure_running()?;
        if matches!(crate::http::get(addr, "/healthz").await, Ok((200, _))) {
            break;
        }
        poll.tick().await.with_context(|| process.log_tail(30))?;
    }
    Ok(Component { process, port })
}

/// The output of one argocd CLI call.
#[derive(Debug)]
pub struct CliOutput {
    /// Exit code (`-1`: killed).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl std::fmt::Display for CliOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}\n--- stdout\n{}\n--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

/// The argocd CLI with its own configuration file, logged in to one argocd-server.
#[derive(Debug)]
pub struct Cli {
    bin: PathBuf,
    config: PathBuf,
}

impl Cli {
    /// `argocd login` to `server` (plaintext) as `admin`.
    ///
    /// # Errors
    /// The binary is missing or the login fails.
    pub async fn login(scratch: &Scratch, server: SocketAddr, password: &str) -> anyhow::Result<Self> {
        let cli = Self { bin: argocd_binary("argocd")?, config: scratch.path().join("cli-config") };
        let server = server.to_string();
        cli.ok(&["login", &server, "--plaintext", "--username", "admin", "--password", password]).await?;
        Ok(cli)
    }

    /// Runs `argocd ARGS --config <ours>` (at most 90 s).
    ///
    /// # Errors
    /// It cannot be run or does not end in time.
    pub async fn run(&self, args: &[&str]) -> anyhow::Result<CliOutput> {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(args).arg("--config").arg(&self.config).kill_on_drop(true);
        let out = tokio::time::timeout(CLI_TIMEOUT, cmd.output())
            .await
            .with_context(|| format!("argocd {} did not end within {CLI_TIMEOUT:?}", args.join(" ")))?
            .context("cannot run argocd")?;
        Ok(CliOutput {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// [`Self::run`], requiring exit 0; its stdout.
    ///
    /// # Errors
    /// It fails (the error has both streams).
    pub async fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.run(args).await?;
        ensure!(out.code == 0, "argocd {}: {out}", args.join(" "));
        Ok(out.stdout)
    }

    /// [`Self::ok`] with `-o json`, parsed.
    ///
    /// # Errors
    /// It fails or does not print JSON.
    pub async fn json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let text = self.ok(&all).await?;
        serde_json::from_str(&text).with_context(|| format!("argocd {} printed no JSON: {text}", args.join(" ")))
    }
}

/// `argocd account bcrypt --password PASSWORD`: the hash `argocd-secret` holds.
///
/// # Errors
/// The binary is missing or fails.
pub fn bcrypt(password: &str) -> anyhow::Result<String> {
    let out = Command::new(argocd_binary("argocd")?).args(["account", "bcrypt", "--password", password]).output()?;
    ensure!(out.status.success(), "argocd account bcrypt: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// One request to Argo CD's REST API (HTTP/1.1, plaintext), with a bearer `token`: the status
/// and the body (chunked bodies decoded).
///
/// # Errors
/// I/O failure, a malformed answer, or no answer within 30 s.
pub async fn api(
    server: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> anyhow::Result<(u16, String)> {
    let body = body.map(serde_json::to_vec).transpose()?.unwrap_or_default();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {server}\r\nConnection: close\r\n");
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if !body.is_empty() {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let io = async {
        let mut s = tokio::net::TcpStream::connect(server).await?;
        s.write_all(head.as_bytes()).await?;
        s.write_all(&body).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        anyhow::Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(30), io).await.context("Argo CD API call timed out")??;
    parse_answer(&text)
}

fn parse_answer(text: &str) -> anyhow::Result<(u16, String)> {
    let (head, body) = text.split_once("\r\n\r\n").context("no end of HTTP headers")?;
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("no HTTP status")?;
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return Ok((status, dechunk(body)));
    }
    Ok((status, body.to_owned()))
}

/// The payload of a chunked body (as much of it as is complete).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.split(';').next().unwrap_or_default().trim(), 16) else { break };
        if size == 0 {
            break;
        }
        let Some(chunk) = rest.get(..size) else { break };
        out.push_str(chunk);
        body = rest.get(size + 2..).unwrap_or_default();
    }
    out
}

/// A session token for `admin` (`POST /api/v1/session`), for REST calls.
///
/// # Errors
/// The login is refused.
pub async fn session_token(server: SocketAddr, password: &str) -> anyhow::Result<String> {
    let (status, body) =
        api(server, "POST", "/api/v1/session", None, Some(&json!({"username": "admin", "password": password}))).await?;
    ensure!(status == 200, "POST /api/v1/session: {status} {body}");
    let v: Value = serde_json::from_str(&body)?;
    v["token"].as_str().map(str::to_owned).with_context(|| format!("no token in {body}"))
}

/// Opens Argo CD's streaming `GET path` (e.g. a resource-tree watch) and reads until the
/// received text satisfies `done` or `within` passes; the text received.
///
/// # Errors
/// I/O failure, a non-200 answer, or `done` not satisfied in time.
pub async fn stream_until(
    server: SocketAddr,
    path: &str,
    token: &str,
    within: Duration,
    done: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(server).await?;
    let head = format!("GET {path} HTTP/1.1\r\nHost: {server}\r\nAuthorization: Bearer {token}\r\n\r\n");
    s.write_all(head.as_bytes()).await?;
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = Vec::new();
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            ensure!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}\n{body}");
            if done(body) {
                return Ok(body.to_owned());
            }
        }
        let mut chunk = [0u8; 16 << 10];
        let n = match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(n) => n?,
            Err(_) => bail!("GET {path}: what was awaited did not arrive within {within:?}; got {text}"),
        };
        ensure!(n > 0, "GET {path}: the server closed the stream; got {text}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod unit {
    #[test]
    fn a_missing_binary_names_the_command_that_builds_it() {
        let err = super::argocd_binary("argocd-not-built").unwrap_err().to_string();
        assert!(err.contains("run scripts/install-test-deps") && err.contains("tests/tools/argocd"), "{err}");
    }

    #[test]
    fn chunked_answers_are_decoded() {
        let text = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(super::parse_answer(text).unwrap(), (200, "abcde".to_owned()));
        let plain = "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno";
        assert_eq!(super::parse_answer(plain).unwrap(), (404, "no".to_owned()));
    }
}
