//! kubectl (1.37, from the test venv) against a running `argocd-agent apiserver` process.
//!
//! Each test starts its own server on a fresh data dir. Manifests go through `apply -f`/`create -f`
//! (kubectl's typed `create namespace`/`create secret` send protobuf, which the server does not
//! decode yet).

use anyhow::{Context as _, ensure};
use serde_json::{Value, json};
use tests::fixtures::{application, application_without_finalizers, namespace, to_yaml};
use tests::{ApiServerProcess, DEFAULT_TIMEOUT, Kubectl, wait_for_async};

const NS: &str = "argocd";

/// A server with the `argocd` namespace applied, and kubectl for it.
async fn server_with_namespace() -> anyhow::Result<(ApiServerProcess, Kubectl)> {
    let server = ApiServerProcess::start().await?;
    let kubectl = server.kubectl()?;
    let out = kubectl.apply(&to_yaml(&namespace(NS))?).await?;
    ensure!(out.contains("namespace/argocd created"), "unexpected apply output: {out}");
    Ok((server, kubectl))
}

fn app_yaml(name: &str, revision: &str) -> anyhow::Result<String> {
    to_yaml(&application_without_finalizers(name, NS, revision))
}

/// A server with namespace `argocd` and Application `guestbook` in it.
async fn server_with_app() -> anyhow::Result<(ApiServerProcess, Kubectl)> {
    let (server, kubectl) = server_with_namespace().await?;
    let out = kubectl.apply(&app_yaml("guestbook", "HEAD")?).await?;
    ensure!(out.contains("application.argoproj.io/guestbook created"), "unexpected apply output: {out}");
    Ok((server, kubectl))
}

async fn get_app(kubectl: &Kubectl, name: &str) -> anyhow::Result<Value> {
    kubectl.get_yaml(["applications", "-n", NS, name]).await
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

fn i64_at(v: &Value, pointer: &str) -> i64 {
    v.pointer(pointer).and_then(Value::as_i64).unwrap_or(-1)
}

fn rv(v: &Value) -> anyhow::Result<u64> {
    let s = str_at(v, "/metadata/resourceVersion");
    s.parse().with_context(|| format!("resourceVersion {s:?} is not a number"))
}

/// Whether `out` reports that `kind "name"` was not found (kubectl's rendering of a 404 Status).
fn says_not_found(stderr: &str, resource: &str, name: &str) -> bool {
    stderr.contains("(NotFound)") && stderr.contains(&format!("{resource} \"{name}\" not found"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_resources_lists_the_served_types() -> anyhow::Result<()> {
    let server = ApiServerProcess::start().await?;
    let kubectl = server.kubectl()?;
    let out = kubectl.ok(["api-resources"]).await?;
    let rows: Vec<Vec<&str>> = out.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    let expected = [
        ("applications", "argoproj.io/v1alpha1", "Application"),
        ("appprojects", "argoproj.io/v1alpha1", "AppProject"),
        ("applicationsets", "argoproj.io/v1alpha1", "ApplicationSet"),
        ("namespaces", "v1", "Namespace"),
        ("secrets", "v1", "Secret"),
        ("configmaps", "v1", "ConfigMap"),
        ("pods", "v1", "Pod"),
        ("events", "v1", "Event"),
        ("services", "v1", "Service"),
        ("leases", "coordination.k8s.io/v1", "Lease"),
        ("customresourcedefinitions", "apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    ];
    for (name, api_version, kind) in expected {
        let row = rows.iter().find(|r| r.first() == Some(&name));
        let row = row.with_context(|| format!("api-resources does not list {name}:\n{out}"))?;
        ensure!(row.contains(&api_version) && row.last() == Some(&kind), "bad row for {name}: {row:?}\n{out}");
    }
    let versions = kubectl.ok(["api-versions"]).await?;
    for gv in ["v1", "argoproj.io/v1alpha1", "coordination.k8s.io/v1", "apiextensions.k8s.io/v1"] {
        ensure!(versions.lines().any(|l| l == gv), "api-versions lacks {gv}:\n{versions}");
    }
    let version: Value = serde_json::from_str(&kubectl.ok(["version", "-o", "json"]).await?)?;
    ensure!(!str_at(&version, "/serverVersion/gitVersion").is_empty(), "no server version: {version}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_creates_and_get_yaml_shows_server_set_fields() -> anyhow::Result<()> {
    let (_server, kubectl) = server_with_app().await?;
    let app = get_app(&kubectl, "guestbook").await?;
    let applied = application_without_finalizers("guestbook", NS, "HEAD");

    assert_eq!(str_at(&app, "/apiVersion"), "argoproj.io/v1alpha1");
    assert_eq!(str_at(&app, "/kind"), "Application");
    assert_eq!(app["spec"], applied["spec"], "spec differs from the manifest");
    assert_eq!(app["metadata"]["labels"], applied["metadata"]["labels"]);
    let uid = str_at(&app, "/metadata/uid");
    ensure!(uid.len() == 36 && uid.matches('-').count() == 4, "uid {uid:?} is not a UUID");
    ensure!(rv(&app)? > 0, "resourceVersion must be set");
    let created = str_at(&app, "/metadata/creationTimestamp");
    ensure!(created.len() == 20 && created.ends_with('Z') && created.contains('T'), "creationTimestamp {created:?}");
    assert_eq!(i64_at(&app, "/metadata/generation"), 1);
    ensure!(
        !str_at(&app, "/metadata/annotations/kubectl.kubernetes.io~1last-applied-configuration").is_empty(),
        "apply must record last-applied-configuration: {app}"
    );

    // Re-applying the same manifest changes nothing; a changed one updates and bumps generation.
    let out = kubectl.apply(&app_yaml("guestbook", "HEAD")?).await?;
    ensure!(out.contains("application.argoproj.io/guestbook unchanged"), "{out}");
    assert_eq!(rv(&get_app(&kubectl, "guestbook").await?)?, rv(&app)?, "a no-op apply must not write");
    let out = kubectl.apply(&app_yaml("guestbook", "v2.0.0")?).await?;
    ensure!(out.contains("application.argoproj.io/guestbook configured"), "{out}");
    let app2 = get_app(&kubectl, "guestbook").await?;
    assert_eq!(str_at(&app2, "/spec/source/targetRevision"), "v2.0.0");
    assert_eq!(i64_at(&app2, "/metadata/generation"), 2);
    assert_eq!(str_at(&app2, "/metadata/uid"), uid);

    // create -f: created once, AlreadyExists the second time.
    let manifest = kubectl.write_manifest("create.yaml", &app_yaml("created", "HEAD")?)?;
    let manifest = manifest.to_string_lossy().into_owned();
    let out = kubectl.ok(["create", "-f", &manifest]).await?;
    ensure!(out.contains("application.argoproj.io/created created"), "{out}");
    let again = kubectl.fails(["create", "-f", &manifest]).await?;
    ensure!(again.stderr.contains("AlreadyExists") && again.stderr.contains("already exists"), "{again}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_merge_changes_spec_and_bumps_generation() -> anyhow::Result<()> {
    let (_server, kubectl) = server_with_app().await?;
    let before = get_app(&kubectl, "guestbook").await?;
    let patch = r#"{"spec":{"source":{"targetRevision":"v1.2.3"},"destination":{"namespace":"guestbook-prod"}}}"#;
    let out = kubectl.ok(["patch", "application", "guestbook", "-n", NS, "--type", "merge", "-p", patch]).await?;
    ensure!(out.contains("application.argoproj.io/guestbook patched"), "{out}");
    let after = get_app(&kubectl, "guestbook").await?;
    assert_eq!(str_at(&after, "/spec/source/targetRevision"), "v1.2.3");
    assert_eq!(str_at(&after, "/spec/destination/namespace"), "guestbook-prod");
    assert_eq!(after["spec"]["syncPolicy"], before["spec"]["syncPolicy"], "merge patch must keep other fields");
    assert_eq!(i64_at(&after, "/metadata/generation"), 2);
    ensure!(rv(&after)? > rv(&before)?, "resourceVersion must grow");

    // Metadata-only changes do not bump generation.
    let out = kubectl
        .ok([
            "patch",
            "application",
            "guestbook",
            "-n",
            NS,
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"labels":{"tier":"web"}}}"#,
        ])
        .await?;
    ensure!(out.contains("patched"), "{out}");
    let labelled = get_app(&kubectl, "guestbook").await?;
    assert_eq!(str_at(&labelled, "/metadata/labels/tier"), "web");
    assert_eq!(i64_at(&labelled, "/metadata/generation"), 2);

    // A patch that changes nothing does not write.
    let out = kubectl.ok(["patch", "application", "guestbook", "-n", NS, "--type", "merge", "-p", patch]).await?;
    ensure!(out.contains("patched (no change)"), "a no-op patch must leave the object as is: {out}");
    assert_eq!(rv(&get_app(&kubectl, "guestbook").await?)?, rv(&labelled)?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_json_applies_operations_and_rejects_failed_tests() -> anyhow::Result<()> {
    let (_server, kubectl) = server_with_app().await?;
    let patch = json!([
        {"op": "replace", "path": "/spec/destination/namespace", "value": "guestbook-2"},
        {"op": "add", "path": "/metadata/labels/patched", "value": "json"},
        {"op": "remove", "path": "/spec/syncPolicy/automated"},
        {"op": "add", "path": "/spec/syncPolicy/syncOptions/-", "value": "PruneLast=true"},
    ])
    .to_string();
    let out = kubectl.ok(["patch", "application", "guestbook", "-n", NS, "--type", "json", "-p", &patch]).await?;
    ensure!(out.contains("application.argoproj.io/guestbook patched"), "{out}");
    let app = get_app(&kubectl, "guestbook").await?;
    assert_eq!(str_at(&app, "/spec/destination/namespace"), "guestbook-2");
    assert_eq!(str_at(&app, "/metadata/labels/patched"), "json");
    assert_eq!(app.pointer("/spec/syncPolicy/automated"), None);
    assert_eq!(
        app["spec"]["syncPolicy"]["syncOptions"],
        json!(["CreateNamespace=true", "ServerSideApply=true", "PruneLast=true"])
    );
    assert_eq!(i64_at(&app, "/metadata/generation"), 2);

    // A failing "test" operation rejects the whole patch.
    let failing = json!([
        {"op": "test", "path": "/spec/project", "value": "not-the-project"},
        {"op": "replace", "path": "/spec/project", "value": "hijacked"},
    ])
    .to_string();
    let out = kubectl.fails(["patch", "application", "guestbook", "-n", NS, "--type", "json", "-p", &failing]).await?;
    ensure!(out.stderr.contains("Error from server") || out.stderr.contains("is invalid"), "{out}");
    let unchanged = get_app(&kubectl, "guestbook").await?;
    assert_eq!(str_at(&unchanged, "/spec/project"), "default");
    assert_eq!(rv(&unchanged)?, rv(&app)?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_prints_changes_made_after_it_started() -> anyhow::Result<()> {
    let (_server, kubectl) = server_with_app().await?;
    let mut watch = kubectl.spawn_watch(["get", "applications", "-n", NS, "--watch", "--output-watch-events"])?;
    let event = |kind: &'static str, name: &'static str| {
        move |line: &str| {
            let mut cols = line.split_whitespace();
            cols.next() == Some(kind) && cols.next() == Some(name)
        }
    };
    // The initial list: once printed, the watch runs from that list's resourceVersion, so every
    // later change is reported.
    watch.wait_for_line(DEFAULT_TIMEOUT, event("ADDED", "guestbook")).await?;

    kubectl.ok(["label", "application", "guestbook", "-n", NS, "watched=yes"]).await?;
    watch.wait_for_line(DEFAULT_TIMEOUT, event("MODIFIED", "guestbook")).await?;

    kubectl.apply(&app_yaml("guestbook-2", "HEAD")?).await?;
    watch.wait_for_line(DEFAULT_TIMEOUT, event("ADDED", "guestbook-2")).await?;

    kubectl.ok(["delete", "application", "guestbook-2", "-n", NS]).await?;
    watch.wait_for_line(DEFAULT_TIMEOUT, event("DELETED", "guestbook-2")).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_the_application() -> anyhow::Result<()> {
    let (_server, kubectl) = server_with_app().await?;
    let out = kubectl.ok(["delete", "application", "guestbook", "-n", NS]).await?;
    ensure!(out.contains("\"guestbook\" deleted"), "{out}");
    let get = kubectl.fails(["get", "application", "guestbook", "-n", NS]).await?;
    ensure!(says_not_found(&get.stderr, "applications.argoproj.io", "guestbook"), "{get}");
    let list = kubectl.run(["get", "applications", "-n", NS]).await?;
    ensure!(list.success() && list.stderr.contains("No resources found in argocd namespace."), "{list}");
    let again = kubectl.fails(["delete", "application", "guestbook", "-n", NS]).await?;
    ensure!(says_not_found(&again.stderr, "applications.argoproj.io", "guestbook"), "{again}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_an_object_with_a_finalizer_waits_for_its_removal() -> anyhow::Result<()> {
    let (_server, kubectl) = server_with_namespace().await?;
    kubectl.apply(&to_yaml(&application("guarded", NS, "HEAD"))?).await?;
    kubectl.ok(["delete", "application", "guarded", "-n", NS, "--wait=false"]).await?;
    let app = get_app(&kubectl, "guarded").await?;
    ensure!(!str_at(&app, "/metadata/deletionTimestamp").is_empty(), "deletion must be pending: {app}");
    assert_eq!(app["metadata"]["finalizers"], json!(["resources-finalizer.argocd.argoproj.io"]));

    // What Argo CD does once the app's resources are pruned: drop the finalizer.
    let remove = r#"[{"op":"remove","path":"/metadata/finalizers"}]"#;
    kubectl.ok(["patch", "application", "guarded", "-n", NS, "--type", "json", "-p", remove]).await?;
    kubectl.ok(["wait", "--for=delete", "application/guarded", "-n", NS, "--timeout=30s"]).await?;
    let get = kubectl.fails(["get", "application", "guarded", "-n", NS]).await?;
    ensure!(says_not_found(&get.stderr, "applications.argoproj.io", "guarded"), "{get}");
    Ok(())
}

const WIDGET_CRD: &str = r"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names:
    plural: widgets
    singular: widget
    kind: Widget
    listKind: WidgetList
    shortNames: [wdg]
  versions:
  - name: v1
    served: true
    storage: true
    additionalPrinterColumns:
    - name: Color
      type: string
      jsonPath: .spec.color
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size:
                type: integer
              color:
                type: string
";

const WIDGET: &str = r"apiVersion: example.com/v1
kind: Widget
metadata:
  name: w1
  namespace: argocd
spec:
  size: 3
  color: blue
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_of_a_new_kind_is_served_once_created() -> anyhow::Result<()> {
    let (_server, kubectl) = server_with_namespace().await?;
    let before = kubectl.fails(["get", "widgets", "-n", NS]).await?;
    ensure!(before.stderr.contains("the server doesn't have a resource type \"widgets\""), "{before}");

    let out = kubectl.apply(WIDGET_CRD).await?;
    ensure!(out.contains("customresourcedefinition.apiextensions.k8s.io/widgets.example.com created"), "{out}");
    kubectl.ok(["wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=30s"]).await?;

    let out = kubectl.apply(WIDGET).await?;
    ensure!(out.contains("widget.example.com/w1 created"), "{out}");
    let table = kubectl.ok(["get", "widgets", "-n", NS]).await?;
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "COLOR", "AGE"], "printer columns of the CRD:\n{table}");
    ensure!(table.lines().skip(1).any(|l| l.split_whitespace().take(2).eq(["w1", "blue"])), "{table}");

    let w1 = kubectl.get_yaml(["wdg", "w1", "-n", NS]).await?;
    assert_eq!(str_at(&w1, "/kind"), "Widget");
    assert_eq!(w1["spec"], json!({"size": 3, "color": "blue"}));
    assert_eq!(i64_at(&w1, "/metadata/generation"), 1);
    ensure!(!str_at(&w1, "/metadata/uid").is_empty(), "{w1}");

    let resources = kubectl.ok(["api-resources", "--api-group", "example.com"]).await?;
    ensure!(resources.lines().any(|l| l.starts_with("widgets ") && l.contains("example.com/v1")), "{resources}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_namespace_removes_the_objects_in_it() -> anyhow::Result<()> {
    let (_server, kubectl) = server_with_namespace().await?;
    let team = "team-a";
    let manifests = [
        to_yaml(&namespace(team))?,
        to_yaml(&application_without_finalizers("in-team", team, "HEAD"))?,
        to_yaml(&application_without_finalizers("elsewhere", NS, "HEAD"))?,
        to_yaml(&json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": team}, "data": {"mode": "fast"},
        }))?,
        to_yaml(&json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "repo-creds", "namespace": team}, "stringData": {"password": "hunter2"},
        }))?,
    ];
    kubectl.apply(&manifests.join("---\n")).await?;
    let listed = kubectl.ok(["get", "applications,configmaps,secrets", "-n", team, "-o", "name"]).await?;
    for name in ["application.argoproj.io/in-team", "configmap/settings", "secret/repo-creds"] {
        ensure!(listed.lines().any(|l| l == name), "{name} missing before the delete:\n{listed}");
    }

    let out = kubectl.ok(["delete", "namespace", team]).await?;
    ensure!(out.contains("namespace \"team-a\" deleted"), "{out}");
    // Namespace deletion is asynchronous in Kubernetes; kubectl waited, but poll to be exact.
    wait_for_async(DEFAULT_TIMEOUT, "namespace team-a to be gone", || async {
        let get = kubectl.run(["get", "namespace", team]).await?;
        Ok((!get.success() && says_not_found(&get.stderr, "namespaces", team)).then_some(()))
    })
    .await?;
    let left = kubectl.run(["get", "applications,configmaps,secrets", "-n", team, "-o", "name"]).await?;
    ensure!(left.success() && left.stdout.trim().is_empty(), "objects left in the deleted namespace: {left}");
    let all = kubectl.ok(["get", "applications", "-A", "-o", "name"]).await?;
    assert_eq!(all.trim(), "application.argoproj.io/elsewhere", "only the other namespace's app must remain");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_name_is_rejected_with_invalid_value() -> anyhow::Result<()> {
    let (_server, kubectl) = server_with_namespace().await?;
    let out = kubectl.run_apply(&app_yaml("Guestbook_Invalid!", "HEAD")?).await?;
    ensure!(!out.success(), "an invalid name must be rejected: {out}");
    ensure!(out.stderr.contains("Invalid value") && out.stderr.contains("metadata.name"), "{out}");
    ensure!(out.stderr.contains("is invalid"), "kubectl should render a 422 Invalid status: {out}");
    let list = kubectl.run(["get", "applications", "-n", NS, "-o", "name"]).await?;
    ensure!(list.success() && list.stdout.trim().is_empty(), "nothing must be created: {list}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_resource_types_fail() -> anyhow::Result<()> {
    let server = ApiServerProcess::start().await?;
    let kubectl = server.kubectl()?;
    let get = kubectl.fails(["get", "frobnicators"]).await?;
    ensure!(get.stderr.contains("the server doesn't have a resource type \"frobnicators\""), "{get}");
    let unknown_kind = "apiVersion: example.com/v1\nkind: Frobnicator\nmetadata:\n  name: f\n  namespace: default\n";
    let apply = kubectl.run_apply(unknown_kind).await?;
    ensure!(!apply.success(), "{apply}");
    ensure!(apply.stderr.contains("no matches for kind \"Frobnicator\" in version \"example.com/v1\""), "{apply}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_of_get_output_list_restores_deleted_objects() -> anyhow::Result<()> {
    let (_server, kubectl) = server_with_app().await?;
    kubectl.apply(&app_yaml("guestbook-2", "v2")?).await?;
    // Backup and restore as users do it: `get -o yaml` prints a `kind: List`.
    let backup = kubectl.ok(["get", "applications", "-n", NS, "-o", "yaml"]).await?;
    ensure!(backup.contains("kind: List"), "{backup}");
    kubectl.ok(["delete", "applications", "--all", "-n", NS]).await?;
    let out = kubectl.apply(&backup).await?;
    ensure!(out.contains("application.argoproj.io/guestbook created"), "{out}");
    ensure!(out.contains("application.argoproj.io/guestbook-2 created"), "{out}");
    let restored = get_app(&kubectl, "guestbook-2").await?;
    assert_eq!(str_at(&restored, "/spec/source/targetRevision"), "v2");
    Ok(())
}
