//! Whatever replica the hub's Argo CD reaches (issue 33, item 5): with principal replicas
//! (`--agent-leases`), a resource-proxy request for an agent another replica owns is forwarded
//! to the owner over mutual TLS with the replica client certificate (`argocd-agentctl pki issue
//! replica`, subject OU `argocd-agent-principal-replica`), instead of a 502 naming the owner.
//! And nothing an agent or a proxy caller holds passes as a replica: the header that names the
//! agent of a forwarded request is refused from any other certificate.
//!
//! The same for the Redis proxy: a GET or SUBSCRIBE of an agent's key through a replica that
//! does not hold the agent's stream is read at the owner, through its replica-only endpoint,
//! which nothing but a replica certificate opens and which never forwards again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use principal::cluster_secret::ClusterSecret;
use serde_json::json;
use tests::kubectl::Kubectl;
use tests::redis::RedisServer as Redis;
use tests::replicas::{Replicas, TEST_LEASE, attach_to, bootstrap_args, prepare_forwarding};
use tests::topology::{ARGOCD_NS, MeshOptions, Mode, StartOptions, Topology, Transport, ensure_namespace};
use tests::wait::{DEFAULT_TIMEOUT, Poller};

const TRACKING: &str = "argocd.argoproj.io/tracking-id";
const FORWARDED: &str = "x-argocd-agent-forwarded-agent";

/// The topology the replicas start from: managed agent-a (not started yet), mutual TLS, the
/// resource proxy, and a lone principal that bootstraps the hub.
async fn agent_a_topology() -> Result<Topology> {
    let options = StartOptions {
        resource_proxy: true,
        start_agents: false,
        principal_args: bootstrap_args(),
        ..StartOptions::default()
    };
    Topology::start_with_transport(&[("agent-a", Mode::Managed)], Transport::Mtls, MeshOptions::default(), options)
        .await
}

/// Three replicas with resource proxies on loopback that forward to each other, agent-a owned
/// by replica 0, its cluster secret, and a tracked ConfigMap on its cluster.
async fn three_replicas() -> Result<(Topology, Replicas)> {
    let mut t = agent_a_topology().await?;
    prepare_forwarding(&mut t, &[])?;
    let r = Replicas::start(
        &t,
        &[("r0", Default::default()), ("r1", Default::default()), ("r2", Default::default())],
        TEST_LEASE,
    )
    .await?;
    attach_to(&mut t, &r, &["agent-a"], 0).await?;
    let owner_proxy = r.replica(0).resource_proxy_addr().context("replica r0 serves the resource proxy")?;
    t.ctl(&["agent", "create", "agent-a", "--resource-proxy-server", &owner_proxy.to_string()])?;
    tests::live::application_on_agent(&t, "agent-a", "gb").await?;
    let spoke = t.spoke("agent-a")?;
    ensure_namespace(&spoke, "guestbook").await?;
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "tracked", "annotations": {TRACKING: "gb:/ConfigMap:guestbook/tracked"}},
        "data": {"k": "v"},
    }))?;
    Api::<ConfigMap>::namespaced(spoke, "guestbook").create(&PostParams::default(), &cm).await?;
    Ok((t, r))
}

async fn cluster_secret(t: &Topology, agent: &str) -> Result<ClusterSecret> {
    let secrets: Api<Secret> = Api::namespaced(t.hub(), ARGOCD_NS);
    let name = principal::cluster_secret::secret_name(agent);
    Ok(ClusterSecret::from_secret(secrets.get(&name).await.with_context(|| format!("secret {name}"))?)?)
}

/// One HTTP/1.1 GET over TLS to `addr` presenting `cert_pem`/`key_pem`, with `headers`: the
/// status code and the raw answer.
async fn raw_get(
    addr: SocketAddr,
    ca_pem: &str,
    (cert_pem, key_pem): (&str, &str),
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String)> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1")?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    tls.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status line: {text:?}"))?;
    Ok((code, text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_serves_a_resource_proxy_get_for_an_agent_one_of_them_owns() -> Result<()> {
    let (t, r) = three_replicas().await?;
    let scratch = tempfile::tempdir()?;
    for index in 0..3 {
        let replica = r.replica(index);
        let proxy = replica.resource_proxy_addr().with_context(|| format!("replica {} proxy", replica.name()))?;
        let dir = scratch.path().join(replica.name());
        std::fs::create_dir_all(&dir)?;
        // What the hub's Argo CD does through whichever replica the Service picks.
        let kubectl = Kubectl::new(&tests::live::cluster_kubeconfig_via(&t, "agent-a", &dir, Some(proxy)).await?)?;
        let got = kubectl
            .ok(["get", "configmap", "tracked", "-n", "guestbook", "-o", "jsonpath={.data.k}"])
            .await
            .with_context(|| format!("through replica {}\n{}", replica.name(), r.logs()))?;
        ensure!(got == "v", "through replica {}: {got:?}", replica.name());
        let refused = kubectl.fails(["get", "configmap", "nope", "-n", "guestbook"]).await?;
        ensure!(
            refused.stderr.contains("NotFound") || refused.stderr.contains("not found"),
            "the owner's agent answers through replica {}: {refused}",
            replica.name()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neither_an_agents_nor_a_proxy_callers_certificate_passes_as_a_replica() -> Result<()> {
    let (t, r) = three_replicas().await?;
    let cs = cluster_secret(&t, "agent-a").await?;
    let tls = &cs.config.tls_client_config;
    let ca = tls.ca_pem().context("the cluster secret's CA")?;
    let (proxy_cert, proxy_key) =
        (tls.cert_pem().context("cluster secret cert")?, tls.key_pem().context("cluster secret key")?);
    let pki = t.pki_dir();
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).with_context(|| format!("{f} in {}", pki.display()));
    let (agent_cert, agent_key) = (read("agent-a.crt")?, read("agent-a.key")?);
    let path = "/api/v1/namespaces/guestbook/configmaps/tracked";
    for index in [0, 1] {
        let addr = r.replica(index).resource_proxy_addr().context("proxy address")?;
        for (who, identity) in [
            ("agent", (agent_cert.as_str(), agent_key.as_str())),
            ("proxy caller", (proxy_cert.as_str(), proxy_key.as_str())),
        ] {
            let (code, text) = raw_get(addr, &ca, identity, path, &[(FORWARDED, "agent-a")]).await?;
            ensure!(
                code == 401 && text.contains(FORWARDED) && text.contains("argocd-agent-principal-replica"),
                "a {who}'s certificate naming the agent of a forwarded request at replica {index}: {code} {text}"
            );
        }
        // The proxy caller's certificate without the header still works, forwarded or not.
        let (code, text) = raw_get(addr, &ca, (&proxy_cert, &proxy_key), path, &[]).await?;
        ensure!(
            code == 200 && text.contains("tracked"),
            "the cluster secret's certificate at replica {index}: {code} {text}"
        );
    }
    Ok(())
}

// === The Redis proxy: GET and SUBSCRIBE of an agent's keys through whichever replica ===

/// The hub's Redis and agent-a's, two replicas serving the Redis proxy and the resource proxy
/// and forwarding to each other, agent-a reading its own Redis and owned by replica 0.
struct RedisReplicas {
    t: Topology,
    r: Replicas,
    spoke: Redis,
    hub: Redis,
}

async fn two_replicas_with_redis() -> Result<RedisReplicas> {
    let hub = Redis::start("redis-hub", None, &[]).await?;
    let spoke = Redis::start("redis-agent-a", None, &[]).await?;
    let mut t = agent_a_topology().await?;
    let hub_addr = hub.addr();
    prepare_forwarding(
        &mut t,
        &[
            "--redis-server-address",
            &hub_addr,
            "--redis-proxy-listen-address",
            "127.0.0.1:0",
            "--redis-proxy-timeout",
            "10s",
        ],
    )?;
    let r = Replicas::start(&t, &[("r0", Default::default()), ("r1", Default::default())], TEST_LEASE).await?;
    let spoke_addr = spoke.addr();
    t.set_agent_args(&["--redis-addr", &spoke_addr]);
    attach_to(&mut t, &r, &["agent-a"], 0).await?;
    let owner_proxy = r.replica(0).resource_proxy_addr().context("replica r0 serves the resource proxy")?;
    t.ctl(&["agent", "create", "agent-a", "--resource-proxy-server", &owner_proxy.to_string()])?;
    Ok(RedisReplicas { t, r, spoke, hub })
}

/// Where replica `index` serves the Redis proxy (from its log).
fn redis_port(r: &Replicas, index: usize) -> Result<u16> {
    Ok(r.replica(index).redis_proxy_addr().context("the replica serves the Redis proxy")?.port())
}

/// redis-cli against 127.0.0.1:`port`; its standard output.
fn redis_cli(port: u16, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .context("redis-cli is missing (Debian package redis-tools)")?;
    ensure!(out.status.success(), "redis-cli {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `redis-cli MONITOR` on the Redis at `port`: every command it executes from now on, while it
/// lives (killed when dropped).
struct Monitor {
    /// Killed when dropped.
    _child: tokio::process::Child,
    out: tokio::process::ChildStdout,
    seen: Vec<u8>,
    port: u16,
}

impl Monitor {
    async fn start(port: u16) -> Result<Self> {
        let mut child = tokio::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "MONITOR"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("redis-cli is missing (Debian package redis-tools)")?;
        let out = child.stdout.take().context("stdout")?;
        let mut m = Self { _child: child, out, seen: Vec::new(), port };
        m.until("OK").await?;
        Ok(m)
    }

    async fn until(&mut self, needle: &str) -> Result<()> {
        use tokio::io::AsyncReadExt as _;
        let poll = Poller::new(DEFAULT_TIMEOUT, "redis-cli MONITOR's output");
        while !String::from_utf8_lossy(&self.seen).contains(needle) {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(poll.remaining(), self.out.read(&mut chunk)).await??;
            ensure!(n > 0, "redis-cli MONITOR ended: {:?}", String::from_utf8_lossy(&self.seen));
            self.seen.extend_from_slice(&chunk[..n]);
        }
        Ok(())
    }

    /// Every command executed since the start, up to a marker command (which shows the rest
    /// has arrived).
    async fn mark(&mut self, marker: &str) -> Result<String> {
        redis_cli(self.port, &["ECHO", marker])?;
        self.until(marker).await?;
        Ok(String::from_utf8_lossy(&self.seen).into_owned())
    }
}

fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// Reads from `stream` until what came contains `needle` (within the default timeout).
async fn read_until(stream: &mut tokio::net::TcpStream, seen: &mut Vec<u8>, needle: &str) -> Result<()> {
    use tokio::io::AsyncReadExt as _;
    let poll = Poller::new(DEFAULT_TIMEOUT, "the Redis proxy's answer");
    while !String::from_utf8_lossy(seen).contains(needle) {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(poll.remaining(), stream.read(&mut chunk))
            .await
            .with_context(|| format!("no {needle:?} in time; got {:?}", String::from_utf8_lossy(seen)))??;
        ensure!(n > 0, "the proxy closed the connection; got {:?}", String::from_utf8_lossy(seen));
        seen.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}

const TREE_KEY: &str = "app|resources-tree|agent-a_gb|1.8.3.gz";
const CHANNEL: &str = "app|managed-resources|agent-a_gb|1.8.3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_get_and_subscribe_of_an_agents_key_succeed_through_the_replica_that_does_not_own_it() -> Result<()> {
    let RedisReplicas { t, r, spoke, hub: _hub } = two_replicas_with_redis().await?;
    // What agent-a's Argo CD cached, in its own Redis.
    redis_cli(spoke.port, &["SET", "app|resources-tree|gb|1.8.3.gz", "the-tree-of-gb"])?;
    for index in [1, 0] {
        let port = redis_port(&r, index)?;
        let got = redis_cli(port, &["GET", TREE_KEY])?;
        ensure!(got.trim() == "the-tree-of-gb", "GET through replica {index}: {got:?}\n{}\n{}", r.logs(), t.logs());
        let miss = redis_cli(port, &["--no-raw", "GET", "app|resources-tree|agent-a_none|1.8.3.gz"])?;
        ensure!(miss.trim() == "(nil)", "a miss through replica {index}: {miss:?}");
    }
    let forwarded =
        r.replica(1).metric("argocd_principal_replica_forwards_total", r#"surface="redis_get",outcome="hit""#);
    ensure!(forwarded.await >= Some(1.0), "replica r1 counted its forwarded GET");

    // SUBSCRIBE through the replica that does not own the agent, as Argo CD's server does.
    let port = redis_port(&r, 1)?;
    let mut watch = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    tokio::io::AsyncWriteExt::write_all(&mut watch, &resp(&["SUBSCRIBE", CHANNEL])).await?;
    let mut seen = Vec::new();
    read_until(&mut watch, &mut seen, ":1\r\n").await?;
    ensure!(String::from_utf8_lossy(&seen).contains(CHANNEL), "{:?}", String::from_utf8_lossy(&seen));
    // agent-a's Argo CD publishes; the message reaches the subscriber through both replicas.
    let mut poll = Poller::new(DEFAULT_TIMEOUT, "the forwarded subscription on agent-a's Redis");
    while redis_cli(spoke.port, &["PUBLISH", "app|managed-resources|gb|1.8.3", ""])?.trim() != "1" {
        poll.tick().await?;
    }
    read_until(&mut watch, &mut seen, "message").await?;

    // What a forwarded read costs (printed): p50 of sequential GETs on one connection, through
    // the owner and through the other replica.
    let mut p50 = Vec::new();
    for index in [0, 1] {
        let mut client = tokio::net::TcpStream::connect(("127.0.0.1", redis_port(&r, index)?)).await?;
        let mut took = Vec::new();
        for _ in 0..50 {
            let started = std::time::Instant::now();
            tokio::io::AsyncWriteExt::write_all(&mut client, &resp(&["GET", TREE_KEY])).await?;
            read_until(&mut client, &mut Vec::new(), "the-tree-of-gb").await?;
            took.push(started.elapsed());
        }
        took.sort();
        p50.push(took[took.len() / 2]);
    }
    println!("GET of agent-a's key: p50 {:?} through its owner, {:?} forwarded by the other replica", p50[0], p50[1]);

    // agent-a goes away: its owner ends the forwarded subscription, and the subscriber's
    // connection is told why and closed (go-redis then reconnects and subscribes again).
    let mut t = t;
    t.kill_agent("agent-a")?;
    let poll = Poller::new(DEFAULT_TIMEOUT, "the forwarded subscriber to be closed");
    loop {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(poll.remaining(), tokio::io::AsyncReadExt::read(&mut watch, &mut chunk))
            .await
            .with_context(|| format!("still open; got {:?}", String::from_utf8_lossy(&seen)))?
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    ensure!(text.contains("agent \"agent-a\"") && text.contains("r0"), "the subscriber was told: {text:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_replica_reads_through_the_replica_redis_endpoint_and_it_is_never_forwarded_again() -> Result<()> {
    let RedisReplicas { t, r, spoke, hub: _hub } = two_replicas_with_redis().await?;
    redis_cli(spoke.port, &["SET", "app|resources-tree|gb|1.8.3.gz", "the-tree-of-gb"])?;
    let cs = cluster_secret(&t, "agent-a").await?;
    let tls = &cs.config.tls_client_config;
    let ca = tls.ca_pem().context("the cluster secret's CA")?;
    let (proxy_cert, proxy_key) =
        (tls.cert_pem().context("cluster secret cert")?, tls.key_pem().context("cluster secret key")?);
    let pki = t.pki_dir();
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).with_context(|| format!("{f} in {}", pki.display()));
    let (agent_cert, agent_key) = (read("agent-a.crt")?, read("agent-a.key")?);
    let secrets: Api<Secret> = Api::namespaced(t.hub(), ARGOCD_NS);
    let replica = secrets.get("argocd-agent-replica-client-tls").await?;
    let field = |k: &str| -> Result<String> {
        let data =
            replica.data.as_ref().and_then(|d| d.get(k)).with_context(|| format!("{k} of the replica secret"))?;
        Ok(String::from_utf8(data.0.clone())?)
    };
    let (replica_cert, replica_key) = (field("tls.crt")?, field("tls.key")?);
    let path = format!("/.argocd-agent/replica/redis/get?key={}", TREE_KEY.replace('|', "%7C"));
    let mut monitor = Monitor::start(spoke.port).await?;
    for index in [0, 1] {
        let addr = r.replica(index).resource_proxy_addr().context("proxy address")?;
        for (who, identity, headers, expect) in [
            ("agent", (agent_cert.as_str(), agent_key.as_str()), &[][..], 401),
            ("agent", (agent_cert.as_str(), agent_key.as_str()), &[(FORWARDED, "agent-a")][..], 401),
            ("proxy caller", (proxy_cert.as_str(), proxy_key.as_str()), &[][..], 403),
            ("proxy caller", (proxy_cert.as_str(), proxy_key.as_str()), &[(FORWARDED, "agent-a")][..], 401),
        ] {
            let (code, text) = raw_get(addr, &ca, identity, &path, headers).await?;
            ensure!(
                code == expect && !text.contains("the-tree-of-gb"),
                "a {who}'s certificate at replica {index}'s replica Redis endpoint ({headers:?}): {code} {text}"
            );
        }
    }
    let refused = monitor.mark("after-the-refused-calls").await?;
    ensure!(!refused.contains("resources-tree"), "a refused caller made agent-a read its Redis: {refused}");
    // The replica certificate reads at the owner (and the monitor sees that read); at the other
    // replica it is not forwarded again.
    let owner = r.replica(0).resource_proxy_addr().context("proxy address")?;
    let (code, text) = raw_get(owner, &ca, (&replica_cert, &replica_key), &path, &[(FORWARDED, "agent-a")]).await?;
    ensure!(code == 200 && text.ends_with("the-tree-of-gb"), "the replica certificate at the owner: {code} {text}");
    let read = monitor.mark("after-the-replica-read").await?;
    ensure!(read[refused.len()..].contains("resources-tree"), "the monitor saw no read by the agent: {read}");
    let other = r.replica(1).resource_proxy_addr().context("proxy address")?;
    let (code, text) = raw_get(other, &ca, (&replica_cert, &replica_key), &path, &[(FORWARDED, "agent-a")]).await?;
    ensure!(
        code == 502 && text.contains("not connected to this principal") && !text.contains("the-tree-of-gb"),
        "a forwarded read at the replica that does not own the agent is not forwarded again: {code} {text}"
    );
    Ok(())
}
