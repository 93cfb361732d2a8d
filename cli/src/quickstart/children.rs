//! The quickstart's child processes: started from this same binary, logged to files, stopped
//! (SIGTERM, then SIGKILL) when the quickstart ends.
//!
//! When the quickstart cannot stop them (SIGKILL, the OOM killer), they stop themselves: each
//! child's stdin is a pipe whose only write end this process holds, and the child, told so by
//! [`crate::runtime::signals::EXIT_WITH_PARENT_ENV`], shuts down when the kernel closes that write end.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};

/// A running child process of the quickstart.
#[derive(Debug)]
pub struct ChildProc {
    /// Short name for messages (`hub apiserver`, `principal`, ...).
    pub name: String,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
    child: Child,
    /// The write end of the child's stdin, never written: closing it (this process exiting,
    /// however it exits) tells the child to shut down. std creates it close-on-exec, so no
    /// other child inherits it.
    _parent_pipe: ChildStdin,
}

impl ChildProc {
    /// Start `argocd-agent <args>` with output appended to `log`. When `first_line` is set, the
    /// first stdout line starting with it is returned (how the principal reports its port).
    ///
    /// # Errors
    /// The process cannot be started, or exits before printing the line within `timeout`.
    pub async fn start(
        name: &str,
        args: &[String],
        log: &Path,
        first_line: Option<(&str, Duration)>,
    ) -> anyhow::Result<(Self, Option<String>)> {
        let exe = std::env::current_exe().context("cannot find the argocd-agent executable")?;
        let (log_file, stderr) = open_log(log)?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .stdin(Stdio::piped())
            .env(crate::runtime::signals::EXIT_WITH_PARENT_ENV, "1")
            .stderr(Stdio::from(stderr))
            .env("NO_COLOR", "1")
            .kill_on_drop(true);
        if first_line.is_some() {
            cmd.stdout(Stdio::piped());
        } else {
            cmd.stdout(Stdio::from(log_file));
        }
        let mut child = cmd.spawn().with_context(|| format!("cannot start the {name}"))?;
        let parent_pipe = child.stdin.take().context("the child's stdin pipe")?;
        let mut line_found = None;
        if let Some((prefix, timeout)) = first_line {
            let stdout = child.stdout.take().context("stdout")?;
            let mut lines = BufReader::new(stdout).lines();
            let wait = async {
                // Lines before the awaited one go to the log too (the principal announces its
                // resource proxy first).
                let mut before = String::new();
                while let Some(line) = lines.next_line().await? {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        let mut f = tokio::fs::OpenOptions::new().append(true).open(log).await?;
                        f.write_all(format!("{before}{line}\n").as_bytes()).await?;
                        // tokio's File hands writes to a blocking thread: flush before anyone reads.
                        f.flush().await?;
                        return Ok::<_, std::io::Error>(Some(rest.trim().to_string()));
                    }
                    before.push_str(&line);
                    before.push('\n');
                }
                Ok(None)
            };
            line_found = match tokio::time::timeout(timeout, wait).await {
                Ok(Ok(Some(l))) => Some(l),
                _ => {
                    let tail = log_tail(log, 15);
                    anyhow::bail!(
                        "the {name} did not start (no {prefix:?} within {timeout:?}); its log {}:\n{tail}",
                        log.display()
                    );
                }
            };
            // Keep draining stdout into the log so the child never blocks on a full pipe.
            let log = log.to_path_buf();
            tokio::spawn(async move {
                if let Ok(mut f) = tokio::fs::OpenOptions::new().append(true).open(&log).await {
                    while let Ok(Some(line)) = lines.next_line().await {
                        let _ = f.write_all(format!("{line}\n").as_bytes()).await;
                    }
                }
            });
        }
        Ok((Self { name: name.to_string(), log: log.to_path_buf(), child, _parent_pipe: parent_pipe }, line_found))
    }

    /// Start a program that is not this binary (Argo CD, redis-server, git daemon), with its
    /// output in `log`. Such a program knows nothing of [`crate::runtime::signals::EXIT_WITH_PARENT_ENV`],
    /// so it runs under a small `sh` watchdog ([`WATCHDOG`]) that stops it when this process's
    /// pipe on the watchdog's stdin closes (this process ended, however) or when the watchdog is
    /// sent SIGTERM / SIGINT ([`Self::stop`]).
    ///
    /// # Errors
    /// `sh` cannot be started or the log cannot be opened.
    pub fn start_program(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, std::ffi::OsString)],
        log: &Path,
    ) -> anyhow::Result<Self> {
        let (log_file, stderr) = open_log(log)?;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(WATCHDOG)
            .arg(format!("quickstart-watchdog[{name}]"))
            .arg(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(stderr))
            // Its own process group, which the pipe watcher stops as a whole: the watcher runs
            // before the program starts, so there is no moment when the program runs unwatched
            // (this process killed just after the program started used to leave it running).
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().with_context(|| format!("cannot start the {name} ({})", program.display()))?;
        let parent_pipe = child.stdin.take().context("the watchdog's stdin pipe")?;
        Ok(Self { name: name.to_string(), log: log.to_path_buf(), child, _parent_pipe: parent_pipe })
    }

    /// Whether it still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Fail with the log tail if the process has exited.
    ///
    /// # Errors
    /// It is no longer running.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            anyhow::bail!(
                "the {} exited ({status}); its log {}:\n{}",
                self.name,
                self.log.display(),
                log_tail(&self.log, 15)
            );
        }
        Ok(())
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL; always reaps the process.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
            if tokio::time::timeout(grace, self.child.wait()).await.is_ok() {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}

/// Runs `"$@"` (its stdin closed) and stops it with SIGTERM when the watchdog's stdin reaches
/// end-of-file (the quickstart, which holds the only write end, is gone: the whole process
/// group, which the watchdog leads, gets SIGTERM) or when the watchdog gets SIGTERM or SIGINT;
/// exits with the program's status. The pipe's reader starts before the program, so the
/// program never runs unwatched. `$0` names the program in `ps`.
/// (An asynchronous list's stdin is /dev/null in a shell without job control: the pipe is kept
/// as fd 3 for the reader.)
const WATCHDOG: &str = r#"
exec 3<&0
( cat <&3 >/dev/null; kill -TERM 0 2>/dev/null ) &
w=$!
"$@" </dev/null 3<&- &
c=$!
trap 'kill -TERM "$c" 2>/dev/null' TERM INT
s=0
while kill -0 "$c" 2>/dev/null; do wait "$c"; s=$?; done
kill "$w" 2>/dev/null
exit "$s"
"#;

/// The last `n` lines of a log file.
#[must_use]
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Wait until `path` exists (a kubeconfig written once its server listens).
///
/// # Errors
/// The child exits first or the deadline passes.
pub async fn wait_for_file(child: &mut ChildProc, path: &Path, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    while !path.exists() {
        child.ensure_running()?;
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!(
                "the {} did not write {} within {timeout:?}; log:\n{}",
                child.name,
                path.display(),
                log_tail(&child.log, 15)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A child's log file, opened for appending, twice: for its stdout and its stderr.
fn open_log(log: &Path) -> anyhow::Result<(std::fs::File, std::fs::File)> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let stderr = log_file.try_clone().context("log file")?;
    Ok((log_file, stderr))
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::ChildProc;

    /// Starts `sh -c 'echo $$ > pidfile; exec sleep 300'` under the watchdog; the sleep's pid.
    async fn sleeper(dir: &Path, name: &str) -> (ChildProc, u32) {
        let pidfile = dir.join(format!("{name}.pid"));
        let script = format!("echo $$ > {}; exec sleep 300", pidfile.display());
        let child = ChildProc::start_program(
            name,
            Path::new("/bin/sh"),
            &["-c".to_owned(), script],
            &[],
            &dir.join(format!("{name}.log")),
        )
        .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(pid) = std::fs::read_to_string(&pidfile).ok().and_then(|t| t.trim().parse().ok()) {
                return (child, pid);
            }
            assert!(tokio::time::Instant::now() < deadline, "the program under the watchdog did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether `pid` is alive (not gone, not a zombie).
    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
    }

    async fn wait_gone(pid: u32, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while alive(pid) {
            assert!(tokio::time::Instant::now() < deadline, "{what}: pid {pid} still runs");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn the_watchdog_stops_its_program_on_stop_and_when_the_quickstart_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        // Stopped as the quickstart stops its children (SIGTERM to the watchdog).
        let (child, pid) = sleeper(dir.path(), "stopped").await;
        assert!(alive(pid));
        child.stop(Duration::from_secs(5)).await;
        wait_gone(pid, "after stop").await;
        // The watchdog killed outright and its pipe closed, as when the quickstart is SIGKILLed.
        let (child, pid) = sleeper(dir.path(), "orphaned").await;
        drop(child);
        wait_gone(pid, "after the watchdog was killed and its pipe closed").await;
    }
}
