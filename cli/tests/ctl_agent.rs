//! `argocd-agentctl agent` and `version` against the embedded API server, through the real binary:
//! the cluster secret `agent create` writes (upstream's name, labels, annotations, data fields and
//! config JSON, a client certificate from the PKI's CA), and `list`, `inspect`, `print-tls`,
//! `reconfigure` reading and changing it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Output};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

/// One embedded API server with its kubeconfig and the namespaces the tests use.
struct Cluster {
    rt: tokio::runtime::Runtime,
    server: Option<apiserver::ApiServer>,
    client: kube::Client,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let server = rt.block_on(apiserver::ApiServer::start(apiserver::Config::new(dir.path().join("data")))).unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let client = rt.block_on(server.client()).unwrap();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        for ns in ["argocd", "agents"] {
            let object = Namespace {
                metadata: ObjectMeta { name: Some(ns.into()), ..ObjectMeta::default() },
                ..Namespace::default()
            };
            rt.block_on(namespaces.create(&PostParams::default(), &object)).unwrap();
        }
        Self { rt, server: Some(server), client, kubeconfig, _dir: dir }
    }

    /// Run argocd-agentctl with `--kubeconfig` and none of its environment variables.
    fn ctl(&self, args: &[&str]) -> Output {
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
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(out.status.success(), "argocd-agentctl {args:?} failed:\n{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    }

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

fn labels(secret: &Secret) -> BTreeMap<String, String> {
    secret.metadata.labels.clone().unwrap_or_default()
}

fn annotations(secret: &Secret) -> BTreeMap<String, String> {
    secret.metadata.annotations.clone().unwrap_or_default()
}

/// The `config` JSON of a cluster secret.
fn config(secret: &Secret) -> serde_json::Value {
    serde_json::from_str(&field(secret, "config")).unwrap()
}

/// A base64 `[]byte` field of the config's tlsClientConfig, decoded.
fn tls_field(config: &serde_json::Value, key: &str) -> String {
    let bytes: ByteString = serde_json::from_value(config["tlsClientConfig"][key].clone()).unwrap();
    String::from_utf8(bytes.0).unwrap()
}

fn der_of(pem: &str) -> Vec<u8> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    pem.contents
}

/// Keys fast enough for tests (upstream's default is RSA-4096).
const FAST: [&str; 2] = ["--key-algorithm", "ecdsa-p256"];

fn with_fast<'a>(args: &[&'a str]) -> Vec<&'a str> {
    [args, &FAST[..]].concat()
}

fn init(c: &Cluster) -> String {
    c.ok(&with_fast(&["pki", "init"]));
    field(&c.must_secret("argocd", "argocd-agent-ca"), "tls.crt")
}

#[test]
fn agent_create_writes_upstreams_cluster_secret() {
    let c = Cluster::start();

    // Without a CA there is nothing to issue the client certificate from.
    let err = c.fails(&with_fast(&["agent", "create", "agent-1"]));
    assert!(err.contains("CA is not initialized") && err.contains("pki init"), "{err}");

    let ca_pem = init(&c);
    let out = c.ok(&with_fast(&[
        "agent",
        "create",
        "agent-1",
        "-l",
        "env=prod",
        "--resource-proxy-server",
        "rp.example:9090",
    ]));
    assert!(out.contains("Agent agent-1 created") && out.contains("argocd/cluster-agent-1"), "{out}");

    let secret = c.must_secret("argocd", "cluster-agent-1");
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    assert_eq!(
        labels(&secret),
        BTreeMap::from([
            ("argocd.argoproj.io/secret-type".to_owned(), "cluster".to_owned()),
            ("argocd-agent.argoproj-labs.io/agent-name".to_owned(), "agent-1".to_owned()),
            ("env".to_owned(), "prod".to_owned()),
        ])
    );
    assert_eq!(
        annotations(&secret),
        BTreeMap::from([
            ("managed-by".to_owned(), "argocd-agent".to_owned()),
            ("argocd.argoproj.io/skip-reconcile".to_owned(), "true".to_owned()),
        ])
    );
    let keys: BTreeSet<_> = secret.data.as_ref().unwrap().keys().cloned().collect();
    assert_eq!(keys, BTreeSet::from(["config".to_owned(), "name".to_owned(), "server".to_owned()]));
    assert_eq!(field(&secret, "server"), "https://rp.example:9090?agentName=agent-1");
    assert_eq!(field(&secret, "name"), "agent-1");

    // config is Argo CD's ClusterConfig as Go marshals it: []byte fields in base64.
    let cfg = config(&secret);
    assert_eq!(cfg["tlsClientConfig"]["insecure"], false, "{cfg}");
    assert_eq!(tls_field(&cfg, "caData"), ca_pem);
    let cert_pem = tls_field(&cfg, "certData");
    let key_pem = tls_field(&cfg, "keyData");
    let der = der_of(&cert_pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let ca_der = der_of(&ca_pem);
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    cert.verify_signature(Some(ca.public_key())).expect("issued by the PKI's CA");
    assert_eq!(cert.subject().iter_common_name().next().unwrap().as_str().unwrap(), "agent-1");
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && !eku.server_auth);
    let days = cert.validity().time_to_expiration().unwrap().whole_days();
    assert!((179..=180).contains(&days), "valid for {days} days");
    let key = rcgen::KeyPair::from_pem(&key_pem).unwrap();
    assert_eq!(key.public_key_raw(), cert.public_key().subject_public_key.data.as_ref(), "key fits the cert");

    // A second create refuses and leaves the secret alone.
    let err = c.fails(&with_fast(&["agent", "create", "agent-1"]));
    assert!(err.contains("agent agent-1 exists") && err.contains("reconfigure"), "{err}");
    assert_eq!(
        field(&c.must_secret("argocd", "cluster-agent-1"), "server"),
        "https://rp.example:9090?agentName=agent-1"
    );

    // Bad names, addresses and labels are named; nothing is written.
    let err = c.fails(&with_fast(&["agent", "create", "Agent_2"]));
    assert!(err.contains("DNS-1123"), "{err}");
    let err = c.fails(&with_fast(&["agent", "create", "agent-2", "--resource-proxy-server", "no-port"]));
    assert!(err.contains("--resource-proxy-server"), "{err}");
    let err = c.fails(&with_fast(&["agent", "create", "agent-2", "-l", "novalue"]));
    assert!(err.contains("key=value"), "{err}");
    assert!(c.secret("argocd", "cluster-agent-2").is_none());

    // The default resource proxy address is upstream's; --days sets the validity.
    c.ok(&with_fast(&["agent", "create", "agent-2", "--days", "7"]));
    let secret = c.must_secret("argocd", "cluster-agent-2");
    assert_eq!(field(&secret, "server"), "https://argocd-agent-resource-proxy:9090?agentName=agent-2");
    let der = der_of(&tls_field(&config(&secret), "certData"));
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert!((6..=7).contains(&cert.validity().time_to_expiration().unwrap().whole_days()));
}

#[test]
fn agent_create_takes_tls_from_existing_secrets() {
    let c = Cluster::start();
    init(&c);
    // Material an operator already has: a client cert and a CA secret, here in namespace agents.
    c.ok(&with_fast(&["pki", "issue", "agent", "shared", "--same-context", "--agent-namespace", "agents"]));
    c.ok(&["pki", "propagate", "--agent-namespace", "agents"]);
    let tls = c.must_secret("agents", "argocd-agent-client-tls");

    let err = c.fails(&["agent", "create", "agent-3", "--tls-from-secret", "agents/argocd-agent-client-tls"]);
    assert!(err.contains("--ca-from-secret"), "both flags go together: {err}");
    let err = c.fails(&[
        "agent",
        "create",
        "agent-3",
        "--tls-from-secret",
        "agents/nope",
        "--ca-from-secret",
        "agents/argocd-agent-ca",
    ]);
    assert!(err.contains("agents/nope") && err.contains("--tls-from-secret"), "{err}");

    c.ok(&[
        "agent",
        "create",
        "agent-3",
        "--tls-from-secret",
        "agents/argocd-agent-client-tls",
        "--ca-from-secret",
        "agents/argocd-agent-ca",
    ]);
    let cfg = config(&c.must_secret("argocd", "cluster-agent-3"));
    assert_eq!(tls_field(&cfg, "certData"), field(&tls, "tls.crt"));
    assert_eq!(tls_field(&cfg, "keyData"), field(&tls, "tls.key"));
    assert_eq!(tls_field(&cfg, "caData"), field(&c.must_secret("agents", "argocd-agent-ca"), "ca.crt"));
}

#[test]
fn agent_list_inspect_and_print_tls() {
    let c = Cluster::start();
    let ca_pem = init(&c);
    let err = c.fails(&["agent", "list"]);
    assert!(err.contains("no agents found") && err.contains("agent create"), "{err}");

    c.ok(&with_fast(&["agent", "create", "agent-1", "-l", "env=prod"]));
    c.ok(&with_fast(&["agent", "create", "agent-2", "-l", "env=dev"]));
    let table = c.ok(&["agent", "list"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    for column in ["NAME", "SERVER", "AUTH", "CERT NOT AFTER", "SKIP-RECONCILE"] {
        assert!(lines[0].contains(column), "{table}");
    }
    assert!(
        lines[1].starts_with("agent-1 ") && lines[1].contains("client-cert") && lines[1].ends_with("true"),
        "{table}"
    );
    assert!(lines[2].starts_with("agent-2 "), "{table}");
    let filtered = c.ok(&["agent", "list", "-l", "env=prod"]);
    assert!(filtered.contains("agent-1") && !filtered.contains("agent-2"), "{filtered}");

    // inspect: upstream's fields plus subject, issuer, fingerprint.
    let json: serde_json::Value = serde_json::from_str(&c.ok(&["agent", "inspect", "agent-1"])).unwrap();
    assert_eq!(json["server"], "https://argocd-agent-resource-proxy:9090?agentName=agent-1");
    assert_eq!(json["name"], "agent-1");
    // The resource-proxy client mark (OU) is what tells this certificate from an agent's.
    assert_eq!(json["subject"], "OU=argocd-agent-resource-proxy-client,CN=agent-1,O=DO NOT USE IN PRODUCTION");
    assert_eq!(json["issuer"], "CN=argocd-agent-ca,O=DO NOT USE IN PRODUCTION");
    assert_eq!(json["skipReconcile"], true);
    assert_eq!(json["sha256"].as_str().unwrap().len(), 64);
    assert!(json["notValidBefore"].as_str().unwrap() < json["notValidAfter"].as_str().unwrap());
    assert_eq!(json["warnings"], serde_json::json!([]), "{json}");
    let text = c.ok(&["agent", "inspect", "agent-1", "-o", "text"]);
    assert!(
        text.contains("Server address") && text.contains("Not valid after") && text.contains("CN=agent-1"),
        "{text}"
    );
    let yaml: serde_json::Value = serde_yaml::from_str(&c.ok(&["agent", "show", "agent-1", "-o", "yaml"])).unwrap();
    assert_eq!(yaml["name"], "agent-1");
    let err = c.fails(&["agent", "inspect", "nope"]);
    assert!(err.contains("no such agent configured: nope"), "{err}");

    // print-tls prints the PEMs stored in the config.
    let cfg = config(&c.must_secret("argocd", "cluster-agent-1"));
    assert_eq!(c.ok(&["agent", "print-tls", "agent-1"]), tls_field(&cfg, "certData"));
    assert_eq!(c.ok(&["agent", "print-tls", "agent-1", "-t", "key"]), tls_field(&cfg, "keyData"));
    assert_eq!(c.ok(&["agent", "print-tls", "agent-1", "-t", "ca"]), ca_pem);

    // A cluster secret whose skip-reconcile annotation went missing shows up in list and inspect.
    let api: Api<Secret> = Api::namespaced(c.client.clone(), "argocd");
    let mut secret = c.must_secret("argocd", "cluster-agent-2");
    secret.metadata.annotations.as_mut().unwrap().remove("argocd.argoproj.io/skip-reconcile");
    c.rt.block_on(api.replace("cluster-agent-2", &PostParams::default(), &secret)).unwrap();
    assert!(c.ok(&["agent", "list"]).lines().nth(2).unwrap().ends_with("MISSING"));
    let json: serde_json::Value = serde_json::from_str(&c.ok(&["agent", "inspect", "agent-2"])).unwrap();
    assert_eq!(json["skipReconcile"], false);
    assert!(json["warnings"][0].as_str().unwrap().contains("skip-reconcile"), "{json}");
}

#[test]
fn agent_reconfigure_changes_only_what_is_asked() {
    let c = Cluster::start();
    init(&c);
    c.ok(&with_fast(&["agent", "create", "agent-1", "-l", "team=a"]));
    let before = c.must_secret("argocd", "cluster-agent-1");

    let out = c.ok(&["agent", "reconfigure", "agent-1"]);
    assert!(out.contains("Nothing to change"), "{out}");

    let out = c.ok(&["agent", "reconfigure", "agent-1", "--resource-proxy-server", "10.0.0.1:9443"]);
    assert!(out.contains("Cluster configuration saved"), "{out}");
    let after = c.must_secret("argocd", "cluster-agent-1");
    assert_eq!(field(&after, "server"), "https://10.0.0.1:9443?agentName=agent-1");
    assert_eq!(labels(&after), labels(&before), "labels kept");
    assert_eq!(annotations(&after), annotations(&before), "annotations kept");
    assert_eq!(config(&after), config(&before), "credentials kept");

    // A full URL is taken as given; credentials land in the config.
    c.ok(&[
        "agent",
        "reconfigure",
        "agent-1",
        "--resource-proxy-server",
        "https://proxy.example:443?agentName=agent-1",
        "--resource-proxy-username",
        "argocd",
        "--resource-proxy-password",
        "s3cret",
    ]);
    let after = c.must_secret("argocd", "cluster-agent-1");
    assert_eq!(field(&after, "server"), "https://proxy.example:443?agentName=agent-1");
    let cfg = config(&after);
    assert_eq!((cfg["username"].as_str(), cfg["password"].as_str()), (Some("argocd"), Some("s3cret")));
    assert_eq!(tls_field(&cfg, "certData"), tls_field(&config(&before), "certData"));

    // After a new CA, --reissue-client-cert issues from it and rewrites caData.
    c.ok(&with_fast(&["pki", "init", "--force"]));
    let new_ca = field(&c.must_secret("argocd", "argocd-agent-ca"), "tls.crt");
    c.ok(&with_fast(&["agent", "reconfigure", "agent-1", "--reissue-client-cert", "--days", "30"]));
    let cfg = config(&c.must_secret("argocd", "cluster-agent-1"));
    assert_eq!(tls_field(&cfg, "caData"), new_ca);
    assert_eq!(cfg["username"], "argocd", "other fields kept");
    let der = der_of(&tls_field(&cfg, "certData"));
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let ca_der = der_of(&new_ca);
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    cert.verify_signature(Some(ca.public_key())).expect("issued by the new CA");
    assert!((29..=30).contains(&cert.validity().time_to_expiration().unwrap().whole_days()));

    let err = c.fails(&["agent", "reconfigure", "nope", "--resource-proxy-server", "a:1"]);
    assert!(err.contains("no such agent configured: nope"), "{err}");
}

#[test]
fn version_prints_upstreams_json() {
    let c = Cluster::start();
    let out = c.ok(&["version"]);
    assert_eq!(out.lines().count(), 1, "{out}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["name"], "argocd-agent");
    assert_eq!(json["component"], "ctl");
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    let indented = c.ok(&["version", "--indent"]);
    assert!(indented.lines().count() > 3, "{indented}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&indented).unwrap(), json);
}
