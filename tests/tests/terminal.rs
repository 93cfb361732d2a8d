//! Web terminals through the resource proxy (upstream §5.4) across spawned binaries: real
//! kubectl, configured from the agent's cluster secret as the hub's Argo CD is, execs into pods
//! of the agent's cluster (the embedded API server's simulated node runs them): stdin reaches
//! the command and its EOF ends it, stdout and stderr stay apart, the exit code comes back; a
//! tty session resizes; Argo CD UI's frames work; refusals arrive as `Status` messages.

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use futures::{SinkExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, PostParams, TerminalSize};
use serde_json::json;
use tests::kubectl::Kubectl;
use tests::topology::{Mode, StartOptions, Topology, ensure_namespace};
use tests::wait::{DEFAULT_TIMEOUT, wait_for_async};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const AGENT: &str = "agent-a";
const AUTONOMOUS: &str = "agent-b";
const NS: &str = "shop";
const TRACKING: &str = "argocd.argoproj.io/tracking-id";

/// A pod that sleeps; tracked by an Argo CD Application when `managed`.
fn pod(name: &str, managed: bool) -> Result<Pod> {
    let annotations = if managed { json!({TRACKING: format!("shop:/Pod:{NS}/{name}")}) } else { json!({}) };
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}]},
    }))?)
}

async fn running(pods: &Api<Pod>, name: &str) -> Result<()> {
    wait_for_async(DEFAULT_TIMEOUT, &format!("pod {name} to run"), || async {
        let pod = pods.get(name).await?;
        Ok((pod.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
    })
    .await
}

/// Reads `reader` until what was read contains `needle` (bounded).
async fn read_until(reader: &mut (impl tokio::io::AsyncRead + Unpin), needle: &str) -> Result<String> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(DEFAULT_TIMEOUT, async {
        loop {
            let n = reader.read(&mut buf).await?;
            if n == 0 {
                bail!("the stream ended before {needle:?}: {:?}", String::from_utf8_lossy(&seen));
            }
            seen.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&seen).contains(needle) {
                return Ok(String::from_utf8_lossy(&seen).into_owned());
            }
        }
    })
    .await
    .with_context(|| format!("{needle:?} did not come in time"))?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_through_the_proxy_reaches_managed_pods_of_the_agent() -> Result<()> {
    // Terminals are off unless the agent's operator turns them on.
    let options = StartOptions {
        resource_proxy: true,
        simulate_pods: true,
        agent_args: vec!["--enable-web-terminal".into()],
        ..StartOptions::default()
    };
    let mut t =
        Topology::start_with_options(&[(AGENT, Mode::Managed), (AUTONOMOUS, Mode::Autonomous)], options).await?;
    let proxy = t.resource_proxy_addr().context("the principal serves the resource proxy")?;
    for agent in [AGENT, AUTONOMOUS] {
        t.ctl(&["agent", "create", agent, "--resource-proxy-server", &proxy.to_string()])?;
    }
    // The Application the pods' tracking ids name: the principal's on the managed agent, one
    // the autonomous agent sent up on the other.
    tests::live::application_on_agent(&t, AGENT, "shop").await?;
    let autonomous_app = tests::fixtures::app_with_path("shop", tests::topology::ARGOCD_NS, "live")?;
    tests::apps::apps(&t.spoke(AUTONOMOUS)?, tests::topology::ARGOCD_NS)
        .create(&PostParams::default(), &autonomous_app)
        .await?;
    let hub_apps = tests::apps::apps(&t.hub(), AUTONOMOUS);
    wait_for_async(DEFAULT_TIMEOUT, "the autonomous agent's Application on the hub", || async {
        Ok(hub_apps.get_opt("shop").await?.map(|_| ()))
    })
    .await?;
    let spoke = t.spoke(AGENT)?;
    ensure_namespace(&spoke, NS).await?;
    let pods: Api<Pod> = Api::namespaced(spoke, NS);
    pods.create(&PostParams::default(), &pod("shell", true)?).await?;
    pods.create(&PostParams::default(), &pod("plain", false)?).await?;
    running(&pods, "shell").await?;
    running(&pods, "plain").await?;
    let scratch = tempfile::tempdir()?;
    let kubectl = Kubectl::new(&tests::live::cluster_kubeconfig(&t, AGENT, scratch.path()).await?)?;

    // Piped stdin reaches the command; its EOF (v5 close of channel 0) ends `cat`.
    let input = "hello\nthrough the principal\n";
    let out = kubectl.run_with_stdin(["exec", "-i", "shell", "-n", NS, "--", "cat"], input.as_bytes()).await?;
    ensure!(out.success() && out.stdout == input, "{out}");

    // stdout and stderr apart, and the exit code, as the kubelet reports them.
    let out = kubectl.run(["exec", "shell", "-n", NS, "--", "sh", "-c", "echo out; echo err >&2; exit 3"]).await?;
    ensure!(out.status.code() == Some(3), "the remote exit code: {out}");
    ensure!(out.stdout.trim() == "out" && out.stderr.contains("err") && !out.stdout.contains("err"), "{out}");

    // A pod no Argo CD Application manages: refused by the agent, with a message kubectl prints.
    let out = kubectl.run(["exec", "plain", "-n", NS, "--", "echo", "never"]).await?;
    ensure!(!out.success() && out.stderr.contains("not managed") && !out.stdout.contains("never"), "{out}");
    // A pod that does not exist.
    let out = kubectl.run(["exec", "nope", "-n", NS, "--", "true"]).await?;
    ensure!(!out.success() && out.stderr.contains("not found"), "{out}");

    // A tty session from a Rust WebSocket client (kube-rs over tokio-tungstenite, v5) with the
    // cluster secret's client certificate: a resize reaches the terminal.
    let client = tests::live::cluster_client(&t, AGENT).await?;
    let proxied: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut shell = proxied.exec("shell", ["sh"], &AttachParams::interactive_tty()).await?;
    let mut resize = shell.terminal_size().context("a tty resizes")?;
    let mut stdin = shell.stdin().context("stdin")?;
    let mut stdout = shell.stdout().context("stdout")?;
    let status = shell.take_status().context("status")?;
    resize.send(TerminalSize { width: 111, height: 33 }).await?;
    // The resize and the command race through different paths of the pty: ask until it shows
    // (`do""ne`: the terminal's echo of the command line is not the marker).
    let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
    loop {
        stdin.write_all(b"stty size; echo do\"\"ne\n").await?;
        let seen = read_until(&mut stdout, "done\r\n").await?;
        if seen.contains("33 111") {
            break;
        }
        ensure!(tokio::time::Instant::now() < deadline, "the terminal never had the new size: {seen:?}");
    }
    stdin.write_all(b"exit 4\n").await?;
    let status = tokio::time::timeout(DEFAULT_TIMEOUT, status).await?.context("a status")?;
    ensure!(status.reason.as_deref() == Some("NonZeroExitCode"), "{status:?}");
    let causes = status.details.and_then(|d| d.causes).unwrap_or_default();
    ensure!(causes.iter().any(|c| c.message.as_deref() == Some("4")), "{causes:?}");

    // Argo CD UI's shapes: one `command`, no stream flags (a tty), JSON text frames.
    let request = http::Request::get(format!("/api/v1/namespaces/{NS}/pods/shell/exec?container=main&command=sh"))
        .body(Vec::new())?;
    let mut ws = client.connect(request).await?.into_stream();
    ws.send(r#"{"operation":"resize","cols":120,"rows":40}"#.to_owned().into()).await?;
    ws.send(r#"{"operation":"stdin","data":"stty size; exit\n"}"#.to_owned().into()).await?;
    let (mut output, mut status) = (Vec::new(), Vec::new());
    tokio::time::timeout(DEFAULT_TIMEOUT, async {
        while let Some(msg) = ws.next().await {
            let msg = msg?;
            if msg.is_close() {
                break;
            }
            let data = msg.into_data();
            match data.split_first() {
                Some((1, out)) => output.extend_from_slice(out),
                Some((3, s)) => status.extend_from_slice(s),
                _ => {}
            }
        }
        anyhow::Ok(())
    })
    .await??;
    let output = String::from_utf8_lossy(&output);
    ensure!(output.contains("40 120"), "the UI's resize reached the terminal: {output:?}");
    ensure!(String::from_utf8_lossy(&status).contains("Success"), "{}", String::from_utf8_lossy(&status));

    // Not a WebSocket (SPDY, or a plain request): refused saying what is served.
    let plain = client
        .request_text(
            http::Request::post(format!("/api/v1/namespaces/{NS}/pods/shell/exec?command=true&stdout=true"))
                .body(Vec::new())?,
        )
        .await;
    ensure!(format!("{plain:?}").contains("WebSocket"), "{plain:?}");

    // Autonomous agents serve no terminals (as upstream), managed pod or not.
    let other = t.spoke(AUTONOMOUS)?;
    ensure_namespace(&other, NS).await?;
    Api::<Pod>::namespaced(other, NS).create(&PostParams::default(), &pod("shell", true)?).await?;
    let autonomous = Kubectl::new(&tests::live::cluster_kubeconfig(&t, AUTONOMOUS, scratch.path()).await?)?;
    let out = autonomous.run(["exec", "shell", "-n", NS, "--", "true"]).await?;
    ensure!(!out.success() && out.stderr.contains("managed agents only"), "{out}");

    // The agent down: refused at once, saying so.
    t.kill_agent(AGENT)?;
    let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
    loop {
        // (This kubectl has discovery cached, as Argo CD has: the pod's GET and the exec fail.)
        let out = kubectl.run(["exec", "shell", "-n", NS, "--", "true"]).await?;
        ensure!(!out.success(), "{out}");
        if out.stderr.contains("not connected") {
            break;
        }
        ensure!(tokio::time::Instant::now() < deadline, "agent-a never seen as disconnected: {out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The exec itself (what a client with the pod at hand sends): refused before any upgrade.
    let started = std::time::Instant::now();
    let request = http::Request::get(format!("/api/v1/namespaces/{NS}/pods/shell/exec?command=true&stdout=true"))
        .body(Vec::new())?;
    let refused = client.connect(request).await.err().context("no terminal without the agent")?;
    ensure!(refused.to_string().contains("not connected"), "{refused}");
    ensure!(started.elapsed() < Duration::from_secs(5), "refused at once: {:?}", started.elapsed());
    Ok(())
}
