//! `argocd-agent quickstart`: a hub and two workload clusters on this machine, in one command.
//!
//! Three embedded API servers (hub, a managed spoke, an autonomous spoke), the PKI written as
//! upstream's secrets, a principal and two agents over mTLS, demo Applications created on the
//! hub and on the autonomous spoke, and a live table until Ctrl-C. Every process is a child of
//! this one and is stopped when it ends. The spokes' application controller is a stand-in
//! ([`controller`]) unless `--argocd` runs the real Argo CD ([`argocd`]).

mod argocd;
mod children;
mod controller;
mod live;
mod table;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

use children::{ChildProc, wait_for_file};

const START_TIMEOUT: Duration = Duration::from_secs(60);
const HUB: &str = "hub";
const MANAGED: &str = "managed";
const AUTONOMOUS: &str = "autonomous";
const MANAGED_AGENT: &str = "agent-managed";
const AUTONOMOUS_AGENT: &str = "agent-autonomous";
/// Namespace of the principal on the hub and of Argo CD on the spokes (upstream's default).
const ARGOCD_NS: &str = "argocd";

/// Flags of `argocd-agent quickstart`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Working directory for data, PKI, kubeconfigs and logs (default: a new temporary one,
    /// removed after a successful `--once`).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Exit 0 once every demo Application has reached the other side with status; non-zero
    /// with a reason otherwise. No process is left behind either way.
    #[arg(long)]
    pub once: bool,
    /// Seconds `--once` waits before giving up.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Do not run the stand-in for Argo CD's application controller on the spokes (no status
    /// will be reported then: there is no Argo CD here).
    #[arg(long)]
    pub no_simulate_controller: bool,
    /// Run the real Argo CD (v3.5.1 is tested) instead of the stand-in: on each spoke
    /// argocd-application-controller, argocd-repo-server and a redis-server; on the hub
    /// argocd-server (admin password printed) and a repo-server behind the principal's Redis
    /// proxy. The demo Applications come from a git repository written into --dir and served
    /// by `git daemon` on 127.0.0.1. Argo CD's binaries are taken from the first directory on
    /// PATH holding argocd, argocd-server, argocd-application-controller and
    /// argocd-repo-server, else from the .venv/bin of the workspace this argocd-agent was built
    /// in, where scripts/install-test-deps builds them; redis-server and git from PATH.
    #[arg(long)]
    pub argocd: bool,
    /// Log level of the quickstart itself (the children log to files).
    #[arg(long, default_value = "warn")]
    pub log_level: String,
}

/// Run the quickstart.
///
/// # Errors
/// A component fails to start, or `--once` does not converge in time.
pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        !(args.argocd && args.no_simulate_controller),
        "--argocd runs the real application controller instead of the stand-in: drop --no-simulate-controller"
    );
    crate::runtime::logging::init(&args.log_level, false);
    let (dir, _temp) = match &args.dir {
        Some(d) => (d.clone(), None),
        None => {
            let t = tempfile_dir()?;
            (t.clone(), Some(t))
        }
    };
    std::fs::create_dir_all(dir.join("logs")).with_context(|| format!("cannot create {}", dir.display()))?;
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let result = rt.block_on(Quickstart::new(dir.clone(), args.clone()).run());
    if result.is_ok() && args.once && args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("argocd-agent-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// What `--argocd` set up that later steps and `--once` need.
struct RealArgoCd {
    scratch: argocd::Scratch,
    /// The demo repository's URL (`git://127.0.0.1:PORT/repo.git`) and its one commit.
    repo_url: String,
    commit: String,
    /// redis-server of the hub, the managed and the autonomous spoke.
    redis: [String; 3],
    /// The hub's argocd-server, once started.
    server: Option<String>,
    password: String,
}

struct Quickstart {
    dir: PathBuf,
    argo: Option<RealArgoCd>,
    /// Stamped on the demo Applications (see [`table::RUN_ANNOTATION`]).
    run_id: String,
    args: Args,
    children: Vec<ChildProc>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn app_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"), "applications")
}

/// Where a demo Application deploys: a hub Application for a managed agent names the agent's
/// cluster (the cluster secret `argocd-agentctl agent create` wrote), so that the hub's Argo CD
/// reaches the spoke through the principal's resource proxy; the in-cluster server there would
/// be the hub itself. An autonomous spoke's own Application deploys to its own cluster.
fn demo_destination(agent_cluster: Option<&str>, namespace: &str) -> Value {
    match agent_cluster {
        Some(agent) => json!({"name": agent, "namespace": namespace}),
        None => json!({"server": "https://kubernetes.default.svc", "namespace": namespace}),
    }
}

/// A demo Application's source: the quickstart's own repository with `--argocd`, else (for the
/// stand-in, which fetches nothing) Argo CD's example apps.
fn demo_source(argo: Option<&RealArgoCd>, path: &str) -> Value {
    match argo {
        Some(a) => json!({"repoURL": a.repo_url, "path": path, "targetRevision": "main"}),
        None => {
            json!({"repoURL": "https://github.com/argoproj/argocd-example-apps.git", "path": path, "targetRevision": "HEAD"})
        }
    }
}

fn demo_app(
    name: &str,
    namespace: &str,
    source: Value,
    destination: Value,
    run: &str,
) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "quickstart"},
            "annotations": {table::RUN_ANNOTATION: run},
        },
        "spec": {
            "project": "default",
            "source": source,
            "destination": destination,
            "syncPolicy": {"automated": {"prune": true, "selfHeal": true}},
        },
    }))?)
}

/// Merge the three servers' kubeconfigs into one with contexts `hub`, `managed`, `autonomous`.
fn merged_kubeconfig(parts: &[(&str, PathBuf)]) -> anyhow::Result<String> {
    let mut clusters = Vec::new();
    let mut users = Vec::new();
    let mut contexts = Vec::new();
    for (name, path) in parts {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let kc: Value = serde_yaml::from_str(&text).with_context(|| format!("{} is not YAML", path.display()))?;
        clusters.push(json!({"name": name, "cluster": kc["clusters"][0]["cluster"]}));
        users.push(json!({"name": name, "user": kc["users"][0]["user"]}));
        contexts.push(json!({"name": name, "context": {"cluster": name, "user": name, "namespace": ARGOCD_NS}}));
    }
    let merged = json!({"apiVersion": "v1", "kind": "Config", "clusters": clusters, "users": users, "contexts": contexts, "current-context": HUB});
    Ok(serde_yaml::to_string(&merged)?)
}

impl Quickstart {
    fn new(dir: PathBuf, args: Args) -> Self {
        let run_id = chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ").to_string();
        Self { dir, argo: None, run_id, args, children: Vec::new(), tasks: Vec::new() }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }

    async fn run(mut self) -> anyhow::Result<()> {
        let result = self.run_inner().await;
        // Stop in-process watchers before the servers they watch.
        for task in self.tasks.drain(..) {
            task.abort();
        }
        for child in self.children.drain(..).rev() {
            child.stop(Duration::from_secs(5)).await;
        }
        if result.is_ok() && !self.args.once {
            println!("stopped every process; data, kubeconfig and logs stay in {}", self.dir.display());
        }
        result
    }

    /// Starts an embedded API server for cluster `name`, with `extra` flags.
    async fn start_apiserver(&mut self, name: &str, extra: &[&str]) -> anyhow::Result<PathBuf> {
        let data = self.dir.join(name);
        let kc = data.join("kubeconfig");
        let _ = std::fs::remove_file(&kc);
        let mut args = vec![
            "apiserver".to_string(),
            "--data-dir".into(),
            data.join("data").display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--kubeconfig-out".into(),
            kc.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_string()));
        let (mut child, _) =
            ChildProc::start(&format!("{name} API server"), &args, &self.log(&format!("apiserver-{name}")), None)
                .await?;
        wait_for_file(&mut child, &kc, START_TIMEOUT).await?;
        self.children.push(child);
        Ok(kc)
    }

    async fn client(&self, context: &str) -> anyhow::Result<kube::Client> {
        crate::ctl::kube::client(Some(&self.kubeconfig()), Some(context)).await
    }

    async fn ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut full =
            vec!["argocd-agentctl".to_string(), "--kubeconfig".into(), self.kubeconfig().display().to_string()];
        full.extend(args.iter().map(|s| (*s).to_string()));
        let shown = args.join(" ");
        tokio::task::spawn_blocking(move || crate::ctl::run_from(full))
            .await
            .context("argocd-agentctl task")?
            .with_context(|| format!("argocd-agentctl {shown}"))
    }

    async fn run_inner(&mut self) -> anyhow::Result<()> {
        println!("argocd-agent quickstart in {}", self.dir.display());
        // Before anything starts: a missing Argo CD binary is said at once.
        let tools = if self.args.argocd {
            let tools = argocd::Tools::find()?;
            let version = tools.version().await?;
            println!("  Argo CD: {version} from {}", tools.bin_dir.display());
            if !version.contains(argocd::ARGOCD_VERSION) {
                println!("  note: the quickstart is tested with Argo CD {} only", argocd::ARGOCD_VERSION);
            }
            Some(tools)
        } else {
            None
        };
        let hub = self.start_apiserver(HUB, &[]).await?;
        // The managed spoke runs its Pods' commands as local processes (a simulated node, for
        // the demo only), so `kubectl logs` and `kubectl exec` through the principal work.
        let managed = self.start_apiserver(MANAGED, &["--simulate-pods"]).await?;
        let autonomous = self.start_apiserver(AUTONOMOUS, &[]).await?;
        let merged = merged_kubeconfig(&[(HUB, hub), (MANAGED, managed), (AUTONOMOUS, autonomous)])?;
        std::fs::write(self.kubeconfig(), merged).context("cannot write the merged kubeconfig")?;
        println!("  3 embedded API servers up (contexts hub, managed, autonomous in {})", self.kubeconfig().display());
        println!("  the managed spoke simulates a node: its Pods' commands run as local processes (demo only)");

        let (hub_c, managed_c, autonomous_c) =
            (self.client(HUB).await?, self.client(MANAGED).await?, self.client(AUTONOMOUS).await?);
        for (client, namespaces) in [
            (&hub_c, vec![ARGOCD_NS, MANAGED_AGENT, AUTONOMOUS_AGENT]),
            (&managed_c, vec![ARGOCD_NS]),
            (&autonomous_c, vec![ARGOCD_NS]),
        ] {
            for ns in namespaces {
                ensure_namespace(client, ns).await?;
            }
        }
        if let Some(tools) = tools {
            self.prepare_argocd(tools, &hub_c, &managed_c, &autonomous_c).await?;
        }

        // The PKI, exactly as an operator would create it with argocd-agentctl.
        // ECDSA P-256 keys keep startup fast; the JWT key is RSA, as upstream's RS512 requires.
        // Each step is skipped when its secret exists, so a second run on the same --dir reuses
        // the PKI (and a run interrupted half-way completes it).
        if !secret_exists(&hub_c, "argocd-agent-ca").await? {
            self.ctl(&["--principal-context", HUB, "pki", "init", "--key-algorithm", "ecdsa-p256"]).await?;
        }
        if !secret_exists(&hub_c, "argocd-agent-principal-tls").await? {
            self.ctl(&[
                "--principal-context",
                HUB,
                "pki",
                "issue",
                "principal",
                "--ip",
                "127.0.0.1",
                "--dns",
                "localhost",
                "--key-algorithm",
                "ecdsa-p256",
            ])
            .await?;
        }
        if !secret_exists(&hub_c, "argocd-agent-resource-proxy-tls").await? {
            self.ctl(&[
                "--principal-context",
                HUB,
                "pki",
                "issue",
                "resource-proxy",
                "--ip",
                "127.0.0.1",
                "--key-algorithm",
                "ecdsa-p256",
            ])
            .await?;
        }
        if !secret_exists(&hub_c, "argocd-agent-jwt").await? {
            self.ctl(&["--principal-context", HUB, "jwt", "create-key"]).await?;
        }
        for (agent, context, client) in
            [(MANAGED_AGENT, MANAGED, &managed_c), (AUTONOMOUS_AGENT, AUTONOMOUS, &autonomous_c)]
        {
            if !secret_exists(client, "argocd-agent-client-tls").await? {
                self.ctl(&[
                    "--principal-context",
                    HUB,
                    "--agent-context",
                    context,
                    "pki",
                    "issue",
                    "agent",
                    agent,
                    "--key-algorithm",
                    "ecdsa-p256",
                ])
                .await?;
            }
            if !secret_exists(client, "argocd-agent-ca").await? {
                self.ctl(&["--principal-context", HUB, "--agent-context", context, "pki", "propagate"]).await?;
            }
        }
        println!("  PKI: CA, principal and agent certificates and the JWT key stored as upstream's secrets");

        let kc = self.kubeconfig().display().to_string();
        let principal_args: Vec<String> = [
            "principal",
            "--allowed-namespaces",
            "agent-*",
            "--namespace",
            ARGOCD_NS,
            "--auth",
            "mtls:subject:CN=([^,]+)",
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            "0",
            "--kubeconfig",
            &kc,
            "--kubecontext",
            HUB,
            // Free loopback ports: nothing of the demo listens beyond this machine.
            "--metrics-address",
            "127.0.0.1:0",
            "--healthz-address",
            "127.0.0.1:0",
            "--resource-proxy-listen-address",
            "127.0.0.1:0",
        ]
        .iter()
        .map(|s| (*s).to_string())
        .collect();
        let mut principal_args = principal_args;
        if let Some(argo) = &self.argo {
            // The Redis proxy, in front of the hub's redis-server, for the hub's argocd-server.
            principal_args.extend([
                "--redis-server-address".to_owned(),
                argo.redis[0].clone(),
                "--redis-proxy-listen-address".to_owned(),
                "127.0.0.1:0".to_owned(),
            ]);
        }
        let (principal, addr) = ChildProc::start(
            "principal",
            &principal_args,
            &self.log("principal"),
            Some(("principal listening on ", START_TIMEOUT)),
        )
        .await?;
        self.children.push(principal);
        let addr = addr.context("the principal did not report its address")?;
        let port = addr.rsplit(':').next().context("principal address")?.to_string();
        println!("  principal listening on {addr} (mTLS, --auth mtls:subject:CN=([^,]+))");
        let proxy = live::proxy_addr(&self.log("principal"))?;
        // The managed agent's cluster secret, as the hub's Argo CD would use it (rewritten for
        // this run's proxy port when an earlier run left one).
        let verb =
            if secret_exists(&hub_c, &format!("cluster-{MANAGED_AGENT}")).await? { "reconfigure" } else { "create" };
        self.ctl(&["--principal-context", HUB, "agent", verb, MANAGED_AGENT, "--resource-proxy-server", &proxy])
            .await?;
        if self.argo.is_some() {
            // The hub's argocd-server shows the autonomous Application's resources through its
            // agent's cluster too.
            let verb = if secret_exists(&hub_c, &format!("cluster-{AUTONOMOUS_AGENT}")).await? {
                "reconfigure"
            } else {
                "create"
            };
            self.ctl(&["--principal-context", HUB, "agent", verb, AUTONOMOUS_AGENT, "--resource-proxy-server", &proxy])
                .await?;
        } else {
            // Argo CD deploys them from git with --argocd; the stand-in deploys nothing.
            live::demo_object(&managed_c).await?;
            live::demo_pod(&managed_c).await?;
        }
        let live_kubeconfig =
            live::kubeconfig(&hub_c, ARGOCD_NS, MANAGED_AGENT, &self.dir.join("live-agent-managed.kubeconfig")).await?;
        println!(
            "  resource proxy on {proxy}: the {MANAGED_AGENT} cluster secret (argocd-agentctl agent create) reaches it"
        );

        for (agent, mode, context) in
            [(MANAGED_AGENT, "managed", MANAGED), (AUTONOMOUS_AGENT, "autonomous", AUTONOMOUS)]
        {
            let mut agent_args: Vec<String> = [
                "agent",
                "--agent-mode",
                mode,
                "--server-address",
                "127.0.0.1",
                "--server-port",
                &port,
                "--namespace",
                ARGOCD_NS,
                "--kubeconfig",
                &kc,
                "--kubecontext",
                context,
                "--metrics-address",
                "127.0.0.1:0",
                "--healthz-address",
                "127.0.0.1:0",
            ]
            .iter()
            .map(|s| (*s).to_string())
            .collect();
            if let Some(argo) = &self.argo {
                // The spoke's Argo CD Redis, which the agent reads for the principal's Redis proxy.
                let redis = if mode == "managed" { &argo.redis[1] } else { &argo.redis[2] };
                agent_args.extend(["--redis-addr".to_owned(), redis.clone()]);
            }
            if mode == "managed" {
                // The demo execs into its Pod through the principal; terminals are off by default.
                agent_args.push("--enable-web-terminal".to_owned());
            }
            let (child, _) = ChildProc::start(
                &format!("{agent} agent"),
                &agent_args,
                &self.log(agent),
                Some(("agent ", START_TIMEOUT)),
            )
            .await?;
            self.children.push(child);
            println!("  agent {agent} ({mode}) started against the {context} cluster");
        }

        if self.argo.is_some() {
            self.start_argocd().await?;
        } else if !self.args.no_simulate_controller {
            let ar = app_resource();
            for (client, name) in [(&managed_c, MANAGED), (&autonomous_c, AUTONOMOUS)] {
                let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), ARGOCD_NS, &ar);
                self.tasks.push(tokio::spawn(controller::run(apps, name.to_string())));
            }
            println!(
                "  simulated application controller on both spokes (a stand-in for Argo CD; --no-simulate-controller turns it off)"
            );
        }

        let ar = app_resource();
        let hub_apps: Api<DynamicObject> = Api::namespaced_with(hub_c.clone(), MANAGED_AGENT, &ar);
        upsert_demo(
            &hub_apps,
            demo_app(
                "guestbook",
                MANAGED_AGENT,
                demo_source(self.argo.as_ref(), "guestbook"),
                demo_destination(Some(MANAGED_AGENT), "guestbook"),
                &self.run_id,
            )?,
        )
        .await?;
        let auto_apps: Api<DynamicObject> = Api::namespaced_with(autonomous_c.clone(), ARGOCD_NS, &ar);
        upsert_demo(
            &auto_apps,
            demo_app(
                "helm-guestbook",
                ARGOCD_NS,
                demo_source(self.argo.as_ref(), "helm-guestbook"),
                demo_destination(None, "helm-guestbook"),
                &self.run_id,
            )?,
        )
        .await?;
        println!(
            "  demo Applications: hub {MANAGED_AGENT}/guestbook (flows down), autonomous argocd/helm-guestbook (flows up)"
        );
        println!();
        println!(
            "Try: kubectl --kubeconfig {kc} --context hub apply -f <an Application in namespace {MANAGED_AGENT}, destination name {MANAGED_AGENT}>"
        );
        println!("     kubectl --kubeconfig {kc} --context managed get applications -n argocd --watch");
        let lk = live_kubeconfig.display();
        println!("Live resources (the hub's view of the managed spoke, through the principal's resource proxy):");
        println!("     kubectl --kubeconfig {lk} get configmap {} -n {} -o yaml", live::DEMO_NAME, live::DEMO_NS);
        println!("     kubectl --kubeconfig {lk} api-resources");
        println!("     kubectl --kubeconfig {lk} logs -f {} -n {}", live::DEMO_POD, live::DEMO_NS);
        println!(
            "     kubectl --kubeconfig {lk} exec -i {} -n {} -- sh -c 'echo hello from $HOSTNAME'",
            live::DEMO_POD,
            live::DEMO_NS
        );
        println!(
            "     kubectl --kubeconfig {lk} patch configmap {} -n {} --type merge -p '{{\"data\":{{\"message\":\"patched from the hub\"}}}}'",
            live::DEMO_NAME,
            live::DEMO_NS
        );
        if let Some(argo) = &self.argo {
            println!(
                "Argo CD's data: kubectl --kubeconfig {kc} --context managed get application guestbook -n argocd -o yaml"
            );
            if let Some(server) = &argo.server {
                let argocd = argo.scratch.tools().argocd("argocd");
                println!(
                    "The hub's Argo CD (argocd-server {server}, plaintext on loopback; the argocd CLI and the API, no web UI in a build from Argo CD's Go module):"
                );
                println!(
                    "     {} login {server} --plaintext --username admin --password {}",
                    argocd.display(),
                    argo.password
                );
                let argocd = argocd.display();
                println!("     {argocd} app list");
                println!("     {argocd} app get {MANAGED_AGENT}/guestbook");
                println!("     {argocd} app resources {AUTONOMOUS_AGENT}/helm-guestbook");
                println!("     {argocd} app manifests {MANAGED_AGENT}/guestbook --source live");
            }
        }
        println!("Logs: {}", self.dir.join("logs").display());
        println!();

        let clients = Clusters { hub: hub_c, managed: managed_c, autonomous: autonomous_c };
        if self.args.once {
            self.wait_converged(&clients).await?;
            live::read_through_proxy(&live_kubeconfig).await?;
            println!(
                "quickstart: {}/{} read from the managed spoke through the resource proxy",
                live::DEMO_NS,
                live::DEMO_NAME
            );
            let (line, echoed) = live::pod_through_proxy(&live_kubeconfig).await?;
            println!(
                "quickstart: pod {}/{} through the resource proxy: log {line:?}, exec {echoed:?}",
                live::DEMO_NS,
                live::DEMO_POD
            );
            self.argocd_cli_check().await
        } else {
            self.live_table(&clients).await
        }
    }

    fn check_children(&mut self) -> anyhow::Result<()> {
        for c in &mut self.children {
            c.ensure_running()?;
        }
        Ok(())
    }

    async fn snapshot(&self, c: &Clusters) -> anyhow::Result<Vec<table::Row>> {
        let ar = app_resource();
        let agent_of_hub = |ns: &str| match ns {
            MANAGED_AGENT => (MANAGED_AGENT.to_string(), "managed".to_string()),
            AUTONOMOUS_AGENT => (AUTONOMOUS_AGENT.to_string(), "autonomous".to_string()),
            _ => ("-".to_string(), "-".to_string()),
        };
        let mut rows = table::rows(HUB, &Api::all_with(c.hub.clone(), &ar), agent_of_hub).await?;
        rows.extend(
            table::rows(MANAGED, &Api::all_with(c.managed.clone(), &ar), |_| (MANAGED_AGENT.into(), "managed".into()))
                .await?,
        );
        rows.extend(
            table::rows(AUTONOMOUS, &Api::all_with(c.autonomous.clone(), &ar), |_| {
                (AUTONOMOUS_AGENT.into(), "autonomous".into())
            })
            .await?,
        );
        Ok(rows)
    }

    /// Whether each demo app is on the other side (with Synced/Healthy status when the simulated
    /// controller runs). Returns what is still missing.
    ///
    /// With `--argocd`, both demo Applications must be Synced/Healthy at the demo repository's
    /// commit, on their spoke and on the hub: only the real controller syncs that commit.
    fn missing(&self, rows: &[table::Row]) -> Vec<String> {
        let want_status = !self.args.no_simulate_controller;
        let commit = self.argo.as_ref().map(|a| a.commit.as_str());
        let has = |cluster: &str, app: &str| {
            rows.iter().any(|r| {
                r.cluster == cluster
                    && r.application == app
                    && (!want_status || (r.sync == "Synced" && r.health == "Healthy"))
                    && commit.is_none_or(|c| r.revision == c)
            })
        };
        let mut missing = Vec::new();
        if !has(MANAGED, "argocd/guestbook") {
            missing.push("guestbook on the managed spoke".to_string());
        }
        if !has(HUB, &format!("{MANAGED_AGENT}/guestbook")) {
            missing.push("guestbook's status back on the hub".to_string());
        }
        if commit.is_some() && !has(AUTONOMOUS, "argocd/helm-guestbook") {
            missing.push("helm-guestbook synced by the autonomous spoke's Argo CD".to_string());
        }
        if !has(HUB, &format!("{AUTONOMOUS_AGENT}/helm-guestbook")) {
            missing.push("helm-guestbook (autonomous) on the hub".to_string());
        }
        missing
    }

    async fn wait_converged(&mut self, c: &Clusters) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(self.args.timeout);
        loop {
            self.check_children()?;
            let rows = self.snapshot(c).await.unwrap_or_default();
            let missing = self.missing(&rows);
            if missing.is_empty() {
                println!("{}", table::render(&rows));
                let what = if self.argo.is_some() {
                    " with status: both synced by the real Argo CD at the demo repository's commit"
                } else if self.args.no_simulate_controller {
                    ""
                } else {
                    " with status"
                };
                println!("\nquickstart: every demo Application reached the other side{what}");
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                println!("{}", table::render(&rows));
                anyhow::bail!(
                    "quickstart --once: after {}s still missing: {}. Logs: {}",
                    self.args.timeout,
                    missing.join("; "),
                    self.dir.join("logs").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn live_table(&mut self, c: &Clusters) -> anyhow::Result<()> {
        use std::io::IsTerminal as _;
        let tty = std::io::stdout().is_terminal();
        let mut shown = String::new();
        let stop = crate::runtime::signals::wait();
        tokio::pin!(stop);
        loop {
            self.check_children()?;
            if let Ok(rows) = self.snapshot(c).await {
                let text = table::render(&rows);
                if text != shown {
                    if tty {
                        print!("\x1b[2J\x1b[H");
                    }
                    println!(
                        "argocd-agent quickstart (Ctrl-C stops every process)   kubeconfig: {}\n",
                        self.kubeconfig().display()
                    );
                    println!("{text}\n");
                    shown = text;
                }
            }
            tokio::select! {
                () = &mut stop => return Ok(()),
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

struct Clusters {
    hub: kube::Client,
    managed: kube::Client,
    autonomous: kube::Client,
}

async fn ensure_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    if api.get_opt(name).await?.is_none() {
        let ns = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        api.create(&PostParams::default(), &ns).await.with_context(|| format!("cannot create namespace {name}"))?;
    }
    Ok(())
}

/// Create a demo Application, or stamp this run and the source on the one an earlier run left
/// (an earlier run's repository had another port, or was not there at all).
async fn upsert_demo(api: &Api<DynamicObject>, obj: DynamicObject) -> anyhow::Result<()> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    if api.get_opt(&name).await?.is_none() {
        api.create(&PostParams::default(), &obj).await.with_context(|| format!("cannot create Application {name}"))?;
    } else {
        let patch = json!({"metadata": {"annotations": obj.metadata.annotations}, "spec": {"source": obj.data["spec"]["source"]}});
        api.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
            .with_context(|| format!("cannot update Application {name}"))?;
    }
    Ok(())
}

async fn secret_exists(client: &kube::Client, name: &str) -> anyhow::Result<bool> {
    let api: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ARGOCD_NS);
    Ok(api.get_opt(name).await.with_context(|| format!("cannot read secret {ARGOCD_NS}/{name}"))?.is_some())
}
