//! What the load benchmarks (`benches/storm.rs`, `benches/failover.rs`) share: an embedded hub
//! API server with the principal namespace and JWT signing keys made by `argocd-agentctl`, and
//! release principals spawned on it in mesh mode (`--insecure-plaintext --auth xfcc:`), which
//! [`crate::loadgen`] drives.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::loadgen::{LoadGen, procstat};
use crate::{ApiServerProcess, ChildProcess, wait_for, workspace_binary};

/// The principal namespace.
pub const NS: &str = "argocd";

/// An embedded hub API server with namespace [`NS`] and two JWT signing keys (the second
/// replaces the first in the hub's Secret: a principal started with it refuses every session
/// of the first).
#[derive(Debug)]
pub struct LoadHub {
    /// The API server.
    pub api: ApiServerProcess,
    /// The signing keys.
    pub keys: [PathBuf; 2],
    _dir: tempfile::TempDir,
}

/// Creates namespace `name`.
///
/// # Errors
/// The API server refuses it.
pub async fn create_namespace(client: kube::Client, name: &str) -> anyhow::Result<()> {
    let namespaces: kube::api::Api<k8s_openapi::api::core::v1::Namespace> = kube::api::Api::all(client);
    let mut ns = k8s_openapi::api::core::v1::Namespace::default();
    ns.metadata.name = Some(name.to_owned());
    namespaces
        .create(&kube::api::PostParams::default(), &ns)
        .await
        .with_context(|| format!("cannot create the {name} namespace"))?;
    Ok(())
}

impl LoadHub {
    /// Starts the API server and makes the keys: RSA-4096 (upstream's), or of the type
    /// `BENCH_JWT_KEY_TYPE` names (`ecdsa-p256`: tokens ES256, `argocd-agentctl jwt create-key
    /// --type`).
    ///
    /// # Errors
    /// The API server or `argocd-agentctl` fails.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with_key_type("rsa").await
    }

    /// The same, with keys of `default_type` unless `BENCH_JWT_KEY_TYPE` names one.
    ///
    /// # Errors
    /// The API server or `argocd-agentctl` fails.
    pub async fn start_with_key_type(default_type: &str) -> anyhow::Result<Self> {
        let key_type = std::env::var("BENCH_JWT_KEY_TYPE").unwrap_or_else(|_| default_type.to_owned());
        let api = ApiServerProcess::start().await?;
        create_namespace(api.client(), NS).await?;
        let dir = tempfile::Builder::new().prefix("loadhub-jwt-").tempdir()?;
        let mut keys = Vec::new();
        for (i, upsert) in [(0, false), (1, true)] {
            let out_dir = dir.path().join(format!("key-{i}"));
            let mut cmd = Command::new(workspace_binary("argocd-agentctl")?);
            cmd.arg("--kubeconfig")
                .arg(api.kubeconfig_path())
                .args(["jwt", "create-key", "--type", &key_type, "--out-dir"])
                .arg(&out_dir);
            if upsert {
                cmd.arg("--upsert");
            }
            let out = cmd.output().context("cannot run argocd-agentctl")?;
            if !out.status.success() {
                bail!("argocd-agentctl jwt create-key: {}", String::from_utf8_lossy(&out.stderr));
            }
            keys.push(out_dir.join("jwt.key"));
        }
        let keys: [PathBuf; 2] = keys.try_into().map_err(|_| anyhow::anyhow!("two keys expected"))?;
        Ok(Self { api, keys, _dir: dir })
    }
}

/// A spawned principal in mesh mode on a [`LoadHub`].
#[derive(Debug)]
pub struct LoadPrincipal {
    /// The process.
    pub process: ChildProcess,
    /// Its agents' port.
    pub port: u16,
}

/// How many agent connections a principal started by these benchmarks holds at once: its
/// default `--grpc-max-connections`, half of the open-file limit less a reserve
/// (`principal::transport::limits::cap`; the principal inherits this process's limit). Agents
/// past it are refused at connect and retry for ever, so a benchmark size above it never
/// completes: the benchmarks check their sizes against it first.
#[must_use]
pub fn agent_connection_cap() -> usize {
    use principal::transport::limits::{Listener, cap, open_file_limit};
    cap(Listener::Agents, None, open_file_limit())
}

/// Extra flags for the benchmarks' principals (`BENCH_PRINCIPAL_FLAGS`, split on whitespace),
/// e.g. `--auth-signing-concurrency 512 --auth-signing-queue 1000000` (signing as before the
/// signing gate, for a same-binary baseline) or `--access-token-lifetime 30m`.
#[must_use]
pub fn principal_flags() -> Vec<String> {
    std::env::var("BENCH_PRINCIPAL_FLAGS").unwrap_or_default().split_whitespace().map(str::to_owned).collect()
}

impl LoadPrincipal {
    /// Starts one signing with `key` on `port` (0: a free one); returns it and how long after
    /// `start` it listened.
    ///
    /// # Errors
    /// It does not listen in time.
    pub fn start(hub: &LoadHub, key: &Path, port: u16, start: Instant) -> anyhow::Result<(Self, Duration)> {
        Self::start_with(hub, key, port, start, &[])
    }

    /// The same with `extra` flags.
    ///
    /// # Errors
    /// It does not listen in time.
    pub fn start_with(
        hub: &LoadHub,
        key: &Path,
        port: u16,
        start: Instant,
        extra: &[&str],
    ) -> anyhow::Result<(Self, Duration)> {
        Self::start_program(&workspace_binary("argocd-agent")?, hub, key, port, start, extra)
    }

    /// The same with the `argocd-agent` binary at `program` (another build, for a same-run
    /// baseline).
    ///
    /// # Errors
    /// As [`Self::start`].
    pub fn start_program(
        program: &Path,
        hub: &LoadHub,
        key: &Path,
        port: u16,
        start: Instant,
        extra: &[&str],
    ) -> anyhow::Result<(Self, Duration)> {
        let mut cmd = Command::new(program);
        cmd.args(["principal", "--allowed-namespaces", "*", "--namespace", NS, "--auth", "xfcc:"])
            .args(extra)
            .args(["--insecure-plaintext", "--listen-host", "127.0.0.1", "--listen-port", &port.to_string()])
            .args(["--log-level", "info", "--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"])
            .arg("--kubeconfig")
            .arg(hub.api.kubeconfig_path())
            .arg("--jwt-key")
            .arg(key)
            .env("NO_COLOR", "1");
        let mut process = ChildProcess::spawn("principal", cmd)?;
        let addr = wait_for(Duration::from_secs(60), "the principal to listen", || {
            process.ensure_running()?;
            Ok(process.stdout().lines().find_map(|l| l.strip_prefix("principal listening on ").map(str::to_owned)))
        })?;
        let listening = start.elapsed();
        let port = addr.trim().rsplit(':').next().and_then(|p| p.parse().ok()).context("principal address")?;
        Ok((Self { process, port }, listening))
    }

    /// Its agents' URL.
    #[must_use]
    pub fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Its resident memory in KiB.
    ///
    /// # Errors
    /// `/proc` cannot be read.
    pub fn rss(&self) -> anyhow::Result<u64> {
        procstat::rss_kib(self.pid())
    }

    /// `cannot start resync` warnings and ERROR lines in its log, counted.
    #[must_use]
    pub fn warnings(&self) -> String {
        let log = self.process.stderr();
        let resync = log.lines().filter(|l| l.contains("cannot start resync")).count();
        let errors = log.lines().filter(|l| l.contains(" ERROR ")).count();
        format!("{resync} \"cannot start resync\" warnings, {errors} ERROR lines")
    }

    /// Its `/metrics` text.
    ///
    /// # Errors
    /// No metrics address was printed, or the scrape fails.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        let metrics = self
            .process
            .stdout()
            .lines()
            .find_map(|l| l.strip_prefix("principal metrics listening on ").map(|a| a.trim().to_owned()))
            .context("the principal's metrics address")?;
        let (_, text) = crate::http::get(metrics.parse()?, "/metrics").await?;
        Ok(text)
    }

    /// The sum over every series of metric `name` whose labels contain `label` (e.g.
    /// `result="started"`; empty: every series).
    ///
    /// # Errors
    /// The scrape fails.
    pub async fn metric_sum(&self, name: &str, label: &str) -> anyhow::Result<f64> {
        let text = self.metrics().await?;
        Ok(text
            .lines()
            .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    /// The sum of `argocd_principal_resyncs_total` over agents with this `result`.
    ///
    /// # Errors
    /// The scrape fails.
    pub async fn resyncs(&self, result: &str) -> anyhow::Result<f64> {
        self.metric_sum("argocd_principal_resyncs_total", &format!("result=\"{result}\"")).await
    }

    /// How many times it logged `agent connected`.
    #[must_use]
    pub fn connects(&self) -> usize {
        self.process.stderr().lines().filter(|l| l.contains("agent connected")).count()
    }
}

/// One AppProject change on the hub that every agent must apply.
#[derive(Debug, Clone, Copy)]
pub struct Fanout {
    /// Until the hub API server acknowledged the write (the baseline: one hub write).
    pub hub_write: Duration,
    /// Until the first and the last agent applied it.
    pub first: Duration,
    /// Until the last.
    pub last: Duration,
}

/// The AppProject every agent matches (destination name `*`, source namespaces `*`).
pub const FANOUT_PROJECT: &str = "fanout";

/// The fan-out AppProject with `description`.
///
/// # Errors
/// It cannot be encoded.
pub fn fanout_project(description: &str) -> anyhow::Result<kube::api::DynamicObject> {
    crate::fixtures::dynamic(serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AppProject",
        "metadata": {"name": FANOUT_PROJECT, "namespace": NS},
        "spec": {
            "description": description,
            "sourceRepos": ["*"],
            "sourceNamespaces": ["*"],
            "destinations": [{"name": "*", "namespace": "*"}],
        },
    }))
}

/// The hub's AppProjects in [`NS`].
#[must_use]
pub fn projects(hub: &LoadHub) -> kube::api::Api<kube::api::DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AppProject");
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, "appprojects");
    kube::api::Api::namespaced_with(hub.api.client(), NS, &ar)
}

/// Changes the fan-out AppProject's description and waits until every agent has applied it.
///
/// # Errors
/// The write fails, or not every agent applied it within `timeout`.
pub async fn fanout(hub: &LoadHub, loads: &[LoadGen], level: usize, timeout: Duration) -> anyhow::Result<Fanout> {
    use kube::api::{Patch, PatchParams};
    let marker = format!("fan-out to {level} agents");
    for load in loads {
        load.expect_marker(&marker);
    }
    let started = Instant::now();
    let patch = Patch::Merge(serde_json::json!({"spec": {"description": marker}}));
    projects(hub)
        .patch(FANOUT_PROJECT, &PatchParams::default(), &patch)
        .await
        .context("cannot change the AppProject")?;
    let hub_write = started.elapsed();
    let (mut first, mut last) = (Duration::MAX, Duration::ZERO);
    for load in loads {
        let (f, l) = load.wait_all_marked(started, timeout).await?;
        first = first.min(f);
        last = last.max(l);
    }
    Ok(Fanout { hub_write, first, last })
}

/// A progress callback for [`LoadGen::wait_all_resynced`]: a line every 10 s.
pub fn progress(label: impl Into<String>, total: usize) -> impl FnMut(usize, Duration) {
    let label = label.into();
    let mut last = Instant::now();
    move |count, elapsed| {
        if last.elapsed() >= Duration::from_secs(10) {
            last = Instant::now();
            eprintln!("  {label}: {count}/{total} resynced after {:.0} s", elapsed.as_secs_f64());
        }
    }
}
