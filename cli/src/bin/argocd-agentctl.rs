//! `argocd-agentctl`: administration of principals and agents.
fn main() {
    eprintln!("argocd-agentctl: no commands yet");
    std::process::exit(2);
}
