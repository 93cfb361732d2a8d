//! kube-rs against the embedded API server, in-process: CRUD, conflicts, watches and their
//! recovery, status subresource, finalizers, selectors, paging and error codes.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use apiserver::{ApiServer, Config};
use futures::{StreamExt as _, TryStreamExt as _};
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

struct Cluster {
    server: ApiServer,
    client: kube::Client,
    _dir: tempfile::TempDir,
}

async fn start_with(f: impl FnOnce(&mut Config)) -> Result<Cluster> {
    let dir = tempfile::tempdir()?;
    let mut cfg = Config::new(dir.path().join("data"));
    f(&mut cfg);
    let server = ApiServer::start(cfg).await?;
    let client = server.client().await?;
    Ok(Cluster { server, client, _dir: dir })
}

async fn start() -> Result<Cluster> {
    start_with(|_| {}).await
}

fn app_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"), "applications")
}

fn appset_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "ApplicationSet"),
        "applicationsets",
    )
}

fn apps(c: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(c.clone(), ns, &app_resource())
}

fn app(name: &str, labels: Value) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "labels": labels},
        "spec": {"project": "default", "source": {"repoURL": "https://example.com/r.git", "path": name}, "destination": {"namespace": name}},
    }))?)
}

async fn namespace(c: &kube::Client, name: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(c.clone()).create(&PostParams::default(), &ns).await?;
    Ok(())
}

fn err_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

#[tokio::test]
async fn crud_generation_and_conflicts() -> Result<()> {
    let c = start().await?;
    namespace(&c.client, "argocd").await?;
    let api = apps(&c.client, "argocd");
    let created = api.create(&PostParams::default(), &app("guestbook", json!({}))?).await?;
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    let rv1: u64 = created.metadata.resource_version.clone().context("rv")?.parse()?;

    // A spec change bumps generation; a label change does not.
    let patched =
        api.patch("guestbook", &PatchParams::default(), &Patch::Merge(json!({"spec": {"project": "p2"}}))).await?;
    assert_eq!(patched.metadata.generation, Some(2));
    let rv2: u64 = patched.metadata.resource_version.clone().context("rv")?.parse()?;
    assert!(rv2 > rv1, "resourceVersion increases");
    let labelled = api
        .patch("guestbook", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})))
        .await?;
    assert_eq!(labelled.metadata.generation, Some(2));

    // JSON patch.
    let p: json_patch::Patch =
        serde_json::from_value(json!([{"op": "replace", "path": "/spec/project", "value": "p3"}]))?;
    let jp = api.patch("guestbook", &PatchParams::default(), &Patch::<()>::Json(p)).await?;
    assert_eq!(jp.data["spec"]["project"], "p3");

    // Optimistic concurrency: replacing with a stale resourceVersion is a 409.
    let mut stale = created.clone();
    stale.data["spec"]["project"] = json!("stale");
    let err =
        api.replace("guestbook", &PostParams::default(), &stale).await.err().context("stale replace must fail")?;
    assert_eq!(err_code(&err), Some(409));
    let mut fresh = api.get("guestbook").await?;
    fresh.data["spec"]["project"] = json!("fresh");
    let replaced = api.replace("guestbook", &PostParams::default(), &fresh).await?;
    assert_eq!(replaced.data["spec"]["project"], "fresh");

    // Creating twice is 409 AlreadyExists.
    let dup = api.create(&PostParams::default(), &app("guestbook", json!({}))?).await.err().context("dup")?;
    assert_eq!(err_code(&dup), Some(409));

    api.delete("guestbook", &DeleteParams::default()).await?;
    assert_eq!(api.get("guestbook").await.err().as_ref().and_then(err_code), Some(404));
    c.server.shutdown().await;
    Ok(())
}

async fn next_event(
    stream: &mut (impl futures::Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>> + Unpin),
) -> Result<watcher::Event<DynamicObject>> {
    loop {
        match tokio::time::timeout(DEADLINE, stream.next()).await {
            Err(_) => bail!("no watch event within {DEADLINE:?}"),
            Ok(None) => bail!("watch stream ended"),
            Ok(Some(Ok(e))) => return Ok(e),
            // The watcher retries by itself; errors in between are part of recovery.
            Ok(Some(Err(_))) => {}
        }
    }
}

/// Apply/Delete events only, as (kind, name, project).
fn describe(e: &watcher::Event<DynamicObject>) -> Option<(String, String, String)> {
    let (kind, o) = match e {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => ("apply", o),
        watcher::Event::Delete(o) => ("delete", o),
        _ => return None,
    };
    Some((
        kind.to_string(),
        o.metadata.name.clone().unwrap_or_default(),
        o.data["spec"]["project"].as_str().unwrap_or_default().to_string(),
    ))
}

#[tokio::test]
async fn watcher_sees_ordered_add_update_delete() -> Result<()> {
    let c = start().await?;
    namespace(&c.client, "argocd").await?;
    let api = apps(&c.client, "argocd");
    api.create(&PostParams::default(), &app("before", json!({}))?).await?;
    let mut w = watcher(api.clone(), watcher::Config::default()).boxed();
    assert!(matches!(next_event(&mut w).await?, watcher::Event::Init));
    assert_eq!(describe(&next_event(&mut w).await?).map(|d| d.1), Some("before".into()));
    assert!(matches!(next_event(&mut w).await?, watcher::Event::InitDone));

    api.create(&PostParams::default(), &app("a", json!({}))?).await?;
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"project": "p1"}}))).await?;
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"project": "p2"}}))).await?;
    api.delete("a", &DeleteParams::default()).await?;
    let mut seen = Vec::new();
    while seen.len() < 4 {
        if let Some(d) = describe(&next_event(&mut w).await?) {
            seen.push(d);
        }
    }
    let expect = |k: &str, p: &str| (k.to_string(), "a".to_string(), p.to_string());
    assert_eq!(
        seen,
        vec![expect("apply", "default"), expect("apply", "p1"), expect("apply", "p2"), expect("delete", "p2")]
    );
    c.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn raw_watch_resumes_from_a_resource_version_and_old_ones_are_gone() -> Result<()> {
    let c = start_with(|cfg| cfg.watch_history = 5).await?;
    namespace(&c.client, "argocd").await?;
    let api = apps(&c.client, "argocd");
    let first = api.create(&PostParams::default(), &app("a", json!({}))?).await?;
    let rv_after_a = first.metadata.resource_version.clone().context("rv")?;
    // Changes made while no one watches...
    api.create(&PostParams::default(), &app("b", json!({}))?).await?;
    api.create(&PostParams::default(), &app("c", json!({}))?).await?;
    // ...are replayed in order to a watch that resumes from the version it last saw.
    let mut s = api.watch(&WatchParams::default().timeout(5), &rv_after_a).await?.boxed();
    let mut names = Vec::new();
    while names.len() < 2 {
        match tokio::time::timeout(DEADLINE, s.try_next()).await?? {
            Some(WatchEvent::Added(o)) => names.push(o.metadata.name.unwrap_or_default()),
            Some(other) => bail!("unexpected event {other:?}"),
            None => bail!("watch ended early"),
        }
    }
    assert_eq!(names, vec!["b", "c"]);
    drop(s);

    // Push the history past that version: the watch answers 410 Expired.
    for i in 0..10 {
        api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"n": i}}))).await?;
    }
    let mut s = api.watch(&WatchParams::default().timeout(5), &rv_after_a).await?.boxed();
    match tokio::time::timeout(DEADLINE, s.try_next()).await?? {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => bail!("expected a 410 error event, got {other:?}"),
    }
    c.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn watcher_recovers_from_410_by_relisting() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cfg = Config::new(dir.path().join("data"));
    cfg.watch_history = 3;
    let server = ApiServer::start(cfg.clone()).await?;
    let client = server.client().await?;
    namespace(&client, "argocd").await?;
    let api = apps(&client, "argocd");
    api.create(&PostParams::default(), &app("a", json!({}))?).await?;
    let mut w = watcher(api.clone(), watcher::Config::default()).boxed();
    while !matches!(next_event(&mut w).await?, watcher::Event::InitDone) {}

    // While the watched server is down, another server on the same data dir takes writes.
    // History is not kept across restarts, so when the watched address comes back its
    // resourceVersion is older than anything retained: 410, and the watcher must re-list.
    let addr = server.addr();
    server.shutdown().await;
    let interim = ApiServer::start(cfg.clone()).await?;
    let writer = apps(&interim.client().await?, "argocd");
    for n in ["b", "c", "d", "e", "f"] {
        writer.create(&PostParams::default(), &app(n, json!({}))?).await?;
    }
    interim.shutdown().await;
    cfg.listen = addr;
    let server = ApiServer::start(cfg).await?;
    let mut relisted = Vec::new();
    loop {
        match next_event(&mut w).await? {
            watcher::Event::Init => relisted.clear(),
            watcher::Event::InitApply(o) => relisted.push(o.metadata.name.unwrap_or_default()),
            watcher::Event::InitDone => break,
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => {
                bail!("expected a re-list after 410, got a plain event")
            }
        }
    }
    relisted.sort();
    assert_eq!(relisted, vec!["a", "b", "c", "d", "e", "f"]);
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn bookmarks_carry_the_current_resource_version() -> Result<()> {
    let c = start_with(|cfg| cfg.bookmark_interval = Duration::from_millis(100)).await?;
    namespace(&c.client, "argocd").await?;
    let api = apps(&c.client, "argocd");
    let created = api.create(&PostParams::default(), &app("a", json!({}))?).await?;
    let rv = created.metadata.resource_version.context("rv")?;
    let mut s = api.watch(&WatchParams::default().timeout(10), &rv).await?.boxed();
    // Another type's write moves the global version; the bookmark reports it.
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), "argocd");
    let cm = cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "x"}}))?).await?;
    let cm_rv = cm.metadata.resource_version.context("rv")?;
    loop {
        match tokio::time::timeout(DEADLINE, s.try_next()).await?? {
            Some(WatchEvent::Bookmark(b)) if b.metadata.resource_version == cm_rv => break,
            Some(WatchEvent::Bookmark(_)) => {}
            other => bail!("expected bookmarks only, got {other:?}"),
        }
    }
    c.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn status_subresource_separates_spec_and_status_writes() -> Result<()> {
    let c = start().await?;
    namespace(&c.client, "argocd").await?;
    let api: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), "argocd", &appset_resource());
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
        "metadata": {"name": "set"}, "spec": {"generators": []}, "status": {"conditions": [{"type": "Forged"}]},
    }))?;
    let created = api.create(&PostParams::default(), &obj).await?;
    assert!(created.data.get("status").is_none(), "create cannot set status");

    let with_status = api
        .patch_status(
            "set",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ok"}, "spec": {"x": 1}})),
        )
        .await?;
    assert_eq!(with_status.data["status"]["phase"], "Ok");
    assert!(with_status.data["spec"].get("x").is_none(), "a status write changes only status");
    assert_eq!(with_status.metadata.generation, Some(1));

    let mut main = with_status.clone();
    main.data["status"] = json!({"phase": "Evil"});
    main.data["spec"]["x"] = json!(2);
    let replaced = api.replace("set", &PostParams::default(), &main).await?;
    assert_eq!(replaced.data["status"]["phase"], "Ok", "a main write leaves status alone");
    assert_eq!(replaced.data["spec"]["x"], 2);
    assert_eq!(replaced.metadata.generation, Some(2));

    let mut st = replaced.clone();
    st.data["status"] = json!({"phase": "Done"});
    st.data["spec"]["x"] = json!(3);
    let after = api.replace_status("set", &PostParams::default(), &st).await?;
    assert_eq!((after.data["status"]["phase"].clone(), after.data["spec"]["x"].clone()), (json!("Done"), json!(2)));

    // Application has no status subresource (as in Argo CD's CRD): /status is not found.
    let apps = apps(&c.client, "argocd");
    apps.create(&PostParams::default(), &app("a", json!({}))?).await?;
    let e = apps
        .patch_status("a", &PatchParams::default(), &Patch::Merge(json!({"status": {}})))
        .await
        .err()
        .context("404")?;
    assert_eq!(err_code(&e), Some(404));
    c.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() -> Result<()> {
    let c = start().await?;
    namespace(&c.client, "argocd").await?;
    let api = apps(&c.client, "argocd");
    let mut a = app("a", json!({}))?;
    a.metadata.finalizers = Some(vec!["resources-finalizer.argocd.argoproj.io".into()]);
    api.create(&PostParams::default(), &a).await?;
    let mut w = watcher(api.clone(), watcher::Config::default()).boxed();
    while !matches!(next_event(&mut w).await?, watcher::Event::InitDone) {}

    api.delete("a", &DeleteParams::default()).await?;
    let marked = api.get("a").await?;
    assert!(marked.metadata.deletion_timestamp.is_some(), "delete marks an object that has finalizers");
    // Deleting again is harmless.
    api.delete("a", &DeleteParams::default()).await?;
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    assert_eq!(
        api.get("a").await.err().as_ref().and_then(err_code),
        Some(404),
        "removing the last finalizer removes it"
    );

    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        if let Some((k, _, _)) = describe(&next_event(&mut w).await?) {
            kinds.push(k);
        }
    }
    assert_eq!(kinds, vec!["apply", "delete"]);
    c.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn label_and_field_selectors_every_operator() -> Result<()> {
    let c = start().await?;
    namespace(&c.client, "a").await?;
    namespace(&c.client, "b").await?;
    let a = apps(&c.client, "a");
    a.create(&PostParams::default(), &app("x1", json!({"env": "prod", "tier": "web"}))?).await?;
    a.create(&PostParams::default(), &app("x2", json!({"env": "dev", "tier": "db"}))?).await?;
    a.create(&PostParams::default(), &app("x3", json!({"env": "test"}))?).await?;
    apps(&c.client, "b").create(&PostParams::default(), &app("x4", json!({"env": "prod"}))?).await?;
    let all: Api<DynamicObject> = Api::all_with(c.client.clone(), &app_resource());
    let names = |lp: ListParams| {
        let all = all.clone();
        async move {
            let mut n: Vec<String> = all.list(&lp).await?.items.into_iter().filter_map(|o| o.metadata.name).collect();
            n.sort();
            Ok::<_, anyhow::Error>(n)
        }
    };
    let lp = |s: &str| ListParams::default().labels(s);
    assert_eq!(names(lp("env=prod")).await?, ["x1", "x4"]);
    assert_eq!(names(lp("env==dev")).await?, ["x2"]);
    assert_eq!(names(lp("env!=prod")).await?, ["x2", "x3"]);
    assert_eq!(names(lp("env in (dev,test)")).await?, ["x2", "x3"]);
    assert_eq!(names(lp("env notin (dev,test)")).await?, ["x1", "x4"]);
    assert_eq!(names(lp("tier")).await?, ["x1", "x2"]);
    assert_eq!(names(lp("!tier")).await?, ["x3", "x4"]);
    assert_eq!(names(lp("env=prod,tier")).await?, ["x1"]);
    let fp = |s: &str| ListParams::default().fields(s);
    assert_eq!(names(fp("metadata.name=x2")).await?, ["x2"]);
    assert_eq!(names(fp("metadata.namespace=b")).await?, ["x4"]);
    assert_eq!(names(fp("metadata.namespace!=b")).await?, ["x1", "x2", "x3"]);
    let bad = all.list(&fp("spec.project=default")).await.err().context("unsupported field")?;
    assert_eq!(err_code(&bad), Some(400));

    // A watch with a selector sees an object enter (ADDED) and leave (DELETED) the selection.
    let rv = a.list(&ListParams::default()).await?.metadata.resource_version.context("rv")?;
    let mut s = a.watch(&WatchParams::default().labels("env=prod").timeout(10), &rv).await?.boxed();
    a.patch("x3", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"env": "prod"}}}))).await?;
    a.patch("x3", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"env": "gone"}}}))).await?;
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        match tokio::time::timeout(DEADLINE, s.try_next()).await?? {
            Some(WatchEvent::Added(o)) if o.metadata.name.as_deref() == Some("x3") => kinds.push("added"),
            Some(WatchEvent::Deleted(o)) if o.metadata.name.as_deref() == Some("x3") => kinds.push("deleted"),
            Some(other) => bail!("unexpected {other:?}"),
            None => bail!("watch ended"),
        }
    }
    assert_eq!(kinds, ["added", "deleted"]);
    c.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn paging_with_limit_and_continue_returns_each_item_once() -> Result<()> {
    let c = start().await?;
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), "default");
    for i in 0..25 {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": format!("cm-{i:02}")}}))?,
        )
        .await?;
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut lp = ListParams::default().limit(10);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = cms.list(&lp).await?;
        pages += 1;
        seen.extend(page.items.into_iter().filter_map(|o| o.metadata.name));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, (0..25).map(|i| format!("cm-{i:02}")).collect::<Vec<_>>());
    c.server.shutdown().await;
    Ok(())
}

async fn raw(c: &kube::Client, method: &str, path: &str, content_type: &str, body: Vec<u8>) -> Result<(u16, Value)> {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(kube::client::Body::from(body))?;
    let resp = c.send(req).await?;
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((code, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

#[tokio::test]
async fn malformed_and_hostile_requests_get_status_codes() -> Result<()> {
    let c = start().await?;
    namespace(&c.client, "argocd").await?;
    let coll = "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications";
    // (what, path, content type, body, expected code, expected reason)
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, String, &str, Vec<u8>, u16, &str)> = vec![
        ("bad JSON", coll.into(), "application/json", b"{\"metadata\":".to_vec(), 400, "BadRequest"),
        ("not an object", coll.into(), "application/json", b"[1,2]".to_vec(), 400, "BadRequest"),
        (
            // A custom resource of another kind is a 422 naming `kind`, as kube-apiserver answers.
            "wrong kind",
            coll.into(),
            "application/json",
            br#"{"apiVersion":"argoproj.io/v1alpha1","kind":"AppProject","metadata":{"name":"a"}}"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "wrong apiVersion",
            coll.into(),
            "application/json",
            br#"{"apiVersion":"v1","kind":"Application","metadata":{"name":"a"}}"#.to_vec(),
            400,
            "BadRequest",
        ),
        (
            "invalid name",
            coll.into(),
            "application/json",
            br#"{"metadata":{"name":"Not_A_Name"}}"#.to_vec(),
            422,
            "Invalid",
        ),
        ("missing name", coll.into(), "application/json", br#"{"metadata":{}}"#.to_vec(), 422, "Invalid"),
        (
            "invalid label",
            coll.into(),
            "application/json",
            br#"{"metadata":{"name":"a","labels":{"k":"bad value"}}}"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "huge body",
            coll.into(),
            "application/json",
            vec![b' '; apiserver::DEFAULT_MAX_BODY_BYTES + 1],
            413,
            "RequestEntityTooLarge",
        ),
        (
            "unknown resource",
            "/apis/argoproj.io/v1alpha1/namespaces/argocd/widgets".into(),
            "application/json",
            b"{}".to_vec(),
            404,
            "NotFound",
        ),
        ("unknown group", "/apis/nope.io/v1/things".into(), "application/json", b"{}".to_vec(), 404, "NotFound"),
        (
            "missing namespace",
            "/api/v1/namespaces/nowhere/configmaps".into(),
            "application/json",
            br#"{"metadata":{"name":"a"}}"#.to_vec(),
            404,
            "NotFound",
        ),
        (
            "protobuf body",
            coll.into(),
            "application/vnd.kubernetes.protobuf",
            b"k8s\0".to_vec(),
            415,
            "UnsupportedMediaType",
        ),
    ];
    for (what, path, ct, body, code, reason) in cases {
        let (got, status) = raw(&c.client, "POST", &path, ct, body).await?;
        assert_eq!(got, code, "{what}: {status}");
        assert_eq!(status["kind"], "Status", "{what}");
        assert_eq!(status["reason"], reason, "{what}: {status}");
        assert!(!status["message"].as_str().unwrap_or_default().is_empty(), "{what}: a message says what is wrong");
    }
    // Patches: malformed, wrong type for a custom resource, and a failing JSON-patch test.
    apps(&c.client, "argocd").create(&PostParams::default(), &app("a", json!({}))?).await?;
    let item = format!("{coll}/a");
    let (code, _) = raw(&c.client, "PATCH", &item, "application/merge-patch+json", b"{nope".to_vec()).await?;
    assert_eq!(code, 400);
    let (code, _) = raw(&c.client, "PATCH", &item, "application/strategic-merge-patch+json", b"{}".to_vec()).await?;
    assert_eq!(code, 415);
    let (code, _) = raw(
        &c.client,
        "PATCH",
        &item,
        "application/json-patch+json",
        br#"[{"op":"test","path":"/spec/project","value":"x"}]"#.to_vec(),
    )
    .await?;
    assert_eq!(code, 422);
    let (code, _) =
        raw(&c.client, "PUT", &item, "application/json", br#"{"metadata":{"name":"other"}}"#.to_vec()).await?;
    assert_eq!(code, 400, "a body naming another object than the URL");
    // Without the bearer token nothing but health answers.
    let anon = reqwest_free_get(&c.server, "/api/v1/secrets").await?;
    assert_eq!(anon, 401);
    assert_eq!(reqwest_free_get(&c.server, "/readyz").await?, 200);
    c.server.shutdown().await;
    Ok(())
}

/// GET without credentials, with a kube client built from a token-less kubeconfig.
async fn reqwest_free_get(server: &ApiServer, path: &str) -> Result<u16> {
    let kc = server.kubeconfig().replace(&format!("token: {}", server.token()), "token: wrong");
    let cfg =
        kube::Config::from_custom_kubeconfig(kube::config::Kubeconfig::from_yaml(&kc)?, &Default::default()).await?;
    let client = kube::Client::try_from(cfg)?;
    Ok(raw(&client, "GET", path, "application/json", vec![]).await?.0)
}

#[tokio::test]
async fn namespace_deletion_removes_its_objects() -> Result<()> {
    let c = start().await?;
    namespace(&c.client, "doomed").await?;
    let api = apps(&c.client, "doomed");
    api.create(&PostParams::default(), &app("plain", json!({}))?).await?;
    let mut held = app("held", json!({}))?;
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &held).await?;
    let nss: Api<Namespace> = Api::all(c.client.clone());
    nss.delete("doomed", &DeleteParams::default()).await?;
    assert_eq!(api.get("plain").await.err().as_ref().and_then(err_code), Some(404));
    let ns = nss.get("doomed").await?;
    assert_eq!(ns.status.and_then(|s| s.phase).as_deref(), Some("Terminating"), "waits for the finalizer");
    let refused = api.create(&PostParams::default(), &app("late", json!({}))?).await.err().context("terminating")?;
    assert_eq!(err_code(&refused), Some(403));
    api.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    assert_eq!(nss.get("doomed").await.err().as_ref().and_then(err_code), Some(404), "gone once empty");
    c.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_crd_created_through_the_api_is_served() -> Result<()> {
    let c = start().await?;
    let crds: Api<DynamicObject> = Api::all_with(
        c.client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster", "names": {"plural": "widgets", "kind": "Widget"},
                 "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]},
    }))?;
    crds.create(&PostParams::default(), &crd).await?;
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Widget"), "widgets");
    let widgets: Api<DynamicObject> = Api::all_with(c.client.clone(), &ar);
    let w: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 3, "colour": "red"}}),
    )?;
    widgets.create(&PostParams::default(), &w).await?;
    let stored = widgets.get("w").await?;
    assert_eq!(stored.data["spec"]["size"], 3);
    assert!(stored.data["spec"].get("colour").is_none(), "the structural schema prunes unknown fields");
    // A value of the wrong type is a 422 naming the field.
    let bad: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "b"}, "spec": {"size": "big"}}),
    )?;
    assert_eq!(widgets.create(&PostParams::default(), &bad).await.err().as_ref().and_then(err_code), Some(422));
    let discovery = kube::discovery::Discovery::new(c.client.clone()).run().await?;
    assert!(discovery.groups().any(|g| g.name() == "example.com"), "discovery lists the new group");
    // Deleting the CRD stops serving it.
    crds.delete("widgets.example.com", &DeleteParams::default()).await?;
    assert_eq!(widgets.get("w").await.err().as_ref().and_then(err_code), Some(404));
    c.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn invalid_crd_is_rejected_with_field_causes() -> Result<()> {
    let c = start().await?;
    let (code, status) = raw(
        &c.client,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        "application/json",
        br#"{"metadata":{"name":"x.example.com"},"spec":{"group":"example.com","scope":"Sideways","names":{"plural":"y","kind":"Y"},"versions":[]}}"#.to_vec(),
    )
    .await?;
    assert_eq!(code, 422);
    let msg = status["message"].as_str().unwrap_or_default();
    assert!(msg.contains("spec.scope") && msg.contains("spec.versions") && msg.contains("metadata.name"), "{msg}");
    c.server.shutdown().await;
    Ok(())
}

/// An Application without status, for the JSON patches upstream argocd-agent's principal sends.
async fn app_without_status(c: &Cluster) -> Result<&'static str> {
    namespace(&c.client, "argocd").await?;
    apps(&c.client, "argocd").create(&PostParams::default(), &app("first", json!({}))?).await?;
    Ok("/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/first")
}

/// Upstream's principal writes a managed agent's first status with `replace /status` on an
/// Application that has none: kube-apiserver (json-patch v4) adds the member.
#[tokio::test]
async fn json_patch_replace_of_a_missing_member_adds_it() -> Result<()> {
    let c = start().await?;
    let item = app_without_status(&c).await?;
    let status = json!([{"op": "replace", "path": "/status", "value": {"health": {"status": "Healthy"}}}]);
    let (code, body) =
        raw(&c.client, "PATCH", item, "application/json-patch+json", serde_json::to_vec(&status)?).await?;
    assert_eq!(code, 200, "replace of a missing member: {body}");
    assert_eq!(body["status"]["health"]["status"], "Healthy");
    c.server.shutdown().await;
    Ok(())
}

/// A JSON patch of `null` is an empty patch, as in kube-apiserver.
#[tokio::test]
async fn json_patch_null_is_a_no_op() -> Result<()> {
    let c = start().await?;
    let item = app_without_status(&c).await?;
    let (code, body) = raw(&c.client, "PATCH", item, "application/json-patch+json", b"null".to_vec()).await?;
    assert_eq!(code, 200, "a null JSON patch: {body}");
    assert_eq!(body["metadata"]["name"], "first");
    c.server.shutdown().await;
    Ok(())
}

/// client-go's typed clients for built-in kinds send every DeleteOptions body as protobuf:
/// decoded, with their preconditions, `dryRun` and `propagationPolicy`, for delete and
/// deletecollection.
#[tokio::test]
async fn protobuf_delete_options_as_client_go_sends_them() -> Result<()> {
    use apiserver::protobuf::options::{DeleteOptions, KIND, Preconditions};
    use apiserver::protobuf::{CONTENT_TYPE, encode};
    use k8s_openapi::api::core::v1::Secret;
    use prost::Message as _;

    let c = start().await?;
    namespace(&c.client, "argocd").await?;
    let secrets = Api::<Secret>::namespaced(c.client.clone(), "argocd");
    let secret = |name: &str| -> Result<Secret> { Ok(serde_json::from_value(json!({"metadata": {"name": name}}))?) };
    let created = secrets.create(&PostParams::default(), &secret("s1")?).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    let path = "/api/v1/namespaces/argocd/secrets/s1";
    let body = |o: &DeleteOptions| encode("v1", KIND, &o.encode_to_vec());
    let right = DeleteOptions {
        preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
        propagation_policy: Some("Background".into()),
        ..Default::default()
    };
    let dry = DeleteOptions { dry_run: vec!["All".into()], ..right.clone() };
    let (code, status) = raw(&c.client, "DELETE", path, CONTENT_TYPE, body(&dry)).await?;
    assert_eq!(code, 200, "{status}");
    assert!(secrets.get_opt("s1").await?.is_some(), "a dry-run delete deletes nothing");
    let wrong = DeleteOptions {
        preconditions: Some(Preconditions { uid: Some("not-the-uid".into()), resource_version: None }),
        ..Default::default()
    };
    let (code, _) = raw(&c.client, "DELETE", path, CONTENT_TYPE, body(&wrong)).await?;
    assert_eq!(code, 409, "a protobuf precondition is checked");
    let bad = DeleteOptions { propagation_policy: Some("Sideways".into()), ..Default::default() };
    let (code, status) = raw(&c.client, "DELETE", path, CONTENT_TYPE, body(&bad)).await?;
    assert_eq!((code, status["details"]["causes"][0]["field"].as_str()), (422, Some("propagationPolicy")));
    let (code, status) = raw(&c.client, "DELETE", path, CONTENT_TYPE, body(&right)).await?;
    assert_eq!(code, 200, "{status}");
    assert!(secrets.get_opt("s1").await?.is_none());
    // DeleteCollection with an empty protobuf DeleteOptions (client-go always sends one).
    secrets.create(&PostParams::default(), &secret("s2")?).await?;
    let (code, _) =
        raw(&c.client, "DELETE", "/api/v1/namespaces/argocd/secrets", CONTENT_TYPE, body(&DeleteOptions::default()))
            .await?;
    assert_eq!(code, 200);
    assert!(secrets.get_opt("s2").await?.is_none());
    // Not DeleteOptions, or not protobuf: 400.
    let (code, _) = raw(&c.client, "DELETE", path, CONTENT_TYPE, encode("v1", "Secret", &[])).await?;
    assert_eq!(code, 400);
    let (code, _) = raw(&c.client, "DELETE", path, CONTENT_TYPE, b"{}".to_vec()).await?;
    assert_eq!(code, 400);
    c.server.shutdown().await;
    Ok(())
}

/// kube-rs (and kubectl, client-go) put `dryRun` in the DeleteOptions body, which kube-apiserver
/// honours: a dry-run delete deletes nothing.
#[tokio::test]
async fn a_delete_body_dry_run_deletes_nothing() -> Result<()> {
    let c = start().await?;
    namespace(&c.client, "argocd").await?;
    let cms = Api::<ConfigMap>::namespaced(c.client.clone(), "argocd");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "kept"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    cms.delete("kept", &DeleteParams { dry_run: true, ..DeleteParams::default() }).await?;
    assert!(cms.get_opt("kept").await?.is_some(), "a kube-rs dry-run delete deleted the object");
    cms.delete("kept", &DeleteParams::default()).await?;
    assert!(cms.get_opt("kept").await?.is_none());
    c.server.shutdown().await;
    Ok(())
}
