//! `--auth spiffe:x509`, `--auth spiffe:jwt` and the Envoy SDS sidecars against a real SPIRE
//! (v1.13, `tests::spire`): SPIRE Server and Agent on loopback, the principal and an agent as
//! spawned binaries on embedded API servers, each workload told apart by the unix attestor's
//! `unix:path` selector and given short-lived SVIDs. What `spiffe_e2e.rs` shows against the fake
//! Workload API, here with SPIRE doing the issuing, rotating, deleting and federating:
//!
//! - X.509-SVIDs rotate (~10 s after each issue) and the X.509 CA is rotated by hand (prepare,
//!   activate, taint, revoke) under a live stream, which stays up; a new handshake after the old
//!   CA left the bundle succeeds, so it used the new SVID;
//! - an agent whose entry is deleted keeps its live stream (SPIRE revokes nothing, TLS does not
//!   re-authenticate) until it reconnects after its last SVID expired: refused; a new agent
//!   process gets no SVID and stops; an agent with an SVID of another trust domain is refused by
//!   the TLS layer, and, once the trust domains federate, by the SPIFFE policy;
//! - JWT-SVIDs with a 10 s lifetime are refreshed, and the JWT signing key is rotated and the old
//!   one revoked under a live stream;
//! - Envoy with `envoy/principal-sidecar-sds.yaml` (and the agent's sidecar, `agent-sidecar.yaml`
//!   in its SDS variant) takes SVIDs and bundle from SPIRE Agent's SDS, rotates them without
//!   dropping the stream, and forwards the agent's identity to `--auth xfcc:`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tests::apiserver::ApiServerProcess;
use tests::fixtures::application_resource;
use tests::process::ChildProcess;
use tests::spire::{Authority, Entry, Spire, SpireOptions};
use tests::topology::ARGOCD_NS;
use tests::{wait_for_async, wait_until_async, workspace_binary};

const TD: &str = "cluster.local";
const FOREIGN_TD: &str = "other.example";
const PRINCIPAL_ID: &str = "spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal";
const AUDIENCE: &str = "argocd-agent-principal";
/// Lifetime of the X.509-SVIDs. SPIRE backdates `notBefore` by 10 s and its agent renews at half
/// the certificate's lifetime, so a workload gets a new SVID ~10 s after each issue (the agent
/// syncs every second, see `tests::spire`).
const X509_TTL: Duration = Duration::from_secs(30);
/// Lifetime of the JWT-SVIDs (the agent refreshes at half of it).
const JWT_TTL: Duration = Duration::from_secs(10);
/// Metrics and health of principal and agent on free loopback ports (tests run side by side).
const LOOPBACK_ENDPOINTS: [&str; 4] = ["--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"];
const CONVERGE: Duration = Duration::from_secs(60);
const START: Duration = Duration::from_secs(60);

fn agent_id(td: &str, name: &str) -> String {
    format!("spiffe://{td}/ns/agents/sa/{name}")
}

fn blocking<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    tokio::task::block_in_place(f)
}

fn start_spire(td: &str) -> Result<Spire> {
    let mut options = SpireOptions::new(td);
    options.x509_svid_ttl = X509_TTL;
    options.jwt_svid_ttl = JWT_TTL;
    let started = Instant::now();
    let spire = blocking(|| Spire::start(options))?;
    eprintln!("SPIRE Server and Agent ({td}) healthy in {:?}", started.elapsed());
    Ok(spire)
}

/// Hub, spoke, and the principal and agent processes, each started from its own link of
/// `argocd-agent` so that SPIRE can tell them apart.
struct Setup {
    // Processes first: they stop before the API servers and directories go.
    agent: Option<ChildProcess>,
    principal: Option<ChildProcess>,
    hub: ApiServerProcess,
    spoke: ApiServerProcess,
    principal_bin: PathBuf,
    principal_args: Vec<String>,
    principal_port: u16,
    agent_name: String,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// Starts hub and spoke and the principal (`principal_bin`) with `args` (e.g. `--auth`).
    async fn start(agent: &str, principal_bin: PathBuf, args: &[String]) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("spire-e2e-").tempdir()?;
        let hub = ApiServerProcess::start_on(dir.path().join("hub")).await?;
        let spoke = ApiServerProcess::start_on(dir.path().join("spoke")).await?;
        for (client, ns) in [(hub.client(), ARGOCD_NS), (hub.client(), agent), (spoke.client(), ARGOCD_NS)] {
            let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
            api.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}}))?).await?;
        }
        let mut s = Self {
            agent: None,
            principal: None,
            hub,
            spoke,
            principal_bin,
            principal_args: args.to_vec(),
            principal_port: 0,
            agent_name: agent.to_string(),
            _dir: dir,
        };
        s.start_principal().await?;
        Ok(s)
    }

    /// Starts (or restarts, on the same port) the principal.
    async fn start_principal(&mut self) -> Result<()> {
        let mut cmd = Command::new(&self.principal_bin);
        cmd.args(["principal", "--allowed-namespaces", "*", "--namespace", ARGOCD_NS])
            .args(&self.principal_args)
            .args(["--listen-host", "127.0.0.1", "--listen-port", &self.principal_port.to_string()])
            .args(["--log-level", "debug", "--insecure-jwt-generate"])
            .args(LOOPBACK_ENDPOINTS)
            .arg("--kubeconfig")
            .arg(self.hub.kubeconfig_path())
            .env("NO_COLOR", "1")
            .env_remove("SPIFFE_ENDPOINT_SOCKET");
        let mut principal = ChildProcess::spawn("principal", cmd)?;
        let addr = wait_for_async(START, "the principal to listen", || {
            let running = principal.ensure_running();
            let addr = principal
                .stdout()
                .lines()
                .find_map(|l| l.strip_prefix("principal listening on ").map(|a| a.trim().to_string()));
            async move { running.map(|()| addr) }
        })
        .await?;
        self.principal_port = addr.rsplit(':').next().and_then(|p| p.parse().ok()).context("principal address")?;
        self.principal = Some(principal);
        Ok(())
    }

    fn principal_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.principal_port))
    }

    /// Starts (or restarts) the managed agent from `bin`, dialling `port` with `args`.
    fn start_agent(&mut self, bin: &Path, port: u16, args: &[&str]) -> Result<()> {
        self.agent = Some(ChildProcess::spawn("agent", self.agent_command(bin, port, args))?);
        Ok(())
    }

    fn agent_command(&self, bin: &Path, port: u16, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin);
        cmd.args(["agent", "--agent-mode", "managed", "--server-address", "127.0.0.1"])
            .args(["--server-port", &port.to_string(), "--agent-name", &self.agent_name])
            .args(["--namespace", ARGOCD_NS, "--log-level", "debug"])
            .args(LOOPBACK_ENDPOINTS)
            .args(args)
            .arg("--kubeconfig")
            .arg(self.spoke.kubeconfig_path())
            .env("NO_COLOR", "1")
            .env_remove("SPIFFE_ENDPOINT_SOCKET");
        cmd
    }

    fn kill_agent(&mut self) -> Result<()> {
        if let Some(mut agent) = self.agent.take() {
            agent.sigkill()?;
        }
        Ok(())
    }

    fn principal_log(&self) -> String {
        self.principal.as_ref().map(ChildProcess::stderr).unwrap_or_default()
    }

    fn connects(&self) -> usize {
        let needle = format!("agent connected agent={} ", self.agent_name);
        self.principal_log().lines().filter(|l| l.contains(&needle)).count()
    }

    fn agent_log(&self) -> String {
        self.agent.as_ref().map(ChildProcess::stderr).unwrap_or_default()
    }

    fn agent_log_count(&self, needle: &str) -> usize {
        self.agent_log().lines().filter(|l| l.contains(needle)).count()
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        if let Some(principal) = &self.principal {
            out.push_str(&format!("--- principal\n{}\n", principal.log_tail(40)));
        }
        if let Some(agent) = &self.agent {
            out.push_str(&format!("--- agent\n{}\n", agent.log_tail(40)));
        }
        out
    }

    /// Waits for `count` connects in total, counted over the current principal's log.
    async fn wait_connects(&self, count: usize) -> Result<()> {
        wait_until_async(CONVERGE, &format!("{count} connect(s) of agent {}", self.agent_name), || async {
            self.connects() >= count
        })
        .await
        .with_context(|| self.logs())
    }

    async fn wait_agent_log(&self, needle: &str, count: usize) -> Result<()> {
        wait_until_async(CONVERGE, &format!("the agent to log {needle:?} {count} time(s)"), || async {
            self.agent_log_count(needle) >= count
        })
        .await
        .with_context(|| self.logs())
    }

    /// An Application created on the hub reaches the spoke, and status written on the spoke
    /// comes back to the hub.
    async fn sync_both_ways(&self, app: &str) -> Result<()> {
        let agent = &self.agent_name;
        let hub: Api<DynamicObject> = Api::namespaced_with(self.hub.client(), agent, &application_resource());
        let spoke: Api<DynamicObject> = Api::namespaced_with(self.spoke.client(), ARGOCD_NS, &application_resource());
        hub.create(&PostParams::default(), &tests::fixtures::app_with_path(app, agent, app)?).await?;
        wait_until_async(CONVERGE, &format!("{app} reaches the spoke"), || async {
            spoke.get_opt(app).await.ok().flatten().is_some()
        })
        .await
        .with_context(|| self.logs())?;
        let status = json!({"status": {"health": {"status": "Healthy"}, "sync": {"status": "Synced"}}});
        spoke.patch(app, &PatchParams::default(), &Patch::Merge(status)).await?;
        wait_until_async(CONVERGE, &format!("{app}'s status reaches the hub"), || async {
            hub.get_opt(app)
                .await
                .ok()
                .flatten()
                .and_then(|o| serde_json::to_value(o).ok())
                .is_some_and(|o: Value| o["status"]["health"]["status"] == "Healthy")
        })
        .await
        .with_context(|| self.logs())
    }
}

/// `localauthority <kind> prepare`, then waits until SPIRE Agent has the bundle with the prepared
/// authority (its next sync with the server), as SPIRE's rotation procedure asks before
/// `activate`. Activating earlier makes SPIRE Server present a certificate of the new CA that the
/// agent cannot verify yet: an agent that reconnects in that window (to renew its own SVID, every
/// few seconds with these TTLs) stops with "Agent crashed", and every workload with it.
async fn prepare_and_propagate(spire: &Spire, kind: Authority) -> Result<String> {
    change_bundle(spire, "the bundle with the prepared authority", || spire.prepare_authority(kind)).await
}

/// Makes `change` on SPIRE Server, then waits until SPIRE Agent has the changed bundle (its next
/// sync logs "Bundle updated"); `what` names the bundle for the timeout's message.
async fn change_bundle<T>(spire: &Spire, what: &str, change: impl FnOnce() -> Result<T>) -> Result<T> {
    let bundle_updates = spire.agent_log_count("Bundle updated", "trust_domain_id", TD);
    let changed = blocking(change)?;
    wait_until_async(CONVERGE, &format!("SPIRE Agent to have {what}"), || async {
        spire.agent_log_count("Bundle updated", "trust_domain_id", TD) > bundle_updates
    })
    .await?;
    Ok(changed)
}

/// The principal's and `agent`'s workload binaries (copies of `binary`), each registered in
/// `spire` (entries `principal` and `agent`), and the principal's entry (to create it again or
/// change it).
fn register_workloads(spire: &Spire, binary: &Path, agent: &str) -> Result<(PathBuf, PathBuf, Entry)> {
    let principal_bin = spire.workload_binary(binary, "argocd-agent-principal")?;
    let agent_bin = spire.workload_binary(binary, &format!("argocd-agent-{agent}"))?;
    let principal_entry = Entry::for_binary("principal", PRINCIPAL_ID, &principal_bin);
    blocking(|| {
        spire.create_entry(&principal_entry)?;
        spire.create_entry(&Entry::for_binary("agent", &agent_id(TD, agent), &agent_bin))
    })?;
    Ok((principal_bin, agent_bin, principal_entry))
}

// === Certificates as the peer sees them ===

/// The leaf certificate a TLS server presents (the handshake itself may then fail: the
/// principal requires a client certificate this probe does not have).
async fn served_certificate(addr: SocketAddr) -> Result<Vec<u8>> {
    #[derive(Debug)]
    struct Capture(Arc<Mutex<Option<Vec<u8>>>>, Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for Capture {
        fn verify_server_cert(
            &self,
            end_entity: &rustls_pki_types::CertificateDer<'_>,
            _: &[rustls_pki_types::CertificateDer<'_>],
            _: &rustls_pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls_pki_types::UnixTime,
        ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(end_entity.to_vec());
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &rustls_pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.1.signature_verification_algorithms)
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &rustls_pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.1.signature_verification_algorithms)
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.1.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let seen = Arc::new(Mutex::new(None));
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Capture(seen.clone(), provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::try_from("localhost")?;
    let connect = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp);
    // The outcome does not matter, only what the server showed.
    let _ = tokio::time::timeout(Duration::from_secs(10), connect).await;
    let der = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    der.with_context(|| format!("{addr} presented no certificate"))
}

/// A DER element at the start of `der`: (tag, content, rest).
fn der_element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        let (bytes, rest) = (rest.get(..n)?, rest.get(n..)?);
        (bytes.iter().fold(0usize, |acc, b| (acc << 8) | usize::from(*b)), rest)
    };
    Some((tag, rest.get(..len)?, rest.get(len..)?))
}

/// The serial number (hex) of a DER certificate.
fn serial(cert: &[u8]) -> Option<String> {
    let (_, certificate, _) = der_element(cert)?;
    let (_, tbs, _) = der_element(certificate)?;
    let (tag, content, rest) = der_element(tbs)?;
    let (tag, content) = if tag == 0xa0 { der_element(rest).map(|(t, c, _)| (t, c))? } else { (tag, content) };
    (tag == 0x02).then(|| hex::encode(content))
}

/// The authority key identifier (hex) of a DER certificate: SPIRE's authority ID of its signer.
fn authority_key_id(cert: &[u8]) -> Option<String> {
    const OID: &[u8] = &[0x06, 0x03, 0x55, 0x1d, 0x23];
    let at = cert.windows(OID.len()).position(|w| w == OID)? + OID.len();
    let mut rest = &cert[at..];
    let (mut tag, mut value, mut after) = der_element(rest)?;
    if tag == 0x01 {
        rest = after; // the critical flag
        (tag, value, after) = der_element(rest)?;
    }
    let _ = after;
    if tag != 0x04 {
        return None;
    }
    let (_, sequence, _) = der_element(value)?;
    let (tag, key_id, _) = der_element(sequence)?;
    (tag == 0x80).then(|| hex::encode(key_id))
}

/// (serial, authority key ID) of the certificate `addr` serves.
async fn served_svid(addr: SocketAddr) -> Result<(String, String)> {
    let der = served_certificate(addr).await?;
    Ok((serial(&der).context("no serial")?, authority_key_id(&der).context("no authority key identifier")?))
}

// === spiffe:x509 ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spire_x509_rotation_of_svids_and_ca_keeps_the_stream_and_new_handshakes_use_the_new_svid() -> Result<()> {
    let agent = "rx";
    let spire = start_spire(TD)?;
    let (principal_bin, agent_bin, _) = register_workloads(&spire, &workspace_binary("argocd-agent")?, agent)?;

    let auth = format!("spiffe:x509:trust-domain={TD};namespaces=agents;endpoint={}", spire.endpoint());
    let mut s = Setup::start(agent, principal_bin, &["--auth".to_string(), auth]).await?;
    let creds = format!("spiffe:x509:endpoint={};principal-id={PRINCIPAL_ID}", spire.endpoint());
    s.start_agent(&agent_bin, s.principal_port, &["--creds", &creds])?;
    s.wait_connects(1).await?;
    s.sync_both_ways("first").await?;
    let (first_serial, first_ca) = served_svid(s.principal_addr()).await?;
    let ca = blocking(|| spire.authorities(Authority::X509))?;
    assert_eq!(ca.active.as_deref(), Some(first_ca.as_str()), "the principal serves an SVID of the active CA");

    // SVID rotation: SPIRE renews both SVIDs at half their lifetime; the principal's next
    // handshake shows the new one, the agent's renewal is in SPIRE Agent's log.
    let started = Instant::now();
    let renewed = |id: &str| spire.agent_log_count("Renewing X509-SVID", "spiffe_id", id);
    wait_for_async(CONVERGE, "SPIRE to rotate the principal's SVID", || async {
        // A failed probe (e.g. the principal busy past the probe's timeout) is "not yet".
        let serial = served_svid(s.principal_addr()).await.ok().map(|(serial, _)| serial);
        Ok(serial.filter(|serial| *serial != first_serial).map(|_| ()))
    })
    .await
    .with_context(|| s.logs())?;
    wait_until_async(CONVERGE, "SPIRE to rotate the agent's SVID", || async { renewed(&agent_id(TD, agent)) >= 1 })
        .await?;
    eprintln!("SVIDs rotated {:?} after the first sync", started.elapsed());
    s.sync_both_ways("after-svid-rotation").await?;
    assert_eq!(s.connects(), 1, "SVID rotation must not drop the stream\n{}", s.logs());

    // CA rotation: a new X.509 authority is prepared (published in the bundle), activated
    // (signs from now on) and the old one tainted (agents replace what it signed at once) and
    // revoked (out of the bundle). The live stream, authenticated with old-CA SVIDs, stays up.
    let started = Instant::now();
    let old_ca = first_ca;
    let agent_renewals = renewed(&agent_id(TD, agent));
    let new_ca = prepare_and_propagate(&spire, Authority::X509).await?;
    blocking(|| {
        spire.authority_action(Authority::X509, "activate", &new_ca)?;
        spire.authority_action(Authority::X509, "taint", &old_ca)
    })?;
    wait_for_async(CONVERGE, "the principal to serve an SVID of the new CA", || async {
        let ca = served_svid(s.principal_addr()).await.ok().map(|(_, ca)| ca);
        Ok((ca.as_deref() == Some(new_ca.as_str())).then_some(()))
    })
    .await
    .with_context(|| s.logs())?;
    wait_until_async(CONVERGE, "SPIRE to replace the agent's tainted SVID", || async {
        renewed(&agent_id(TD, agent)) > agent_renewals
    })
    .await?;
    change_bundle(&spire, "the bundle without the old CA", || {
        spire.authority_action(Authority::X509, "revoke", &old_ca)
    })
    .await?;
    eprintln!("CA rotated (prepare to revoke) in {:?}", started.elapsed());
    s.sync_both_ways("after-ca-rotation").await?;
    assert_eq!(s.connects(), 1, "CA rotation must not drop the stream\n{}", s.logs());

    // A new handshake from the running agent (the principal restarts on the same port): the old
    // CA is no longer in any bundle, so it succeeds only with the agent's new SVID.
    s.principal.as_mut().context("principal")?.sigkill()?;
    s.start_principal().await?;
    s.wait_connects(1).await?;
    s.sync_both_ways("after-new-handshake").await?;
    let (_, ca) = served_svid(s.principal_addr()).await?;
    assert_eq!(ca, new_ca);
    Ok(())
}

/// The principal's own entry is deleted: SPIRE Agent withdraws its identity ("no identity
/// issued"), so it has no SVID to present and every new handshake fails. It says so at WARN with
/// the Workload API's reason (not only the clients' failed handshakes at DEBUG), and once the entry
/// is back it presents an SVID again, says so, and an agent connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spire_x509_principal_without_an_svid_warns_and_recovers() -> Result<()> {
    let agent = "rw";
    let spire = start_spire(TD)?;
    let (principal_bin, agent_bin, principal_entry) =
        register_workloads(&spire, &workspace_binary("argocd-agent")?, agent)?;
    let auth = format!("spiffe:x509:trust-domain={TD};namespaces=agents;endpoint={}", spire.endpoint());
    let mut s = Setup::start(agent, principal_bin, &["--auth".to_string(), auth]).await?;
    served_svid(s.principal_addr()).await.context("the principal serves its SVID")?;

    blocking(|| spire.delete_entry("principal"))?;
    let warning = "no X.509-SVID to present";
    wait_until_async(CONVERGE, "the principal to warn that it has no SVID to present", || async {
        // Each probe is a handshake the principal cannot serve once SPIRE withdrew its SVID.
        let _ = served_svid(s.principal_addr()).await;
        s.principal_log().contains(warning)
    })
    .await
    .with_context(|| s.logs())?;
    let log = s.principal_log();
    let line = log.lines().find(|l| l.contains(warning)).unwrap_or_default();
    assert!(line.contains("WARN") && line.contains("no identity issued"), "names the Workload API's reason: {line}");

    blocking(|| spire.create_entry(&principal_entry))?;
    wait_for_async(CONVERGE, "the principal to present an SVID again", || async {
        Ok(served_svid(s.principal_addr()).await.ok().map(|_| ()))
    })
    .await
    .with_context(|| s.logs())?;
    assert!(s.principal_log().contains("an X.509-SVID to present again"), "{}", s.logs());
    let creds = format!("spiffe:x509:endpoint={};principal-id={PRINCIPAL_ID}", spire.endpoint());
    s.start_agent(&agent_bin, s.principal_port, &["--creds", &creds])?;
    s.wait_connects(1).await?;
    s.sync_both_ways("after-the-entry-is-back").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spire_x509_refuses_a_deleted_entry_and_another_trust_domain() -> Result<()> {
    let agent = "rd";
    let spire = start_spire(TD)?;
    let foreign = start_spire(FOREIGN_TD)?;
    let binary = workspace_binary("argocd-agent")?;
    let (principal_bin, agent_bin, principal_entry) = register_workloads(&spire, &binary, agent)?;
    // The same agent name in the other trust domain: an impostor with a valid SVID of its own.
    let impostor_bin = foreign.workload_binary(&binary, &format!("argocd-agent-{agent}"))?;
    blocking(|| {
        // The impostor trusts the principal (its SPIRE federates with ours), so the handshake
        // reaches the principal's check of the client.
        foreign.set_federated_bundle(TD, &spire.bundle_pem()?)?;
        let mut impostor = Entry::for_binary("impostor", &agent_id(FOREIGN_TD, agent), &impostor_bin);
        impostor.federates_with = vec![TD.to_string()];
        foreign.create_entry(&impostor)
    })?;

    let auth = format!("spiffe:x509:trust-domain={TD};namespaces=agents;endpoint={}", spire.endpoint());
    let mut s = Setup::start(agent, principal_bin, &["--auth".to_string(), auth]).await?;
    let creds = format!("spiffe:x509:endpoint={};principal-id={PRINCIPAL_ID}", spire.endpoint());
    s.start_agent(&agent_bin, s.principal_port, &["--creds", &creds])?;
    s.wait_connects(1).await?;
    s.sync_both_ways("registered").await?;

    // The entry is deleted. SPIRE never revokes an X.509-SVID: the running agent keeps its last
    // one, and its live stream (authenticated once, at the handshake) stays up.
    blocking(|| spire.delete_entry("agent"))?;
    s.sync_both_ways("entry-deleted").await?;
    assert_eq!(s.connects(), 1, "{}", s.logs());
    // A second agent process started now gets no SVID at all: SPIRE answers its Workload API
    // with PermissionDenied ("no identity issued") and it stops, naming the Workload API.
    let mut second =
        ChildProcess::spawn("agent-restarted", s.agent_command(&agent_bin, s.principal_port, &["--creds", &creds]))?;
    // Once the last SVID has expired, the running agent's next handshake (the principal
    // restarts) is refused.
    let expiry = spire.last_x509_svid_expiry("agent").context("SPIRE signed no SVID for the agent")?;
    wait_until_async(CONVERGE, "the deleted agent's last SVID to expire", || async { chrono::Utc::now() > expiry })
        .await?;
    s.principal.as_mut().context("principal")?.sigkill()?;
    s.start_principal().await?;
    let refused = |s: &Setup| s.principal_log().matches("TLS handshake failed").count();
    wait_until_async(CONVERGE, "the principal to refuse the agent's expired SVID twice", || async { refused(&s) >= 2 })
        .await
        .with_context(|| s.logs())?;
    assert_eq!(s.connects(), 0, "an agent whose entry was deleted must not reconnect\n{}", s.logs());
    let status = second.wait_exit_async(START).await?;
    assert!(!status.success(), "an agent without an entry must not run\n{}", second.log_tail(20));
    let log = second.stderr();
    assert!(log.contains("no X.509-SVID from the SPIFFE Workload API"), "{log}");
    s.kill_agent()?;

    // Another trust domain, same agent name, not federated with the principal: the principal's
    // TLS layer refuses the client SVID (no bundle for its trust domain).
    let handshakes_failed = |s: &Setup| s.principal_log().matches("TLS handshake failed").count();
    let before = handshakes_failed(&s);
    let creds = format!("spiffe:x509:endpoint={};principal-id={PRINCIPAL_ID}", foreign.endpoint());
    s.start_agent(&impostor_bin, s.principal_port, &["--creds", &creds])?;
    s.wait_agent_log("authentication failed", 2).await?;
    assert!(handshakes_failed(&s) > before, "the principal's TLS layer refuses it\n{}", s.logs());
    assert_eq!(s.connects(), 0, "an SVID of another trust domain must not connect\n{}", s.logs());

    // Federated (the principal now holds the other trust domain's bundle): TLS passes, and the
    // SPIFFE policy refuses the trust domain, saying so.
    blocking(|| {
        spire.set_federated_bundle(FOREIGN_TD, &foreign.bundle_pem()?)?;
        let mut federated = principal_entry.clone();
        federated.federates_with = vec![FOREIGN_TD.to_string()];
        spire.update_entry(&federated)
    })?;
    let refused = format!("trust domain \\\"{FOREIGN_TD}\\\" is not allowed");
    let refused_plain = format!("trust domain \"{FOREIGN_TD}\" is not allowed");
    wait_until_async(CONVERGE, "the policy to refuse the other trust domain", || async {
        let log = s.agent_log();
        log.contains(&refused) || log.contains(&refused_plain)
    })
    .await
    .with_context(|| s.logs())?;
    assert_eq!(s.connects(), 0, "an SVID of another trust domain must not connect\n{}", s.logs());
    Ok(())
}

// === spiffe:jwt ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spire_jwt_short_lived_svids_and_key_rotation_keep_the_stream() -> Result<()> {
    let agent = "rj";
    let spire = start_spire(TD)?;
    let binary = workspace_binary("argocd-agent")?;
    let principal_bin = spire.workload_binary(&binary, "argocd-agent-principal")?;
    let agent_bin = spire.workload_binary(&binary, &format!("argocd-agent-{agent}"))?;
    blocking(|| {
        spire.create_entry(&Entry::for_binary("principal", PRINCIPAL_ID, &principal_bin))?;
        let mut entry = Entry::for_binary("agent", &agent_id(TD, agent), &agent_bin);
        entry.jwt_svid_ttl = Some(JWT_TTL);
        spire.create_entry(&entry)
    })?;
    let auth =
        format!("spiffe:jwt:audience={AUDIENCE};trust-domain={TD};namespaces=agents;endpoint={}", spire.endpoint());
    let args = ["--auth".to_string(), auth, "--insecure-plaintext".to_string()];
    let mut s = Setup::start(agent, principal_bin, &args).await?;

    // SPIRE issues a JWT-SVID for any audience; the principal refuses one for another.
    let wrong = format!("spiffe:jwt:audience=someone-else;endpoint={}", spire.endpoint());
    s.start_agent(&agent_bin, s.principal_port, &["--creds", &wrong, "--insecure-plaintext"])?;
    s.wait_agent_log("authentication failed", 1).await?;
    assert_eq!(s.connects(), 0, "a JWT-SVID for another audience must not connect\n{}", s.logs());
    s.kill_agent()?;

    let creds = format!("spiffe:jwt:endpoint={}", spire.endpoint());
    s.start_agent(&agent_bin, s.principal_port, &["--creds", &creds, "--insecure-plaintext"])?;
    s.wait_connects(1).await?;
    s.sync_both_ways("first").await?;
    let started = Instant::now();
    s.wait_agent_log("JWT-SVID refreshed", 2).await?;
    eprintln!("two JWT-SVID refreshes in {:?}", started.elapsed());

    // The JWT signing key rotates: prepared (published), activated, the old one tainted and
    // revoked (out of the bundle). The stream stays; the agent's refreshed SVIDs verify.
    let started = Instant::now();
    let old_key = blocking(|| spire.authorities(Authority::Jwt))?.active.context("no JWT authority")?;
    let refreshed = s.agent_log_count("JWT-SVID refreshed");
    let new_key = prepare_and_propagate(&spire, Authority::Jwt).await?;
    blocking(|| {
        spire.authority_action(Authority::Jwt, "activate", &new_key)?;
        spire.authority_action(Authority::Jwt, "taint", &old_key)
    })?;
    change_bundle(&spire, "the bundle without the old key", || {
        spire.authority_action(Authority::Jwt, "revoke", &old_key)
    })
    .await?;
    s.wait_agent_log("JWT-SVID refreshed", refreshed + 1).await?;
    eprintln!("JWT key rotated and the agent refreshed in {:?}", started.elapsed());
    s.sync_both_ways("after-key-rotation").await?;
    assert_eq!(s.connects(), 1, "key rotation must not drop the stream\n{}", s.logs());

    // A new stream authenticates with a JWT-SVID of the new key (the old one is revoked).
    s.kill_agent()?;
    s.start_agent(&agent_bin, s.principal_port, &["--creds", &creds, "--insecure-plaintext"])?;
    s.wait_connects(2).await?;
    s.sync_both_ways("after-restart").await?;
    Ok(())
}

// === Envoy fed by SPIRE Agent's SDS ===

/// `GET path` on Envoy's admin interface; status and body (de-chunked).
async fn admin_get(admin: SocketAddr, path: &str) -> Result<(u16, String)> {
    let (status, body) = tests::http::get(admin, path).await?;
    Ok((status, dechunk(&body).unwrap_or(body)))
}

/// The body of a chunked HTTP/1.1 response; `None` if `body` is not chunked.
fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// The serial numbers of the certificates Envoy holds (admin `/certs`).
async fn envoy_cert_serials(admin: SocketAddr) -> Result<Vec<String>> {
    let (status, body) = admin_get(admin, "/certs").await?;
    if status != 200 {
        bail!("admin /certs answered {status}: {body}");
    }
    let json: Value = serde_json::from_str(&body).with_context(|| format!("admin /certs: {body}"))?;
    let mut serials: Vec<String> = json["certificates"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["cert_chain"].as_array().into_iter().flatten())
        .filter_map(|c| c["serial_number"].as_str().map(str::to_string))
        .collect();
    serials.sort();
    Ok(serials)
}

/// The Envoy binary itself (the venv's `envoy` may be a wrapper that execs it): what
/// `/proc/<pid>/exe` of a running Envoy names.
fn envoy_binary() -> Result<PathBuf> {
    let envoy = tests::envoy_path()?;
    if std::fs::read(&envoy)?.starts_with(b"\x7fELF") {
        return Ok(std::fs::canonicalize(envoy)?);
    }
    // A wrapper script: the real binary is the package's `envoy/_bin/envoy`.
    let venv = envoy.parent().and_then(Path::parent).context("venv of envoy")?;
    let found = std::fs::read_dir(venv.join("lib"))?
        .filter_map(std::result::Result::ok)
        .map(|python| python.path().join("site-packages/envoy/_bin/envoy"))
        .find(|p| p.is_file());
    found.with_context(|| format!("no envoy/_bin/envoy under {}", venv.display()))
}

/// `envoy/agent-sidecar.yaml` turned into its SDS variant as `envoy/README.md` describes it: the
/// client SVID and the bundle from SPIRE Agent's SDS, the principal pinned by its SPIFFE ID.
fn agent_sidecar_sds_template(principal_id: &str, trust_domain: &str, sds_socket: &Path) -> Result<String> {
    let file = tests::envoy::template("agent-sidecar.yaml")?;
    let at = file.find("          tls_certificates:\n").context("agent-sidecar.yaml has no tls_certificates")?;
    let tail = &file[at..];
    for expected in ["${CLIENT_CERT_PATH}", "${CLIENT_KEY_PATH}", "${PRINCIPAL_CA_PATH}"] {
        if !tail.contains(expected) {
            bail!("agent-sidecar.yaml changed: its TLS block has no {expected}");
        }
    }
    let sds = format!(
        r#"          tls_certificate_sds_secret_configs:
          - name: "${{AGENT_SPIFFE_ID}}"
            sds_config: &spire_sds
              resource_api_version: V3
              api_config_source:
                api_type: GRPC
                transport_api_version: V3
                grpc_services:
                - envoy_grpc: {{ cluster_name: spire_agent }}
          combined_validation_context:
            default_validation_context:
              match_typed_subject_alt_names:
              - san_type: URI
                matcher: {{ exact: "{principal_id}" }}
            validation_context_sds_secret_config:
              name: "spiffe://{trust_domain}"
              sds_config: *spire_sds

  - name: spire_agent
    type: STATIC
    connect_timeout: 5s
    load_assignment:
      cluster_name: spire_agent
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              pipe: {{ path: "{socket}" }}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {{}}
"#,
        socket = sds_socket.display()
    );
    Ok(format!("{}{sds}", &file[..at]))
}

/// A running Envoy on a rendered bootstrap, with its admin and (only) listener address.
struct Envoy {
    process: ChildProcess,
    admin: SocketAddr,
    listen: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts `bin` on `config` and waits until it is LIVE: with SDS, only once the listener (or
    /// cluster) has its secrets from SPIRE.
    async fn start(name: &str, bin: &Path, config: &str) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix(&format!("{name}-")).tempdir()?;
        let path = dir.path().join("envoy.yaml");
        std::fs::write(&path, config)?;
        let admin_path = dir.path().join("admin-address");
        let mut cmd = Command::new(bin);
        cmd.arg("--config-path").arg(&path).arg("--admin-address-path").arg(&admin_path);
        cmd.args(["--disable-hot-restart", "--use-dynamic-base-id", "--concurrency", "1", "--log-level", "info"]);
        let mut process = ChildProcess::spawn(name, cmd)?;
        let admin: SocketAddr = wait_for_async(START, &format!("{name} to write its admin address"), || {
            let running = process.ensure_running();
            let text = std::fs::read_to_string(&admin_path).unwrap_or_default();
            async move { running.map(|()| text.trim().parse().ok()) }
        })
        .await?;
        wait_for_async(START, &format!("{name} to be LIVE with its SDS secrets"), || {
            let running = process.ensure_running();
            async move {
                running?;
                let ready = admin_get(admin, "/ready").await.ok();
                Ok(ready.filter(|(status, body)| *status == 200 && body.trim() == "LIVE").map(|_| ()))
            }
        })
        .await
        .with_context(|| process.log_tail(20))?;
        let (_, listeners) = admin_get(admin, "/listeners?format=json").await?;
        let listeners: Value = serde_json::from_str(&listeners).with_context(|| format!("/listeners: {listeners}"))?;
        let port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
            .as_u64()
            .with_context(|| format!("no listener port in {listeners}"))?;
        let listen = SocketAddr::from(([127, 0, 0, 1], u16::try_from(port)?));
        Ok(Self { process, admin, listen, _dir: dir })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spire_sds_feeds_envoy_sidecars_and_rotates_without_dropping_the_stream() -> Result<()> {
    let agent = "re";
    let spire = start_spire(TD)?;
    let binary = workspace_binary("argocd-agent")?;
    let envoy = envoy_binary()?;
    let principal_bin = spire.workload_binary(&binary, "argocd-agent-principal")?;
    let agent_bin = spire.workload_binary(&binary, &format!("argocd-agent-{agent}"))?;
    let principal_envoy = spire.workload_binary(&envoy, "envoy-principal-sidecar")?;
    let agent_envoy = spire.workload_binary(&envoy, &format!("envoy-agent-sidecar-{agent}"))?;
    blocking(|| {
        // The sidecars, not the processes behind them, hold the SVIDs.
        spire.create_entry(&Entry::for_binary("principal-sidecar", PRINCIPAL_ID, &principal_envoy))?;
        spire.create_entry(&Entry::for_binary("agent-sidecar", &agent_id(TD, agent), &agent_envoy))
    })?;
    let auth = format!("xfcc:profile=envoy;trust-domain={TD};namespaces=agents");
    let args = ["--auth".to_string(), auth, "--insecure-plaintext".to_string()];
    let mut s = Setup::start(agent, principal_bin, &args).await?;

    // envoy/principal-sidecar-sds.yaml as it is, for loopback and this SPIRE Agent.
    let idle = tests::envoy::proto_duration(tests::envoy::PRODUCTION_STREAM_IDLE_TIMEOUT);
    let values = std::collections::BTreeMap::from([
        ("ADMIN_PORT", "0".to_string()),
        ("LISTEN_ADDRESS", "127.0.0.1".to_string()),
        ("LISTEN_PORT", "0".to_string()),
        ("PRINCIPAL_PORT", s.principal_port.to_string()),
        ("STREAM_IDLE_TIMEOUT", idle.clone()),
        ("SPIFFE_ENDPOINT_SOCKET", spire.socket_path().display().to_string()),
        ("PRINCIPAL_SPIFFE_ID", PRINCIPAL_ID.to_string()),
        ("TRUST_DOMAIN", TD.to_string()),
    ]);
    let config = tests::envoy::render(&tests::envoy::template("principal-sidecar-sds.yaml")?, &values)?;
    let mut principal_sidecar = Envoy::start("envoy-principal-sidecar-sds", &principal_envoy, &config).await?;
    let (_, ca) = served_svid(principal_sidecar.listen).await?;
    assert_eq!(Some(ca), blocking(|| spire.authorities(Authority::X509))?.active, "Envoy serves a SPIRE SVID");

    // The agent's sidecar: envoy/agent-sidecar.yaml with its certificates from SDS as well.
    let values = std::collections::BTreeMap::from([
        ("ADMIN_PORT", "0".to_string()),
        ("LISTEN_PORT", "0".to_string()),
        ("STREAM_IDLE_TIMEOUT", idle),
        ("PRINCIPAL_SIDECAR_HOST", "127.0.0.1".to_string()),
        ("PRINCIPAL_SIDECAR_PORT", principal_sidecar.listen.port().to_string()),
        ("PRINCIPAL_SNI", "localhost".to_string()),
        ("AGENT_SPIFFE_ID", agent_id(TD, agent)),
    ]);
    let template = agent_sidecar_sds_template(PRINCIPAL_ID, TD, spire.socket_path())?;
    let mut agent_sidecar =
        Envoy::start("envoy-agent-sidecar-sds", &agent_envoy, &tests::envoy::render(&template, &values)?).await?;

    // The agent speaks h2c to its sidecar; the sidecars do mTLS with SPIRE's SVIDs; the
    // principal reads the agent's SPIFFE ID from x-forwarded-client-cert.
    let sidecar_port = agent_sidecar.listen.port();
    let agent_args = ["--creds", "header:", "--insecure-plaintext", "--heartbeat-interval", "30s"];
    s.start_agent(&agent_bin, sidecar_port, &agent_args)?;
    s.wait_connects(1).await?;
    s.sync_both_ways("through-envoy").await?;

    // SPIRE rotates both sidecars' SVIDs; SDS pushes them to Envoy without a restart or a dropped
    // stream.
    let started = Instant::now();
    let first = (envoy_cert_serials(principal_sidecar.admin).await?, envoy_cert_serials(agent_sidecar.admin).await?);
    wait_for_async(CONVERGE, "SDS to push rotated SVIDs to both sidecars", || async {
        let principal_now = envoy_cert_serials(principal_sidecar.admin).await?;
        let agent_now = envoy_cert_serials(agent_sidecar.admin).await?;
        Ok((principal_now != first.0 && agent_now != first.1).then_some(()))
    })
    .await
    .with_context(|| s.logs())?;
    eprintln!("both sidecars' SVIDs rotated through SDS {:?} after the first sync", started.elapsed());
    s.sync_both_ways("after-sds-rotation").await?;
    assert_eq!(s.connects(), 1, "SDS rotation must not drop the stream\n{}", s.logs());

    // A new stream (the agent restarts; its sidecar may reuse its pooled connection) and a new
    // handshake with the principal's sidecar (this probe), which shows the SVID SDS gave it last.
    s.kill_agent()?;
    s.start_agent(&agent_bin, sidecar_port, &agent_args)?;
    s.wait_connects(2).await?;
    s.sync_both_ways("after-restart").await?;
    wait_for_async(CONVERGE, "a new handshake to show Envoy's current SVID", || async {
        let Ok((serial, _)) = served_svid(principal_sidecar.listen).await else { return Ok(None) };
        let held = envoy_cert_serials(principal_sidecar.admin).await?;
        Ok(held.iter().any(|h| h.trim_start_matches('0') == serial.trim_start_matches('0')).then_some(()))
    })
    .await?;
    for sidecar in [&mut principal_sidecar, &mut agent_sidecar] {
        sidecar.process.ensure_running()?;
    }
    Ok(())
}
