//! The Go interop peer (`tests/gopeer`, built into the venv as `argocd-gopeer` by
//! `scripts/install-test-deps`): an upstream agent, principal or bare codec written on the
//! libraries upstream uses (grpc-go, cloudevents sdk-go v2.16.2), driven over JSON lines.
//!
//! Commands go to its stdin, one JSON object per line; its reports come back on stdout and are
//! collected here, so a test waits for a report with a deadline ([`GoPeer::wait`]) instead of
//! sleeping. Each received event is reported as upstream decodes it: `kind` is `event` (with
//! `target`, `type`, `resourceid`, `eventid`, `attr_types`, `data` re-encoded by Go from
//! upstream's payload struct, `decode_error`, and `roundtrip_diff`: how the bytes differ from
//! what sdk-go itself writes for that event) or `dropped` (upstream would drop it, e.g.
//! "unknown event target"). Dropping the peer kills it.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::bin_path::venv_tool;
use crate::wait::Poller;

/// The version string our principal and agent report and expect (`argocd-agent-<version>`).
pub const OUR_VERSION: &str = concat!("argocd-agent-", env!("CARGO_PKG_VERSION"));

/// How long a peer may take to answer on a busy 2-core machine.
pub const ANSWER: Duration = Duration::from_secs(60);

/// A running `argocd-gopeer`.
pub struct GoPeer {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    reports: Arc<Mutex<Vec<Value>>>,
    stderr_path: PathBuf,
    _logs: tempfile::TempDir,
}

impl std::fmt::Debug for GoPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoPeer").field("name", &self.name).finish_non_exhaustive()
    }
}

/// PKI file paths of a [`crate::topology::Topology`] (`<dir>/pki`).
#[derive(Debug, Clone)]
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// The PKI next to a topology's kubeconfig.
    ///
    /// # Errors
    /// The kubeconfig has no parent directory.
    pub fn of_kubeconfig(kubeconfig: &Path) -> anyhow::Result<Self> {
        Ok(Self { dir: kubeconfig.parent().context("kubeconfig without a directory")?.join("pki") })
    }

    /// `ca.crt`.
    #[must_use]
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// `<name>.crt` (`principal` or an agent name).
    #[must_use]
    pub fn cert(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.crt"))
    }

    /// `<name>.key`.
    #[must_use]
    pub fn key(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.key"))
    }
}

impl GoPeer {
    /// Starts `argocd-gopeer <args>`.
    ///
    /// # Errors
    /// The binary is missing (run `scripts/install-test-deps`) or cannot start.
    pub fn spawn(name: &str, args: &[&std::ffi::OsStr]) -> anyhow::Result<Self> {
        let bin = venv_tool("argocd-gopeer")?;
        let logs = tempfile::Builder::new().prefix(&format!("gopeer-{name}-")).tempdir()?;
        let stderr_path = logs.path().join("stderr.log");
        let stderr = std::fs::File::create(&stderr_path)?;
        let mut child = Command::new(&bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let reports = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&reports);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value = serde_json::from_str(&line).unwrap_or_else(
                    |e| serde_json::json!({"kind": "unparsable", "line": line, "error": e.to_string()}),
                );
                sink.lock().unwrap_or_else(PoisonError::into_inner).push(value);
            }
        });
        let stdin = child.stdin.take();
        Ok(Self { name: name.to_owned(), child, stdin, reports, stderr_path, _logs: logs })
    }

    /// The bare codec: decode/encode single messages, checksums.
    ///
    /// # Errors
    /// As [`Self::spawn`], or it does not report ready.
    pub async fn codec() -> anyhow::Result<Self> {
        let mut peer = Self::spawn("codec", &["codec".as_ref()])?;
        peer.wait("ready", |r| r["kind"] == "ready").await?;
        Ok(peer)
    }

    /// An upstream agent dialling `server` with `name`'s certificate from `pki`.
    ///
    /// # Errors
    /// As [`Self::spawn`].
    pub fn agent(
        pki: &Pki,
        name: &str,
        server: std::net::SocketAddr,
        mode: &str,
        version: &str,
    ) -> anyhow::Result<Self> {
        Self::agent_with(pki, name, server, mode, version, &[])
    }

    /// [`Self::agent`] with more flags of the Go agent (e.g. `--compress`).
    ///
    /// # Errors
    /// As [`Self::spawn`].
    pub fn agent_with(
        pki: &Pki,
        name: &str,
        server: std::net::SocketAddr,
        mode: &str,
        version: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let server = server.to_string();
        let (ca, cert, key) = (pki.ca(), pki.cert(name), pki.key(name));
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "agent".as_ref(),
            "--server".as_ref(),
            server.as_ref(),
            "--ca".as_ref(),
            ca.as_os_str(),
            "--cert".as_ref(),
            cert.as_os_str(),
            "--key".as_ref(),
            key.as_os_str(),
            "--mode".as_ref(),
            mode.as_ref(),
            "--version".as_ref(),
            version.as_ref(),
        ];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        Self::spawn(&format!("agent-{name}"), &args)
    }

    /// An upstream principal on a free loopback port with the principal's certificate from
    /// `pki`; returns it with the address it listens on.
    ///
    /// # Errors
    /// As [`Self::spawn`], or it does not report listening.
    pub async fn principal(pki: &Pki, version: &str) -> anyhow::Result<(Self, std::net::SocketAddr)> {
        Self::principal_with(pki, version, &[]).await
    }

    /// [`Self::principal`] with `extra` arguments (e.g. `--websocket`).
    ///
    /// # Errors
    /// As [`Self::principal`].
    pub async fn principal_with(
        pki: &Pki,
        version: &str,
        extra: &[&str],
    ) -> anyhow::Result<(Self, std::net::SocketAddr)> {
        let (ca, cert, key) = (pki.ca(), pki.cert("principal"), pki.key("principal"));
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "principal".as_ref(),
            "--ca".as_ref(),
            ca.as_os_str(),
            "--cert".as_ref(),
            cert.as_os_str(),
            "--key".as_ref(),
            key.as_os_str(),
            "--version".as_ref(),
            version.as_ref(),
        ];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        let mut peer = Self::spawn("principal", &args)?;
        let listening = peer.wait("listening", |r| r["kind"] == "listening").await?;
        let addr = listening["addr"].as_str().context("listening without addr")?.parse()?;
        Ok((peer, addr))
    }

    /// Sends one command line.
    ///
    /// # Errors
    /// The peer has exited or its stdin is closed.
    pub fn command(&mut self, cmd: &Value) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        writeln!(stdin, "{cmd}").and_then(|()| stdin.flush()).with_context(|| format!("{} is gone", self.name))
    }

    /// Every report so far.
    #[must_use]
    pub fn reports(&self) -> Vec<Value> {
        self.reports.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Reports matching `pred`.
    #[must_use]
    pub fn matching(&self, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.reports.lock().unwrap_or_else(PoisonError::into_inner).iter().filter(|r| pred(r)).cloned().collect()
    }

    /// Waits (polling, with [`ANSWER`] as deadline) for the first report matching `pred`.
    ///
    /// # Errors
    /// Timeout or the peer exited; the message carries its recent reports and log.
    pub async fn wait(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
        let mut poll = Poller::new(ANSWER, format!("{} to report {what}", self.name));
        loop {
            if let Some(r) = self.matching(&pred).into_iter().next() {
                return Ok(r);
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited ({status}) before reporting {what}:\n{}", self.name, self.diagnostics());
            }
            if let Err(e) = poll.tick().await {
                bail!("{e}:\n{}", self.diagnostics());
            }
        }
    }

    /// Sends a command and waits for the answer carrying its `id` (`cmd_id`), or for a
    /// `command_error` about it.
    ///
    /// # Errors
    /// The peer refused the command or did not answer in time.
    pub async fn ask(&mut self, id: &str, mut cmd: Value) -> anyhow::Result<Value> {
        cmd["id"] = Value::from(id);
        self.command(&cmd)?;
        let answer = self.wait(&format!("an answer to command {id}"), |r| r["cmd_id"] == id).await?;
        if answer["kind"] == "command_error" {
            bail!("{} refused command {id}: {}", self.name, answer["error"]);
        }
        Ok(answer)
    }

    /// The tail of the peer's reports and stderr, for failure messages.
    #[must_use]
    pub fn diagnostics(&self) -> String {
        let reports = self.reports();
        let tail: Vec<String> = reports.iter().rev().take(15).rev().map(Value::to_string).collect();
        let stderr = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        format!(
            "--- last reports of {}\n{}\n--- stderr\n{}",
            self.name,
            tail.join("\n"),
            crate::process::tail(&stderr, 20)
        )
    }
}

impl Drop for GoPeer {
    fn drop(&mut self) {
        // Closing stdin ends the peer; kill it anyway so nothing outlives the test.
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The checks every event a Go peer received from us must pass: upstream would not drop it,
/// sdk-go re-encodes it to the same attributes and data (so we encode exactly as sdk-go),
/// `dataschema` is a `ce_uri`, and the payload decoded into upstream's struct.
///
/// # Errors
/// The first failed check, with the report.
pub fn check_received(report: &Value) -> anyhow::Result<()> {
    if report["kind"] != "event" {
        bail!("the Go peer did not accept the event: {report}");
    }
    if report["roundtrip_diff"].as_array().is_some_and(|d| !d.is_empty()) {
        bail!("we do not encode as sdk-go does: {}", report["roundtrip_diff"]);
    }
    if report["attr_types"]["dataschema"] != "ce_uri" {
        bail!("dataschema is not a ce_uri: {report}");
    }
    if report.get("decode_error").is_some_and(|e| !e.is_null()) {
        bail!("the Go peer could not decode the payload: {report}");
    }
    Ok(())
}
