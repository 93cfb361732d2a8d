//! `argocd-agentctl`: administration of principals and agents (pki, jwt).
fn main() -> std::process::ExitCode {
    cli::ctl::main()
}
