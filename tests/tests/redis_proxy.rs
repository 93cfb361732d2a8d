//! The Redis proxy (upstream §5.2) across spawned binaries, with a real redis-server (Debian's)
//! on the hub and on each spoke: what the hub's Argo CD reads of an agent's Application comes
//! from that agent's Redis, byte for byte; everything else stays on the hub's Redis; change
//! notifications arrive through SUBSCRIBE; redis-cli works against the proxy; an agent that goes
//! away fails its callers at once.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use protocol::resp::{Grammar, Limits, Scanner};
use tests::redis::{RedisServer as Redis, TlsFiles};
use tests::topology::{Mode, StartOptions, Topology};
use tests::wait::{DEFAULT_TIMEOUT, Poller};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// redis-cli against `redis`.
fn cli_on(redis: &Redis, args: &[&str]) -> Result<String> {
    redis_cli(redis.port, redis.ca.as_deref(), args)
}

/// `redis-cli` against 127.0.0.1:`port` (TLS when `ca` is given); its standard output.
fn redis_cli(port: u16, ca: Option<&Path>, args: &[&str]) -> Result<String> {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(ca) = ca {
        cmd.arg("--tls").arg("--cacert").arg(ca);
    }
    let out = cmd.args(args).output().context("redis-cli is missing (Debian package redis-tools)")?;
    ensure!(out.status.success(), "redis-cli {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A RESP client speaking raw frames, to check the bytes the proxy sends.
struct Client {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
    scanner: Scanner,
}

fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

impl Client {
    async fn connect(port: u16) -> Result<Self> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        Ok(Self { stream, buf: Vec::new(), scanner: Scanner::new(Grammar::Reply, Limits::default()) })
    }

    /// Sends commands in one write (pipelined).
    async fn send(&mut self, commands: &[&[&[u8]]]) -> Result<()> {
        let bytes: Vec<u8> = commands.iter().flat_map(|c| command(c)).collect();
        self.stream.write_all(&bytes).await?;
        Ok(())
    }

    /// The next frame, within `within`.
    async fn frame(&mut self, within: Duration) -> Result<Vec<u8>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(f) = self.scanner.scan(&self.buf)? {
                return Ok(self.buf.drain(..f.len).collect());
            }
            let mut chunk = [0u8; 16 << 10];
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut chunk))
                .await
                .context("no frame from the proxy in time")??;
            ensure!(n > 0, "the proxy closed the connection; unread: {:?}", String::from_utf8_lossy(&self.buf));
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn call(&mut self, args: &[&[u8]]) -> Result<Vec<u8>> {
        self.send(&[args]).await?;
        self.frame(DEFAULT_TIMEOUT).await
    }

    /// Waits (within `within`) for the proxy to close the connection; what came before.
    async fn closed(&mut self, within: Duration) -> Result<Vec<u8>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
                Err(_) => bail!("the proxy kept the connection open; got {:?}", String::from_utf8_lossy(&self.buf)),
                Ok(Ok(0) | Err(_)) => return Ok(std::mem::take(&mut self.buf)),
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

/// The RESP bulk string `value` is.
fn bulk(value: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", value.len()).into_bytes();
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
    out
}

/// `text` gzipped by the real gzip tool (what Argo CD's gzip cache holds).
fn gzip(text: &[u8]) -> Result<Vec<u8>> {
    let mut child = Command::new("gzip").arg("-c").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
    child.stdin.take().context("stdin")?.write_all(text)?;
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "gzip failed");
    Ok(out.stdout)
}

fn gunzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut child = Command::new("gzip").arg("-dc").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
    child.stdin.take().context("stdin")?.write_all(bytes)?;
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "gunzip failed");
    Ok(out.stdout)
}

/// A resource tree as an autonomous agent's Argo CD caches it for an app-of-apps: child
/// Applications and an ApplicationSet in the agent's Argo CD namespace.
const TREE: &str = r#"{"nodes":[{"version":"v1alpha1","kind":"ApplicationSet","namespace":"argocd","name":"team","uid":"u1","group":"argoproj.io"},{"version":"v1alpha1","kind":"Application","namespace":"argocd","name":"child","uid":"u2","group":"argoproj.io","parentRefs":[{"group":"argoproj.io","kind":"ApplicationSet","namespace":"argocd","name":"team","uid":"u1"}]},{"version":"v1","kind":"Deployment","namespace":"guestbook","name":"ui","uid":"u3","group":"apps"}],"hosts":[]}"#;

/// Where the principal's Redis proxy listens (from its log).
fn proxy_port(t: &Topology) -> Result<u16> {
    Ok(t.redis_proxy_addr().context("the principal serves the Redis proxy")?.port())
}

/// The principal with the Redis proxy in front of `hub`, and agents each reading their own
/// Redis; waits until every agent is connected.
async fn topology(
    agents: &[(&str, Mode, &Redis)],
    hub: &Redis,
    principal_args: &[&str],
    agent_args: &[&str],
) -> Result<Topology> {
    let mut args = vec![
        "--redis-server-address".to_owned(),
        hub.addr(),
        "--redis-proxy-listen-address".to_owned(),
        "127.0.0.1:0".to_owned(),
    ];
    args.extend(principal_args.iter().map(|a| (*a).to_owned()));
    let options = StartOptions { start_agents: false, principal_args: args, ..StartOptions::default() };
    let names: Vec<(&str, Mode)> = agents.iter().map(|(n, m, _)| (*n, *m)).collect();
    let mut t = Topology::start_with_options(&names, options).await?;
    for (name, _, redis) in agents {
        let addr = redis.addr();
        let mut flags = vec!["--redis-addr", addr.as_str()];
        flags.extend_from_slice(agent_args);
        t.set_agent_args(&flags);
        t.start_agent(name).await?;
    }
    let mut poll = Poller::new(DEFAULT_TIMEOUT, "the agents to connect");
    while !agents.iter().all(|(name, _, _)| t.principal_connects(name) >= 1) {
        poll.tick().await?;
    }
    Ok(t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argo_cd_reads_agents_state_through_the_proxy_and_the_rest_from_the_hub() -> Result<()> {
    let hub = Redis::start("redis-hub", None, &[]).await?;
    let spoke_m = Redis::start("redis-agent-m", None, &[]).await?;
    let spoke_a = Redis::start("redis-agent-a", None, &[]).await?;
    let mut t = topology(
        &[("agent-m", Mode::Managed, &spoke_m), ("agent-a", Mode::Autonomous, &spoke_a)],
        &hub,
        &["--redis-proxy-timeout", "10s"],
        &[],
    )
    .await?;
    let proxy = proxy_port(&t)?;

    // The managed agent's Argo CD cached a resource tree (gzip, as Argo CD's default cache).
    let tree_gz = gzip(TREE.repeat(200).as_bytes())?;
    let mut spoke = Client::connect(spoke_m.port).await?;
    let stored = spoke.call(&[b"SET", b"app|resources-tree|guestbook|1.8.3.gz", &tree_gz]).await?;
    ensure!(stored == b"+OK\r\n", "{stored:?}");
    let binary: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(7) ^ (i >> 3)) as u8).collect();
    spoke.call(&[b"SET", b"app|managed-resources|guestbook|1.8.3.gz", &binary]).await?;
    // A key of the hub's own (a hub-local Application, a manifest cache entry).
    Client::connect(hub.port).await?.call(&[b"SET", b"app|resources-tree|hub-app|1.8.3.gz", b"hub-tree"]).await?;

    // RESP3, as go-redis v9 (Argo CD) speaks it: HELLO 3, then GETs, pipelined.
    let mut argo = Client::connect(proxy).await?;
    argo.send(&[
        &[b"HELLO", b"3"],
        &[b"get", b"app|resources-tree|agent-m_guestbook|1.8.3.gz"],
        &[b"GET", b"app|resources-tree|hub-app|1.8.3.gz"],
        &[b"GET", b"app|managed-resources|agent-m_guestbook|1.8.3.gz"],
        &[b"GET", b"app|resources-tree|agent-m_missing|1.8.3.gz"],
        &[b"SET", b"mfst|annotation:app.kubernetes.io/instance|agent-m_guestbook|abc|1.8.3.gz", b"m"],
    ])
    .await?;
    let hello = argo.frame(DEFAULT_TIMEOUT).await?;
    ensure!(hello.starts_with(b"%"), "HELLO 3 answered by the hub's Redis: {:?}", String::from_utf8_lossy(&hello));
    ensure!(argo.frame(DEFAULT_TIMEOUT).await? == bulk(&tree_gz), "the agent's tree, byte for byte");
    ensure!(argo.frame(DEFAULT_TIMEOUT).await? == bulk(b"hub-tree"), "in command order, from the hub");
    ensure!(argo.frame(DEFAULT_TIMEOUT).await? == bulk(&binary), "binary value, byte for byte");
    ensure!(argo.frame(DEFAULT_TIMEOUT).await? == b"_\r\n", "a miss is RESP3's null");
    ensure!(argo.frame(DEFAULT_TIMEOUT).await? == b"+OK\r\n");
    let on_hub = cli_on(
        &hub,
        &["--no-raw", "GET", "mfst|annotation:app.kubernetes.io/instance|agent-m_guestbook|abc|1.8.3.gz"],
    )?;
    ensure!(on_hub.trim() == "\"m\"", "non-agent keys are written to the hub's Redis: {on_hub:?}");

    // RESP2 (no HELLO): a miss is RESP2's null bulk.
    let mut plain = Client::connect(proxy).await?;
    let miss = plain.call(&[b"GET", b"app|resources-tree|agent-m_missing|1.8.3.gz"]).await?;
    ensure!(miss == b"$-1\r\n", "{miss:?}");

    // An autonomous agent's tree: its Applications shown in the agent's hub namespace.
    let mut spoke = Client::connect(spoke_a.port).await?;
    spoke.call(&[b"SET", b"app|resources-tree|parent|1.8.3.gz", &gzip(format!("{TREE}\n").as_bytes())?]).await?;
    let got = plain.call(&[b"GET", b"app|resources-tree|agent-a_parent|1.8.3.gz"]).await?;
    let body = got.splitn(2, |b| *b == b'\n').nth(1).context("bulk")?;
    let tree: serde_json::Value = serde_json::from_slice(&gunzip(&body[..body.len() - 2])?)?;
    ensure!(tree["nodes"][0]["namespace"] == "agent-a" && tree["nodes"][1]["namespace"] == "agent-a", "{tree}");
    ensure!(tree["nodes"][1]["parentRefs"][0]["namespace"] == "agent-a", "{tree}");
    ensure!(tree["nodes"][2]["namespace"] == "guestbook", "other resources keep their namespace: {tree}");

    // redis-cli, the real client, in RESP2 and RESP3.
    cli_on(&spoke_m, &["SET", "app|resources-tree|small|1.8.3", "small-tree"])?;
    let cli = redis_cli(proxy, None, &["--no-raw", "GET", "app|resources-tree|agent-m_small|1.8.3"])?;
    ensure!(cli.trim() == "\"small-tree\"", "{cli:?}");
    let cli = redis_cli(proxy, None, &["-3", "--no-raw", "GET", "app|resources-tree|agent-m_gone|1.8.3"])?;
    ensure!(cli.trim() == "(nil)", "{cli:?}");
    ensure!(redis_cli(proxy, None, &["PING"])?.trim() == "PONG");

    // SUBSCRIBE as Argo CD's server does it for a tree's change notifications (RESP3).
    let channel = b"app|managed-resources|agent-m_guestbook|1.8.3";
    let mut watch = Client::connect(proxy).await?;
    watch.send(&[&[b"HELLO", b"3"], &[b"subscribe", channel]]).await?;
    watch.frame(DEFAULT_TIMEOUT).await?;
    let confirmed = watch.frame(DEFAULT_TIMEOUT).await?;
    ensure!(confirmed == [&b">3\r\n$9\r\nsubscribe\r\n"[..], &bulk(channel), b":1\r\n"].concat(), "{confirmed:?}");
    // And redis-cli's RESP2 subscription, beside it.
    let mut cli_sub = tokio::process::Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &proxy.to_string(),
            "SUBSCRIBE",
            "app|managed-resources|agent-m_guestbook|1.8.3",
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut cli_out = cli_sub.stdout.take().context("stdout")?;
    // The agent's Argo CD publishes (an empty message) when the tree changes; until both
    // subscriptions are in place on the agent's Redis, PUBLISH reaches fewer receivers.
    let mut poll = Poller::new(DEFAULT_TIMEOUT, "both subscriptions on the agent's Redis");
    while cli_on(&spoke_m, &["PUBLISH", "app|managed-resources|guestbook|1.8.3", ""])?.trim() != "2" {
        poll.tick().await?;
    }
    let message = watch.frame(DEFAULT_TIMEOUT).await?;
    ensure!(message == [&b">3\r\n$7\r\nmessage\r\n"[..], &bulk(channel), b"$0\r\n\r\n"].concat(), "{message:?}");
    let mut seen = Vec::new();
    let poll = Poller::new(DEFAULT_TIMEOUT, "redis-cli to print the message");
    while !String::from_utf8_lossy(&seen).contains("message") {
        let mut chunk = [0u8; 1024];
        let n = tokio::time::timeout(poll.remaining(), cli_out.read(&mut chunk)).await??;
        ensure!(n > 0, "redis-cli ended: {:?}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&chunk[..n]);
    }

    // What a read costs (printed): p50 of sequential GETs of a 1 KiB tree, through the proxy
    // and directly on the agent's Redis.
    cli_on(&spoke_m, &["SET", "app|resources-tree|kib|1.8.3.gz", &"x".repeat(1024)])?;
    let mut direct = Client::connect(spoke_m.port).await?;
    let mut p50 = Vec::new();
    for (client, key) in [
        (&mut plain, &b"app|resources-tree|agent-m_kib|1.8.3.gz"[..]),
        (&mut direct, &b"app|resources-tree|kib|1.8.3.gz"[..]),
    ] {
        let mut took: Vec<Duration> = Vec::new();
        for _ in 0..200 {
            let started = Instant::now();
            ensure!(client.call(&[b"GET", key]).await?.len() > 1024);
            took.push(started.elapsed());
        }
        took.sort();
        p50.push(took[took.len() / 2]);
    }
    println!("GET of a 1 KiB agent key: p50 {:?} through the proxy, {:?} on the agent's Redis", p50[0], p50[1]);

    let metrics_addr = t.principal_metrics_addr().context("metrics")?;
    let (_, text) = tests::http::get(metrics_addr, "/metrics").await?;
    let hits = tests::http::sample(
        &text,
        "argocd_principal_redis_proxy_requests_total",
        r#"agent_name="agent-m",command="get",result="hit""#,
    );
    ensure!(hits >= Some(3.0), "GET hits counted: {hits:?}");

    // The agent goes away: its subscribers hear it at once and are closed (go-redis then
    // reconnects and subscribes again); a GET is refused saying why, the connection stays.
    let started = Instant::now();
    t.kill_agent("agent-m")?;
    let last = watch.closed(DEFAULT_TIMEOUT).await?;
    let took = started.elapsed();
    ensure!(String::from_utf8_lossy(&last).contains("agent \"agent-m\" disconnected"), "{last:?}");
    let refused = plain.call(&[b"GET", b"app|resources-tree|agent-m_guestbook|1.8.3.gz"]).await?;
    ensure!(refused.starts_with(b"-ERR agent \"agent-m\" is not connected"), "{:?}", String::from_utf8_lossy(&refused));
    ensure!(plain.call(&[b"GET", b"app|resources-tree|hub-app|1.8.3.gz"]).await? == bulk(b"hub-tree"));
    let _ = cli_sub.kill().await;
    println!("subscriber closed {took:?} after the agent was killed");
    ensure!(took < Duration::from_secs(10), "the disconnect took {took:?} to reach the subscriber");
    Ok(())
}

/// The hub Redis's password in the TLS test.
const PASSWORD: &str = "hub-s3cret";

/// TLS everywhere, as upstream's manifests set it up: Argo CD to the proxy, the proxy to the
/// hub's Redis, the agent to its Redis. The hub's Redis has a password: what a client may not
/// read from the hub, it may not read from agents either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_speaks_tls_to_clients_and_to_both_redis_servers() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = tests::pki::Ca::generate("redis-ca")?;
    let hub_files = TlsFiles::issue(&ca, dir.path(), "redis-hub")?;
    let spoke_files = TlsFiles::issue(&ca, dir.path(), "redis-spoke")?;
    let proxy_files = TlsFiles::issue(&ca, dir.path(), "redis-proxy")?;
    let hub = Redis::start("redis-hub", Some(&hub_files), &["--requirepass", PASSWORD]).await?;
    let spoke = Redis::start("redis-spoke", Some(&spoke_files), &[]).await?;
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let (cert, key, hub_ca, spoke_ca) =
        (path(&proxy_files.cert), path(&proxy_files.key), path(&hub_files.ca), path(&spoke_files.ca));
    let t = topology(
        &[("agent-t", Mode::Managed, &spoke)],
        &hub,
        &[
            "--redis-tls-enabled",
            "--redis-proxy-server-tls-cert",
            &cert,
            "--redis-proxy-server-tls-key",
            &key,
            "--redis-ca-path",
            &hub_ca,
        ],
        &["--redis-tls-enabled", "--redis-tls-ca-path", &spoke_ca],
    )
    .await?;
    let proxy = proxy_port(&t)?;
    cli_on(&spoke, &["SET", "app|resources-tree|web|1.8.3.gz", "spoke-tree"])?;
    cli_on(
        &hub,
        &[
            "-a",
            PASSWORD,
            "--no-auth-warning",
            "SET",
            "cluster|info|https://kubernetes.default.svc|1.8.3.gz",
            "hub-info",
        ],
    )?;
    let ca_file = proxy_files.ca.as_path();
    let agent_key = "app|resources-tree|agent-t_web|1.8.3.gz";
    let refused = redis_cli(proxy, Some(ca_file), &["--no-raw", "GET", agent_key])?;
    ensure!(refused.contains("NOAUTH"), "without the hub's password, no agent's state: {refused:?}");
    let auth = ["-a", PASSWORD, "--no-auth-warning", "--no-raw"];
    let got = redis_cli(proxy, Some(ca_file), &[&auth[..], &["GET", agent_key]].concat())?;
    ensure!(got.trim() == "\"spoke-tree\"", "through TLS to the agent's TLS Redis: {got:?}");
    let hub_key = "cluster|info|https://kubernetes.default.svc|1.8.3.gz";
    let got = redis_cli(proxy, Some(ca_file), &[&["-3"][..], &auth, &["GET", hub_key]].concat())?;
    ensure!(got.trim() == "\"hub-info\"", "through TLS to the hub's TLS Redis: {got:?}");
    // A plaintext client gets no Redis service.
    let mut plain = Client::connect(proxy).await?;
    plain.send(&[&[b"PING"]]).await?;
    ensure!(plain.frame(Duration::from_secs(10)).await.is_err(), "plaintext refused");
    Ok(())
}

/// An `argocd-gopeer argocd-redis` (Argo CD v3.5's cache code on the go-redis and
/// go-redis/cache versions Argo CD v3.5.7 pins) with its server client on `server` and its
/// controller client on `controller`.
async fn argo_cd_cache(name: &str, server: Option<&str>, controller: Option<&str>) -> Result<tests::gopeer::GoPeer> {
    let mut args: Vec<&std::ffi::OsStr> = vec!["argocd-redis".as_ref()];
    if let Some(addr) = server {
        args.extend([std::ffi::OsStr::new("--server-redis"), std::ffi::OsStr::new(addr)]);
    }
    if let Some(addr) = controller {
        args.extend([std::ffi::OsStr::new("--controller-redis"), std::ffi::OsStr::new(addr)]);
    }
    let mut peer = tests::gopeer::GoPeer::spawn(name, &args)?;
    peer.wait("ready", |r| r["kind"] == "ready").await?;
    Ok(peer)
}

/// A resource tree of `n` Deployments with ReplicaSets and Pods under them, shaped as Argo
/// CD's controller caches it (`ApplicationTree` with health, info, parent refs, images).
fn big_tree(n: usize) -> serde_json::Value {
    let mut nodes = Vec::new();
    for i in 0..n {
        let (dep, rs, pod) = (format!("web-{i}"), format!("web-{i}-5d8f"), format!("web-{i}-5d8f-x{i}"));
        let dep_ref = serde_json::json!({"group":"apps","version":"v1","kind":"Deployment","namespace":"guestbook","name":dep,"uid":format!("d{i}")});
        let rs_ref = serde_json::json!({"group":"apps","version":"v1","kind":"ReplicaSet","namespace":"guestbook","name":rs,"uid":format!("r{i}")});
        nodes.push(serde_json::json!({"group":"apps","version":"v1","kind":"Deployment","namespace":"guestbook","name":dep,"uid":format!("d{i}"),
            "resourceVersion":"123","health":{"status":"Healthy"},"info":[{"name":"Revision","value":"Rev:1"}],"createdAt":"2025-01-01T00:00:00Z"}));
        nodes.push(serde_json::json!({"group":"apps","version":"v1","kind":"ReplicaSet","namespace":"guestbook","name":rs,"uid":format!("r{i}"),
            "parentRefs":[dep_ref],"health":{"status":"Healthy"}}));
        nodes.push(serde_json::json!({"version":"v1","kind":"Pod","namespace":"guestbook","name":pod,"uid":format!("p{i}"),
            "parentRefs":[rs_ref],"images":["quay.io/argoprojlabs/argocd-e2e-container:0.2"],"health":{"status":"Progressing","message":"starting … ünïcode"}}));
    }
    serde_json::json!({"nodes": nodes})
}

/// What Argo CD's server does for an agent's Application, with Argo CD's own client code: the
/// agent's controller writes its tree and managed resources (gzip JSON, optionally sharded) and
/// publishes; the hub's server, through the proxy, hears the change, reads them back decoded;
/// its other keys stay on the hub's Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argo_cds_go_redis_cache_reads_an_agents_tree_through_the_proxy() -> Result<()> {
    let hub = Redis::start("redis-hub", None, &[]).await?;
    let spoke = Redis::start("redis-agent-m", None, &[]).await?;
    let t = topology(&[("agent-m", Mode::Managed, &spoke)], &hub, &["--redis-proxy-timeout", "10s"], &[]).await?;
    let proxy = format!("127.0.0.1:{}", proxy_port(&t)?);
    let mut argo = argo_cd_cache("argocd-m", Some(&proxy), Some(&spoke.addr())).await?;
    let mut hub_direct = argo_cd_cache("argocd-hub", Some(&hub.addr()), None).await?;

    // The server watches the Application (OnAppResourcesTreeChanged), through the proxy; the
    // subscription is in place once the agent's Redis counts a receiver on the channel.
    argo.ask("watch", serde_json::json!({"cmd":"watch","as":"server","app":"agent-m_guestbook"})).await?;
    let mut poll = Poller::new(DEFAULT_TIMEOUT, "the server's subscription on the agent's Redis");
    while cli_on(&spoke, &["PUBSUB", "NUMSUB", "app|managed-resources|guestbook|1.8.3"])?.lines().nth(1) != Some("1") {
        poll.tick().await?;
    }

    // The agent's controller writes the tree (SetAppResourcesTree: gzip JSON, then an empty
    // message on the managed-resources channel).
    let tree = big_tree(150);
    let set =
        argo.ask("set", serde_json::json!({"cmd":"set_tree","as":"controller","app":"guestbook","tree":tree})).await?;
    ensure!(set["keys"] == serde_json::json!(["app|resources-tree|guestbook|1.8.3.gz"]), "{set}");
    ensure!(set["receivers"] == 1, "the server's subscription heard the publish: {set}");
    let changed = argo.wait("the tree change", |r| r["kind"] == "tree_changed").await?;
    ensure!(
        changed["channel"] == "app|managed-resources|agent-m_guestbook|1.8.3" && changed["payload"] == "",
        "{changed}"
    );
    ensure!(changed["nodes"] == 450, "the callback read the new tree: {changed}");

    // GetAppResourcesTree through the proxy: the same tree, decoded.
    let got = argo.ask("get", serde_json::json!({"cmd":"get_tree","as":"server","app":"agent-m_guestbook"})).await?;
    ensure!(got["miss"] == false && got["tree"]["nodes"] == tree["nodes"], "the tree as written: {}", got["error"]);
    ensure!(got["bytes"] == set["bytes"][0], "byte for byte: {} vs {}", got["bytes"], set["bytes"]);

    // Sharded (ARGOCD_APPLICATION_TREE_SHARD_SIZE=100): shard 0 carries the count, the server
    // reads `app|resources-tree|<app>|<n>|1.8.3.gz` for the others.
    let sharded = argo
        .ask("set-sh", serde_json::json!({"cmd":"set_tree","as":"controller","app":"sharded","tree":big_tree(80),"shard_size":100}))
        .await?;
    ensure!(sharded["keys"].as_array().map(Vec::len) == Some(3), "{sharded}");
    ensure!(sharded["keys"][2] == "app|resources-tree|sharded|2|1.8.3.gz", "{sharded}");
    let got = argo.ask("get-sh", serde_json::json!({"cmd":"get_tree","as":"server","app":"agent-m_sharded"})).await?;
    ensure!(got["miss"] == false && got["tree"]["nodes"] == big_tree(80)["nodes"], "all shards merged: {got}");

    // Managed resources (SetAppManagedResources sorts by full name).
    let managed = serde_json::json!([
        {"group":"apps","kind":"Deployment","namespace":"guestbook","name":"ui","targetState":"{\"kind\":\"Deployment\"}","liveState":"{\"kind\":\"Deployment\"}","modified":true,"diff":"{}"},
        {"kind":"Service","namespace":"guestbook","name":"ui","targetState":"{}","liveState":"{}","resourceVersion":"42"}
    ]);
    argo.ask("set-m", serde_json::json!({"cmd":"set_managed","as":"controller","app":"guestbook","managed":managed}))
        .await?;
    let got =
        argo.ask("get-m", serde_json::json!({"cmd":"get_managed","as":"server","app":"agent-m_guestbook"})).await?;
    let mut expected = managed.as_array().context("array")?.clone();
    expected.reverse(); // "/Service/..." sorts before "apps/Deployment/..."
    ensure!(got["managed"] == serde_json::Value::Array(expected), "{got}");

    // A miss is Argo CD's cache miss, not an error.
    let miss = argo.ask("miss", serde_json::json!({"cmd":"get_tree","as":"server","app":"agent-m_nothing"})).await?;
    ensure!(miss["miss"] == true, "{miss}");

    // A manifest cache entry (repo-server's `mfst|...`) goes to the hub's Redis and back.
    let mfst = "mfst|annotation:app.kubernetes.io/instance|agent-m_guestbook|abc123|guestbook";
    let value = serde_json::json!({"manifests":["{\"kind\":\"Service\"}"],"revision":"abc123"});
    argo.ask("set-i", serde_json::json!({"cmd":"set_item","as":"server","key":mfst,"value":value})).await?;
    let on_hub = hub_direct.ask("get-i", serde_json::json!({"cmd":"get_item","as":"server","key":mfst})).await?;
    ensure!(on_hub["value"] == value, "written to the hub's Redis: {on_hub}");
    let back = argo.ask("get-i", serde_json::json!({"cmd":"get_item","as":"server","key":mfst})).await?;
    ensure!(back["value"] == value, "read back through the proxy: {back}");
    ensure!(cli_on(&spoke, &["EXISTS", &format!("{mfst}|1.8.3.gz")])?.trim() == "0", "not on the agent's Redis");

    // What a tree read costs Argo CD's server: 450 nodes, through the proxy and directly.
    let via = argo
        .ask("t1", serde_json::json!({"cmd":"time_get_tree","as":"server","app":"agent-m_guestbook","n":200}))
        .await?;
    let direct =
        argo.ask("t2", serde_json::json!({"cmd":"time_get_tree","as":"controller","app":"guestbook","n":200})).await?;
    println!(
        "GetAppResourcesTree ({} gzip bytes, 450 nodes), 200 sequential reads: p50 {} µs / p99 {} µs through the proxy, p50 {} µs / p99 {} µs on the agent's Redis",
        set["bytes"][0], via["p50_micros"], via["p99_micros"], direct["p50_micros"], direct["p99_micros"]
    );
    Ok(())
}

/// An autonomous agent's tree as Argo CD's controller really writes it: its gzip stream is
/// flushed, never closed (util/cache/redis.go `marshal`), so it has no final block and no
/// trailer. Its Applications must still be shown in the agent's hub namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autonomous_agents_tree_from_argo_cds_own_gzip_is_rewritten() -> Result<()> {
    let hub = Redis::start("redis-hub", None, &[]).await?;
    let spoke = Redis::start("redis-agent-a", None, &[]).await?;
    let t = topology(&[("agent-a", Mode::Autonomous, &spoke)], &hub, &[], &[]).await?;
    let proxy = format!("127.0.0.1:{}", proxy_port(&t)?);
    let mut argo = argo_cd_cache("argocd-a", Some(&proxy), Some(&spoke.addr())).await?;
    let tree: serde_json::Value = serde_json::from_str(TREE)?;
    argo.ask("set", serde_json::json!({"cmd":"set_tree","as":"controller","app":"parent","tree":tree})).await?;
    let got = argo.ask("get", serde_json::json!({"cmd":"get_tree","as":"server","app":"agent-a_parent"})).await?;
    let nodes = &got["tree"]["nodes"];
    ensure!(got["miss"] == false, "{got}");
    ensure!(nodes[2]["namespace"] == "guestbook", "other resources keep their namespace: {got}");
    let skipped = t.principal_log_lines("passed on without the namespace rewrite");
    ensure!(
        nodes[0]["namespace"] == "agent-a"
            && nodes[1]["namespace"] == "agent-a"
            && nodes[1]["parentRefs"][0]["namespace"] == "agent-a",
        "the Application and ApplicationSet nodes stay in the agent's namespace: {nodes}; principal: {skipped:?}"
    );
    Ok(())
}

/// A peak and a current resident set size of process `pid`, in KiB (`VmHWM`, `VmRSS`).
fn memory_kib(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        let line = status.lines().find(|l| l.starts_with(name)).with_context(|| format!("{name} in status"))?;
        Ok(line.split_whitespace().nth(1).context("value")?.parse()?)
    };
    Ok((field("VmHWM:")?, field("VmRSS:")?))
}

/// What a client that never authenticates gets for `head` followed by `filler` bytes, written
/// while it reads: everything until the server closes the connection (within 10 s).
async fn unauthenticated_attempt(port: u16, head: Vec<u8>, filler: usize) -> Result<Vec<u8>> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        // Errors are expected: the server closes the connection without reading it all.
        if wr.write_all(&head).await.is_err() {
            return;
        }
        let chunk = vec![b'x'; 64 << 10];
        let mut sent = 0;
        while sent < filler {
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
            sent += chunk.len();
        }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    loop {
        let mut buf = [0u8; 4096];
        match tokio::time::timeout_at(deadline, rd.read(&mut buf)).await {
            Err(_) => {
                writer.abort();
                bail!("the connection stayed open; got {:?}", String::from_utf8_lossy(&got));
            }
            // A reset after the reply (the server closed with our bytes unread) ends it too.
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
    writer.abort();
    Ok(got)
}

/// Issue #31 item 3: clients that never send AUTH cannot make the principal buffer. Redis's
/// bounds before authentication apply at the proxy (10 arguments of 16 KiB, since Redis 6.2.6,
/// CVE-2021-32675): 8 connections each declaring a 500 MiB argument and sending 8 MiB get
/// Redis's own error (the words redis-server itself answers the same bytes with) and are
/// closed, and the principal's memory stays put; 11 arguments are refused the same way; an
/// authenticated client keeps working meanwhile, with 11 arguments and values over 16 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_have_not_authenticated_cannot_make_the_principal_buffer() -> Result<()> {
    let hub = Redis::start("redis-hub", None, &["--requirepass", PASSWORD]).await?;
    let spoke = Redis::start("redis-agent-m", None, &[]).await?;
    let t = topology(&[("agent-m", Mode::Managed, &spoke)], &hub, &[], &[]).await?;
    let proxy = proxy_port(&t)?;
    let pid = t.principal_pid().context("the principal runs")?;
    cli_on(&spoke, &["SET", "app|resources-tree|web|1.8.3.gz", "spoke-tree"])?;

    // The legitimate client, authenticated before the attack and used through it.
    let mut argo = Client::connect(proxy).await?;
    ensure!(argo.call(&[b"AUTH", PASSWORD.as_bytes()]).await? == b"+OK\r\n");
    let big = vec![b'v'; 64 << 10];
    ensure!(argo.call(&[b"SET", b"big", &big]).await? == b"+OK\r\n", "an authenticated value over 16 KiB");
    let (peak_before, rss_before) = memory_kib(pid)?;

    let declared = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$524288000\r\n".to_vec();
    let eleven = command(&[&b"MSET"[..]; 11]);
    let started = Instant::now();
    let attempts: Vec<_> =
        (0..8).map(|_| tokio::spawn(unauthenticated_attempt(proxy, declared.clone(), 8 << 20))).collect();
    let mut answers = Vec::new();
    for attempt in attempts {
        answers.push(attempt.await??);
    }
    let too_many = unauthenticated_attempt(proxy, eleven.clone(), 0).await?;
    let took = started.elapsed();
    let (peak_after, rss_after) = memory_kib(pid)?;

    // The same bytes straight to redis-server: the proxy must answer in Redis's own words.
    let redis_bulk = unauthenticated_attempt(hub.port, declared, 1 << 20).await?;
    let redis_args = unauthenticated_attempt(hub.port, eleven, 0).await?;
    ensure!(redis_bulk == b"-ERR Protocol error: unauthenticated bulk length\r\n", "{redis_bulk:?}");
    for answer in &answers {
        ensure!(*answer == redis_bulk, "each refused as Redis does: {:?}", String::from_utf8_lossy(answer));
    }
    ensure!(
        too_many == redis_args,
        "11 arguments: {:?} vs Redis's {:?}",
        String::from_utf8_lossy(&too_many),
        String::from_utf8_lossy(&redis_args)
    );

    let (peak_growth, rss_growth) = (peak_after.saturating_sub(peak_before), rss_after.saturating_sub(rss_before));
    println!(
        "8 unauthenticated connections declaring 500 MiB and sending 8 MiB each: refused in {took:?}; principal VmHWM +{peak_growth} KiB, VmRSS +{rss_growth} KiB"
    );
    ensure!(peak_growth < 32 << 10, "the principal's peak memory grew by {peak_growth} KiB");
    ensure!(rss_growth < 32 << 10, "the principal's memory grew by {rss_growth} KiB");

    // The authenticated client was not disturbed: 11 arguments, large values, an agent's key.
    let pairs: Vec<&[u8]> = [&b"MSET"[..], b"a", b"1", b"b", b"2", b"c", b"3", b"d", b"4", b"e", b"5"].to_vec();
    ensure!(argo.call(&pairs).await? == b"+OK\r\n", "11 arguments once authenticated");
    ensure!(argo.call(&[b"GET", b"big"]).await? == bulk(&big));
    ensure!(argo.call(&[b"GET", b"app|resources-tree|agent-m_web|1.8.3.gz"]).await? == bulk(b"spoke-tree"));
    Ok(())
}
