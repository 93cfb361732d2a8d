//! The install manifests as objects: the Helm charts under `install/helm/` rendered by the pinned
//! Helm (`scripts/install-test-deps` builds it), the kustomize overlays under
//! `install/kustomize/` rendered by kubectl's built-in kustomize, server-side dry-runs against a
//! [`RealCluster`], the CRDs those need (Istio's, the Prometheus Operator's) from the Go module
//! cache, and a Deployment's environment resolved the way the kubelet does it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Deserialize as _;
use serde_json::Value;

use crate::bin_path::{kubectl_path, venv_tool, workspace_root};
use crate::realkube::RealCluster;
use crate::wait::Poller;

/// `istio.io/api`, whose module holds Istio's CRDs (`kubernetes/customresourcedefinitions.gen.yaml`).
pub const ISTIO_API_MODULE: &str = "istio.io/api@v1.31.4";
/// The Prometheus Operator, whose module holds the ServiceMonitor and PrometheusRule CRDs.
pub const PROMETHEUS_OPERATOR_MODULE: &str = "github.com/prometheus-operator/prometheus-operator@v0.85.0";

/// `install/helm/<chart>`.
#[must_use]
pub fn chart_dir(chart: &str) -> PathBuf {
    workspace_root().join("install").join("helm").join(chart)
}

/// `install/kustomize/<overlay>`, or the Istio overlay `istio/<overlay>` (the top-level `istio/`
/// holds the mesh overlays and components on top of the plain bases).
#[must_use]
pub fn kustomize_dir(overlay: &str) -> PathBuf {
    match overlay.strip_prefix("istio/") {
        Some(istio) => workspace_root().join("istio").join(istio),
        None => workspace_root().join("install").join("kustomize").join(overlay),
    }
}

/// The pinned Helm.
///
/// # Errors
/// It is not installed: run `scripts/install-test-deps`.
pub fn helm_path() -> anyhow::Result<PathBuf> {
    venv_tool("helm")
}

/// Output of a finished command.
#[derive(Debug)]
pub struct Output {
    /// Exit success.
    pub ok: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

fn run(program: &Path, args: &[&str]) -> anyhow::Result<Output> {
    let out = Command::new(program).args(args).output().with_context(|| format!("cannot run {}", program.display()))?;
    Ok(Output {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// `helm ARGS…`, whatever its exit status.
///
/// # Errors
/// Helm is missing or cannot run.
pub fn helm(args: &[&str]) -> anyhow::Result<Output> {
    run(&helm_path()?, args)
}

/// `helm template` of `chart` (a directory name under `install/helm/`) into `namespace`, with
/// `values` (a JSON object, written to a values file so that no `--set` escaping applies).
///
/// # Errors
/// Helm fails (its stderr is in the error).
pub fn helm_template(chart: &str, namespace: &str, values: &Value) -> anyhow::Result<String> {
    let out = try_helm_template(chart, namespace, values)?;
    if !out.ok {
        bail!("helm template {chart} with {values}: {}", out.stderr);
    }
    Ok(out.stdout)
}

/// [`helm_template`] that returns Helm's answer, failed or not.
///
/// # Errors
/// Helm is missing, or the values file cannot be written.
pub fn try_helm_template(chart: &str, namespace: &str, values: &Value) -> anyhow::Result<Output> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, serde_yaml::to_string(values)?)?;
    let chart = chart_dir(chart);
    helm(&[
        "template",
        "rel",
        &chart.display().to_string(),
        "--namespace",
        namespace,
        "--values",
        &file.display().to_string(),
    ])
}

/// `kubectl kustomize install/kustomize/<overlay>`.
///
/// # Errors
/// kubectl fails (its stderr is in the error).
pub fn kustomize(overlay: &str) -> anyhow::Result<String> {
    let dir = kustomize_dir(overlay);
    let out = run(&kubectl_path()?, &["kustomize", &dir.display().to_string()])?;
    if !out.ok {
        bail!("kubectl kustomize {}: {}", dir.display(), out.stderr);
    }
    Ok(out.stdout)
}

/// Every non-empty YAML document of `yaml`, as JSON.
///
/// # Errors
/// A document does not parse.
pub fn documents(yaml: &str) -> anyhow::Result<Vec<Value>> {
    let mut docs = Vec::new();
    for (i, de) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
        let v = serde_yaml::Value::deserialize(de).with_context(|| format!("YAML document {}", i + 1))?;
        if !v.is_null() {
            docs.push(serde_json::to_value(v)?);
        }
    }
    Ok(docs)
}

/// `kind/namespace/name` of an object, for messages.
#[must_use]
pub fn object_id(o: &Value) -> String {
    format!(
        "{}/{}/{}",
        o["kind"].as_str().unwrap_or("?"),
        o["metadata"]["namespace"].as_str().unwrap_or(""),
        o["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// The one object of `kind` named `name`.
///
/// # Errors
/// None or several.
pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> anyhow::Result<&'a Value> {
    let found: Vec<_> = docs.iter().filter(|d| d["kind"] == kind && d["metadata"]["name"] == name).collect();
    match found.as_slice() {
        [one] => Ok(one),
        other => bail!("expected one {kind} {name}, found {}", other.len()),
    }
}

/// The directory of a Go module in the module cache (`scripts/install-test-deps` downloads it).
///
/// # Errors
/// `go` is missing or the module was not downloaded.
pub fn go_module_dir(module_at_version: &str) -> anyhow::Result<PathBuf> {
    let out = Command::new("go").args(["env", "GOMODCACHE"]).output().context("cannot run `go env GOMODCACHE`")?;
    let cache = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let dir = cache.join(module_at_version);
    if !dir.is_dir() {
        bail!("Go module {module_at_version} is not in {}: run scripts/install-test-deps", cache.display());
    }
    Ok(dir)
}

/// Install Istio's CRDs and the Prometheus Operator's ServiceMonitor and PrometheusRule CRDs
/// (from the Go module cache) and wait until the API server serves their kinds.
///
/// # Errors
/// A module is missing, or the CRDs are refused or never served.
pub async fn install_addon_crds(cluster: &RealCluster) -> anyhow::Result<()> {
    let istio = go_module_dir(ISTIO_API_MODULE)?.join("kubernetes").join("customresourcedefinitions.gen.yaml");
    cluster.apply_file(&istio)?;
    let crds = go_module_dir(PROMETHEUS_OPERATOR_MODULE)?.join("example").join("prometheus-operator-crd");
    for file in ["monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml"] {
        cluster.apply_file(&crds.join(file))?;
    }
    let served = [
        ("security.istio.io/v1", &["authorizationpolicies", "peerauthentications"][..]),
        ("networking.istio.io/v1", &["destinationrules", "sidecars"][..]),
        ("monitoring.coreos.com/v1", &["servicemonitors", "prometheusrules"][..]),
    ];
    wait_served(cluster, &served, Duration::from_secs(90)).await
}

/// Wait until the API server serves every `(group/version, resources)` of `served` (each within
/// `within`), e.g. after applying CRDs.
///
/// # Errors
/// One is not served in time.
pub(crate) async fn wait_served(
    cluster: &RealCluster,
    served: &[(&str, &[&str])],
    within: Duration,
) -> anyhow::Result<()> {
    for (group_version, kinds) in served {
        let mut poll = Poller::new(within, format!("{group_version} to be served"));
        loop {
            let req = http::Request::get(format!("/apis/{group_version}")).body(Vec::new())?;
            if let Ok(text) = cluster.client().request_text(req).await
                && kinds.iter().all(|k| text.contains(&format!("\"{k}\"")))
            {
                break;
            }
            poll.tick().await?;
        }
    }
    Ok(())
}

/// `kubectl apply --dry-run=server` of `yaml` as the cluster's admin: the API server validates
/// and admits every object (schemas, CRD kinds, RBAC escalation checks) without storing it.
///
/// # Errors
/// kubectl is missing, or the server refuses (the error has kubectl's stderr).
pub fn dry_run_server(cluster: &RealCluster, name: &str, yaml: &str) -> anyhow::Result<String> {
    let file = cluster.work_dir().join(format!("{name}.yaml"));
    std::fs::write(&file, yaml)?;
    let out = Command::new(kubectl_path()?)
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(["apply", "--dry-run=server", "--server-side", "--field-manager", "install-test", "-f"])
        .arg(&file)
        .output()
        .context("cannot run kubectl")?;
    if !out.status.success() {
        bail!("{name}: kubectl apply --dry-run=server refused it:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `kubectl apply --server-side` of `yaml` as the cluster's admin (for real).
///
/// # Errors
/// The server refuses.
pub fn apply(cluster: &RealCluster, name: &str, yaml: &str) -> anyhow::Result<()> {
    let file = cluster.work_dir().join(format!("{name}.yaml"));
    std::fs::write(&file, yaml)?;
    cluster.apply_file(&file)
}

/// The environment of a Deployment's one container as the kubelet builds it: `value`s, and
/// `configMapKeyRef`s resolved against `configmaps` (a missing optional key or ConfigMap sets
/// nothing, as in Kubernetes). Anything else (Secrets, field refs) is refused: the install
/// manifests do not use it.
///
/// # Errors
/// The Deployment has not exactly one container, a required reference is missing, or a source
/// is not supported here.
pub fn container_env(deployment: &Value, configmaps: &[Value]) -> anyhow::Result<BTreeMap<String, String>> {
    let id = object_id(deployment);
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .with_context(|| format!("{id}: no containers"))?;
    let [container] = containers.as_slice() else { bail!("{id}: expected one container, found {}", containers.len()) };
    let ns = deployment["metadata"]["namespace"].as_str().unwrap_or_default();
    let mut env = BTreeMap::new();
    for e in container["env"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let name = e["name"].as_str().with_context(|| format!("{id}: env entry without a name: {e}"))?;
        if let Some(v) = e.get("value") {
            env.insert(name.to_string(), v.as_str().unwrap_or_default().to_string());
            continue;
        }
        let r = &e["valueFrom"]["configMapKeyRef"];
        if r.is_null() {
            bail!("{id}: env {name}: only value and configMapKeyRef are resolved here: {e}");
        }
        let (cm, key) = (r["name"].as_str().unwrap_or_default(), r["key"].as_str().unwrap_or_default());
        let optional = r["optional"].as_bool().unwrap_or(false);
        let found = configmaps
            .iter()
            .find(|c| c["kind"] == "ConfigMap" && c["metadata"]["name"] == cm && c["metadata"]["namespace"] == ns)
            .and_then(|c| c["data"].get(key))
            .and_then(Value::as_str);
        match found {
            Some(v) => {
                env.insert(name.to_string(), v.to_string());
            }
            None if optional => {}
            None => bail!("{id}: env {name}: ConfigMap {ns}/{cm} has no key {key} and the reference is not optional"),
        }
    }
    Ok(env)
}

/// The `args` of a Deployment's one container.
#[must_use]
pub fn container_args(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

/// The `(configMapKeyRef key, env name)` pairs of a Deployment's container, in order.
#[must_use]
pub fn params_mapping(deployment: &Value) -> Vec<(String, String)> {
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .map(|env| {
            env.iter()
                .filter_map(|e| {
                    let key = e["valueFrom"]["configMapKeyRef"]["key"].as_str()?;
                    Some((key.to_string(), e["name"].as_str()?.to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// RBAC objects (ServiceAccount, Role, ClusterRole and their bindings) reduced to what grants
/// permissions: kind, name, namespace, rules, roleRef, subjects. Labels and annotations differ
/// between renderings (Helm's labels) and grant nothing.
#[must_use]
pub fn rbac_objects(docs: &[Value]) -> BTreeMap<String, Value> {
    const KINDS: [&str; 5] = ["ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"];
    docs.iter()
        .filter(|d| d["kind"].as_str().is_some_and(|k| KINDS.contains(&k)))
        .map(|d| {
            let reduced = serde_json::json!({
                "rules": d["rules"],
                "roleRef": d["roleRef"],
                "subjects": d["subjects"],
            });
            (object_id(d), reduced)
        })
        .collect()
}
