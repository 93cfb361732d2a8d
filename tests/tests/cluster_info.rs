//! Each agent's cluster info in the hub's Argo CD Redis, across spawned binaries and real
//! redis-servers (Debian's): what `argocd cluster list`, `argocd cluster get` and the Clusters
//! page read for an agent's cluster (upstream `internal/argocd/cluster`).
//!
//! The hub's Redis has TLS and a password, as Argo CD's does in upstream's manifests. Each
//! agent's own Redis holds the cluster info its Argo CD's controller caches for the in-cluster
//! destination; the agent reports its counts (`cluster-cache-info-update`), the principal
//! writes `cluster|info|<cluster secret server>|1.8.3.gz`. The value is decoded here as Argo CD
//! v3.5.1 decodes it, written from its source rather than with our codec:
//! `util/cache/redis.go` `redisCache.unmarshal` (a gzip reader, then `json.Decoder.Decode`
//! into `v1alpha1.ClusterInfo`, whose JSON names are in `pkg/apis/application/v1alpha1/
//! types.go`: `connectionState{status,message,attemptedAt}`, `serverVersion`,
//! `cacheInfo{resourcesCount,apisCount,lastCacheSyncTime}`, `applicationsCount`), under the key
//! of `util/cache/appstate/cache.go` `clusterInfoKey` + `util/cache/cache.go`
//! `generateFullKey` (`|1.8.3`) + `redisCache.getKey` (`.gz`).

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, ensure};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Secret;
use serde_json::Value;
use tests::redis::{RedisServer, TlsFiles};
use tests::topology::{Mode, StartOptions, Topology};
use tests::wait::{DEFAULT_TIMEOUT, Poller};

/// The hub Redis's password.
const PASSWORD: &str = "hub-s3cret";

/// One redis-server ([`RedisServer`]) and the password it requires, if any.
struct Redis {
    server: RedisServer,
    password: Option<&'static str>,
}

impl Redis {
    /// Starts one (TLS only with `tls`, a password with `password`) and waits until it is ready.
    async fn start(name: &str, tls: Option<&TlsFiles>, password: Option<&'static str>) -> Result<Self> {
        Self::start_on(name, None, tls, password).await
    }

    /// [`Self::start`] on `port` (`None`: a free one).
    async fn start_on(
        name: &str,
        fixed: Option<u16>,
        tls: Option<&TlsFiles>,
        password: Option<&'static str>,
    ) -> Result<Self> {
        let extra: Vec<&str> = password.map(|p| vec!["--requirepass", p]).unwrap_or_default();
        Ok(Self { server: RedisServer::start_on(name, fixed, tls, &extra).await?, password })
    }

    fn addr(&self) -> String {
        self.server.addr()
    }

    /// redis-cli against this server; its raw standard output.
    fn cli(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<Vec<u8>> {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &self.server.port.to_string()]);
        if let Some(ca) = &self.server.ca {
            cmd.arg("--tls").arg("--cacert").arg(ca);
        }
        if let Some(password) = self.password {
            cmd.args(["-a", password, "--no-auth-warning"]);
        }
        cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().context("redis-cli is missing (Debian package redis-tools)")?;
        let mut input = child.stdin.take().context("stdin")?;
        if let Some(bytes) = stdin {
            input.write_all(bytes)?;
        }
        drop(input);
        let out = child.wait_with_output()?;
        ensure!(out.status.success(), "redis-cli {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(out.stdout)
    }

    /// `SET key <bytes>` (binary-safe: redis-cli -x takes the last argument from stdin).
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let out = self.cli(&["-x", "SET", key], Some(value))?;
        ensure!(String::from_utf8_lossy(&out).trim() == "OK", "SET {key}: {}", String::from_utf8_lossy(&out));
        Ok(())
    }

    /// `GET key`, the value's bytes; `None` on a miss.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        // --raw prints the bulk string's bytes as they are, then a newline; a miss prints only that.
        let mut out = self.cli(&["--raw", "GET", key], None)?;
        ensure!(out.pop() == Some(b'\n'), "redis-cli --raw ends with a newline");
        Ok(Some(out).filter(|v| !v.is_empty()))
    }
}

/// `bytes` gzipped by the real gzip tool, and back.
fn gzip(bytes: &[u8], decompress: bool) -> Result<Vec<u8>> {
    let mut child = Command::new("gzip")
        .arg(if decompress { "-dc" } else { "-c" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().context("stdin")?.write_all(bytes)?;
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "gzip: {}", String::from_utf8_lossy(&out.stderr));
    Ok(out.stdout)
}

/// Argo CD's `GetClusterInfo` of `server` on `redis`: `None` on a miss (module docs).
fn argo_cd_cluster_info(redis: &Redis, server: &str) -> Result<Option<Value>> {
    let key = format!("cluster|info|{server}|1.8.3.gz");
    let Some(value) = redis.get(&key)? else { return Ok(None) };
    let json = gzip(&value, true).with_context(|| format!("{key}: not gzip"))?;
    // json.Encoder wrote one value and a newline.
    ensure!(json.ends_with(b"}\n"), "{key}: one JSON value and a newline: {:?}", String::from_utf8_lossy(&json));
    Ok(Some(serde_json::from_slice(&json).with_context(|| format!("{key}: not JSON"))?))
}

/// The cluster info an agent's Argo CD controller caches for its own cluster
/// (`controller/clusterinfoupdater.go`: counts and sync time when its cache is synced).
fn spoke_cluster_info(apps: i64, apis: i64, resources: i64) -> Vec<u8> {
    let info = serde_json::json!({
        "connectionState": {"status": "Successful", "message": "", "attemptedAt": "2026-12-02T10:00:00Z"},
        "serverVersion": "1.37",
        "cacheInfo": {"resourcesCount": resources, "apisCount": apis, "lastCacheSyncTime": "2026-12-02T09:59:30Z"},
        "applicationsCount": apps,
        "apiVersions": ["v1", "apps/v1"],
    });
    format!("{info}\n").into_bytes()
}

/// Argo CD's cluster secret for `agent` (as self-registration or an operator writes it).
fn cluster_secret(agent: &str, server: &str) -> Secret {
    let bytes = |s: &str| k8s_openapi::ByteString(s.as_bytes().to_vec());
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("cluster-{agent}")),
            namespace: Some("argocd".into()),
            labels: Some(
                [
                    ("argocd.argoproj.io/secret-type".to_owned(), "cluster".to_owned()),
                    ("argocd-agent.argoproj-labs.io/agent-name".to_owned(), agent.to_owned()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        data: Some(
            [
                ("name".to_owned(), bytes(agent)),
                ("server".to_owned(), bytes(server)),
                ("config".to_owned(), bytes("{}")),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

fn time_of(info: &Value) -> Result<DateTime<Utc>> {
    let text = info["connectionState"]["attemptedAt"].as_str().context("attemptedAt")?;
    Ok(DateTime::parse_from_rfc3339(text)?.with_timezone(&Utc))
}

/// Waits until `server`'s cluster info on `hub` satisfies `ok`; returns it.
async fn wait_for(hub: &Redis, server: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Result<Value> {
    let mut poll = Poller::new(DEFAULT_TIMEOUT, what);
    loop {
        if let Some(info) = argo_cd_cluster_info(hub, server)?
            && ok(&info)
        {
            return Ok(info);
        }
        poll.tick().await?;
    }
}

/// An agent connects: Argo CD's key for its cluster shows it `Successful` since then, with the
/// counts and Kubernetes version its own Argo CD caches and the agent's version, for Argo CD's
/// 10 minutes; counts follow the agent's Argo CD; an agent that goes away shows `Failed` since
/// then. Both modes report; TLS and a password to the hub's Redis, as Argo CD's has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argo_cd_sees_each_agent_connected_with_counts_then_disconnected() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = tests::pki::Ca::generate("redis-ca")?;
    let hub_files = TlsFiles::issue(&ca, dir.path(), "redis-hub")?;
    let proxy_files = TlsFiles::issue(&ca, dir.path(), "redis-proxy")?;
    let hub = Redis::start("redis-hub", Some(&hub_files), Some(PASSWORD)).await?;
    let spoke_m = Redis::start("redis-agent-m", None, None).await?;
    let spoke_a = Redis::start("redis-agent-a", None, None).await?;
    // The agents' Argo CDs: gzip (Argo CD's default), and --redis-compression none.
    let in_cluster = "cluster|info|https://kubernetes.default.svc|1.8.3";
    spoke_m.set(&format!("{in_cluster}.gz"), &gzip(&spoke_cluster_info(3, 41, 1234), false)?)?;
    spoke_a.set(in_cluster, &spoke_cluster_info(1, 12, 99))?;
    let creds = dir.path().join("redis-creds");
    std::fs::create_dir(&creds)?;
    std::fs::write(creds.join("auth"), format!("{PASSWORD}\n"))?;

    let path = |p: &Path| p.to_string_lossy().into_owned();
    let principal_args = [
        "--redis-server-address",
        &hub.addr(),
        "--redis-proxy-listen-address",
        "127.0.0.1:0",
        "--redis-creds-dir-path",
        &path(&creds),
        "--redis-tls-enabled",
        "--redis-proxy-server-tls-cert",
        &path(&proxy_files.cert),
        "--redis-proxy-server-tls-key",
        &path(&proxy_files.key),
        "--redis-ca-path",
        &path(&hub_files.ca),
    ]
    .map(str::to_owned)
    .to_vec();
    let options = StartOptions { start_agents: false, principal_args, ..StartOptions::default() };
    let mut t =
        Topology::start_with_options(&[("agent-m", Mode::Managed), ("agent-a", Mode::Autonomous)], options).await?;
    let secrets: kube::Api<Secret> = kube::Api::namespaced(t.hub(), "argocd");
    let server = |agent: &str| format!("https://127.0.0.1:9090?agentName={agent}");
    for agent in ["agent-m", "agent-a"] {
        secrets.create(&kube::api::PostParams::default(), &cluster_secret(agent, &server(agent))).await?;
    }
    let before = Utc::now() - chrono::Duration::seconds(1);
    for (agent, redis) in [("agent-m", &spoke_m), ("agent-a", &spoke_a)] {
        t.set_agent_args(&["--redis-addr", &redis.addr(), "--cache-refresh-interval", "500ms"]);
        t.start_agent(agent).await?;
    }

    // Connected, with the counts of its Argo CD and its version.
    let m = wait_for(&hub, &server("agent-m"), "agent-m Successful with counts", |i| {
        i["connectionState"]["status"] == "Successful" && i["applicationsCount"] == 3
    })
    .await?;
    let message = m["connectionState"]["message"].as_str().context("message")?;
    ensure!(
        message.starts_with("Agent: 'agent-m' is connected with principal (agent version argocd-agent-")
            && message.ends_with(')'),
        "upstream's message and our agent's version: {m}"
    );
    ensure!(m["cacheInfo"]["apisCount"] == 41 && m["cacheInfo"]["resourcesCount"] == 1234, "{m}");
    ensure!(m["cacheInfo"]["lastCacheSyncTime"] == "2026-12-02T09:59:30Z", "{m}");
    ensure!(m["serverVersion"] == "1.37", "the cluster's Kubernetes version: {m}");
    eprintln!("what Argo CD reads for agent-m, connected: {m}");
    let since = time_of(&m)?;
    ensure!(before <= since && since <= Utc::now(), "attemptedAt is when the stream was taken: {m}");
    let a = wait_for(&hub, &server("agent-a"), "agent-a Successful with counts", |i| {
        i["connectionState"]["status"] == "Successful" && i["applicationsCount"] == 1
    })
    .await?;
    ensure!(a["cacheInfo"]["resourcesCount"] == 99, "an autonomous agent reports too: {a}");
    // Argo CD's TTL: 10 minutes.
    let ttl = String::from_utf8(hub.cli(&["TTL", &format!("cluster|info|{}|1.8.3.gz", server("agent-m"))], None)?)?;
    let ttl: i64 = ttl.trim().parse().with_context(|| format!("TTL {ttl:?}"))?;
    ensure!((1..=600).contains(&ttl), "TTL {ttl}");

    // The agent's Argo CD counts more: the hub follows.
    spoke_m.set(&format!("{in_cluster}.gz"), &gzip(&spoke_cluster_info(4, 41, 1300), false)?)?;
    wait_for(&hub, &server("agent-m"), "agent-m's new counts", |i| {
        i["applicationsCount"] == 4 && i["cacheInfo"]["resourcesCount"] == 1300
    })
    .await?;

    // The agent goes away: Failed, since then, upstream's message; the other stays.
    let gone = Utc::now() - chrono::Duration::seconds(1);
    t.kill_agent("agent-m")?;
    let m =
        wait_for(&hub, &server("agent-m"), "agent-m Failed", |i| i["connectionState"]["status"] == "Failed").await?;
    let message = m["connectionState"]["message"].as_str().context("message")?;
    ensure!(message.starts_with("Agent: 'agent-m' is disconnected with principal"), "{m}");
    eprintln!("what Argo CD reads for agent-m, disconnected: {m}");
    ensure!(time_of(&m)? >= gone, "attemptedAt is when the stream ended: {m}");
    ensure!(m["applicationsCount"] == 0 && m["cacheInfo"] == serde_json::json!({}), "no counts, as upstream: {m}");
    let a = argo_cd_cluster_info(&hub, &server("agent-a"))?.context("agent-a's info")?;
    ensure!(a["connectionState"]["status"] == "Successful", "{a}");

    // The principal stops: before it exits, the agents it served show Failed.
    t.stop_principal(std::time::Duration::from_secs(30))?;
    let a = argo_cd_cluster_info(&hub, &server("agent-a"))?.context("agent-a's info")?;
    ensure!(a["connectionState"]["status"] == "Failed", "written before the principal exited: {a}");
    Ok(())
}

/// What an upstream agent sends (the Go peer on upstream's event code, reporting as
/// `addClusterCacheInfoUpdateToQueue` does: three counts) reaches Argo CD's key as well, with the
/// bare version it presented on `Authenticate`; plaintext hub Redis without a password, and
/// `--redis-compression-type none` (Argo CD's `--redis-compression none`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_agents_report_reaches_argo_cd() -> Result<()> {
    let agent = "agent-gou";
    let hub = Redis::start("redis-hub", None, None).await?;
    let principal_args = [
        "--redis-server-address",
        &hub.addr(),
        "--redis-proxy-listen-address",
        "127.0.0.1:0",
        "--redis-compression-type",
        "none",
    ]
    .map(str::to_owned)
    .to_vec();
    let options = StartOptions { start_agents: false, principal_args, ..StartOptions::default() };
    let topo = Topology::start_with_options(&[(agent, Mode::Managed)], options).await?;
    let server = format!("https://127.0.0.1:9090?agentName={agent}");
    let secrets: kube::Api<Secret> = kube::Api::namespaced(topo.hub(), "argocd");
    secrets.create(&kube::api::PostParams::default(), &cluster_secret(agent, &server)).await?;

    let pki = tests::gopeer::Pki::of_kubeconfig(&topo.kubeconfig())?;
    let addr = topo.principal_addr().context("principal address")?;
    let mut go = tests::gopeer::GoPeer::agent(&pki, agent, addr, "managed", "0.10.2")?;
    let auth = go
        .wait("authenticated", |r| ["authenticated", "auth_error"].contains(&r["kind"].as_str().unwrap_or("")))
        .await?;
    ensure!(auth["kind"] == "authenticated", "{auth}\n{}", topo.logs());
    go.wait("subscribed", |r| r["kind"] == "subscribed").await?;
    let report = serde_json::json!({"cmd": "send", "type": "io.argoproj.argocd-agent.event.cluster-cache-info-update",
        "target": "clusterCacheInfoUpdate", "data": {"applicationsCount": 2, "apisCount": 30, "resourcesCount": 400}});
    go.ask("cache", report).await?;

    // Uncompressed: the key without `.gz`, the value Go's JSON and a newline.
    let key = format!("cluster|info|{server}|1.8.3");
    let mut poll = Poller::new(DEFAULT_TIMEOUT, "the upstream agent's counts in Argo CD's key");
    let info: Value = loop {
        if let Some(value) = hub.get(&key)? {
            ensure!(value.ends_with(b"}\n"), "{:?}", String::from_utf8_lossy(&value));
            let info: Value = serde_json::from_slice(&value)?;
            if info["applicationsCount"] == 2 {
                break info;
            }
        }
        poll.tick().await?;
    };
    ensure!(info["connectionState"]["status"] == "Successful", "{info}");
    ensure!(
        info["connectionState"]["message"]
            == format!("Agent: '{agent}' is connected with principal (agent version 0.10.2)"),
        "{info}"
    );
    ensure!(info["cacheInfo"] == serde_json::json!({"resourcesCount": 400, "apisCount": 30}), "{info}");
    ensure!(info.get("serverVersion").is_none(), "upstream agents report no Kubernetes version: {info}");
    Ok(())
}

/// A hub Redis that is not there yet when the agent connects: the principal keeps retrying with
/// backoff (1 s, doubling, at most 30 s) and the info arrives once it is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_info_arrives_when_the_hub_redis_comes_up_late() -> Result<()> {
    let agent = "agent-late";
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let spoke = Redis::start("redis-agent-late", None, None).await?;
    spoke.set("cluster|info|https://kubernetes.default.svc|1.8.3.gz", &gzip(&spoke_cluster_info(7, 8, 9), false)?)?;
    let principal_args =
        ["--redis-server-address", &format!("127.0.0.1:{port}"), "--redis-proxy-listen-address", "127.0.0.1:0"]
            .map(str::to_owned)
            .to_vec();
    let options = StartOptions { start_agents: false, principal_args, ..StartOptions::default() };
    let mut t = Topology::start_with_options(&[(agent, Mode::Managed)], options).await?;
    let server = format!("https://127.0.0.1:9090?agentName={agent}");
    let secrets: kube::Api<Secret> = kube::Api::namespaced(t.hub(), "argocd");
    secrets.create(&kube::api::PostParams::default(), &cluster_secret(agent, &server)).await?;
    t.set_agent_args(&["--redis-addr", &spoke.addr()]);
    t.start_agent(agent).await?;
    let mut poll = Poller::new(DEFAULT_TIMEOUT, "the principal to fail writing to the missing hub Redis");
    while t.principal_log_lines("cannot write the agent's cluster info").is_empty() {
        poll.tick().await?;
    }
    let hub = Redis::start_on("redis-hub-late", Some(port), None, None).await?;
    wait_for(&hub, &server, "the info after the hub's Redis came up", |i| {
        i["connectionState"]["status"] == "Successful" && i["applicationsCount"] == 7
    })
    .await?;
    Ok(())
}
