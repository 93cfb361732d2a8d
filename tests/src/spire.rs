//! [`Spire`]: a real SPIRE Server and SPIRE Agent (v1.13, built by `scripts/install-test-deps`)
//! on loopback, for the `spire` tests.
//!
//! - The server listens on a free `127.0.0.1` port (SPIRE reads `bind_port = 0` as its default
//!   8081, so the port is picked here and the start retried if another process takes it), its
//!   API on a Unix socket in a private temp dir; sqlite datastore and in-memory keys in that dir.
//! - The agent attests with a join token, trusts the server through `bundle show` (no insecure
//!   bootstrap), serves the Workload API and Envoy's SDS on a Unix socket in the same dir, and
//!   syncs with the server every second so that entry changes and rotations reach workloads
//!   quickly.
//! - Workloads are told apart by the unix attestor's `unix:path` selector (the agent runs with
//!   `discover_workload_path`): every test process runs as the same uid, so each workload runs
//!   from its own hard link of the binary ([`Spire::workload_binary`]); `/proc/<pid>/exe` names
//!   the link it was started from. Hashing (`unix:sha256`) is off: the debug binaries are large.
//! - Entries are created with an ID chosen by the caller, and every change waits until the agent
//!   has it in its cache (its debug log), so a workload started afterwards gets its SVID at once.
//!
//! Both processes log JSON to stdout; both stop when the [`Spire`] is dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;
use tempfile::TempDir;

use crate::bin_path::venv_tool;
use crate::process::ChildProcess;
use crate::wait::wait_for;

/// How long SPIRE may take to start, or to push a change to its agent, on a busy machine.
const START: Duration = Duration::from_secs(60);

/// How often the agent syncs with the server (SPIRE's default is 5 s).
const AGENT_SYNC_INTERVAL: &str = "1s";

/// What a SPIRE deployment is started with.
#[derive(Debug, Clone)]
pub struct SpireOptions {
    /// The trust domain, e.g. `cluster.local`.
    pub trust_domain: String,
    /// `default_x509_svid_ttl` of the server (entries may set their own).
    pub x509_svid_ttl: Duration,
    /// `default_jwt_svid_ttl` of the server (entries may set their own).
    pub jwt_svid_ttl: Duration,
}

impl SpireOptions {
    /// Options for `trust_domain` with SPIRE's default SVID lifetimes (1 h X.509, 5 min JWT).
    #[must_use]
    pub fn new(trust_domain: &str) -> Self {
        Self {
            trust_domain: trust_domain.to_string(),
            x509_svid_ttl: Duration::from_secs(3600),
            jwt_svid_ttl: Duration::from_secs(300),
        }
    }
}

/// A registration entry (`spire-server entry create`).
#[derive(Debug, Clone, Default)]
pub struct Entry {
    /// The entry ID (`-entryID`): chosen by the test, so it can wait for, update and delete it.
    pub id: String,
    /// The workload's SPIFFE ID.
    pub spiffe_id: String,
    /// Selectors, e.g. `unix:path:/tmp/.../argocd-agent-principal`.
    pub selectors: Vec<String>,
    /// `-x509SVIDTTL` (`None`: the server's default).
    pub x509_svid_ttl: Option<Duration>,
    /// `-jwtSVIDTTL` (`None`: the server's default).
    pub jwt_svid_ttl: Option<Duration>,
    /// Trust domains whose bundles the workload also gets (`-federatesWith spiffe://<td>`).
    pub federates_with: Vec<String>,
}

impl Entry {
    /// An entry for the process started from `binary` (selector `unix:path:<binary>`).
    #[must_use]
    pub fn for_binary(id: &str, spiffe_id: &str, binary: &Path) -> Self {
        Self {
            id: id.to_string(),
            spiffe_id: spiffe_id.to_string(),
            selectors: vec![format!("unix:path:{}", binary.display())],
            ..Self::default()
        }
    }

    fn args(&self, parent_id: &str) -> Vec<String> {
        let mut args = vec![
            "-entryID".to_string(),
            self.id.clone(),
            "-parentID".to_string(),
            parent_id.to_string(),
            "-spiffeID".to_string(),
            self.spiffe_id.clone(),
        ];
        for selector in &self.selectors {
            args.extend(["-selector".to_string(), selector.clone()]);
        }
        if let Some(ttl) = self.x509_svid_ttl {
            args.extend(["-x509SVIDTTL".to_string(), ttl.as_secs().to_string()]);
        }
        if let Some(ttl) = self.jwt_svid_ttl {
            args.extend(["-jwtSVIDTTL".to_string(), ttl.as_secs().to_string()]);
        }
        for td in &self.federates_with {
            args.extend(["-federatesWith".to_string(), format!("spiffe://{td}")]);
        }
        args
    }
}

/// Which kind of local authority (`spire-server localauthority x509|jwt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// The X.509 CA that signs X.509-SVIDs (its ID is the CA's subject key ID, hex).
    X509,
    /// The key that signs JWT-SVIDs (its ID is the `kid`).
    Jwt,
}

impl Authority {
    fn as_str(self) -> &'static str {
        match self {
            Self::X509 => "x509",
            Self::Jwt => "jwt",
        }
    }
}

/// The state of one kind of local authority (`localauthority <kind> show`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthorityState {
    /// The authority signing now.
    pub active: Option<String>,
    /// The next one, already in the bundle.
    pub prepared: Option<String>,
    /// The previous one, still in the bundle until revoked.
    pub old: Option<String>,
}

/// A running SPIRE Server and SPIRE Agent of one trust domain. Dropping it stops both.
pub struct Spire {
    // Dropped first: the processes stop before their directory is removed.
    agent: ChildProcess,
    server: ChildProcess,
    options: SpireOptions,
    server_bin: PathBuf,
    server_socket: PathBuf,
    server_addr: std::net::SocketAddr,
    agent_socket: PathBuf,
    parent_id: String,
    dir: TempDir,
}

impl std::fmt::Debug for Spire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spire")
            .field("trust_domain", &self.options.trust_domain)
            .field("server", &self.server_addr)
            .field("agent_socket", &self.agent_socket)
            .finish_non_exhaustive()
    }
}

impl Spire {
    /// Start the server, wait until it is healthy, attest an agent with a join token, and wait
    /// until the agent is healthy. Blocks while it polls: from async tests, use a multi-thread
    /// runtime and `tokio::task::block_in_place`.
    ///
    /// # Errors
    /// The binaries are missing (run `scripts/install-test-deps`), or a process exits or is not
    /// healthy within a minute (its log tail is in the error).
    pub fn start(options: SpireOptions) -> anyhow::Result<Self> {
        let server_bin = venv_tool("spire-server").context("the SPIRE tests need the real SPIRE Server")?;
        let agent_bin = venv_tool("spire-agent").context("the SPIRE tests need the real SPIRE Agent")?;
        let dir = tempfile::Builder::new().prefix("spire-").tempdir()?;
        let td = options.trust_domain.clone();
        let server_socket = dir.path().join("server.sock");
        let agent_socket = dir.path().join("agent.sock");

        let (mut server, server_addr) = start_server(&server_bin, &options, dir.path(), &server_socket)?;
        wait_for(START, &format!("spire-server ({td}) to be healthy"), || {
            server.ensure_running()?;
            Ok(run(&server_bin, &["healthcheck", "-socketPath"], &server_socket, &[]).ok())
        })
        .with_context(|| server.log_tail(30))?;

        let bundle = dir.path().join("bootstrap-bundle.pem");
        std::fs::write(&bundle, run(&server_bin, &["bundle", "show", "-socketPath"], &server_socket, &[])?)?;
        let token: Value = serde_json::from_str(&run(
            &server_bin,
            &["token", "generate", "-socketPath"],
            &server_socket,
            &["-ttl", "600", "-output", "json"],
        )?)?;
        let token = token["value"].as_str().context("no token in `spire-server token generate`")?.to_string();
        let parent_id = format!("spiffe://{td}/spire/agent/join_token/{token}");

        std::fs::create_dir_all(dir.path().join("agent-data"))?;
        let agent_conf = dir.path().join("agent.conf");
        std::fs::write(&agent_conf, agent_config(&td, dir.path(), server_addr, &agent_socket, &bundle))?;
        let mut cmd = Command::new(&agent_bin);
        cmd.arg("run").arg("-config").arg(&agent_conf).arg("-joinToken").arg(&token);
        let mut agent = ChildProcess::spawn(&format!("spire-agent-{td}"), cmd)?;
        wait_for(START, &format!("spire-agent ({td}) to be healthy"), || {
            agent.ensure_running()?;
            server.ensure_running()?;
            Ok(run(&agent_bin, &["healthcheck", "-socketPath"], &agent_socket, &[]).ok())
        })?;
        Ok(Self { agent, server, options, server_bin, server_socket, server_addr, agent_socket, parent_id, dir })
    }

    /// The trust domain.
    #[must_use]
    pub fn trust_domain(&self) -> &str {
        &self.options.trust_domain
    }

    /// The agent's Workload API (and SDS) endpoint, `unix:<path>`.
    #[must_use]
    pub fn endpoint(&self) -> String {
        format!("unix:{}", self.agent_socket.display())
    }

    /// Path of the agent's Workload API (and SDS) socket.
    #[must_use]
    pub fn socket_path(&self) -> &Path {
        &self.agent_socket
    }

    /// The agent's SPIFFE ID: the parent of every workload entry.
    #[must_use]
    pub fn parent_id(&self) -> &str {
        &self.parent_id
    }

    /// The SPIRE Server process (logs).
    #[must_use]
    pub fn server(&self) -> &ChildProcess {
        &self.server
    }

    /// The SPIRE Agent process (logs).
    #[must_use]
    pub fn agent(&self) -> &ChildProcess {
        &self.agent
    }

    /// A hard link (a copy if linking fails) of `binary` named `name` in this deployment's
    /// directory: a workload started from it is selected by `unix:path:<returned path>`.
    ///
    /// # Errors
    /// Neither linking nor copying worked.
    pub fn workload_binary(&self, binary: &Path, name: &str) -> anyhow::Result<PathBuf> {
        let bin_dir = self.dir.path().join("bin");
        std::fs::create_dir_all(&bin_dir)?;
        let path = bin_dir.join(name);
        if std::fs::hard_link(binary, &path).is_err() {
            std::fs::copy(binary, &path)
                .with_context(|| format!("cannot link or copy {} to {}", binary.display(), path.display()))?;
        }
        Ok(path)
    }

    /// Run `spire-server <args> -socketPath <server socket> <rest>`; its stdout.
    ///
    /// # Errors
    /// The command fails (its output is in the error).
    pub fn server_cli(&self, args: &[&str], rest: &[&str]) -> anyhow::Result<String> {
        let mut with_flag: Vec<&str> = args.to_vec();
        with_flag.push("-socketPath");
        run(&self.server_bin, &with_flag, &self.server_socket, rest)
    }

    /// Create `entry` under this agent and wait until the agent has it.
    ///
    /// # Errors
    /// The server refuses it, or the agent does not see it within a minute.
    pub fn create_entry(&self, entry: &Entry) -> anyhow::Result<()> {
        let args = entry.args(&self.parent_id);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.server_cli(&["entry", "create"], &args)?;
        self.wait_agent_entry_log("Entry created", &entry.id, 1)
    }

    /// Replace `entry` (same ID) and wait until the agent has the new version.
    ///
    /// # Errors
    /// The server refuses it, or the agent does not see it within a minute.
    pub fn update_entry(&self, entry: &Entry) -> anyhow::Result<()> {
        let before = self.agent_entry_log_count("Entry updated", &entry.id);
        let args = entry.args(&self.parent_id);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.server_cli(&["entry", "update"], &args)?;
        self.wait_agent_entry_log("Entry updated", &entry.id, before + 1)
    }

    /// Delete the entry `id` and wait until the agent has dropped it.
    ///
    /// # Errors
    /// The server refuses, or the agent still has it after a minute.
    pub fn delete_entry(&self, id: &str) -> anyhow::Result<()> {
        self.server_cli(&["entry", "delete"], &["-entryID", id])?;
        self.wait_agent_entry_log("Entry removed", id, 1)
    }

    /// This trust domain's X.509 bundle (PEM), as `spire-server bundle show` prints it.
    ///
    /// # Errors
    /// The command fails.
    pub fn bundle_pem(&self) -> anyhow::Result<String> {
        self.server_cli(&["bundle", "show"], &[])
    }

    /// Trust `trust_domain`'s X.509 bundle (PEM) as a federated bundle (`bundle set`); entries
    /// that federate with it then carry it to their workloads.
    ///
    /// # Errors
    /// The command fails.
    pub fn set_federated_bundle(&self, trust_domain: &str, pem: &str) -> anyhow::Result<()> {
        let path = self.dir.path().join(format!("federated-{trust_domain}.pem"));
        std::fs::write(&path, pem)?;
        let id = format!("spiffe://{trust_domain}");
        let path = path.display().to_string();
        self.server_cli(&["bundle", "set"], &["-id", &id, "-path", &path])?;
        Ok(())
    }

    /// The active, prepared and old local authorities of `kind`.
    ///
    /// # Errors
    /// The command fails or its output has no active authority.
    pub fn authorities(&self, kind: Authority) -> anyhow::Result<AuthorityState> {
        let out = self.server_cli(&["localauthority", kind.as_str(), "show"], &["-output", "json"])?;
        let json: Value = serde_json::from_str(&out).with_context(|| format!("localauthority show: {out}"))?;
        let id = |slot: &str| json[slot]["authority_id"].as_str().filter(|s| !s.is_empty()).map(str::to_string);
        let state = AuthorityState { active: id("active"), prepared: id("prepared"), old: id("old") };
        if state.active.is_none() {
            bail!("no active {} authority: {out}", kind.as_str());
        }
        Ok(state)
    }

    /// `localauthority <kind> prepare`: a new authority, published in the bundle, not yet
    /// signing. Returns its ID.
    ///
    /// # Errors
    /// The server refuses.
    pub fn prepare_authority(&self, kind: Authority) -> anyhow::Result<String> {
        self.server_cli(&["localauthority", kind.as_str(), "prepare"], &[])?;
        self.authorities(kind)?.prepared.context("no prepared authority after `prepare`")
    }

    /// `localauthority <kind> <action> -authorityID <id>` with `action` one of `activate` (the
    /// prepared one signs from now on), `taint` (agents replace what the old one signed) and
    /// `revoke` (the tainted old one leaves the bundle).
    ///
    /// # Errors
    /// The server refuses.
    pub fn authority_action(&self, kind: Authority, action: &str, id: &str) -> anyhow::Result<()> {
        self.server_cli(&["localauthority", kind.as_str(), action], &["-authorityID", id])?;
        Ok(())
    }

    /// How many times the agent logged `msg` for entry `id`.
    #[must_use]
    pub fn agent_entry_log_count(&self, msg: &str, id: &str) -> usize {
        log_records(&self.agent.stdout()).iter().filter(|r| r["msg"] == msg && r["entry"] == id).count()
    }

    /// How many records of the agent's log have `msg` and the field `key` equal to `value`
    /// (e.g. `"Renewing X509-SVID"`, `spiffe_id`, an agent's ID).
    #[must_use]
    pub fn agent_log_count(&self, msg: &str, key: &str, value: &str) -> usize {
        log_records(&self.agent.stdout()).iter().filter(|r| r["msg"] == msg && r[key] == value).count()
    }

    /// When the last X.509-SVID the server signed for entry `id` expires (`None`: none signed).
    #[must_use]
    pub fn last_x509_svid_expiry(&self, id: &str) -> Option<chrono::DateTime<chrono::Utc>> {
        log_records(&self.server.stdout())
            .iter()
            .filter(|r| r["msg"] == "Signed X509 SVID" && r["entry_id"] == id)
            .filter_map(|r| r["expiration"].as_str().and_then(|t| t.parse().ok()))
            .max()
    }

    fn wait_agent_entry_log(&self, msg: &str, id: &str, count: usize) -> anyhow::Result<()> {
        let what = format!("spire-agent ({}) to log {msg:?} for entry {id}", self.trust_domain());
        wait_for(START, &what, || Ok((self.agent_entry_log_count(msg, id) >= count).then_some(())))
            .with_context(|| self.agent.log_tail(30))
    }
}

/// Start `spire-server run` on a free loopback port and wait until it listens there. SPIRE takes
/// `bind_port = 0` for "unset" (its default, 8081), so the port is picked here; if another
/// process takes it first, the server exits and is started again on a new one.
fn start_server(
    bin: &Path,
    options: &SpireOptions,
    dir: &Path,
    socket: &Path,
) -> anyhow::Result<(ChildProcess, std::net::SocketAddr)> {
    let td = &options.trust_domain;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let conf = dir.join("server.conf");
        std::fs::write(&conf, server_config(options, dir, port, socket))?;
        let mut cmd = Command::new(bin);
        cmd.arg("run").arg("-config").arg(&conf);
        let mut server = ChildProcess::spawn(&format!("spire-server-{td}"), cmd)?;
        let listening = wait_for(START, &format!("spire-server ({td}) to listen on port {port}"), || {
            if server.try_wait()?.is_some() {
                return Ok(Some(None));
            }
            let up = log_records(&server.stdout())
                .iter()
                .filter(|r| r["msg"] == "Starting Server APIs" && r["network"] == "tcp")
                .find_map(|r| r["address"].as_str().and_then(|a| a.parse::<std::net::SocketAddr>().ok()));
            Ok(up.map(Some))
        })
        .with_context(|| server.log_tail(30))?;
        match listening {
            Some(addr) if addr.port() == port => return Ok((server, addr)),
            Some(addr) => bail!("spire-server listens on {addr}, not on the configured port {port}"),
            None if attempts < 3 && server.stdout().contains("address already in use") => {}
            None => bail!("spire-server ({td}) exited at startup\n{}", server.log_tail(30)),
        }
    }
}

/// Every JSON record of a SPIRE log (`log_format = "json"`), skipping anything else.
fn log_records(log: &str) -> Vec<Value> {
    log.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).collect()
}

/// Run `bin <args> <socket> <rest>` and return stdout, or fail with its output.
fn run(bin: &Path, args: &[&str], socket: &Path, rest: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(bin)
        .args(args)
        .arg(socket)
        .args(rest)
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} {} {} {} failed ({}): {}{}",
            bin.display(),
            args.join(" "),
            socket.display(),
            rest.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn hcl_duration(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

fn server_config(options: &SpireOptions, dir: &Path, port: u16, socket: &Path) -> String {
    format!(
        r#"server {{
    bind_address = "127.0.0.1"
    bind_port = "{port}"
    socket_path = "{socket}"
    trust_domain = "{td}"
    data_dir = "{dir}"
    log_level = "DEBUG"
    log_format = "json"
    default_x509_svid_ttl = "{x509}"
    default_jwt_svid_ttl = "{jwt}"
}}

plugins {{
    DataStore "sql" {{
        plugin_data {{
            database_type = "sqlite3"
            connection_string = "{dir}/datastore.sqlite3"
        }}
    }}
    NodeAttestor "join_token" {{
        plugin_data {{}}
    }}
    KeyManager "memory" {{
        plugin_data {{}}
    }}
}}
"#,
        socket = socket.display(),
        td = options.trust_domain,
        port = port,
        dir = dir.display(),
        x509 = hcl_duration(options.x509_svid_ttl),
        jwt = hcl_duration(options.jwt_svid_ttl),
    )
}

fn agent_config(td: &str, dir: &Path, server: std::net::SocketAddr, socket: &Path, bundle: &Path) -> String {
    format!(
        r#"agent {{
    data_dir = "{dir}/agent-data"
    log_level = "DEBUG"
    log_format = "json"
    server_address = "{ip}"
    server_port = "{port}"
    socket_path = "{socket}"
    trust_bundle_path = "{bundle}"
    trust_domain = "{td}"
    experimental {{
        sync_interval = "{AGENT_SYNC_INTERVAL}"
    }}
}}

plugins {{
    NodeAttestor "join_token" {{
        plugin_data {{}}
    }}
    KeyManager "memory" {{
        plugin_data {{}}
    }}
    WorkloadAttestor "unix" {{
        plugin_data {{
            discover_workload_path = true
            workload_size_limit = -1
        }}
    }}
}}
"#,
        dir = dir.display(),
        ip = server.ip(),
        port = server.port(),
        socket = socket.display(),
        bundle = bundle.display(),
    )
}
