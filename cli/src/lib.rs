//! Command-line front ends. Only this crate parses flags.
#![forbid(unsafe_code)]

mod agent_cmd;
mod agent_creds;
mod apiserver_cmd;
pub mod ctl;
mod flags;
mod material;
mod principal_cmd;
mod quickstart;
mod redis_proxy;
mod runtime;
mod spire;
mod tls;
mod unsupported;
mod upstream_only;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// The argocd-agent binary.
#[derive(Debug, Parser)]
#[command(name = "argocd-agent", version, about = "Argo CD Agent (Rust, mesh-native): principal, agent and tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the principal (hub side).
    Principal(Box<principal_cmd::Args>),
    /// Run an agent (spoke side).
    Agent(Box<agent_cmd::Args>),
    /// Run an embedded Kubernetes-compatible API server on loopback.
    Apiserver(apiserver_cmd::Args),
    /// A hub and two workload clusters on this machine: API servers, PKI, principal, agents
    /// and demo Applications, with a live table.
    Quickstart(quickstart::Args),
}

/// Entry point of `argocd-agent`.
#[must_use]
pub fn main() -> ExitCode {
    let matches = flags::upstream_style(Cli::command()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = match cli.command {
        Command::Principal(args) => principal_cmd::run(*args),
        Command::Agent(args) => agent_cmd::run(*args),
        Command::Apiserver(args) => apiserver_cmd::run(args),
        Command::Quickstart(args) => quickstart::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("argocd-agent: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
