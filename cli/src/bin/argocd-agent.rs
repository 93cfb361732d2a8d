//! `argocd-agent`: principal, agent, embedded API server and quickstart in one binary.
fn main() -> std::process::ExitCode {
    cli::main()
}
