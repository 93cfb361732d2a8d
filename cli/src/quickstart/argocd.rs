//! `quickstart --argocd`: the real Argo CD components in place of the stand-in controller.
//!
//! On each spoke Argo CD's application controller and repo-server with a `redis-server` (which
//! the agent reads for the principal's Redis proxy); on the hub argocd-server and a repo-server,
//! whose Redis is the principal's Redis proxy in front of the hub's `redis-server`. The demo
//! Applications' source is a git repository the quickstart writes into its directory from
//! [`MANAGED_FILES`] and [`AUTONOMOUS_FILES`] and serves with `git daemon` on loopback (there
//! is no internet here). Every listener is on 127.0.0.1 but the controllers' metrics, which Argo
//! CD binds on every address (free ports).
//!
//! The Argo CD binaries are those `scripts/install-test-deps` builds (Argo CD [`ARGOCD_VERSION`]
//! from `tests/tools/argocd/go.mod`, one `argocd` binary that runs the component its name
//! says), found as [`Tools::find`] says.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::children::{ChildProc, log_tail};

/// The Argo CD release `scripts/install-test-deps` builds and the quickstart is tested with.
pub(super) const ARGOCD_VERSION: &str = "v3.5.1";

/// The names the one `argocd` binary answers to.
const ARGOCD_NAMES: [&str; 4] = ["argocd", "argocd-server", "argocd-application-controller", "argocd-repo-server"];

/// How long an Argo CD component or Redis may take to listen on two busy cores.
const START: Duration = Duration::from_secs(90);

/// The managed demo (`guestbook`, deployed into namespace `guestbook` of the managed spoke): a
/// ConfigMap, a Service and a Pod the managed spoke's simulated node runs (so `kubectl logs`
/// and `exec` through the principal have something to talk to). There is no Deployment: the
/// embedded API server serves no `apps` group (and has no controller that would make Pods).
/// `restartPolicy` is spelled out: the embedded API server does not default it, and Argo CD
/// calls a running Pod without one `Unknown`.
pub(super) const MANAGED_FILES: &[(&str, &str)] = &[
    (
        "guestbook/configmap.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: guestbook-ui\ndata:\n  message: read through the principal's resource proxy\n",
    ),
    (
        "guestbook/service.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: guestbook-ui\nspec:\n  type: ClusterIP\n  selector:\n    app: guestbook-ui\n  ports:\n  - port: 80\n    targetPort: 80\n",
    ),
    (
        "guestbook/pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: guestbook-ui-0\n  labels:\n    app: guestbook-ui\nspec:\n  restartPolicy: Always\n  containers:\n  - name: guestbook-ui\n    image: guestbook-ui:simulated\n    command: [sh, -c, 'i=0; while true; do echo \"guestbook-ui: served request $i\"; i=$((i+1)); sleep 1; done']\n",
    ),
];

/// The autonomous demo (`helm-guestbook`, a plain directory despite its name, deployed into
/// namespace `helm-guestbook` of the autonomous spoke): a ConfigMap and a Service (that spoke
/// runs no simulated node, so a Pod there would stay Pending).
pub(super) const AUTONOMOUS_FILES: &[(&str, &str)] = &[
    (
        "helm-guestbook/configmap.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: helm-guestbook\ndata:\n  message: deployed by the autonomous spoke's own Argo CD\n",
    ),
    (
        "helm-guestbook/service.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: helm-guestbook\nspec:\n  type: ClusterIP\n  selector:\n    app: helm-guestbook\n  ports:\n  - port: 80\n    targetPort: 80\n",
    ),
];

/// The spokes' `argocd-cm`: the controllers watch only the kinds the demo deploys, which keeps
/// their cluster caches small on two busy cores.
pub(super) fn spoke_settings() -> Value {
    json!({"resource.inclusions": "- apiGroups: [\"\"]\n  kinds: [ConfigMap, Service, Pod]\n  clusters: [\"*\"]\n"})
}

/// Our stand-in for the `git-verify-wrapper.sh` Argo CD's images ship (`hack/`): the repo-server
/// runs it for every revision it renders. The demo's commits are unsigned and GnuPG is off.
const GIT_VERIFY_WRAPPER: &str = "#!/bin/sh\n# Argo CD's repo-server asks for the signature of revision $1: the quickstart's commits are unsigned.\ntest -n \"$1\" || { echo 'usage: git-verify-wrapper.sh REVISION' >&2; exit 1; }\nexit 0\n";

/// Where the quickstart found what `--argocd` runs.
#[derive(Debug, Clone)]
pub(super) struct Tools {
    /// The directory holding all four Argo CD names.
    pub bin_dir: PathBuf,
    redis_server: PathBuf,
    git: PathBuf,
}

fn executable(path: &Path) -> bool {
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn path_dirs() -> Vec<PathBuf> {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default()
}

fn on_path(name: &str) -> Option<PathBuf> {
    path_dirs().into_iter().map(|d| d.join(name)).find(|p| executable(p))
}

/// `.venv/bin` of the workspace this binary was built in (`<workspace>/target/<profile>/argocd-agent`).
fn workspace_venv() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors().skip(1).map(|a| a.join(".venv").join("bin")).find(|d| d.is_dir())
}

impl Tools {
    /// The first directory on `PATH` that holds all four Argo CD names, else the `.venv/bin` of
    /// the workspace the running `argocd-agent` was built in (where `scripts/install-test-deps`
    /// puts them); `redis-server` and `git` from `PATH`.
    ///
    /// # Errors
    /// One is missing: the message names it and `scripts/install-test-deps`.
    pub fn find() -> anyhow::Result<Self> {
        let venv = workspace_venv();
        let mut dirs = path_dirs();
        dirs.extend(venv.clone());
        let bin_dir = dirs.into_iter().find(|d| ARGOCD_NAMES.iter().all(|n| executable(&d.join(n))));
        let Some(bin_dir) = bin_dir else {
            let looked = venv.as_ref().map_or_else(
                || "on PATH (and there is no .venv/bin next to this argocd-agent's workspace)".to_owned(),
                |v| format!("on PATH nor in {}", v.display()),
            );
            let missing: Vec<&str> = ARGOCD_NAMES
                .iter()
                .copied()
                .filter(|n| venv.as_ref().is_none_or(|v| !executable(&v.join(n))))
                .collect();
            bail!(
                "quickstart --argocd needs Argo CD {ARGOCD_VERSION}'s binaries, and `{}` is not {looked}: run \
                 scripts/install-test-deps in the argocd-agent repository (it builds argocd and links it as \
                 argocd-server, argocd-application-controller and argocd-repo-server in .venv/bin), or put \
                 all four on PATH",
                missing.first().copied().unwrap_or("argocd")
            );
        };
        let redis_server = on_path("redis-server").context(
            "quickstart --argocd needs `redis-server` on PATH (Debian package redis-server; \
             scripts/install-test-deps installs it)",
        )?;
        let git = on_path("git").context(
            "quickstart --argocd needs `git` on PATH (Debian package git; scripts/install-test-deps installs it)",
        )?;
        Ok(Self { bin_dir, redis_server, git })
    }

    /// The Argo CD component `name`.
    pub fn argocd(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    /// `argocd version --client --short`, e.g. `argocd: v3.5.1+unknown`.
    pub async fn version(&self) -> anyhow::Result<String> {
        let out = tokio::process::Command::new(self.argocd("argocd"))
            .args(["version", "--client", "--short"])
            .output()
            .await
            .with_context(|| format!("cannot run {}", self.argocd("argocd").display()))?;
        ensure!(out.status.success(), "argocd version: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// `argocd account bcrypt`: the hash `argocd-secret` holds for `password`.
    pub async fn bcrypt(&self, password: &str) -> anyhow::Result<String> {
        let out = tokio::process::Command::new(self.argocd("argocd"))
            .args(["account", "bcrypt", "--password", password])
            .output()
            .await
            .context("argocd account bcrypt")?;
        ensure!(out.status.success(), "argocd account bcrypt: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// `argocd ARGS --config <dir>/argocd-cli.config`, requiring success; its stdout.
    pub async fn cli(&self, dir: &Path, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = tokio::process::Command::new(self.argocd("argocd"));
        cmd.args(args).arg("--config").arg(dir.join("argocd-cli.config")).kill_on_drop(true);
        let out = tokio::time::timeout(START, cmd.output())
            .await
            .with_context(|| format!("argocd {} did not end within {START:?}", args.join(" ")))?
            .context("cannot run argocd")?;
        ensure!(
            out.status.success(),
            "argocd {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// A port free on 127.0.0.1 now.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0").context("no free loopback port")?.local_addr()?.port())
}

/// One process of the Argo CD side, described for [`start_listening`].
struct Spec {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, OsString)>,
}

/// Starts the process `make(port)` describes and waits until it accepts connections on
/// 127.0.0.1:`port`; another free port when it exits first (a port taken between picking and
/// binding), three tries.
async fn start_listening(
    name: &str,
    log: &Path,
    mut make: impl FnMut(u16) -> anyhow::Result<Spec>,
) -> anyhow::Result<(ChildProc, u16)> {
    let mut last = None;
    for _ in 0..3 {
        let port = free_port()?;
        let spec = make(port)?;
        let mut child = ChildProc::start_program(name, &spec.program, &spec.args, &spec.env, log)?;
        let deadline = tokio::time::Instant::now() + START;
        loop {
            if !child.is_running() {
                last = Some(anyhow::anyhow!(
                    "the {name} exited before listening on 127.0.0.1:{port}; its log {}:\n{}",
                    log.display(),
                    log_tail(log, 15)
                ));
                break;
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return Ok((child, port));
            }
            if tokio::time::Instant::now() > deadline {
                child.stop(Duration::from_secs(5)).await;
                bail!(
                    "the {name} did not listen on 127.0.0.1:{port} within {START:?}; its log {}:\n{}",
                    log.display(),
                    log_tail(log, 15)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("the {name} did not start")))
}

/// The Argo CD side's working area under the quickstart's directory: a `bin/` with
/// `git-verify-wrapper.sh` first on the components' `PATH`, a `HOME` and `TMPDIR` per component.
pub(super) struct Scratch {
    dir: PathBuf,
    logs: PathBuf,
    tools: Tools,
}

impl Scratch {
    /// Creates `dir` (and its `bin/`).
    pub fn new(dir: PathBuf, logs: PathBuf, tools: Tools) -> anyhow::Result<Self> {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).with_context(|| format!("cannot create {}", bin.display()))?;
        let wrapper = bin.join("git-verify-wrapper.sh");
        std::fs::write(&wrapper, GIT_VERIFY_WRAPPER)?;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        Ok(Self { dir, logs, tools })
    }

    pub fn tools(&self) -> &Tools {
        &self.tools
    }

    fn log(&self, label: &str) -> PathBuf {
        self.logs.join(format!("{label}.log"))
    }

    /// The environment of Argo CD component `label`: its own `HOME` and `TMPDIR`, our `bin/`
    /// first on `PATH`, GnuPG off, git without the system's configuration.
    fn env(&self, label: &str) -> anyhow::Result<Vec<(String, OsString)>> {
        let home = self.dir.join(label);
        let tmp = home.join("tmp");
        std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let mut paths = vec![self.dir.join("bin")];
        paths.extend(path_dirs());
        Ok(vec![
            ("PATH".into(), std::env::join_paths(paths)?),
            ("HOME".into(), home.into_os_string()),
            ("TMPDIR".into(), tmp.into_os_string()),
            ("ARGOCD_GPG_ENABLED".into(), "false".into()),
            ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
        ])
    }

    /// Argo CD's in-cluster cluster for a component outside any Pod: `ARGOCD_FAKE_IN_CLUSTER`
    /// with `KUBECONFIG` (its current context), and `--kubeconfig` for its own clients.
    fn in_cluster(env: &mut Vec<(String, OsString)>, args: &mut Vec<String>, kubeconfig: &Path) {
        env.push(("ARGOCD_FAKE_IN_CLUSTER".into(), "true".into()));
        env.push(("KUBECONFIG".into(), kubeconfig.as_os_str().to_owned()));
        args.extend(["--kubeconfig".to_owned(), kubeconfig.display().to_string()]);
    }

    /// A `redis-server` for cluster `label` on a free loopback port, saving nothing; its address.
    pub async fn redis(&self, label: &str) -> anyhow::Result<(ChildProc, String)> {
        let name = format!("redis-{label}");
        let work = self.dir.join(&name);
        std::fs::create_dir_all(&work)?;
        let (child, port) = start_listening(&format!("{label} redis-server"), &self.log(&name), |port| {
            Ok(Spec {
                program: self.tools.redis_server.clone(),
                args: ["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .chain(["--dir".to_owned(), work.display().to_string()])
                    .collect(),
                env: Vec::new(),
            })
        })
        .await?;
        Ok((child, format!("127.0.0.1:{port}")))
    }

    /// `argocd-repo-server` for cluster `label`, plaintext on loopback, caching in `redis`.
    pub async fn repo_server(&self, label: &str, redis: &str) -> anyhow::Result<(ChildProc, String)> {
        let name = format!("argocd-repo-server-{label}");
        let (child, port) = start_listening(&format!("{label} argocd-repo-server"), &self.log(&name), |port| {
            let mut args: Vec<String> = ["--address", "127.0.0.1", "--port", &port.to_string(), "--disable-tls"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
            args.extend(["--client-ca-path".into(), String::new()]);
            args.extend(["--metrics-address".into(), "127.0.0.1".into(), "--metrics-port".into()]);
            args.push(free_port()?.to_string());
            args.extend(["--redis".into(), redis.to_owned(), "--loglevel".into(), "info".into()]);
            Ok(Spec { program: self.tools.argocd("argocd-repo-server"), args, env: self.env(&name)? })
        })
        .await?;
        Ok((child, format!("127.0.0.1:{port}")))
    }

    /// `argocd-application-controller` for the cluster of `kubeconfig`, namespace `argocd`.
    pub fn application_controller(
        &self,
        label: &str,
        kubeconfig: &Path,
        redis: &str,
        repo_server: &str,
    ) -> anyhow::Result<ChildProc> {
        let name = format!("argocd-application-controller-{label}");
        let mut env = self.env(&name)?;
        let mut args = Vec::new();
        Self::in_cluster(&mut env, &mut args, kubeconfig);
        args.extend(
            [
                "--namespace",
                super::ARGOCD_NS,
                "--redis",
                redis,
                "--repo-server",
                repo_server,
                "--repo-server-plaintext",
                "--status-processors",
                "2",
                "--operation-processors",
                "2",
                "--loglevel",
                "info",
            ]
            .iter()
            .map(|s| (*s).to_owned()),
        );
        // It binds its metrics on every address and has no flag for the address: a free port.
        args.extend(["--metrics-port".to_owned(), free_port()?.to_string()]);
        ChildProc::start_program(
            &format!("{label} argocd-application-controller"),
            &self.tools.argocd("argocd-application-controller"),
            &args,
            &env,
            &self.log(&name),
        )
    }

    /// `argocd-server` on the hub of `kubeconfig`, plaintext (`--insecure`) on loopback, for the
    /// Applications of `namespaces`, with `redis` (the principal's Redis proxy); its address.
    pub async fn server(
        &self,
        kubeconfig: &Path,
        redis: &str,
        repo_server: &str,
        namespaces: &[&str],
    ) -> anyhow::Result<(ChildProc, String)> {
        let name = "argocd-server-hub";
        let (child, port) = start_listening("hub argocd-server", &self.log(name), |port| {
            let mut env = self.env(name)?;
            let mut args = Vec::new();
            Self::in_cluster(&mut env, &mut args, kubeconfig);
            args.extend(
                [
                    "--namespace",
                    super::ARGOCD_NS,
                    "--insecure",
                    "--address",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                    "--metrics-address",
                    "127.0.0.1",
                    "--redis",
                    redis,
                    "--repo-server",
                    repo_server,
                    "--repo-server-plaintext",
                    "--application-namespaces",
                    &namespaces.join(","),
                    "--loglevel",
                    "info",
                ]
                .iter()
                .map(|s| (*s).to_owned()),
            );
            args.extend(["--metrics-port".to_owned(), free_port()?.to_string()]);
            Ok(Spec { program: self.tools.argocd("argocd-server"), args, env })
        })
        .await?;
        Ok((child, format!("127.0.0.1:{port}")))
    }

    /// A git repository (`<dir>/git/repo.git`, recreated each run) whose one commit on `main`
    /// holds `files`, served read-only by `git daemon` on loopback: the daemon, the repository's
    /// URL and the commit.
    pub async fn git_repository(&self, files: &[(&str, &str)]) -> anyhow::Result<(ChildProc, String, String)> {
        let root = self.dir.join("git");
        let _ = std::fs::remove_dir_all(&root);
        let (srv, work, home) = (root.join("srv"), root.join("work"), root.join("home"));
        for d in [&srv, &work, &home] {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        for (path, content) in files {
            let path = work.join(path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, content)?;
        }
        let git = |dir: &Path, args: &[&str]| -> anyhow::Result<String> {
            let out = std::process::Command::new(&self.tools.git)
                .current_dir(dir)
                .env("HOME", &home)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .args(["-c", "user.name=argocd-agent quickstart", "-c", "user.email=quickstart@example.invalid"])
                .args(["-c", "init.defaultBranch=main"])
                .args(args)
                .output()
                .context("cannot run git")?;
            ensure!(out.status.success(), "git {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        };
        git(&srv, &["init", "-q", "--bare", "repo.git"])?;
        git(&work, &["init", "-q"])?;
        git(&work, &["add", "-A"])?;
        git(&work, &["commit", "-q", "-m", "argocd-agent quickstart demo"])?;
        git(&work, &["push", "-q", &srv.join("repo.git").display().to_string(), "HEAD:refs/heads/main"])?;
        let commit = git(&work, &["rev-parse", "HEAD"])?;
        let srv_arg = srv.display().to_string();
        // `git daemon` runs git-daemon as a child it does not stop when it is sent SIGTERM: run
        // that one itself, so that stopping it stops the daemon.
        let exec_path = PathBuf::from(git(&work, &["--exec-path"])?);
        let daemon_bin = exec_path.join("git-daemon");
        ensure!(executable(&daemon_bin), "git has no git-daemon at {} (Debian package git)", daemon_bin.display());
        let (daemon, port) = start_listening("git daemon", &self.log("git-daemon"), |port| {
            Ok(Spec {
                program: daemon_bin.clone(),
                args: vec![
                    "--reuseaddr".into(),
                    "--listen=127.0.0.1".into(),
                    "--export-all".into(),
                    "--informative-errors".into(),
                    format!("--port={port}"),
                    format!("--base-path={srv_arg}"),
                    srv_arg.clone(),
                ],
                env: vec![("HOME".into(), home.clone().into_os_string())],
            })
        })
        .await?;
        Ok((daemon, format!("git://127.0.0.1:{port}/repo.git"), commit))
    }
}

/// What every Argo CD settings object carries: Argo CD's settings manager watches only objects
/// labelled `app.kubernetes.io/part-of: argocd`.
fn part_of_argocd() -> Value {
    json!({"app.kubernetes.io/part-of": "argocd"})
}

/// Writes (or overwrites) `argocd-cm` with `cm_data` and `argocd-secret` (a `server.secretkey`
/// kept across runs, and the admin password's bcrypt hash when given) into namespace `argocd`.
pub(super) async fn install_settings(
    client: &kube::Client,
    cm_data: &Value,
    admin_password_bcrypt: Option<&str>,
) -> anyhow::Result<()> {
    let ns = super::ARGOCD_NS;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "argocd-cm", "namespace": ns, "labels": part_of_argocd()}, "data": cm_data});
    upsert(&cms, "argocd-cm", cm).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let mut data = serde_json::Map::new();
    let existing = secrets.get_opt("argocd-secret").await.context("cannot read argocd-secret")?;
    if existing.as_ref().and_then(|s| s.data.as_ref()).is_none_or(|d| !d.contains_key("server.secretkey")) {
        let key: [u8; 32] = rand::random();
        data.insert("server.secretkey".into(), json!(ByteString(hex::encode(key).into_bytes())));
    }
    if let Some(hash) = admin_password_bcrypt {
        data.insert("admin.password".into(), json!(ByteString(hash.as_bytes().to_vec())));
        let mtime = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        data.insert("admin.passwordMtime".into(), json!(ByteString(mtime.into_bytes())));
    }
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "argocd-secret", "namespace": ns, "labels": part_of_argocd()}, "data": data});
    upsert(&secrets, "argocd-secret", secret).await
}

/// Creates `obj`, or merges it into the one that exists.
async fn upsert<K>(api: &Api<K>, name: &str, obj: Value) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    if api.get_opt(name).await.with_context(|| format!("cannot read {name}"))?.is_none() {
        let obj: K = serde_json::from_value(obj).with_context(|| format!("{name} is not valid"))?;
        api.create(&PostParams::default(), &obj).await.with_context(|| format!("cannot create {name}"))?;
    } else {
        api.patch(name, &PatchParams::default(), &Patch::Merge(&obj))
            .await
            .with_context(|| format!("cannot update {name}"))?;
    }
    Ok(())
}

/// The `default` AppProject in namespace `argocd` (created when missing), allowing any source and
/// destination, and Applications in `source_namespaces` (the hub's agent namespaces).
pub(super) async fn default_project(client: &kube::Client, source_namespaces: &[&str]) -> anyhow::Result<()> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AppProject"),
        "appprojects",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), super::ARGOCD_NS, &ar);
    let mut spec = json!({"sourceRepos": ["*"], "destinations": [{"name": "*", "server": "*", "namespace": "*"}],
        "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]});
    if !source_namespaces.is_empty() {
        spec["sourceNamespaces"] = json!(source_namespaces);
    }
    let project = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "default", "namespace": super::ARGOCD_NS}, "spec": spec});
    if api.get_opt("default").await.context("cannot read AppProject default")?.is_none() {
        api.create(&PostParams::default(), &serde_json::from_value(project)?)
            .await
            .context("cannot create AppProject default")?;
    }
    Ok(())
}

/// A random admin password for the hub's argocd-server (printed for the user).
pub(super) fn admin_password() -> String {
    let bytes: [u8; 9] = rand::random();
    format!("quickstart-{}", hex::encode(bytes))
}

impl super::Quickstart {
    /// Before the principal and the agents start (they need the Redis addresses): the demo
    /// repository and its daemon, a redis-server per cluster, Argo CD's settings and projects,
    /// and the demo namespaces (the demo has no `CreateNamespace`: the spokes' controllers
    /// watch only ConfigMaps, Services and Pods).
    pub(super) async fn prepare_argocd(
        &mut self,
        tools: Tools,
        hub: &kube::Client,
        managed: &kube::Client,
        autonomous: &kube::Client,
    ) -> anyhow::Result<()> {
        let scratch = Scratch::new(self.dir.join("argocd"), self.dir.join("logs"), tools)?;
        let files: Vec<(&str, &str)> = MANAGED_FILES.iter().chain(AUTONOMOUS_FILES).copied().collect();
        let (daemon, repo_url, commit) = scratch.git_repository(&files).await?;
        self.children.push(daemon);
        let mut redis = Vec::new();
        for label in [super::HUB, super::MANAGED, super::AUTONOMOUS] {
            let (child, addr) = scratch.redis(label).await?;
            self.children.push(child);
            redis.push(addr);
        }
        let redis: [String; 3] = redis.try_into().map_err(|_| anyhow::anyhow!("three Redis addresses"))?;
        println!("  demo repository {repo_url} (commit {}), served by git daemon", &commit[..7]);
        println!("  redis-server for the hub, the managed and the autonomous spoke: {}", redis.join(", "));

        let password = admin_password();
        let hash = scratch.tools().bcrypt(&password).await?;
        install_settings(hub, &json!({}), Some(&hash)).await?;
        install_settings(managed, &spoke_settings(), None).await?;
        install_settings(autonomous, &spoke_settings(), None).await?;
        // The hub's project lets Applications live in the agents' namespaces; the principal
        // sends it to the managed agent. The autonomous spoke has its own.
        default_project(hub, &[super::MANAGED_AGENT, super::AUTONOMOUS_AGENT]).await?;
        default_project(autonomous, &[]).await?;
        super::ensure_namespace(managed, "guestbook").await?;
        super::ensure_namespace(autonomous, "helm-guestbook").await?;
        self.argo = Some(super::RealArgoCd { scratch, repo_url, commit, redis, server: None, password });
        Ok(())
    }

    /// Once the agents run: per spoke a repo-server and the application controller; on the hub
    /// a repo-server and argocd-server behind the principal's Redis proxy.
    pub(super) async fn start_argocd(&mut self) -> anyhow::Result<()> {
        let proxy = self.redis_proxy_addr().await?;
        let argo = self.argo.take().context("--argocd set up")?;
        let result = self.start_argocd_with(&argo, &proxy).await;
        let server = result?;
        self.argo = Some(super::RealArgoCd { server: Some(server), ..argo });
        Ok(())
    }

    async fn start_argocd_with(&mut self, argo: &super::RealArgoCd, redis_proxy: &str) -> anyhow::Result<String> {
        let scratch = &argo.scratch;
        for (label, redis) in [(super::MANAGED, &argo.redis[1]), (super::AUTONOMOUS, &argo.redis[2])] {
            let (repo, repo_addr) = scratch.repo_server(label, redis).await?;
            self.children.push(repo);
            let kubeconfig = self.dir.join(label).join("kubeconfig");
            self.children.push(scratch.application_controller(label, &kubeconfig, redis, &repo_addr)?);
        }
        println!(
            "  Argo CD on both spokes: argocd-application-controller, argocd-repo-server (logs/argocd-*-{{managed,autonomous}}.log)"
        );
        let (repo, repo_addr) = scratch.repo_server(super::HUB, &argo.redis[0]).await?;
        self.children.push(repo);
        let (server, addr) = scratch
            .server(
                &self.dir.join(super::HUB).join("kubeconfig"),
                redis_proxy,
                &repo_addr,
                &[super::MANAGED_AGENT, super::AUTONOMOUS_AGENT],
            )
            .await?;
        self.children.push(server);
        println!(
            "  Argo CD on the hub: argocd-server on {addr} (its Redis: the principal's Redis proxy {redis_proxy})"
        );
        Ok(addr)
    }

    /// Where the principal's Redis proxy listens (its stdout line, in its log).
    async fn redis_proxy_addr(&mut self) -> anyhow::Result<String> {
        let log = self.log("principal");
        let deadline = tokio::time::Instant::now() + START;
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(addr) = text.lines().filter_map(|l| l.strip_prefix("redis proxy listening on ")).next_back() {
                return Ok(addr.trim().to_owned());
            }
            self.check_children()?;
            ensure!(
                tokio::time::Instant::now() < deadline,
                "the principal did not report its Redis proxy within {START:?}; its log {}:\n{}",
                log.display(),
                log_tail(&log, 15)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `--once --argocd`: the argocd CLI logs in to the hub's argocd-server and lists both
    /// demo Applications as the hub's Argo CD shows them.
    pub(super) async fn argocd_cli_check(&self) -> anyhow::Result<()> {
        let Some(argo) = &self.argo else { return Ok(()) };
        let Some(server) = &argo.server else { return Ok(()) };
        let tools = argo.scratch.tools();
        let dir = argo.scratch.dir.as_path();
        tools.cli(dir, &["login", server, "--plaintext", "--username", "admin", "--password", &argo.password]).await?;
        let list = tools.cli(dir, &["app", "list"]).await?;
        for app in
            [format!("{}/guestbook", super::MANAGED_AGENT), format!("{}/helm-guestbook", super::AUTONOMOUS_AGENT)]
        {
            ensure!(
                list.lines().any(|l| l.contains(&app) && l.contains("Synced") && l.contains("Healthy")),
                "argocd app list on the hub does not show {app} Synced/Healthy:\n{list}"
            );
        }
        println!("quickstart: argocd app list on the hub's argocd-server:\n{}", list.trim_end());
        Ok(())
    }
}
