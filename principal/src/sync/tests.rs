//! Routing and resync on the hub indexes alone: the watch indexes are fed synthetic watch
//! events through [`link::watch::drive`], and what reaches each agent is read from its mailbox.
//! The hub's API server is never reached ([`Hub::offline`]: every request would fail).

use std::sync::Arc;

use kube::api::DynamicObject;
use kube::runtime::watcher::Event as WatchEvent;
use link::watch::{Index, drive};
use protocol::argocd::annotations::IGNORE_SYNC;
use protocol::checksum::{RESYNC_KIND_APP_PROJECT, RESYNC_KIND_APPLICATION};
use protocol::payload::RequestUpdate;
use protocol::{Event, EventType, Payload, Target};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::hub::Hub;
use super::watch::{Applications, GpgKeys, Projects, Repositories};
use crate::config::{AgentMode, PrincipalConfig};
use crate::ident::StreamGrant;
use crate::peer::{AgentPeer, StreamHandle};

fn hub() -> Hub {
    let mut config = PrincipalConfig::new("argocd");
    config.allowed_namespaces = vec!["agent-*".into()];
    Hub::offline(config)
}

fn app(ns: &str, name: &str, path: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"), "resourceVersion": "1"},
        "spec": {"project": "default", "source": {"repoURL": "https://example.com/r.git", "path": path},
                 "destination": {"server": "https://kubernetes.default.svc", "namespace": "default"}},
    }))
    .expect("an Application")
}

fn ignored(mut obj: DynamicObject) -> DynamicObject {
    obj.metadata.labels.get_or_insert_default().insert(IGNORE_SYNC.into(), "true".into());
    obj
}

fn project(name: &str, destination: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}"), "resourceVersion": "1"},
        "spec": {"destinations": [{"name": destination, "namespace": "*", "server": "*"}], "sourceNamespaces": ["*"]},
    }))
    .expect("an AppProject")
}

/// Feeds watch events to an index, as a live watch would.
async fn feed<I: Index<Object = DynamicObject>>(index: &I, events: Vec<WatchEvent<DynamicObject>>) {
    drive(index, futures::stream::iter(events.into_iter().map(Ok)), &CancellationToken::new()).await;
}

/// A listed hub: the watches' first list, so the resync reads the caches.
async fn listed(hub: &Hub, apps: Vec<DynamicObject>, projects: Vec<DynamicObject>) {
    let initial = |objs: Vec<DynamicObject>| {
        std::iter::once(WatchEvent::Init)
            .chain(objs.into_iter().map(WatchEvent::InitApply))
            .chain([WatchEvent::InitDone])
    };
    feed(&Applications(hub), initial(apps).collect()).await;
    feed(&Projects(hub), initial(projects).collect()).await;
    feed(&Repositories(hub), initial(Vec::new()).collect()).await;
    feed(&GpgKeys(hub), initial(Vec::new()).collect()).await;
}

fn repo_secret(name: &str, project: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}"), "resourceVersion": "1",
                     "labels": {"argocd.argoproj.io/secret-type": "repository"}},
        "stringData": {"project": project},
    }))
    .expect("a Secret")
}

/// An agent with a live stream.
fn connect(hub: &Hub, agent: &str, mode: AgentMode) -> (Arc<AgentPeer>, StreamHandle) {
    let peer = hub.peers.get_or_create(agent, mode);
    let handle = peer.attach(mode, StreamGrant::default());
    (peer, handle)
}

/// What the agent was sent since the last call, each ACKed at once (so the resource's next event
/// may go): `"<type> <name>"`, the name read from the payload.
fn sent(peer: &AgentPeer, handle: &StreamHandle) -> Vec<String> {
    let ready = peer.mailbox().take_ready(handle.attachment(), "test").expect("the stream is current");
    ready
        .events
        .iter()
        .map(|ev| {
            peer.mailbox().ack(&ev.resource_id, &ev.event_id);
            describe(ev)
        })
        .collect()
}

fn describe(ev: &Event) -> String {
    let ty = ev.event_type.as_str().rsplit('.').next().unwrap_or_default().to_owned();
    let name = match ev.payload() {
        Ok(Payload::Application(a)) => a.metadata.name.unwrap_or_default(),
        Ok(Payload::AppProject(p)) => p.metadata.name.unwrap_or_default(),
        Ok(Payload::Repository(r)) => r.metadata.name.unwrap_or_default(),
        Ok(Payload::RequestUpdate(r)) => r.name,
        Ok(Payload::SyncedResource(r)) => r.name,
        _ => ev.target.as_str().to_owned(),
    };
    format!("{ty} {name}")
}

#[tokio::test]
async fn hub_changes_of_a_managed_agents_applications_reach_it_in_order() {
    let hub = hub();
    let (peer, stream) = connect(&hub, "agent-1", AgentMode::Managed);
    listed(&hub, vec![app("agent-1", "guestbook", "v1")], vec![]).await;
    assert_eq!(sent(&peer, &stream), ["create guestbook"]);

    let apps = Applications(&hub);
    feed(&apps, vec![WatchEvent::Apply(app("agent-1", "guestbook", "v2"))]).await;
    assert_eq!(sent(&peer, &stream), ["spec-update guestbook"]);
    feed(&apps, vec![WatchEvent::Apply(app("agent-1", "guestbook", "v2"))]).await;
    assert!(sent(&peer, &stream).is_empty(), "the same spec again sends nothing");
    feed(&apps, vec![WatchEvent::Delete(app("agent-1", "guestbook", "v2"))]).await;
    assert_eq!(sent(&peer, &stream), ["delete guestbook"]);
}

#[tokio::test]
async fn applications_of_other_agents_or_outside_allowed_namespaces_are_not_sent() {
    let hub = hub();
    let (peer, stream) = connect(&hub, "agent-1", AgentMode::Managed);
    let (peer2, stream2) = connect(&hub, "agent-2", AgentMode::Managed);
    listed(&hub, vec![app("agent-2", "other", "v1"), app("team-x", "stray", "v1")], vec![]).await;
    assert!(sent(&peer, &stream).is_empty());
    assert_eq!(sent(&peer2, &stream2), ["create other"]);
    assert!(!hub.seen_apps.contains(&("team-x".into(), "stray".into())), "never indexed");
}

#[tokio::test]
async fn a_relist_that_no_longer_returns_an_application_deletes_it_on_the_agent() {
    let hub = hub();
    let (peer, stream) = connect(&hub, "agent-1", AgentMode::Managed);
    listed(&hub, vec![app("agent-1", "kept", "v1"), app("agent-1", "gone", "v1")], vec![]).await;
    assert_eq!(sent(&peer, &stream).len(), 2);
    // The watch broke; `gone` was deleted while it was down.
    feed(
        &Applications(&hub),
        vec![WatchEvent::Init, WatchEvent::InitApply(app("agent-1", "kept", "v1")), WatchEvent::InitDone],
    )
    .await;
    assert_eq!(sent(&peer, &stream), ["delete gone"]);
}

/// A managed agent's `request-update` for a resource of `kind` it does not hold (no UID, no
/// checksum).
async fn ask(hub: &Hub, peer: &AgentPeer, kind: &str, name: &str) {
    let req = RequestUpdate {
        name: name.into(),
        namespace: "argocd".into(),
        uid: String::new(),
        kind: kind.into(),
        checksum: None,
    };
    let ev = Event::request(EventType::RequestUpdate, Target::ResourceResync, "req").with_json(&req).expect("event");
    let payload = ev.payload().expect("payload");
    crate::sync::resync::handle(hub, peer, &ev, payload).await.expect("answered");
}

/// `obj` as a client creates it: no UID, no resourceVersion.
fn new_object(mut obj: DynamicObject) -> DynamicObject {
    obj.metadata.uid = None;
    obj.metadata.resource_version = None;
    obj
}

/// Creates the Application `name` of agent-1 on the hub's API server.
async fn create(hub: &Hub, name: &str) {
    assert!(hub.apps.create("agent-1", name, &new_object(app("agent-1", name, "v1"))).await.expect("created"));
}

/// A hub on the embedded API server with the namespaces `argocd` and `agent-1`, listed empty.
async fn live_hub(dir: &std::path::Path) -> (apiserver::ApiServer, Hub) {
    let server = apiserver::ApiServer::start(apiserver::Config::new(dir.join("data"))).await.expect("started");
    let client = server.client().await.expect("a client");
    for ns in ["argocd", "agent-1"] {
        protocol::kube_store::ensure_namespace(&client, ns, &Default::default()).await.expect("a namespace");
    }
    let mut config = PrincipalConfig::new("argocd");
    config.allowed_namespaces = vec!["agent-*".into()];
    let hub = Hub::new(config, "principal-uid".into(), client);
    listed(&hub, vec![], vec![]).await;
    (server, hub)
}

/// The watch listed the hub, then broke (a 410 Gone: the real API server answers one when its
/// watch cache starts after the list). Meanwhile `down` was created, a resync's live read sent it
/// to its agent, and it was deleted: the re-list that no longer returns it deletes it on the
/// agent. `late`, sent the same way and still on the hub, was created after that re-list's
/// snapshot: it is not deleted, and the watch showing it later sends nothing new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_sent_from_a_live_read_and_deleted_while_unwatched_is_deleted_on_the_agent() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (_server, hub) = live_hub(dir.path()).await;
    let (peer, stream) = connect(&hub, "agent-1", AgentMode::Managed);

    create(&hub, "down").await;
    ask(&hub, &peer, RESYNC_KIND_APPLICATION, "down").await;
    assert_eq!(sent(&peer, &stream), ["spec-update down"], "read live: the watch has not shown it");
    assert!(hub.apps.delete("agent-1", "down").await.expect("deleted"));
    create(&hub, "late").await;
    ask(&hub, &peer, RESYNC_KIND_APPLICATION, "late").await;
    assert_eq!(sent(&peer, &stream), ["spec-update late"]);
    let late = hub.apps.get::<DynamicObject>("agent-1", "late").await.expect("read").expect("on the hub");

    feed(&Applications(&hub), vec![WatchEvent::Init, WatchEvent::InitDone]).await;
    assert_eq!(sent(&peer, &stream), ["delete down"], "deleted while unwatched; `late` is newer than the re-list");
    feed(&Applications(&hub), vec![WatchEvent::Apply(late)]).await;
    assert!(sent(&peer, &stream).is_empty(), "the agent holds this version already");
    assert!(hub.seen_apps.contains(&("agent-1".into(), "late".into())));
    assert!(!hub.seen_apps.only_shipped(&("agent-1".into(), "late".into())), "watched now");
}

/// As [`an_application_sent_from_a_live_read_and_deleted_while_unwatched_is_deleted_on_the_agent`],
/// for an AppProject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_project_sent_from_a_live_read_and_deleted_while_unwatched_is_deleted_on_the_agent() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (_server, hub) = live_hub(dir.path()).await;
    let (peer, stream) = connect(&hub, "agent-1", AgentMode::Managed);
    for name in ["gone", "late"] {
        assert!(hub.projects.create("argocd", name, &new_object(project(name, "agent-*"))).await.expect("created"));
        ask(&hub, &peer, RESYNC_KIND_APP_PROJECT, name).await;
        assert_eq!(sent(&peer, &stream), [format!("spec-update {name}")], "read live");
        if name == "gone" {
            assert!(hub.projects.delete("argocd", name).await.expect("deleted"));
        }
    }
    feed(&Projects(&hub), vec![WatchEvent::Init, WatchEvent::InitDone]).await;
    assert_eq!(sent(&peer, &stream), ["delete gone"], "deleted while unwatched; `late` is newer than the re-list");
    let late = hub.projects.get::<DynamicObject>("argocd", "late").await.expect("read").expect("on the hub");
    feed(&Projects(&hub), vec![WatchEvent::Apply(late)]).await;
    assert!(sent(&peer, &stream).is_empty(), "the agent holds this version already");
    assert!(!hub.seen_projects.only_shipped("late"), "watched now");
}

#[tokio::test]
async fn labelling_an_application_ignore_sync_removes_it_from_its_agent() {
    let hub = hub();
    let (peer, stream) = connect(&hub, "agent-1", AgentMode::Managed);
    listed(&hub, vec![app("agent-1", "guestbook", "v1")], vec![]).await;
    sent(&peer, &stream);
    feed(&Applications(&hub), vec![WatchEvent::Apply(ignored(app("agent-1", "guestbook", "v1")))]).await;
    assert_eq!(sent(&peer, &stream), ["delete guestbook"]);
    assert!(hub.seen_apps.all().is_empty(), "an ignored Application is not indexed");
}

#[tokio::test]
async fn app_projects_go_to_the_agents_their_destinations_name() {
    let hub = hub();
    let (peer1, stream1) = connect(&hub, "agent-1", AgentMode::Managed);
    let (peer2, stream2) = connect(&hub, "agent-2", AgentMode::Managed);
    listed(&hub, vec![], vec![project("only-one", "agent-1"), project("everyone", "agent-*")]).await;
    let mut one = sent(&peer1, &stream1);
    one.sort();
    assert_eq!(one, ["create everyone", "create only-one"]);
    assert_eq!(sent(&peer2, &stream2), ["create everyone"]);

    feed(&Projects(&hub), vec![WatchEvent::Delete(project("everyone", "agent-*"))]).await;
    assert_eq!(sent(&peer1, &stream1), ["delete everyone"]);
    assert_eq!(sent(&peer2, &stream2), ["delete everyone"]);
}

#[tokio::test]
async fn a_managed_agent_connecting_gets_its_projects_and_is_asked_for_what_it_holds() {
    let hub = hub();
    listed(&hub, vec![app("agent-1", "guestbook", "v1")], vec![project("p", "agent-1")]).await;
    let (peer, stream) = connect(&hub, "agent-1", AgentMode::Managed);
    crate::sync::resync::on_connect(&hub, &peer).await.expect("the resync reads the caches, not the API server");
    assert_eq!(sent(&peer, &stream), ["spec-update p", "request-resource-resync resourceResync"]);
}

#[tokio::test]
async fn repositories_follow_their_project_and_a_connecting_agent_gets_them_after_the_project() {
    let hub = hub();
    listed(&hub, vec![], vec![project("p", "agent-1"), project("q", "agent-2")]).await;
    let (peer, stream) = connect(&hub, "agent-1", AgentMode::Managed);
    feed(&Repositories(&hub), vec![WatchEvent::Apply(repo_secret("r", "p")), WatchEvent::Apply(repo_secret("s", "q"))])
        .await;
    assert_eq!(sent(&peer, &stream), ["create r"], "only the repository of the agent's project");

    // The project moves to another agent: the repository leaves with it.
    feed(&Projects(&hub), vec![WatchEvent::Apply(project("p", "agent-2"))]).await;
    assert_eq!(sent(&peer, &stream), ["delete p", "delete r"]);
    feed(&Projects(&hub), vec![WatchEvent::Apply(project("p", "agent-1"))]).await;
    assert_eq!(sent(&peer, &stream), ["create p", "create r"], "the project first, then its repositories");

    // A reconnect: the project, its repository, then the resync request.
    crate::sync::resync::on_connect(&hub, &peer).await.expect("the resync reads the caches, not the API server");
    assert_eq!(sent(&peer, &stream), ["spec-update p", "spec-update r", "request-resource-resync resourceResync"]);
}

#[tokio::test]
async fn resync_sends_a_stale_spec_again_and_nothing_for_a_current_one() {
    let hub = hub();
    listed(&hub, vec![app("agent-1", "guestbook", "v2")], vec![]).await;
    let (peer, stream) = connect(&hub, "agent-1", AgentMode::Managed);
    let request = |name: &str, checksum: Option<Vec<u8>>| {
        let req = RequestUpdate {
            name: name.into(),
            namespace: "argocd".into(),
            uid: format!("uid-agent-1-{name}"),
            kind: protocol::checksum::RESYNC_KIND_APPLICATION.into(),
            checksum,
        };
        Event::request(EventType::RequestUpdate, Target::ResourceResync, "req").with_json(&req).expect("event")
    };
    // The agent holds an older spec of `guestbook`: the hub's is sent again.
    let ev = request("guestbook", Some(vec![0; 32]));
    let payload = ev.payload().expect("payload");
    crate::sync::resync::handle(&hub, &peer, &ev, payload).await.expect("handled from the cache");
    assert_eq!(sent(&peer, &stream), ["spec-update guestbook"]);
    // The agent holds the same spec: nothing to send.
    let current = hub.seen_apps.get(&("agent-1".into(), "guestbook".into())).expect("indexed");
    let ev = request("guestbook", crate::sync::resync::checksum_of(&current));
    let payload = ev.payload().expect("payload");
    crate::sync::resync::handle(&hub, &peer, &ev, payload).await.expect("handled");
    assert!(sent(&peer, &stream).is_empty());
}

#[tokio::test]
async fn an_autonomous_agents_resync_lists_its_hub_copies_live_not_from_the_cache() {
    let hub = hub();
    listed(&hub, vec![], vec![]).await;
    let (peer, stream) = connect(&hub, "agent-3", AgentMode::Autonomous);
    // A hub copy the cache has not shown yet would never be checked: the watch event of a copy
    // sends nothing to its agent. So the resync reads the hub, which this one cannot reach.
    assert!(crate::sync::resync::on_connect(&hub, &peer).await.is_err(), "read live, and the hub is unreachable");
    assert!(sent(&peer, &stream).is_empty(), "nothing sent from a failed start: it is retried");
}

#[tokio::test]
async fn a_resync_starts_only_once_the_event_being_applied_is_done() {
    let hub = hub();
    listed(&hub, vec![], vec![project("default", "agent-*")]).await;
    let (peer, stream) = connect(&hub, "agent-1", AgentMode::Managed);
    let _ = sent(&peer, &stream);
    // An event of the agent's previous stream is still being applied.
    let applying = peer.applying(Some("argocd/app-1")).await;
    let resync = tokio::spawn({
        let (hub, peer) = (Arc::new(hub), peer.clone());
        async move { crate::sync::resync::on_connect(&hub, &peer).await }
    });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!resync.is_finished(), "the resync waits for the event");
    assert!(peer.mailbox().take_ready(stream.attachment(), "test").expect("current").events.is_empty());
    drop(applying);
    resync.await.expect("joined").expect("started");
    assert_eq!(sent(&peer, &stream), ["spec-update default", "request-resource-resync resourceResync"]);
}

// === The periodic resync digest from the indexes by agent ===

/// `obj` at resourceVersion `rv` (a real watch never shows two contents under one version).
fn at(mut obj: DynamicObject, rv: u64) -> DynamicObject {
    obj.metadata.resource_version = Some(rv.to_string());
    obj
}

/// A repository secret of project `p` or `everyone`, its data as the API server keeps it
/// (base64), so its spec checksum changes with its project.
fn repo_data(name: &str, project: &str, rv: u64) -> DynamicObject {
    let encoded = match project {
        "p" => "cA==",
        "everyone" => "ZXZlcnlvbmU=",
        other => panic!("no fixture for project {other}"),
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}"), "resourceVersion": rv.to_string(),
                     "labels": {"argocd.argoproj.io/secret-type": "repository"}},
        "data": {"project": encoded, "url": "aHR0cHM6Ly9leGFtcGxlLmNvbS9yLmdpdA=="},
    }))
    .expect("a Secret")
}

/// An Application of the principal namespace routed by its destination (destination-based
/// mapping); `None`: `in-cluster`.
fn app_to(name: &str, destination: Option<&str>, rv: u64) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}"), "resourceVersion": rv.to_string()},
        "spec": {"project": "default", "source": {"repoURL": "https://example.com/r.git", "path": format!("v{rv}")},
                 "destination": {"name": destination.unwrap_or("in-cluster"), "namespace": "default"}},
    }))
    .expect("an Application")
}

/// The digests each agent gets from the indexes, after checking each against a full scan of
/// the hub's caches.
async fn digests(hub: &Hub, agents: &[&str]) -> Vec<Option<protocol::checksum::Checksum>> {
    let mut out = Vec::new();
    for agent in agents {
        let indexed = crate::sync::resync::managed_digest(hub, agent).await.expect("from the caches");
        assert_eq!(indexed, super::bench::full_scan_digest(hub, agent), "{agent}: the indexes and a full scan differ");
        out.push(indexed);
    }
    out
}

#[tokio::test]
async fn the_digest_by_agent_follows_every_change_of_what_the_agent_should_hold() {
    let hub = hub();
    let agents = ["agent-1", "agent-2", "agent-3"];
    listed(
        &hub,
        vec![app("agent-1", "a", "v1"), app("agent-1", "b", "v1"), app("agent-2", "c", "v1")],
        vec![project("p", "agent-1"), project("everyone", "agent-*")],
    )
    .await;
    feed(
        &Repositories(&hub),
        vec![WatchEvent::Apply(repo_data("r", "p", 1)), WatchEvent::Apply(repo_data("s", "everyone", 1))],
    )
    .await;
    let apps = Applications(&hub);
    let start = digests(&hub, &agents).await;
    assert!(start.iter().all(Option::is_some));

    // A spec change reaches only its agent's digest, though every entry was kept.
    feed(&apps, vec![WatchEvent::Apply(at(app("agent-1", "a", "v2"), 2))]).await;
    let changed = digests(&hub, &agents).await;
    assert_ne!(changed[0], start[0]);
    assert_eq!(changed[1..], start[1..]);

    // A new Application, one deleted, one left out by its label, one gone from a re-list.
    feed(&apps, vec![WatchEvent::Apply(at(app("agent-3", "d", "v1"), 3))]).await;
    let added = digests(&hub, &agents).await;
    assert_ne!(added[2], changed[2]);
    feed(&apps, vec![WatchEvent::Delete(at(app("agent-3", "d", "v1"), 3))]).await;
    assert_eq!(digests(&hub, &agents).await, changed, "back to what it was");
    feed(&apps, vec![WatchEvent::Apply(at(ignored(app("agent-1", "b", "v1")), 4))]).await;
    let left_out = digests(&hub, &agents).await;
    assert_ne!(left_out[0], changed[0]);
    feed(&apps, vec![WatchEvent::Init, WatchEvent::InitApply(at(app("agent-1", "a", "v2"), 2)), WatchEvent::InitDone])
        .await;
    let relisted = digests(&hub, &agents).await;
    assert_ne!(relisted[1], left_out[1], "c was not listed again: a tombstone");

    // A project moves from agent-1 to agent-2, its repository with it; then it goes.
    feed(&Projects(&hub), vec![WatchEvent::Apply(at(project("p", "agent-2"), 5))]).await;
    let moved = digests(&hub, &agents).await;
    assert_ne!(moved[0], relisted[0]);
    assert_ne!(moved[1], relisted[1]);
    assert_eq!(moved[2], relisted[2]);
    // The repository changes project, then is deleted.
    feed(&Repositories(&hub), vec![WatchEvent::Apply(repo_data("r", "everyone", 6))]).await;
    let repo_moved = digests(&hub, &agents).await;
    assert!(repo_moved.iter().zip(&moved).all(|(a, b)| a != b), "every agent gains r, agent-2 loses it from p");
    feed(&Repositories(&hub), vec![WatchEvent::Delete(repo_data("r", "everyone", 6))]).await;
    let deleted = digests(&hub, &agents).await;
    assert_eq!([deleted[0], deleted[2]], [moved[0], moved[2]], "as before they gained r");
    assert_ne!(deleted[1], moved[1], "agent-2 held r through p");
    feed(&Projects(&hub), vec![WatchEvent::Delete(at(project("p", "agent-2"), 5))]).await;
    digests(&hub, &agents).await;
    // A project left out by its label, then a re-list without the other one.
    feed(&Projects(&hub), vec![WatchEvent::Apply(at(ignored(project("everyone", "agent-*")), 7))]).await;
    digests(&hub, &agents).await;
    feed(&Projects(&hub), vec![WatchEvent::Init, WatchEvent::InitApply(project("q", "agent-3")), WatchEvent::InitDone])
        .await;
    let last = digests(&hub, &agents).await;
    assert_eq!(last[1], None, "agent-2 holds nothing any more");
    assert!(last[0].is_some() && last[2].is_some(), "agent-1 holds a, agent-3 q");
}

#[tokio::test]
async fn under_destination_mapping_an_application_moves_with_its_destination() {
    let mut config = PrincipalConfig::new("argocd");
    config.destination_based_mapping = true;
    let hub = Hub::offline(config);
    let agents = ["agent-1", "agent-2"];
    listed(&hub, vec![app_to("a", Some("agent-1"), 1), app_to("b", Some("agent-2"), 2)], vec![]).await;
    let start = digests(&hub, &agents).await;
    let apps = Applications(&hub);

    feed(&apps, vec![WatchEvent::Apply(app_to("a", Some("agent-2"), 3))]).await;
    let moved = digests(&hub, &agents).await;
    assert_eq!(moved[0], None, "agent-1 lost its only Application");
    assert_ne!(moved[1], start[1]);
    feed(&apps, vec![WatchEvent::Apply(app_to("a", None, 4))]).await;
    assert_eq!(digests(&hub, &agents).await[1], start[1], "in-cluster: no agent's");
    feed(&apps, vec![WatchEvent::Apply(app_to("a", Some("agent-1"), 5))]).await;
    let back = digests(&hub, &agents).await;
    assert_ne!(back[0], start[0], "a new version of a");
    feed(&apps, vec![WatchEvent::Delete(app_to("a", Some("agent-1"), 5))]).await;
    assert_eq!(digests(&hub, &agents).await, [None, start[1]]);
}

#[tokio::test]
async fn an_unchanged_object_is_not_hashed_again() {
    let hub = hub();
    listed(&hub, vec![app("agent-1", "a", "v1"), app("agent-1", "b", "v1")], vec![project("p", "agent-*")]).await;
    let ns = super::hub::AgentApps::InNamespace("agent-1");
    let first = hub.seen_apps.entries(ns, |_| true);
    let again = hub.seen_apps.entries(ns, |_| true);
    assert!(first.iter().zip(&again).all(|(a, b)| Arc::ptr_eq(a, b)), "kept beside their versions");
    // A re-list of the same versions keeps them; a new version of one is hashed again.
    feed(&Applications(&hub), vec![WatchEvent::InitApply(app("agent-1", "a", "v1"))]).await;
    feed(&Applications(&hub), vec![WatchEvent::Apply(at(app("agent-1", "b", "v2"), 2))]).await;
    let after = hub.seen_apps.entries(ns, |_| true);
    assert!(Arc::ptr_eq(&first[0], &after[0]));
    assert!(!Arc::ptr_eq(&first[1], &after[1]));
    assert_ne!(first[1], after[1]);

    // A project's copy: kept, shared by the agents that get the same copy, dropped when the
    // project changes.
    let (_, one) = hub.seen_projects.entries("agent-1", |_| true);
    let (_, two) = hub.seen_projects.entries("agent-2", |_| true);
    assert!(Arc::ptr_eq(&one[0], &hub.seen_projects.entries("agent-1", |_| true).1[0]));
    assert!(Arc::ptr_eq(&one[0], &two[0]), "the same copy: one entry");
    feed(&Projects(&hub), vec![WatchEvent::Apply(at(project("p", "agent-*"), 2))]).await;
    assert!(!Arc::ptr_eq(&one[0], &hub.seen_projects.entries("agent-1", |_| true).1[0]));
}

#[tokio::test]
async fn a_periodic_digest_equal_to_the_hubs_is_answered_with_nothing() {
    use protocol::payload::{DIGEST_SPEC, RequestSyncedResourceList};
    let mut config = PrincipalConfig::new("argocd");
    config.allowed_namespaces = vec!["agent-*".into()];
    config.resync_min_interval = std::time::Duration::ZERO;
    let hub = Hub::offline(config);
    listed(&hub, vec![app("agent-1", "a", "v1")], vec![project("p", "agent-1")]).await;
    let (peer, stream) = connect(&hub, "agent-1", AgentMode::Managed);
    let digest = |checksum: Option<Vec<u8>>| {
        let req = RequestSyncedResourceList { checksum, digest: Some(DIGEST_SPEC.to_owned()) };
        Event::request(EventType::RequestSyncedResourceList, Target::ResourceResync, "req")
            .with_json(&req)
            .expect("event")
    };
    let ours = super::bench::full_scan_digest(&hub, "agent-1").map(|d| d.to_vec());
    let ev = digest(ours);
    crate::sync::resync::handle(&hub, &peer, &ev, ev.payload().expect("payload")).await.expect("from the caches");
    assert!(sent(&peer, &stream).is_empty(), "in sync");

    let ev = digest(Some(vec![0; 32]));
    crate::sync::resync::handle(&hub, &peer, &ev, ev.payload().expect("payload")).await.expect("from the caches");
    let mut repair = sent(&peer, &stream);
    repair.sort();
    assert_eq!(
        repair,
        ["request-resource-resync resourceResync", "response-synced-resource a", "response-synced-resource p"]
    );
}
