//! [`ChildProcess`]: a spawned process that cannot outlive its test.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tempfile::TempDir;

use crate::wait::Poller;

/// Lines of each stream shown when a process is dropped (visible only for failing tests: the
/// test runner captures the output of passing ones).
const DROP_TAIL_LINES: usize = 25;

/// Set to keep the log directories of spawned processes after the test (their paths are printed).
const KEEP_LOGS_ENV: &str = "TESTS_KEEP_LOGS";

/// A spawned process whose stdout and stderr go to files in a private temp dir.
///
/// Dropping it sends SIGKILL (if it is still running) and waits for it, so no process is left
/// behind even when the test panics; it then prints the tail of its logs to stderr, which the
/// test runner shows only for failing tests. The child stays in the test's process group, so a
/// runner that kills a timed-out test's group kills it too.
///
/// A test process that dies without dropping it (SIGKILL, a runner's timeout, an abort) does
/// not leave it behind either: a [`Watchdog`] started beside it SIGKILLs it when the test
/// process's end of a pipe closes.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    watchdog: Option<Watchdog>,
    exit: Option<ExitStatus>,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
    logs: Option<TempDir>,
}

impl ChildProcess {
    /// Spawn `cmd` (stdin closed; stdout and stderr captured to files). `name` labels logs and errors.
    ///
    /// # Errors
    /// The log files cannot be created or the program cannot be started.
    pub fn spawn(name: &str, mut cmd: Command) -> anyhow::Result<Self> {
        let logs = tempfile::Builder::new()
            .prefix(&format!("{}-", name.replace(|c: char| !c.is_ascii_alphanumeric(), "-")))
            .tempdir()
            .context("cannot create a log dir")?;
        let stdout_path = logs.path().join("stdout.log");
        let stderr_path = logs.path().join("stderr.log");
        let stdout = File::create(&stdout_path).with_context(|| format!("cannot create {}", stdout_path.display()))?;
        let stderr = File::create(&stderr_path).with_context(|| format!("cannot create {}", stderr_path.display()))?;
        cmd.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        let mut child = cmd.spawn().with_context(|| format!("cannot spawn {name}: {cmd:?}"))?;
        let watchdog = match Watchdog::start(child.id()) {
            Ok(w) => w,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e.context(format!("cannot guard {name}, so it was not left running")));
            }
        };
        Ok(Self {
            name: name.to_string(),
            child,
            watchdog: Some(watchdog),
            exit: None,
            stdout_path,
            stderr_path,
            logs: Some(logs),
        })
    }

    /// The label given at spawn.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Directory holding `stdout.log` and `stderr.log`.
    #[must_use]
    pub fn log_dir(&self) -> &Path {
        self.stdout_path.parent().unwrap_or(Path::new("."))
    }

    /// The exit status if the process has exited (reaping it), `None` while it runs.
    ///
    /// # Errors
    /// The status cannot be queried.
    pub fn try_wait(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().with_context(|| format!("cannot query {}", self.name))?;
            if self.exit.is_some() {
                self.disarm_watchdog();
            }
        }
        Ok(self.exit)
    }

    /// Stop the watchdog: once the child is reaped its pid may be reused.
    fn disarm_watchdog(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.disarm();
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.try_wait(), Ok(None))
    }

    /// Fail (with the log tail) if the process has exited.
    ///
    /// # Errors
    /// The process is no longer running.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        match self.try_wait()? {
            None => Ok(()),
            Some(status) => bail!("{} exited unexpectedly ({status})\n{}", self.name, self.log_tail(40)),
        }
    }

    /// Send a signal by name (`TERM`, `INT`, `KILL`, `STOP`, `CONT`, ...) with `kill(1)`.
    ///
    /// # Errors
    /// The process has already exited (and been reaped), or `kill` failed.
    pub fn signal(&mut self, signal: &str) -> anyhow::Result<()> {
        if let Some(status) = self.try_wait()? {
            bail!("cannot send SIG{signal} to {}: it already exited ({status})", self.name);
        }
        // Not reaped yet, so the pid cannot have been reused.
        let out = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .stdin(Stdio::null())
            .output()
            .context("cannot run kill(1)")?;
        if !out.status.success() {
            bail!("kill -{signal} {} failed: {}", self.pid(), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    /// SIGKILL the process (if it still runs) and reap it.
    ///
    /// # Errors
    /// Killing or waiting failed.
    pub fn sigkill(&mut self) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        // std's kill is SIGKILL on Unix.
        self.child.kill().with_context(|| format!("cannot SIGKILL {}", self.name))?;
        let status = self.child.wait().with_context(|| format!("cannot wait for {}", self.name))?;
        self.exit = Some(status);
        self.disarm_watchdog();
        Ok(status)
    }

    /// Wait (blocking) for the process to exit on its own, up to `timeout`.
    ///
    /// # Errors
    /// It is still running at the deadline (it is left running), or waiting failed.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let mut poll = Poller::new(timeout, format!("{} to exit", self.name));
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            poll.tick_blocking().with_context(|| self.log_tail(20))?;
        }
    }

    /// Async [`Self::wait_exit`], for use inside a runtime.
    ///
    /// # Errors
    /// It is still running at the deadline (it is left running), or waiting failed.
    pub async fn wait_exit_async(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let mut poll = Poller::new(timeout, format!("{} to exit", self.name));
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            poll.tick().await.with_context(|| self.log_tail(20))?;
        }
    }

    /// SIGTERM, then wait (blocking) up to `timeout` for the exit; SIGKILL and fail if it does not
    /// exit in time. Returns the exit status (check it: a clean shutdown exits 0).
    ///
    /// # Errors
    /// The process did not exit within the deadline, or signalling failed.
    pub fn sigterm_and_wait(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        self.signal("TERM")?;
        match self.wait_exit(timeout) {
            Ok(status) => Ok(status),
            Err(e) => {
                let _ = self.sigkill();
                Err(e.context(format!("{} did not exit within {timeout:?} of SIGTERM; killed it", self.name)))
            }
        }
    }

    /// Async [`Self::sigterm_and_wait`].
    ///
    /// # Errors
    /// The process did not exit within the deadline, or signalling failed.
    pub async fn sigterm_and_wait_async(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        self.signal("TERM")?;
        match self.wait_exit_async(timeout).await {
            Ok(status) => Ok(status),
            Err(e) => {
                let _ = self.sigkill();
                Err(e.context(format!("{} did not exit within {timeout:?} of SIGTERM; killed it", self.name)))
            }
        }
    }

    /// Everything written to stdout so far.
    #[must_use]
    pub fn stdout(&self) -> String {
        read_lossy(&self.stdout_path)
    }

    /// Everything written to stderr so far.
    #[must_use]
    pub fn stderr(&self) -> String {
        read_lossy(&self.stderr_path)
    }

    /// The last `lines` lines of stdout and of stderr, labelled, for error messages.
    #[must_use]
    pub fn log_tail(&self, lines: usize) -> String {
        format!(
            "--- {} (pid {}) stdout, last {lines} lines ---\n{}\n--- {} stderr, last {lines} lines ---\n{}",
            self.name,
            self.pid(),
            tail(&self.stdout(), lines),
            self.name,
            tail(&self.stderr(), lines)
        )
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let status = match self.sigkill() {
            Ok(s) => s.to_string(),
            Err(e) => format!("could not be killed: {e:#}"),
        };
        eprintln!("=== {} (pid {}) stopped: {status}\n{}", self.name, self.pid(), self.log_tail(DROP_TAIL_LINES));
        if std::env::var_os(KEEP_LOGS_ENV).is_some()
            && let Some(dir) = self.logs.take()
        {
            eprintln!("=== {} logs kept in {}", self.name, dir.keep().display());
        }
    }
}

/// SIGKILLs one process when the test process is gone, however it went.
///
/// A `sh` whose stdin is a pipe; the test process holds the only write end (close-on-exec, so no
/// other child inherits it). The kernel closes that end when the test process exits, SIGKILL
/// included; `read` then sees end-of-file and the shell kills the guarded pid. A sidecar rather
/// than the child itself watching the pipe: the guarded programs include kube-apiserver, etcd,
/// SPIRE and envoy, and the child's pid, stdin (closed) and signals stay exactly as spawned.
/// (`argocd-agent` children of a killed quickstart stop on their own: see `cli`'s `signals`.)
#[derive(Debug)]
struct Watchdog {
    shell: Child,
    pipe: ChildStdin,
}

/// `$1` is the guarded pid. Nothing is ever written to the pipe: `read` returns non-zero only at
/// end-of-file.
const WATCHDOG_SCRIPT: &str = "while read -r _; do :; done; kill -KILL \"$1\" 2>/dev/null";

impl Watchdog {
    fn start(pid: u32) -> anyhow::Result<Self> {
        let mut shell = Command::new("sh")
            .args(["-c", WATCHDOG_SCRIPT, "test-watchdog", &pid.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start the watchdog shell (sh)")?;
        let pipe = shell.stdin.take().context("the watchdog's stdin pipe")?;
        Ok(Self { shell, pipe })
    }

    /// Stop it without letting it kill: the shell first, then its pipe.
    fn disarm(mut self) {
        let _ = self.shell.kill();
        let _ = self.shell.wait();
        drop(self.pipe);
    }
}

fn read_lossy(path: &Path) -> String {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// The last `n` lines of `text`.
#[must_use]
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod unit {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script);
        cmd
    }

    #[test]
    fn captures_output_and_exit_status() -> anyhow::Result<()> {
        let mut p = ChildProcess::spawn("echo", sh("echo out; echo err >&2; exit 3"))?;
        let status = p.wait_exit(Duration::from_secs(30))?;
        assert_eq!(status.code(), Some(3));
        assert_eq!(p.stdout(), "out\n");
        assert_eq!(p.stderr(), "err\n");
        assert!(p.log_tail(5).contains("out") && p.log_tail(5).contains("err"));
        Ok(())
    }

    #[test]
    fn sigterm_stops_a_process() -> anyhow::Result<()> {
        let mut p = ChildProcess::spawn("sleeper", sh("exec sleep 600"))?;
        assert!(p.is_running());
        let status = p.sigterm_and_wait(Duration::from_secs(30))?;
        assert!(!status.success());
        assert!(p.signal("TERM").is_err(), "signalling an exited process must fail");
        Ok(())
    }

    #[test]
    fn drop_kills_a_running_process() -> anyhow::Result<()> {
        let p = ChildProcess::spawn("sleeper", sh("exec sleep 600"))?;
        let pid = p.pid().to_string();
        drop(p);
        // Reaped by the drop, so the pid no longer names our sleeper.
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(!cmdline.contains("sleep"), "sleeper {pid} still alive");
        Ok(())
    }

    /// Set for [`helper_holds_a_sleeper`] when this test binary runs it as a separate process:
    /// where to write its sleeper's pid.
    const HELPER_PID_FILE_ENV: &str = "TESTS_PROCESS_HELPER_PID_FILE";

    /// Whether `pid` names a live process running `sleep` (a zombie or a reused pid does not).
    fn sleeper_alive(pid: &str) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        !stat.is_empty() && state != Some("Z") && cmdline.contains("sleep")
    }

    /// Not a test on its own: [`children_die_with_a_killed_test_process`] runs it in a process
    /// of its own, which spawns a sleeper and waits to be SIGKILLed.
    #[test]
    #[ignore = "run by children_die_with_a_killed_test_process"]
    fn helper_holds_a_sleeper() -> anyhow::Result<()> {
        let Some(pid_file) = std::env::var_os(HELPER_PID_FILE_ENV) else { return Ok(()) };
        let sleeper = ChildProcess::spawn("sleeper", sh("exec sleep 600"))?;
        std::fs::write(&pid_file, sleeper.pid().to_string())?;
        // Parked until the outer test SIGKILLs this process (it never returns on its own).
        loop {
            std::thread::park();
        }
    }

    /// A test process killed outright (no drop runs) takes the processes it spawned with it.
    #[test]
    fn children_die_with_a_killed_test_process() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let pid_file = dir.path().join("sleeper.pid");
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["--exact", "process::unit::helper_holds_a_sleeper", "--ignored", "--nocapture"])
            .env(HELPER_PID_FILE_ENV, &pid_file);
        let mut helper = ChildProcess::spawn("helper", cmd)?;
        crate::wait::wait_until(Duration::from_secs(60), "the helper to start its sleeper", || {
            helper.is_running() && std::fs::read_to_string(&pid_file).is_ok_and(|p| !p.is_empty())
        })
        .with_context(|| helper.log_tail(20))?;
        let sleeper = std::fs::read_to_string(&pid_file)?;
        // The pid is written as soon as `spawn` returns, which can be while the kernel is still
        // inside the exec (its command line not yet readable): wait for it rather than read once.
        crate::wait::wait_until(Duration::from_secs(30), "the helper's sleeper to be running", || {
            sleeper_alive(&sleeper)
        })
        .with_context(|| helper.log_tail(20))?;
        helper.sigkill()?;
        let gone = crate::wait::wait_until(Duration::from_secs(30), "the killed helper's sleeper to exit", || {
            !sleeper_alive(&sleeper)
        });
        if gone.is_err() {
            // Do not leave it behind when the mechanism is broken.
            let _ = Command::new("kill").args(["-KILL", &sleeper]).status();
        }
        gone.with_context(|| format!("sleeper {sleeper} outlived the SIGKILLed test process that spawned it"))
    }

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
    }
}
