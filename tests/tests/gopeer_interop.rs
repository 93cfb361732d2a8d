//! Interop with upstream's Go libraries: the Go peer (`tests/gopeer`, grpc-go and cloudevents
//! sdk-go v2.16.2 as upstream pins them, code generated from our .proto files) decodes every
//! event we send exactly as upstream does, and we decode every event it sends.
//!
//! * `gopeer_codec_*`: the whole catalogue, both ways, one message at a time, plus resync
//!   checksums computed with Go's `encoding/json` against ours;
//! * `gopeer_upstream_agent_*`: the Go peer as an upstream agent against our principal binary,
//!   managed and autonomous, over mTLS on loopback;
//! * `gopeer_upstream_principal_*`: the Go peer as an upstream principal against our agent.
//!
//! docs/compatibility.md maps every event type and direction to the test that crosses it.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use protocol::argocd::ObjectMeta;
use protocol::checksum::{ResourceKey, resource_set_checksum, spec_checksum};
use protocol::event::DecodeLimits;
use protocol::pb::cloudevents::cloud_event::CloudEventAttributeValue;
use protocol::pb::cloudevents::cloud_event::cloud_event_attribute_value::Attr;
use protocol::{Event, EventType, Target};
use serde_json::{Value, json};
use tests::fixtures::{applications, dynamic};
use tests::gopeer::{GoPeer, OUR_VERSION, Pki, check_received};
use tests::kubectl::Kubectl;
use tests::topology::{ARGOCD_NS, Mode, StartOptions, Topology};
use tests::wait::Poller;

const TIMEOUT: Duration = Duration::from_secs(60);

// === the catalogue ===

fn application_json(name: &str, ns: &str, uid: &str, rv: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": rv,
                     "annotations": {"note": "a&b<c> \u{e9}"}},
        "spec": {"project": "default",
                 "source": {"repoURL": "https://example.com/r.git", "path": "guestbook", "targetRevision": "HEAD"},
                 "destination": {"server": "https://kubernetes.default.svc", "namespace": "guestbook"}},
        "operation": {"sync": {"revision": "HEAD"}},
        "status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}},
    })
}

fn appproject_json() -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "team-a", "namespace": "argocd", "uid": "p-uid", "resourceVersion": "4"},
        "spec": {"sourceRepos": ["*"], "destinations": [{"server": "*", "namespace": "*"}],
                 "roles": [{"name": "ci", "policies": ["p, proj:team-a:ci, applications, sync, team-a/*, allow"]}]},
    })
}

fn repository_json() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "repo-1", "namespace": "argocd", "uid": "s-uid", "resourceVersion": "9",
                     "labels": {"argocd.argoproj.io/secret-type": "repository"}},
        "data": {"url": "aHR0cHM6Ly9leGFtcGxlLmNvbS9yLmdpdA==", "password": "c2VjcmV0"},
        "type": "Opaque",
    })
}

fn gpgkey_json() -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "argocd-gpg-keys-cm", "namespace": "argocd", "uid": "c-uid", "resourceVersion": "2"},
        "data": {"4AEE18F83AFDEB23": "-----BEGIN PGP PUBLIC KEY BLOCK-----\n..."},
    })
}

fn applicationset_json() -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
        "metadata": {"name": "set-1", "namespace": "argocd", "uid": "as-uid", "resourceVersion": "3"},
        "spec": {"generators": [{"list": {"elements": [{"cluster": "a"}]}}], "template": {"metadata": {"name": "x"}, "spec": {}}},
    })
}

/// One entry per (type, target) of the catalogue, with a representative payload (`None`: the
/// event carries no data). Object payloads take their ids from their metadata.
fn catalogue() -> Vec<(EventType, Target, Option<Value>)> {
    use EventType as T;
    let app = application_json("guestbook", "agent-1", "uid-1", "17");
    let mut out = Vec::new();
    for t in [
        T::Create,
        T::SpecUpdate,
        T::StatusUpdate,
        T::SetOperation,
        T::TerminateOperation,
        T::Delete,
        T::Update,
        T::OperationUpdate,
    ] {
        out.push((t, Target::Application, Some(app.clone())));
    }
    out.push((
        T::Error,
        Target::Application,
        Some(json!({"resourceName": "guestbook", "resourceNamespace": "agent-1", "message": "cannot apply: é ☃"})),
    ));
    for (target, obj) in [
        (Target::AppProject, appproject_json()),
        (Target::Repository, repository_json()),
        (Target::GpgKey, gpgkey_json()),
        (Target::ApplicationSet, applicationset_json()),
    ] {
        for t in [T::Create, T::SpecUpdate, T::Delete] {
            out.push((t, target.clone(), Some(obj.clone())));
        }
    }
    let request = json!({"uuid": "req-1", "namespace": "guestbook", "name": "web", "subresource": "status",
        "method": "PATCH", "body": "eyJhIjoxfQ==", "params": {"dryRun": "All"},
        "group": "apps", "version": "v1", "resource": "deployments"});
    for t in [T::HttpGet, T::HttpPost, T::HttpPut, T::HttpPatch, T::HttpDelete, T::HttpHead, T::HttpOptions] {
        out.push((t, Target::Resource, Some(request.clone())));
    }
    out.push((
        T::Response,
        Target::Resource,
        Some(json!({"uuid": "req-1", "status": 200, "resource": "{\"kind\":\"Deployment\"}"})),
    ));
    out.push((
        T::HttpGet,
        Target::ContainerLog,
        Some(json!({"uuid": "log-1", "namespace": "guestbook", "podName": "web-0", "container": "app",
                    "follow": true, "tailLines": 100, "sinceSeconds": 60, "timestamps": true, "limitBytes": 4096})),
    ));
    out.push((
        T::TerminalRequest,
        Target::Terminal,
        Some(json!({"uuid": "term-1", "namespace": "guestbook", "podName": "web-0", "containerName": "app",
                    "command": ["sh", "-c", "ls"], "tty": true, "stdin": true, "stdout": true, "stderr": false})),
    ));
    out.push((
        T::RedisRequest,
        Target::Redis,
        Some(json!({"uuid": "r-1", "connectionUuid": "c-1", "body": {"get": {"key": "app|managed-resources|guestbook"}}})),
    ));
    out.push((
        T::RedisResponse,
        Target::Redis,
        Some(json!({"uuid": "r-1", "connectionUuid": "c-1",
                    "body": {"get": {"bytes": "AAEC/w==", "cacheHit": true, "error": ""}}})),
    ));
    out.push((
        T::RequestSyncedResourceList,
        Target::ResourceResync,
        Some(json!({"checksum": "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg="})),
    ));
    out.push((
        T::ResponseSyncedResource,
        Target::ResourceResync,
        Some(json!({"name": "guestbook", "namespace": "agent-1", "uid": "uid-1", "kind": "Application"})),
    ));
    out.push((
        T::RequestUpdate,
        Target::ResourceResync,
        Some(json!({"name": "guestbook", "namespace": "agent-1", "uid": "uid-1", "kind": "Application",
                    "checksum": "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg="})),
    ));
    out.push((T::RequestResourceResync, Target::ResourceResync, Some(json!({}))));
    out.push((
        T::ClusterCacheInfoUpdate,
        Target::ClusterCacheInfoUpdate,
        Some(json!({"applicationsCount": 3, "apisCount": 41, "resourcesCount": 1234})),
    ));
    // Heartbeats (`.pong` and `.get` are defined upstream and never emitted: envelope only).
    for t in [T::Ping, T::Pong, T::Get] {
        out.push((t, Target::Heartbeat, None));
    }
    out.push((T::Processed, Target::EventProcessed, None));
    out
}

/// Our event for a catalogue entry, built with our constructors.
fn our_event(event_type: &EventType, target: &Target, data: Option<&Value>) -> anyhow::Result<Event> {
    let ev = match data {
        Some(obj) if obj.get("metadata").is_some() => {
            let meta: ObjectMeta = serde_json::from_value(obj["metadata"].clone())?;
            Event::for_object(event_type.clone(), target.clone(), &meta, obj)?
        }
        Some(d) if *event_type == EventType::Response || *event_type == EventType::RedisResponse => {
            Event::response(event_type.clone(), target.clone(), "req-1").with_json(d)?
        }
        Some(d) => Event::request(event_type.clone(), target.clone(), &protocol::event::new_uuid()).with_json(d)?,
        None if *event_type == EventType::Processed => {
            Event::request(EventType::SpecUpdate, Target::Application, "acked-1").processed_ack()
        }
        None => Event::new(event_type.clone(), target.clone(), "hb-1", "hb-1"),
    };
    Ok(ev)
}

/// The payload as we type it, from JSON data given for this type and target.
fn typed(event_type: &EventType, target: &Target, data: Option<Value>) -> anyhow::Result<protocol::Payload> {
    let mut ev = Event::new(event_type.clone(), target.clone(), "r", "e");
    ev.data = data.map(Into::into);
    Ok(ev.payload()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_codec_every_catalogue_event_both_ways() -> anyhow::Result<()> {
    let mut go = GoPeer::codec().await?;
    let entries = catalogue();
    // Every known type of ours is in the catalogue.
    for t in EventType::KNOWN {
        ensure!(entries.iter().any(|(et, _, _)| et == t), "catalogue misses {t}");
    }
    for (i, (event_type, target, data)) in entries.iter().enumerate() {
        let what = format!("{event_type} on {target}");
        // Ours -> Go: decoded by sdk-go's FromProto, dispatched and decoded as upstream does.
        let ours = our_event(event_type, target, data.as_ref())?;
        let wire = prost::Message::encode_to_vec(&ours.to_wire());
        let report = go.ask(&format!("d{i}"), json!({"cmd": "decode", "wire": hex::encode(&wire)})).await?;
        check_received(&report).with_context(|| what.clone())?;
        ensure!(report["target"] == target.as_str() && report["type"] == event_type.as_str(), "{what}: {report}");
        ensure!(report["resourceid"] == ours.resource_id.as_str(), "{what}: resourceid {report}");
        ensure!(report["eventid"] == ours.event_id.as_str(), "{what}: eventid {report}");
        let go_view = report.get("data").cloned().filter(|d| !d.is_null());
        ensure!(
            typed(event_type, target, go_view)? == ours.payload()?,
            "{what}: the payload Go decoded differs from ours: {report}"
        );

        // Go -> ours: built as upstream's constructors build it, encoded with sdk-go.
        let mut cmd = json!({"cmd": "encode", "type": event_type.as_str(), "target": target.as_str()});
        if let Some(d) = data {
            cmd["data"] = d.clone();
        }
        if *event_type == EventType::Processed {
            cmd["resourceid"] = json!("acked-1");
            cmd["eventid"] = json!("acked-1");
        }
        let encoded = go.ask(&format!("e{i}"), cmd).await?;
        let bytes = hex::decode(encoded["wire"].as_str().context("no wire")?)?;
        let theirs = Event::decode_wire_bytes(&bytes, &DecodeLimits::default()).with_context(|| what.clone())?;
        ensure!(theirs.event_type == *event_type && theirs.target == *target, "{what}: decoded as {theirs:?}");
        ensure!(theirs.id.is_empty(), "{what}: upstream sets no id");
        let expected = typed(event_type, target, data.clone())?;
        ensure!(theirs.payload()? == expected, "{what}: the payload we decoded differs");
        if data.as_ref().is_some_and(|d| d.get("metadata").is_some()) {
            ensure!(theirs.resource_id == ours.resource_id && theirs.event_id == ours.event_id, "{what}: ids");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_codec_dataschema_as_string_is_dropped_by_upstream() -> anyhow::Result<()> {
    // What we sent before the fix: sdk-go's FromProto loses a ce_string dataschema, so upstream
    // sees an empty target and drops the event. The Go peer must reproduce that, or it could
    // not catch the mistake.
    let mut go = GoPeer::codec().await?;
    let ev = our_event(&EventType::Create, &Target::Application, Some(&application_json("a", "n", "u", "1")))?;
    let mut msg = ev.to_wire();
    let ce = msg.event.as_mut().context("no event")?;
    ce.attributes
        .insert("dataschema".into(), CloudEventAttributeValue { attr: Some(Attr::CeString("application".into())) });
    let wire = prost::Message::encode_to_vec(&msg);
    let report = go.ask("s", json!({"cmd": "decode", "wire": hex::encode(&wire)})).await?;
    ensure!(report["kind"] == "dropped" && report["dataschema"] == "", "{report}");
    ensure!(check_received(&report).is_err());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_codec_resync_checksums_match_go_encoding_json() -> anyhow::Result<()> {
    let mut go = GoPeer::codec().await?;
    let key = |kind: &str, name: &str, ns: &str, uid: &str| ResourceKey {
        kind: kind.into(),
        name: name.into(),
        namespace: ns.into(),
        uid: uid.into(),
    };
    let sets: Vec<Vec<ResourceKey>> = vec![
        vec![],
        vec![key("Application", "a", "argocd", "u1")],
        vec![
            key("Application", "b", "argocd", "u2"),
            key("AppProject", "default", "argocd", "p1"),
            key("Application", "a", "argocd", "u1"),
            key("Application", "a", "other", "u1"),
            key("Repository", "r", "argocd", ""),
            key("GPGKey", "argocd-gpg-keys-cm", "argocd", "c1"),
        ],
    ];
    for (i, keys) in sets.iter().enumerate() {
        let as_json: Vec<Value> = keys
            .iter()
            .map(|k| json!({"kind": k.kind, "name": k.name, "namespace": k.namespace, "uid": k.uid}))
            .collect();
        let go_sum = go.ask(&format!("k{i}"), json!({"cmd": "checksum", "keys": as_json})).await?;
        let ours = resource_set_checksum(keys).map(hex::encode);
        ensure!(go_sum["checksum"] == json!(ours), "resource set {i}: Go {} ours {ours:?}", go_sum["checksum"]);
    }
    // Integers and strings only: Argo CD specs have no floats, and upstream hashes typed
    // structs converted to unstructured maps (int64), not the JSON text.
    let objects = [
        application_json("a", "n", "u", "1"),
        json!({"kind": "Application", "metadata": {"name": "x"},
               "spec": {"b": "<html> & \u{2028} ü \"q\" \\", "a": [1, -2, 300_000, 9_007_199_254_740_993_i64],
                        "destination": {"server": "s"}, "destinations": [{"server": "s"}], "nested": {"z": null, "y": true}}}),
        appproject_json(),
        repository_json(),
        gpgkey_json(),
        json!({"kind": "ConfigMap", "metadata": {"name": "argocd-gpg-keys-cm"}}),
    ];
    for (i, obj) in objects.iter().enumerate() {
        let go_sum = go.ask(&format!("s{i}"), json!({"cmd": "spec_checksum", "object": obj})).await?;
        let ours = hex::encode(spec_checksum(obj)?);
        ensure!(go_sum["checksum"] == json!(ours), "object {i}: Go {} ours {ours}\n{obj}", go_sum["checksum"]);
    }
    Ok(())
}

/// The expected values in protocol/tests/checksum_vectors.json (which the protocol tests hold
/// ours to) are what Go computes: none of them can be a wrong hand computation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_codec_checksum_vectors_are_what_go_computes() -> anyhow::Result<()> {
    let path = tests::workspace_root().join("protocol/tests/checksum_vectors.json");
    let vectors: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let mut go = GoPeer::codec().await?;
    let sets = vectors["resource_sets"].as_array().context("resource_sets")?;
    for (i, set) in sets.iter().enumerate() {
        let go_sum = go.ask(&format!("k{i}"), json!({"cmd": "checksum", "keys": set["keys"]})).await?;
        ensure!(
            go_sum["checksum"] == set["checksum"],
            "{}: Go computes {}, the vector says {}",
            set["name"],
            go_sum["checksum"],
            set["checksum"]
        );
    }
    let specs = vectors["specs"].as_array().context("specs")?;
    for (i, spec) in specs.iter().enumerate() {
        let go_sum = go.ask(&format!("s{i}"), json!({"cmd": "spec_checksum", "object": spec["object"]})).await?;
        ensure!(
            go_sum["checksum"] == spec["checksum"],
            "{}: Go computes {}, the vector says {}",
            spec["name"],
            go_sum["checksum"],
            spec["checksum"]
        );
    }
    ensure!(sets.len() + specs.len() >= 8, "vectors missing from {}", path.display());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_generated_code_is_current() -> anyhow::Result<()> {
    // The committed .pb.go files record the hashes of the .proto files they were made from.
    let bin = tests::venv_tool("argocd-gopeer")?;
    let out = std::process::Command::new(bin)
        .arg("check-protos")
        .arg(tests::workspace_root().join("protocol/proto"))
        .output()?;
    ensure!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok(())
}

// === the Go peer as an upstream agent against our principal ===

fn appprojects(client: kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AppProject"),
        "appprojects",
    );
    Api::namespaced_with(client, ns, &ar)
}

/// Waits for the first event report of `event_type` on `target` matching `pred`, and checks it
/// as upstream would read it.
async fn received(
    go: &mut GoPeer,
    event_type: EventType,
    target: Target,
    pred: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let what = format!("{event_type} on {target}");
    let report = go
        .wait(&what, |r| {
            (r["kind"] == "event" || r["kind"] == "dropped")
                && r["type"] == event_type.as_str()
                && (r["target"] == target.as_str() || r["dataschema"] != target.as_str())
                && pred(r)
        })
        .await?;
    check_received(&report).with_context(|| format!("{what}\n{}", go.diagnostics()))?;
    Ok(report)
}

/// Sends an event from the Go peer and waits for our side's ACK of it (decoded by sdk-go).
async fn send_acked(go: &mut GoPeer, id: &str, cmd: Value) -> anyhow::Result<()> {
    let mut cmd = cmd;
    cmd["cmd"] = json!("send");
    let sent = go.ask(id, cmd).await?;
    let (res, ev) = (sent["resourceid"].clone(), sent["eventid"].clone());
    let ack = go
        .wait(&format!("the ACK of {id}"), |r| {
            r["type"] == EventType::Processed.as_str() && r["resourceid"] == res && r["eventid"] == ev
        })
        .await?;
    check_received(&ack).with_context(|| format!("ACK of {id}"))?;
    ensure!(ack["target"] == "eventProcessed", "{ack}");
    Ok(())
}

async fn wait_hub<T>(what: &str, mut check: impl AsyncFnMut() -> anyhow::Result<Option<T>>) -> anyhow::Result<T> {
    let mut poll = Poller::new(TIMEOUT, what);
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        poll.tick().await?;
    }
}

/// What a released upstream agent sends as `AuthRequest.version`: its bare build version (the
/// `VERSION` file through `-X internal/version.version`), not `argocd-agent-<version>`.
const UPSTREAM_AGENT_VERSION: &str = "0.10.0";

/// Waits until the Go agent authenticated (it reports `authenticated` only when our answer
/// passed its version check), or says how it was refused.
async fn go_authenticated(go: &mut GoPeer, topo: &Topology) -> anyhow::Result<Value> {
    let auth = go
        .wait("authenticated", |r| {
            ["authenticated", "auth_error", "version_refused"].contains(&r["kind"].as_str().unwrap_or(""))
        })
        .await?;
    ensure!(auth["kind"] == "authenticated", "the Go agent did not get through: {auth}\n{}", topo.logs());
    Ok(auth)
}

async fn start_go_agent(name: &str, mode: Mode) -> anyhow::Result<(Topology, GoPeer)> {
    let topo = Topology::start_without_agents(&[(name, mode)]).await?;
    let pki = Pki::of_kubeconfig(&topo.kubeconfig())?;
    let addr = topo.principal_addr().context("principal address")?;
    let mode_str = if mode == Mode::Managed { "managed" } else { "autonomous" };
    let mut go = GoPeer::agent(&pki, name, addr, mode_str, UPSTREAM_AGENT_VERSION)?;
    let auth = go_authenticated(&mut go, &topo).await?;
    ensure!(auth["principal_version"] == UPSTREAM_AGENT_VERSION, "{auth}");
    go.wait("subscribed", |r| r["kind"] == "subscribed").await?;
    Ok((topo, go))
}

/// The version handshake as released upstream agents do it, against our principal's default
/// `--agent-version-check=compatible`: v0.8.x (the first releases with the handshake), v0.9.x,
/// v0.10.x, later releases and dev builds send their bare version and get it back (the Go agent
/// refuses any other answer, as upstream's exact comparison would), then stream; one older than
/// the minimum, and one sending no version (releases before the handshake), are refused with
/// upstream's status codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_agent_versions_against_our_principal() -> anyhow::Result<()> {
    let name = "agent-gov";
    let topo = Topology::start_without_agents(&[(name, Mode::Managed)]).await?;
    let pki = Pki::of_kubeconfig(&topo.kubeconfig())?;
    let addr = topo.principal_addr().context("principal address")?;
    for version in
        ["0.8.0", "0.8.1", "0.9.0", "0.9.3", "0.10.0", "0.10.2", "0.11.0-rc1", "99.9.9-unreleased", OUR_VERSION]
    {
        let mut go = GoPeer::agent(&pki, name, addr, "managed", version)?;
        let auth = go_authenticated(&mut go, &topo).await.with_context(|| format!("agent version {version}"))?;
        ensure!(auth["principal_version"] == version, "{version}: {auth}");
        let info = go.wait("the Version answer", |r| r["kind"] == "version").await?;
        ensure!(info["version"] == OUR_VERSION, "versionapi.Version reports our own version: {info}");
        go.wait("subscribed", |r| r["kind"] == "subscribed").await?;
        received(&mut go, EventType::RequestResourceResync, Target::ResourceResync, |_| true)
            .await
            .with_context(|| format!("agent version {version}"))?;
    }
    for (version, code) in [("0.7.7", "FailedPrecondition"), ("", "InvalidArgument"), ("main", "FailedPrecondition")] {
        let mut go = GoPeer::agent(&pki, name, addr, "managed", version)?;
        let refused = go.wait("auth_error", |r| r["kind"] == "auth_error" || r["kind"] == "authenticated").await?;
        ensure!(refused["kind"] == "auth_error" && refused["code"] == code, "agent version {version:?}: {refused}");
    }
    Ok(())
}

/// Upstream's managed agent asks for the principal's resource list once per process
/// (`resyncOnStart`), so after our principal restarts, a hub Application created while it was
/// down must reach the agent without that list: our principal sends it a `create` of every
/// Application on connect, as upstream's principal does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_agent_gets_what_the_hub_created_while_our_principal_was_down() -> anyhow::Result<()> {
    let agent = "agent-gor";
    let (mut topo, go) = start_go_agent(agent, Mode::Managed).await?;
    drop(go);
    topo.stop_principal(Duration::from_secs(10))?;
    let apps = applications(topo.hub(), agent);
    let app = tests::fixtures::application_without_finalizers("while-down", agent, "v1");
    apps.create(&PostParams::default(), &dynamic(app)?).await?;
    topo.start_principal().await?;

    // The agent process lives on (a new peer here, which like upstream's agent after its first
    // connect never sends request-synced-resource-list).
    let pki = Pki::of_kubeconfig(&topo.kubeconfig())?;
    let addr = topo.principal_addr().context("principal address")?;
    let mut go = GoPeer::agent(&pki, agent, addr, "managed", UPSTREAM_AGENT_VERSION)?;
    go_authenticated(&mut go, &topo).await?;
    let created =
        received(&mut go, EventType::Create, Target::Application, |r| r["data"]["metadata"]["name"] == "while-down")
            .await
            .with_context(|| topo.logs())?;
    ensure!(created["data"]["spec"]["source"]["targetRevision"] == "v1", "{created}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_agent_managed_against_our_principal() -> anyhow::Result<()> {
    let agent = "agent-gom";
    let (topo, mut go) = start_go_agent(agent, Mode::Managed).await?;
    let apps = applications(topo.hub(), agent);

    // On connect our principal asks the agent for a resync.
    received(&mut go, EventType::RequestResourceResync, Target::ResourceResync, |_| true).await?;

    // Hub -> Go agent: create, spec-update, set-operation, terminate-operation, delete.
    let app = tests::fixtures::application_without_finalizers("guestbook", agent, "v1");
    apps.create(&PostParams::default(), &dynamic(app)?).await?;
    let created =
        received(&mut go, EventType::Create, Target::Application, |r| r["data"]["metadata"]["name"] == "guestbook")
            .await?;
    ensure!(created["data"]["spec"]["source"]["targetRevision"] == "v1", "{created}");
    let hub_uid = created["data"]["metadata"]["uid"].as_str().context("uid")?.to_owned();
    ensure!(created["resourceid"] == format!("guestbook_{hub_uid}"), "{created}");

    let merge = |v: Value| Patch::Merge(v);
    apps.patch("guestbook", &PatchParams::default(), &merge(json!({"spec": {"source": {"targetRevision": "v2"}}})))
        .await?;
    received(&mut go, EventType::SpecUpdate, Target::Application, |r| {
        r["data"]["spec"]["source"]["targetRevision"] == "v2"
    })
    .await?;
    apps.patch("guestbook", &PatchParams::default(), &merge(json!({"operation": {"sync": {"revision": "v2"}}})))
        .await?;
    received(&mut go, EventType::SetOperation, Target::Application, |r| {
        r["data"]["operation"]["sync"]["revision"] == "v2"
    })
    .await?;
    // Applications have no status subresource (as Argo CD's CRD): status is patched in place.
    apps.patch(
        "guestbook",
        &PatchParams::default(),
        &merge(json!({"status": {"operationState": {"phase": "Terminating"}}})),
    )
    .await?;
    received(&mut go, EventType::TerminateOperation, Target::Application, |_| true).await?;

    // Go agent -> hub: status-update (applied to the hub), error, cluster cache info, heartbeat.
    let mut status_obj = created["data"].clone();
    status_obj["status"] = json!({"sync": {"status": "Synced", "revision": "go-rev"}, "health": {"status": "Healthy"}});
    status_obj["metadata"]["resourceVersion"] = json!("go-1");
    send_acked(
        &mut go,
        "status",
        json!({"type": EventType::StatusUpdate.as_str(), "target": "application", "data": status_obj}),
    )
    .await?;
    wait_hub("the hub to show the Go agent's status", async || {
        let a = apps.get("guestbook").await?;
        Ok((a.data["status"]["sync"]["revision"] == "go-rev").then_some(()))
    })
    .await?;
    send_acked(
        &mut go,
        "error",
        json!({"type": EventType::Error.as_str(), "target": "application",
               "data": {"resourceName": "guestbook", "resourceNamespace": agent, "message": "from Go"}}),
    )
    .await?;
    send_acked(
        &mut go,
        "cache",
        json!({"type": EventType::ClusterCacheInfoUpdate.as_str(), "target": "clusterCacheInfoUpdate",
               "data": {"applicationsCount": 1, "apisCount": 2, "resourcesCount": 3}}),
    )
    .await?;
    send_acked(&mut go, "ping", json!({"type": EventType::Ping.as_str(), "target": "heartbeat"})).await?;

    // Resync, checksums computed by Go: a resource set that differs from the hub's makes our
    // principal list what it has; a stale spec checksum makes it send the spec.
    send_acked(
        &mut go,
        "list",
        json!({"type": EventType::RequestSyncedResourceList.as_str(), "target": "resourceResync", "data": {},
               "checksum_keys": [{"kind": "Application", "name": "other", "namespace": ARGOCD_NS, "uid": "x"}]}),
    )
    .await?;
    received(&mut go, EventType::ResponseSyncedResource, Target::ResourceResync, |r| r["data"]["name"] == "guestbook")
        .await?;
    let before = go.matching(|r| r["type"] == EventType::SpecUpdate.as_str()).len();
    let stale = json!({"kind": "Application", "spec": {"project": "stale"}});
    send_acked(
        &mut go,
        "update",
        json!({"type": EventType::RequestUpdate.as_str(), "target": "resourceResync",
               "data": {"name": "guestbook", "namespace": agent, "uid": hub_uid, "kind": "Application"},
               "spec_checksum_of": stale}),
    )
    .await?;
    go.wait("a spec-update answering request-update", |r| {
        r["type"] == EventType::SpecUpdate.as_str() && r["data"]["metadata"]["name"] == "guestbook"
    })
    .await?;
    ensure!(go.matching(|r| r["type"] == EventType::SpecUpdate.as_str()).len() > before);

    // Hub delete -> Go agent.
    apps.delete("guestbook", &Default::default()).await?;
    received(&mut go, EventType::Delete, Target::Application, |r| r["data"]["metadata"]["name"] == "guestbook").await?;

    // Nothing our principal sent was dropped by the Go agent.
    let dropped = go.matching(|r| r["kind"] == "dropped");
    ensure!(dropped.is_empty(), "the upstream agent dropped: {dropped:?}");
    Ok(())
}

/// Repository secrets and the GPG keys ConfigMap (upstream §4.5, §4.6) from our principal to an
/// upstream managed agent: each arrives whole in its target (`repository`, `gpgkey`), and our
/// answers to the agent's resync `request-update`s agree with the spec checksums Go computes
/// over their `data`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_agent_managed_gets_repository_secrets_and_gpg_keys() -> anyhow::Result<()> {
    let agent = "agent-gor";
    let (topo, mut go) = start_go_agent(agent, Mode::Managed).await?;
    received(&mut go, EventType::RequestResourceResync, Target::ResourceResync, |_| true).await?;
    let hub_projects = Api::<DynamicObject>::namespaced_with(
        topo.hub(),
        ARGOCD_NS,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AppProject"),
            "appprojects",
        ),
    );
    hub_projects
        .create(
            &PostParams::default(),
            &dynamic(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "team", "namespace": ARGOCD_NS},
                "spec": {"sourceRepos": ["*"], "sourceNamespaces": [agent],
                         "destinations": [{"name": agent, "namespace": "*", "server": "*"}]}}))?,
        )
        .await?;
    let secrets = Api::<DynamicObject>::namespaced_with(
        topo.hub(),
        ARGOCD_NS,
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Secret"), "secrets"),
    );
    secrets
        .create(
            &PostParams::default(),
            &dynamic(json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "repo", "namespace": ARGOCD_NS,
                             "labels": {"argocd.argoproj.io/secret-type": "repository"}},
                "type": "Opaque",
                "stringData": {"url": "https://git.example/r.git", "password": "pw", "project": "team"}}))?,
        )
        .await?;
    let created =
        received(&mut go, EventType::Create, Target::Repository, |r| r["data"]["metadata"]["name"] == "repo").await?;
    let uid = created["data"]["metadata"]["uid"].as_str().context("uid")?.to_owned();
    ensure!(created["resourceid"] == format!("repo_{uid}"), "{created}");
    ensure!(created["data"]["data"]["password"] == "cHc=", "credentials travel in data, base64: {created}");
    ensure!(created["subject"] == format!("{ARGOCD_NS}/repo"), "{created}");

    // request-update with the checksum Go computes over the same data: nothing to send.
    let repo_updates =
        |go: &GoPeer| go.matching(|r| r["type"] == EventType::SpecUpdate.as_str() && r["target"] == "repository").len();
    let request = |name: &str, data: Value| {
        json!({"type": EventType::RequestUpdate.as_str(), "target": "resourceResync",
               "data": {"name": name, "namespace": agent, "uid": uid, "kind": "Repository"},
               "spec_checksum_of": {"kind": "Secret", "data": data}})
    };
    let before = repo_updates(&go);
    send_acked(&mut go, "same", request("repo", created["data"]["data"].clone())).await?;
    // A stale copy: the secret is sent again (upstream answers this one with an error).
    send_acked(&mut go, "stale", request("repo", json!({"password": "b2xk"}))).await?;
    go.wait("a spec-update answering the stale request-update", |r| {
        r["type"] == EventType::SpecUpdate.as_str() && r["target"] == "repository"
    })
    .await?;
    ensure!(repo_updates(&go) == before + 1, "only the stale copy is sent again");

    // A copy the hub does not have: deleted.
    send_acked(&mut go, "unknown", request("not-on-hub", json!({}))).await?;
    received(&mut go, EventType::Delete, Target::Repository, |r| r["data"]["metadata"]["name"] == "not-on-hub").await?;

    // Hub delete -> Go agent.
    secrets.delete("repo", &Default::default()).await?;
    received(&mut go, EventType::Delete, Target::Repository, |r| r["data"]["metadata"]["name"] == "repo").await?;

    // The GPG keys ConfigMap (upstream §4.6), and a stale copy of it answered with the current one.
    let config_maps = Api::<DynamicObject>::namespaced_with(
        topo.hub(),
        ARGOCD_NS,
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "ConfigMap"), "configmaps"),
    );
    config_maps
        .create(
            &PostParams::default(),
            &dynamic(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "argocd-gpg-keys-cm", "namespace": ARGOCD_NS},
                "data": {"4AEE18F83AFDEB23": "key"}}))?,
        )
        .await?;
    let gpg = received(&mut go, EventType::Create, Target::GpgKey, |r| r["data"]["data"]["4AEE18F83AFDEB23"] == "key")
        .await?;
    let gpg_uid = gpg["data"]["metadata"]["uid"].as_str().context("uid")?.to_owned();
    send_acked(
        &mut go,
        "gpg-stale",
        json!({"type": EventType::RequestUpdate.as_str(), "target": "resourceResync",
               "data": {"name": "argocd-gpg-keys-cm", "namespace": agent, "uid": gpg_uid, "kind": "GPGKey"},
               "spec_checksum_of": {"kind": "ConfigMap", "data": {"4AEE18F83AFDEB23": "old"}}}),
    )
    .await?;
    received(&mut go, EventType::SpecUpdate, Target::GpgKey, |r| r["data"]["data"]["4AEE18F83AFDEB23"] == "key")
        .await?;
    let dropped = go.matching(|r| r["kind"] == "dropped");
    ensure!(dropped.is_empty(), "the upstream agent dropped: {dropped:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_agent_autonomous_against_our_principal() -> anyhow::Result<()> {
    let agent = "agent-goa";
    let (topo, mut go) = start_go_agent(agent, Mode::Autonomous).await?;
    let apps = applications(topo.hub(), agent);

    // Go agent -> hub: Application create, spec-update, AppProject create/update/delete, delete.
    let app = application_json("auto", ARGOCD_NS, "go-uid-1", "1");
    send_acked(&mut go, "create", json!({"type": EventType::Create.as_str(), "target": "application", "data": app}))
        .await?;
    wait_hub("the Go agent's Application on the hub", async || Ok(apps.get_opt("auto").await?.map(|_| ()))).await?;
    let mut updated = application_json("auto", ARGOCD_NS, "go-uid-1", "2");
    updated["spec"]["source"]["path"] = json!("changed-by-go");
    send_acked(
        &mut go,
        "spec",
        json!({"type": EventType::SpecUpdate.as_str(), "target": "application", "data": updated}),
    )
    .await?;
    wait_hub("the spec update on the hub", async || {
        Ok(apps.get_opt("auto").await?.filter(|a| a.data["spec"]["source"]["path"] == "changed-by-go").map(|_| ()))
    })
    .await?;

    // Hub -> Go agent: set-operation on the agent's Application.
    apps.patch("auto", &PatchParams::default(), &Patch::Merge(json!({"operation": null}))).await?;
    apps.patch(
        "auto",
        &PatchParams::default(),
        &Patch::Merge(json!({"operation": {"sync": {"revision": "from-hub"}}})),
    )
    .await?;
    let op = go
        .wait("an operation for the autonomous Application", |r| {
            (r["type"] == EventType::SetOperation.as_str() || r["type"] == EventType::SpecUpdate.as_str())
                && r["data"]["operation"]["sync"]["revision"] == "from-hub"
        })
        .await?;
    check_received(&op)?;

    let mut project = appproject_json();
    project["metadata"]["name"] = json!("go-proj");
    send_acked(
        &mut go,
        "proj",
        json!({"type": EventType::Create.as_str(), "target": "appproject", "data": project.clone()}),
    )
    .await?;
    project["metadata"]["resourceVersion"] = json!("5");
    project["spec"]["description"] = json!("updated by Go");
    send_acked(
        &mut go,
        "proj2",
        json!({"type": EventType::SpecUpdate.as_str(), "target": "appproject", "data": project.clone()}),
    )
    .await?;
    send_acked(&mut go, "proj3", json!({"type": EventType::Delete.as_str(), "target": "appproject", "data": project}))
        .await?;

    // Resync, the autonomous way round: the agent asks, our principal answers with a
    // request-update per hub copy and a request-synced-resource-list.
    send_acked(
        &mut go,
        "resync",
        json!({"type": EventType::RequestResourceResync.as_str(), "target": "resourceResync", "data": {}}),
    )
    .await?;
    received(&mut go, EventType::RequestSyncedResourceList, Target::ResourceResync, |_| true).await?;
    received(&mut go, EventType::RequestUpdate, Target::ResourceResync, |r| r["data"]["name"] == "auto").await?;
    // The Go agent answers as upstream's would: its tracked resource, with the source UID.
    send_acked(
        &mut go,
        "synced",
        json!({"type": EventType::ResponseSyncedResource.as_str(), "target": "resourceResync",
               "data": {"name": "auto", "namespace": ARGOCD_NS, "uid": "go-uid-1", "kind": "Application"}}),
    )
    .await?;

    send_acked(
        &mut go,
        "delete",
        json!({"type": EventType::Delete.as_str(), "target": "application", "data": updated}),
    )
    .await?;
    wait_hub("the Application gone from the hub", async || Ok(apps.get_opt("auto").await?.is_none().then_some(())))
        .await?;
    let dropped = go.matching(|r| r["kind"] == "dropped");
    ensure!(dropped.is_empty(), "the upstream agent dropped: {dropped:?}");
    Ok(())
}

// === the Go peer as an upstream principal against our agent ===

async fn start_go_principal(name: &str, mode: Mode) -> anyhow::Result<(Topology, GoPeer)> {
    let mut topo = Topology::start_without_agents(&[(name, mode)]).await?;
    let pki = Pki::of_kubeconfig(&topo.kubeconfig())?;
    let (mut go, addr) = GoPeer::principal(&pki, OUR_VERSION).await?;
    topo.start_agent_via(name, addr).await?;
    let auth = go.wait("our agent to authenticate", |r| r["kind"] == "authenticate").await?;
    ensure!(auth["agent"] == name && auth["version"] == OUR_VERSION && auth["method"] == "mtls", "{auth}");
    go.wait("our agent to subscribe", |r| r["kind"] == "subscribed").await?;
    Ok((topo, go))
}

/// An upstream principal (v0.8.0 on) accepts only its own bare version in `AuthRequest.version`
/// and refuses ours with `FailedPrecondition "version mismatch"`: our agent reads the
/// principal's `versionapi.Version` (`argocd-agent-<version>`), presents that version, and
/// connects, whatever the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_principals_of_every_release_take_our_agent() -> anyhow::Result<()> {
    let name = "agent-gpv";
    let mut topo = Topology::start_without_agents(&[(name, Mode::Managed)]).await?;
    let pki = Pki::of_kubeconfig(&topo.kubeconfig())?;
    for release in ["0.8.0", "0.9.0", "0.10.0"] {
        let (mut go, addr) = GoPeer::principal(&pki, release).await?;
        topo.start_agent_via(name, addr).await?;
        let refused = go.wait("our version refused first", |r| r["kind"] == "version_mismatch").await?;
        ensure!(refused["version"] == OUR_VERSION, "{release}: {refused}");
        let auth =
            go.wait("our agent to authenticate", |r| r["kind"] == "authenticate").await.with_context(|| topo.logs())?;
        ensure!(auth["agent"] == name && auth["version"] == release, "{release}: {auth}");
        go.wait("our agent to subscribe", |r| r["kind"] == "subscribed").await?;
        topo.kill_agent(name)?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_principal_against_our_agent_managed() -> anyhow::Result<()> {
    let agent = "agent-gpm";
    let (topo, mut go) = start_go_principal(agent, Mode::Managed).await?;
    let spoke = applications(topo.spoke(agent)?, ARGOCD_NS);

    // The Go principal sends nothing first, so grpc-go holds back the stream's response
    // headers: our agent must open with its resync request anyway, as upstream's agent does
    // (its resource-set checksum; empty spoke, no checksum).
    let list = received(&mut go, EventType::RequestSyncedResourceList, Target::ResourceResync, |_| true).await?;
    ensure!(list["data"]["checksum"].is_null(), "no resources, no checksum: {list}");
    ensure!(go.matching(|r| r["kind"] == "sent").is_empty(), "the Go principal sent first: {}", go.diagnostics());
    // Principal -> agent resync: our agent answers request-resource-resync (nothing to list).
    send_acked(
        &mut go,
        "hello",
        json!({"type": EventType::RequestResourceResync.as_str(), "target": "resourceResync", "data": {}}),
    )
    .await?;

    // Go principal -> our agent: AppProject and Application create, spec-update,
    // set-operation, terminate-operation; each applied to the spoke and ACKed.
    let mut project = appproject_json();
    project["metadata"]["name"] = json!("default");
    send_acked(
        &mut go,
        "proj",
        json!({"type": EventType::Create.as_str(), "target": "appproject", "data": project.clone()}),
    )
    .await?;
    let projects = appprojects(topo.spoke(agent)?, ARGOCD_NS);
    wait_hub("the AppProject on the spoke", async || Ok(projects.get_opt("default").await?.map(|_| ()))).await?;
    project["metadata"]["resourceVersion"] = json!("5");
    project["spec"]["description"] = json!("from the Go principal");
    send_acked(
        &mut go,
        "proj2",
        json!({"type": EventType::SpecUpdate.as_str(), "target": "appproject", "data": project.clone()}),
    )
    .await?;

    let mut app = application_json("web", agent, "hub-uid-1", "1");
    app.as_object_mut().context("app")?.remove("operation");
    app.as_object_mut().context("app")?.remove("status");
    send_acked(
        &mut go,
        "create",
        json!({"type": EventType::Create.as_str(), "target": "application", "data": app.clone()}),
    )
    .await?;
    wait_hub("the Application on the spoke", async || Ok(spoke.get_opt("web").await?.map(|_| ()))).await?;
    app["metadata"]["resourceVersion"] = json!("2");
    app["spec"]["source"]["path"] = json!("from-go");
    send_acked(
        &mut go,
        "spec",
        json!({"type": EventType::SpecUpdate.as_str(), "target": "application", "data": app.clone()}),
    )
    .await?;
    wait_hub("the spec update on the spoke", async || {
        Ok(spoke.get_opt("web").await?.filter(|a| a.data["spec"]["source"]["path"] == "from-go").map(|_| ()))
    })
    .await?;
    app["metadata"]["resourceVersion"] = json!("3");
    app["operation"] = json!({"sync": {"revision": "go-op"}});
    send_acked(
        &mut go,
        "op",
        json!({"type": EventType::SetOperation.as_str(), "target": "application", "data": app.clone()}),
    )
    .await?;
    wait_hub("the operation on the spoke", async || {
        Ok(spoke.get_opt("web").await?.filter(|a| a.data["operation"]["sync"]["revision"] == "go-op").map(|_| ()))
    })
    .await?;
    app["metadata"]["resourceVersion"] = json!("4");
    send_acked(
        &mut go,
        "term",
        json!({"type": EventType::TerminateOperation.as_str(), "target": "application", "data": app.clone()}),
    )
    .await?;
    wait_hub("the operation terminating on the spoke", async || {
        Ok(spoke
            .get_opt("web")
            .await?
            .filter(|a| a.data["status"]["operationState"]["phase"] == "Terminating")
            .map(|_| ()))
    })
    .await?;

    // Our agent -> Go principal: status-update when the spoke's status changes.
    spoke
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"sync": {"status": "Synced", "revision": "spoke-rev"}}})),
        )
        .await?;
    received(&mut go, EventType::StatusUpdate, Target::Application, |r| {
        r["data"]["status"]["sync"]["revision"] == "spoke-rev"
    })
    .await?;

    // Resync from the principal's side: our agent answers request-resource-resync with a
    // request-update per resource.
    send_acked(
        &mut go,
        "resync",
        json!({"type": EventType::RequestResourceResync.as_str(), "target": "resourceResync", "data": {}}),
    )
    .await?;
    let update =
        received(&mut go, EventType::RequestUpdate, Target::ResourceResync, |r| r["data"]["name"] == "web").await?;
    ensure!(update["data"]["uid"] == "hub-uid-1", "{update}");
    // Delete -> gone from the spoke.
    send_acked(&mut go, "delete", json!({"type": EventType::Delete.as_str(), "target": "application", "data": app}))
        .await?;
    wait_hub("the Application gone from the spoke", async || Ok(spoke.get_opt("web").await?.is_none().then_some(())))
        .await?;
    let dropped = go.matching(|r| r["kind"] == "dropped");
    ensure!(dropped.is_empty(), "the upstream principal dropped: {dropped:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_principal_against_our_agent_autonomous() -> anyhow::Result<()> {
    let agent = "agent-gpa";
    let (topo, mut go) = start_go_principal(agent, Mode::Autonomous).await?;
    let spoke = applications(topo.spoke(agent)?, ARGOCD_NS);

    // The Go principal sends nothing first (see the managed test): our autonomous agent opens
    // with its request-resource-resync, as upstream's agent does.
    received(&mut go, EventType::RequestResourceResync, Target::ResourceResync, |_| true).await?;
    ensure!(go.matching(|r| r["kind"] == "sent").is_empty(), "the Go principal sent first: {}", go.diagnostics());
    send_acked(
        &mut go,
        "hello",
        json!({"type": EventType::RequestSyncedResourceList.as_str(), "target": "resourceResync", "data": {}, "checksum_keys": []}),
    )
    .await?;

    // Our agent -> Go principal: create, spec-update, delete of a spoke Application.
    spoke
        .create(
            &PostParams::default(),
            &dynamic(tests::fixtures::application_without_finalizers("local", ARGOCD_NS, "v1"))?,
        )
        .await?;
    received(&mut go, EventType::Create, Target::Application, |r| r["data"]["metadata"]["name"] == "local").await?;
    spoke
        .patch("local", &PatchParams::default(), &Patch::Merge(json!({"spec": {"source": {"targetRevision": "v2"}}})))
        .await?;
    received(&mut go, EventType::SpecUpdate, Target::Application, |r| {
        r["data"]["spec"]["source"]["targetRevision"] == "v2"
    })
    .await?;

    // Go principal -> our agent: set-operation, and the resync requests of the autonomous side.
    let local = spoke.get("local").await?;
    let mut app = serde_json::to_value(&local)?;
    app["operation"] = json!({"sync": {"revision": "from-principal"}});
    send_acked(
        &mut go,
        "op",
        json!({"type": EventType::SetOperation.as_str(), "target": "application", "data": app.clone()}),
    )
    .await?;
    wait_hub("the operation on the spoke", async || {
        Ok(spoke
            .get_opt("local")
            .await?
            .filter(|a| a.data["operation"]["sync"]["revision"] == "from-principal")
            .map(|_| ()))
    })
    .await?;
    let uid = local.metadata.uid.clone().context("uid")?;
    send_acked(
        &mut go,
        "list",
        json!({"type": EventType::RequestSyncedResourceList.as_str(), "target": "resourceResync", "data": {},
               "checksum_keys": []}),
    )
    .await?;
    received(&mut go, EventType::ResponseSyncedResource, Target::ResourceResync, |r| r["data"]["name"] == "local")
        .await?;
    send_acked(
        &mut go,
        "update",
        json!({"type": EventType::RequestUpdate.as_str(), "target": "resourceResync",
               "data": {"name": "local", "namespace": agent, "uid": uid, "kind": "Application"},
               "spec_checksum_of": {"kind": "Application", "spec": {}}}),
    )
    .await?;
    go.wait("a spec-update answering request-update", |r| {
        r["type"] == EventType::SpecUpdate.as_str() && r["data"]["metadata"]["name"] == "local"
    })
    .await?;

    spoke.delete("local", &Default::default()).await?;
    received(&mut go, EventType::Delete, Target::Application, |r| r["data"]["metadata"]["name"] == "local").await?;
    let dropped = go.matching(|r| r["kind"] == "dropped");
    ensure!(dropped.is_empty(), "the upstream principal dropped: {dropped:?}");
    Ok(())
}

// === gzip (`--enable-compression`) ===

/// A Helm values text of about `bytes` bytes, as compressible as real values files are (gzip
/// shrinks it several times, not a thousand times as it would a run of one letter).
fn helm_values(bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 128);
    let mut i = 0_usize;
    while text.len() < bytes {
        text.push_str(&format!(
            "service-{i:05}:\n  image: registry.local/team-{}/app-{}:v1.{}.{}\n  replicas: {}\n  cpu: {}m\n",
            i % 13,
            i % 37,
            i % 11,
            i % 7,
            i % 5,
            100 + (i * 37) % 900
        ));
        i += 1;
    }
    text
}

/// Size of the compressible payload each direction carries in the gzip tests.
const PAYLOAD: usize = 256 * 1024;

/// Bytes through `proxy` both ways (TLS records included).
fn traffic(proxy: &tests::faultproxy::FaultProxy) -> (u64, u64) {
    let s = proxy.stats();
    (s.bytes_to_upstream, s.bytes_to_client)
}

/// Upstream's agent with `--enable-compression` (grpc-go `UseCompressor(gzip)` on every call)
/// against our principal: it authenticates and streams, our principal reads its compressed
/// events and answers compressed; an agent beside it without compression is answered plain
/// (upstream's principal answers in the caller's compression). Measured on the wire: the same
/// 256 KiB Application down and 256 KiB status up cost the compressing agent a fraction of
/// the plain one's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_agent_with_compression_against_our_principal() -> anyhow::Result<()> {
    use tests::faultproxy::FaultProxy;
    let (plain, gz) = ("agent-goz-plain", "agent-goz-gzip");
    let topo = Topology::start_without_agents(&[(plain, Mode::Managed), (gz, Mode::Managed)]).await?;
    let pki = Pki::of_kubeconfig(&topo.kubeconfig())?;
    let principal = topo.principal_addr().context("principal address")?;
    let values = helm_values(PAYLOAD);
    let mut measured = Vec::new();
    for (agent, flags) in [(plain, &[][..]), (gz, &["--compress"][..])] {
        let proxy = FaultProxy::start(principal).await?;
        let mut go = GoPeer::agent_with(&pki, agent, proxy.addr(), "managed", UPSTREAM_AGENT_VERSION, flags)?;
        go_authenticated(&mut go, &topo).await.with_context(|| format!("{agent} {flags:?}"))?;
        go.wait("subscribed", |r| r["kind"] == "subscribed").await?;
        received(&mut go, EventType::RequestResourceResync, Target::ResourceResync, |_| true).await?;
        let before = traffic(&proxy);

        // Down: a large Application, whole.
        let apps = applications(topo.hub(), agent);
        let mut app = tests::fixtures::application_without_finalizers("big", agent, "v1");
        app["spec"]["source"]["helm"] = json!({"values": values});
        apps.create(&PostParams::default(), &dynamic(app)?).await?;
        let created =
            received(&mut go, EventType::Create, Target::Application, |r| r["data"]["metadata"]["name"] == "big")
                .await?;
        ensure!(created["data"]["spec"]["source"]["helm"]["values"] == values.as_str(), "{agent}: values not intact");
        let down = traffic(&proxy).1 - before.1;

        // Up: a large status, applied to the hub whole.
        let mut status_obj = created["data"].clone();
        status_obj["status"] = json!({"sync": {"status": "OutOfSync"},
            "conditions": [{"type": "ComparisonError", "message": values}]});
        send_acked(
            &mut go,
            "status",
            json!({"type": EventType::StatusUpdate.as_str(), "target": "application", "data": status_obj}),
        )
        .await?;
        wait_hub("the large status on the hub", async || {
            let a = apps.get("big").await?;
            Ok((a.data["status"]["conditions"][0]["message"] == values.as_str()).then_some(()))
        })
        .await?;
        let up = traffic(&proxy).0 - before.0;
        ensure!(go.matching(|r| r["kind"] == "dropped").is_empty(), "{agent}: {}", go.diagnostics());
        eprintln!("{agent} {flags:?}: {PAYLOAD} B each way; on the wire {down} B down, {up} B up");
        measured.push((down, up));
    }
    let [(plain_down, plain_up), (gz_down, gz_up)] = measured[..] else { anyhow::bail!("two runs") };
    // Plain carries at least the payload each way; gzip a third of that at most (values text
    // compresses about 8x; the margin keeps TLS framing and other events out of the verdict).
    ensure!(plain_down >= PAYLOAD as u64 && plain_up >= PAYLOAD as u64, "plain: {plain_down} down, {plain_up} up");
    ensure!(
        gz_down * 3 < plain_down,
        "our principal answered the compressing agent plain: {gz_down} vs {plain_down} B"
    );
    ensure!(gz_up * 3 < plain_up, "the Go agent's events were not compressed: {gz_up} vs {plain_up} B");
    Ok(())
}

/// Our agent with `--enable-compression` against upstream's principal (grpc-go with gzip
/// registered, as upstream's `principal/listen.go`): its compressed calls are read, the Go
/// principal answers compressed because our agent compressed, and both directions shrink on
/// the wire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_principal_with_our_compressing_agent() -> anyhow::Result<()> {
    use tests::faultproxy::FaultProxy;
    let agent = "agent-gpz";
    let mut topo = Topology::start_without_agents(&[(agent, Mode::Managed)]).await?;
    let pki = Pki::of_kubeconfig(&topo.kubeconfig())?;
    let (mut go, addr) = GoPeer::principal(&pki, OUR_VERSION).await?;
    let proxy = FaultProxy::start(addr).await?;
    topo.set_agent_args(&["--enable-compression"]);
    topo.start_agent_via(agent, proxy.addr()).await?;
    go.wait("our agent to subscribe", |r| r["kind"] == "subscribed").await?;
    received(&mut go, EventType::RequestSyncedResourceList, Target::ResourceResync, |_| true).await?;
    let spoke = applications(topo.spoke(agent)?, ARGOCD_NS);
    let values = helm_values(PAYLOAD);
    let before = traffic(&proxy);

    let mut app = application_json("big", agent, "hub-uid-z", "1");
    app.as_object_mut().context("app")?.remove("operation");
    app.as_object_mut().context("app")?.remove("status");
    app["spec"]["source"]["helm"] = json!({"values": values});
    send_acked(&mut go, "create", json!({"type": EventType::Create.as_str(), "target": "application", "data": app}))
        .await?;
    wait_hub("the large Application on the spoke", async || {
        Ok(spoke.get_opt("big").await?.filter(|a| a.data["spec"]["source"]["helm"]["values"] == values.as_str()))
    })
    .await?;
    let down = traffic(&proxy).1 - before.1;

    spoke
        .patch(
            "big",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{"type": "ComparisonError", "message": values}]}})),
        )
        .await?;
    received(&mut go, EventType::StatusUpdate, Target::Application, |r| {
        r["data"]["status"]["conditions"][0]["message"] == values.as_str()
    })
    .await?;
    let up = traffic(&proxy).0 - before.0;
    eprintln!("{PAYLOAD} B each way; on the wire {down} B down, {up} B up");
    ensure!(down * 3 < PAYLOAD as u64, "the Go principal answered our compressing agent plain: {down} B");
    // A status-update carries the whole Application: the values and the message, twice the
    // payload (the plain Go agent's in the test above measures 2.1 times it).
    ensure!(up * 3 < 2 * PAYLOAD as u64, "our agent's events were not compressed: {up} B");
    ensure!(go.matching(|r| r["kind"] == "dropped").is_empty(), "{}", go.diagnostics());
    Ok(())
}

// === the resource proxy with upstream peers ===

/// A managed upstream-shaped Go agent `name` subscribed to our principal, which serves the
/// resource proxy; and a kubeconfig from the agent's cluster secret (in the returned dir), as
/// the hub's Argo CD would use it.
async fn go_agent_behind_our_proxy(
    name: &str,
) -> anyhow::Result<(Topology, GoPeer, std::path::PathBuf, tempfile::TempDir)> {
    let options = StartOptions { start_agents: false, resource_proxy: true, ..StartOptions::default() };
    let topo = Topology::start_with_options(&[(name, Mode::Managed)], options).await?;
    let pki = Pki::of_kubeconfig(&topo.kubeconfig())?;
    let addr = topo.principal_addr().context("principal address")?;
    let mut go = GoPeer::agent(&pki, name, addr, "managed", UPSTREAM_AGENT_VERSION)?;
    go_authenticated(&mut go, &topo).await?;
    go.wait("subscribed", |r| r["kind"] == "subscribed").await?;
    let proxy = topo.resource_proxy_addr().context("the resource proxy")?;
    topo.ctl(&["agent", "create", name, "--resource-proxy-server", &proxy.to_string()])?;
    let scratch = tempfile::tempdir()?;
    let kubeconfig = tests::live::cluster_kubeconfig(&topo, name, scratch.path()).await?;
    Ok((topo, go, kubeconfig, scratch))
}

/// Our principal's resource proxy in front of an upstream agent: the request it sends is
/// upstream's `ResourceRequest` as sdk-go decodes it (ids, fields, method as type), and the
/// answer an upstream agent sends back (a fresh resourceid, eventid = the request's uuid) reaches
/// kubectl; a bare error status, as upstream's agent sends, reaches it as a Status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_agent_answers_our_resource_proxy() -> anyhow::Result<()> {
    let name = "agent-grp";
    let (_topo, mut go, kubeconfig, _scratch) = go_agent_behind_our_proxy(name).await?;

    for (seen, (status, resource, expect)) in [
        (
            200,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web"}, "data": {"from": "go"}})
                .to_string(),
            "\"from\":\"go\"",
        ),
        (403, String::new(), "Forbidden"),
    ]
    .into_iter()
    .enumerate()
    {
        let kubectl = Kubectl::new(&kubeconfig)?;
        let get = tokio::spawn(async move {
            kubectl.run(["get", "--raw", "/api/v1/namespaces/guestbook/configmaps/web?resourceVersion=0"]).await
        });
        let req = wait_hub("the proxied GET", async || {
            Ok(go.matching(|r| r["type"] == "GET" && r["target"] == "resource").get(seen).cloned())
        })
        .await?;
        check_received(&req)?;
        let data = &req["data"];
        ensure!(
            data["namespace"] == "guestbook"
                && data["name"] == "web"
                && data["group"] == ""
                && data["version"] == "v1"
                && data["resource"] == "configmaps"
                && data["method"] == "GET"
                && data["params"]["resourceVersion"] == "0",
            "upstream's ResourceRequest: {req}"
        );
        let uuid = data["uuid"].as_str().context("uuid")?.to_owned();
        ensure!(req["eventid"] == uuid.as_str() && req["resourceid"] == uuid.as_str(), "ids: {req}");
        // As upstream's NewResourceResponseEvent: a fresh resourceid, eventid = the request's uuid.
        go.ask(
            &format!("answer-{status}"),
            json!({"cmd": "send", "type": EventType::Response.as_str(), "target": "resource", "eventid": uuid,
                   "data": {"uuid": uuid, "status": status, "resource": resource}}),
        )
        .await?;
        let out = get.await??;
        ensure!(out.stdout.contains(expect) || out.stderr.contains(expect), "{out}");
        ensure!(out.success() == (status == 200), "{out}");
    }
    Ok(())
}

/// An upstream principal's resource requests against our agent: a GET of a tracked object is
/// answered 200 with the object, one of an untracked object 403 with a Status body, both as
/// upstream's `ResourceResponse` (eventid = the request's uuid).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_principal_resource_requests_against_our_agent() -> anyhow::Result<()> {
    let agent = "agent-gpr";
    let (topo, mut go) = start_go_principal(agent, Mode::Managed).await?;
    // The Application the tracked object names: the agent serves only what its Applications manage.
    let mut app = application_json("a", agent, "hub-uid-a", "1");
    app.as_object_mut().context("app")?.remove("operation");
    app.as_object_mut().context("app")?.remove("status");
    send_acked(&mut go, "create", json!({"type": EventType::Create.as_str(), "target": "application", "data": app}))
        .await?;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(topo.spoke(agent)?, ARGOCD_NS);
    for (name, annotations) in
        [("tracked", json!({"argocd.argoproj.io/tracking-id": "a:/ConfigMap:argocd/tracked"})), ("plain", json!({}))]
    {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": name, "annotations": annotations}, "data": {"k": "v"}}),
            )?,
        )
        .await?;
    }
    for (name, status) in [("tracked", 200), ("plain", 403)] {
        let uuid = format!("req-{name}");
        go.ask(
            &uuid,
            json!({"cmd": "send", "type": "GET", "target": "resource", "resourceid": uuid, "eventid": uuid,
                   "data": {"uuid": uuid, "namespace": ARGOCD_NS, "name": name, "method": "GET",
                            "group": "", "version": "v1", "resource": "configmaps"}}),
        )
        .await?;
        let answer =
            received(&mut go, EventType::Response, Target::Resource, |r| r["eventid"] == uuid.as_str()).await?;
        ensure!(answer["resourceid"] != uuid.as_str(), "a fresh resourceid, as upstream: {answer}");
        let data = &answer["data"];
        ensure!(data["uuid"] == uuid.as_str() && data["status"] == status, "{answer}");
        let body: Value = serde_json::from_str(data["resource"].as_str().context("resource")?)?;
        if status == 200 {
            ensure!(body["metadata"]["name"] == name, "{body}");
        } else {
            ensure!(body["kind"] == "Status" && body["reason"] == "Forbidden", "{body}");
        }
    }
    Ok(())
}

/// Our principal's pod logs and web terminal in front of an upstream-shaped agent: grpc-go opens
/// `StreamLogs` and `StreamTerminal` on the agent's connection with its access token and a
/// handshake frame, as upstream's agent does (agent/log.go, agent/terminal.go). The log bytes
/// reach kubectl verbatim (upstream's agent always sends kubelet timestamps), the call is
/// answered with status 200; a terminal's stdin reaches the agent and its output reaches
/// kubectl, whose EOF ends the session on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gopeer_upstream_agent_streams_logs_and_a_terminal_through_our_proxy() -> anyhow::Result<()> {
    let name = "agent-gls";
    let (topo, mut go, kubeconfig, _scratch) = go_agent_behind_our_proxy(name).await?;
    let kubectl = Kubectl::new(&kubeconfig)?;

    let log = kubectl.ok(["get", "--raw", "/api/v1/namespaces/guestbook/pods/web/log?container=main"]).await?;
    let lines: Vec<&str> = log.lines().collect();
    ensure!(lines.len() == 3, "three lines from the Go agent: {log:?}\n{}", go.diagnostics());
    for (i, line) in lines.iter().enumerate() {
        ensure!(
            line.ends_with(&format!("guestbook/web line {}", i + 1)) && line.starts_with("2026-01-02T03:04:05"),
            "{line:?}"
        );
    }
    let done = go.wait("the log call's answer", |r| r["kind"] == "log_stream_done").await?;
    ensure!(done["status"] == 200 && done["follow"] == false && done["code"].is_null(), "{done}");
    let req = go.matching(|r| r["target"] == "containerlog").into_iter().next().context("the containerlog request")?;
    check_received(&req)?;
    ensure!(req["type"] == "GET" && req["data"]["podName"] == "web" && req["data"]["container"] == "main", "{req}");

    // A terminal, as kube-rs (and Argo CD's server) opens it: a WebSocket with v5.channel.k8s.io
    // on the proxy, stdin piped through the Go agent's echoing shell and back.
    let client = tests::live::cluster_client(&topo, name).await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, "guestbook");
    let params = kube::api::AttachParams::default().container("main").stdin(true).stdout(true).stderr(false);
    let mut cat = pods.exec("web", ["cat"], &params).await?;
    let mut stdin = cat.stdin().context("stdin")?;
    let mut stdout = cat.stdout().context("stdout")?;
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"hello terminal\n").await?;
    let mut echoed = vec![0u8; 15];
    tokio::time::timeout(tests::wait::DEFAULT_TIMEOUT, tokio::io::AsyncReadExt::read_exact(&mut stdout, &mut echoed))
        .await
        .with_context(|| format!("no echo\n{}", go.diagnostics()))??;
    ensure!(echoed == b"hello terminal\n", "{:?}", String::from_utf8_lossy(&echoed));
    // Closing stdin (v5's close of channel 0) reaches the agent as `eof`; its `eof` ends the
    // session.
    // (kube-rs sees stdin end on shutdown; dropping a split half would not close it.)
    tokio::io::AsyncWriteExt::shutdown(&mut stdin).await?;
    drop(stdin);
    let mut rest = Vec::new();
    tokio::time::timeout(tests::wait::DEFAULT_TIMEOUT, tokio::io::AsyncReadExt::read_to_end(&mut stdout, &mut rest))
        .await
        .with_context(|| format!("the session did not end after stdin closed\n{}", go.diagnostics()))??;
    ensure!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    tokio::time::timeout(tests::wait::DEFAULT_TIMEOUT, cat.join()).await.context("the session's end")??;
    let open = go.wait("the terminal call", |r| r["kind"] == "terminal_open").await?;
    ensure!(open["command"] == json!(["cat"]) && open["pod"] == "web", "{open}");
    let done = go.wait("the terminal's end", |r| r["kind"] == "terminal_done").await?;
    ensure!(done["code"].is_null() || done["code"] == "OK", "{done}");
    Ok(())
}
