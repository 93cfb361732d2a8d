//! Pod logs through the resource proxy (upstream §5.3) across spawned binaries: real kubectl,
//! configured from the agent's cluster secret as the hub's Argo CD is, reads the logs of pods
//! of the agent's cluster (the embedded API server's simulated node runs them) and gets what
//! kubectl reads directly from that cluster; `logs -f` follows, and survives the agent
//! restarting with no line lost or repeated; errors arrive as `Status` bodies kubectl prints.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use tests::kubectl::Kubectl;
use tests::topology::{Mode, StartOptions, Topology, ensure_namespace};
use tests::wait::{DEFAULT_TIMEOUT, wait_for_async, wait_until_async};

const AGENT: &str = "agent-a";
const NS: &str = "shop";
const TRACKING: &str = "argocd.argoproj.io/tracking-id";

/// A pod Argo CD manages (kubectl reads the pod through the proxy before its log) running `script`.
fn pod(name: &str, script: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": {TRACKING: format!("shop:/Pod:{NS}/{name}")}},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}]},
    }))?)
}

async fn start() -> Result<(Topology, Kubectl, Kubectl, tempfile::TempDir)> {
    let options = StartOptions { resource_proxy: true, simulate_pods: true, ..StartOptions::default() };
    let t = Topology::start_with_options(&[(AGENT, Mode::Managed)], options).await?;
    let proxy = t.resource_proxy_addr().context("the principal serves the resource proxy")?;
    t.ctl(&["agent", "create", AGENT, "--resource-proxy-server", &proxy.to_string()])?;
    // The Application the pods' tracking ids name.
    tests::live::application_on_agent(&t, AGENT, "shop").await?;
    ensure_namespace(&t.spoke(AGENT)?, NS).await?;
    let scratch = tempfile::tempdir()?;
    let proxied = Kubectl::new(&tests::live::cluster_kubeconfig(&t, AGENT, scratch.path()).await?)?;
    let direct = Kubectl::new(&t.kubeconfig())?;
    Ok((t, proxied, direct, scratch))
}

/// The numbers of lines `tick N` in `lines`.
fn ticks(lines: &[String]) -> Vec<u64> {
    lines.iter().filter_map(|l| l.strip_prefix("tick ")).filter_map(|n| n.trim().parse().ok()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_through_the_proxy_are_the_pods_logs() -> Result<()> {
    let (t, proxied, direct, _scratch) = start().await?;
    let pods: Api<Pod> = Api::namespaced(t.spoke(AGENT)?, NS);
    pods.create(&PostParams::default(), &pod("counter", "for i in $(seq 1 40); do echo line $i; done; sleep 3600")?)
        .await?;
    let ctx = ["--context", AGENT];
    wait_until_async(DEFAULT_TIMEOUT, "the pod printed its 40 lines", || {
        let direct = &direct;
        async move {
            direct
                .run(["logs", "counter", "-n", NS, "--context", AGENT])
                .await
                .is_ok_and(|o| o.stdout.contains("line 40"))
        }
    })
    .await?;

    for extra in [&[][..], &["--tail=3"][..], &["--timestamps"][..], &["--tail=5", "--timestamps"][..]] {
        let mut args = vec!["logs", "counter", "-n", NS];
        args.extend_from_slice(extra);
        let through = proxied.ok(&args).await?;
        let mut own = args.clone();
        own.extend_from_slice(&ctx);
        let there = direct.ok(&own).await?;
        ensure!(through == there, "kubectl logs {extra:?}: through the proxy\n{through}\ndirectly\n{there}");
        ensure!(!through.is_empty(), "{extra:?}: some log");
    }
    ensure!(proxied.ok(["logs", "counter", "-n", NS, "--tail=3"]).await? == "line 38\nline 39\nline 40\n");

    // `-f` follows: lines printed after it started arrive.
    pods.create(
        &PostParams::default(),
        &pod("ticker", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.05; done")?,
    )
    .await?;
    let mut follow = proxied.spawn_watch(["logs", "-f", "ticker", "-n", NS])?;
    let first = follow.wait_for_line(DEFAULT_TIMEOUT, |l| l.starts_with("tick ")).await?;
    let n: u64 = first.trim_start_matches("tick ").parse()?;
    follow.wait_for_line(DEFAULT_TIMEOUT, |l| l == format!("tick {}", n + 40)).await?;

    // Errors are Status bodies kubectl prints: a missing pod, a bad parameter.
    let missing = proxied.fails(["get", "--raw", &format!("/api/v1/namespaces/{NS}/pods/nope/log")]).await?;
    ensure!(missing.stderr.contains("NotFound") || missing.stderr.contains("not found"), "{missing}");
    let bad = proxied.fails(["get", "--raw", &format!("/api/v1/namespaces/{NS}/pods/counter/log?tailLines=x")]).await?;
    ensure!(bad.stderr.contains("tailLines"), "{bad}");
    drop(follow);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_f_resumes_across_an_agent_restart_without_loss_or_repeats() -> Result<()> {
    let (mut t, proxied, _direct, _scratch) = start().await?;
    let pods: Api<Pod> = Api::namespaced(t.spoke(AGENT)?, NS);
    pods.create(
        &PostParams::default(),
        &pod("ticker", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.05; done")?,
    )
    .await?;
    let mut follow = proxied.spawn_watch(["logs", "-f", "ticker", "-n", NS])?;
    follow.wait_for_line(DEFAULT_TIMEOUT, |l| l.starts_with("tick ")).await?;
    let before = *ticks(&follow.lines()).last().context("a tick")?;

    t.kill_agent(AGENT)?;
    t.start_agent(AGENT).await?;
    // It continues well past where it was when the agent died.
    let target = ticks(&follow.lines()).last().copied().unwrap_or(before) + 60;
    follow.wait_for_line(DEFAULT_TIMEOUT, |l| ticks(&[l.to_owned()]).first().is_some_and(|n| *n >= target)).await?;
    let seen = ticks(&follow.lines());
    let first = *seen.first().context("ticks")?;
    let expected: Vec<u64> = (first..first + seen.len() as u64).collect();
    ensure!(
        seen == expected,
        "every line once, in order, across the restart (first {first}, {} lines): {:?}",
        seen.len(),
        seen.windows(2).filter(|w| w[1] != w[0] + 1).collect::<Vec<_>>()
    );
    ensure!(seen.len() as u64 > target - first, "it went on after the restart");
    drop(follow);

    // The agent gone: kubectl fails at once, saying why.
    t.kill_agent(AGENT)?;
    let raw = format!("/api/v1/namespaces/{NS}/pods/ticker/log");
    let refused = wait_for_async(DEFAULT_TIMEOUT, "the proxy answers that the agent is not connected", || {
        let (proxied, raw) = (&proxied, raw.clone());
        async move {
            let started = Instant::now();
            let out = proxied.run(["get", "--raw", &raw]).await?;
            Ok((!out.success() && out.stderr.contains("not connected")).then(|| (out, started.elapsed())))
        }
    })
    .await?;
    ensure!(refused.1 < Duration::from_secs(5), "at once, not after a time-out: {:?}", refused.1);
    ensure!(refused.0.stderr.contains(AGENT), "{}", refused.0.stderr);
    Ok(())
}
