//! The install (issue 19): the Helm charts under `install/helm/` and the kustomize overlays under
//! `install/kustomize/`, checked by the tools and servers that consume them, not by reading YAML:
//!
//! - `helm lint --strict` and `helm template` of every chart with default and non-default values;
//!   upstream values of features not implemented here stop the rendering, naming the key;
//! - every rendering and every overlay through `kubectl apply --dry-run=server` on a real
//!   kube-apiserver with Istio's and the Prometheus Operator's CRDs installed;
//! - the RBAC both renderings produce is the RBAC in `install/rbac/`, which every realkube
//!   end-to-end test runs the principal and agents under, with and without the optional
//!   features (destination-based mapping, the resource proxy, namespace creation,
//!   self-registration);
//! - the resource proxy is opt-in in both charts and in kustomize, and turned on renders the same
//!   Service, container port and parameters either way;
//! - self-registration is opt-in in the principal chart and in kustomize, renders the same
//!   parameters and grant either way, and is refused without the resource proxy (by the chart
//!   when rendering, by the binary at start);
//! - the argocd-agent-params mapping is the same in the chart and in kustomize, and every
//!   environment variable it sets is one `argocd-agent` reads;
//! - upstream's default argocd-agent-params ConfigMap, with the edits docs/install.md lists,
//!   passes the binary's checks;
//! - `promtool test rules` on the charts' PrometheusRules; the dashboard and the alerts only name
//!   metrics the binaries export;
//! - the Helm renderings applied for real to a hub and a spoke control plane, the principal and
//!   a managed and an autonomous agent started from the rendered Deployments' environment (the
//!   ConfigMap read back from the API server) with their rendered ServiceAccounts' tokens,
//!   Applications crossing in both modes, and kubectl reaching the managed agent's cluster through
//!   the rendered resource proxy with the cluster secret `argocd-agentctl agent create` writes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};
use tests::apps::{apps, wait_object};
use tests::fixtures::application_without_finalizers;
use tests::install::{
    apply, container_args, container_env, documents, dry_run_server, find, helm, helm_template, install_addon_crds,
    kustomize, object_id, params_mapping, rbac_objects, try_helm_template,
};
use tests::kubectl::Kubectl;
use tests::realkube::RealCluster;
use tests::{ChildProcess, wait_for, workspace_binary, workspace_root};

const PRINCIPAL_CHART: &str = "argocd-agent-principal";
const AGENT_CHART: &str = "argocd-agent-agent";

/// Every chart rendering the tests check: (name, chart, namespace, values).
fn chart_renderings() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    vec![
        ("principal-default", PRINCIPAL_CHART, "argocd", json!({})),
        (
            "principal-everything-on",
            PRINCIPAL_CHART,
            "hub-system",
            json!({
                "principal": {
                    "namespace": "argocd",
                    "allowedNamespaces": "agent-*,edge-?",
                    "namespaceCreate": {"enable": true},
                    "listen": {"host": "127.0.0.1", "port": 9443},
                    "log": {"level": "info,principal::service=debug", "format": "json"},
                    "tls": {"insecurePlaintext": true, "minVersion": "tls1.2"},
                    "auth": "xfcc:profile=istio;trust-domain=cluster.local;pattern=/ns/{namespace}/sa/{agent};namespaces=argocd",
                    "jwt": {"secretName": "my-jwt"},
                    "otlpAddress": "otel-collector.monitoring:4317",
                    "additionalArgs": ["--metrics-agent-retention=30m"],
                    "resourceProxy": {
                        "enabled": true,
                        "listenAddress": "0.0.0.0:9191",
                        "address": "argocd-agent-resource-proxy.hub-system:9090",
                        "timeout": "10s",
                        "maxInFlight": 16,
                    },
                    "selfRegistration": {"enabled": true, "clientCertSecret": "hub-self-registration-client"},
                },
                "service": {"type": "ClusterIP", "port": 8443, "annotations": {"example.com/x": "z"}},
                "image": {"repository": "registry.invalid/argocd-agent-rs", "tag": "v9", "pullPolicy": "Always"},
                "imagePullSecrets": [{"name": "pull"}],
                "podLabels": {"team": "platform"},
                "podAnnotations": {"example.com/a": "b"},
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "hub", "operator": "Exists", "effect": "NoSchedule"}],
                "priorityClassName": "system-cluster-critical",
                "spiffe": {"enabled": true},
                "extraEnv": [{"name": "NO_COLOR", "value": "1"}],
                "serviceAccount": {"annotations": {"example.com/role": "hub"}},
                "serviceMonitor": {"enabled": true, "additionalLabels": {"release": "prometheus"}},
                "prometheusRule": {"enabled": true, "certManager": {"enabled": true}},
                "grafanaDashboard": {"enabled": true},
                "configMapData": {"principal.min-agent-version": "0.9.0"},
            }),
        ),
        (
            "principal-no-rbac-no-extra-services",
            PRINCIPAL_CHART,
            "argocd",
            json!({
                "rbac": {"create": false, "createClusterRole": false},
                "serviceAccount": {"create": false, "name": "existing"},
                "metricsService": {"enabled": false},
                "healthzService": {"enabled": false},
                "probes": {"liveness": {"enabled": false}, "readiness": {"enabled": false}},
            }),
        ),
        ("agent-default", AGENT_CHART, "argocd", json!({"server": "principal.example.com"})),
        (
            "agent-managed",
            AGENT_CHART,
            "argocd",
            json!({"server": "principal.example.com", "agentMode": "managed", "serverPort": "8443"}),
        ),
        (
            "agent-everything-on",
            AGENT_CHART,
            "argocd-edge",
            json!({
                "server": "argocd-agent-principal.argocd.svc.cluster.local",
                "serverPort": "8443",
                "agentMode": "managed",
                "auth": "header:",
                "insecurePlaintext": true,
                "agentName": "edge-1",
                "heartbeatInterval": "30s",
                "logFormat": "json",
                "keepAliveInterval": "20s",
                "enableResourceProxy": true,
                "spiffe": {"enabled": true},
                "podLabels": {"sidecar.istio.io/inject": "true"},
                "serviceMonitor": {"enabled": true},
                "prometheusRule": {"enabled": true},
                "image": {"repository": "registry.invalid/argocd-agent-rs", "tag": "v9"},
            }),
        ),
    ]
}

/// Every overlay under `install/kustomize/` (every directory but `components/`).
/// Every kustomize overlay: the plain and SPIRE ones in `install/kustomize/` by name, the mesh
/// ones in `istio/` as `istio/<name>`.
fn overlays() -> Vec<String> {
    let under = |dir: &str, prefix: &str| -> Vec<String> {
        std::fs::read_dir(workspace_root().join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().to_string_lossy().into_owned();
                (e.path().join("kustomization.yaml").is_file()).then(|| format!("{prefix}{name}"))
            })
            .collect()
    };
    let mut names = under("install/kustomize", "");
    names.extend(under("istio", "istio/"));
    names.sort();
    names
}

fn kinds(docs: &[Value]) -> BTreeSet<String> {
    docs.iter().filter_map(|d| d["kind"].as_str().map(str::to_string)).collect()
}

// === Helm: lint and render ===

#[test]
fn charts_lint_strict_and_render_with_default_and_non_default_values() {
    for (name, chart, ns, values) in chart_renderings() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("values.yaml");
        std::fs::write(&file, serde_yaml::to_string(&values).expect("values")).expect("write values");
        let chart_path = tests::install::chart_dir(chart).display().to_string();
        let lint = helm(&["lint", "--strict", &chart_path, "--namespace", ns, "--values", &file.display().to_string()])
            .expect("helm");
        assert!(lint.ok, "{name}: helm lint --strict:\n{}{}", lint.stdout, lint.stderr);
        assert!(!lint.stdout.contains("[WARNING]"), "{name}: helm lint warns:\n{}", lint.stdout);

        let docs = documents(&helm_template(chart, ns, &values).expect("helm template")).expect("parse");
        let k = kinds(&docs);
        for kind in ["ServiceAccount", "ConfigMap", "Deployment", "Service"] {
            if name.contains("no-rbac") && kind == "ServiceAccount" {
                assert!(!k.contains(kind), "{name}: serviceAccount.create=false still renders a ServiceAccount");
                continue;
            }
            assert!(k.contains(kind), "{name}: no {kind} rendered: {k:?}");
        }
        for d in &docs {
            let doc_ns = d["metadata"]["namespace"].as_str();
            let cluster_scoped = matches!(d["kind"].as_str(), Some("ClusterRole" | "ClusterRoleBinding"));
            assert!(cluster_scoped || doc_ns.is_some(), "{name}: {} has no namespace", object_id(d));
        }
    }

    // What the non-default values switch on is there, and gone with the defaults.
    let on = documents(&helm_template(PRINCIPAL_CHART, "hub-system", &chart_renderings()[1].3).expect("render"))
        .expect("parse");
    let off = documents(&helm_template(PRINCIPAL_CHART, "argocd", &json!({})).expect("render")).expect("parse");
    for (kind, name) in [
        ("ServiceMonitor", "argocd-agent-principal"),
        ("PrometheusRule", "argocd-agent-principal"),
        ("ConfigMap", "argocd-agent-principal-dashboard"),
        ("ClusterRole", "argocd-agent-principal-namespace-create"),
        ("Service", "argocd-agent-resource-proxy"),
        ("Role", "argocd-agent-principal-self-registration"),
        ("RoleBinding", "argocd-agent-principal-self-registration"),
    ] {
        find(&on, kind, name).unwrap_or_else(|e| panic!("everything-on: {e}"));
        assert!(find(&off, kind, name).is_err(), "defaults render {kind} {name}, which is optional");
    }
    let no_rbac =
        documents(&helm_template(PRINCIPAL_CHART, "argocd", &chart_renderings()[2].3).expect("render")).expect("parse");
    assert!(rbac_objects(&no_rbac).is_empty(), "rbac.create=false still renders RBAC: {:?}", rbac_objects(&no_rbac));
    let d = find(&no_rbac, "Deployment", "argocd-agent-principal").expect("deployment");
    assert_eq!(d["spec"]["template"]["spec"]["serviceAccountName"], "existing");
}

#[test]
fn upstream_values_of_missing_features_stop_the_rendering_naming_the_key() {
    let cases = [
        (
            PRINCIPAL_CHART,
            json!({"principal": {"auth": "userpass:/app/config/userpass/passwd"}}),
            "principal.auth userpass:",
        ),
        (AGENT_CHART, json!({}), "server"),
    ];
    for (chart, values, key) in cases {
        let out = try_helm_template(chart, "argocd", &values).expect("helm");
        assert!(!out.ok, "{chart} with {values}: rendered, but argocd-agent-rs does not support it");
        assert!(out.stderr.contains(key), "{chart} with {values}: the error does not name {key}:\n{}", out.stderr);
    }
    // Upstream's own defaults for these keys are inert and render; so do upstream's resource
    // proxy values, on by default there (opt-in here).
    let upstream_defaults = json!({
        "principal": {"keepAlive": {"minInterval": "0"}, "pprof": {"port": "0"}, "eventProcessors": "10",
                      "redis": {"server": {"address": "argocd-redis:6379"}, "compressionType": "gzip"},
                      "resourceProxy": {"enabled": true, "secretName": "argocd-agent-resource-proxy-tls",
                                        "tls": {"certPath": "", "keyPath": ""},
                                        "ca": {"secretName": "argocd-agent-ca", "path": ""}},
                      "resourceProxyAddress": "argocd-agent-resource-proxy:9090"},
    });
    helm_template(PRINCIPAL_CHART, "argocd", &upstream_defaults).expect("upstream's inert defaults render");
    helm_template(
        AGENT_CHART,
        "argocd",
        &json!({"server": "p", "redisAddress": "argocd-redis:6379", "pprofPort": "0", "enableResourceProxy": true}),
    )
    .expect("upstream's inert defaults render");
}

// === The same RBAC everywhere ===

fn read_rbac(file: &str) -> BTreeMap<String, Value> {
    let path = workspace_root().join("install").join("rbac").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    rbac_objects(&documents(&text).unwrap_or_else(|e| panic!("parse: {e:#}")))
}

fn assert_same_rbac(what: &str, got: &BTreeMap<String, Value>, want: &BTreeMap<String, Value>) {
    let (g, w): (BTreeSet<_>, BTreeSet<_>) = (got.keys().collect(), want.keys().collect());
    assert_eq!(g, w, "{what}: not the same RBAC objects as install/rbac/");
    for (id, obj) in want {
        assert_eq!(&got[id], obj, "{what}: {id} grants something else than install/rbac/ (rules, roleRef or subjects)");
    }
}

/// `kubectl kustomize` of an overlay (as [`kustomize`] names it) with `components` of
/// `install/kustomize/components/`, composed the way an operator's overlay does it.
///
/// # Errors
/// kubectl fails (its stderr is in the error), or the overlay cannot be written.
fn kustomize_with_components(base: &str, components: &[&str]) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().canonicalize()?;
    // kustomize takes no absolute paths: reach the repository from the overlay's directory.
    let up = "../".repeat(root.components().count().saturating_sub(1));
    let relative = |p: PathBuf| -> anyhow::Result<String> {
        let p = p.canonicalize().with_context(|| p.display().to_string())?;
        Ok(format!("{up}{}", p.strip_prefix("/")?.display()))
    };
    let kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [relative(tests::install::kustomize_dir(base))?],
        "components": components
            .iter()
            .map(|c| relative(tests::install::kustomize_dir(&format!("components/{c}"))))
            .collect::<anyhow::Result<Vec<_>>>()?,
    });
    std::fs::write(root.join("kustomization.yaml"), serde_yaml::to_string(&kustomization)?)?;
    let out = Command::new(tests::bin_path::kubectl_path()?).arg("kustomize").arg(&root).output()?;
    if !out.status.success() {
        bail!("kubectl kustomize {base} + {components:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

#[test]
fn rendered_rbac_is_the_rbac_the_end_to_end_tests_run_under() {
    let principal = read_rbac("principal.yaml");
    let mut with_ns_create = principal.clone();
    with_ns_create.extend(read_rbac("principal-namespace-create.yaml"));
    let agent = read_rbac("agent.yaml");

    let render = |chart: &str, values: Value| {
        rbac_objects(&documents(&helm_template(chart, "argocd", &values).expect("render")).expect("parse"))
    };
    assert_same_rbac("helm principal (defaults)", &render(PRINCIPAL_CHART, json!({})), &principal);
    assert_same_rbac(
        "helm principal (namespaceCreate.enable)",
        &render(PRINCIPAL_CHART, json!({"principal": {"namespaceCreate": {"enable": true}}})),
        &with_ns_create,
    );
    for mode in ["managed", "autonomous"] {
        assert_same_rbac(
            &format!("helm agent ({mode})"),
            &render(AGENT_CHART, json!({"server": "p", "agentMode": mode})),
            &agent,
        );
    }
    let mut with_dbm = agent.clone();
    with_dbm.extend(read_rbac("agent-destination-mapping.yaml"));
    assert_same_rbac(
        "helm agent (destinationBasedMapping)",
        &render(AGENT_CHART, json!({"server": "p", "agentMode": "managed", "destinationBasedMapping": true})),
        &with_dbm,
    );
    let resource_proxy = read_rbac("agent-resource-proxy.yaml");
    let mut with_rp = agent.clone();
    with_rp.extend(resource_proxy.clone());
    for mode in ["managed", "autonomous"] {
        assert_same_rbac(
            &format!("helm agent ({mode}, enableResourceProxy)"),
            &render(AGENT_CHART, json!({"server": "p", "agentMode": mode, "enableResourceProxy": true})),
            &with_rp,
        );
    }
    let mut with_dbm_rp = with_dbm.clone();
    with_dbm_rp.extend(resource_proxy);
    assert_same_rbac(
        "helm agent (destinationBasedMapping, enableResourceProxy)",
        &render(
            AGENT_CHART,
            json!({"server": "p", "agentMode": "managed",
                   "destinationBasedMapping": true, "enableResourceProxy": true}),
        ),
        &with_dbm_rp,
    );
    // The principal's side of the resource proxy needs nothing beyond its Role (Secrets by name).
    assert_same_rbac(
        "helm principal (resourceProxy.enabled)",
        &render(PRINCIPAL_CHART, json!({"principal": {"resourceProxy": {"enabled": true}}})),
        &principal,
    );
    let from_kustomize =
        |overlay: &str| rbac_objects(&documents(&kustomize(overlay).expect("kustomize")).expect("parse"));
    assert_same_rbac("kustomize principal", &from_kustomize("principal"), &principal);
    assert_same_rbac("kustomize agent-managed", &from_kustomize("agent-managed"), &agent);
    assert_same_rbac("kustomize agent-autonomous", &from_kustomize("agent-autonomous"), &agent);
    let with_components = |base: &str, component: &str| {
        rbac_objects(&documents(&kustomize_with_components(base, &[component]).expect("kustomize")).expect("parse"))
    };
    for base in ["agent-managed", "agent-autonomous"] {
        assert_same_rbac(
            &format!("kustomize {base} + components/agent-resource-proxy"),
            &with_components(base, "agent-resource-proxy"),
            &with_rp,
        );
    }
    assert_same_rbac(
        "kustomize principal + components/principal-resource-proxy",
        &with_components("principal", "principal-resource-proxy"),
        &principal,
    );
    assert_same_rbac(
        "kustomize principal + components/principal-namespace-create",
        &with_components("principal", "principal-namespace-create"),
        &with_ns_create,
    );
    // Self-registration adds its own Role (Secrets create, update); it needs the proxy on.
    let mut with_self_registration = principal.clone();
    with_self_registration.extend(read_rbac("principal-self-registration.yaml"));
    assert_same_rbac(
        "helm principal (resourceProxy.enabled, selfRegistration.enabled)",
        &render(
            PRINCIPAL_CHART,
            json!({"principal": {"resourceProxy": {"enabled": true}, "selfRegistration": {"enabled": true}}}),
        ),
        &with_self_registration,
    );
    assert_same_rbac(
        "kustomize principal + components/principal-resource-proxy, principal-self-registration",
        &rbac_objects(
            &documents(
                &kustomize_with_components("principal", &["principal-resource-proxy", "principal-self-registration"])
                    .expect("kustomize"),
            )
            .expect("parse"),
        ),
        &with_self_registration,
    );

    // The mesh and SPIRE overlays only rename the agent's ServiceAccount (its SPIFFE ID names the
    // agent) and the principal's overlays add nothing: same rules.
    for overlay in overlays() {
        let got = from_kustomize(&overlay);
        let want = if overlay.trim_start_matches("istio/").starts_with("principal") || overlay == "istio/pattern1-hub" {
            &principal
        } else {
            &agent
        };
        let rules = |m: &BTreeMap<String, Value>| -> Vec<Value> { m.values().map(|o| o["rules"].clone()).collect() };
        assert_eq!(rules(&got), rules(want), "kustomize {overlay}: other RBAC rules than install/rbac/");
    }
}

// === The resource proxy ===

/// `data[key]` of the rendering's argocd-agent-params ConfigMap.
fn param(docs: &[Value], key: &str) -> Option<String> {
    let cm = find(docs, "ConfigMap", "argocd-agent-params").unwrap_or_else(|e| panic!("{e:#}"));
    cm["data"][key].as_str().map(str::to_string)
}

/// The principal container's port named `resource-proxy`.
fn resource_proxy_port(docs: &[Value]) -> Option<Value> {
    let d = find(docs, "Deployment", PRINCIPAL_CHART).unwrap_or_else(|e| panic!("{e:#}"));
    d["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .and_then(|ports| ports.iter().find(|p| p["name"] == "resource-proxy"))
        .cloned()
}

#[test]
fn resource_proxy_is_opt_in_and_renders_alike_in_the_charts_and_kustomize() {
    const SERVICE: &str = "argocd-agent-resource-proxy";
    let helm = |chart: &str, values: Value| -> Vec<Value> {
        documents(&helm_template(chart, "argocd", &values).expect("render")).expect("parse")
    };
    let kz = |overlay: &str| documents(&kustomize(overlay).expect("kustomize")).expect("parse");
    let kz_with = |base: &str, component: &str| {
        documents(&kustomize_with_components(base, &[component]).expect("kustomize")).expect("parse")
    };

    // The principal: off by default, saying so to the binary (unset would serve it whenever its
    // Secret exists); on, the Service Argo CD reaches (upstream's name and port) and the port.
    for (what, docs) in
        [("helm principal (defaults)", helm(PRINCIPAL_CHART, json!({}))), ("kustomize principal", kz("principal"))]
    {
        assert_eq!(param(&docs, "principal.resource-proxy.enable").as_deref(), Some("false"), "{what}");
        assert!(resource_proxy_port(&docs).is_none(), "{what}: a resource-proxy container port by default");
        assert!(find(&docs, "Service", SERVICE).is_err(), "{what}: the {SERVICE} Service by default");
    }
    let on = [
        (
            "helm principal (resourceProxy.enabled)",
            helm(PRINCIPAL_CHART, json!({"principal": {"resourceProxy": {"enabled": true}}})),
        ),
        ("kustomize principal + components/principal-resource-proxy", kz_with("principal", "principal-resource-proxy")),
    ];
    for (what, docs) in &on {
        assert_eq!(param(docs, "principal.resource-proxy.enable").as_deref(), Some("true"), "{what}");
        assert_eq!(
            resource_proxy_port(docs),
            Some(json!({"name": "resource-proxy", "containerPort": 9090, "protocol": "TCP"})),
            "{what}: the container port"
        );
        let svc = find(docs, "Service", SERVICE).unwrap_or_else(|e| panic!("{what}: {e:#}"));
        assert_eq!(svc["metadata"]["namespace"], "argocd", "{what}: {SERVICE}'s namespace");
        assert_eq!(
            svc["spec"]["ports"],
            json!([{"name": "resource-proxy", "port": 9090, "targetPort": "resource-proxy", "protocol": "TCP"}]),
            "{what}: {SERVICE}'s ports"
        );
        let d = find(docs, "Deployment", PRINCIPAL_CHART).expect("deployment");
        for (k, v) in svc["spec"]["selector"].as_object().expect("selector") {
            assert_eq!(
                &d["spec"]["template"]["metadata"]["labels"][k], v,
                "{what}: {SERVICE} does not select the principal"
            );
        }
    }

    // The chart's values reach the binary's variables, resolved as the kubelet does; the
    // container port follows the listen address, and upstream's resourceProxyAddress is honoured.
    let docs = helm(
        PRINCIPAL_CHART,
        json!({"principal": {"resourceProxy": {
            "enabled": true, "secretName": "rp-tls", "ca": {"secretName": "rp-ca"},
            "listenAddress": "127.0.0.1:9191", "address": "rp.hub.example:443", "timeout": "10s", "maxInFlight": 8,
        }}}),
    );
    let cm = find(&docs, "ConfigMap", "argocd-agent-params").expect("params").clone();
    let env = container_env(find(&docs, "Deployment", PRINCIPAL_CHART).expect("deployment"), &[cm]).expect("env");
    for (var, want) in [
        ("ARGOCD_PRINCIPAL_ENABLE_RESOURCE_PROXY", "true"),
        ("ARGOCD_PRINCIPAL_RESOURCE_PROXY_SECRET_NAME", "rp-tls"),
        ("ARGOCD_PRINCIPAL_RESOURCE_PROXY_CA_SECRET_NAME", "rp-ca"),
        ("ARGOCD_PRINCIPAL_RESOURCE_PROXY_LISTEN_ADDRESS", "127.0.0.1:9191"),
        ("ARGOCD_PRINCIPAL_RESOURCE_PROXY_ADDRESS", "rp.hub.example:443"),
        ("ARGOCD_PRINCIPAL_RESOURCE_PROXY_TIMEOUT", "10s"),
        ("ARGOCD_PRINCIPAL_RESOURCE_PROXY_MAX_IN_FLIGHT", "8"),
    ] {
        assert_eq!(env.get(var).map(String::as_str), Some(want), "{var}");
    }
    assert!(!env.contains_key("ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CERT_PATH"), "an empty value sets no variable");
    assert_eq!(resource_proxy_port(&docs).expect("port")["containerPort"], 9191, "the port of listenAddress");
    let docs = helm(PRINCIPAL_CHART, json!({"principal": {"resourceProxyAddress": "upstream.example:9090"}}));
    assert_eq!(param(&docs, "principal.resource-proxy.address").as_deref(), Some("upstream.example:9090"));
    let bad = try_helm_template(
        PRINCIPAL_CHART,
        "argocd",
        &json!({"principal": {"resourceProxy": {"enabled": true, "listenAddress": "nowhere"}}}),
    )
    .expect("helm");
    assert!(!bad.ok && bad.stderr.contains("principal.resourceProxy.listenAddress"), "{}", bad.stderr);

    // The agents: off by default, saying so (each proxied request is then answered 403
    // "disabled" instead of failing on RBAC); on with the value or the component.
    for (what, docs, want) in [
        ("helm agent (defaults)", helm(AGENT_CHART, json!({"server": "p"})), "false"),
        (
            "helm agent (enableResourceProxy)",
            helm(AGENT_CHART, json!({"server": "p", "enableResourceProxy": true})),
            "true",
        ),
        ("kustomize agent-managed", kz("agent-managed"), "false"),
        ("kustomize agent-autonomous", kz("agent-autonomous"), "false"),
        (
            "kustomize agent-managed + components/agent-resource-proxy",
            kz_with("agent-managed", "agent-resource-proxy"),
            "true",
        ),
    ] {
        assert_eq!(param(&docs, "agent.resource-proxy.enable").as_deref(), Some(want), "{what}");
    }
}

// === Self-registration ===

/// The data of the rendering's argocd-agent-params ConfigMap, with the metrics and health ports
/// off: the binary is started while other tests start it too.
fn params_data(docs: &[Value]) -> BTreeMap<String, String> {
    let cm = find(docs, "ConfigMap", "argocd-agent-params").unwrap_or_else(|e| panic!("{e:#}"));
    let mut data: BTreeMap<String, String> = cm["data"]
        .as_object()
        .unwrap_or_else(|| panic!("argocd-agent-params without data"))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_else(|| panic!("{k}: not a string")).to_string()))
        .collect();
    for key in ["principal.metrics.port", "principal.healthz.port"] {
        data.insert(key.to_string(), "0".to_string());
    }
    data
}

/// What `argocd-agent principal` says when started from the rendering's Deployment and params.
fn principal_says(docs: &[Value]) -> String {
    let data = params_data(docs);
    let data: BTreeMap<&str, &str> = data.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let deployment = find(docs, "Deployment", PRINCIPAL_CHART).unwrap_or_else(|e| panic!("{e:#}"));
    check_settings("principal", deployment, &data)
}

#[test]
fn self_registration_is_opt_in_needs_the_resource_proxy_and_renders_alike_in_the_chart_and_kustomize() {
    const ROLE: &str = "argocd-agent-principal-self-registration";
    const SECRET: &str = "argocd-agent-self-registration-client";
    let helm = |values: Value| -> Vec<Value> {
        documents(&helm_template(PRINCIPAL_CHART, "argocd", &values).expect("render")).expect("parse")
    };
    let kz_with = |components: &[&str]| {
        documents(&kustomize_with_components("principal", components).expect("kustomize")).expect("parse")
    };
    let both = json!({"principal": {"resourceProxy": {"enabled": true}, "selfRegistration": {"enabled": true}}});

    // Off by default, saying so; no Secret named, no grant. The resource proxy alone leaves it off.
    for (what, docs) in [
        ("helm principal (defaults)", helm(json!({}))),
        ("helm principal (resourceProxy.enabled)", helm(json!({"principal": {"resourceProxy": {"enabled": true}}}))),
        ("kustomize principal", documents(&kustomize("principal").expect("kustomize")).expect("parse")),
        ("kustomize principal + components/principal-resource-proxy", kz_with(&["principal-resource-proxy"])),
    ] {
        assert_eq!(param(&docs, "principal.self-registration.enabled").as_deref(), Some("false"), "{what}");
        assert_eq!(param(&docs, "principal.self-registration.client-cert-secret"), None, "{what}");
        for kind in ["Role", "RoleBinding"] {
            assert!(find(&docs, kind, ROLE).is_err(), "{what}: the {kind} {ROLE} by default");
        }
    }

    // On, with the resource proxy: the same parameters either way, resolved to the binary's
    // variables as the kubelet does, the grant, and a binary that takes them all (on to the
    // missing cluster, where it would read the client certificate's Secret).
    for (what, docs) in [
        ("helm principal (resourceProxy.enabled, selfRegistration.enabled)", helm(both.clone())),
        (
            "kustomize principal + components/principal-resource-proxy, principal-self-registration",
            kz_with(&["principal-resource-proxy", "principal-self-registration"]),
        ),
    ] {
        let cm = find(&docs, "ConfigMap", "argocd-agent-params").expect("params").clone();
        let env = container_env(find(&docs, "Deployment", PRINCIPAL_CHART).expect("deployment"), &[cm]).expect("env");
        for (var, want) in [
            ("ARGOCD_PRINCIPAL_ENABLE_SELF_CLUSTER_REGISTRATION", "true"),
            ("ARGOCD_PRINCIPAL_SELF_REGISTRATION_CLIENT_CERT_SECRET", SECRET),
            ("ARGOCD_PRINCIPAL_ENABLE_RESOURCE_PROXY", "true"),
        ] {
            assert_eq!(env.get(var).map(String::as_str), Some(want), "{what}: {var}");
        }
        for kind in ["Role", "RoleBinding"] {
            let o = find(&docs, kind, ROLE).unwrap_or_else(|e| panic!("{what}: {e:#}"));
            assert_eq!(o["metadata"]["namespace"], "argocd", "{what}: {kind} {ROLE} outside the principal's namespace");
        }
        let said = principal_says(&docs);
        assert!(!said.contains("error: --") && !said.contains("not supported yet"), "{what}: {said}");
        assert!(said.contains("/nonexistent/kubeconfig"), "{what}: stopped before reaching the cluster: {said}");
    }
    let docs = helm(json!({"principal": {"resourceProxy": {"enabled": true},
                                         "selfRegistration": {"enabled": true, "clientCertSecret": "mine"}}}));
    assert_eq!(param(&docs, "principal.self-registration.client-cert-secret").as_deref(), Some("mine"));

    // Without the resource proxy: the chart refuses to render, naming the value; kustomize cannot
    // refuse, so the component alone gives a principal that refuses to start, saying why.
    let out =
        try_helm_template(PRINCIPAL_CHART, "argocd", &json!({"principal": {"selfRegistration": {"enabled": true}}}))
            .expect("helm");
    assert!(!out.ok, "selfRegistration without the resource proxy rendered");
    assert!(
        out.stderr.contains("principal.selfRegistration.enabled needs principal.resourceProxy.enabled=true"),
        "the error does not say what is missing:\n{}",
        out.stderr
    );
    let out = try_helm_template(
        PRINCIPAL_CHART,
        "argocd",
        &json!({"principal": {"resourceProxy": {"enabled": true}, "selfRegistration": {"enabled": true, "clientCertSecret": ""}}}),
    )
    .expect("helm");
    assert!(!out.ok && out.stderr.contains("principal.selfRegistration.clientCertSecret"), "{}", out.stderr);
    let said = principal_says(&kz_with(&["principal-self-registration"]));
    assert!(
        said.contains("--enable-self-cluster-registration needs the resource proxy")
            && !said.contains("/nonexistent/kubeconfig"),
        "kustomize principal + components/principal-self-registration alone: {said}"
    );
}

// === The argocd-agent-params mapping ===

fn rendered_deployment(chart: &str, values: &Value) -> Value {
    let docs = documents(&helm_template(chart, "argocd", values).unwrap_or_else(|e| panic!("render: {e:#}")))
        .unwrap_or_else(|e| panic!("parse: {e:#}"));
    find(&docs, "Deployment", chart).unwrap_or_else(|e| panic!("deployment: {e:#}")).clone()
}

fn kustomize_deployment(overlay: &str, name: &str) -> Value {
    let docs = documents(&kustomize(overlay).unwrap_or_else(|e| panic!("kustomize: {e:#}")))
        .unwrap_or_else(|e| panic!("parse: {e:#}"));
    find(&docs, "Deployment", name).unwrap_or_else(|e| panic!("deployment: {e:#}")).clone()
}

#[test]
fn principal_replicas_share_the_agents_through_leases() {
    let env_of = |d: &Value| -> BTreeMap<String, Value> {
        let env = d["spec"]["template"]["spec"]["containers"][0]["env"].as_array().cloned().unwrap_or_default();
        env.into_iter().filter_map(|e| Some((e["name"].as_str()?.to_owned(), e))).collect()
    };
    let one = env_of(&rendered_deployment(PRINCIPAL_CHART, &json!({})));
    assert!(!one.contains_key("ARGOCD_PRINCIPAL_AGENT_LEASES"), "one replica: a lone principal");
    let three = rendered_deployment(PRINCIPAL_CHART, &json!({"replicaCount": 3}));
    assert_eq!(three["spec"]["replicas"], 3);
    let env = env_of(&three);
    assert_eq!(env["ARGOCD_PRINCIPAL_AGENT_LEASES"]["value"], "true");
    assert_eq!(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name", "the replica's name");
    assert!(!env.contains_key("POD_IP"), "no resource proxy: nothing to forward");
    // With the resource proxy, replicas forward requests for each other's agents.
    let forwarding = rendered_deployment(
        PRINCIPAL_CHART,
        &json!({"replicaCount": 2, "principal": {"resourceProxy": {"enabled": true}},
                "replicas": {"proxyServerName": "argocd-agent-resource-proxy"}}),
    );
    let env = env_of(&forwarding);
    assert_eq!(env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP", "where the owner is reached");
    assert_eq!(env["ARGOCD_PRINCIPAL_REPLICA_CLIENT_CERT_SECRET"]["value"], "argocd-agent-replica-client-tls");
    assert_eq!(env["ARGOCD_PRINCIPAL_REPLICA_PROXY_SERVER_NAME"]["value"], "argocd-agent-resource-proxy");
    // The flags the chart sets are the binary's.
    let said = help("principal");
    for flag in [
        "ARGOCD_PRINCIPAL_AGENT_LEASES",
        "--replica-name",
        "POD_IP",
        "ARGOCD_PRINCIPAL_REPLICA_CLIENT_CERT_SECRET",
        "ARGOCD_PRINCIPAL_REPLICA_PROXY_SERVER_NAME",
    ] {
        assert!(said.contains(flag), "argocd-agent principal --help does not say {flag}:\n{said}");
    }
}

/// `argocd-agent <command> --help`.
fn help(command: &str) -> String {
    let out = Command::new(workspace_binary("argocd-agent").unwrap_or_else(|e| panic!("argocd-agent: {e:#}")))
        .args([command, "--help"])
        .output()
        .unwrap_or_else(|e| panic!("run argocd-agent: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn params_mapping_agrees_between_chart_and_kustomize_and_the_binary_reads_every_variable() {
    for (chart, overlay, command, values) in [
        (PRINCIPAL_CHART, "principal", "principal", json!({})),
        (AGENT_CHART, "agent-managed", "agent", json!({"server": "p"})),
    ] {
        let helm_map = params_mapping(&rendered_deployment(chart, &values));
        let kustomize_map = params_mapping(&kustomize_deployment(overlay, chart));
        assert_eq!(helm_map, kustomize_map, "{chart}: the chart and install/kustomize/{overlay} map other keys");
        let keys: BTreeSet<_> = helm_map.iter().map(|(k, _)| k).collect();
        assert_eq!(keys.len(), helm_map.len(), "{chart}: a key is mapped twice");

        let help = help(command);
        for (key, env) in &helm_map {
            if help.contains(&format!("[env: {env}=")) {
                continue;
            }
            // Not in --help: a flag accepted for compatibility only. Setting it to a non-inert
            // value of its type must stop the binary, naming the flag, rather than be ignored.
            let refused = |value: &str| {
                let out = Command::new(workspace_binary("argocd-agent").expect("argocd-agent"))
                    .arg(command)
                    .env(env, value)
                    .env("ARGOCD_PRINCIPAL_NAMESPACE", "argocd")
                    .env("ARGOCD_PRINCIPAL_AUTH", "mtls:any")
                    .env("ARGOCD_AGENT_REMOTE_SERVER", "127.0.0.1")
                    .args(["--kubeconfig", "/nonexistent"])
                    .output()
                    .expect("run argocd-agent");
                let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                (!out.status.success() && stderr.contains("not supported yet"), stderr)
            };
            let (ok, stderr) =
                ["true", "7"].iter().map(|v| refused(v)).find(|(ok, _)| *ok).unwrap_or_else(|| refused("x"));
            assert!(
                ok,
                "{chart}: {key} sets {env}, which `argocd-agent {command}` neither lists nor refuses:\n{stderr}"
            );
        }
    }
}

/// Upstream's argocd-agent-params defaults (upstream's install/kubernetes manifests), as facts.
fn upstream_principal_params() -> Vec<(&'static str, &'static str)> {
    vec![
        ("principal.listen.host", ""),
        ("principal.listen.port", "8443"),
        ("principal.log.level", "info"),
        ("principal.metrics.port", "8000"),
        ("principal.healthz.port", "8003"),
        ("principal.namespace", "argocd"),
        ("principal.allowed-namespaces", ""),
        ("principal.namespace-create.enable", "false"),
        ("principal.namespace-create.pattern", ""),
        ("principal.namespace-create.labels", ""),
        ("principal.tls.secret-name", "argocd-agent-principal-tls"),
        ("principal.tls.server.cert-path", ""),
        ("principal.tls.server.key-path", ""),
        ("principal.tls.server.allow-generate", "false"),
        ("principal.tls.insecure-plaintext", "false"),
        ("principal.tls.client-cert.require", "false"),
        ("principal.tls.server.root-ca-secret-name", "argocd-agent-ca"),
        ("principal.tls.server.root-ca-path", ""),
        ("principal.tls.client-cert.match-subject", "false"),
        ("principal.resource-proxy.secret-name", "argocd-agent-resource-proxy-tls"),
        ("principal.resource-proxy.tls.cert-path", ""),
        ("principal.resource-proxy.tls.key-path", ""),
        ("principal.resource-proxy.ca.secret-name", "argocd-agent-ca"),
        ("principal.resource-proxy.ca.path", ""),
        ("principal.jwt.allow-generate", "false"),
        ("principal.jwt.secret-name", "argocd-agent-jwt"),
        ("principal.jwt.key-path", ""),
        ("principal.auth", "mtls:CN=([^,]+)"),
        ("principal.log.format", "text"),
        ("principal.websocket.enable", "false"),
        ("principal.redis.compression.type", "gzip"),
        ("principal.resource-proxy.enable", "true"),
        ("principal.keep-alive.min-interval", "0"),
        ("principal.pprof.port", "0"),
        ("principal.redis.server.address", "argocd-redis:6379"),
        ("principal.redis.tls.enabled", "true"),
    ]
}

fn upstream_agent_params() -> Vec<(&'static str, &'static str)> {
    vec![
        ("agent.mode", "autonomous"),
        ("agent.creds", "mtls:any"),
        ("agent.tls.insecure-plaintext", "false"),
        ("agent.tls.client.insecure", "false"),
        ("agent.tls.root-ca-secret-name", "argocd-agent-ca"),
        ("agent.tls.root-ca-path", ""),
        ("agent.tls.secret-name", "argocd-agent-client-tls"),
        ("agent.tls.client.cert-path", ""),
        ("agent.tls.client.key-path", ""),
        ("agent.tls.min-version", ""),
        ("agent.tls.max-version", ""),
        ("agent.tls.ciphersuites", ""),
        ("agent.log.level", "info"),
        ("agent.namespace", "argocd"),
        ("agent.server.address", "argocd-agent-principal.example.com"),
        ("agent.server.port", "443"),
        ("agent.metrics.port", "8181"),
        ("agent.healthz.port", "8002"),
        ("agent.log.format", "text"),
        ("agent.websocket.enable", "false"),
        ("agent.compression.enable", "false"),
        ("agent.keep-alive.interval", "0"),
        ("agent.pprof.port", "0"),
        ("agent.resource-proxy.enable", "true"),
        ("agent.redis.address", "argocd-redis:6379"),
        ("agent.destination-based-mapping", "false"),
        ("agent.create-namespace", "false"),
        ("agent.allowed-namespaces", ""),
    ]
}

/// Run `argocd-agent <command>` with the environment `deployment` builds from `data`; it never
/// reaches a cluster (the kubeconfig does not exist), so what it says is about its settings.
fn check_settings(command: &str, deployment: &Value, data: &BTreeMap<&str, &str>) -> String {
    let cm =
        json!({"kind": "ConfigMap", "metadata": {"name": "argocd-agent-params", "namespace": "argocd"}, "data": data});
    let env = container_env(deployment, &[cm]).unwrap_or_else(|e| panic!("resolve env: {e:#}"));
    let out = Command::new(workspace_binary("argocd-agent").unwrap_or_else(|e| panic!("argocd-agent: {e:#}")))
        .arg(command)
        .args(["--kubeconfig", "/nonexistent/kubeconfig"])
        .envs(&env)
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("run argocd-agent: {e}"));
    assert!(!out.status.success(), "{command} started without a cluster");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn upstream_params_configmap_works_verbatim() {
    let docs = std::fs::read_to_string(workspace_root().join("docs").join("install.md")).expect("docs/install.md");
    assert!(docs.contains("works unchanged"), "docs/install.md no longer says upstream's ConfigMap works unchanged");
    for (chart, command, keys) in
        [(PRINCIPAL_CHART, "principal", upstream_principal_params()), (AGENT_CHART, "agent", upstream_agent_params())]
    {
        let mut deployment = rendered_deployment(chart, &json!({"server": "p"}));
        deployment["metadata"]["namespace"] = json!("argocd");
        // As upstream ships it: past every check (every feature upstream turns on by default is
        // here), on to the (missing) cluster.
        let verbatim: BTreeMap<&str, &str> = keys.iter().copied().collect();
        let said = check_settings(command, &deployment, &verbatim);
        assert!(!said.contains("not supported yet") && !said.contains("error: invalid value"), "{chart}: {said}");
        assert!(said.contains("/nonexistent/kubeconfig"), "{chart}: stopped before reaching the cluster: {said}");
    }
}

// === Monitoring ===

#[test]
fn promtool_rule_unit_tests_pass_on_the_rendered_prometheus_rules() {
    let promtool = tests::bin_path::promtool_path().expect("promtool");
    for (chart, values, test_file) in [
        (
            PRINCIPAL_CHART,
            json!({"prometheusRule": {"enabled": true, "certManager": {"enabled": true}}}),
            "principal.rules.test.yaml",
        ),
        (AGENT_CHART, json!({"server": "p", "prometheusRule": {"enabled": true}}), "agent.rules.test.yaml"),
    ] {
        let docs = documents(&helm_template(chart, "argocd", &values).expect("render")).expect("parse");
        let rule = find(&docs, "PrometheusRule", chart).expect("PrometheusRule");
        let dir = tempfile::tempdir().expect("tempdir");
        let rules = dir.path().join("rules.yaml");
        std::fs::write(&rules, serde_yaml::to_string(&rule["spec"]).expect("yaml")).expect("write");
        let tests_src = tests::install::chart_dir(chart).join("rules-tests").join(test_file);
        std::fs::copy(&tests_src, dir.path().join(test_file)).expect("copy the rule tests");
        for args in [vec!["check", "rules", "rules.yaml"], vec!["test", "rules", test_file]] {
            let out = Command::new(&promtool).args(&args).current_dir(dir.path()).output().expect("run promtool");
            assert!(
                out.status.success(),
                "{chart}: promtool {}:\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let alerts: BTreeSet<&str> = rule["spec"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .filter_map(|r| r["alert"].as_str())
            .collect();
        let tested = std::fs::read_to_string(&tests_src).expect("read");
        for alert in alerts {
            assert!(tested.contains(&format!("alertname: {alert}")), "{chart}: alert {alert} has no promtool test");
        }
    }
}

/// Metric names in a PromQL expression (identifiers followed by `{`, `[`, `)` or space that look
/// like ours or upstream's).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut word = String::new();
    for c in expr.chars().chain([' ']) {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            if (word.starts_with("argocd_") || word.starts_with("principal_") || word.starts_with("agent_"))
                && word.contains('_')
                && !word.ends_with("_name")
                && word != "agent_mode"
            {
                names.insert(word.clone());
            }
            word.clear();
        }
    }
    names
}

#[test]
fn dashboard_and_alerts_name_only_metrics_the_binaries_export() {
    let reference = std::fs::read_to_string(workspace_root().join("docs").join("operations").join("metrics.md"))
        .expect("docs/operations/metrics.md");
    let exported = |name: &str| {
        let base = ["_bucket", "_sum", "_count"].iter().fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
        reference.contains(&format!("`{base}`"))
    };
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(tests::install::chart_dir(PRINCIPAL_CHART).join("files").join("dashboard.json"))
            .expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut exprs: Vec<(String, String)> = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().into_iter().flatten() {
            exprs.push((format!("dashboard panel {}", panel["title"]), t["expr"].as_str().unwrap_or_default().into()));
        }
    }
    assert!(exprs.len() >= 10, "the dashboard has only {} queries", exprs.len());
    for (chart, values) in [
        (PRINCIPAL_CHART, json!({"prometheusRule": {"enabled": true}})),
        (AGENT_CHART, json!({"server": "p", "prometheusRule": {"enabled": true}})),
    ] {
        let docs = documents(&helm_template(chart, "argocd", &values).expect("render")).expect("parse");
        let rule = find(&docs, "PrometheusRule", chart).expect("rule");
        for g in rule["spec"]["groups"].as_array().into_iter().flatten() {
            for r in g["rules"].as_array().into_iter().flatten() {
                exprs.push((format!("{chart} alert {}", r["alert"]), r["expr"].as_str().unwrap_or_default().into()));
            }
        }
    }
    for (what, expr) in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{what}: no metric of ours in {expr}");
        for name in names {
            assert!(exported(&name), "{what}: {name} is not a metric docs/operations/metrics.md lists");
        }
    }
    let promtool = tests::bin_path::promtool_path().expect("promtool");
    for (what, expr) in &exprs {
        let out =
            Command::new(&promtool).args(["query", "instant", "http://127.0.0.1:1", expr]).output().expect("promtool");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("parse error"), "{what}: {expr}: {err}");
    }
}

// === The real API server ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rendering_and_overlay_passes_server_side_dry_run() {
    let cluster = RealCluster::start().await.expect("control plane");
    install_addon_crds(&cluster).await.expect("Istio and Prometheus Operator CRDs");
    for ns in ["argocd", "hub-system", "argocd-edge"] {
        cluster.ensure_namespace(ns).await.expect("namespace");
    }
    let mut checked = Vec::new();
    for (name, chart, ns, values) in chart_renderings() {
        let yaml = helm_template(chart, ns, &values).expect("render");
        let out = dry_run_server(&cluster, &format!("helm-{name}"), &yaml).unwrap_or_else(|e| panic!("{e:#}"));
        let docs = documents(&yaml).expect("parse");
        assert_eq!(
            out.matches("(server dry run)").count(),
            docs.len(),
            "helm {name}: not every object was checked:\n{out}"
        );
        checked.push(format!("helm {name}: {}", docs.len()));
    }
    let overlays = overlays();
    for want in [
        "principal",
        "agent-managed",
        "agent-autonomous",
        "istio/principal",
        "istio/agent-managed",
        "istio/agent-autonomous",
        "principal-spire",
        "agent-managed-spire",
        "agent-autonomous-spire",
        "istio/pattern1-hub",
        "istio/pattern1-spoke",
    ] {
        assert!(overlays.iter().any(|o| o == want), "overlay {want} is missing (install/kustomize/ or istio/)");
    }
    for overlay in &overlays {
        let yaml = kustomize(overlay).expect("kustomize");
        let out = dry_run_server(&cluster, &format!("kustomize-{}", overlay.replace('/', "-")), &yaml)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let docs = documents(&yaml).expect("parse");
        assert_eq!(
            out.matches("(server dry run)").count(),
            docs.len(),
            "kustomize {overlay}: not every object:\n{out}"
        );
        checked.push(format!("kustomize {overlay}: {}", docs.len()));
    }
    for (base, components) in [
        ("principal", &["principal-resource-proxy"][..]),
        ("principal", &["principal-namespace-create"]),
        ("principal", &["principal-resource-proxy", "principal-self-registration"]),
        ("agent-managed", &["agent-resource-proxy"]),
    ] {
        let yaml = kustomize_with_components(base, components).expect("kustomize");
        let name = format!("kustomize-{base}-{}", components.join("-"));
        let out = dry_run_server(&cluster, &name, &yaml).unwrap_or_else(|e| panic!("{e:#}"));
        let docs = documents(&yaml).expect("parse");
        assert_eq!(out.matches("(server dry run)").count(), docs.len(), "{name}: not every object:\n{out}");
        checked.push(format!("{name}: {}", docs.len()));
    }
    // The dry-run refuses what the server would: a sanity check that it validates at all.
    let bad = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: x, namespace: argocd}\nspec: {action: NOT_AN_ACTION}\n";
    assert!(dry_run_server(&cluster, "bad", bad).is_err(), "the server accepted an invalid AuthorizationPolicy");
    eprintln!("dry-run on the real API server:\n  {}", checked.join("\n  "));
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap_or_else(|e| panic!("bind: {e:#}"))
        .local_addr()
        .unwrap_or_else(|e| panic!("addr: {e:#}"))
        .port()
}

/// A real control plane with Argo CD's CRDs.
async fn control_plane() -> RealCluster {
    let c = RealCluster::start().await.unwrap_or_else(|e| panic!("control plane: {e:#}"));
    c.install_argocd_crds().await.unwrap_or_else(|e| panic!("Argo CD CRDs: {e:#}"));
    c
}

/// Apply a Helm rendering of `chart` into `namespace` to `cluster`, for real; its objects.
async fn install(cluster: &RealCluster, chart: &str, namespace: &str, values: &Value) -> Vec<Value> {
    cluster.ensure_namespace(namespace).await.unwrap_or_else(|e| panic!("namespace: {e:#}"));
    let yaml = helm_template(chart, namespace, values).unwrap_or_else(|e| panic!("render: {e:#}"));
    apply(cluster, &format!("{chart}-{namespace}"), &yaml).unwrap_or_else(|e| panic!("apply the rendering: {e:#}"));
    documents(&yaml).unwrap_or_else(|e| panic!("parse: {e:#}"))
}

/// The process as the kubelet would start it from the rendering `docs`: the Deployment's args
/// and its environment with the ConfigMap read back from the API server, authenticated as the
/// rendered ServiceAccount (a TokenRequest token, as a pod's projected token).
async fn start(
    cluster: &RealCluster,
    docs: &[Value],
    chart: &str,
    namespace: &str,
    name: &str,
) -> anyhow::Result<ChildProcess> {
    let deployment = find(docs, "Deployment", chart)?;
    let cms: Api<DynamicObject> = Api::namespaced_with(
        cluster.client(),
        namespace,
        &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
    );
    let cm = serde_json::to_value(cms.get("argocd-agent-params").await?)?;
    let env = container_env(deployment, &[cm])?;
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"].as_str().context("no ServiceAccount")?;
    let kubeconfig = cluster.work_dir().join(format!("{name}.kubeconfig"));
    cluster.service_account_kubeconfig(namespace, sa, Duration::from_secs(3600), &kubeconfig).await?;
    let mut cmd = Command::new(workspace_binary("argocd-agent")?);
    cmd.args(container_args(deployment)).arg("--kubeconfig").arg(&kubeconfig).envs(&env).env("NO_COLOR", "1");
    for (k, _) in std::env::vars() {
        if k.starts_with("ARGOCD_") && !env.contains_key(&k) {
            cmd.env_remove(k);
        }
    }
    ChildProcess::spawn(name, cmd)
}

fn ctl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(workspace_binary("argocd-agentctl")?)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--principal-context", "hub"])
        .args(args)
        .output()?;
    if !out.status.success() {
        bail!("argocd-agentctl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// A kubeconfig with contexts `hub` and `spoke` (admin), for argocd-agentctl.
fn merged_kubeconfig(dir: &Path, hub: &RealCluster, spoke: &RealCluster) -> PathBuf {
    let read = |c: &RealCluster| -> Value {
        serde_yaml::from_str(
            &std::fs::read_to_string(c.kubeconfig_path()).unwrap_or_else(|e| panic!("kubeconfig: {e:#}")),
        )
        .unwrap_or_else(|e| panic!("yaml: {e:#}"))
    };
    let (h, s) = (read(hub), read(spoke));
    let part = |v: &Value, key: &str| v[key][0][key.trim_end_matches('s')].clone();
    let kc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "hub", "cluster": part(&h, "clusters")}, {"name": "spoke", "cluster": part(&s, "clusters")}],
        "users": [{"name": "hub", "user": part(&h, "users")}, {"name": "spoke", "user": part(&s, "users")}],
        "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "hub"}},
                     {"name": "spoke", "context": {"cluster": "spoke", "user": "spoke"}}],
        "current-context": "hub",
    });
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&kc).unwrap_or_else(|e| panic!("yaml: {e:#}")))
        .unwrap_or_else(|e| panic!("write: {e:#}"));
    path
}

/// A kubeconfig from agent `agent`'s cluster secret on the hub (namespace argocd), as Argo CD
/// reads it: `server` and `config.tlsClientConfig`.
async fn cluster_secret_kubeconfig(hub: &RealCluster, agent: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(hub.client(), "argocd");
    let data = secrets.get(&format!("cluster-{agent}")).await?.data.context("cluster secret without data")?;
    let text = |k: &str| -> anyhow::Result<String> {
        Ok(String::from_utf8(data.get(k).with_context(|| format!("no {k}"))?.0.clone())?)
    };
    let config: Value = serde_json::from_str(&text("config")?)?;
    let tls = &config["tlsClientConfig"];
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": agent, "cluster": {
            "server": text("server")?, "certificate-authority-data": tls["caData"]}}],
        "users": [{"name": agent, "user": {
            "client-certificate-data": tls["certData"], "client-key-data": tls["keyData"]}}],
        "contexts": [{"name": agent, "context": {"cluster": agent, "user": agent}}],
        "current-context": agent,
    });
    let path = dir.join(format!("{agent}-cluster.kubeconfig"));
    std::fs::write(&path, serde_json::to_string(&kubeconfig)?)?;
    Ok(path)
}

async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    tests::http::get(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), path).await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_install_runs_both_modes_under_its_own_rbac_and_params() {
    const START: Duration = Duration::from_secs(90);
    let (grpc, metrics, healthz, resource_proxy) = (free_port(), free_port(), free_port(), free_port());
    let principal_values = json!({
        "principal": {
            "listen": {"host": "127.0.0.1", "port": grpc},
            "metrics": {"port": metrics},
            "healthz": {"port": healthz},
            "allowedNamespaces": "agent-*",
            "log": {"level": "warn,cli=info", "format": "json"},
            "resourceProxy": {"enabled": true, "listenAddress": format!("127.0.0.1:{resource_proxy}")},
        },
    });
    let hub = control_plane().await;
    let hub_docs = install(&hub, PRINCIPAL_CHART, "argocd", &principal_values).await;
    let spoke = control_plane().await;
    let mut agents = Vec::new();
    for (agent, ns, mode) in
        [("agent-managed", "argocd", "managed"), ("agent-autonomous", "argocd-autonomous", "autonomous")]
    {
        let (m, h) = (free_port(), free_port());
        // The resource proxy on the managed agent only (both share the spoke, and the chart's
        // ClusterRoles are named after the release's full name).
        let values = json!({
            "server": "127.0.0.1", "serverPort": grpc.to_string(), "agentMode": mode,
            "metricsPort": m.to_string(), "healthzPort": h.to_string(), "logLevel": "info,agent=debug",
            "enableResourceProxy": mode == "managed",
        });
        let docs = install(&spoke, AGENT_CHART, ns, &values).await;
        agents.push((agent, ns, mode, h, m, docs));
    }

    // PKI and JWT key as an operator makes them, with argocd-agentctl as cluster admin.
    let dir = tempfile::tempdir().expect("tempdir");
    let kc = merged_kubeconfig(dir.path(), &hub, &spoke);
    ctl(&kc, &["pki", "init", "--key-algorithm", "ecdsa-p256"]).expect("pki init");
    ctl(
        &kc,
        &["pki", "issue", "principal", "--ip", "127.0.0.1", "--dns", "localhost", "--key-algorithm", "ecdsa-p256"],
    )
    .expect("pki issue principal");
    ctl(&kc, &["pki", "issue", "resource-proxy", "--ip", "127.0.0.1", "--key-algorithm", "ecdsa-p256"])
        .expect("pki issue resource-proxy");
    ctl(&kc, &["jwt", "create-key"]).expect("jwt create-key");
    for (agent, ns, ..) in &agents {
        hub.ensure_namespace(agent).await.expect("hub namespace of the agent");
        ctl(
            &kc,
            &[
                "--agent-context",
                "spoke",
                "--agent-namespace",
                ns,
                "pki",
                "issue",
                "agent",
                agent,
                "--key-algorithm",
                "ecdsa-p256",
            ],
        )
        .expect("pki issue agent");
        ctl(&kc, &["--agent-context", "spoke", "--agent-namespace", ns, "pki", "propagate"]).expect("pki propagate");
    }

    // The principal, from the rendered Deployment and the ConfigMap as stored.
    let mut principal = start(&hub, &hub_docs, PRINCIPAL_CHART, "argocd", "principal").await.expect("start principal");
    let addr = wait_for(START, "the principal to listen", || {
        principal.ensure_running()?;
        Ok(principal
            .stdout()
            .lines()
            .find_map(|l| l.strip_prefix("principal listening on ").map(|a| a.trim().to_string())))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", principal.log_tail(40)));
    // principal.listen.host and .port took effect.
    assert_eq!(addr, format!("127.0.0.1:{grpc}"), "principal.listen.*");
    // principal.resourceProxy.enabled and .listenAddress too.
    let proxy = wait_for(START, "the resource proxy to listen", || {
        principal.ensure_running()?;
        Ok(principal
            .stdout()
            .lines()
            .find_map(|l| l.strip_prefix("resource proxy listening on ").map(|a| a.trim().to_string())))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", principal.log_tail(40)));
    assert_eq!(proxy, format!("127.0.0.1:{resource_proxy}"), "principal.resourceProxy.listenAddress");
    // principal.healthz.port: 200 once its watchers listed the hub, under its RBAC.
    tests::wait_until_async(START, "the principal's /healthz on principal.healthz.port", || async {
        matches!(http_get(healthz, "/healthz").await, Some((200, _)))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", principal.log_tail(40)));
    // principal.log.format json; principal.log.level "warn,cli=info": the command's own INFO
    // line, none of the principal crate's (which logs "principal ready" at INFO).
    let logs = principal.stdout() + &principal.stderr();
    let lines: Vec<Value> = logs.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).collect();
    assert!(
        lines.iter().any(|l| l["level"] == "INFO" && l["target"] == "cli::principal_cmd"),
        "principal.log.format=json, principal.log.level cli=info: no JSON INFO line of the command:\n{}",
        principal.log_tail(20)
    );
    assert!(
        !lines.iter().any(|l| l["level"] == "INFO" && l["target"] == "principal"),
        "principal.log.level=warn,cli=info: the principal crate still logs at INFO:\n{}",
        principal.log_tail(20)
    );

    // The agents, each from its rendering.
    let mut running = Vec::new();
    for (agent, ns, mode, healthz, metrics, docs) in &agents {
        let mut p = start(&spoke, docs, AGENT_CHART, ns, agent).await.expect("start agent");
        tests::wait_until_async(START, &format!("{agent} ({mode}) /readyz on agent.healthz.port"), || async {
            matches!(http_get(*healthz, "/readyz").await, Some((200, _)))
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}\n{}", p.log_tail(40), principal.log_tail(20)));
        p.ensure_running().expect("agent runs");
        let (code, body) = http_get(*metrics, "/metrics").await.expect("agent metrics on agent.metrics.port");
        assert_eq!(code, 200);
        assert!(body.contains("argocd_agent_connection_status 1"), "{agent}: not connected per its metrics");
        running.push(p);
    }
    let (code, body) = http_get(metrics, "/metrics").await.expect("principal metrics on principal.metrics.port");
    assert_eq!(code, 200);
    assert!(body.contains("argocd_principal_connected_agents 2"), "principal metrics:\n{body}");

    // Managed: the hub's Application reaches the managed agent's namespace on the spoke.
    let logs = || {
        format!("{}\n{}", principal.log_tail(30), running.iter().map(|p| p.log_tail(30)).collect::<Vec<_>>().join("\n"))
    };
    let hub_apps = apps(&hub.client(), "agent-managed");
    let app: DynamicObject =
        serde_json::from_value(application_without_finalizers("guestbook", "agent-managed", "HEAD")).expect("app");
    hub_apps.create(&PostParams::default(), &app).await.expect("create on the hub");
    wait_object(
        &apps(&spoke.client(), "argocd"),
        "guestbook",
        START,
        "the managed Application on the spoke",
        |o| o.is_some(),
        logs,
    )
    .await
    .expect("managed mode");
    // Autonomous: the spoke's Application reaches the hub in the agent's namespace.
    let spoke_apps = apps(&spoke.client(), "argocd-autonomous");
    let app: DynamicObject =
        serde_json::from_value(application_without_finalizers("local-app", "argocd-autonomous", "HEAD")).expect("app");
    spoke_apps.create(&PostParams::default(), &app).await.expect("create on the spoke");
    wait_object(
        &apps(&hub.client(), "agent-autonomous"),
        "local-app",
        START,
        "the autonomous Application on the hub",
        |o| o.is_some(),
        logs,
    )
    .await
    .expect("autonomous mode");

    // The resource proxy, as the hub's Argo CD uses it: kubectl with the cluster secret
    // `argocd-agentctl agent create` writes reads a tracked object outside the managed agent's
    // namespace (the chart's ClusterRoles: its Role covers its namespace only); the autonomous
    // agent, installed with the default enableResourceProxy=false, answers that it is disabled.
    spoke.ensure_namespace("guestbook").await.expect("namespace guestbook");
    let tracking = json!({"argocd.argoproj.io/tracking-id": "guestbook:/ConfigMap:guestbook/tracked"});
    let tracked: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "tracked", "annotations": tracking}})).expect("configmap");
    Api::namespaced(spoke.client(), "guestbook").create(&PostParams::default(), &tracked).await.expect("create");
    for (agent, ..) in &agents {
        ctl(&kc, &["agent", "create", agent, "--resource-proxy-server", &proxy]).expect("agent create");
    }
    let kubectl = |agent: &'static str| {
        let dir = dir.path();
        let hub = &hub;
        async move {
            Kubectl::new(&cluster_secret_kubeconfig(hub, agent, dir).await.expect("cluster secret")).expect("kubectl")
        }
    };
    let got = kubectl("agent-managed")
        .await
        .ok(["get", "configmap", "tracked", "-n", "guestbook", "-o", "name"])
        .await
        .unwrap_or_else(|e| panic!("through the resource proxy: {e:#}\n{}", logs()));
    assert_eq!(got.trim(), "configmap/tracked");
    let refused = kubectl("agent-autonomous")
        .await
        .fails(["get", "--raw", "/api/v1/namespaces/guestbook/configmaps/tracked"])
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        refused.stderr.contains("Forbidden") && refused.stderr.contains("resource proxy is disabled"),
        "enableResourceProxy=false: {refused}"
    );

    for mut p in running {
        p.sigterm_and_wait_async(Duration::from_secs(20)).await.expect("agent stops");
    }
    principal.sigterm_and_wait_async(Duration::from_secs(20)).await.expect("principal stops");
}

// === The image ===

/// The image the `Dockerfile` builds and the charts' defaults agree: the user the image runs as
/// is the one the pods run as, the pods use the image's entrypoint (only `args`), and the root
/// filesystem is read-only. (The image itself is built with `docker build`, `buildah bud` or
/// `podman build`; see docs/install.md.)
#[test]
fn dockerfile_and_chart_defaults_agree() {
    let dockerfile = std::fs::read_to_string(workspace_root().join("Dockerfile")).expect("Dockerfile");
    let last = |directive: &str| {
        dockerfile
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(directive).map(str::trim))
            .unwrap_or_else(|| panic!("Dockerfile: no {directive}"))
            .to_string()
    };
    let stages = dockerfile.lines().filter(|l| l.starts_with("FROM ")).count();
    assert!(stages >= 2, "Dockerfile: not multi-stage");
    assert_eq!(last("USER "), "999:999", "Dockerfile: the runtime user");
    assert_eq!(last("ENTRYPOINT "), "[\"/bin/argocd-agent\"]", "Dockerfile: upstream's entrypoint");
    for line in dockerfile.lines().filter(|l| l.starts_with("FROM ")) {
        let image = line.split_whitespace().nth(1).unwrap_or_default();
        let first = image.split('/').next().unwrap_or_default();
        assert!(
            !image.contains('/') || !(first.contains('.') || first.contains(':')),
            "Dockerfile: {image} names a registry host; leave it to the builder's configuration"
        );
    }
    for (chart, values) in [(PRINCIPAL_CHART, json!({})), (AGENT_CHART, json!({"server": "p"}))] {
        let d = rendered_deployment(chart, &values);
        let pod = &d["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        assert!(c.get("command").is_none(), "{chart}: sets command; the image's entrypoint is the binary");
        assert_eq!(pod["securityContext"]["runAsUser"], 999, "{chart}: podSecurityContext.runAsUser");
        assert_eq!(pod["securityContext"]["runAsGroup"], 999, "{chart}: podSecurityContext.runAsGroup");
        assert_eq!(c["securityContext"]["runAsNonRoot"], true, "{chart}: runAsNonRoot");
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true, "{chart}: readOnlyRootFilesystem");
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false, "{chart}: allowPrivilegeEscalation");
        assert!(c.get("volumeMounts").is_none(), "{chart}: mounts a volume by default; the processes write nothing");
    }
    for overlay in ["principal", "agent-managed"] {
        let docs = documents(&kustomize(overlay).expect("kustomize")).expect("parse");
        let d = docs.iter().find(|d| d["kind"] == "Deployment").expect("deployment");
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        assert!(c.get("command").is_none(), "kustomize {overlay}: sets command");
        assert_eq!(d["spec"]["template"]["spec"]["securityContext"]["runAsUser"], 999, "kustomize {overlay}");
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true, "kustomize {overlay}");
    }
}

// === Upstream v0.10's SPIRE values ===

/// An upstream values file with SPIRE on (`principal.spire.enabled`, an empty `principal.auth`;
/// the agent's `spire.enabled`) renders upstream's ConfigMap keys and socket mount, and the
/// binary started from the rendered Deployment's environment takes them: past every check
/// (upstream's default `--auth` for the method), on to the (missing) cluster.
#[test]
fn upstream_spire_values_render_and_the_binaries_take_them() {
    const SOCKET: &str = "unix:///run/spire/agent-sockets/spire-agent.sock";
    for (chart, command, prefix, values) in [
        (
            PRINCIPAL_CHART,
            "principal",
            "principal",
            json!({"principal": {"auth": "", "spire": {"enabled": true, "authMethod": "jwt"}}}),
        ),
        (
            PRINCIPAL_CHART,
            "principal",
            "principal",
            json!({"principal": {"spire": {"enabled": true, "authMethod": "mtls", "mountMethod": "csi"}}}),
        ),
        (AGENT_CHART, "agent", "agent", json!({"server": "p", "spire": {"enabled": true, "authMethod": "mtls"}})),
    ] {
        let docs = documents(&helm_template(chart, "argocd", &values).expect("render")).expect("parse");
        let cm = find(&docs, "ConfigMap", "argocd-agent-params").expect("params").clone();
        let data: BTreeMap<String, String> = serde_json::from_value(cm["data"].clone()).expect("data");
        let method =
            values.pointer(&format!("/{}spire/authMethod", if chart == AGENT_CHART { "" } else { "principal/" }));
        assert_eq!(data.get(&format!("{prefix}.spire.socket-path")).map(String::as_str), Some(SOCKET), "{values}");
        assert_eq!(
            data.get(&format!("{prefix}.spire.auth-method")),
            method.and_then(Value::as_str).map(str::to_owned).as_ref()
        );
        let auth_key = if chart == AGENT_CHART { "agent.creds" } else { "principal.auth" };
        assert!(!data.contains_key(auth_key), "{values}: {auth_key} is left empty with SPIRE, as upstream");
        let mut deployment = find(&docs, "Deployment", chart).expect("deployment").clone();
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["containers"][0]["volumeMounts"][0]["mountPath"], "/run/spire/agent-sockets", "{values}");
        let volume = &pod["volumes"][0];
        assert!(volume["hostPath"]["path"] == "/run/spire/agent-sockets" || volume["csi"]["driver"] == "csi.spiffe.io");
        deployment["metadata"]["namespace"] = json!("argocd");
        let data: BTreeMap<&str, &str> = data.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let said = check_settings(command, &deployment, &data);
        assert!(!said.contains("not supported yet") && !said.contains("--auth"), "{chart} {values}: {said}");
        assert!(said.contains("/nonexistent/kubeconfig"), "{chart} {values}: stopped before the cluster: {said}");
    }
    // Without a method, as upstream's schema says, the chart refuses naming the key.
    let out = try_helm_template(PRINCIPAL_CHART, "argocd", &json!({"principal": {"spire": {"enabled": true}}}))
        .expect("helm");
    assert!(!out.ok && out.stderr.contains("principal.spire.authMethod"), "{}", out.stderr);
    let out =
        try_helm_template(AGENT_CHART, "argocd", &json!({"server": "p", "spire": {"enabled": true}})).expect("helm");
    assert!(!out.ok && out.stderr.contains("spire.authMethod"), "{}", out.stderr);
}
