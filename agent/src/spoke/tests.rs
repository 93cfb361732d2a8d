//! The spoke's watch indexes alone: synthetic watch events through [`link::watch::drive`], and
//! what the agent would send the principal read from its mailbox. The spoke's API server is never
//! reached (every request of [`link::testing::offline_client`] fails).

use kube::api::DynamicObject;
use kube::runtime::watcher::Event as WatchEvent;
use link::watch::{Index, drive};
use protocol::argocd::annotations::{IGNORE_SYNC, NAMESPACE_REMAPPED, SOURCE_UID};
use protocol::{Event, Payload};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Spoke;
use super::projects::Projects;
use super::watch::Applications;
use crate::config::{AgentConfig, AgentMode};

fn spoke(mode: AgentMode) -> Spoke {
    Spoke::new(AgentConfig::new("http://127.0.0.1:1", "agent-1", mode), link::testing::offline_client("argocd"))
}

fn app(name: &str, path: &str, status: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}"), "resourceVersion": "1"},
        "spec": {"project": "default", "source": {"repoURL": "https://example.com/r.git", "path": path},
                 "destination": {"server": "https://kubernetes.default.svc", "namespace": "default"}},
        "status": {"sync": {"status": status}},
    }))
    .expect("an Application")
}

/// A principal-owned copy (managed mode): it carries the hub object's UID.
fn owned(mut obj: DynamicObject) -> DynamicObject {
    let uid = format!("hub-{}", obj.metadata.name.as_deref().unwrap_or_default());
    obj.metadata.annotations.get_or_insert_default().insert(SOURCE_UID.into(), uid);
    obj
}

fn label(mut obj: DynamicObject, key: &str) -> DynamicObject {
    obj.metadata.labels.get_or_insert_default().insert(key.into(), "true".into());
    obj
}

fn project(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}"), "resourceVersion": "1"},
        "spec": {"destinations": [{"namespace": "*", "server": "*"}]},
    }))
    .expect("an AppProject")
}

async fn feed<I: Index<Object = DynamicObject>>(index: &I, events: Vec<WatchEvent<DynamicObject>>) {
    drive(index, futures::stream::iter(events.into_iter().map(Ok)), &CancellationToken::new()).await;
}

fn listed(objs: Vec<DynamicObject>) -> Vec<WatchEvent<DynamicObject>> {
    std::iter::once(WatchEvent::Init)
        .chain(objs.into_iter().map(WatchEvent::InitApply))
        .chain([WatchEvent::InitDone])
        .collect()
}

/// What the agent would send since the last call, each ACKed at once: `"<type> <name>"`.
fn sent(spoke: &Spoke) -> Vec<String> {
    let stream = spoke.mailbox.attach();
    let ready = spoke.mailbox.take_ready(stream, "test").expect("attached");
    let out = ready
        .events
        .iter()
        .map(|ev| {
            spoke.mailbox.ack(&ev.resource_id, &ev.event_id);
            describe(ev)
        })
        .collect();
    spoke.mailbox.detach(stream);
    out
}

fn describe(ev: &Event) -> String {
    let ty = ev.event_type.as_str().rsplit('.').next().unwrap_or_default().to_owned();
    let name = match ev.payload() {
        Ok(Payload::Application(a)) => a.metadata.name.unwrap_or_default(),
        Ok(Payload::AppProject(p)) => p.metadata.name.unwrap_or_default(),
        _ => ev.target.as_str().to_owned(),
    };
    format!("{ty} {name}")
}

#[tokio::test]
async fn autonomous_changes_go_up_as_create_update_delete() {
    let spoke = spoke(AgentMode::Autonomous);
    let apps = Applications(&spoke);
    feed(&apps, listed(vec![app("guestbook", "v1", "Synced")])).await;
    assert_eq!(sent(&spoke), ["create guestbook"]);
    feed(&apps, vec![WatchEvent::Apply(app("guestbook", "v2", "Synced"))]).await;
    assert_eq!(sent(&spoke), ["spec-update guestbook"]);
    let mut same = app("guestbook", "v2", "Synced");
    same.metadata.resource_version = Some("2".into());
    feed(&apps, vec![WatchEvent::Apply(same)]).await;
    assert!(sent(&spoke).is_empty(), "only a new resourceVersion: nothing the principal mirrors changed");
    feed(&apps, vec![WatchEvent::Delete(app("guestbook", "v2", "Synced"))]).await;
    assert_eq!(sent(&spoke), ["delete guestbook"]);
}

#[tokio::test]
async fn autonomous_relist_tombstones_and_ignore_sync_are_deletions_for_the_principal() {
    let spoke = spoke(AgentMode::Autonomous);
    let apps = Applications(&spoke);
    feed(&apps, listed(vec![app("kept", "v1", "Synced"), app("gone", "v1", "Synced"), app("hidden", "v1", "Synced")]))
        .await;
    assert_eq!(sent(&spoke).len(), 3);
    feed(&apps, vec![WatchEvent::Apply(label(app("hidden", "v1", "Synced"), IGNORE_SYNC))]).await;
    assert_eq!(sent(&spoke), ["delete hidden"]);
    feed(&apps, listed(vec![app("kept", "v1", "Synced")])).await;
    assert_eq!(sent(&spoke), ["delete gone"]);
}

#[tokio::test]
async fn managed_status_changes_of_principal_owned_applications_are_reported() {
    let spoke = spoke(AgentMode::Managed);
    let apps = Applications(&spoke);
    feed(&apps, listed(vec![owned(app("guestbook", "v1", "OutOfSync")), app("local", "v1", "Synced")])).await;
    assert_eq!(sent(&spoke), ["status-update guestbook"], "an Application not from the principal is not ours");
    feed(&apps, vec![WatchEvent::Apply(owned(app("guestbook", "v1", "OutOfSync")))]).await;
    assert!(sent(&spoke).is_empty(), "the same status is not reported twice");
    feed(&apps, vec![WatchEvent::Apply(owned(app("guestbook", "v1", "Synced")))]).await;
    assert_eq!(sent(&spoke), ["status-update guestbook"]);
}

#[tokio::test]
async fn managed_deletion_the_principal_asked_for_is_confirmed_to_it() {
    let spoke = spoke(AgentMode::Managed);
    let apps = Applications(&spoke);
    feed(&apps, listed(vec![owned(app("guestbook", "v1", "Synced"))])).await;
    sent(&spoke);
    spoke.managed.expect_delete(("argocd".into(), "guestbook".into()));
    feed(&apps, vec![WatchEvent::Delete(owned(app("guestbook", "v1", "Synced")))]).await;
    assert_eq!(sent(&spoke), ["delete guestbook"]);
    assert!(spoke.managed.sources().is_empty(), "no longer the principal's copy to restore");
}

#[tokio::test]
async fn autonomous_app_projects_go_up_and_managed_ones_only_when_principal_owned() {
    let autonomous = spoke(AgentMode::Autonomous);
    feed(&Projects(&autonomous), listed(vec![project("team")])).await;
    assert_eq!(sent(&autonomous), ["create team"]);
    feed(&Projects(&autonomous), listed(vec![])).await;
    assert_eq!(sent(&autonomous), ["delete team"], "a re-list that no longer returns it");

    let managed = spoke(AgentMode::Managed);
    let mut theirs = project("from-hub");
    theirs.metadata.annotations.get_or_insert_default().insert(SOURCE_UID.into(), "hub-uid".into());
    feed(&Projects(&managed), listed(vec![theirs, project("local")])).await;
    assert!(sent(&managed).is_empty(), "managed agents send no AppProjects up");
    assert_eq!(managed.managed_projects.keys(), ["from-hub"]);
}

/// A managed agent under destination-based mapping in namespace `argocd-agent`, whose principal
/// is in `argocd`.
fn remapping_spoke() -> Spoke {
    let mut config = AgentConfig::new("http://127.0.0.1:1", "agent-1", AgentMode::Managed);
    config.namespace = "argocd-agent".into();
    config.destination_based_mapping = true;
    config.allowed_namespaces = vec!["team-*".into()];
    config.principal_namespace = Some("argocd".into());
    Spoke::new(config, link::testing::offline_client("argocd-agent"))
}

/// What the agent would send since the last call: `"<type> <namespace>/<name> <remapped mark>"`.
fn sent_apps(spoke: &Spoke) -> Vec<String> {
    let stream = spoke.mailbox.attach();
    let ready = spoke.mailbox.take_ready(stream, "test").expect("attached");
    let out = ready
        .events
        .iter()
        .map(|ev| {
            spoke.mailbox.ack(&ev.resource_id, &ev.event_id);
            let ty = ev.event_type.as_str().rsplit('.').next().unwrap_or_default().to_owned();
            let Ok(Payload::Application(a)) = ev.payload() else { return format!("{ty} ?") };
            let mark = a.metadata.annotation(NAMESPACE_REMAPPED).unwrap_or("-").to_owned();
            let (ns, name) = super::app_key(&a.metadata);
            assert_eq!(ev.subject.as_deref(), Some(format!("{ns}/{name}").as_str()), "the event names its payload");
            format!("{ty} {ns}/{name} {mark}")
        })
        .collect();
    spoke.mailbox.detach(stream);
    out
}

fn in_namespace(mut obj: DynamicObject, ns: &str) -> DynamicObject {
    obj.metadata.namespace = Some(ns.into());
    obj
}

fn remapped(mut obj: DynamicObject) -> DynamicObject {
    obj.metadata.annotations.get_or_insert_default().insert(NAMESPACE_REMAPPED.into(), "true".into());
    obj
}

#[tokio::test]
async fn applications_of_the_principal_namespace_are_kept_in_the_agent_namespace() {
    let spoke = remapping_spoke();
    let at = |ns: &str| spoke.app_namespace(Some(ns)).map(|p| (p.namespace.to_owned(), p.remapped)).ok();
    assert_eq!(at("argocd"), Some(("argocd-agent".into(), true)), "the principal's namespace: moved");
    assert_eq!(at("argocd-agent"), Some(("argocd-agent".into(), false)), "the agent's own: kept");
    assert_eq!(at("team-a"), Some(("team-a".into(), false)), "an allowed one: kept");
    assert_eq!(at("other"), None, "neither: refused");
    assert_eq!(spoke.app_namespace(Some("")).map(|p| p.namespace).ok(), Some("argocd-agent"));

    let meta = |ns: &str, mark: bool| {
        let mut m = protocol::argocd::ObjectMeta { namespace: Some(ns.into()), ..Default::default() };
        if mark {
            m.set_annotation(NAMESPACE_REMAPPED, "true");
        }
        m
    };
    assert_eq!(spoke.hub_namespace(&meta("argocd-agent", true)), "argocd", "moved: the principal's namespace");
    assert_eq!(spoke.hub_namespace(&meta("argocd-agent", false)), "argocd-agent");
    assert_eq!(spoke.hub_namespace(&meta("team-a", true)), "team-a", "only the agent's namespace holds moved ones");
    assert_eq!(spoke.hub_meta(&meta("argocd-agent", true)).annotation(NAMESPACE_REMAPPED), Some("true"));

    // Two hub Applications of one name, in the principal's namespace and the agent's, share a
    // place here: each copy holds it against the other.
    let mut owned_meta = meta("argocd-agent", true);
    owned_meta.set_annotation(SOURCE_UID, "hub-1");
    let moved = spoke.app_namespace(Some("argocd")).expect("placed");
    let own = spoke.app_namespace(Some("argocd-agent")).expect("placed");
    assert!(!spoke.holds_other(&owned_meta, moved));
    assert!(spoke.holds_other(&owned_meta, own));
    owned_meta.remove_annotation(NAMESPACE_REMAPPED);
    assert!(spoke.holds_other(&owned_meta, moved));
    assert!(!spoke.holds_other(&owned_meta, own));
    owned_meta.remove_annotation(SOURCE_UID);
    assert!(!spoke.holds_other(&owned_meta, moved), "one made here is adopted or refused by the adoption policy");
}

#[tokio::test]
async fn nothing_is_remapped_when_the_namespaces_agree_or_the_principal_namespace_is_unknown() {
    let mut config = AgentConfig::new("http://127.0.0.1:1", "agent-1", AgentMode::Managed);
    config.destination_based_mapping = true;
    config.principal_namespace = Some("argocd".into());
    let same = Spoke::new(config.clone(), link::testing::offline_client("argocd"));
    let placed = same.app_namespace(Some("argocd")).expect("its own namespace");
    assert_eq!((placed.namespace, placed.remapped), ("argocd", false));

    config.namespace = "argocd-agent".into();
    config.principal_namespace = None;
    let unknown = Spoke::new(config.clone(), link::testing::offline_client("argocd"));
    assert!(unknown.app_namespace(Some("argocd")).is_err(), "an unknown principal namespace is not allowed here");
    config.allowed_namespaces = vec!["argocd".into()];
    let allowed = Spoke::new(config.clone(), link::testing::offline_client("argocd"));
    let placed = allowed.app_namespace(Some("argocd")).expect("allowed");
    assert_eq!((placed.namespace, placed.remapped), ("argocd", false), "kept where it is named");

    config.destination_based_mapping = false;
    config.principal_namespace = Some("argocd".into());
    let by_namespace = Spoke::new(config, link::testing::offline_client("argocd"));
    let placed = by_namespace.app_namespace(Some("agent-1")).expect("namespace mapping");
    assert_eq!((placed.namespace, placed.remapped), ("argocd-agent", false));
}

#[tokio::test]
async fn status_and_deletions_of_moved_applications_name_them_as_the_principal_does() {
    let spoke = remapping_spoke();
    let apps = Applications(&spoke);
    let moved = remapped(owned(in_namespace(app("guestbook", "v1", "OutOfSync"), "argocd-agent")));
    let own = owned(in_namespace(app("web", "v1", "OutOfSync"), "argocd-agent"));
    let team = owned(in_namespace(app("api", "v1", "OutOfSync"), "team-a"));
    feed(&apps, listed(vec![moved.clone(), own, team])).await;
    let mut reported = sent_apps(&spoke);
    reported.sort();
    assert_eq!(
        reported,
        ["status-update argocd-agent/web -", "status-update argocd/guestbook true", "status-update team-a/api -"],
        "in the principal's namespace, the mark kept for a principal that strips it"
    );
    assert_eq!(
        spoke.managed.keys().into_iter().filter(|(_, n)| n == "guestbook").collect::<Vec<_>>(),
        [("argocd-agent".to_owned(), "guestbook".to_owned())],
        "the agent's own caches keep its namespace"
    );
    spoke.managed.expect_delete(("argocd-agent".into(), "guestbook".into()));
    feed(&apps, vec![WatchEvent::Delete(moved)]).await;
    assert_eq!(sent_apps(&spoke), ["delete argocd/guestbook true"]);
}
