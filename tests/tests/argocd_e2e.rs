//! Real Argo CD v3.5.1 (built from its Go module by `scripts/install-test-deps`) through our
//! principal and agents, on real kube-apiservers: a hub, a managed spoke and an autonomous
//! spoke, each with its own etcd and kube-apiserver and a real `redis-server`, and a git
//! repository served by `git daemon` on loopback.
//!
//! - Each spoke runs Argo CD's real application-controller and repo-server (with the spoke's
//!   Redis, which the agent reads for the Redis proxy). The hub runs argocd-server, whose Redis is
//!   our principal's Redis proxy (in front of the hub's Redis), and the hub's repo-server. The
//!   hub's Application for an agent targets that agent's cluster (destination name = the agent,
//!   the cluster secret `argocd-agentctl agent create` writes, pointing at the resource proxy).
//! - What is checked, as a user of the hub's Argo CD sees it: the real controller syncs a managed
//!   and an autonomous Application; their status and resource list reach the hub; through
//!   argocd-server and the argocd CLI: `app list`/`get`, the resource tree (`app resources`, and a
//!   tree watch), `app manifests` (rendered by the hub's repo-server, and live), `app diff`,
//!   `app get-resource`, a resource's events, `app patch-resource`, a hard refresh, `app sync`
//!   from the hub, `app delete --cascade` (background: there is no garbage collector); and the
//!   autonomous Application's hub copy keeps its destination namespace.
//!
//! - Once more with the principal as two replicas (issue 33 item 5): Argo CD reaches both, and
//!   every CLI call that touches the proxies succeeds whichever replica it lands on.
//!
//! A bare control plane has no kubelet nor garbage collector, so the Application deploys a
//! ConfigMap. The spokes' Argo CD watches ConfigMaps only (`resource.inclusions`), which keeps
//! the controllers' cluster caches small on two busy cores.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};
use tests::apps::{apps, projects};
use tests::argocd::{self, Cli, Component, GitServer, Redis, Scratch};
use tests::process::ChildProcess;
use tests::replicas::{LoadBalancer, Replicas, TEST_LEASE, attach_to, bootstrap_args, prepare_forwarding};
use tests::topology::{ARGOCD_NS, Clusters, Mode, StartOptions, Topology};
use tests::wait::{wait_for_async, wait_until_async};

/// How long Argo CD and the agents may take to get somewhere on two busy cores.
const CONVERGE: Duration = Duration::from_secs(90);

const MANAGED: &str = "agent-m";
const AUTONOMOUS: &str = "agent-a";
const PASSWORD: &str = "e2e-admin-password";

fn configmap_manifest(greeting: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\ndata:\n  greeting: {greeting}\n")
}

/// The spokes' `argocd-cm`: only ConfigMaps are watched and managed.
fn spoke_settings() -> Value {
    json!({"resource.inclusions": "- apiGroups: [\"\"]\n  kinds: [ConfigMap]\n  clusters: [\"*\"]\n"})
}

fn object(value: Value) -> Result<DynamicObject> {
    Ok(serde_json::from_value(value)?)
}

/// Where the principal's Redis proxy listens (from its log line).
fn redis_proxy_addr(t: &Topology) -> Result<String> {
    Ok(t.redis_proxy_addr().context("the principal serves the Redis proxy")?.to_string())
}

/// The Argo CD side of the run, kept together so that a failure shows every log.
struct ArgoCd {
    server: Component,
    hub_repo: Component,
    controllers: Vec<ChildProcess>,
    spoke_repos: Vec<Component>,
    redises: Vec<Redis>,
    git: GitServer,
}

impl ArgoCd {
    fn logs(&self, t: &Topology) -> String {
        let mut out = t.logs();
        out.push_str(&format!("\n{}\n{}\n", self.server.process().log_tail(40), self.hub_repo.process().log_tail(20)));
        for c in &self.controllers {
            out.push_str(&format!("{}\n", c.log_tail(40)));
        }
        for r in &self.spoke_repos {
            out.push_str(&format!("{}\n", r.process().log_tail(20)));
        }
        for r in &self.redises {
            out.push_str(&format!("{}\n", r.process().log_tail(5)));
        }
        out.push_str(&self.git.process().log_tail(10));
        out
    }
}

/// Status fields the hub copy must show as the spoke's Argo CD wrote them.
fn status_summary(app: &Value) -> Value {
    json!({
        "sync": app["status"]["sync"]["status"],
        "health": app["status"]["health"]["status"],
        "revision": app["status"]["sync"]["revision"],
        "resources": app["status"]["resources"],
    })
}

fn synced_healthy(app: &Value) -> bool {
    app["status"]["sync"]["status"] == "Synced"
        && app["status"]["health"]["status"] == "Healthy"
        && app["status"]["resources"].as_array().is_some_and(|r| r.iter().any(|r| r["kind"] == "ConfigMap"))
}

async fn get_value(api: &Api<DynamicObject>, name: &str) -> Option<Value> {
    api.get_opt(name).await.ok().flatten().and_then(|o| serde_json::to_value(o).ok())
}

async fn greeting(cms: &Api<ConfigMap>) -> Option<String> {
    cms.get_opt("demo").await.ok().flatten().and_then(|c| c.data?.get("greeting").cloned())
}

/// The events of the managed spoke's demo ConfigMap (Argo CD's Events tab) through argocd-server,
/// that is through the resource proxy: an event about the ConfigMap is created on the spoke
/// (nothing there emits one by itself), then read back.
async fn check_events(spoke_m: &kube::Client, server: SocketAddr, token: &str) -> Result<()> {
    let cms_m: Api<ConfigMap> = Api::namespaced(spoke_m.clone(), "demo-m");
    let uid = cms_m.get("demo").await?.metadata.uid.context("the ConfigMap's uid")?;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(spoke_m.clone(), "demo-m");
    events
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "demo.e2e"}, "reason": "E2eChecked",
                "message": "seen by the e2e test", "type": "Normal",
                "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "demo-m", "name": "demo", "uid": uid}}))?,
        )
        .await?;
    let path = format!(
        "/api/v1/applications/mapp/events?appNamespace=agent-m&resourceNamespace=demo-m&resourceName=demo&resourceUID={uid}"
    );
    let (status, body) = argocd::api(server, "GET", &path, Some(token), None).await?;
    ensure!(
        status == 200 && body.contains("E2eChecked"),
        "the ConfigMap's events through argocd-server: {status} {body}"
    );
    Ok(())
}

/// Opens a resource-tree watch of agent-m/mapp, as the UI keeps one open: Argo CD sends the tree
/// when it changes, from a subscription made in the agent's Redis through the Redis proxy.
/// Returns once that subscription reached the agent's Redis; the task ends when the tree shows
/// the demo ConfigMap.
async fn open_tree_watch(argo: &ArgoCd, token: &str) -> Result<tokio::task::JoinHandle<Result<String>>> {
    let (server, token) = (argo.server.addr(), token.to_owned());
    let watch = tokio::spawn(async move {
        argocd::stream_until(
            server,
            "/api/v1/stream/applications/mapp/resource-tree?appNamespace=agent-m",
            &token,
            CONVERGE,
            |body| body.contains("\"kind\":\"ConfigMap\"") && body.contains("\"name\":\"demo\""),
        )
        .await
    });
    wait_until_async(CONVERGE, "the tree watch's subscription to reach the agent's Redis", || async {
        argo.redises[1].channels().is_ok_and(|c| c.iter().any(|c| c.contains("mapp")))
    })
    .await?;
    Ok(watch)
}

/// `argocd app patch-resource` of the demo ConfigMap: the spoke's object changes (through the
/// resource proxy), seen on the spoke.
async fn patch_demo(cli: &Cli, cms_m: &Api<ConfigMap>) -> Result<()> {
    cli.ok(&[
        "app",
        "patch-resource",
        "agent-m/mapp",
        "--kind",
        "ConfigMap",
        "--resource-name",
        "demo",
        "--namespace",
        "demo-m",
        "--patch",
        r#"{"data":{"greeting":"patched"}}"#,
        "--patch-type",
        "application/merge-patch+json",
    ])
    .await?;
    wait_until_async(CONVERGE, "the patch to reach the spoke's ConfigMap", || async {
        greeting(cms_m).await.as_deref() == Some("patched")
    })
    .await
}

/// A sync from the hub runs on the spoke, and its result comes back (`--async`: a blocking sync
/// can miss a result that arrives between its Get and its Watch).
async fn sync_from_hub(cli: &Cli, cms_m: &Api<ConfigMap>, hub_m: &Api<DynamicObject>) -> Result<()> {
    cli.ok(&["app", "sync", "agent-m/mapp", "--async"]).await?;
    wait_until_async(CONVERGE, "the hub's sync to restore the ConfigMap and report Succeeded", || async {
        greeting(cms_m).await.as_deref() == Some("hello")
            && get_value(hub_m, "mapp").await.is_some_and(|a| {
                a["status"]["operationState"]["phase"] == "Succeeded" && a["status"]["sync"]["status"] == "Synced"
            })
    })
    .await
}

/// Everything a run starts, kept together so that a failure shows every log: the clusters and
/// agents, the principal or its two replicas (and the load balancers standing in for their
/// Services), Argo CD.
struct Env {
    t: Topology,
    replicas: Option<Replicas>,
    /// The load balancers standing in for Services (with two replicas: the Redis proxies').
    services: Vec<LoadBalancer>,
    argo: ArgoCd,
    scratch: Scratch,
    started: Instant,
}

impl Env {
    fn logs(&self) -> String {
        let mut out = self.argo.logs(&self.t);
        if let Some(r) = &self.replicas {
            out.push_str(&r.logs());
        }
        out
    }

    fn phase(&self, what: &str) {
        eprintln!("[{:>6.1} s] {what}", self.started.elapsed().as_secs_f64());
    }
}

/// The principal replaced by two replicas that forward to each other (`--agent-leases`, the
/// replica client certificate), the managed agent on replica 0 and the autonomous one on
/// replica 1. Argo CD reaches the Redis proxies through a round-robin load balancer (the
/// Service's place: each of argocd-server's Redis connections lands on a replica that owns one
/// agent and not the other), and each agent's cluster secret names the resource proxy of the
/// replica that does NOT own it, so every resource-proxy call is forwarded. Returns the Redis
/// proxy's address for argocd-server, and the load balancers.
async fn start_replicas(
    t: &mut Topology,
    redis_args: &[String],
    redis_m: &Redis,
    redis_a: &Redis,
) -> Result<(Replicas, String, Vec<LoadBalancer>)> {
    let redis_args: Vec<&str> = redis_args.iter().map(String::as_str).collect();
    prepare_forwarding(t, &redis_args)?;
    let r = Replicas::start(t, &[("r0", Default::default()), ("r1", Default::default())], TEST_LEASE).await?;
    for (index, (agent, redis)) in [(MANAGED, redis_m), (AUTONOMOUS, redis_a)].into_iter().enumerate() {
        t.set_agent_args(&["--redis-addr", &redis.addr()]);
        attach_to(t, &r, &[agent], index).await?;
    }
    let mut redis_proxies = Vec::new();
    for index in [0, 1] {
        redis_proxies.push(r.replica(index).redis_proxy_addr().context("a replica's Redis proxy")?);
    }
    let redis_service = LoadBalancer::start(&redis_proxies).await?;
    for (agent, other) in [(MANAGED, 1), (AUTONOMOUS, 0)] {
        let proxy = r.replica(other).resource_proxy_addr().context("a replica's resource proxy")?;
        t.ctl(&["agent", "create", agent, "--resource-proxy-server", &proxy.to_string()])?;
    }
    let redis_proxy = redis_service.addr().to_string();
    Ok((r, redis_proxy, vec![redis_service]))
}

/// Starts everything (one principal, or two replicas) and waits until the real controllers
/// have synced a managed Application (on the hub, for the managed agent's cluster) and an
/// autonomous one (on its spoke), and their status reached the hub.
async fn start_env(two_replicas: bool) -> Result<Env> {
    argocd::require_tools()?;
    let started = Instant::now();
    let phase = |what: &str| eprintln!("[{:>6.1} s] {what}", started.elapsed().as_secs_f64());

    let scratch = Scratch::new()?;
    let hub_redis = Redis::start("redis-hub").await?;
    let redis_m = Redis::start("redis-agent-m").await?;
    let redis_a = Redis::start("redis-agent-a").await?;
    let redis_args: Vec<String> = vec![
        "--redis-server-address".into(),
        hub_redis.addr(),
        "--redis-proxy-listen-address".into(),
        "127.0.0.1:0".into(),
    ];
    let git = GitServer::start(&[
        ("managed/configmap.yaml", &configmap_manifest("hello")),
        ("autonomous/configmap.yaml", &configmap_manifest("hi")),
    ])
    .await?;
    let repo_url = git.url();

    let options = StartOptions {
        clusters: Clusters::REAL,
        resource_proxy: true,
        start_agents: false,
        principal_args: if two_replicas { [redis_args.clone(), bootstrap_args()].concat() } else { redis_args.clone() },
        ..StartOptions::default()
    };
    let mut t =
        Topology::start_with_options(&[(MANAGED, Mode::Managed), (AUTONOMOUS, Mode::Autonomous)], options).await?;
    let (replicas, redis_proxy, services) = if two_replicas {
        let (r, redis_proxy, services) = start_replicas(&mut t, &redis_args, &redis_m, &redis_a).await?;
        (Some(r), redis_proxy, services)
    } else {
        for (agent, redis) in [(MANAGED, &redis_m), (AUTONOMOUS, &redis_a)] {
            t.set_agent_args(&["--redis-addr", &redis.addr()]);
            t.start_agent(agent).await?;
        }
        wait_until_async(CONVERGE, "both agents to connect", || async {
            t.principal_connects(MANAGED) > 0 && t.principal_connects(AUTONOMOUS) > 0
        })
        .await
        .with_context(|| t.logs())?;
        let proxy = t.resource_proxy_addr().context("the principal serves the resource proxy")?;
        // Argo CD's cluster secret per agent, pointing at the resource proxy: the destination
        // `name` of the hub's Applications for that agent.
        for agent in [MANAGED, AUTONOMOUS] {
            t.ctl(&["agent", "create", agent, "--resource-proxy-server", &proxy.to_string()])?;
        }
        (None, redis_proxy_addr(&t)?, Vec::new())
    };
    phase("hub, spokes, principal and agents up");

    // Argo CD's settings on each cluster, and its projects: on the hub `default` for the
    // agents' namespaces (the principal sends it to the managed agent); on the autonomous spoke
    // its own (the agent sends it to the hub as `agent-a-default`).
    let (hub, spoke_m, spoke_a) = (t.hub(), t.spoke(MANAGED)?, t.spoke(AUTONOMOUS)?);
    argocd::install_settings(&hub, ARGOCD_NS, &json!({}), Some(&argocd::bcrypt(PASSWORD)?)).await?;
    argocd::install_settings(&spoke_m, ARGOCD_NS, &spoke_settings(), None).await?;
    argocd::install_settings(&spoke_a, ARGOCD_NS, &spoke_settings(), None).await?;
    let everything = json!([{"group": "*", "kind": "*"}]);
    projects(&hub, ARGOCD_NS)
        .create(
            &PostParams::default(),
            &object(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "default", "namespace": ARGOCD_NS},
                "spec": {"sourceRepos": ["*"], "sourceNamespaces": [MANAGED, AUTONOMOUS],
                         "destinations": [{"name": "*", "server": "*", "namespace": "*"}],
                         "clusterResourceWhitelist": everything}}))?,
        )
        .await?;
    projects(&spoke_a, ARGOCD_NS)
        .create(
            &PostParams::default(),
            &object(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "default", "namespace": ARGOCD_NS},
                "spec": {"sourceRepos": ["*"], "destinations": [{"server": "*", "namespace": "*"}],
                         "clusterResourceWhitelist": everything}}))?,
        )
        .await?;
    tests::topology::ensure_namespace(&spoke_m, "demo-m").await?;
    tests::topology::ensure_namespace(&spoke_a, "demo-a").await?;

    // Argo CD itself: per spoke a repo-server and an application controller, on the hub a
    // repo-server and argocd-server behind the Redis proxy.
    let kubeconfig = |context: &str| {
        argocd::cluster_kubeconfig(&t.kubeconfig(), context, &scratch.path().join(format!("{context}.kubeconfig")))
    };
    let repo_m = argocd::start_repo_server(&scratch, MANAGED, &redis_m.addr()).await?;
    let repo_a = argocd::start_repo_server(&scratch, AUTONOMOUS, &redis_a.addr()).await?;
    let controllers = vec![
        argocd::start_application_controller(&scratch, MANAGED, &kubeconfig(MANAGED)?, &redis_m.addr(), repo_m.addr())?,
        argocd::start_application_controller(
            &scratch,
            AUTONOMOUS,
            &kubeconfig(AUTONOMOUS)?,
            &redis_a.addr(),
            repo_a.addr(),
        )?,
    ];
    let hub_repo = argocd::start_repo_server(&scratch, "hub", &hub_redis.addr()).await?;
    let server =
        argocd::start_server(&scratch, &kubeconfig("hub")?, &redis_proxy, hub_repo.addr(), &[MANAGED, AUTONOMOUS])
            .await?;
    let argo = ArgoCd {
        server,
        hub_repo,
        controllers,
        spoke_repos: vec![repo_m, repo_a],
        redises: vec![hub_redis, redis_m, redis_a],
        git,
    };
    let env = Env { t, replicas, services, argo, scratch, started };
    let logs = || env.logs();
    phase("Argo CD up");

    // A managed Application on the hub, for the managed agent's cluster; an autonomous one on
    // the autonomous spoke. Both sync automatically.
    let hub_m = apps(&hub, MANAGED);
    let hub_a = apps(&hub, AUTONOMOUS);
    let spoke_apps_m = apps(&spoke_m, ARGOCD_NS);
    let spoke_apps_a = apps(&spoke_a, ARGOCD_NS);
    hub_m
        .create(
            &PostParams::default(),
            &object(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": {"name": "mapp", "namespace": MANAGED},
                "spec": {"project": "default",
                         "source": {"repoURL": repo_url, "path": "managed", "targetRevision": "main"},
                         "destination": {"name": MANAGED, "namespace": "demo-m"},
                         "syncPolicy": {"automated": {"prune": true}}}}))?,
        )
        .await?;
    spoke_apps_a
        .create(
            &PostParams::default(),
            &object(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": {"name": "aapp", "namespace": ARGOCD_NS},
                "spec": {"project": "default",
                         "source": {"repoURL": repo_url, "path": "autonomous", "targetRevision": "main"},
                         "destination": {"server": "https://kubernetes.default.svc", "namespace": "demo-a"},
                         "syncPolicy": {"automated": {"prune": true}}}}))?,
        )
        .await?;

    // The real controllers sync them.
    let cms_m: Api<ConfigMap> = Api::namespaced(spoke_m.clone(), "demo-m");
    let cms_a: Api<ConfigMap> = Api::namespaced(spoke_a.clone(), "demo-a");
    wait_until_async(CONVERGE, "the managed spoke's controller to deploy the ConfigMap", || async {
        greeting(&cms_m).await.as_deref() == Some("hello")
    })
    .await
    .with_context(logs)?;
    wait_until_async(CONVERGE, "the autonomous spoke's controller to deploy the ConfigMap", || async {
        greeting(&cms_a).await.as_deref() == Some("hi")
    })
    .await
    .with_context(logs)?;
    phase("both Applications synced by the spokes' controllers");

    // Status and the resource list reach the hub as the spokes' Argo CD wrote them.
    for (hub_api, spoke_api, name, what) in
        [(&hub_m, &spoke_apps_m, "mapp", "managed"), (&hub_a, &spoke_apps_a, "aapp", "autonomous")]
    {
        wait_until_async(
            CONVERGE,
            &format!("the {what} Application's status on the hub to equal the spoke's"),
            || async {
                match (get_value(hub_api, name).await, get_value(spoke_api, name).await) {
                    (Some(h), Some(s)) => synced_healthy(&s) && status_summary(&h) == status_summary(&s),
                    _ => false,
                }
            },
        )
        .await
        .with_context(logs)?;
    }
    // The autonomous hub copy: the agent's cluster, in the namespace the agent deploys to.
    let copy = get_value(&hub_a, "aapp").await.context("the autonomous hub copy")?;
    ensure!(
        copy["spec"]["destination"] == json!({"name": AUTONOMOUS, "namespace": "demo-a"}),
        "the autonomous hub copy's destination: {}",
        copy["spec"]["destination"]
    );
    phase("status on the hub");
    Ok(env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_argocd_through_principal_and_agents() -> Result<()> {
    let mut env = start_env(false).await?;
    let (t, argo, scratch) = (&env.t, &env.argo, &env.scratch);
    let logs = || env.logs();
    let phase = |what: &str| env.phase(what);
    let (hub, spoke_m) = (t.hub(), t.spoke(MANAGED)?);
    let hub_m = apps(&hub, MANAGED);
    let spoke_apps_m = apps(&spoke_m, ARGOCD_NS);
    let cms_m: Api<ConfigMap> = Api::namespaced(spoke_m.clone(), "demo-m");

    // The argocd CLI against argocd-server on the hub.
    let server = argo.server.addr();
    let cli = Cli::login(scratch, server, PASSWORD).await.with_context(logs)?;
    // The CLI and the server are the same stamped build.
    let versions = cli.json(&["version", "--short"]).await?;
    let (client, server_version) = (&versions["client"]["argocd"], &versions["server"]["argocd-server"]);
    ensure!(
        client == server_version && client.as_str().is_some_and(|v| v.starts_with(argocd::ARGOCD_VERSION)),
        "argocd version: {versions}"
    );
    let list = cli.json(&["app", "list"]).await?;
    let names: Vec<String> = list
        .as_array()
        .context("app list")?
        .iter()
        .map(|a| {
            format!(
                "{}/{}",
                a["metadata"]["namespace"].as_str().unwrap_or(""),
                a["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    ensure!(
        ["agent-m/mapp", "agent-a/aapp"].iter().all(|want| names.iter().any(|n| n.as_str() == *want)),
        "app list: {names:?}"
    );
    let got = cli.json(&["app", "get", "agent-m/mapp"]).await?;
    ensure!(synced_healthy(&got), "app get agent-m/mapp: {}", got["status"]);
    let got = cli.json(&["app", "get", "agent-a/aapp"]).await?;
    ensure!(synced_healthy(&got), "app get agent-a/aapp: {}", got["status"]);
    ensure!(got["spec"]["destination"]["namespace"] == "demo-a", "app get agent-a/aapp: {}", got["spec"]);
    phase("app list, app get");

    // Settings → Clusters: `argocd cluster list` shows each agent connected, with its version in
    // the message (the principal writes Argo CD's cluster info into the hub's Redis, as
    // upstream's does) and the managed agent's Application counted.
    let clusters = wait_for_async(CONVERGE, "argocd cluster list to show both agents connected", || async {
        let Ok(list) = cli.json(&["cluster", "list", "-o", "json"]).await else { return Ok(None) };
        let shown = |agent: &str, min_apps: u64| {
            list.as_array().into_iter().flatten().any(|c| {
                let state = &c["info"]["connectionState"];
                c["name"] == agent
                    && state["status"] == "Successful"
                    && state["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(&format!("'{agent}' is connected")) && m.contains("agent version"))
                    && c["info"]["applicationsCount"].as_u64().unwrap_or(0) >= min_apps
            })
        };
        Ok((shown(MANAGED, 1) && shown(AUTONOMOUS, 0)).then_some(list))
    })
    .await
    .with_context(logs)?;
    phase(&format!("cluster list: {} clusters, both agents connected", clusters.as_array().map_or(0, Vec::len)));

    // The resource tree (the spokes' Redis, through the Redis proxy) for both modes.
    for app in ["agent-m/mapp", "agent-a/aapp"] {
        let tree = cli.ok(&["app", "resources", app]).await?;
        ensure!(tree.contains("ConfigMap") && tree.contains("demo"), "app resources {app}: {tree}");
    }
    let token = argocd::session_token(server, PASSWORD).await?;
    phase("resource tree");

    // Manifests: rendered by the hub's repo-server from git, and live (the spoke's Redis).
    let rendered = cli.ok(&["app", "manifests", "agent-m/mapp", "--source", "git"]).await?;
    ensure!(rendered.contains("greeting: hello"), "app manifests --source git: {rendered}");
    let live = cli.ok(&["app", "manifests", "agent-m/mapp", "--source", "live"]).await?;
    ensure!(
        live.contains("greeting: hello") && live.contains("argocd.argoproj.io/tracking-id"),
        "app manifests --source live: {live}"
    );
    let diff = cli.run(&["app", "diff", "agent-m/mapp"]).await?;
    ensure!(diff.code == 0, "app diff of a synced Application: {diff}");
    phase("app manifests, app diff");

    // A live object through the resource proxy.
    let live_cm = cli
        .ok(&["app", "get-resource", "agent-m/mapp", "--kind", "ConfigMap", "--resource-name", "demo", "-o", "json"])
        .await?;
    ensure!(
        live_cm.contains("\"greeting\": \"hello\"") || live_cm.contains("\"greeting\":\"hello\""),
        "app get-resource: {live_cm}"
    );

    // The events of one resource (Argo CD's Events tab), through the resource proxy.
    check_events(&spoke_m, server, &token).await.with_context(logs)?;
    phase("get-resource, events");

    // A tree watch, as the UI keeps one open (through the Redis proxy).
    let watch = open_tree_watch(argo, &token).await.with_context(logs)?;

    // patch-resource changes the spoke's object (not the hub's), and the spoke's controller
    // sees the drift: OutOfSync on the hub, and `app diff` shows it.
    patch_demo(&cli, &cms_m).await.with_context(logs)?;
    watch.await?.context("the tree watch")?;
    let hub_cms: Api<ConfigMap> = Api::namespaced(hub.clone(), "demo-m");
    ensure!(hub_cms.get_opt("demo").await.ok().flatten().is_none(), "patch-resource created or touched a hub object");
    wait_until_async(CONVERGE, "the drift to show as OutOfSync on the hub", || async {
        get_value(&hub_m, "mapp").await.is_some_and(|a| a["status"]["sync"]["status"] == "OutOfSync")
    })
    .await
    .with_context(logs)?;
    let diff = cli.run(&["app", "diff", "agent-m/mapp"]).await?;
    ensure!(diff.code == 1 && diff.stdout.contains("patched"), "app diff of the drifted Application: {diff}");
    phase("tree watch, patch-resource, drift, diff");

    // A hard refresh from the hub: argocd-server waits until the spoke's controller has done it.
    let refreshed = cli.json(&["app", "get", "agent-m/mapp", "--hard-refresh"]).await.with_context(logs)?;
    ensure!(refreshed["status"]["sync"]["status"] == "OutOfSync", "after the refresh: {}", refreshed["status"]["sync"]);

    // A sync from the hub runs on the spoke; its result comes back.
    sync_from_hub(&cli, &cms_m, &hub_m).await.with_context(logs)?;
    let got = cli.json(&["app", "get", "agent-m/mapp"]).await?;
    ensure!(
        got["status"]["operationState"]["phase"] == "Succeeded",
        "app get after the sync: {}",
        got["status"]["operationState"]
    );
    phase("hard refresh, sync from the hub");

    // Delete with cascade (background: no garbage collector here): the spoke's controller
    // deletes the ConfigMap, then both copies go.
    cli.ok(&["app", "delete", "agent-m/mapp", "--cascade", "--propagation-policy", "background", "--yes"]).await?;
    wait_for_async(CONVERGE, "the cascade to delete the ConfigMap and both Application copies", || async {
        let cm_gone = cms_m.get_opt("demo").await?.is_none();
        let spoke_gone = spoke_apps_m.get_opt("mapp").await?.is_none();
        let hub_gone = hub_m.get_opt("mapp").await?.is_none();
        anyhow::Ok((cm_gone && spoke_gone && hub_gone).then_some(()))
    })
    .await
    .with_context(logs)?;
    let list = cli.json(&["app", "list"]).await?;
    ensure!(
        list.as_array().is_some_and(|l| l.iter().all(|a| a["metadata"]["name"] != "mapp")),
        "app list after the delete: {list}"
    );
    phase("delete --cascade");

    let stopped = env.t.not_running();
    ensure!(stopped.is_empty(), "stopped during the run: {stopped:?}");
    Ok(())
}

/// Issue 33 item 5: the same Argo CD with the principal as two replicas. Each agent's cluster
/// secret names the replica that does not own it (every resource-proxy call is forwarded), and
/// argocd-server's Redis is a round-robin load balancer over both replicas' Redis proxies (each
/// connection lands on a replica that owns one agent and not the other). Every argocd CLI call
/// that touches the proxies succeeds: get, resources, manifests live, diff, get-resource,
/// events, a tree watch, patch-resource, sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_argocd_through_two_principal_replicas() -> Result<()> {
    let mut env = start_env(true).await?;
    let (t, argo, scratch) = (&env.t, &env.argo, &env.scratch);
    let r = env.replicas.as_ref().context("the replicas")?;
    let logs = || env.logs();
    let phase = |what: &str| env.phase(what);
    let spoke_m = t.spoke(MANAGED)?;
    let hub_m = apps(&t.hub(), MANAGED);
    let cms_m: Api<ConfigMap> = Api::namespaced(spoke_m.clone(), "demo-m");

    let server = argo.server.addr();
    let cli = Cli::login(scratch, server, PASSWORD).await.with_context(logs)?;
    for app in ["agent-m/mapp", "agent-a/aapp"] {
        let got = cli.json(&["app", "get", app]).await.with_context(logs)?;
        ensure!(synced_healthy(&got), "app get {app}: {}", got["status"]);
        // The resource tree and the live manifests: the agent's Redis, through either replica.
        let tree = cli.ok(&["app", "resources", app]).await.with_context(logs)?;
        ensure!(tree.contains("ConfigMap") && tree.contains("demo"), "app resources {app}: {tree}");
        let live = cli.ok(&["app", "manifests", app, "--source", "live"]).await.with_context(logs)?;
        ensure!(live.contains("argocd.argoproj.io/tracking-id"), "app manifests {app} --source live: {live}");
        // A live object: the resource proxy of the replica that does not own the agent.
        let object = cli
            .ok(&["app", "get-resource", app, "--kind", "ConfigMap", "--resource-name", "demo", "-o", "json"])
            .await
            .with_context(logs)?;
        ensure!(object.contains("greeting"), "app get-resource {app}: {object}");
    }
    let diff = cli.run(&["app", "diff", "agent-m/mapp"]).await?;
    ensure!(diff.code == 0, "app diff of a synced Application: {diff}\n{}", logs());
    phase("app get, resources, manifests live, get-resource, diff");

    // A resource's events, through the forwarding replica's resource proxy.
    let token = argocd::session_token(server, PASSWORD).await?;
    check_events(&spoke_m, server, &token).await.with_context(logs)?;

    // A tree watch, then patch-resource, which the watch sees; then a sync from the hub
    // restores the object. The watch's subscription (go-redis opens a new connection for it) is
    // steered to the replica that does not own agent-m, so it is forwarded.
    let redis_service = env.services.first().context("the Redis proxies' load balancer")?;
    redis_service.only(1);
    let watch = open_tree_watch(argo, &token).await.with_context(logs)?;
    redis_service.all_up();
    patch_demo(&cli, &cms_m).await.with_context(logs)?;
    watch.await?.context("the tree watch")?;
    phase("events, tree watch, patch-resource");
    sync_from_hub(&cli, &cms_m, &hub_m).await.with_context(logs)?;
    phase("sync from the hub");

    // Both replicas forwarded resource-proxy calls, and Redis reads were forwarded.
    let forwards = "argocd_principal_replica_forwards_total";
    for index in [0, 1] {
        let answered = r.replica(index).metric(forwards, r#"surface="resource_proxy",outcome="answered""#).await;
        ensure!(answered >= Some(1.0), "replica {index} forwarded resource-proxy calls: {answered:?}");
    }
    let mut redis_hits = 0.0;
    for index in [0, 1] {
        redis_hits += r.replica(index).metric(forwards, r#"surface="redis_get",outcome="hit""#).await.unwrap_or(0.0);
    }
    ensure!(redis_hits >= 1.0, "Redis GETs forwarded between the replicas: {redis_hits}");
    let labels = r#"surface="redis_subscribe",outcome="subscribed""#;
    let subscriptions = r.replica(1).metric(forwards, labels).await.unwrap_or(0.0);
    ensure!(subscriptions >= 1.0, "the tree watch's subscription was forwarded by replica 1: {subscriptions}");
    phase(&format!("forwarded: Redis GET hits {redis_hits}, subscriptions {subscriptions}"));

    let stopped: Vec<String> = env.t.not_running().into_iter().filter(|p| p != "principal").collect();
    ensure!(stopped.is_empty(), "stopped during the run: {stopped:?}");
    if let Some(r) = env.replicas.as_mut() {
        for index in [0, 1] {
            ensure!(r.replica_mut(index).is_running(), "replica {index} stopped during the run");
        }
    }
    Ok(())
}
