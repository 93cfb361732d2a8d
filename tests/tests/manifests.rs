//! The Istio overlays (`istio/principal` and `istio/agent-managed`, rendered by
//! kubectl's kustomize; `tests/tests/install.rs` dry-runs them on a real API server) and the
//! sidecar bootstraps (`envoy/*.yaml`) agree with the code's defaults and with each other: no
//! process is started, every YAML document is parsed and cross-checked. Settings are read where
//! the binary gets them: container args, or environment variables from the argocd-agent-params
//! ConfigMap.
//!
//! - the principal's `--auth` parses with [`auth::AuthMethodSpec::parse`] and fits the plaintext
//!   loopback listener the Deployment configures ([`auth::AuthMethodSpec::check_listener`]);
//! - the AuthorizationPolicy admits exactly identities the `--auth` SPIFFE policy maps to the agent
//!   `agent.yaml` runs, and neither the principal itself nor a gateway;
//! - the agent's heartbeat is at most a third of every idle timeout on the path (DestinationRule,
//!   Envoy `stream_idle_timeout`, [`mesh::MeshProfile::stream_idle_timeout`]);
//! - the identity header the principal reads is the one the sidecars set and the profile names;
//! - PeerAuthentication is STRICT; ports agree between Service, Sidecar, Deployment, DestinationRule,
//!   AuthorizationPolicy and the agent's flags;
//! - every `--auth '…'` example in the mesh docs parses.
//!
//! Failures name the file, the document and the field.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use auth::{AuthMethodSpec, MeshProfile};
use mesh::{SpiffeId, SpiffePolicy};
use serde::Deserialize as _;
use serde_yaml::Value;

/// The Istio overlays: the hub's and a spoke's.
const ISTIO_OVERLAYS: [&str; 2] = ["istio/principal", "istio/agent-managed"];
const XFCC: &str = "x-forwarded-client-cert";
const PRINCIPAL: &str = "argocd-agent-principal";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: cannot read: {e}"))
}

// === YAML documents ===

/// One YAML document of a file, after placeholders were rendered.
struct Doc {
    file: String,
    index: usize,
    value: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.value.get("kind").and_then(Value::as_str).unwrap_or("")
    }

    fn name(&self) -> &str {
        self.value.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("")
    }

    fn namespace(&self) -> &str {
        self.value.get("metadata").and_then(|m| m.get("namespace")).and_then(Value::as_str).unwrap_or("")
    }

    /// The value at a dotted path (`spec.ports.0.port`; numbers index sequences), if any.
    fn at(&self, path: &str) -> Option<&Value> {
        at(&self.value, path)
    }

    /// The value at `path`, or a panic naming file, document and field.
    fn field(&self, path: &str) -> &Value {
        self.at(path).unwrap_or_else(|| panic!("{self}: field {path} is missing"))
    }

    fn str(&self, path: &str) -> &str {
        self.field(path).as_str().unwrap_or_else(|| panic!("{self}: field {path} is not a string"))
    }

    fn u64(&self, path: &str) -> u64 {
        let v = self.field(path);
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap_or_else(|| panic!("{self}: field {path} is not a number: {v:?}"))
    }

    fn seq(&self, path: &str) -> &[Value] {
        self.field(path).as_sequence().map_or_else(|| panic!("{self}: field {path} is not a list"), Vec::as_slice)
    }
}

impl fmt::Display for Doc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (document {}", self.file, self.index + 1)?;
        if !self.kind().is_empty() {
            write!(f, ", {} {}/{}", self.kind(), self.namespace(), self.name())?;
        }
        f.write_str(")")
    }
}

fn at<'a>(mut value: &'a Value, path: &str) -> Option<&'a Value> {
    for key in path.split('.') {
        value = match key.parse::<usize>() {
            Ok(i) if value.is_sequence() => value.get(i)?,
            _ => value.get(key)?,
        };
    }
    Some(value)
}

/// Every `${NAME}` in `text`, outside comment lines.
fn placeholders(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let mut rest = line;
        while let Some(start) = rest.find("${") {
            let after = &rest[start + 2..];
            let end = after.find('}').unwrap_or(after.len());
            found.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    found
}

/// Parses every document of `dir/*.yaml` after replacing `${NAME}` by `render(NAME)`.
fn load(dir: &str, render: impl Fn(&str, &str) -> String) -> Vec<Doc> {
    let mut files: Vec<_> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("{dir}/: cannot list: {e}"))
        .map(|e| e.unwrap_or_else(|e| panic!("{dir}/: cannot list: {e}")).path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{dir}/ holds no .yaml file");
    let mut docs = Vec::new();
    for path in files {
        let file = format!("{dir}/{}", path.file_name().unwrap_or_default().to_string_lossy());
        let mut text = read(&file);
        for name in placeholders(&text) {
            text = text.replace(&format!("${{{name}}}"), &render(&file, &name));
        }
        let before = docs.len();
        for (index, de) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = Value::deserialize(de).unwrap_or_else(|e| panic!("{file} (document {}): {e}", index + 1));
            if !value.is_null() {
                docs.push(Doc { file: file.clone(), index, value });
            }
        }
        assert!(docs.len() > before, "{file}: no YAML document");
    }
    docs
}

/// The Istio overlays rendered, objects both contain (the namespace, the DestinationRule) once.
fn istio() -> Vec<Doc> {
    let mut docs: Vec<Doc> = Vec::new();
    for overlay in ISTIO_OVERLAYS {
        let file = (*overlay).to_owned();
        let text = tests::install::kustomize(overlay).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(placeholders(&text).is_empty(), "{file}: placeholders left: {:?}", placeholders(&text));
        for (index, de) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = Value::deserialize(de).unwrap_or_else(|e| panic!("{file} (document {}): {e}", index + 1));
            if !value.is_null() && !docs.iter().any(|d| d.value == value) {
                docs.push(Doc { file: file.clone(), index, value });
            }
        }
    }
    docs
}

/// The production value `envoy/README.md` gives a placeholder (last column of its table row).
fn envoy_production_value(name: &str) -> String {
    let readme = read("envoy/README.md");
    let row = readme
        .lines()
        .find(|l| l.starts_with(&format!("| `{name}` |")))
        .unwrap_or_else(|| panic!("envoy/README.md: the placeholder table has no row for `{name}`"));
    let cell = row.trim_end_matches('|').rsplit('|').next().unwrap_or_default().trim();
    cell.trim_matches('`').to_owned()
}

/// `envoy/*.yaml` with `${STREAM_IDLE_TIMEOUT}` at its production value and every other
/// placeholder as its own name (a valid YAML scalar; only the structure matters here).
fn envoy() -> Vec<Doc> {
    let idle = envoy_production_value("STREAM_IDLE_TIMEOUT");
    load("envoy", |_, name| if name == "STREAM_IDLE_TIMEOUT" { idle.clone() } else { name.to_owned() })
}

fn find<'a>(docs: &'a [Doc], kind: &str, name: &str) -> &'a Doc {
    let found: Vec<_> = docs.iter().filter(|d| d.kind() == kind && d.name() == name).collect();
    match found.as_slice() {
        [one] => one,
        [] => panic!("Istio overlays: no {kind} named {name}"),
        many => panic!("Istio overlays: {} {kind} documents named {name}", many.len()),
    }
}

fn only<'a>(docs: &'a [Doc], kind: &str) -> &'a Doc {
    let found: Vec<_> = docs.iter().filter(|d| d.kind() == kind).collect();
    match found.as_slice() {
        [one] => one,
        other => panic!("Istio overlays: expected exactly one {kind}, found {}", other.len()),
    }
}

// === Container arguments ===

/// The environment variable each flag the checks read comes from (`argocd-agent`'s own names).
const FLAG_ENV: [(&str, &str, &str); 14] = [
    ("principal", "--auth", "ARGOCD_PRINCIPAL_AUTH"),
    ("principal", "--insecure-plaintext", "ARGOCD_PRINCIPAL_INSECURE_PLAINTEXT"),
    ("principal", "--listen-host", "ARGOCD_PRINCIPAL_LISTEN_HOST"),
    ("principal", "--listen-port", "ARGOCD_PRINCIPAL_LISTEN_PORT"),
    ("principal", "--namespace", "ARGOCD_PRINCIPAL_NAMESPACE"),
    ("principal", "--allowed-namespaces", "ARGOCD_PRINCIPAL_ALLOWED_NAMESPACES"),
    ("agent", "--agent-name", "ARGOCD_AGENT_NAME"),
    ("agent", "--creds", "ARGOCD_AGENT_CREDS"),
    ("agent", "--heartbeat-interval", "ARGOCD_AGENT_HEARTBEAT_INTERVAL"),
    ("agent", "--server-address", "ARGOCD_AGENT_REMOTE_SERVER"),
    ("agent", "--server-port", "ARGOCD_AGENT_REMOTE_PORT"),
    ("agent", "--insecure-plaintext", "ARGOCD_AGENT_INSECURE_PLAINTEXT"),
    ("agent", "--agent-mode", "ARGOCD_AGENT_MODE"),
    ("agent", "--namespace", "ARGOCD_AGENT_NAMESPACE"),
];

/// The one container of a Deployment, its arguments and its environment (configMapKeyRef
/// resolved against the ConfigMaps of the same rendering, as the kubelet does).
struct Container<'a> {
    doc: &'a Doc,
    args: Vec<String>,
    env: std::collections::BTreeMap<String, String>,
}

impl<'a> Container<'a> {
    fn of(doc: &'a Doc, docs: &[Doc]) -> Self {
        assert_eq!(doc.kind(), "Deployment", "{doc}: not a Deployment");
        let containers = doc.seq("spec.template.spec.containers");
        assert_eq!(
            containers.len(),
            1,
            "{doc}: spec.template.spec.containers: expected one container (the sidecar is injected)"
        );
        let args = doc
            .seq("spec.template.spec.containers.0.args")
            .iter()
            .map(|a| {
                a.as_str()
                    .unwrap_or_else(|| panic!("{doc}: spec.template.spec.containers.0.args: {a:?} is not a string"))
                    .to_owned()
            })
            .collect();
        let deployment = serde_json::to_value(&doc.value).unwrap_or_else(|e| panic!("{doc}: {e}"));
        let configmaps: Vec<_> = docs
            .iter()
            // The ConfigMaps of the same cluster: hub and spoke both have argocd/argocd-agent-params.
            .filter(|d| d.kind() == "ConfigMap" && d.file == doc.file)
            .map(|d| serde_json::to_value(&d.value).unwrap_or_else(|e| panic!("{d}: {e}")))
            .collect();
        let env = tests::install::container_env(&deployment, &configmaps).unwrap_or_else(|e| panic!("{doc}: {e:#}"));
        Self { doc, args, env }
    }

    /// The command (`principal` or `agent`).
    fn command(&self) -> &str {
        self.args.first().map_or("", String::as_str)
    }

    /// The value of `flag` from the environment, if the container sets its variable.
    fn env_flag(&self, flag: &str) -> Option<String> {
        let (_, _, var) = FLAG_ENV.iter().find(|(c, f, _)| *c == self.command() && *f == flag)?;
        self.env.get(*var).cloned()
    }

    /// The value of `--flag` (`--flag=value` or `--flag value`), at most once.
    fn flag(&self, flag: &str) -> Option<String> {
        let mut values = Vec::new();
        let mut it = self.args.iter();
        while let Some(arg) = it.next() {
            if let Some(v) = arg.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
                values.push(v.to_owned());
            } else if arg == flag {
                values.push(it.next().cloned().unwrap_or_default());
            }
        }
        assert!(values.len() <= 1, "{}: container args: {flag} is given {} times", self.doc, values.len());
        let from_env = self.env_flag(flag);
        assert!(
            values.is_empty() || from_env.is_none(),
            "{}: {flag} is given both as an argument and in the environment",
            self.doc
        );
        values.pop().or(from_env)
    }

    fn required(&self, flag: &str) -> String {
        self.flag(flag).unwrap_or_else(|| panic!("{}: {flag} is set neither in args nor in the environment", self.doc))
    }

    fn switch(&self, flag: &str) -> bool {
        self.args.iter().any(|a| a == flag || *a == format!("{flag}=true"))
            || self.env_flag(flag).as_deref() == Some("true")
    }
}

// === Durations and globs ===

/// A Go or protobuf duration: `30s`, `3600s`, `1m30s`, `500ms`, `1h`.
fn duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0.0;
    let mut rest = t;
    while !rest.is_empty() {
        let n = rest.find(|c: char| !c.is_ascii_digit() && c != '.').ok_or(format!("{text:?}: no unit"))?;
        let (num, tail) = rest.split_at(n);
        let u = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
        let (unit, next) = tail.split_at(u);
        let n: f64 = num.parse().map_err(|_| format!("{text:?}: {num:?} is not a number"))?;
        total += n * match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(format!("{text:?}: unknown unit {unit:?}")),
        };
        rest = next;
    }
    Ok(Duration::from_secs_f64(total))
}

/// Glob with `*` and `?`, as `--allowed-namespaces`.
fn glob(pattern: &str, text: &str) -> bool {
    fn go(p: &[char], t: &[char]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some(('*', rest)) => (0..=t.len()).any(|i| go(rest, &t[i..])),
            Some(('?', rest)) => !t.is_empty() && go(rest, &t[1..]),
            Some((c, rest)) => t.first() == Some(c) && go(rest, &t[1..]),
        }
    }
    go(&pattern.chars().collect::<Vec<_>>(), &text.chars().collect::<Vec<_>>())
}

/// Istio's string match in `principals`: exact, `prefix*`, `*suffix` or `*`.
fn istio_match(pattern: &str, value: &str) -> bool {
    if pattern == "*" {
        true
    } else if let Some(prefix) = pattern.strip_suffix('*') {
        value.starts_with(prefix)
    } else if let Some(suffix) = pattern.strip_prefix('*') {
        value.ends_with(suffix)
    } else {
        pattern == value
    }
}

// === The pieces the tests share ===

struct Principal<'a> {
    deployment: &'a Doc,
    container: Container<'a>,
    spec: AuthMethodSpec,
    policy: SpiffePolicy,
    listen_port: u64,
}

fn principal(docs: &[Doc]) -> Principal<'_> {
    let deployment = find(docs, "Deployment", PRINCIPAL);
    let container = Container::of(deployment, docs);
    assert_eq!(
        container.args.first().map(String::as_str),
        Some("principal"),
        "{deployment}: args must start with `principal`"
    );
    let auth = container.required("--auth");
    let spec = AuthMethodSpec::parse(&auth).unwrap_or_else(|e| panic!("{deployment}: --auth {auth:?}: {e}"));
    let AuthMethodSpec::Xfcc { policy, .. } = &spec else {
        panic!("{deployment}: --auth {auth:?} is not an xfcc: method (the Istio manifests rely on the SPIFFE policy)")
    };
    let policy = policy.clone();
    let listen_port = container
        .flag("--listen-port")
        .map_or(8443, |p| p.parse().unwrap_or_else(|_| panic!("{deployment}: --listen-port {p:?} is not a port")));
    Principal { deployment, container, spec, policy, listen_port }
}

struct Agent<'a> {
    deployment: &'a Doc,
    container: Container<'a>,
    name: String,
    spiffe_id: SpiffeId,
}

fn agent(docs: &[Doc]) -> Agent<'_> {
    let deployments: Vec<_> = docs.iter().filter(|d| d.kind() == "Deployment" && d.name() != PRINCIPAL).collect();
    let [deployment] = deployments.as_slice() else {
        panic!("Istio overlays: expected one agent Deployment, found {}", deployments.len())
    };
    let container = Container::of(deployment, docs);
    assert_eq!(container.args.first().map(String::as_str), Some("agent"), "{deployment}: args must start with `agent`");
    let name = container.required("--agent-name");
    let sa = deployment.str("spec.template.spec.serviceAccountName");
    assert_eq!(sa, name, "{deployment}: spec.template.spec.serviceAccountName must be the agent name (--agent-name)");
    let account = find(docs, "ServiceAccount", sa);
    assert_eq!(account.namespace(), deployment.namespace(), "{account}: must be in the agent's namespace");
    let id = format!("spiffe://{}/ns/{}/sa/{sa}", MeshProfile::DEFAULT_TRUST_DOMAIN, deployment.namespace());
    let spiffe_id = SpiffeId::parse(&id).unwrap_or_else(|e| panic!("{deployment}: SPIFFE ID {id}: {e}"));
    Agent { deployment, container, name, spiffe_id }
}

// === Tests ===

#[test]
fn every_document_parses_and_envoy_placeholders_are_documented() {
    let docs = istio();
    for doc in &docs {
        for key in ["apiVersion", "kind", "metadata.name"] {
            doc.str(key);
        }
    }
    let kinds: Vec<_> = docs.iter().map(Doc::kind).collect();
    for kind in [
        "Namespace",
        "PeerAuthentication",
        "AuthorizationPolicy",
        "DestinationRule",
        "Sidecar",
        "ServiceAccount",
        "Service",
        "Deployment",
    ] {
        assert!(kinds.contains(&kind), "Istio overlays: no {kind} document");
    }

    let envoy_docs = envoy();
    let envoy_readme = read("envoy/README.md");
    for doc in &envoy_docs {
        doc.field("static_resources.listeners");
        for name in placeholders(&read(&doc.file)) {
            assert!(
                envoy_readme.contains(&format!("`{name}`")),
                "{doc}: placeholder ${{{name}}} has no row in envoy/README.md's placeholder table"
            );
        }
    }
}

#[test]
fn principal_auth_parses_and_fits_the_plaintext_loopback_listener() {
    let docs = istio();
    let p = principal(&docs);
    let d = p.deployment;
    assert!(
        p.container.switch("--insecure-plaintext"),
        "{d}: --insecure-plaintext is missing: the sidecar terminates mTLS"
    );
    p.spec.check_listener(true).unwrap_or_else(|e| panic!("{d}: --auth does not fit a plaintext listener: {e}"));
    assert_eq!(
        p.container.required("--listen-host"),
        "127.0.0.1",
        "{d}: --listen-host must be 127.0.0.1 (plaintext reachable from the pod's sidecar only)"
    );
    let AuthMethodSpec::Xfcc { profile, trusted_hops, .. } = &p.spec else { unreachable!("checked in principal()") };
    assert_eq!(*profile, MeshProfile::Istio, "{d}: --auth must use profile=istio");
    let hops = p.spec.trusted_hops().expect("header methods have hops");
    assert!(hops.is_trusted([127, 0, 0, 1].into()), "{d}: --auth trusted-hops must include 127.0.0.1 (the sidecar)");
    assert!(
        hops.networks().iter().all(|n| n.addr().is_loopback()),
        "{d}: --auth trusted-hops {trusted_hops:?}: only loopback (the sidecar in the pod) may be trusted here"
    );
    assert!(p.policy.denied_namespaces().contains("istio-system"), "{d}: --auth must deny istio-system (gateways)");
    let ns = d.namespace();
    assert_eq!(p.container.required("--namespace"), ns, "{d}: --namespace must be the Deployment's namespace");
    assert!(
        !p.container.required("--allowed-namespaces").is_empty(),
        "{d}: --allowed-namespaces is empty: no agent could connect"
    );
}

#[test]
fn identity_header_agrees_between_principal_profile_and_envoy() {
    let docs = istio();
    let p = principal(&docs);
    let AuthMethodSpec::Xfcc { header, profile, .. } = &p.spec else { unreachable!("checked in principal()") };
    assert_eq!(header.as_str(), XFCC, "{}: --auth reads {header}, Istio's sidecar sets {XFCC}", p.deployment);
    assert_eq!(profile.identity_header().name(), XFCC, "mesh::MeshProfile::Istio: identity header");
    assert_eq!(MeshProfile::Envoy.identity_header().name(), XFCC, "mesh::MeshProfile::Envoy: identity header");

    for doc in envoy() {
        for hcm in hcms(&doc.value) {
            let mode = hcm.get("forward_client_cert_details").and_then(Value::as_str).unwrap_or("SANITIZE");
            if doc.file.contains("principal") {
                assert_eq!(
                    mode, "SANITIZE_SET",
                    "{doc}: forward_client_cert_details: the principal sidecar must replace {XFCC} with its own element"
                );
                let uri = at(hcm, "set_current_client_cert_details.uri").and_then(Value::as_bool);
                assert_eq!(uri, Some(true), "{doc}: set_current_client_cert_details.uri must be true: xfcc: reads URI");
            } else {
                assert_eq!(mode, "SANITIZE", "{doc}: forward_client_cert_details: the agent sidecar must strip {XFCC}");
            }
        }
    }

    // Every `--auth '...'` example in the mesh docs parses and fits a plaintext listener.
    for file in ["envoy/README.md", "docs/mesh/istio.md", "docs/mesh/envoy.md"] {
        let text = read(file);
        let mut examples = 0;
        for (i, _) in text.match_indices("--auth '") {
            let rest = &text[i + "--auth '".len()..];
            let value = &rest[..rest.find('\'').unwrap_or(rest.len())];
            let spec = AuthMethodSpec::parse(value).unwrap_or_else(|e| panic!("{file}: --auth '{value}': {e}"));
            spec.check_listener(true).unwrap_or_else(|e| panic!("{file}: --auth '{value}': {e}"));
            if let AuthMethodSpec::Xfcc { header, profile, .. } = &spec {
                assert_eq!(header.as_str(), XFCC, "{file}: --auth '{value}' reads {header}, the sidecars set {XFCC}");
                if *profile == MeshProfile::Istio {
                    assert_eq!(
                        spec.to_string(),
                        p.spec.to_string(),
                        "{file}: --auth '{value}' differs from {}'s --auth",
                        p.deployment
                    );
                }
            }
            examples += 1;
        }
        assert!(examples > 0, "{file}: no `--auth '...'` example of the principal's flags");
    }
}

/// The HTTP connection managers of an Envoy bootstrap.
fn hcms(value: &Value) -> Vec<&Value> {
    let mut found = Vec::new();
    walk(value, &mut |v| {
        if v.get("@type").and_then(Value::as_str).is_some_and(|t| t.ends_with(".HttpConnectionManager")) {
            found.push(v);
        }
    });
    assert!(!found.is_empty(), "no http_connection_manager");
    found
}

fn walk<'a>(value: &'a Value, f: &mut impl FnMut(&'a Value)) {
    f(value);
    match value {
        Value::Mapping(m) => m.values().for_each(|v| walk(v, f)),
        Value::Sequence(s) => s.iter().for_each(|v| walk(v, f)),
        _ => {}
    }
}

#[test]
fn authorization_policy_admits_exactly_agents_the_auth_policy_accepts() {
    let docs = istio();
    let p = principal(&docs);
    let a = agent(&docs);
    let ap = only(&docs, "AuthorizationPolicy");

    assert_eq!(ap.namespace(), p.deployment.namespace(), "{ap}: must be in the principal's namespace");
    assert_eq!(ap.str("spec.action"), "ALLOW", "{ap}: spec.action");
    let selector = ap.field("spec.selector.matchLabels");
    let labels = p.deployment.field("spec.template.metadata.labels");
    for (k, v) in selector.as_mapping().expect("matchLabels is a map") {
        assert_eq!(labels.get(k), Some(v), "{ap}: spec.selector.matchLabels {k:?} does not select {}", p.deployment);
    }
    let rules = ap.seq("spec.rules");
    assert_eq!(rules.len(), 1, "{ap}: spec.rules: expected one rule (agents to the gRPC port)");
    let sources = at(&rules[0], "from").and_then(Value::as_sequence).expect("spec.rules.0.from");
    let mut principals = Vec::new();
    for source in sources {
        let source = source.get("source").unwrap_or_else(|| panic!("{ap}: spec.rules.0.from: entry without source"));
        let keys: Vec<_> = source.as_mapping().expect("source is a map").keys().filter_map(Value::as_str).collect();
        assert_eq!(
            keys,
            ["principals"],
            "{ap}: spec.rules.0.from.source: only `principals` (SPIFFE identities) may admit callers"
        );
        for pr in source["principals"].as_sequence().expect("principals is a list") {
            principals.push(pr.as_str().expect("principal is a string").to_owned());
        }
    }
    assert!(!principals.is_empty(), "{ap}: spec.rules.0.from.source.principals is empty");

    for pr in &principals {
        assert!(
            !(pr.starts_with('*') || pr.ends_with("/*")),
            "{ap}: principal {pr:?} admits every ServiceAccount of a namespace or trust domain; list agents"
        );
        // A prefix wildcard (`.../sa/agent-*`) stands for any agent with that prefix.
        let sample = pr.replace('*', "x");
        let id = SpiffeId::parse(&format!("spiffe://{sample}"))
            .unwrap_or_else(|e| panic!("{ap}: principal {pr:?} is not <trust-domain>/<path>: {e}"));
        let authorized = p.policy.authorize(&id).unwrap_or_else(|e| {
            panic!("{ap}: principal {pr:?} is refused by the principal's --auth policy ({}): {e}", p.deployment)
        });
        assert!(
            p.container.required("--allowed-namespaces").split(',').any(|g| glob(g.trim(), authorized.agent())),
            "{ap}: principal {pr:?} is agent {:?}, which {}'s --allowed-namespaces does not admit",
            authorized.agent(),
            p.deployment
        );
    }

    // The agent agent.yaml runs is admitted by both, under the name it gives.
    let istio_id = a.spiffe_id.istio_principal();
    assert!(
        principals.iter().any(|pr| istio_match(pr, &istio_id)),
        "{ap}: spec.rules.0.from.source.principals {principals:?} do not admit the agent of {} ({istio_id})",
        a.deployment
    );
    let authorized = p.policy.authorize(&a.spiffe_id).unwrap_or_else(|e| {
        panic!("{}: --auth refuses the agent of {} ({}): {e}", p.deployment, a.deployment, a.spiffe_id)
    });
    assert_eq!(
        authorized.agent(),
        a.name,
        "{}: --agent-name differs from the name the principal derives from {}",
        a.deployment,
        a.spiffe_id
    );

    // Neither the principal itself nor a gateway is admitted.
    let own = format!(
        "{}/ns/{}/sa/{}",
        MeshProfile::DEFAULT_TRUST_DOMAIN,
        p.deployment.namespace(),
        p.deployment.str("spec.template.spec.serviceAccountName")
    );
    let gateway =
        format!("{}/ns/istio-system/sa/istio-eastwestgateway-service-account", MeshProfile::DEFAULT_TRUST_DOMAIN);
    for other in [&own, &gateway] {
        assert!(
            !principals.iter().any(|pr| istio_match(pr, other)),
            "{ap}: principals admit {other}, which is no agent"
        );
    }
    let gateway_id = SpiffeId::parse(&format!("spiffe://{gateway}")).expect("gateway id");
    assert!(
        p.policy.authorize(&gateway_id).is_err(),
        "{}: --auth accepts a gateway identity ({gateway})",
        p.deployment
    );

    let ports: Vec<_> = at(&rules[0], "to.0.operation.ports")
        .and_then(Value::as_sequence)
        .unwrap_or_else(|| panic!("{ap}: spec.rules.0.to.0.operation.ports is missing: admit the gRPC port only"))
        .iter()
        .map(|v| v.as_str().map_or_else(|| v.as_u64().unwrap_or_default().to_string(), str::to_owned))
        .collect();
    assert_eq!(
        ports,
        [p.listen_port.to_string()],
        "{ap}: spec.rules.0.to.0.operation.ports must be the principal's gRPC port only"
    );
}

#[test]
fn heartbeat_is_at_most_a_third_of_every_idle_timeout() {
    let docs = istio();
    let a = agent(&docs);
    let text = a.container.required("--heartbeat-interval");
    let heartbeat = duration(&text).unwrap_or_else(|e| panic!("{}: --heartbeat-interval: {e}", a.deployment));
    assert!(
        !heartbeat.is_zero(),
        "{}: --heartbeat-interval is 0 (off): quiet streams would be reset by the mesh",
        a.deployment
    );

    let mut timeouts: Vec<(String, Duration)> = Vec::new();
    let dr = only(&docs, "DestinationRule");
    for (i, _) in dr.seq("spec.trafficPolicy.portLevelSettings").iter().enumerate() {
        let path = format!("spec.trafficPolicy.portLevelSettings.{i}.connectionPool.http.idleTimeout");
        let t = duration(dr.str(&path)).unwrap_or_else(|e| panic!("{dr}: {path}: {e}"));
        timeouts.push((format!("{dr}: {path}"), t));
    }
    let profile = MeshProfile::Istio.stream_idle_timeout().expect("the istio profile has an idle timeout");
    timeouts.push(("mesh::MeshProfile::Istio.stream_idle_timeout()".into(), profile));
    for doc in envoy() {
        for (i, hcm) in hcms(&doc.value).into_iter().enumerate() {
            let v = hcm.get("stream_idle_timeout").and_then(Value::as_str).unwrap_or_else(|| {
                panic!(
                    "{doc}: http_connection_manager #{}: stream_idle_timeout is missing (write it explicitly)",
                    i + 1
                )
            });
            let t = duration(v).unwrap_or_else(|e| panic!("{doc}: stream_idle_timeout: {e}"));
            assert_eq!(
                Some(t),
                MeshProfile::Envoy.stream_idle_timeout(),
                "{doc}: stream_idle_timeout (production value from envoy/README.md) differs from mesh::MeshProfile::Envoy"
            );
            timeouts.push((format!("{doc}: stream_idle_timeout"), t));
            // No route may put a deadline on the stream (Envoy's default is 15 s). Every entry of
            // every `routes` list that forwards (has a `route` action) is checked, and there must be
            // at least one: a config whose routes moved (RDS, a renamed key) must not pass unchecked.
            let mut routes = 0;
            walk(hcm, &mut |v| {
                let Some(entries) = v.get("routes").and_then(Value::as_sequence) else { return };
                for route in entries.iter().filter_map(|e| e.get("route")) {
                    routes += 1;
                    let t = route.get("timeout").and_then(Value::as_str).map(duration);
                    assert_eq!(
                        t,
                        Some(Ok(Duration::ZERO)),
                        "{doc}: http_connection_manager #{}: route timeout must be 0s (no deadline on the stream)",
                        i + 1
                    );
                }
            });
            assert!(
                routes > 0,
                "{doc}: http_connection_manager #{}: no route found under route_config.virtual_hosts.*.routes: \
                 the route timeout (must be 0s) cannot be checked",
                i + 1
            );
        }
    }
    for (what, timeout) in &timeouts {
        assert!(
            heartbeat * 3 <= *timeout,
            "{}: --heartbeat-interval {text} is more than a third of {what} ({timeout:?}): a lost heartbeat or two \
             would let the stream be closed as idle",
            a.deployment
        );
    }
    assert!(
        heartbeat <= MeshProfile::Istio.heartbeat_interval(),
        "{}: --heartbeat-interval {text} is above the istio profile's default {:?}",
        a.deployment,
        MeshProfile::Istio.heartbeat_interval()
    );
}

#[test]
fn peer_authentication_is_strict_in_the_principals_namespace() {
    let docs = istio();
    let p = principal(&docs);
    let pa = only(&docs, "PeerAuthentication");
    assert_eq!(pa.namespace(), p.deployment.namespace(), "{pa}: metadata.namespace must be the principal's namespace");
    assert_eq!(pa.str("spec.mtls.mode"), "STRICT", "{pa}: spec.mtls.mode");
    if let Some(levels) = pa.at("spec.portLevelMtls").and_then(Value::as_mapping) {
        for (port, level) in levels {
            assert_eq!(
                at(level, "mode").and_then(Value::as_str),
                Some("STRICT"),
                "{pa}: spec.portLevelMtls.{port:?}.mode"
            );
        }
    }
    let ns = find(&docs, "Namespace", pa.namespace());
    assert_eq!(ns.str("metadata.labels.istio-injection"), "enabled", "{ns}: metadata.labels.istio-injection");
    for doc in docs.iter().filter(|d| d.kind() == "Deployment") {
        assert_eq!(doc.namespace(), ns.name(), "{doc}: metadata.namespace must be the injected namespace");
    }
}

#[test]
fn ports_and_names_agree() {
    let docs = istio();
    let p = principal(&docs);
    let a = agent(&docs);
    let d = p.deployment;
    let svc = find(&docs, "Service", PRINCIPAL);
    let dr = only(&docs, "DestinationRule");
    let sidecar = only(&docs, "Sidecar");

    let ports = svc.seq("spec.ports");
    assert_eq!(ports.len(), 1, "{svc}: spec.ports: expected the gRPC port only");
    let port = svc.u64("spec.ports.0.port");
    let target = svc.u64("spec.ports.0.targetPort");
    let grpc = svc.at("spec.ports.0.appProtocol").and_then(Value::as_str) == Some("grpc")
        || svc.str("spec.ports.0.name").starts_with("grpc");
    assert!(grpc, "{svc}: spec.ports.0: appProtocol grpc (or a grpc- name) is needed for Istio to set {XFCC}");
    assert_eq!(target, p.listen_port, "{svc}: spec.ports.0.targetPort differs from {d}'s --listen-port");
    assert_eq!(
        d.u64("spec.template.spec.containers.0.ports.0.containerPort"),
        target,
        "{d}: containerPort differs from {svc}'s targetPort"
    );
    for (k, v) in svc.field("spec.selector").as_mapping().expect("selector is a map") {
        assert_eq!(
            d.field("spec.template.metadata.labels").get(k),
            Some(v),
            "{svc}: spec.selector {k:?} does not select {d}"
        );
    }

    // The Sidecar forwards the captured port to the principal's loopback listener.
    assert_eq!(
        sidecar.u64("spec.ingress.0.port.number"),
        target,
        "{sidecar}: spec.ingress.0.port.number differs from {svc}'s targetPort"
    );
    assert_eq!(
        sidecar.str("spec.ingress.0.defaultEndpoint"),
        format!("{}:{}", p.container.required("--listen-host"), p.listen_port),
        "{sidecar}: spec.ingress.0.defaultEndpoint must be {d}'s --listen-host:--listen-port"
    );
    for (k, v) in sidecar.field("spec.workloadSelector.labels").as_mapping().expect("labels") {
        assert_eq!(
            d.field("spec.template.metadata.labels").get(k),
            Some(v),
            "{sidecar}: spec.workloadSelector {k:?} does not select {d}"
        );
    }

    let fqdn = format!("{}.{}.svc.cluster.local", svc.name(), svc.namespace());
    assert_eq!(dr.str("spec.host"), fqdn, "{dr}: spec.host must be {svc}");
    assert_eq!(
        dr.u64("spec.trafficPolicy.portLevelSettings.0.port.number"),
        port,
        "{dr}: portLevelSettings port differs from {svc}'s port"
    );
    assert_eq!(dr.str("spec.trafficPolicy.portLevelSettings.0.tls.mode"), "ISTIO_MUTUAL", "{dr}: tls.mode");

    let server = a.container.required("--server-address");
    assert!(
        server == fqdn || server == svc.name(),
        "{}: --server-address {server} is not {svc} ({fqdn})",
        a.deployment
    );
    assert_eq!(
        a.container.required("--server-port"),
        port.to_string(),
        "{}: --server-port differs from {svc}'s port",
        a.deployment
    );
    assert!(
        a.container.switch("--insecure-plaintext"),
        "{}: --insecure-plaintext is missing: the sidecar adds mTLS",
        a.deployment
    );
    assert_eq!(
        a.container.required("--creds"),
        "header:",
        "{}: --creds must be header: (identity from the mesh)",
        a.deployment
    );
}

#[test]
fn helpers_behave() {
    assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(duration("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(duration("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
    assert!(duration("30").is_err() && duration("3d").is_err());
    assert!(glob("agent-*", "agent-1") && glob("a?c", "abc") && !glob("agent-*", "other"));
    assert!(istio_match("td/ns/a/sa/agent-*", "td/ns/a/sa/agent-1") && !istio_match("td/ns/a/sa/x", "td/ns/a/sa/y"));
    assert_eq!(placeholders("a: ${X}\n# ${Y}\nb: ${Z}-${W}"), ["X", "Z", "W"]);
}
