//! Differential conformance of the embedded API server: one sequence of kube-rs and kubectl
//! requests, each scenario written once, run against a real kube-apiserver (etcd + kube-apiserver
//! v1.37 with Argo CD's own CRDs, once with v3.5.1's and once with v3.6.1's) and against `argocd-agent apiserver`
//! with the same CRDs.
//! Each run records the facts that matter (status code, reason, field causes, the object's
//! shape after pruning and defaulting, watch event order) and the two records must be equal.
//!
//! What cannot be equal is not hidden: a bare control plane has no kube-controller-manager, so a
//! deleted namespace stays `Terminating` there while the embedded server empties and removes it;
//! the scenarios record what both do (the namespace is marked `Terminating`, new content is
//! refused) and the completion is only checked on the embedded server. The differences we keep
//! are listed in `docs/apiserver.md` ("Differences from kube-apiserver").

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use futures::{AsyncBufReadExt as _, StreamExt as _};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tests::apiserver::ApiServerProcess;
use tests::kubectl::Kubectl;
use tests::realkube::{ArgoCdRelease, RealCluster, argocd_crds_dir_of};
use tests::wait::Poller;

const NS: &str = "conformance";
const APPS: &str = "/apis/argoproj.io/v1alpha1/namespaces/conformance/applications";
const PROJECTS: &str = "/apis/argoproj.io/v1alpha1/namespaces/conformance/appprojects";
const APPSETS: &str = "/apis/argoproj.io/v1alpha1/namespaces/conformance/applicationsets";
const CONFIGMAPS: &str = "/api/v1/namespaces/conformance/configmaps";

/// One of the two servers under test.
enum Backend {
    Real(Box<RealCluster>),
    Embedded(Box<ApiServerProcess>),
}

struct Server {
    name: &'static str,
    backend: Backend,
    kubectl: Kubectl,
    facts: Vec<(String, Value)>,
    /// Raw answers, written to `$CONFORMANCE_DUMP_DIR/<server>.json` when set (to read messages).
    raw: Vec<(String, Value)>,
}

/// What one raw request answered.
struct Answer {
    code: u16,
    warnings: Vec<String>,
    body: Value,
}

impl Server {
    fn client(&self) -> kube::Client {
        match &self.backend {
            Backend::Real(c) => c.client(),
            Backend::Embedded(s) => s.client(),
        }
    }

    fn is_real(&self) -> bool {
        matches!(self.backend, Backend::Real(_))
    }

    fn record(&mut self, step: &str, fact: Value) {
        self.facts.push((step.to_string(), fact));
    }

    async fn send(&self, method: &str, path: &str, content_type: &str, body: &Value) -> Result<Answer> {
        let bytes = if body.is_null() { Vec::new() } else { serde_json::to_vec(body)? };
        self.send_bytes(method, path, content_type, bytes).await
    }

    /// A request with a body of any bytes (protobuf, or JSON that is `null`).
    async fn send_bytes(&self, method: &str, path: &str, content_type: &str, bytes: Vec<u8>) -> Result<Answer> {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .header("accept", "application/json")
            .body(kube::client::Body::from(bytes))?;
        let resp = self.client().send(req).await.with_context(|| format!("{} {method} {path}", self.name))?;
        let code = resp.status().as_u16();
        let warnings = resp
            .headers()
            .get_all("warning")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(|w| w.trim_start_matches("299 - ").trim_matches('"').replace("\\\"", "\""))
            .collect();
        let raw = resp.into_body().collect_bytes().await?;
        let body = serde_json::from_slice(&raw).unwrap_or_else(|_| json!(String::from_utf8_lossy(&raw)));
        Ok(Answer { code, warnings, body })
    }

    /// A request whose answer is recorded (code, reason, causes, normalised object).
    async fn step(&mut self, step: &str, method: &str, path: &str, content_type: &str, body: Value) -> Result<Value> {
        let a = self.send(method, path, content_type, &body).await?;
        let mut fact = json!({"code": a.code, "body": normalize(&a.body)});
        if !a.warnings.is_empty() {
            let mut w = a.warnings.clone();
            w.sort();
            fact["warnings"] = json!(w);
        }
        self.record(step, fact);
        self.raw.push((step.to_string(), a.body.clone()));
        Ok(a.body)
    }

    /// [`Server::step`] with a body of raw bytes.
    async fn step_bytes(
        &mut self,
        step: &str,
        method: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<Value> {
        let a = self.send_bytes(method, path, content_type, body).await?;
        let mut fact = json!({"code": a.code, "body": normalize(&a.body)});
        if !a.warnings.is_empty() {
            let mut w = a.warnings.clone();
            w.sort();
            fact["warnings"] = json!(w);
        }
        self.record(step, fact);
        self.raw.push((step.to_string(), a.body.clone()));
        Ok(a.body)
    }

    async fn kubectl_step(&mut self, step: &str, args: &[&str]) -> Result<String> {
        let out = self.kubectl.run(args).await?;
        // "Error from server (Reason): ..." names the reason; the wording after it may differ.
        let reasons: Vec<String> = out
            .stderr
            .lines()
            .filter_map(|l| l.split("Error from server (").nth(1))
            .filter_map(|r| r.split(')').next())
            .map(str::to_string)
            .collect();
        let warned = out.stderr.lines().filter(|l| l.starts_with("Warning: unknown field")).count();
        self.record(step, json!({"ok": out.success(), "reasons": reasons, "unknown_field_warnings": warned}));
        Ok(out.stdout)
    }
}

/// The facts of a body: objects without what the server makes up (uids, times, versions),
/// Status objects as code, reason and field causes (the wording of messages may differ).
fn normalize(v: &Value) -> Value {
    if v["kind"] == "Status" {
        let mut causes: Vec<(String, String)> = v["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["field"].as_str().unwrap_or_default().to_string(),
                    c["reason"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        causes.sort();
        causes.dedup();
        return json!({"status": v["status"], "code": v["code"], "reason": v["reason"], "causes": causes});
    }
    let mut o = v.clone();
    if let Some(items) = o.get_mut("items").and_then(Value::as_array_mut) {
        for i in items.iter_mut() {
            *i = normalize(i);
        }
    }
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["uid", "resourceVersion", "creationTimestamp", "managedFields", "selfLink", "continue"] {
            m.remove(k);
        }
        if m.remove("deletionTimestamp").is_some() {
            m.insert("deletionTimestamp".into(), json!("<set>"));
        }
        if let Some(n) = m.get("remainingItemCount").cloned() {
            m.insert("remainingItemCount".into(), n);
        }
    }
    o
}

fn app(name: &str, extra: Value) -> Value {
    let mut a = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "project": "default",
            "source": {"repoURL": "https://git.example.com/apps.git", "path": "guestbook", "targetRevision": "HEAD"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "guestbook"},
        },
    });
    merge(&mut a, &extra);
    a
}

/// RFC 7386 merge of `patch` into `doc`.
fn merge(doc: &mut Value, patch: &Value) {
    match (doc, patch) {
        (Value::Object(d), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    d.remove(k);
                } else {
                    merge(d.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (d, p) => *d = p.clone(),
    }
}

/// Percent-encode a query value.
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Setup
// ---------------------------------------------------------------------------------------------

/// Create or replace each of Argo CD's CRDs (the embedded server has its own schema-less ones
/// from the start; the real one has none) and wait until they are served.
async fn install_crds(s: &Server, release: ArgoCdRelease) -> Result<()> {
    let crds: Api<DynamicObject> = Api::all_with(
        s.client(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    let dir = argocd_crds_dir_of(release)?;
    for file in ["application-crd.yaml", "appproject-crd.yaml", "applicationset-crd.yaml"] {
        let text = std::fs::read_to_string(dir.join(file))?;
        let mut crd: DynamicObject = serde_yaml::from_str(&text)?;
        let name = crd.metadata.name.clone().context("CRD without a name")?;
        match crds.get_opt(&name).await? {
            Some(old) => {
                crd.metadata.resource_version = old.metadata.resource_version;
                crds.replace(&name, &PostParams::default(), &crd).await?;
            }
            None => {
                crds.create(&PostParams::default(), &crd).await?;
            }
        }
    }
    let mut poll = Poller::new(Duration::from_secs(60), format!("{}: Argo CD's CRDs to be served", s.name));
    loop {
        let answer = s.send("GET", APPSETS, "application/json", &Value::Null).await?;
        let served = s.send("GET", "/apis/argoproj.io/v1alpha1", "application/json", &Value::Null).await?;
        if answer.code == 200 && served.body.to_string().contains("\"applicationsets/status\"") {
            return Ok(());
        }
        poll.tick().await?;
    }
}

async fn start_servers(release: ArgoCdRelease) -> Result<(Server, Server)> {
    let (real, embedded) = tokio::join!(RealCluster::start(), ApiServerProcess::start());
    let (real, embedded) = (real?, embedded?);
    let mut servers = Vec::new();
    for (name, backend) in
        [("real", Backend::Real(Box::new(real))), ("embedded", Backend::Embedded(Box::new(embedded)))]
    {
        let kubectl = match &backend {
            Backend::Real(c) => c.kubectl()?,
            Backend::Embedded(e) => e.kubectl()?,
        };
        let s = Server { name, backend, kubectl, facts: Vec::new(), raw: Vec::new() };
        install_crds(&s, release).await?;
        let ns = s.send("POST", "/api/v1/namespaces", "application/json", &json!({"metadata": {"name": NS}})).await?;
        ensure!(ns.code == 201, "{}: cannot create namespace {NS}: {}", s.name, ns.body);
        servers.push(s);
    }
    let embedded = servers.pop().context("two servers")?;
    let real = servers.pop().context("two servers")?;
    Ok((real, embedded))
}

/// Steps where the servers differ on purpose, each a row of "Differences from kube-apiserver"
/// in docs/apiserver.md. They are run and printed, not compared.
const DOCUMENTED: &[(&str, &str)] = &[
    (
        "crud: unknown resource is NotFound",
        "both answer 404; kube-apiserver's body is the text `404 page not found`, ours a NotFound Status",
    ),
    (
        "client-go: protobuf create of a Pod",
        "protobuf bodies are decoded for Namespace, Secret, ConfigMap, Service, Event, Lease and DeleteOptions; a Pod in protobuf is 415 here (send JSON)",
    ),
    (
        "patch: server-side apply",
        "server-side apply is not implemented: 415 (kube-apiserver applies it, here a 409 FieldManagerConflict)",
    ),
];

/// Both records must be equal; every differing step is shown with both facts.
fn compare(real: &Server, embedded: &Server) -> Result<()> {
    let r: BTreeMap<&str, &Value> = real.facts.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let e: BTreeMap<&str, &Value> = embedded.facts.iter().map(|(k, v)| (k.as_str(), v)).collect();
    ensure!(real.facts.len() == r.len(), "duplicate step names");
    let mut diff = String::new();
    for (step, why) in DOCUMENTED {
        let (rv, ev) = (
            r.get(step).context("a documented step did not run")?,
            e.get(step).context("a documented step did not run")?,
        );
        println!("documented difference {step:?} ({why}):\n  real:     {rv}\n  embedded: {ev}");
    }
    for (step, rv) in r.iter().filter(|(k, _)| !DOCUMENTED.iter().any(|(d, _)| d == *k)) {
        match e.get(step) {
            Some(ev) if ev == rv => {}
            Some(ev) => {
                let _ = write!(diff, "\n--- {step}\n  real:     {rv}\n  embedded: {ev}");
            }
            None => {
                let _ = write!(diff, "\n--- {step}: only on the real server: {rv}");
            }
        }
    }
    for step in e.keys().filter(|k| !r.contains_key(*k)) {
        let _ = write!(diff, "\n--- {step}: only on the embedded server");
    }
    if !diff.is_empty() {
        bail!("the embedded server differs from kube-apiserver in {} steps:{diff}", diff.matches("\n---").count());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Scenarios: each runs once per server and records what it saw.
// ---------------------------------------------------------------------------------------------

async fn crud_and_errors(s: &mut Server) -> Result<()> {
    let ct = "application/json";
    let created = s.step("crud: create", "POST", APPS, ct, app("crud", json!({}))).await?;
    s.step("crud: create again is AlreadyExists", "POST", APPS, ct, app("crud", json!({}))).await?;
    s.step("crud: get", "GET", &format!("{APPS}/crud"), ct, Value::Null).await?;
    s.step("crud: get a missing one is NotFound", "GET", &format!("{APPS}/missing"), ct, Value::Null).await?;
    let mut stale = app("crud", json!({"spec": {"project": "other"}}));
    stale["metadata"]["resourceVersion"] = json!("1");
    s.step("crud: update with a stale resourceVersion is Conflict", "PUT", &format!("{APPS}/crud"), ct, stale).await?;
    let mut fresh = app("crud", json!({"spec": {"project": "other"}}));
    fresh["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
    s.step("crud: update bumps generation", "PUT", &format!("{APPS}/crud"), ct, fresh).await?;
    s.step("crud: update of a missing one is NotFound", "PUT", &format!("{APPS}/nope"), ct, app("nope", json!({})))
        .await?;
    let mut wrong = app("crud", json!({}));
    wrong["metadata"]["namespace"] = json!("elsewhere");
    s.step("crud: namespace mismatch is BadRequest", "PUT", &format!("{APPS}/crud"), ct, wrong).await?;
    s.step("crud: invalid name is Invalid", "POST", APPS, ct, app("Not_Valid", json!({}))).await?;
    s.step(
        "crud: kind mismatch is BadRequest",
        "POST",
        APPS,
        ct,
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject", "metadata": {"name": "k"}}),
    )
    .await?;
    s.step(
        "crud: apiVersion mismatch",
        "POST",
        APPS,
        ct,
        json!({"apiVersion": "v1", "kind": "Application", "metadata": {"name": "av"}}),
    )
    .await?;
    s.step(
        "crud: other version of the group",
        "POST",
        APPS,
        ct,
        json!({"apiVersion": "argoproj.io/v1", "kind": "Application", "metadata": {"name": "av2"}}),
    )
    .await?;
    s.step("crud: malformed JSON is BadRequest", "POST", APPS, ct, json!("not an object")).await?;
    s.step("crud: unknown resource is NotFound", "GET", "/apis/argoproj.io/v1alpha1/widgets", ct, Value::Null).await?;
    s.step(
        "crud: create in a missing namespace is NotFound",
        "POST",
        "/apis/argoproj.io/v1alpha1/namespaces/nowhere/applications",
        ct,
        app("x", json!({"metadata": {"namespace": "nowhere"}})),
    )
    .await?;
    s.step("crud: delete", "DELETE", &format!("{APPS}/crud"), ct, Value::Null).await?;
    s.step("crud: delete again is NotFound", "DELETE", &format!("{APPS}/crud"), ct, Value::Null).await?;
    let dry = s.send("POST", &format!("{APPS}?dryRun=All"), ct, &app("dry", json!({}))).await?;
    let after = s.send("GET", &format!("{APPS}/dry"), ct, &Value::Null).await?;
    s.record("crud: dryRun creates nothing", json!({"code": dry.code, "then": after.code}));
    Ok(())
}

async fn schema_pruning_and_validation(s: &mut Server) -> Result<()> {
    let ct = "application/json";
    let unknown = app(
        "pruned",
        json!({"spec": {"bogus": 1, "source": {"extra": "x"}}, "topLevel": true, "metadata": {"labels": {"a": "b"}},
               "status": {"health": {"status": "Healthy", "nope": 1}}}),
    );
    s.step("schema: unknown fields are pruned, with warnings", "POST", APPS, ct, unknown.clone()).await?;
    s.step("schema: the stored object has no unknown field", "GET", &format!("{APPS}/pruned"), ct, Value::Null).await?;
    let mut strict = unknown.clone();
    strict["metadata"]["name"] = json!("strict");
    s.step(
        "schema: fieldValidation=Strict refuses unknown fields",
        "POST",
        &format!("{APPS}?fieldValidation=Strict"),
        ct,
        strict,
    )
    .await?;
    let mut ignore = unknown;
    ignore["metadata"]["name"] = json!("ignored");
    s.step(
        "schema: fieldValidation=Ignore prunes silently",
        "POST",
        &format!("{APPS}?fieldValidation=Ignore"),
        ct,
        ignore,
    )
    .await?;
    s.step(
        "schema: a bad fieldValidation is BadRequest",
        "POST",
        &format!("{APPS}?fieldValidation=Loud"),
        ct,
        app("fv", json!({})),
    )
    .await?;
    // A merge patch that only adds unknown fields changes nothing (same resourceVersion).
    let before = s.send("GET", &format!("{APPS}/pruned"), ct, &Value::Null).await?;
    let patched = s
        .send("PATCH", &format!("{APPS}/pruned"), "application/merge-patch+json", &json!({"spec": {"bogus2": 1}}))
        .await?;
    s.record(
        "schema: a patch of only unknown fields is a no-op",
        json!({"code": patched.code, "same_rv": patched.body["metadata"]["resourceVersion"] == before.body["metadata"]["resourceVersion"],
               "warnings": patched.warnings}),
    );
    s.step(
        "schema: operationState without operation is Invalid",
        "POST",
        APPS,
        ct,
        app(
            "opstate",
            json!({"status": {"operationState": {"phase": "Running", "startedAt": "2026-01-01T00:00:00Z"}}}),
        ),
    )
    .await?;
    s.step(
        "schema: a string where an object goes is Invalid",
        "POST",
        APPS,
        ct,
        app("typed", json!({"spec": {"source": "git"}})),
    )
    .await?;
    s.step(
        "schema: an integer where a string goes is Invalid",
        "POST",
        APPS,
        ct,
        app("typed2", json!({"spec": {"project": 5}})),
    )
    .await?;
    s.step(
        "schema: a missing required field is Invalid",
        "POST",
        APPS,
        ct,
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "nospec"}}),
    )
    .await?;
    s.step(
        "schema: an enum value not listed is NotSupported",
        "POST",
        APPS,
        ct,
        app("enum", json!({"status": {"sourceHydrator": {"currentOperation": {"phase": "Sideways", "startedAt": "2026-01-01T00:00:00Z", "message": "m", "drySHA": "x", "hydratedSHA": "y", "sourceHydrator": {"drySource": {"repoURL": "r", "targetRevision": "t", "path": "p"}, "syncSource": {"targetBranch": "b", "path": "p"}}}}}})),
    )
    .await?;
    s.step(
        "schema: a date-time that is not one is Invalid",
        "POST",
        APPS,
        ct,
        app("when", json!({"status": {"reconciledAt": "yesterday"}})),
    )
    .await?;
    s.step("schema: int-or-string takes both", "POST", APPS, ct,
        app("intstr", json!({"spec": {"source": {"kustomize": {"replicas": [{"name": "a", "count": 2}, {"name": "b", "count": "3"}]}}}}))).await?;
    s.step(
        "schema: int-or-string refuses a boolean",
        "POST",
        APPS,
        ct,
        app("intstr2", json!({"spec": {"source": {"kustomize": {"replicas": [{"name": "a", "count": true}]}}}})),
    )
    .await?;
    s.step(
        "schema: null of a non-nullable field is dropped",
        "POST",
        APPS,
        ct,
        app("nulls", json!({"spec": {"source": {"chart": null}}, "status": {"health": null}})),
    )
    .await?;
    s.step(
        "schema: maxLength is TooLong",
        "POST",
        PROJECTS,
        ct,
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject", "metadata": {"name": "long"},
               "spec": {"description": "x".repeat(256)}}),
    )
    .await?;
    s.step(
        "schema: required inside a list item",
        "POST",
        PROJECTS,
        ct,
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject", "metadata": {"name": "req"},
               "spec": {"clusterResourceWhitelist": [{"group": "*"}]}}),
    )
    .await?;
    s.step(
        "schema: an update is validated too",
        "PATCH",
        &format!("{APPS}/pruned"),
        "application/merge-patch+json",
        json!({"spec": {"destination": "here"}}),
    )
    .await?;
    Ok(())
}

async fn patches(s: &mut Server) -> Result<()> {
    let ct = "application/json";
    s.step(
        "patch: setup",
        "POST",
        APPS,
        ct,
        app("patched", json!({"metadata": {"labels": {"keep": "1", "drop": "1"}}})),
    )
    .await?;
    let path = format!("{APPS}/patched");
    s.step(
        "patch: merge",
        "PATCH",
        &path,
        "application/merge-patch+json",
        json!({"metadata": {"labels": {"drop": null, "new": "1"}}, "spec": {"source": {"targetRevision": "v2"}}}),
    )
    .await?;
    s.step(
        "patch: json",
        "PATCH",
        &path,
        "application/json-patch+json",
        json!([{"op": "replace", "path": "/spec/project", "value": "p2"}, {"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]),
    )
    .await?;
    s.step(
        "patch: json with a failing test",
        "PATCH",
        &path,
        "application/json-patch+json",
        json!([{"op": "test", "path": "/spec/project", "value": "nope"}]),
    )
    .await?;
    s.step(
        "patch: json to a missing path",
        "PATCH",
        &path,
        "application/json-patch+json",
        json!([{"op": "replace", "path": "/spec/nothing/here", "value": 1}]),
    )
    .await?;
    s.step(
        "patch: strategic merge on a custom resource",
        "PATCH",
        &path,
        "application/strategic-merge-patch+json",
        json!({"spec": {"project": "p3"}}),
    )
    .await?;
    s.step("patch: server-side apply", "PATCH", &format!("{path}?fieldManager=conformance"), "application/apply-patch+yaml",
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "patched"}, "spec": {"project": "ssa"}})).await?;
    s.step("patch: unknown patch type", "PATCH", &path, "application/x-nonsense", json!({})).await?;
    s.step("patch: of a missing object", "PATCH", &format!("{APPS}/absent"), "application/merge-patch+json", json!({}))
        .await?;
    s.step("patch: merge patch that is not an object", "PATCH", &path, "application/merge-patch+json", json!([1]))
        .await?;
    // Built-in kinds take strategic merge.
    s.step(
        "patch: configmap setup",
        "POST",
        CONFIGMAPS,
        ct,
        json!({"metadata": {"name": "smp"}, "data": {"a": "1", "b": "2"}}),
    )
    .await?;
    s.step(
        "patch: strategic merge on a ConfigMap",
        "PATCH",
        &format!("{CONFIGMAPS}/smp"),
        "application/strategic-merge-patch+json",
        json!({"data": {"a": null, "c": "3"}}),
    )
    .await?;
    // Through kube-rs' typed Patch too.
    let api: Api<DynamicObject> = Api::namespaced_with(s.client(), NS, &app_resource());
    let merged =
        api.patch("patched", &PatchParams::default(), &Patch::Merge(json!({"spec": {"project": "kube-rs"}}))).await?;
    s.record("patch: kube-rs merge", normalize(&serde_json::to_value(&merged)?));
    Ok(())
}

/// Protobuf wire encoding by hand (not the embedded server's decoder): `tag` as a
/// length-delimited field.
fn pb(tag: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![(tag << 3) | 2];
    let mut n = bytes.len();
    while n >= 0x80 {
        out.push(u8::try_from(n & 0x7f).unwrap_or(0) | 0x80);
        n >>= 7;
    }
    out.push(u8::try_from(n).unwrap_or(0));
    out.extend_from_slice(bytes);
    out
}

/// A Kubernetes protobuf body as client-go's protobuf serializer writes it: the `k8s\0` magic,
/// then a `runtime.Unknown` naming `api_version` and `kind`, with `raw` as the object's message.
fn pb_body(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let type_meta = [pb(1, api_version.as_bytes()), pb(2, kind.as_bytes())].concat();
    let unknown = [pb(1, &type_meta), pb(2, raw), pb(3, b""), pb(4, b"")].concat();
    [b"k8s\0".as_slice(), &unknown].concat()
}

/// What client-go sends that other clients do not: JSON patches kube-apiserver's json-patch v4
/// accepts beyond RFC 6902 (upstream argocd-agent writes an Application's first status with
/// `replace /status`), and the protobuf bodies of its typed clients for built-in kinds
/// (`DeleteOptions` on every delete, objects on create and update).
async fn client_go_bodies(s: &mut Server) -> Result<()> {
    let ct = "application/json";
    let jp = "application/json-patch+json";
    s.step("client-go: create an app without status", "POST", APPS, ct, app("cg", json!({}))).await?;
    let path = format!("{APPS}/cg");
    let steps: &[(&str, &str, Value)] = &[
        (
            "client-go: json patch replace of a missing /status",
            "",
            json!([{"op": "replace", "path": "/status", "value": {"health": {"status": "Healthy"}, "sync": {"status": "Synced"}}}]),
        ),
        ("client-go: json patch null", "", Value::Null),
        ("client-go: json patch empty", "", json!([])),
        (
            "client-go: json patch replace of a missing member",
            "",
            json!([{"op": "replace", "path": "/spec/syncPolicy", "value": {"automated": {"prune": true}}}]),
        ),
        (
            "client-go: json patch negative indexes",
            "",
            json!([
                {"op": "add", "path": "/spec/info", "value": [{"name": "a", "value": "1"}, {"name": "b", "value": "2"}]},
                {"op": "replace", "path": "/spec/info/-1", "value": {"name": "c", "value": "3"}},
                {"op": "remove", "path": "/spec/info/-2"},
                {"op": "add", "path": "/spec/info/-1", "value": {"name": "d", "value": "4"}},
                {"op": "add", "path": "/spec/info/+0", "value": {"name": "e", "value": "5"}},
            ]),
        ),
        (
            "client-go: json patch replace past the end of an array",
            "",
            json!([{"op": "replace", "path": "/spec/info/9", "value": {"name": "x", "value": "x"}}]),
        ),
        ("client-go: json patch remove of a missing member", "", json!([{"op": "remove", "path": "/spec/nothing"}])),
        (
            "client-go: json patch move from a missing member",
            "",
            json!([{"op": "move", "from": "/spec/nothing", "path": "/spec/project"}]),
        ),
        (
            "client-go: json patch copy of a missing member",
            "",
            json!([{"op": "copy", "from": "/spec/nothing", "path": "/spec/revisionHistoryLimit"}]),
        ),
        (
            "client-go: json patch test of a missing member against null",
            "",
            json!([{"op": "test", "path": "/spec/nothing", "value": null}, {"op": "test", "path": "/spec/nothing"}]),
        ),
        (
            "client-go: json patch with an unknown op",
            "",
            json!([{"op": "merge", "path": "/spec/project", "value": "x"}]),
        ),
        ("client-go: json patch with a null operation", "", json!([null])),
        ("client-go: json patch without a path", "", json!([{"op": "add", "value": 1}])),
        ("client-go: json patch whose op is not a string", "", json!([{"op": 1, "path": "/spec/project"}])),
        (
            "client-go: json patch whose op is not a string, fieldValidation=Ignore",
            "?fieldValidation=Ignore",
            json!([{"op": 1, "path": "/spec/project"}]),
        ),
        ("client-go: json patch that is an object", "", json!({"op": "add", "path": "/spec/project", "value": "x"})),
        ("client-go: json patch with a non-object operation", "", json!(["add"])),
        (
            "client-go: json patch path without a leading slash",
            "",
            json!([{"op": "replace", "path": "x/spec/project", "value": "slashless"}]),
        ),
        (
            "client-go: json patch with an unknown member warns",
            "",
            json!([{"op": "replace", "path": "/spec/project", "value": "warned", "extra": 1}]),
        ),
        (
            "client-go: json patch with an unknown member, fieldValidation=Strict",
            "?fieldValidation=Strict",
            json!([{"op": "replace", "path": "/spec/project", "value": "strict", "extra": 1}]),
        ),
        (
            "client-go: json patch escapes",
            "",
            json!([{"op": "add", "path": "/metadata/annotations", "value": {}},
                   {"op": "add", "path": "/metadata/annotations/example.com~1a~01", "value": "v"}]),
        ),
    ];
    for (step, query, body) in steps {
        let bytes = serde_json::to_vec(body)?;
        s.step_bytes(step, "PATCH", &format!("{path}{query}"), jp, bytes).await?;
    }

    // DELETEs with protobuf DeleteOptions, as client-go's typed clients send them.
    let pbct = "application/vnd.kubernetes.protobuf";
    let secrets = "/api/v1/namespaces/conformance/secrets";
    for name in ["pb-s1", "pb-s2", "pb-s3"] {
        let a = s.send("POST", secrets, ct, &json!({"metadata": {"name": name}, "data": {"k": "dg=="}})).await?;
        ensure!(a.code == 201, "{}: {}", s.name, a.body);
    }
    let s1 = format!("{secrets}/pb-s1");
    let opts = |fields: &[Vec<u8>]| pb_body("v1", "DeleteOptions", &fields.concat());
    let precondition_uid = |uid: &str| pb(2, &pb(1, uid.as_bytes()));
    s.step_bytes(
        "client-go: protobuf delete, wrong uid precondition",
        "DELETE",
        &s1,
        pbct,
        opts(&[precondition_uid("nope")]),
    )
    .await?;
    s.step_bytes("client-go: protobuf delete, dryRun", "DELETE", &s1, pbct, opts(&[pb(5, b"All")])).await?;
    let after = s.send("GET", &s1, ct, &Value::Null).await?;
    s.record("client-go: protobuf delete, dryRun deletes nothing", json!(after.code));
    s.step_bytes("client-go: protobuf delete, dryRun of another value", "DELETE", &s1, pbct, opts(&[pb(5, b"Some")]))
        .await?;
    s.step_bytes(
        "client-go: protobuf delete, unknown propagationPolicy",
        "DELETE",
        &s1,
        pbct,
        opts(&[pb(4, b"Sideways")]),
    )
    .await?;
    s.step_bytes(
        "client-go: protobuf delete, orphanDependents with propagationPolicy",
        "DELETE",
        &s1,
        pbct,
        opts(&[vec![3 << 3, 1], pb(4, b"Orphan")]),
    )
    .await?;
    s.step_bytes("client-go: protobuf delete, not DeleteOptions", "DELETE", &s1, pbct, pb_body("v1", "Secret", b""))
        .await?;
    s.step_bytes("client-go: protobuf delete, no magic", "DELETE", &s1, pbct, b"{}".to_vec()).await?;
    s.step_bytes("client-go: protobuf delete, garbage", "DELETE", &s1, pbct, b"k8s\0\xff\xff".to_vec()).await?;
    let uid = after.body["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    s.step_bytes(
        "client-go: protobuf delete, right uid and Background",
        "DELETE",
        &s1,
        pbct,
        opts(&[precondition_uid(&uid), pb(4, b"Background")]),
    )
    .await?;
    s.step_bytes("client-go: protobuf delete, empty", "DELETE", &format!("{secrets}/pb-s2"), pbct, opts(&[])).await?;
    let meta_envelope = pb_body("meta.k8s.io/v1", "DeleteOptions", b"");
    s.step_bytes(
        "client-go: protobuf delete, meta.k8s.io/v1",
        "DELETE",
        &format!("{secrets}/pb-s3"),
        pbct,
        meta_envelope,
    )
    .await?;
    // A JSON body's dryRun (kube-rs and kubectl send it there) decides; with a body, the query's
    // dryRun does not count.
    let cm = |name: &str| json!({"metadata": {"name": name, "labels": {"pbdc": "1"}}, "data": {"k": "v"}});
    for name in ["pb-c1", "pb-c2", "pb-c3"] {
        s.send("POST", CONFIGMAPS, ct, &cm(name)).await?;
    }
    s.step(
        "client-go: json delete, dryRun in the body",
        "DELETE",
        &format!("{CONFIGMAPS}/pb-c1"),
        ct,
        json!({"dryRun": ["All"]}),
    )
    .await?;
    let after = s.send("GET", &format!("{CONFIGMAPS}/pb-c1"), ct, &Value::Null).await?;
    s.record("client-go: json delete, dryRun in the body deletes nothing", json!(after.code));
    s.step(
        "client-go: json delete, a body without dryRun overrides the query",
        "DELETE",
        &format!("{CONFIGMAPS}/pb-c1?dryRun=All"),
        ct,
        json!({"kind": "DeleteOptions", "apiVersion": "v1"}),
    )
    .await?;
    let after = s.send("GET", &format!("{CONFIGMAPS}/pb-c1"), ct, &Value::Null).await?;
    s.record("client-go: json delete, a body without dryRun deleted", json!(after.code));
    let a = s.send_bytes("DELETE", &format!("{CONFIGMAPS}?labelSelector=pbdc%3D1"), pbct, opts(&[])).await?;
    let left = s.send("GET", &format!("{CONFIGMAPS}?labelSelector=pbdc%3D1"), ct, &Value::Null).await?;
    s.record(
        "client-go: protobuf deletecollection",
        json!({"code": a.code, "left": left.body["items"].as_array().map(Vec::len)}),
    );
    // Other groups: client-go names its own group version in the envelope.
    let leases = "/apis/coordination.k8s.io/v1/namespaces/conformance/leases";
    s.send("POST", leases, ct, &json!({"metadata": {"name": "pb-lease"}, "spec": {"holderIdentity": "a"}})).await?;
    s.step_bytes(
        "client-go: protobuf delete of a Lease",
        "DELETE",
        &format!("{leases}/pb-lease"),
        pbct,
        pb_body("coordination.k8s.io/v1", "DeleteOptions", b""),
    )
    .await?;
    s.send("POST", APPS, ct, &app("cg-delete", json!({}))).await?;
    s.step_bytes(
        "client-go: protobuf delete of an Application",
        "DELETE",
        &format!("{APPS}/cg-delete"),
        pbct,
        pb_body("argoproj.io/v1alpha1", "DeleteOptions", b""),
    )
    .await?;
    // A typed create of a built-in kind not decoded here.
    let container = [pb(1, b"c"), pb(2, b"registry.example.com/app:1")].concat();
    let pod = [pb(1, &pb(1, b"pb-pod")), pb(2, &pb(2, &container))].concat();
    s.step_bytes(
        "client-go: protobuf create of a Pod",
        "POST",
        "/api/v1/namespaces/conformance/pods",
        pbct,
        pb_body("v1", "Pod", &pod),
    )
    .await?;
    Ok(())
}

fn app_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"), "applications")
}

async fn paging_and_selectors(s: &mut Server) -> Result<()> {
    let ct = "application/json";
    let labels = [
        ("sel-a", json!({"tier": "web", "env": "prod"})),
        ("sel-b", json!({"tier": "api", "env": "prod"})),
        ("sel-c", json!({"tier": "db"})),
        ("sel-d", json!({"env": "dev"})),
        ("sel-e", json!({"tier": "web", "canary": "true"})),
    ];
    for (name, l) in &labels {
        let a = s
            .send("POST", CONFIGMAPS, ct, &json!({"metadata": {"name": name, "labels": l}, "data": {"k": "v"}}))
            .await?;
        ensure!(a.code == 201, "{}: {}", s.name, a.body);
    }
    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
            .filter(|n| n.starts_with("sel-"))
            .collect()
    };
    for sel in [
        "tier=web",
        "tier==web",
        "tier!=web",
        "tier in (web,db)",
        "tier notin (web,db)",
        "tier",
        "!tier",
        "tier=web,env=prod",
        "env in (prod),!canary",
        "tier in ()",
        "a b",
        "tier=web,",
        "!tier=x",
        "x>1",
    ] {
        let q = encode(sel);
        let a = s.send("GET", &format!("{CONFIGMAPS}?labelSelector={q}"), ct, &Value::Null).await?;
        s.record(
            &format!("selector: label {sel:?}"),
            json!({"code": a.code, "names": names(&a.body), "reason": a.body["reason"]}),
        );
    }
    for sel in [
        "metadata.name=sel-a",
        "metadata.name!=sel-a",
        "metadata.namespace=conformance",
        "metadata.namespace==other",
        "spec.nodeName=x",
        "metadata.name",
        "status.phase=Running",
    ] {
        let q = encode(sel);
        let a = s.send("GET", &format!("{CONFIGMAPS}?fieldSelector={q}"), ct, &Value::Null).await?;
        s.record(
            &format!("selector: field {sel:?}"),
            json!({"code": a.code, "names": names(&a.body), "reason": a.body["reason"]}),
        );
    }
    // Paging: limit 2, each item exactly once, in name order; remainingItemCount only without
    // a selector. With a selector kube-apiserver may end with an empty page (it cannot know that
    // nothing more matches); the embedded server knows and ends a page earlier: empty pages are
    // not recorded (docs/apiserver.md).
    for (step, selector) in
        [("paging: limit=2", ""), ("paging: limit=2 with a selector", "&labelSelector=tier%20in%20(web,api,db)")]
    {
        let mut pages = Vec::new();
        let mut cont = String::new();
        loop {
            let q = if cont.is_empty() { String::new() } else { format!("&continue={cont}") };
            let a = s.send("GET", &format!("{CONFIGMAPS}?limit=2{selector}{q}"), ct, &Value::Null).await?;
            ensure!(a.code == 200, "{}: {}", s.name, a.body);
            let all: Vec<&str> = a.body["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["metadata"]["name"].as_str())
                .collect();
            if !all.is_empty() {
                pages.push(json!({"names": all, "remaining": a.body["metadata"]["remainingItemCount"]}));
            }
            match a.body["metadata"]["continue"].as_str() {
                Some(c) if !c.is_empty() => cont = c.to_string(),
                _ => break,
            }
            ensure!(pages.len() < 10, "{}: paging does not end", s.name);
        }
        s.record(step, json!(pages));
    }
    let bad = s.send("GET", &format!("{CONFIGMAPS}?limit=2&continue=garbage"), ct, &Value::Null).await?;
    s.record("paging: a garbage continue token", json!({"code": bad.code, "reason": bad.body["reason"]}));
    // kube-rs list with a selector.
    let api: Api<DynamicObject> = Api::namespaced_with(
        s.client(),
        NS,
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "ConfigMap"), "configmaps"),
    );
    let listed = api.list(&ListParams::default().labels("tier in (web),env")).await?;
    s.record(
        "selector: kube-rs list",
        json!(listed.items.iter().filter_map(|o| o.metadata.name.clone()).collect::<Vec<_>>()),
    );
    Ok(())
}

/// Field selectors per kind (kube-apiserver's field label conversions): Events by their
/// `involvedObject` as Argo CD's Events tab asks (`involvedObject.name=..,involvedObject.uid=..,
/// involvedObject.namespace=..`), `reason`, `type`, `source` (the component, else
/// `reportingComponent`); Pods, Secrets, Services and Namespaces by their own fields; and the
/// 400 for a field a kind does not have, whose message (two shapes) is compared too.
async fn field_selectors_by_kind(s: &mut Server) -> Result<()> {
    let ct = "application/json";
    let events = "/api/v1/namespaces/conformance/events";
    let event = |name: &str, involved: Value, extra: Value| {
        let mut e = json!({"metadata": {"name": name}, "involvedObject": involved, "message": "m"});
        merge(&mut e, &extra);
        e
    };
    for body in [
        event(
            "fs-a",
            json!({"kind": "Pod", "name": "web", "namespace": NS, "uid": "u-1", "apiVersion": "v1",
                "fieldPath": "spec.containers{web}"}),
            json!({"reason": "Pulled", "type": "Normal", "source": {"component": "kubelet"}}),
        ),
        event(
            "fs-b",
            json!({"kind": "ConfigMap", "name": "cfg", "namespace": NS, "uid": "u-2", "apiVersion": "v1",
                "resourceVersion": "7"}),
            json!({"reason": "Synced", "type": "Warning", "reportingComponent": "argocd-agent"}),
        ),
        event(
            "fs-c",
            json!({"kind": "Pod", "name": "web-2", "namespace": NS, "uid": "u-3", "apiVersion": "v1"}),
            json!({"reason": "Pulled", "type": "Normal", "source": {"component": "kubelet"},
                "reportingComponent": "other"}),
        ),
    ] {
        let a = s.send("POST", events, ct, &body).await?;
        ensure!(a.code == 201, "{}: {}", s.name, a.body);
    }
    let names = |v: &Value, prefix: &str| -> Vec<String> {
        let mut n: Vec<String> = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
            .filter(|n| n.starts_with(prefix))
            .collect();
        n.sort();
        n
    };
    let cases: [(&str, &str, &str); 22] = [
        (events, "fs-", "involvedObject.name=web,involvedObject.uid=u-1,involvedObject.namespace=conformance"),
        (events, "fs-", "involvedObject.kind=Pod,involvedObject.namespace=conformance"),
        (events, "fs-", "involvedObject.kind!=Pod"),
        (events, "fs-", "involvedObject.apiVersion==v1,involvedObject.fieldPath=spec.containers{web}"),
        (events, "fs-", "involvedObject.resourceVersion=7"),
        (events, "fs-", "reason=Pulled,type!=Warning"),
        (events, "fs-", "source=kubelet"),
        (events, "fs-", "source=argocd-agent"),
        (events, "fs-", "reportingComponent=other"),
        (events, "fs-", "metadata.name=fs-b"),
        (events, "fs-", "involvedObject.nope=x"),
        (events, "fs-", "spec.nodeName=x"),
        ("/api/v1/namespaces/conformance/pods", "", "spec.nodeName=n1,status.phase=Running"),
        ("/api/v1/namespaces/conformance/pods", "", "spec.restartPolicy=Always,spec.hostNetwork=false"),
        ("/api/v1/namespaces/conformance/pods", "", "spec.containers=x"),
        ("/api/v1/namespaces/conformance/secrets", "", "type=kubernetes.io/tls"),
        ("/api/v1/namespaces/conformance/secrets", "", "data=x"),
        ("/api/v1/namespaces/conformance/services", "", "spec.type=ClusterIP"),
        ("/api/v1/namespaces", NS, "status.phase=Active"),
        ("/api/v1/namespaces", NS, "metadata.namespace=x"),
        (CONFIGMAPS, "", "spec.nodeName=x"),
        (APPS, "", "spec.project=default"),
    ];
    for (path, prefix, sel) in cases {
        let a = s.send("GET", &format!("{path}?fieldSelector={}", encode(sel)), ct, &Value::Null).await?;
        let mut fact = json!({"code": a.code});
        if a.code == 200 {
            fact["names"] = json!(if prefix.is_empty() { Vec::new() } else { names(&a.body, prefix) });
        } else {
            fact["reason"] = a.body["reason"].clone();
            fact["message"] = a.body["message"].clone();
        }
        s.record(&format!("selector: field {sel:?} on {path}"), fact);
    }
    // A watch selects by the same fields.
    let list = s.send("GET", events, ct, &Value::Null).await?;
    let rv = list.body["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string();
    let later = event(
        "fs-d",
        json!({"kind": "Pod", "name": "web", "namespace": NS, "uid": "u-1", "apiVersion": "v1"}),
        json!({"reason": "Started", "type": "Normal"}),
    );
    let a = s.send("POST", events, ct, &later).await?;
    ensure!(a.code == 201, "{}: {}", s.name, a.body);
    let watched =
        watch_events(s, &format!("{events}?fieldSelector={}", encode("involvedObject.uid=u-1,reason=Started")), &rv, 1)
            .await?;
    s.record("selector: field on a watch of events", json!(watched));
    Ok(())
}

/// Events of a watch from `rv` until `count` events (bookmarks skipped) or the server ends it.
async fn watch_events(s: &Server, path: &str, rv: &str, count: usize) -> Result<Vec<Value>> {
    let sep = if path.contains('?') { '&' } else { '?' };
    let req =
        http::Request::get(format!("{path}{sep}watch=1&resourceVersion={rv}&timeoutSeconds=20")).body(Vec::new())?;
    let stream = s.client().request_stream(req).await?;
    let mut lines = stream.lines();
    let mut out = Vec::new();
    let read = async {
        while let Some(line) = lines.next().await {
            let ev: Value = serde_json::from_str(&line?)?;
            if ev["type"] == "BOOKMARK" {
                continue;
            }
            let o = &ev["object"];
            out.push(if ev["type"] == "ERROR" {
                json!({"type": "ERROR", "code": o["code"], "reason": o["reason"]})
            } else {
                json!({"type": ev["type"], "name": o["metadata"]["name"], "labels": o["metadata"]["labels"],
                       "deleting": o["metadata"].get("deletionTimestamp").is_some()})
            });
            if out.len() >= count || ev["type"] == "ERROR" {
                break;
            }
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(30), read).await.context("watch did not deliver in time")??;
    Ok(out)
}

async fn watches(s: &mut Server) -> Result<()> {
    let ct = "application/json";
    let list = s.send("GET", APPS, ct, &Value::Null).await?;
    let rv = list.body["metadata"]["resourceVersion"].as_str().context("list without resourceVersion")?.to_string();
    // Changes after the list: create, label, a finalizer-held delete, the finalizer removed.
    s.send("POST", APPS, ct, &app("w1", json!({"metadata": {"finalizers": ["example.com/hold"]}}))).await?;
    s.send("POST", APPS, ct, &app("w2", json!({}))).await?;
    s.send(
        "PATCH",
        &format!("{APPS}/w1"),
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"x": "1"}}}),
    )
    .await?;
    s.send("DELETE", &format!("{APPS}/w2"), ct, &Value::Null).await?;
    s.send("DELETE", &format!("{APPS}/w1"), ct, &Value::Null).await?;
    s.send("PATCH", &format!("{APPS}/w1"), "application/merge-patch+json", &json!({"metadata": {"finalizers": null}}))
        .await?;
    let events = watch_events(s, APPS, &rv, 6).await?;
    s.record("watch: from a resourceVersion, in order", json!(events));
    let labelled = watch_events(s, &format!("{APPS}?labelSelector=x"), &rv, 2).await?;
    // Selector transitions: w1 enters the selection when labelled (ADDED), leaves when deleted.
    s.record("watch: with a label selector", json!(labelled));
    Ok(())
}

/// Watching from a resourceVersion the server no longer has: an ERROR event with 410 Expired;
/// then a re-list works and a watch from its resourceVersion sees new changes. The embedded server
/// forgets its history on restart (the real one's watch cache starts when the type is served), so
/// it is restarted first; both then get resourceVersion "1", older than either keeps.
async fn gone_and_relist(s: &mut Server) -> Result<()> {
    if let Backend::Embedded(e) = &mut s.backend {
        e.restart().await?;
    }
    let old = watch_events(s, APPS, "1", 1).await?;
    s.record("410: watch from a compacted resourceVersion", json!(old));
    let list = s.send("GET", APPS, "application/json", &Value::Null).await?;
    let rv = list.body["metadata"]["resourceVersion"].as_str().context("list without resourceVersion")?.to_string();
    s.send("POST", APPS, "application/json", &app("after410", json!({}))).await?;
    let events = watch_events(s, APPS, &rv, 1).await?;
    s.record("410: re-list then watch", json!(events));
    Ok(())
}

async fn status_subresource(s: &mut Server) -> Result<()> {
    let ct = "application/json";
    let appset = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet", "metadata": {"name": "set"},
        "spec": {"generators": [], "template": {"metadata": {}, "spec": {"project": "default", "destination": {}}}},
        "status": {"conditions": [{"type": "ErrorOccurred", "status": "False", "message": "m", "reason": "r"}]},
    });
    let created = s.step("status: create drops status", "POST", APPSETS, ct, appset.clone()).await?;
    let mut main = appset.clone();
    main["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
    main["spec"]["goTemplate"] = json!(true);
    let updated =
        s.step("status: update of the main resource keeps status", "PUT", &format!("{APPSETS}/set"), ct, main).await?;
    let mut st = appset;
    st["metadata"]["resourceVersion"] = updated["metadata"]["resourceVersion"].clone();
    st["spec"]["goTemplate"] = json!(false);
    s.step("status: update of /status changes only status", "PUT", &format!("{APPSETS}/set/status"), ct, st).await?;
    s.step("status: merge patch of /status", "PATCH", &format!("{APPSETS}/set/status"), "application/merge-patch+json",
        json!({"status": {"conditions": [{"type": "ResourcesUpToDate", "status": "True", "message": "m", "reason": "r"}]}})).await?;
    s.step(
        "status: /status is validated",
        "PATCH",
        &format!("{APPSETS}/set/status"),
        "application/merge-patch+json",
        json!({"status": {"conditions": [{"type": "X"}]}}),
    )
    .await?;
    // Application has no status subresource: status is written with the object.
    s.step(
        "status: Application writes status with the object",
        "POST",
        APPS,
        ct,
        app("withstatus", json!({"status": {"sync": {"status": "Synced"}}})),
    )
    .await?;
    s.step("status: Application has no /status", "GET", &format!("{APPS}/withstatus/status"), ct, Value::Null).await?;
    Ok(())
}

async fn finalizers_and_namespaces(s: &mut Server) -> Result<()> {
    let ct = "application/json";
    s.step(
        "finalizer: create",
        "POST",
        APPS,
        ct,
        app("held", json!({"metadata": {"finalizers": ["example.com/hold"]}})),
    )
    .await?;
    s.step("finalizer: delete marks it", "DELETE", &format!("{APPS}/held"), ct, Value::Null).await?;
    s.step("finalizer: still there", "GET", &format!("{APPS}/held"), ct, Value::Null).await?;
    s.step(
        "finalizer: a new finalizer cannot be added while deleting",
        "PATCH",
        &format!("{APPS}/held"),
        "application/json-patch+json",
        json!([{"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/late"}]),
    )
    .await?;
    s.step(
        "finalizer: removing the last one deletes",
        "PATCH",
        &format!("{APPS}/held"),
        "application/merge-patch+json",
        json!({"metadata": {"finalizers": null}}),
    )
    .await?;
    s.step("finalizer: gone", "GET", &format!("{APPS}/held"), ct, Value::Null).await?;
    let pre = json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}});
    s.step("delete: a failed uid precondition is Conflict", "POST", APPS, ct, app("pre", json!({}))).await?;
    s.step("delete: precondition", "DELETE", &format!("{APPS}/pre"), ct, pre).await?;

    s.step("namespace: create", "POST", "/api/v1/namespaces", ct, json!({"metadata": {"name": "doomed"}})).await?;
    // Content held by a finalizer keeps the namespace Terminating on both servers.
    s.step(
        "namespace: content",
        "POST",
        "/api/v1/namespaces/doomed/configmaps",
        ct,
        json!({"metadata": {"name": "c", "finalizers": ["example.com/hold"]}}),
    )
    .await?;
    s.step("namespace: delete marks it Terminating", "DELETE", "/api/v1/namespaces/doomed", ct, Value::Null).await?;
    s.step(
        "namespace: new content is Forbidden",
        "POST",
        "/api/v1/namespaces/doomed/configmaps",
        ct,
        json!({"metadata": {"name": "late"}}),
    )
    .await?;
    s.step("namespace: an invalid name", "POST", "/api/v1/namespaces", ct, json!({"metadata": {"name": "Bad.Name"}}))
        .await?;
    // Without kube-controller-manager the real namespace stays Terminating with its content;
    // the embedded server (its own namespace controller) empties and removes it.
    if !s.is_real() {
        let cm = s.send("GET", "/api/v1/namespaces/doomed/configmaps/c", ct, &Value::Null).await?;
        ensure!(
            cm.body["metadata"]["deletionTimestamp"].is_string(),
            "the embedded server deletes the content: {}",
            cm.body
        );
        let released = s
            .send(
                "PATCH",
                "/api/v1/namespaces/doomed/configmaps/c",
                "application/merge-patch+json",
                &json!({"metadata": {"finalizers": null}}),
            )
            .await?;
        ensure!(released.code == 200, "{}", released.body);
        let mut poll = Poller::new(Duration::from_secs(20), "the embedded server to remove namespace doomed");
        while s.send("GET", "/api/v1/namespaces/doomed", ct, &Value::Null).await?.code != 404 {
            poll.tick().await?;
        }
    }
    Ok(())
}

async fn kubectl_flow(s: &mut Server) -> Result<()> {
    let good = serde_yaml::to_string(&app("kubectl-app", json!({})))?;
    let good_path = s.kubectl.write_manifest("good.yaml", &good)?;
    let unknown = serde_yaml::to_string(&app("kubectl-unknown", json!({"spec": {"bogus": 1}})))?;
    let unknown_path = s.kubectl.write_manifest("unknown.yaml", &unknown)?;
    let invalid = serde_yaml::to_string(&app("kubectl-invalid", json!({"spec": {"project": 5}})))?;
    let invalid_path = s.kubectl.write_manifest("invalid.yaml", &invalid)?;
    let (g, u, i) =
        (good_path.display().to_string(), unknown_path.display().to_string(), invalid_path.display().to_string());
    s.kubectl_step("kubectl: create -f", &["create", "-f", &g]).await?;
    s.kubectl_step("kubectl: create -f again", &["create", "-f", &g]).await?;
    s.kubectl_step("kubectl: apply with an unknown field (strict by default)", &["apply", "-f", &u]).await?;
    s.kubectl_step("kubectl: apply --validate=warn", &["apply", "--validate=warn", "-f", &u]).await?;
    s.kubectl_step("kubectl: apply of an invalid object", &["apply", "-f", &i]).await?;
    s.kubectl_step(
        "kubectl: patch --type merge",
        &["-n", NS, "patch", "application", "kubectl-app", "--type", "merge", "-p", r#"{"spec":{"project":"k"}}"#],
    )
    .await?;
    s.kubectl_step(
        "kubectl: patch --type json",
        &[
            "-n",
            NS,
            "patch",
            "application",
            "kubectl-app",
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/spec/project","value":"j"}]"#,
        ],
    )
    .await?;
    s.kubectl_step(
        "kubectl: patch with an unknown field",
        &["-n", NS, "patch", "application", "kubectl-app", "--type", "merge", "-p", r#"{"spec":{"bogus":1}}"#],
    )
    .await?;
    let out =
        s.kubectl_step("kubectl: get -o json", &["-n", NS, "get", "application", "kubectl-app", "-o", "json"]).await?;
    let obj: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    s.record("kubectl: the object", normalize(&obj));
    s.kubectl_step("kubectl: get a missing one", &["-n", NS, "get", "application", "nope"]).await?;
    s.kubectl_step("kubectl: label", &["-n", NS, "label", "application", "kubectl-app", "team=a"]).await?;
    let out = s
        .kubectl_step("kubectl: get -l", &["-n", NS, "get", "applications", "-l", "team in (a)", "-o", "name"])
        .await?;
    s.record("kubectl: get -l names", json!(out.lines().collect::<Vec<_>>()));
    s.kubectl_step("kubectl: delete", &["-n", NS, "delete", "application", "kubectl-app"]).await?;
    s.kubectl_step("kubectl: delete again", &["-n", NS, "delete", "application", "kubectl-app"]).await?;
    Ok(())
}

async fn run_all(s: &mut Server) -> Result<()> {
    crud_and_errors(s).await?;
    schema_pruning_and_validation(s).await?;
    patches(s).await?;
    client_go_bodies(s).await?;
    paging_and_selectors(s).await?;
    field_selectors_by_kind(s).await?;
    watches(s).await?;
    status_subresource(s).await?;
    finalizers_and_namespaces(s).await?;
    kubectl_flow(s).await?;
    gone_and_relist(s).await?;
    Ok(())
}

/// Both servers with the CRDs of `release`, every scenario on each, then compared.
async fn conformance(release: ArgoCdRelease) -> Result<()> {
    let (mut real, mut embedded) = start_servers(release).await?;
    let (r, e) = tokio::join!(run_all(&mut real), run_all(&mut embedded));
    r.context("on the real server")?;
    e.context("on the embedded server")?;
    if let Some(dir) = std::env::var_os("CONFORMANCE_DUMP_DIR") {
        for s in [&real, &embedded] {
            let raw: serde_json::Map<String, Value> = s.raw.iter().cloned().collect();
            std::fs::write(
                std::path::Path::new(&dir).join(format!("{}-v{}.json", s.name, release.version())),
                serde_json::to_vec_pretty(&raw)?,
            )?;
        }
    }
    compare(&real, &embedded).with_context(|| format!("with Argo CD v{}'s CRDs", release.version()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_conformance_embedded_matches_kube_apiserver_argocd_3_5() -> Result<()> {
    conformance(ArgoCdRelease::V3_5_1).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realkube_conformance_embedded_matches_kube_apiserver_argocd_3_6() -> Result<()> {
    conformance(ArgoCdRelease::V3_6_1).await
}
