//! `argocd-agentctl pki` and `jwt` against the embedded API server: the secrets they write (names,
//! types, keys), the certificates in them (chain, subject, SANs, usages) and the refusals.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;

/// One embedded API server (one "cluster") with its kubeconfig.
struct Cluster {
    rt: tokio::runtime::Runtime,
    server: Option<apiserver::ApiServer>,
    client: kube::Client,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let server = rt.block_on(apiserver::ApiServer::start(apiserver::Config::new(&data))).unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let client = rt.block_on(server.client()).unwrap();
        // Like a real cluster, the API server wants a namespace before its secrets.
        let namespaces: Api<Namespace> = Api::all(client.clone());
        for ns in ["argocd", "agents"] {
            let object = Namespace {
                metadata: ObjectMeta { name: Some(ns.into()), ..ObjectMeta::default() },
                ..Namespace::default()
            };
            rt.block_on(namespaces.create(&PostParams::default(), &object)).unwrap();
        }
        Self { rt, server: Some(server), client, kubeconfig, dir }
    }

    /// Run argocd-agentctl with `--kubeconfig` and a clean environment.
    fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_env(args, &[])
    }

    /// Run argocd-agentctl with `--kubeconfig`, a clean environment plus `env`.
    fn ctl_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_argocd-agentctl"));
        for var in [
            "KUBECONFIG",
            "ARGOCD_AGENT_PRINCIPAL_CONTEXT",
            "ARGOCD_AGENT_PRINCIPAL_NAMESPACE",
            "ARGOCD_AGENT_AGENT_CONTEXT",
            "ARGOCD_AGENT_AGENT_NAMESPACE",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().copied()).arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        cmd.output().unwrap()
    }

    /// Run and require success.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(out.status.success(), "argocd-agentctl {args:?} failed:\n{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    /// Run and require failure; returns stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(!out.status.success(), "argocd-agentctl {args:?} should fail:\n{}", text(&out));
        String::from_utf8(out.stderr).unwrap()
    }

    fn secret(&self, ns: &str, name: &str) -> Option<Secret> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        self.rt.block_on(api.get_opt(name)).unwrap()
    }

    fn must_secret(&self, ns: &str, name: &str) -> Secret {
        self.secret(ns, name).unwrap_or_else(|| panic!("secret {ns}/{name} missing"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.shutdown());
        }
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn field(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

fn keys_of(secret: &Secret) -> BTreeSet<String> {
    secret.data.as_ref().unwrap().keys().cloned().collect()
}

fn der_of(pem: &str) -> Vec<u8> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    assert_eq!(pem.label, "CERTIFICATE");
    pem.contents
}

fn cn(cert: &X509Certificate<'_>) -> String {
    cert.subject().iter_common_name().next().unwrap().as_str().unwrap().to_owned()
}

fn sans(cert: &X509Certificate<'_>) -> Vec<String> {
    let Some(ext) = cert.subject_alternative_name().unwrap() else { return Vec::new() };
    ext.value
        .general_names
        .iter()
        .map(|n| match n {
            GeneralName::DNSName(d) => format!("DNS:{d}"),
            GeneralName::URI(u) => format!("URI:{u}"),
            GeneralName::IPAddress(b) if b.len() == 4 => {
                format!("IP:{}", std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).unwrap()))
            }
            other => format!("{other:?}"),
        })
        .collect()
}

/// `pki init` with a fast key unless a test wants the default RSA.
const FAST: [&str; 2] = ["--key-algorithm", "ecdsa-p256"];

fn init(c: &Cluster) -> String {
    c.ok(&[&["pki", "init"][..], &FAST].concat());
    field(&c.must_secret("argocd", "argocd-agent-ca"), "tls.crt")
}

#[test]
fn pki_init_creates_the_ca_secret_and_refuses_to_overwrite_it() {
    let c = Cluster::start();
    let out = c.ok(&[&["pki", "init"][..], &FAST].concat());
    assert!(out.contains("argocd/argocd-agent-ca"), "{out}");

    let secret = c.must_secret("argocd", "argocd-agent-ca");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(keys_of(&secret), BTreeSet::from(["tls.crt".to_owned(), "tls.key".to_owned()]));
    assert!(secret.metadata.labels.as_ref().is_none_or(|l| l.is_empty()), "upstream sets no labels");
    let ca_pem = field(&secret, "tls.crt");
    assert!(field(&secret, "tls.key").contains("-----BEGIN PRIVATE KEY-----"), "PKCS#8 key");
    let der = der_of(&ca_pem);
    let (_, ca) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert!(ca.is_ca());
    assert_eq!(cn(&ca), "argocd-agent-ca");
    assert_eq!(ca.subject().iter_organization().next().unwrap().as_str().unwrap(), "DO NOT USE IN PRODUCTION");
    let days = ca.validity().time_to_expiration().unwrap().whole_days();
    assert!((3649..=3650).contains(&days), "CA valid for {days} days");
    ca.verify_signature(None).unwrap();

    // A second init refuses and says how to proceed; the CA is untouched.
    let err = c.fails(&[&["pki", "init"][..], &FAST].concat());
    assert!(err.contains("already exists") && err.contains("--force"), "{err}");
    assert_eq!(field(&c.must_secret("argocd", "argocd-agent-ca"), "tls.crt"), ca_pem);

    // --force regenerates it.
    c.ok(&[&["pki", "init", "--force", "--days", "30"][..], &FAST].concat());
    let new_pem = field(&c.must_secret("argocd", "argocd-agent-ca"), "tls.crt");
    assert_ne!(new_pem, ca_pem);
    let der = der_of(&new_pem);
    let (_, ca) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert!((29..=30).contains(&ca.validity().time_to_expiration().unwrap().whole_days()));

    // inspect summarizes it with upstream's field names.
    let summary: serde_json::Value = serde_json::from_str(&c.ok(&["pki", "inspect"])).unwrap();
    assert_eq!(summary["ca"]["subject"], "CN=argocd-agent-ca,O=DO NOT USE IN PRODUCTION");
    assert_eq!(summary["ca"]["keyType"], "ECDSA");
    assert!(summary.get("principal").is_none(), "no principal certificate yet: {summary}");

    // dump --cert prints the CA certificate; without a selector it refuses.
    assert_eq!(c.ok(&["pki", "dump", "--cert"]), new_pem);
    let err = c.fails(&["pki", "dump"]);
    assert!(err.contains("--all, --key or --cert"), "{err}");

    // delete --yes removes it; issuing afterwards says the CA is missing.
    c.ok(&["pki", "delete", "--yes"]);
    assert!(c.secret("argocd", "argocd-agent-ca").is_none());
    let err = c.fails(&[&["pki", "issue", "principal"][..], &FAST].concat());
    assert!(err.contains("CA is not initialized") && err.contains("pki init"), "{err}");
}

#[test]
fn pki_issue_principal_writes_a_server_cert_with_the_requested_sans() {
    let c = Cluster::start();
    let ca_pem = init(&c);
    let ca_der = der_of(&ca_pem);
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();

    let args = ["pki", "issue", "principal", "--ip", "127.0.0.1,10.0.0.5", "--dns", "localhost", "--dns"];
    let out = c.ok(&[&args[..], &["principal.example.com"], &FAST].concat());
    assert!(out.contains("argocd/argocd-agent-principal-tls created"), "{out}");

    let secret = c.must_secret("argocd", "argocd-agent-principal-tls");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(keys_of(&secret), BTreeSet::from(["tls.crt".to_owned(), "tls.key".to_owned()]));
    let der = der_of(&field(&secret, "tls.crt"));
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    cert.verify_signature(Some(ca.public_key())).expect("chains to the CA");
    assert_eq!(cert.issuer(), ca.subject());
    assert_eq!(cn(&cert), "argocd-agent-principal");
    assert!(!cert.is_ca());
    let names = sans(&cert);
    for want in ["IP:127.0.0.1", "IP:10.0.0.5", "DNS:localhost", "DNS:principal.example.com"] {
        assert!(names.contains(&want.to_owned()), "{want} missing from {names:?}");
    }
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth, "clientAuth too: a cross-hub replica dials its peer with it");
    let days = cert.validity().time_to_expiration().unwrap().whole_days();
    assert!((179..=180).contains(&days), "leaf valid for {days} days");

    // Reissuing needs --upsert.
    let err = c.fails(&[&["pki", "issue", "principal"][..], &FAST].concat());
    assert!(err.contains("--upsert"), "{err}");
    let out = c.ok(&[&["pki", "issue", "principal", "-u"][..], &FAST].concat());
    assert!(out.contains("updated"), "{out}");
    let der = der_of(&field(&c.must_secret("argocd", "argocd-agent-principal-tls"), "tls.crt"));
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert_eq!(sans(&cert), vec!["DNS:localhost".to_owned(), "IP:127.0.0.1".to_owned()], "upstream defaults");

    // A bad --ip is named.
    let err = c.fails(&["pki", "issue", "principal", "-u", "--ip", "300.1.1.1"]);
    assert!(err.contains("300.1.1.1") && err.contains("--ip"), "{err}");

    // The resource proxy needs SANs or --no-san.
    let err = c.fails(&["pki", "issue", "resource-proxy"]);
    assert!(err.contains("--no-san"), "{err}");
    c.ok(&[&["pki", "issue", "resource-proxy", "--dns", "argocd-agent-resource-proxy"][..], &FAST].concat());
    let der = der_of(&field(&c.must_secret("argocd", "argocd-agent-resource-proxy-tls"), "tls.crt"));
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert_eq!(cn(&cert), "argocd-agent-resource-proxy");
    cert.verify_signature(Some(ca.public_key())).unwrap();
}

#[test]
fn pki_issue_agent_writes_a_client_cert_named_after_the_agent() {
    let c = Cluster::start();
    let ca_pem = init(&c);
    let ca_der = der_of(&ca_pem);
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();

    // One kubeconfig context for both sides: upstream insists on --same-context.
    let err = c.fails(&[&["pki", "issue", "agent", "agent-1"][..], &FAST].concat());
    assert!(err.contains("--same-context"), "{err}");

    let args = ["pki", "issue", "agent", "agent-1", "--same-context", "--agent-namespace", "agents"];
    let out = c.ok(&[&args[..], &FAST].concat());
    assert!(out.contains("agents/argocd-agent-client-tls created"), "{out}");
    assert!(c.secret("argocd", "argocd-agent-client-tls").is_none(), "written to the agent namespace only");

    let secret = c.must_secret("agents", "argocd-agent-client-tls");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(keys_of(&secret), BTreeSet::from(["tls.crt".to_owned(), "tls.key".to_owned()]));
    let der = der_of(&field(&secret, "tls.crt"));
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    cert.verify_signature(Some(ca.public_key())).expect("signed by the CA");
    assert_eq!(cn(&cert), "agent-1");
    assert!(sans(&cert).is_empty(), "no SPIFFE SAN unless asked: {:?}", sans(&cert));
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && !eku.server_auth);

    // With a trust domain, the SPIFFE ID follows the Kubernetes convention.
    let args = ["pki", "issue", "agent", "agent-1", "--same-context", "--agent-namespace", "agents", "--upsert"];
    c.ok(&[&args[..], &["--spiffe-trust-domain", "cluster.local"], &FAST].concat());
    let der = der_of(&field(&c.must_secret("agents", "argocd-agent-client-tls"), "tls.crt"));
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert_eq!(cn(&cert), "agent-1");
    assert_eq!(sans(&cert), vec!["URI:spiffe://cluster.local/ns/agents/sa/agent-1".to_owned()]);
    let err = c.fails(&[&args[..], &["--spiffe-trust-domain", "Cluster.Local"]].concat());
    assert!(err.contains("trust domain"), "{err}");
}

#[test]
fn pki_issue_agent_rejects_names_that_are_not_dns_labels() {
    let c = Cluster::start();
    init(&c);
    for bad in ["Agent_1", "agent-", "agent.one"] {
        let err = c.fails(&[&["pki", "issue", "agent", bad, "--same-context"][..], &FAST].concat());
        assert!(err.contains("DNS-1123") && err.contains(bad), "{err}");
    }
    assert!(c.secret("argocd", "argocd-agent-client-tls").is_none());
}

#[test]
fn out_dir_writes_pem_files_that_parse() {
    use std::os::unix::fs::PermissionsExt as _;
    let c = Cluster::start();
    let out = c.dir.path().join("pem");
    let dir = out.to_str().unwrap();
    c.ok(&[&["pki", "init", "--out-dir", dir][..], &FAST].concat());
    c.ok(&[&["pki", "issue", "agent", "agent-1", "--same-context", "--out-dir", dir][..], &FAST].concat());
    c.ok(&[&["pki", "issue", "principal", "--out-dir", dir][..], &FAST].concat());

    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
    let mode = |name: &str| std::fs::metadata(out.join(name)).unwrap().permissions().mode() & 0o777;
    let ca_pem = read("ca.crt");
    assert_eq!(ca_pem, field(&c.must_secret("argocd", "argocd-agent-ca"), "tls.crt"));
    let ca_der = der_of(&ca_pem);
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    for (stem, secret_ns, secret) in
        [("agent-1", "argocd", "argocd-agent-client-tls"), ("principal", "argocd", "argocd-agent-principal-tls")]
    {
        let cert_pem = read(&format!("{stem}.crt"));
        let key_pem = read(&format!("{stem}.key"));
        assert_eq!(cert_pem, field(&c.must_secret(secret_ns, secret), "tls.crt"));
        assert_eq!(key_pem, field(&c.must_secret(secret_ns, secret), "tls.key"));
        assert_eq!(mode(&format!("{stem}.key")), 0o600, "{stem}.key is private");
        let der = der_of(&cert_pem);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        cert.verify_signature(Some(ca.public_key())).unwrap();
        let key = rcgen::KeyPair::from_pem(&key_pem).expect("the key parses");
        assert_eq!(key.public_key_raw(), cert.public_key().subject_public_key.data.as_ref(), "key matches cert");
    }
    assert_eq!(cn(&x509_parser::parse_x509_certificate(&der_of(&read("agent-1.crt"))).unwrap().1), "agent-1");
    assert_eq!(mode("ca.key"), 0o600);
    rcgen::KeyPair::from_pem(&read("ca.key")).unwrap();
    let pems: Vec<_> = Pem::iter_from_buffer(read("ca.crt").as_bytes()).collect();
    assert_eq!(pems.len(), 1);
}

#[test]
fn rsa_defaults_propagate_and_jwt_key() {
    let c = Cluster::start();
    // Upstream's default algorithm is RSA (4096; 2048 here to keep the test quick).
    c.ok(&["pki", "init", "--key-size", "2048"]);
    let ca_der = der_of(&field(&c.must_secret("argocd", "argocd-agent-ca"), "tls.crt"));
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    assert!(matches!(ca.public_key().parsed().unwrap(), x509_parser::public_key::PublicKey::RSA(_)));
    c.ok(&["pki", "issue", "agent", "agent-9", "--same-context", "--key-size", "2048"]);
    let der = der_of(&field(&c.must_secret("argocd", "argocd-agent-client-tls"), "tls.crt"));
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    cert.verify_signature(Some(ca.public_key())).unwrap();
    let err = c.fails(&["pki", "init", "--force", "--key-size", "1024"]);
    assert!(err.contains("--key-size"), "{err}");

    // propagate copies the public CA into the agent's namespace, never over the principal's CA.
    let err = c.fails(&["pki", "propagate"]);
    assert!(err.contains("overwrite"), "{err}");
    c.ok(&["pki", "propagate", "--agent-namespace", "agents"]);
    let agent_ca = c.must_secret("agents", "argocd-agent-ca");
    assert_eq!(agent_ca.type_.as_deref(), Some("Opaque"));
    assert_eq!(keys_of(&agent_ca), BTreeSet::from(["ca.crt".to_owned()]));
    assert_eq!(field(&agent_ca, "ca.crt"), field(&c.must_secret("argocd", "argocd-agent-ca"), "tls.crt"));
    let err = c.fails(&["pki", "propagate", "--agent-namespace", "agents"]);
    assert!(err.contains("--force"), "{err}");

    // jwt create-key: RSA-4096 PKCS#8 in argocd-agent-jwt/jwt.key.
    let out = c.ok(&["jwt", "create-key"]);
    assert!(out.contains("argocd/argocd-agent-jwt"), "{out}");
    let jwt = c.must_secret("argocd", "argocd-agent-jwt");
    assert_eq!(jwt.type_.as_deref(), Some("Opaque"));
    assert_eq!(keys_of(&jwt), BTreeSet::from(["jwt.key".to_owned()]));
    let pem = field(&jwt, "jwt.key");
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "PKCS#8");
    let inspect = c.ok(&["jwt", "inspect-key"]);
    assert!(inspect.contains("\"keyLength\":4096") && inspect.contains("\"keyType\":\"RSA\""), "{inspect}");
    let err = c.fails(&["jwt", "create-key"]);
    assert!(err.contains("--upsert"), "{err}");
    // An ECDSA P-256 key (tokens ES256), which the principal loads.
    c.ok(&["jwt", "create-key", "--upsert", "--type", "ecdsa-p256"]);
    let pem = field(&c.must_secret("argocd", "argocd-agent-jwt"), "jwt.key");
    let key = auth::SigningKey::from_pem(&pem).expect("the principal loads it");
    assert_eq!(format!("{:?}", key.algorithm()), "ES256");
    let inspect = c.ok(&["jwt", "inspect-key", "-o", "text"]);
    assert!(inspect.contains("ECDSA-P256") && inspect.contains("Key length:      256"), "{inspect}");
    c.ok(&["jwt", "delete-key", "--force"]);
    assert!(c.secret("argocd", "argocd-agent-jwt").is_none());
}

#[test]
fn contexts_and_namespaces_come_from_flags_and_env() {
    let c = Cluster::start();
    // The embedded server's kubeconfig names its context "embedded".
    c.ok(&[&["pki", "init", "--principal-context", "embedded", "--principal-namespace", "agents"][..], &FAST].concat());
    assert!(c.secret("agents", "argocd-agent-ca").is_some());
    assert!(c.secret("argocd", "argocd-agent-ca").is_none());

    // The env fallbacks have upstream's names.
    let out = c.ctl_env(&["pki", "dump", "--cert"], &[("ARGOCD_AGENT_PRINCIPAL_NAMESPACE", "agents")]);
    assert!(out.status.success(), "{}", text(&out));
    let out = c.ctl_env(&["pki", "dump", "--cert"], &[("ARGOCD_AGENT_PRINCIPAL_CONTEXT", "nope")]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("nope"), "{}", text(&out));

    // Errors name the missing context or namespace.
    let err = c.fails(&["pki", "dump", "--cert", "--principal-context", "nope"]);
    assert!(err.contains("\"nope\""), "{err}");
    let err = c.fails(&[&["pki", "init", "--principal-namespace", "missing"][..], &FAST].concat());
    assert!(err.contains("create namespace missing"), "{err}");
}

/// `pki issue ha-admin`: the client certificate `argocd-agentctl ha --tls-cert/--tls-key/--tls-ca`
/// presents to a principal's HA admin endpoint (CN ha-admin, what
/// `--ha-admin-auth 'mtls:subject:^CN=ha-admin(,|$)'` admits), with the CA beside it.
#[test]
fn pki_issue_ha_admin_writes_the_admin_client_cert_with_its_ca() {
    let c = Cluster::start();
    let ca_pem = init(&c);
    let ca_der = der_of(&ca_pem);
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    let out_dir = c.dir.path().join("admin");
    let out_dir = out_dir.to_str().unwrap();
    let out = c.ok(&[&["pki", "issue", "ha-admin", "--out-dir", out_dir][..], &FAST].concat());
    assert!(out.contains("argocd/argocd-agent-ha-admin-tls created"), "{out}");

    let secret = c.must_secret("argocd", "argocd-agent-ha-admin-tls");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(keys_of(&secret), BTreeSet::from(["ca.crt".to_owned(), "tls.crt".to_owned(), "tls.key".to_owned()]));
    assert_eq!(field(&secret, "ca.crt"), ca_pem);
    let der = der_of(&field(&secret, "tls.crt"));
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    cert.verify_signature(Some(ca.public_key())).expect("signed by the CA");
    assert_eq!(cn(&cert), "ha-admin");
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && !eku.server_auth);
    for file in ["ca.crt", "ha-admin.crt", "ha-admin.key"] {
        assert!(std::path::Path::new(out_dir).join(file).is_file(), "--out-dir wrote {file}");
    }

    let err = c.fails(&[&["pki", "issue", "ha-admin"][..], &FAST].concat());
    assert!(err.contains("--upsert"), "{err}");
    c.ok(&[&["pki", "issue", "ha-admin", "--upsert", "--common-name", "ops-admin"][..], &FAST].concat());
    let der = der_of(&field(&c.must_secret("argocd", "argocd-agent-ha-admin-tls"), "tls.crt"));
    assert_eq!(cn(&x509_parser::parse_x509_certificate(&der).unwrap().1), "ops-admin");
}
