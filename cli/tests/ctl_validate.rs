//! `argocd-agentctl validate principal|agent` against the embedded API server, through the real
//! binary: a complete installation passes; each thing operators get wrong (missing CA, server
//! certificate from another CA, agent certificate from another CA, expired or expiring
//! certificates, unparseable JWT key, cluster secret without the skip-reconcile annotation or the
//! agent-name label) is one FAIL (or WARN) line with a fix, and FAIL makes the exit status non-zero.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
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
        let c = Self { rt, server: Some(server), client, kubeconfig, _dir: dir };
        for ns in ["argocd", "agents", "other"] {
            c.namespace(ns);
        }
        c
    }

    fn namespace(&self, name: &str) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let object = Namespace {
            metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
            ..Namespace::default()
        };
        self.rt.block_on(namespaces.create(&PostParams::default(), &object)).unwrap();
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

    /// Run `validate ...`, require it to pass; returns stdout.
    fn passes(&self, args: &[&str]) -> String {
        let out = self.ok(&[&["validate"][..], args].concat());
        assert!(!out.lines().any(|l| l.starts_with("FAIL")), "{out}");
        out
    }

    /// Run `validate ...`, require it to fail; returns stdout.
    fn flags(&self, args: &[&str]) -> String {
        let out = self.ctl(&[&["validate"][..], args].concat());
        assert!(!out.status.success(), "validate {args:?} should fail:\n{}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("validation failed"), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    fn secret(&self, ns: &str, name: &str) -> Secret {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        self.rt.block_on(api.get(name)).unwrap()
    }

    fn replace(&self, secret: &Secret) {
        let ns = secret.metadata.namespace.as_deref().unwrap();
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        self.rt
            .block_on(api.replace(secret.metadata.name.as_deref().unwrap(), &PostParams::default(), secret))
            .unwrap();
    }

    fn create(&self, ns: &str, secret: Secret) {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        self.rt.block_on(api.create(&PostParams::default(), &secret)).unwrap();
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

/// The lines of `out` with this status.
fn lines<'a>(out: &'a str, status: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.split_whitespace().next() == Some(status)).collect()
}

/// The one line with `status` that contains `needle`.
fn line<'a>(out: &'a str, status: &str, needle: &str) -> &'a str {
    let found: Vec<&str> = lines(out, status).into_iter().filter(|l| l.contains(needle)).collect();
    assert_eq!(found.len(), 1, "one {status} line with {needle:?} expected in:\n{out}");
    found[0]
}

fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
        data: Some(data.iter().map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec()))).collect()),
        ..Secret::default()
    }
}

fn field(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

/// Keys fast enough for tests (upstream's default is RSA-4096).
const FAST: [&str; 2] = ["--key-algorithm", "ecdsa-p256"];

fn with_fast<'a>(args: &[&'a str]) -> Vec<&'a str> {
    [args, &FAST[..]].concat()
}

/// A JWT secret with an RSA-2048 key (`jwt create-key` makes 4096 bits, slow in debug builds).
fn jwt_secret() -> Secret {
    use rsa::pkcs8::EncodePrivateKey as _;
    let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).unwrap();
    let pem = key.to_pkcs8_pem(rsa::pkcs8::LineEnding::LF).unwrap();
    secret("argocd-agent-jwt", &[("jwt.key", pem.as_str())])
}

/// A complete principal installation in namespace argocd with one agent, agent-1, whose own
/// secrets are in namespace agents.
fn install(c: &Cluster) {
    c.ok(&with_fast(&["pki", "init"]));
    c.ok(&with_fast(&["pki", "issue", "principal", "--dns", "principal.example"]));
    c.ok(&with_fast(&["pki", "issue", "resource-proxy", "--dns", "argocd-agent-resource-proxy"]));
    c.create("argocd", jwt_secret());
    c.ok(&with_fast(&["agent", "create", "agent-1"]));
    c.ok(&with_fast(&["pki", "issue", "agent", "agent-1", "--same-context", "--agent-namespace", "agents"]));
    c.ok(&["pki", "propagate", "--agent-namespace", "agents"]);
    c.namespace("agent-1");
}

#[test]
fn a_complete_installation_passes() {
    let c = Cluster::start();
    install(&c);
    let out = c.passes(&["principal"]);
    for needle in [
        "CA secret argocd/argocd-agent-ca",
        "principal gRPC TLS secret argocd/argocd-agent-principal-tls",
        "principal gRPC certificate chain",
        "resource proxy certificate validity",
        "JWT secret argocd/argocd-agent-jwt",
        "cluster secret argocd/cluster-agent-1 labels",
        "cluster secret argocd/cluster-agent-1 skip-reconcile",
        "cluster secret argocd/cluster-agent-1 server",
        "cluster secret argocd/cluster-agent-1 client certificate:",
        "cluster secret argocd/cluster-agent-1 caData",
        "Applications in argocd",
    ] {
        line(&out, "ok", needle);
    }
    assert!(lines(&out, "WARN").is_empty() && lines(&out, "skip").is_empty(), "{out}");

    let out = c.passes(&["agent", "--agent-namespace", "agents"]);
    for needle in [
        "agent CA secret agents/argocd-agent-ca",
        "agent trusts the principal's certificate",
        "agent client TLS secret agents/argocd-agent-client-tls",
        "agent identity",
        "agent client certificate chain",
        "principal namespace for agent agent-1",
        "principal cluster secret for agent agent-1",
    ] {
        line(&out, "ok", needle);
    }
    assert!(out.contains("Principal (") && out.contains("Agent ("), "{out}");

    // The agent's and the principal's secrets cannot be the same objects.
    let out = c.ctl(&["validate", "agent"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--agent-namespace"));
}

#[test]
fn an_empty_namespace_fails_with_fixes() {
    let c = Cluster::start();
    let out = c.flags(&["principal"]);
    assert!(line(&out, "FAIL", "CA secret argocd/argocd-agent-ca").contains("fix: run `argocd-agentctl pki init`"));
    assert!(line(&out, "FAIL", "principal gRPC TLS secret").contains("pki issue principal"));
    assert!(line(&out, "WARN", "resource proxy TLS secret").contains("pki issue resource-proxy"));
    assert!(line(&out, "FAIL", "JWT secret").contains("jwt create-key"));
    assert!(line(&out, "WARN", "cluster secrets in argocd").contains("agent create"));
    assert!(out.contains("failed"), "{out}");
}

#[test]
fn validate_agent_catches_a_ca_mismatch() {
    let c = Cluster::start();
    install(&c);
    // A second PKI (say, another principal's) issues the agent's certificate.
    c.ok(&with_fast(&["pki", "init", "--principal-namespace", "other"]));
    c.ok(&with_fast(&[
        "pki",
        "issue",
        "agent",
        "agent-1",
        "--same-context",
        "--principal-namespace",
        "other",
        "--agent-namespace",
        "agents",
        "--upsert",
    ]));
    let out = c.flags(&["agent", "--agent-namespace", "agents"]);
    let fail = line(&out, "FAIL", "agent client certificate chain");
    assert!(fail.contains("CA mismatch") && fail.contains("not signed by the principal's CA"), "{fail}");
    assert!(fail.contains("fix: reissue it") && fail.contains("pki issue agent agent-1 --upsert"), "{fail}");
    assert_eq!(lines(&out, "FAIL").len(), 1, "only the mismatch fails:\n{out}");
    // The principal alone is fine.
    c.passes(&["principal"]);
}

#[test]
fn validate_catches_missing_annotation_and_label_on_cluster_secrets() {
    let c = Cluster::start();
    install(&c);
    let mut cs = c.secret("argocd", "cluster-agent-1");
    cs.metadata.annotations.as_mut().unwrap().remove("argocd.argoproj.io/skip-reconcile");
    c.replace(&cs);
    // A hand-made cluster secret for agent-2, marked as argocd-agent's, without the agent-name label.
    let mut manual = c.secret("argocd", "cluster-agent-1");
    manual.metadata = ObjectMeta {
        name: Some("cluster-agent-2".into()),
        labels: Some(BTreeMap::from([("argocd.argoproj.io/secret-type".to_owned(), "cluster".to_owned())])),
        annotations: Some(BTreeMap::from([
            ("managed-by".to_owned(), "argocd-agent".to_owned()),
            ("argocd.argoproj.io/skip-reconcile".to_owned(), "true".to_owned()),
        ])),
        ..ObjectMeta::default()
    };
    manual.data.as_mut().unwrap().insert("server".into(), ByteString(b"https://rp:9090?agentName=agent-2".to_vec()));
    c.create("argocd", manual);

    let out = c.flags(&["principal"]);
    let fail = line(&out, "FAIL", "cluster-agent-1 skip-reconcile");
    assert!(fail.contains("missing"), "{fail}");
    assert!(
        fail.contains(
            "kubectl -n argocd annotate secret cluster-agent-1 --overwrite argocd.argoproj.io/skip-reconcile=true"
        ),
        "{fail}"
    );
    let fail = line(&out, "FAIL", "cluster-agent-2 labels");
    assert!(fail.contains("argocd-agent.argoproj-labs.io/agent-name is missing"), "{fail}");
    assert!(fail.contains("label secret cluster-agent-2 argocd-agent.argoproj-labs.io/agent-name=agent-2"), "{fail}");
    // agent-2's secret carries agent-1's client certificate: the CN does not name agent-2.
    assert!(line(&out, "FAIL", "cluster-agent-2 client certificate").contains("not the agent name \"agent-2\""));
    assert_eq!(lines(&out, "FAIL").len(), 3, "{out}");

    // An annotation set to anything but "true" does not count either.
    let mut cs = c.secret("argocd", "cluster-agent-1");
    cs.metadata.annotations.as_mut().unwrap().insert("argocd.argoproj.io/skip-reconcile".into(), "yes".into());
    c.replace(&cs);
    assert!(line(&c.flags(&["principal"]), "FAIL", "cluster-agent-1 skip-reconcile").contains("\"yes\""));
}

#[test]
fn validate_catches_foreign_server_certs_bad_jwt_keys_and_expiry() {
    let c = Cluster::start();
    install(&c);

    // A principal certificate expiring soon is a warning (an error with --strict).
    c.ok(&with_fast(&["pki", "issue", "principal", "--upsert", "--days", "10"]));
    let out = c.passes(&["principal"]);
    assert!(line(&out, "WARN", "principal gRPC certificate validity").contains("expires in"), "{out}");
    let out = c.ctl(&["validate", "principal", "--strict"]);
    assert!(!out.status.success(), "{}", text(&out));
    c.passes(&["principal", "--expiry-warning-days", "5"]);

    // An unparseable JWT key.
    let mut jwt = c.secret("argocd", "argocd-agent-jwt");
    jwt.data.as_mut().unwrap().insert("jwt.key".into(), ByteString(b"not a key".to_vec()));
    c.replace(&jwt);
    let out = c.flags(&["principal"]);
    assert!(line(&out, "FAIL", "JWT secret").contains("not a usable RSA or ECDSA P-256 key"), "{out}");
    c.replace(&{
        let mut fresh = jwt_secret();
        fresh.metadata = c.secret("argocd", "argocd-agent-jwt").metadata;
        fresh
    });

    // A new CA: every certificate the old one issued is now foreign.
    c.ok(&with_fast(&["pki", "init", "--force"]));
    let out = c.flags(&["principal"]);
    let fail = line(&out, "FAIL", "principal gRPC certificate chain");
    assert!(fail.contains("not signed by the CA") && fail.contains("pki issue principal --upsert"), "{fail}");
    line(&out, "FAIL", "resource proxy certificate chain");
    line(&out, "FAIL", "cluster-agent-1 client certificate:");
    line(&out, "FAIL", "cluster-agent-1 caData");
    let out = c.flags(&["agent", "--agent-namespace", "agents"]);
    assert!(line(&out, "FAIL", "agent client certificate chain").contains("CA mismatch"));
    line(&out, "ok", "agent trusts the principal's certificate");

    // An expired agent client certificate, signed by the current CA.
    let ca = c.secret("argocd", "argocd-agent-ca");
    let ca_key = rcgen::KeyPair::from_pem(&field(&ca, "tls.key")).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&field(&ca, "tls.crt"), &ca_key).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, "agent-1");
    params.not_before = time::OffsetDateTime::now_utc() - time::Duration::days(10);
    params.not_after = time::OffsetDateTime::now_utc() - time::Duration::days(1);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let mut tls = c.secret("agents", "argocd-agent-client-tls");
    let data = tls.data.as_mut().unwrap();
    data.insert("tls.crt".into(), ByteString(cert.pem().into_bytes()));
    data.insert("tls.key".into(), ByteString(key.serialize_pem().into_bytes()));
    c.replace(&tls);
    let out = c.flags(&["agent", "--agent-namespace", "agents"]);
    assert!(line(&out, "FAIL", "agent client certificate validity").contains("expired at"), "{out}");
    line(&out, "ok", "agent client certificate chain");
}

#[test]
fn applications_in_the_principal_namespace_fail() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let c = Cluster::start();
    install(&c);
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), "argocd", &resource);
    let mut app = DynamicObject::new("stray", &resource).within("argocd");
    let destination = serde_json::json!({"server": "https://kubernetes.default.svc"});
    app.data = serde_json::json!({"spec": {"project": "default", "destination": destination}});
    c.rt.block_on(api.create(&PostParams::default(), &app)).unwrap();
    let out = c.flags(&["principal"]);
    assert!(line(&out, "FAIL", "Applications in argocd").contains("(stray)"), "{out}");
    assert_eq!(lines(&out, "FAIL").len(), 1, "{out}");
}
