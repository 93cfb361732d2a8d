//! Durability of `argocd-agent apiserver` as a process: acknowledged writes survive SIGKILL, and a
//! data dir cannot be opened by two servers at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use anyhow::{Context as _, anyhow, ensure};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tests::fixtures::{application, applications, dynamic, namespace};
use tests::{ApiServerProcess, ChildProcess, DEFAULT_TIMEOUT};
use tokio::sync::Notify;

const NS: &str = "durable";
/// The server is killed once this many creates were acknowledged; the writers keep going until
/// then, so the kill always lands while writes are in flight.
const KILL_AFTER: usize = 300;
/// Upper bound on creates attempted (never reached: the kill comes first).
const MAX_WRITES: usize = 10_000;
/// Concurrent writer tasks.
const WRITERS: usize = 6;

/// What a successful create told us.
#[derive(Debug, Clone)]
struct Acked {
    uid: String,
    rv: u64,
    spec: Value,
}

fn rv_of(obj: &DynamicObject) -> anyhow::Result<u64> {
    let rv = obj.metadata.resource_version.as_deref().unwrap_or_default();
    rv.parse().with_context(|| format!("resourceVersion {rv:?} of {:?} is not a number", obj.metadata.name))
}

fn spec_of(obj: &DynamicObject) -> Value {
    obj.data.get("spec").cloned().unwrap_or(Value::Null)
}

fn app_name(i: usize) -> String {
    format!("app-{i:03}")
}

fn app_object(i: usize) -> anyhow::Result<DynamicObject> {
    dynamic(application(&app_name(i), NS, &format!("rev-{i}")))
}

async fn create_namespace(client: kube::Client, name: &str) -> anyhow::Result<u64> {
    let ns: Namespace = serde_json::from_value(namespace(name))?;
    let created = Api::<Namespace>::all(client).create(&PostParams::default(), &ns).await?;
    let rv = created.metadata.resource_version.unwrap_or_default();
    rv.parse().with_context(|| format!("namespace resourceVersion {rv:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill() -> anyhow::Result<()> {
    let mut server = ApiServerProcess::start().await?;
    let ns_rv = create_namespace(server.client(), NS).await?;

    let acked: Arc<std::sync::Mutex<BTreeMap<String, Acked>>> = Arc::default();
    let count = Arc::new(AtomicUsize::new(0));
    let killing = Arc::new(AtomicBool::new(false));
    let kill_now = Arc::new(Notify::new());
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let api = applications(server.client(), NS);
        let (acked, count, killing, kill_now) = (acked.clone(), count.clone(), killing.clone(), kill_now.clone());
        writers.spawn(async move {
            let mut failed_after_kill = 0usize;
            for i in (w..MAX_WRITES).step_by(WRITERS) {
                if killing.load(Ordering::SeqCst) {
                    break;
                }
                let sent = app_object(i)?;
                match api.create(&PostParams::default(), &sent).await {
                    Ok(created) => {
                        anyhow::ensure!(
                            spec_of(&created) == spec_of(&sent),
                            "create of {} returned another spec",
                            app_name(i)
                        );
                        let uid = created.metadata.uid.clone().unwrap_or_default();
                        let entry = Acked { uid, rv: rv_of(&created)?, spec: spec_of(&created) };
                        acked.lock().map_err(|_| anyhow!("poisoned"))?.insert(app_name(i), entry);
                        if count.fetch_add(1, Ordering::SeqCst) + 1 == KILL_AFTER {
                            kill_now.notify_one();
                        }
                    }
                    // In flight while the server died: may or may not have been committed.
                    Err(_) if killing.load(Ordering::SeqCst) => failed_after_kill += 1,
                    Err(e) => return Err(anyhow!("create {} failed before the kill: {e}", app_name(i))),
                }
            }
            Ok(failed_after_kill)
        });
    }

    let triggered = tokio::time::timeout(DEFAULT_TIMEOUT, kill_now.notified()).await;
    killing.store(true, Ordering::SeqCst);
    let status = server.sigkill()?;
    let mut failed_after_kill = 0;
    while let Some(joined) = writers.join_next().await {
        failed_after_kill += joined??;
    }
    triggered.map_err(|_| anyhow!("fewer than {KILL_AFTER} creates acknowledged within {DEFAULT_TIMEOUT:?}"))?;
    let acked = acked.lock().map_err(|_| anyhow!("poisoned"))?.clone();
    eprintln!("killed ({status}) with {} acknowledged, {failed_after_kill} in flight failed", acked.len());
    ensure!(acked.len() >= KILL_AFTER, "only {} acknowledged", acked.len());
    ensure!(acked.len() < MAX_WRITES, "all {MAX_WRITES} writes finished before the kill");
    let max_rv_before = acked.values().map(|a| a.rv).chain([ns_rv]).max().unwrap_or_default();

    server.start_again().await.context("restart on the same data dir after SIGKILL")?;
    let api = applications(server.client(), NS);
    let list = api.list(&ListParams::default()).await?;
    let present: BTreeMap<String, DynamicObject> =
        list.items.into_iter().map(|o| (o.metadata.name.clone().unwrap_or_default(), o)).collect();

    // Every acknowledged create is there, exactly as acknowledged.
    for (name, want) in &acked {
        let got = present.get(name).with_context(|| format!("acknowledged {name} lost after SIGKILL"))?;
        assert_eq!(spec_of(got), want.spec, "spec of {name} changed across the crash");
        assert_eq!(got.metadata.uid.as_deref(), Some(want.uid.as_str()), "uid of {name}");
        assert_eq!(rv_of(got)?, want.rv, "resourceVersion of {name}");
    }
    // Anything else present was in flight at the kill; it must be whole (no torn writes).
    for (name, got) in &present {
        let i: usize = name.trim_start_matches("app-").parse().with_context(|| format!("unexpected object {name}"))?;
        assert_eq!(spec_of(got), spec_of(&app_object(i)?), "unacknowledged {name} is not what was sent");
    }
    eprintln!(
        "after restart: {} present ({} were in flight and committed)",
        present.len(),
        present.len() - acked.len()
    );
    let max_rv_present = present.values().map(rv_of).collect::<anyhow::Result<Vec<_>>>()?.into_iter().max();
    let max_rv_seen = max_rv_before.max(max_rv_present.unwrap_or_default());

    // The server is writable, and never reuses a resourceVersion.
    let after = api.create(&PostParams::default(), &dynamic(application("after-restart", NS, "HEAD"))?).await?;
    ensure!(
        rv_of(&after)? > max_rv_seen,
        "new write got resourceVersion {} <= {max_rv_seen} seen before",
        rv_of(&after)?
    );
    let (first, _) = acked.iter().next().context("nothing acknowledged")?;
    let patch = json!({"spec": {"source": {"targetRevision": "patched-after-crash"}}});
    let patched = api.patch(first, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    ensure!(rv_of(&patched)? > rv_of(&after)?, "patch resourceVersion must grow");
    assert_eq!(patched.metadata.generation, Some(2));
    api.delete(first, &Default::default()).await?;
    server.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_server_on_a_data_dir_in_use_fails_and_the_first_keeps_working() -> anyhow::Result<()> {
    let mut server = ApiServerProcess::start().await?;
    create_namespace(server.client(), NS).await?;
    let api = applications(server.client(), NS);
    api.create(&PostParams::default(), &app_object(1)?).await?;

    let second_kubeconfig = server.work_dir().join("second-kubeconfig");
    let mut second =
        ChildProcess::spawn("apiserver-second", ApiServerProcess::command(server.data_dir(), &second_kubeconfig)?)?;
    let status = second.wait_exit_async(DEFAULT_TIMEOUT).await.context("the second server must exit by itself")?;
    let stderr = second.stderr();
    ensure!(!status.success(), "second server on a data dir in use exited {status}\n{}", second.log_tail(20));
    let data_dir = server.data_dir().display().to_string();
    ensure!(
        stderr.to_lowercase().contains("lock") && stderr.contains(&data_dir),
        "the error must say the data dir is locked and name it: {stderr}"
    );
    ensure!(!second_kubeconfig.exists(), "a server that failed must not write a kubeconfig");
    ensure!(!second.stdout().contains("listening"), "the second server must not claim to listen: {}", second.stdout());

    // The first one is unaffected: reads and writes work, from a new connection too.
    server.process_mut().ensure_running()?;
    let fresh = applications(server.new_client().await?, NS);
    let got = fresh.get(&app_name(1)).await?;
    assert_eq!(spec_of(&got), spec_of(&app_object(1)?));
    fresh.create(&PostParams::default(), &app_object(2)?).await?;
    let kubectl = server.kubectl()?;
    let names = kubectl.ok(["get", "applications", "-n", NS, "-o", "name"]).await?;
    assert_eq!(
        names.lines().collect::<Vec<_>>(),
        ["application.argoproj.io/app-001", "application.argoproj.io/app-002"]
    );

    // Once the first stops cleanly, the data dir is free again and holds both writes.
    server.restart().await?;
    let names = kubectl.ok(["get", "applications", "-n", NS, "-o", "name"]).await?;
    assert_eq!(names.lines().count(), 2, "{names}");
    server.stop().await
}
