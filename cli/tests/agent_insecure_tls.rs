//! `--insecure-tls` (upstream's "do not verify the principal's certificate") is refused by the
//! agent, as a flag and as upstream's environment variable `ARGOCD_AGENT_TLS_INSECURE`
//! (docs/security.md, docs/configuration.md): it exits non-zero, naming the flag and what to pass
//! instead, without dialling anything.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the agent may take to refuse (it never dials: nothing listens at the kubeconfig's
/// server, and the refusal comes before any TLS handshake).
const DEADLINE: Duration = Duration::from_secs(60);

/// A kubeconfig that parses and names a server nobody talks to: the agent builds its client
/// (no request) before it looks at the TLS flags.
fn kubeconfig(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let text = "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: { server: \"https://127.0.0.1:1\", insecure-skip-tls-verify: true }
users:
- name: u
  user: { token: not-a-token }
contexts:
- name: c
  context: { cluster: c, user: u, namespace: argocd }
current-context: c
";
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    path
}

/// Run the agent to the end (killed at [`DEADLINE`]): (exited successfully, stderr).
fn run_agent(extra: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_argocd-agent"));
    cmd.args(["agent", "--server-address", "127.0.0.1", "--server-port", "1", "--agent-mode", "managed"])
        .args(["--metrics-port", "0", "--healthz-port", "0"])
        .arg("--kubeconfig")
        .arg(kubeconfig(dir.path()))
        .args(extra)
        .env_remove("SPIFFE_ENDPOINT_SOCKET")
        .env_remove("ARGOCD_AGENT_TLS_INSECURE")
        .env_remove("ARGOCD_AGENT_INSECURE_PLAINTEXT")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run argocd-agent: {e}"));
    let mut stderr = child.stderr.take().unwrap_or_else(|| panic!("no stderr pipe"));
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() < DEADLINE => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let err = reader.join().unwrap_or_default();
    let status =
        status.unwrap_or_else(|| panic!("argocd-agent {extra:?} {env:?} still ran after {DEADLINE:?}:\n{err}"));
    (status.success(), err)
}

fn assert_refused(ok: bool, err: &str) {
    assert!(!ok, "argocd-agent accepted --insecure-tls:\n{err}");
    assert!(
        err.contains("--insecure-tls is not supported") && err.contains("--root-ca-path"),
        "the error does not name --insecure-tls and what to pass instead:\n{err}"
    );
}

#[test]
fn insecure_tls_flag_is_refused_by_name() {
    let (ok, err) = run_agent(&["--insecure-tls"], &[]);
    assert_refused(ok, &err);
}

#[test]
fn insecure_tls_env_var_is_refused_by_name() {
    let (ok, err) = run_agent(&[], &[("ARGOCD_AGENT_TLS_INSECURE", "true")]);
    assert_refused(ok, &err);
}

/// Not only on the TLS path: with plaintext (behind a sidecar) or SPIFFE credentials the flag
/// would otherwise be ignored silently, and an operator would believe it took effect.
#[test]
fn insecure_tls_is_refused_with_plaintext_and_spiffe_credentials_too() {
    for extra in [&["--insecure-tls", "--insecure-plaintext"][..], &["--insecure-tls", "--creds", "spiffe:x509"][..]] {
        let (ok, err) = run_agent(extra, &[]);
        assert_refused(ok, &err);
    }
}

/// The control: the same command without the flag gets past the TLS flags (and fails later,
/// for another reason: there is no CA to read).
#[test]
fn without_insecure_tls_the_refusal_is_not_given() {
    let (ok, err) = run_agent(&[], &[]);
    assert!(!ok, "argocd-agent started with no CA and no principal:\n{err}");
    assert!(!err.contains("--insecure-tls"), "{err}");
}
