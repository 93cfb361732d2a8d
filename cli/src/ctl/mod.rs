//! `argocd-agentctl`: administration of principals and agents, with upstream's command and flag
//! names (`cmd/ctl` of argocd-agent).
//!
//! Implemented: `pki init|issue principal|issue resource-proxy|issue agent|propagate|inspect|dump|delete`,
//! `jwt create-key|inspect-key|delete-key`, `agent create|list|inspect|print-tls|reconfigure`,
//! `blocklist tls add|remove|list`, `validate principal|agent`, `ha status|promote|demote` and `version`. Additions over
//! upstream: `--kubeconfig`, `--out-dir` (PEM files beside the secrets), the SPIFFE URI SAN of
//! `pki issue agent`, more checks in `validate`, `blocklist agent add|remove|list`, `blocklist
//! list` and `--reason` (see docs/operations/agentctl.md and docs/operations/blocklist.md). Not
//! implemented: `config`.

mod agent;
mod blocklist;
pub(crate) mod certs;
pub(crate) mod cluster;
mod ha;
mod inspect;
mod jwt;
mod keys;
pub(crate) mod kube;
mod names;
mod out;
mod pki;
mod validate;
mod x509;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Upstream's default for `--principal-namespace` and `--agent-namespace`.
pub const DEFAULT_NAMESPACE: &str = "argocd";

/// The argocd-agentctl binary.
#[derive(Debug, Parser)]
#[command(
    name = "argocd-agentctl",
    version,
    about = "Inspect and manipulate argocd-agent configuration",
    long_about = "A CLI to manage configuration for argocd-agent: certificates (pki), JWT signing keys (jwt) and \
                  agents (agent), stored as Kubernetes secrets in the principal's and the agents' clusters, and to \
                  validate an installation (validate).\n\nThe PKI it creates is for development and testing; do not \
                  use it in production."
)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalFlags,
    #[command(subcommand)]
    command: Command,
}

/// Flags every command takes (upstream's persistent flags, plus `--kubeconfig`).
#[derive(Debug, Clone, clap::Args)]
pub struct GlobalFlags {
    /// Kubeconfig file to use (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The Kubernetes context of the principal (default: the current context).
    #[arg(long, global = true, env = "ARGOCD_AGENT_PRINCIPAL_CONTEXT", value_name = "CONTEXT")]
    principal_context: Option<String>,
    /// The Kubernetes namespace the principal is installed in.
    #[arg(long, global = true, env = "ARGOCD_AGENT_PRINCIPAL_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    principal_namespace: String,
    /// The Kubernetes context of the agent (default: the current context).
    #[arg(long, global = true, env = "ARGOCD_AGENT_AGENT_CONTEXT", value_name = "CONTEXT")]
    agent_context: Option<String>,
    /// The Kubernetes namespace the agent is installed in.
    #[arg(long, global = true, env = "ARGOCD_AGENT_AGENT_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    agent_namespace: String,
}

impl GlobalFlags {
    /// `--principal-context`, with an empty value meaning "not set" as in upstream.
    fn principal_context(&self) -> Option<&str> {
        self.principal_context.as_deref().filter(|c| !c.is_empty())
    }

    /// `--agent-context`, with an empty value meaning "not set".
    fn agent_context(&self) -> Option<&str> {
        self.agent_context.as_deref().filter(|c| !c.is_empty())
    }

    /// Whether agent and principal resolve to the same kube context (upstream's rule: equal, or no
    /// agent context given, which means the current one).
    fn same_context(&self) -> bool {
        self.agent_context().is_none() || self.principal_context() == self.agent_context()
    }

    /// Secrets in the principal's namespace and cluster.
    async fn principal_secrets(&self) -> anyhow::Result<kube::Secrets> {
        let client = kube::client(self.kubeconfig.as_deref(), self.principal_context()).await?;
        Ok(kube::Secrets::new(client, &self.principal_namespace))
    }

    /// Secrets in the agent's namespace and cluster.
    async fn agent_secrets(&self) -> anyhow::Result<kube::Secrets> {
        let client = kube::client(self.kubeconfig.as_deref(), self.agent_context()).await?;
        Ok(kube::Secrets::new(client, &self.agent_namespace))
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// !!NON-PROD!! Inspect and manage the principal's PKI.
    #[command(subcommand)]
    Pki(pki::PkiCommand),
    /// Inspect and manage JWT signing keys.
    #[command(subcommand)]
    Jwt(jwt::JwtCommand),
    /// Inspect and manage agent configuration (Argo CD cluster secrets on the principal).
    #[command(subcommand, visible_alias = "agents")]
    Agent(agent::AgentCommand),
    /// Manage blocklists: agents the principal refuses (ConfigMap argocd-agent-tls-blocklist).
    #[command(subcommand)]
    Blocklist(blocklist::BlocklistCommand),
    /// Validate principal and agent installations.
    #[command(subcommand, visible_alias = "check-config")]
    Validate(validate::ValidateCommand),
    /// Manage HA state of the principal server.
    Ha(ha::HaArgs),
    /// Display the version of argocd-agentctl.
    Version(VersionArgs),
}

/// `version` flags.
#[derive(Debug, clap::Args)]
pub struct VersionArgs {
    /// Display indented JSON.
    #[arg(short, long)]
    indent: bool,
}

/// Upstream's version JSON (`internal/version`): name, component, version, git revision and status.
fn version(args: &VersionArgs) -> anyhow::Result<()> {
    let info = serde_json::json!({
        "name": "argocd-agent",
        "component": "ctl",
        "version": env!("CARGO_PKG_VERSION"),
        "gitRevision": option_env!("ARGOCD_AGENT_GIT_REVISION").unwrap_or("unknown"),
        "gitStatus": option_env!("ARGOCD_AGENT_GIT_STATUS").unwrap_or("unknown"),
    });
    let text = if args.indent { serde_json::to_string_pretty(&info)? } else { serde_json::to_string(&info)? };
    println!("{text}");
    Ok(())
}

/// Run the parsed command.
async fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Pki(cmd) => pki::run(&cli.global, cmd).await,
        Command::Jwt(cmd) => jwt::run(&cli.global, cmd).await,
        Command::Agent(cmd) => agent::run(&cli.global, cmd).await,
        Command::Blocklist(cmd) => blocklist::run(&cli.global, cmd).await,
        Command::Validate(cmd) => validate::run(&cli.global, cmd).await,
        Command::Ha(args) => ha::run(&cli.global, args).await,
        Command::Version(args) => version(&args),
    }
}

/// Entry point of `argocd-agentctl`.
#[must_use]
pub fn main() -> ExitCode {
    let matches = crate::flags::upstream_style(Cli::command()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("argocd-agentctl: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(dispatch(cli));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("argocd-agentctl: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Run `argocd-agentctl` in-process with `args` (the first is the program name), as the
/// quickstart does. Must not be called from inside an async runtime (it starts its own).
///
/// # Errors
/// The arguments do not parse or the command fails.
pub fn run_from<I, T>(args: I) -> anyhow::Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = crate::flags::upstream_style(Cli::command()).try_get_matches_from(args)?;
    let cli = Cli::from_arg_matches(&matches)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(dispatch(cli))
}

/// Ask a question on the terminal and return the trimmed answer.
fn ask(question: &str) -> anyhow::Result<String> {
    use std::io::Write as _;
    print!("{question} ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    Ok(answer.trim().to_owned())
}
