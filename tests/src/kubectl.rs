//! [`Kubectl`]: the venv's kubectl against one kubeconfig, with timeouts; [`KubectlWatch`]: a
//! long-running `kubectl get --watch` whose output lines are awaited with deadlines.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tempfile::TempDir;

use crate::bin_path::kubectl_path;
use crate::process::ChildProcess;
use crate::wait::{DEFAULT_TIMEOUT, Poller};

/// kubectl bound to one kubeconfig. Each instance has its own discovery cache (`--cache-dir`), so
/// a cache written for another server that had the same port is never used.
#[derive(Debug)]
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    timeout: Duration,
    scratch: TempDir,
}

/// What one kubectl run produced.
#[derive(Debug, Clone)]
pub struct KubectlOutput {
    /// The arguments (after the kubeconfig and cache flags).
    pub args: Vec<String>,
    /// Exit status.
    pub status: ExitStatus,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl KubectlOutput {
    /// Whether kubectl exited 0.
    #[must_use]
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// stdout if kubectl succeeded, else an error with the command, status and stderr.
    ///
    /// # Errors
    /// kubectl exited non-zero.
    pub fn into_stdout(self) -> anyhow::Result<String> {
        if self.success() { Ok(self.stdout) } else { bail!("{self}") }
    }
}

impl std::fmt::Display for KubectlOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kubectl {} -> {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.args.join(" "),
            self.status,
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }
}

impl Kubectl {
    /// kubectl for `kubeconfig`, with [`DEFAULT_TIMEOUT`] per command.
    ///
    /// # Errors
    /// kubectl is not installed in the test venv (run `scripts/install-test-deps`).
    pub fn new(kubeconfig: &Path) -> anyhow::Result<Self> {
        let scratch = tempfile::Builder::new().prefix("kubectl-").tempdir().context("cannot create a temp dir")?;
        Ok(Self { bin: kubectl_path()?, kubeconfig: kubeconfig.to_path_buf(), timeout: DEFAULT_TIMEOUT, scratch })
    }

    /// Use another per-command timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The kubeconfig passed with `--kubeconfig`.
    #[must_use]
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    fn base_args(&self) -> Vec<std::ffi::OsString> {
        vec![
            "--kubeconfig".into(),
            self.kubeconfig.clone().into(),
            "--cache-dir".into(),
            self.scratch.path().join("cache").into(),
        ]
    }

    fn std_command(&self, args: &[String]) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.bin);
        cmd.args(self.base_args()).args(args).env_remove("KUBECONFIG").env("HOME", self.scratch.path());
        cmd
    }

    /// Run kubectl with `args`; the result has the status whatever it is.
    ///
    /// # Errors
    /// kubectl could not be started or did not finish within the timeout (it is killed).
    pub async fn run<I, S>(&self, args: I) -> anyhow::Result<KubectlOutput>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.run_fed(args, None).await
    }

    /// Run kubectl with `args` and `stdin` on its standard input (closed after it, as a pipe
    /// would be: `kubectl exec -i` then sees EOF); the result has the status whatever it is.
    ///
    /// # Errors
    /// kubectl could not be started or did not finish within the timeout (it is killed).
    pub async fn run_with_stdin<I, S>(&self, args: I, stdin: &[u8]) -> anyhow::Result<KubectlOutput>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.run_fed(args, Some(stdin)).await
    }

    async fn run_fed<I, S>(&self, args: I, stdin: Option<&[u8]>) -> anyhow::Result<KubectlOutput>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        use tokio::io::AsyncWriteExt as _;
        let args: Vec<String> = args.into_iter().map(|a| a.as_ref().to_string_lossy().into_owned()).collect();
        let mut cmd = tokio::process::Command::from(self.std_command(&args));
        let input = if stdin.is_some() { Stdio::piped() } else { Stdio::null() };
        cmd.stdin(input).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = cmd.spawn().with_context(|| format!("cannot run kubectl {}", args.join(" ")))?;
        // Written concurrently with reading the output, so a large input cannot deadlock.
        let writer = match (stdin, child.stdin.take()) {
            (Some(data), Some(mut pipe)) => {
                let data = data.to_vec();
                Some(tokio::spawn(async move {
                    let _ = pipe.write_all(&data).await;
                    let _ = pipe.shutdown().await;
                }))
            }
            _ => None,
        };
        let out = match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
            Ok(out) => out.with_context(|| format!("kubectl {} failed to run", args.join(" ")))?,
            Err(_) => bail!("kubectl {} did not finish within {:?} (killed)", args.join(" "), self.timeout),
        };
        if let Some(writer) = writer {
            writer.abort();
        }
        Ok(KubectlOutput {
            args,
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Run kubectl and require success; returns stdout.
    ///
    /// # Errors
    /// kubectl failed (the error has the command and its stderr) or timed out.
    pub async fn ok<I, S>(&self, args: I) -> anyhow::Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.run(args).await?.into_stdout()
    }

    /// Run kubectl and require failure; returns the output (to check the error message).
    ///
    /// # Errors
    /// kubectl succeeded, or could not run.
    pub async fn fails<I, S>(&self, args: I) -> anyhow::Result<KubectlOutput>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = self.run(args).await?;
        if out.success() {
            bail!("expected kubectl to fail, but it succeeded: {out}");
        }
        Ok(out)
    }

    /// Write `yaml` to a file named `name` in this kubectl's scratch dir; returns its path.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write_manifest(&self, name: &str, yaml: &str) -> anyhow::Result<PathBuf> {
        let path = self.scratch.path().join(name);
        std::fs::write(&path, yaml).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(path)
    }

    /// `kubectl apply -f <file>` of `yaml` (written to a file first), requiring success.
    ///
    /// # Errors
    /// kubectl failed or timed out.
    pub async fn apply(&self, yaml: &str) -> anyhow::Result<String> {
        let path = self.write_manifest("apply.yaml", yaml)?;
        self.ok([OsStr::new("apply"), OsStr::new("-f"), path.as_os_str()]).await
    }

    /// `kubectl apply -f <file>` of `yaml`, whatever the outcome.
    ///
    /// # Errors
    /// kubectl could not run or timed out.
    pub async fn run_apply(&self, yaml: &str) -> anyhow::Result<KubectlOutput> {
        let path = self.write_manifest("apply.yaml", yaml)?;
        self.run([OsStr::new("apply"), OsStr::new("-f"), path.as_os_str()]).await
    }

    /// `kubectl get <args> -o yaml`, parsed.
    ///
    /// # Errors
    /// kubectl failed, or printed something that is not YAML.
    pub async fn get_yaml<I, S>(&self, args: I) -> anyhow::Result<serde_json::Value>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut all: Vec<String> = vec!["get".into()];
        all.extend(args.into_iter().map(|a| a.as_ref().to_string_lossy().into_owned()));
        all.extend(["-o".to_string(), "yaml".to_string()]);
        let out = self.ok(&all).await?;
        serde_yaml::from_str(&out).with_context(|| format!("kubectl {} printed invalid YAML:\n{out}", all.join(" ")))
    }

    /// Spawn a long-running kubectl (e.g. `get applications --watch`) whose stdout lines can be
    /// awaited. It is killed when the returned value is dropped.
    ///
    /// # Errors
    /// kubectl cannot be started.
    pub fn spawn_watch<I, S>(&self, args: I) -> anyhow::Result<KubectlWatch>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<String> = args.into_iter().map(|a| a.as_ref().to_string_lossy().into_owned()).collect();
        let process = ChildProcess::spawn("kubectl-watch", self.std_command(&args))?;
        Ok(KubectlWatch { process, args, consumed: 0 })
    }
}

/// A running kubectl whose stdout lines are read as they come.
#[derive(Debug)]
pub struct KubectlWatch {
    process: ChildProcess,
    args: Vec<String>,
    consumed: usize,
}

impl KubectlWatch {
    /// Complete lines printed so far (all of them, consumed or not).
    #[must_use]
    pub fn lines(&self) -> Vec<String> {
        complete_lines(&self.process.stdout())
    }

    /// Wait up to `timeout` for a line not returned before that satisfies `matches`; lines
    /// before it are passed over for good.
    ///
    /// # Errors
    /// No such line by the deadline, or kubectl exited without printing one (error has its output).
    pub async fn wait_for_line(
        &mut self,
        timeout: Duration,
        mut matches: impl FnMut(&str) -> bool,
    ) -> anyhow::Result<String> {
        let mut poll = Poller::new(timeout, format!("a matching line from kubectl {}", self.args.join(" ")));
        loop {
            // Read the output before checking the exit, so lines printed just before it count.
            let exited = self.process.try_wait()?;
            let lines = self.lines();
            for (i, line) in lines.iter().enumerate().skip(self.consumed) {
                if matches(line) {
                    self.consumed = i + 1;
                    return Ok(line.clone());
                }
            }
            self.consumed = self.consumed.max(lines.len());
            if let Some(status) = exited {
                bail!("kubectl {} exited ({status}) before printing the line\n{}", self.args.join(" "), self.output());
            }
            poll.tick().await.with_context(|| self.output())?;
        }
    }

    /// Everything kubectl printed, for error messages.
    #[must_use]
    pub fn output(&self) -> String {
        self.process.log_tail(60)
    }

    /// The kubectl process.
    pub fn process_mut(&mut self) -> &mut ChildProcess {
        &mut self.process
    }
}

fn complete_lines(text: &str) -> Vec<String> {
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    if complete.is_empty() && !text.starts_with('\n') {
        return Vec::new();
    }
    complete.split('\n').map(str::to_string).collect()
}

#[cfg(test)]
mod unit {
    use super::complete_lines;

    #[test]
    fn only_complete_lines_are_returned() {
        assert!(complete_lines("").is_empty());
        assert!(complete_lines("partial").is_empty());
        assert_eq!(complete_lines("a\nb\npart"), vec!["a", "b"]);
        assert_eq!(complete_lines("a\n"), vec!["a"]);
        assert_eq!(complete_lines("\nx\n"), vec!["", "x"]);
    }
}
