//! `argocd-agent quickstart` as a user runs it: three API servers, PKI, principal and two agents
//! as real processes over mTLS; Applications travel both ways; nothing is left running, even
//! when the quickstart itself is killed outright.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use tests::bin_path::workspace_binary;
use tests::kubectl::Kubectl;
use tests::process::ChildProcess;
use tests::wait::{wait_until, wait_until_async};

const DEADLINE: Duration = Duration::from_secs(120);

/// Live processes whose command line mentions `dir` (every child of a quickstart does), as
/// `pid command line`. Zombies have no command line, so they do not count.
fn processes_using(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { continue };
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmdline.contains(&needle) {
            found.push(format!("{pid} {}", cmdline.trim_end()));
        }
    }
    found
}

/// SIGKILL what [`processes_using`] found, so a failing test leaves nothing behind.
fn kill_all(processes: &[String]) {
    for p in processes {
        if let Some(pid) = p.split_whitespace().next() {
            let _ = Command::new("kill").args(["-KILL", pid]).stderr(Stdio::null()).status();
        }
    }
}

#[test]
fn once_converges_and_leaves_no_process_behind() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let qs_dir = dir.path().join("qs");
    let mut cmd = Command::new(workspace_binary("argocd-agent")?);
    cmd.args(["quickstart", "--once", "--timeout", "100", "--dir"]).arg(&qs_dir);
    let mut qs = ChildProcess::spawn("quickstart", cmd)?;
    let status = qs.wait_exit(DEADLINE)?;
    ensure!(status.success(), "quickstart --once failed ({status}):\n{}", qs.log_tail(60));
    let out = qs.stdout();
    assert!(out.contains("every demo Application reached the other side with status"), "{out}");
    assert!(out.contains("read from the managed spoke through the resource proxy"), "{out}");
    for row in
        ["agent-managed/guestbook", "agent-autonomous/helm-guestbook", "argocd/guestbook", "argocd/helm-guestbook"]
    {
        assert!(
            out.lines().any(|l| l.contains(row) && l.contains("Synced") && l.contains("Healthy")),
            "{row} Synced/Healthy in:\n{out}"
        );
    }
    let left = processes_using(&qs_dir);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    Ok(())
}

/// `quickstart --argocd --once`: the real Argo CD v3.5.1 (built by `scripts/install-test-deps`)
/// in place of the stand-in. Each spoke's application controller syncs its demo Application
/// from the git repository the quickstart serves on loopback; the status (Synced/Healthy at that
/// repository's commit, which the stand-in never reports) reaches the hub, and the argocd CLI
/// lists both through the hub's argocd-server. Nothing is left running.
#[test]
fn argocd_once_has_the_real_controller_sync_both_demo_applications() -> Result<()> {
    tests::argocd::require_tools()?;
    let dir = tempfile::tempdir()?;
    let qs_dir = dir.path().join("qs");
    let mut cmd = Command::new(workspace_binary("argocd-agent")?);
    cmd.args(["quickstart", "--argocd", "--once", "--timeout", "100", "--dir"]).arg(&qs_dir);
    let mut qs = ChildProcess::spawn("quickstart --argocd", cmd)?;
    let status = qs.wait_exit(DEADLINE)?;
    let left = processes_using(&qs_dir);
    kill_all(&left);
    ensure!(status.success(), "quickstart --argocd --once failed ({status}):\n{}", qs.log_tail(80));
    let out = qs.stdout();
    let commit = out
        .lines()
        .find_map(|l| l.split("(commit ").nth(1))
        .and_then(|rest| rest.split(')').next())
        .with_context(|| format!("no demo repository commit in:\n{out}"))?
        .to_owned();
    assert!(out.contains("synced by the real Argo CD at the demo repository's commit"), "{out}");
    for row in
        ["agent-managed/guestbook", "agent-autonomous/helm-guestbook", "argocd/guestbook", "argocd/helm-guestbook"]
    {
        assert!(
            out.lines()
                .any(|l| l.contains(row) && l.contains("Synced") && l.contains("Healthy") && l.contains(&commit)),
            "{row} Synced/Healthy at {commit} in:\n{out}"
        );
    }
    // The real controller deployed the demo from git: the Pod the resource proxy then reached.
    let log = std::fs::read_to_string(qs_dir.join("logs").join("argocd-application-controller-managed.log"))?;
    assert!(
        log.contains("pod/guestbook-ui-0 created"),
        "the managed spoke's controller did not create the Pod:\n{log}"
    );
    assert!(out.contains("read from the managed spoke through the resource proxy"), "{out}");
    assert!(out.contains("argocd app list on the hub's argocd-server"), "{out}");
    assert!(out.contains("login 127.0.0.1:") && out.contains("--username admin --password quickstart-"), "{out}");
    ensure!(left.is_empty(), "processes left behind (now killed): {left:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_run_carries_a_users_application_and_ctrl_c_stops_everything() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let qs_dir = dir.path().join("qs");
    let mut cmd = Command::new(workspace_binary("argocd-agent")?);
    cmd.args(["quickstart", "--dir"]).arg(&qs_dir);
    let mut qs = ChildProcess::spawn("quickstart", cmd)?;
    let kubeconfig = qs_dir.join("kubeconfig");
    wait_until(DEADLINE, "the demo apps to show as Synced on the hub", || {
        let out = qs.stdout();
        out.lines().any(|l| l.starts_with("hub") && l.contains("agent-managed/guestbook") && l.contains("Synced"))
    })
    .with_context(|| qs.log_tail(60))?;

    // A user applies an Application to the hub, in the managed agent's namespace...
    let manifest = dir.path().join("app.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: mine\n  namespace: agent-managed\nspec:\n  project: default\n  source:\n    repoURL: https://example.com/mine.git\n    path: mine\n  destination:\n    name: agent-managed\n    namespace: mine\n",
    )?;
    let kubectl = Kubectl::new(&kubeconfig)?;
    let applied = kubectl.run(&["--context", "hub", "apply", "-f", &manifest.display().to_string()]).await?;
    ensure!(applied.success(), "kubectl apply: {applied:?}");
    // ...it reaches the managed spoke, and the simulated controller's status comes back.
    let arrived = wait_until_async(DEADLINE, "mine on the managed spoke and Synced on the hub", || async {
        let spoke = kubectl.run(&["--context", "managed", "get", "application", "mine", "-n", "argocd"]).await;
        let hub = kubectl
            .run(&[
                "--context",
                "hub",
                "get",
                "application",
                "mine",
                "-n",
                "agent-managed",
                "-o",
                "jsonpath={.status.sync.status}",
            ])
            .await;
        matches!((spoke, hub), (Ok(s), Ok(h)) if s.success() && h.success() && h.stdout.trim() == "Synced")
    })
    .await;
    arrived.with_context(|| qs.log_tail(60))?;

    qs.signal("INT")?;
    let status = qs.wait_exit(Duration::from_secs(30))?;
    ensure!(status.success(), "quickstart after Ctrl-C: {status}\n{}", qs.log_tail(40));
    wait_until(Duration::from_secs(10), "every child to be gone", || processes_using(&qs_dir).is_empty())?;
    Ok(())
}

/// Killed outright (SIGKILL, the OOM killer), the quickstart cannot stop its children: they stop
/// themselves when the pipe it held on their stdin closes, and free the ports and data-dir locks
/// for the next run on the same `--dir`.
#[test]
fn a_sigkilled_quickstart_takes_its_children_with_it_and_the_next_run_starts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let qs_dir = dir.path().join("qs");
    let mut cmd = Command::new(workspace_binary("argocd-agent")?);
    cmd.args(["quickstart", "--dir"]).arg(&qs_dir);
    let mut qs = ChildProcess::spawn("quickstart", cmd)?;
    wait_until(DEADLINE, "the quickstart to start its six processes", || {
        qs.stdout().contains("demo Applications:") || !qs.is_running()
    })
    .with_context(|| qs.log_tail(60))?;
    qs.ensure_running()?;
    let qs_pid = qs.pid().to_string();
    let children: Vec<String> =
        processes_using(&qs_dir).into_iter().filter(|p| p.split_whitespace().next() != Some(&qs_pid)).collect();
    if children.len() != 6 {
        kill_all(&children);
        anyhow::bail!(
            "expected the quickstart's 6 processes (3 API servers, principal, 2 agents), found {children:#?}"
        );
    }

    qs.sigkill()?;
    let gone = wait_until(Duration::from_secs(30), "every child of the SIGKILLed quickstart to exit", || {
        processes_using(&qs_dir).is_empty()
    });
    if let Err(e) = gone {
        let left = processes_using(&qs_dir);
        kill_all(&left);
        return Err(e.context(format!("left running after the quickstart was SIGKILLed (now killed): {left:#?}")));
    }
    // They went because their parent did, by the shutdown path, not by some other accident.
    for log in
        ["apiserver-hub", "apiserver-managed", "apiserver-autonomous", "principal", "agent-managed", "agent-autonomous"]
    {
        let path = qs_dir.join("logs").join(format!("{log}.log"));
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        ensure!(text.contains("the parent process is gone"), "{} does not say why it stopped:\n{text}", path.display());
    }

    // Nothing holds the ports or the data dirs: the next run on the same --dir converges.
    let mut cmd = Command::new(workspace_binary("argocd-agent")?);
    cmd.args(["quickstart", "--once", "--timeout", "100", "--dir"]).arg(&qs_dir);
    let mut again = ChildProcess::spawn("second quickstart", cmd)?;
    let status = again.wait_exit(DEADLINE)?;
    ensure!(status.success(), "the second quickstart on the same --dir failed ({status}):\n{}", again.log_tail(60));
    let left = processes_using(&qs_dir);
    kill_all(&left);
    ensure!(left.is_empty(), "processes left behind by the second run: {left:?}");
    Ok(())
}

/// Kills and reaps a process the test spawned itself (its stdin must be a pipe, which
/// [`ChildProcess`] does not give).
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The mechanism on its own: `ARGOCD_AGENT_EXIT_WITH_PARENT` with a pipe on stdin shuts the
/// process down cleanly when the pipe closes; with no pipe on stdin it is ignored (a closed stdin
/// must not stop a server).
#[test]
fn a_child_told_to_exit_with_its_parent_stops_cleanly_when_the_pipe_closes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let start = |name: &str, stdin: Stdio| -> Result<(Reaped, std::path::PathBuf, std::path::PathBuf)> {
        let kubeconfig = dir.path().join(format!("{name}.kubeconfig"));
        let log = dir.path().join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let child = Command::new(workspace_binary("argocd-agent")?)
            .args(["apiserver", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join(name))
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .env("ARGOCD_AGENT_EXIT_WITH_PARENT", "1")
            .env("NO_COLOR", "1")
            .stdin(stdin)
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("cannot start argocd-agent apiserver")?;
        Ok((Reaped(child), kubeconfig, log))
    };
    let log_of = |log: &Path| std::fs::read_to_string(log).unwrap_or_default();

    let (mut piped, kubeconfig, log) = start("piped", Stdio::piped())?;
    let pipe = piped.0.stdin.take().context("stdin pipe")?;
    wait_until(DEADLINE, "the piped API server to listen", || kubeconfig.exists()).with_context(|| log_of(&log))?;
    let (mut unpiped, kubeconfig2, log2) = start("unpiped", Stdio::null())?;
    wait_until(DEADLINE, "the unpiped API server to listen", || kubeconfig2.exists()).with_context(|| log_of(&log2))?;

    drop(pipe);
    let mut status = None;
    wait_until(Duration::from_secs(30), "the API server to exit once its parent's pipe closed", || {
        status = piped.0.try_wait().ok().flatten();
        status.is_some()
    })
    .with_context(|| log_of(&log))?;
    let status = status.context("exit status")?;
    ensure!(status.success(), "exit after the pipe closed was not clean ({status}):\n{}", log_of(&log));
    ensure!(log_of(&log).contains("the parent process is gone"), "no reason logged:\n{}", log_of(&log));

    // Its stdin is /dev/null: the variable is ignored, with a warning, and the server stays up
    // (its own pipe-less stdin was at end-of-file long before the other one exited).
    ensure!(unpiped.0.try_wait()?.is_none(), "the API server with no pipe on stdin exited:\n{}", log_of(&log2));
    ensure!(log_of(&log2).contains("stdin is not a pipe"), "no warning logged:\n{}", log_of(&log2));
    Ok(())
}
