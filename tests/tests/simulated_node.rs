//! The embedded API server's simulated node (`argocd-agent apiserver --simulate-pods`): Pods'
//! commands run as local processes, and kubectl 1.37 and kube-rs read their logs and exec into
//! them over WebSocket (`v5.channel.k8s.io`).

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::SinkExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, PostParams, TerminalSize};
use serde_json::json;
use tests::{ApiServerProcess, DEFAULT_TIMEOUT, kubectl_path, wait_for_async, wait_until_async};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};

const LOOP: &str = "i=0; while true; do echo line $i; i=$((i+1)); sleep 0.1; done";

fn pod(name: &str, containers: serde_json::Value) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": containers},
    }))?)
}

async fn wait_running(pods: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    wait_for_async(DEFAULT_TIMEOUT, &format!("pod {name} to be Running"), || {
        let pods = pods.clone();
        let name = name.to_string();
        async move {
            let p = pods.get(&name).await?;
            let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
            Ok((phase == "Running").then_some(p))
        }
    })
    .await
}

/// The pid of the pod's first container (`containerID: simulated://PID`).
fn pid_of(pod: &Pod) -> anyhow::Result<u32> {
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .and_then(|c| c.container_id.clone())
        .context("no containerID in the pod's status")?;
    id.strip_prefix("simulated://").context("not a simulated container id")?.parse().context("bad pid")
}

/// Whether any live process is in process group `pgid` (from /proc/*/stat; zombies do not
/// count: an orphan's reaper may be a slow init).
fn group_alive(pgid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else { return false };
    dir.filter_map(Result::ok).any(|e| {
        std::fs::read_to_string(e.path().join("stat")).ok().is_some_and(|stat| {
            // pid (comm) state ppid pgrp ...
            let fields: Vec<&str> =
                stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
            fields.get(2) == Some(&pgid.to_string().as_str()) && fields.first() != Some(&"Z")
        })
    })
}

fn kubectl_cmd(server: &ApiServerProcess, args: &[&str]) -> anyhow::Result<tokio::process::Command> {
    let mut cmd = tokio::process::Command::new(kubectl_path()?);
    cmd.arg("--kubeconfig")
        .arg(server.kubeconfig_path())
        .arg("--cache-dir")
        .arg(server.work_dir().join("kubectl-cache"))
        .args(args)
        .env_remove("KUBECONFIG")
        .env("HOME", server.work_dir())
        .kill_on_drop(true);
    Ok(cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_exec_and_delete() -> anyhow::Result<()> {
    let mut server = ApiServerProcess::start_simulating_pods().await?;
    let kubectl = server.kubectl()?;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    pods.create(
        &PostParams::default(),
        &pod("loop", json!([{"name": "main", "image": "busybox", "command": ["sh", "-c", LOOP]}]))?,
    )
    .await?;
    let running = wait_running(&pods, "loop").await?;
    let pid = pid_of(&running)?;
    ensure!(group_alive(pid), "process group {pid} is not running");

    // Logs, whole and tailed.
    let logs = wait_for_async(DEFAULT_TIMEOUT, "three log lines", || {
        let k = &kubectl;
        async move {
            let out = k.ok(["logs", "loop"]).await?;
            Ok((out.lines().count() >= 3).then_some(out))
        }
    })
    .await?;
    ensure!(logs.starts_with("line 0\nline 1\nline 2\n"), "kubectl logs: {logs:?}");
    let tail = kubectl.ok(["logs", "loop", "--tail=2"]).await?;
    let nums: Vec<u64> = tail.lines().filter_map(|l| l.strip_prefix("line ")).filter_map(|n| n.parse().ok()).collect();
    ensure!(nums.len() == 2 && nums[1] == nums[0] + 1, "kubectl logs --tail=2: {tail:?}");
    let stamped = kubectl.ok(["logs", "loop", "--tail=1", "--timestamps"]).await?;
    let (ts, rest) = stamped.split_once(' ').context("no timestamp")?;
    ensure!(chrono::DateTime::parse_from_rfc3339(ts).is_ok() && ts.len() == 30, "timestamp {ts:?}");
    ensure!(rest.starts_with("line "), "kubectl logs --timestamps: {stamped:?}");

    // Follow: new lines arrive as they are written.
    let mut follow = kubectl_cmd(&server, &["logs", "-f", "loop", "--tail=1"])?
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(follow.stdout.take().context("stdout")?).lines();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let line = tokio::time::timeout(DEFAULT_TIMEOUT, lines.next_line())
            .await
            .context("kubectl logs -f printed nothing new")??
            .context("kubectl logs -f ended")?;
        seen.push(line.strip_prefix("line ").and_then(|n| n.parse::<u64>().ok()).context("not a log line")?);
    }
    ensure!(seen.windows(2).all(|w| w[1] == w[0] + 1), "followed lines {seen:?}");
    follow.start_kill()?;
    follow.wait().await?;

    // exec -i with stdin piped: it comes back.
    let mut cat = kubectl_cmd(&server, &["exec", "-i", "loop", "--", "cat"])?
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdin = cat.stdin.take().context("stdin")?;
    stdin.write_all(b"hello from stdin\nsecond line\n").await?;
    drop(stdin);
    let out =
        tokio::time::timeout(DEFAULT_TIMEOUT, cat.wait_with_output()).await.context("kubectl exec -i cat hung")??;
    ensure!(
        out.status.success() && out.stdout == b"hello from stdin\nsecond line\n",
        "kubectl exec -i cat: {:?} stdout {:?} stderr {:?}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Exit codes and both streams.
    let out = kubectl.run(["exec", "loop", "--", "sh", "-c", "echo out; echo err >&2; exit 3"]).await?;
    ensure!(out.status.code() == Some(3), "exit status: {out}");
    ensure!(out.stdout == "out\n" && out.stderr.contains("err\n"), "streams: {out}");
    let out = kubectl.run(["exec", "loop", "--", "sh", "-c", "pwd; echo $HOSTNAME"]).await?;
    ensure!(out.success() && out.stdout.ends_with("\nloop\n"), "workdir and env: {out}");

    // A container without a command waits, and says why; container choice errors as Kubernetes.
    pods.create(
        &PostParams::default(),
        &pod(
            "two",
            json!([{"name": "a", "image": "x", "command": ["sleep", "3600"]}, {"name": "b", "image": "nginx"}]),
        )?,
    )
    .await?;
    wait_for_async(DEFAULT_TIMEOUT, "container b to say it needs a command", || {
        let pods = pods.clone();
        async move {
            let p = serde_json::to_value(pods.get("two").await?)?;
            let reason = p.pointer("/status/containerStatuses/1/state/waiting/reason").cloned();
            Ok((reason == Some(json!(apiserver_needs_command()))).then_some(()))
        }
    })
    .await?;
    let req = http::Request::get("/api/v1/namespaces/default/pods/two/log").body(Vec::new())?;
    let err = server.client().request_text(req).await.err().context("log of a two-container pod answered")?;
    ensure!(err.to_string().contains("a container name must be specified for pod two, choose one of: [a b]"), "{err}");
    let out = kubectl.run(["exec", "two", "-c", "b", "--", "true"]).await?;
    ensure!(!out.success() && out.stderr.contains("container not found"), "{out}");
    kubectl.ok(["delete", "pod", "two"]).await?;

    // Deleting the pod kills its process group.
    kubectl.ok(["delete", "pod", "loop"]).await?;
    wait_until_async(DEFAULT_TIMEOUT, "the pod's process group to be gone", || async move { !group_alive(pid) })
        .await?;
    server.stop().await?;
    Ok(())
}

fn apiserver_needs_command() -> &'static str {
    "SimulatedNodeNeedsCommand"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_exec_with_stdin_and_a_tty() -> anyhow::Result<()> {
    let mut server = ApiServerProcess::start_simulating_pods().await?;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    pods.create(
        &PostParams::default(),
        &pod(
            "shell",
            json!([{"name": "main", "image": "busybox", "command": ["sh", "-c", "while true; do sleep 1; done"],
            "env": [{"name": "GREETING", "value": "hi there"}]}]),
        )?,
    )
    .await?;
    wait_running(&pods, "shell").await?;

    // stdin in, stdout out, then the status.
    let mut attached = pods
        .exec("shell", ["sh", "-c", "cat; echo $GREETING"], &AttachParams::default().stdin(true).stderr(false))
        .await?;
    let mut stdin = attached.stdin().context("no stdin")?;
    let mut stdout = attached.stdout().context("no stdout")?;
    let status = attached.take_status().context("no status")?;
    stdin.write_all(b"piped through\n").await?;
    // End of input: kube-rs sends the v5 close of stdin.
    stdin.shutdown().await?;
    drop(stdin);
    let mut out = String::new();
    tokio::time::timeout(DEFAULT_TIMEOUT, stdout.read_to_string(&mut out)).await.context("exec output hung")??;
    ensure!(out == "piped through\nhi there\n", "exec output {out:?}");
    let status = tokio::time::timeout(DEFAULT_TIMEOUT, status).await?.context("no status")?;
    ensure!(status.status.as_deref() == Some("Success"), "{status:?}");
    attached.join().await?;

    // A tty, resized: the command sees the size.
    let mut attached =
        pods.exec("shell", ["sh", "-c", "while read x; do stty size; done"], &AttachParams::interactive_tty()).await?;
    let mut size = attached.terminal_size().context("no terminal size sender")?;
    size.send(TerminalSize { width: 123, height: 45 }).await?;
    let mut stdin = attached.stdin().context("no stdin")?;
    let mut stdout = attached.stdout().context("no stdout")?;
    let status = attached.take_status().context("no status")?;
    let mut seen = String::new();
    let mut poll = tests::Poller::new(DEFAULT_TIMEOUT, "the tty to report 45 123");
    while !seen.contains("45 123") {
        stdin.write_all(b"size?\n").await?;
        let mut buf = [0u8; 1024];
        if let Ok(n) = tokio::time::timeout(Duration::from_millis(500), stdout.read(&mut buf)).await {
            let n = n?;
            if n == 0 {
                bail!("tty output ended: {seen:?}");
            }
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        poll.tick().await.with_context(|| format!("tty output so far: {seen:?}"))?;
    }
    // End of input (v5 close of stdin) ends `read`, and the command.
    stdin.shutdown().await?;
    drop(stdin);
    let status = tokio::time::timeout(DEFAULT_TIMEOUT, status).await?.context("no status")?;
    ensure!(status.status.as_deref() == Some("Success"), "{status:?}");
    drop(stdout);
    attached.join().await?;
    server.stop().await?;
    Ok(())
}
