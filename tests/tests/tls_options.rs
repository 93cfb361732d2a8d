//! Upstream's TLS knobs (`--tls-min-version`, `--tls-max-version`, `--tls-ciphersuites`) on the
//! spawned principal and agent: what the principal's listener accepts is checked with OpenSSL as
//! a foreign client, and an agent restricted the same way syncs while one that insists on
//! another version cannot connect.

use std::net::SocketAddr;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, ensure};
use kube::api::PostParams;
use tests::apps::{apps, converge, path_is};
use tests::topology::{ARGOCD_NS, Mode, StartOptions, Topology};

const SUITE: &str = "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384";

/// An OpenSSL handshake with the principal (no client certificate: the principal's TLS lets such
/// clients reach its auth layer); `Ok(output)` if it completed.
fn s_client(addr: SocketAddr, args: &[&str]) -> Result<std::result::Result<String, String>> {
    // Bounded: a session the server keeps open (see `-ign_eof` below) must not hang the test.
    let out = Command::new("timeout")
        .args(["20", "openssl", "s_client", "-connect", &addr.to_string(), "-servername", "localhost", "-alpn", "h2"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("openssl s_client")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok(if out.status.success() { Ok(text) } else { Err(text) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_versions_and_cipher_suites_are_enforced_as_configured() -> Result<()> {
    let agent = "mt1";
    let principal_args = ["--tls-min-version", "tls1.2", "--tls-max-version", "tls1.2", "--tls-ciphersuites", SUITE];
    let options = StartOptions {
        start_agents: false,
        principal_args: principal_args.iter().map(|s| (*s).to_owned()).collect(),
        ..StartOptions::default()
    };
    let mut t = Topology::start_with_options(&[(agent, Mode::Managed)], options).await?;
    let addr = t.principal_addr().context("principal address")?;

    let tls13 = s_client(addr, &["-tls1_3"])?;
    ensure!(tls13.is_err(), "TLS 1.3 must be refused above --tls-max-version tls1.2: {tls13:?}");
    let other = s_client(addr, &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"])?;
    ensure!(other.is_err(), "a suite not in --tls-ciphersuites must be refused: {other:?}");
    let good = s_client(addr, &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"])?;
    let text = good.map_err(|e| anyhow::anyhow!("the configured version and suite must be accepted: {e}"))?;
    ensure!(text.contains("ECDHE-ECDSA-AES256-GCM-SHA384"), "negotiated another suite: {text}");

    // An agent that insists on TLS 1.3 cannot reach this principal...
    t.set_agent_args(&["--tls-min-version", "tls1.3"]);
    t.start_agent(agent).await?;
    tests::wait_until_async(std::time::Duration::from_secs(30), "the refused handshake", || async {
        !t.principal_log_lines("TLS handshake failed").is_empty()
    })
    .await
    .with_context(|| t.logs())?;
    ensure!(!t.principal_log_lines("agent connected").iter().any(|l| l.contains(agent)), "{}", t.logs());
    t.kill_agent(agent)?;

    // ...one restricted as the principal is syncs.
    t.set_agent_args(&["--tls-max-version", "tls1.2", "--tls-ciphersuites", SUITE]);
    t.start_agent(agent).await?;
    let hub = apps(&t.hub(), agent);
    let spoke = apps(&t.spoke(agent)?, ARGOCD_NS);
    hub.create(&PostParams::default(), &tests::fixtures::app_with_path("tls", agent, "v1")?).await?;
    converge(&t, &spoke, "tls", "an Application over TLS 1.2 with the one suite allowed", path_is("v1")).await?;
    Ok(())
}

#[test]
fn cipher_suite_list_prints_gos_names_and_unknown_ones_are_refused_by_name() -> Result<()> {
    let bin = tests::bin_path::workspace_binary("argocd-agent")?;
    for role in ["principal", "agent"] {
        let out = Command::new(&bin).args([role, "--tls-ciphersuites", "list"]).output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && text.contains(SUITE) && text.contains("TLS_AES_128_GCM_SHA256"),
            "{role}: {text}"
        );
    }
    let out = Command::new(&bin)
        .args(["principal", "--namespace", "argocd", "--auth", "mtls:subject:CN=([^,]+)"])
        .args(["--tls-ciphersuites", "TLS_RSA_WITH_RC4_128_SHA"])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("TLS_RSA_WITH_RC4_128_SHA") && err.contains("--tls-ciphersuites"),
        "{err}"
    );
    Ok(())
}

/// `--require-client-certs`: a client without a certificate is refused at the handshake (without
/// the flag it reaches the auth layer, as the test above shows). `--client-cert-subject-match`:
/// with agents identified by their SPIFFE URI SAN (`mtls:uri:`), an agent whose certificate's CN
/// names someone else is refused on the stream, one whose CN is its name syncs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_and_their_subject_matched_when_configured() -> Result<()> {
    let (good, odd) = ("cm1", "cm2");
    let options = StartOptions {
        start_agents: false,
        auth: Some("mtls:uri:^spiffe://cluster.local/ns/argocd/sa/([a-z0-9-]+)$".to_owned()),
        principal_args: ["--require-client-certs", "--client-cert-subject-match"].map(String::from).to_vec(),
        ..StartOptions::default()
    };
    let mut t = Topology::start_with_options(&[(good, Mode::Managed), (odd, Mode::Managed)], options).await?;
    let addr = t.principal_addr().context("principal address")?;
    // TLS 1.3 reports the refused client certificate after the handshake's last flight: OpenSSL
    // sees the alert when it reads, so look for it rather than for a failed exit, and keep
    // reading after stdin's end (`-ign_eof`) until the server closes, or s_client may quit
    // before the alert arrives.
    let bare = s_client(addr, &["-tls1_3", "-ign_eof"])?;
    let text = match &bare {
        Ok(t) | Err(t) => t,
    };
    ensure!(
        text.contains("certificate required"),
        "a client without a certificate must be refused at the handshake: {text}"
    );

    // cm2's certificate names it in its URI SAN (so mtls:uri: identifies it as cm2), but its CN
    // is someone else's.
    let (cert, key, ca) =
        t.issue_client_cert("intruder", &[&format!("spiffe://cluster.local/ns/argocd/sa/{odd}")]).await?;
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::namespaced(t.spoke(odd)?, ARGOCD_NS);
    let secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "argocd-agent-client-tls"}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": cert, "tls.key": key, "ca.crt": ca}}))?;
    secrets.replace("argocd-agent-client-tls", &PostParams::default(), &secret).await?;
    t.start_agent(good).await?;
    t.start_agent(odd).await?;

    let hub = apps(&t.hub(), good);
    let spoke = apps(&t.spoke(good)?, ARGOCD_NS);
    hub.create(&PostParams::default(), &tests::fixtures::app_with_path("matched", good, "v1")?).await?;
    converge(&t, &spoke, "matched", "an Application to the agent whose CN is its name", path_is("v1")).await?;
    tests::wait_until_async(std::time::Duration::from_secs(30), "cm2 refused for its CN", || async {
        t.principal_log_lines("is not agent").iter().any(|l| l.contains("intruder"))
            || t.any_log_contains("\"intruder\" is not agent")
    })
    .await
    .with_context(|| t.logs())?;
    ensure!(t.principal_connects(odd) == 0, "cm2 must never hold a stream:\n{}", t.logs());
    Ok(())
}
