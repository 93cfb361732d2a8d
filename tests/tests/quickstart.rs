//! `argocd-agent quickstart` as a user runs it: three API servers, PKI, principal and two agents
//! as real processes over mTLS; Applications travel both ways; nothing is left running.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use tests::bin_path::workspace_binary;
use tests::kubectl::Kubectl;
use tests::process::ChildProcess;
use tests::wait::{wait_until, wait_until_async};

const DEADLINE: Duration = Duration::from_secs(120);

/// Processes whose command line mentions `dir` (every child of a quickstart does).
fn processes_using(dir: &Path) -> Vec<String> {
    let out = Command::new("pgrep").args(["-a", "-f", &dir.display().to_string()]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect()).unwrap_or_default()
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
        "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: mine\n  namespace: agent-managed\nspec:\n  project: default\n  source:\n    repoURL: https://example.com/mine.git\n    path: mine\n  destination:\n    server: https://kubernetes.default.svc\n    namespace: mine\n",
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
