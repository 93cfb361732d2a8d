//! `argocd-agentctl blocklist` against the embedded API server, through the real binary: the
//! ConfigMap `argocd-agent-tls-blocklist` it writes (upstream's keys for certificates, ours for
//! agent names, reasons as values), input validation, and lists.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

const CM: &str = "argocd-agent-tls-blocklist";
const FP: &str = "0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF";

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
        for ns in ["argocd", "hub-ns"] {
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

    fn config_map(&self, ns: &str) -> Option<ConfigMap> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        self.rt.block_on(api.get_opt(CM)).unwrap()
    }

    fn data(&self, ns: &str) -> BTreeMap<String, String> {
        self.config_map(ns).and_then(|cm| cm.data).unwrap_or_default()
    }

    fn put(&self, ns: &str, data: &[(&str, &str)]) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        let cm = ConfigMap {
            metadata: ObjectMeta { name: Some(CM.into()), ..ObjectMeta::default() },
            data: Some(data.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            ..ConfigMap::default()
        };
        self.rt.block_on(api.create(&PostParams::default(), &cm)).unwrap();
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

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// `FP` in lower case with `:` between bytes, as `openssl x509 -fingerprint` prints it (but lower).
fn colon_form() -> String {
    FP.as_bytes().chunks(2).map(|c| String::from_utf8_lossy(c).to_lowercase()).collect::<Vec<_>>().join(":")
}

#[test]
fn tls_entries_are_stored_in_upstreams_form() {
    let c = Cluster::start();
    assert_eq!(c.ok(&["blocklist", "tls", "list"]), "No entries in the blocklist.\n");
    assert!(c.config_map("argocd").is_none(), "listing does not create the ConfigMap");

    let out = c.ok(&["blocklist", "tls", "add", &colon_form(), "--reason", "key leaked"]);
    assert!(out.starts_with(&format!("Added to blocklist: {FP}\n")), "{out}");
    assert_eq!(c.data("argocd"), map(&[(FP, "key leaked")]));
    assert_eq!(c.ok(&["blocklist", "tls", "list"]), format!("FINGERPRINT\n{FP}\n"));

    // Again: nothing changes; a new reason replaces the old one.
    assert_eq!(c.ok(&["blocklist", "tls", "add", FP]), "Fingerprint already in blocklist.\n");
    assert_eq!(c.data("argocd"), map(&[(FP, "key leaked")]));
    let out = c.ok(&["blocklist", "tls", "add", &FP.to_lowercase(), "--reason", "rotated"]);
    assert!(out.starts_with("Updated the reason"), "{out}");
    assert_eq!(c.data("argocd"), map(&[(FP, "rotated")]));

    let out = c.ok(&["blocklist", "tls", "remove", &FP.to_lowercase()]);
    assert_eq!(out, format!("Removed from blocklist: {FP}\n"));
    assert!(c.data("argocd").is_empty());
    assert_eq!(c.ok(&["blocklist", "tls", "remove", FP]), "Fingerprint not found in blocklist.\n");
}

#[test]
fn agent_entries_and_the_full_list() {
    let c = Cluster::start();
    c.ok(&["blocklist", "agent", "add", "spoke-1", "--reason", "decommissioned"]);
    c.ok(&["blocklist", "tls", "add", FP]);
    assert_eq!(c.data("argocd"), map(&[(FP, ""), ("agent.spoke-1", "decommissioned")]));
    assert_eq!(c.ok(&["blocklist", "agent", "list"]), "AGENT\nspoke-1\n");
    assert_eq!(c.ok(&["blocklist", "tls", "list"]), format!("FINGERPRINT\n{FP}\n"), "tls list shows certificates only");

    let all = c.ok(&["blocklist", "list"]);
    let lines: Vec<&str> = all.lines().collect();
    assert_eq!(lines.len(), 3, "{all}");
    assert!(lines[0].starts_with("KIND") && lines[0].contains("ENTRY") && lines[0].ends_with("REASON"), "{all}");
    assert!(lines[1].starts_with("certificate") && lines[1].contains(FP), "{all}");
    assert!(lines[2].starts_with("agent") && lines[2].contains("spoke-1") && lines[2].ends_with("decommissioned"));
    let json: serde_json::Value = serde_json::from_str(&c.ok(&["blocklist", "list", "-o", "json"])).unwrap();
    assert_eq!(
        json,
        serde_json::json!([
            {"kind": "certificate", "entry": FP, "reason": ""},
            {"kind": "agent", "entry": "spoke-1", "reason": "decommissioned"},
        ])
    );

    assert_eq!(c.ok(&["blocklist", "agent", "remove", "spoke-1"]), "Removed from blocklist: agent.spoke-1\n");
    assert_eq!(c.ok(&["blocklist", "agent", "remove", "spoke-1"]), "Agent spoke-1 not found in blocklist.\n");
    assert_eq!(c.data("argocd"), map(&[(FP, "")]));
}

#[test]
fn invalid_input_is_refused_before_anything_is_written() {
    let c = Cluster::start();
    for (args, needle) in [
        (vec!["blocklist", "tls", "add", "0123"], "it has 4 hex digits"),
        (vec!["blocklist", "tls", "add", &FP[1..]], "it has 63 hex digits"),
        (vec!["blocklist", "tls", "add", &format!("{}Z", &FP[1..])], "'Z' at position 63 is not a hex digit"),
        (vec!["blocklist", "tls", "add", "01:2:34"], "two hex digits between separators"),
        (vec!["blocklist", "tls", "remove", "spoke-1"], "is not a SHA-256 certificate fingerprint"),
        (vec!["blocklist", "agent", "add", "Spoke_1"], "is not an agent name"),
        (vec!["blocklist", "agent", "add", "spoke-"], "starts or ends with '-'"),
        (vec!["blocklist", "agent", "remove", &"a".repeat(64)], "at most 63"),
    ] {
        let err = c.fails(&args);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert!(c.config_map("argocd").is_none());
}

#[test]
fn keys_written_by_others_and_the_principal_namespace() {
    let c = Cluster::start();
    // As upstream's argocd-agentctl would leave it if given a lower-case fingerprint, plus a key
    // the principal ignores.
    c.put("hub-ns", &[(&FP.to_lowercase(), ""), ("notes", "x")]);
    let ns = ["--principal-namespace", "hub-ns"];
    let out = c.ctl(&[&ns[..], &["blocklist", "list"]].concat());
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("\"notes\" is ignored by the principal"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(FP), "{}", text(&out));

    // Adding it again in another form finds the existing key; removing removes it.
    assert_eq!(c.ok(&[&ns[..], &["blocklist", "tls", "add", FP]].concat()), "Fingerprint already in blocklist.\n");
    let out = c.ok(&[&ns[..], &["blocklist", "tls", "remove", &colon_form()]].concat());
    assert_eq!(out, format!("Removed from blocklist: {}\n", FP.to_lowercase()));
    assert_eq!(c.data("hub-ns"), map(&[("notes", "x")]), "keys that are no entry are left alone");
    assert!(c.config_map("argocd").is_none(), "the default namespace was not touched");

    let err = c.fails(&["--principal-namespace", "missing", "blocklist", "agent", "add", "spoke-1"]);
    assert!(err.contains("ConfigMap missing/argocd-agent-tls-blocklist"), "{err}");
}
