//! The simulated node (opt-in, `Config::simulate_pods`): runs each Pod's container `command` +
//! `args` as a local process on this machine, so Pods reach Running, `kubectl logs` and
//! `kubectl exec` work. For tests and the quickstart only: it runs arbitrary commands from Pod
//! specs as the server's user, and never runs images, networking, probes or volumes.

/// The channel protocols of `pods/exec` (shared with the resource proxy's terminal).
pub use protocol::remotecommand as channel;
pub(crate) mod exec;
pub mod logs;
pub mod pty;
pub(crate) mod run;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::{Method, Request};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{ApiError, ApiResult};
use crate::object::{is_deleting, meta_str};
use crate::resource::{GroupResource, ResourceType};
use crate::store::{EventKind, Store};
use run::PodRuntime;

pub use run::NEEDS_COMMAND;

/// The pods running here by `namespace/name`, with their tasks.
type Running = HashMap<String, (Arc<PodRuntime>, JoinHandle<()>)>;

/// Shared by the watcher, the pod tasks and the request handlers.
#[derive(Debug)]
pub(crate) struct Inner {
    pub store: Arc<Store>,
    pub pods_type: Arc<ResourceType>,
    pods_dir: PathBuf,
    pods: Mutex<Running>,
    /// Tasks of pods being stopped, awaited at shutdown.
    stopping: Mutex<Vec<JoinHandle<()>>>,
    pub shutdown: watch::Receiver<bool>,
}

/// The simulated node of a server.
#[derive(Debug)]
pub struct Node {
    inner: Arc<Inner>,
    watcher: Mutex<Option<JoinHandle<()>>>,
}

fn pod_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn pods_gr() -> GroupResource {
    GroupResource::new("", "pods")
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Running> {
        self.pods.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The runtime of the pod `namespace/name` with this `uid`, if it runs here.
    pub fn pod(&self, namespace: &str, name: &str, uid: &str) -> Option<Arc<PodRuntime>> {
        self.lock().get(&pod_key(namespace, name)).filter(|(p, _)| p.uid == uid).map(|(p, _)| p.clone())
    }

    fn stop(&self, key: &str) {
        let removed = self.lock().remove(key);
        if let Some((pod, task)) = removed {
            pod.stop.send_replace(true);
            self.stopping.lock().unwrap_or_else(PoisonError::into_inner).push(task);
        }
    }

    /// Start, keep or stop the runtime for a stored Pod.
    fn reconcile(self: &Arc<Self>, pod: &Value) {
        let key = pod_key(meta_str(pod, "namespace"), meta_str(pod, "name"));
        let uid = meta_str(pod, "uid");
        let current = self.lock().get(&key).map(|(p, _)| p.uid.clone());
        if is_deleting(pod) {
            self.stop(&key);
            return;
        }
        match current {
            Some(u) if u == uid => return,
            Some(_) => self.stop(&key),
            None => {}
        }
        let rt = Arc::new(PodRuntime::new(pod, &self.pods_dir));
        tracing::info!(pod = %rt.name, namespace = %rt.namespace, "simulated node starts a pod");
        let task = tokio::spawn(run::run_pod(self.clone(), rt.clone()));
        self.lock().insert(key, (rt, task));
    }

    /// Every stored Pod runs; runtimes of Pods no longer stored stop.
    fn resync(self: &Arc<Self>) -> u64 {
        let (items, rv) = self.store.list(&pods_gr(), None, None);
        let mut keep = std::collections::HashSet::new();
        for (_, pod) in &items {
            keep.insert(pod_key(meta_str(pod, "namespace"), meta_str(pod, "name")));
            self.reconcile(pod);
        }
        let gone: Vec<String> = self.lock().keys().filter(|k| !keep.contains(*k)).cloned().collect();
        for k in gone {
            self.stop(&k);
        }
        rv
    }

    async fn watch(self: Arc<Self>) {
        let mut changes = self.store.subscribe();
        let mut shutdown = self.shutdown.clone();
        let mut pos = self.resync();
        loop {
            match self.store.events_since(pos, &pods_gr()) {
                Ok((events, latest)) => {
                    for ev in events {
                        match ev.kind {
                            EventKind::Deleted => {
                                let key = pod_key(&ev.namespace, meta_str(&ev.object, "name"));
                                let same =
                                    self.lock().get(&key).is_some_and(|(p, _)| p.uid == meta_str(&ev.object, "uid"));
                                if same {
                                    self.stop(&key);
                                }
                            }
                            EventKind::Added | EventKind::Modified => self.reconcile(&ev.object),
                        }
                        pos = ev.rv;
                    }
                    pos = pos.max(latest);
                }
                Err(_) => pos = self.resync(),
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { break },
                () = run::stopped(&mut shutdown) => break,
            }
        }
    }
}

impl Node {
    /// Start the node: it runs the Pods stored now and those created later, until `shutdown`.
    /// Working dirs are under `data_dir/node/pods`.
    #[must_use]
    pub fn start(store: Arc<Store>, data_dir: &Path, shutdown: watch::Receiver<bool>) -> Arc<Self> {
        let pods_type = crate::builtin::builtin_types()
            .into_iter()
            .find(|t| t.group.is_empty() && t.plural == "pods")
            .map(Arc::new)
            .unwrap_or_else(|| Arc::new(crate::builtin::builtin_types().remove(0)));
        let pods_dir = data_dir.join("node").join("pods");
        // Working dirs of a previous run are stale: their processes died with it.
        let _ = std::fs::remove_dir_all(&pods_dir);
        let inner = Arc::new(Inner {
            store,
            pods_type,
            pods_dir,
            pods: Mutex::default(),
            stopping: Mutex::default(),
            shutdown,
        });
        let watcher = tokio::spawn(inner.clone().watch());
        tracing::warn!(
            "simulated node on: Pods' commands run as local processes of this server's user (tests and quickstart only)"
        );
        Arc::new(Self { inner, watcher: Mutex::new(Some(watcher)) })
    }

    /// Stop every pod (SIGTERM, then SIGKILL after the grace) and wait for them.
    pub async fn shutdown(&self) {
        let watcher = self.watcher.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(w) = watcher {
            w.abort();
            let _ = w.await;
        }
        let keys: Vec<String> = self.inner.lock().keys().cloned().collect();
        for k in keys {
            self.inner.stop(&k);
        }
        let tasks = std::mem::take(&mut *self.inner.stopping.lock().unwrap_or_else(PoisonError::into_inner));
        let all = async {
            for t in tasks {
                let _ = t.await;
            }
        };
        if tokio::time::timeout(run::MAX_GRACE + Duration::from_secs(5), all).await.is_err() {
            tracing::warn!("simulated pods did not all stop in time");
        }
    }

    /// The pid of a container's current process, if it runs (for tests and diagnostics).
    #[must_use]
    pub fn container_pid(&self, namespace: &str, name: &str, container: &str) -> Option<u32> {
        let map = self.inner.lock();
        let (pod, _) = map.get(&pod_key(namespace, name))?;
        pod.container(container)?.lock().pid
    }
}

/// Discovery entries of the subresources the node serves (`pods/log`, `pods/exec`).
#[must_use]
pub fn discovery_entries() -> Vec<Value> {
    vec![
        json!({"name": "pods/exec", "singularName": "", "namespaced": true, "kind": "PodExecOptions", "verbs": ["create", "get"]}),
        json!({"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"]}),
    ]
}

/// Which container of `pod` a request means, as the kubelet's API picks it.
pub(crate) fn pick_container(pod: &Value, requested: Option<&str>) -> ApiResult<String> {
    let name = meta_str(pod, "name");
    let names: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    match requested {
        Some(c) if names.contains(&c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!("container {c} is not valid for pod {name}"))),
        None if names.len() == 1 => Ok(names[0].to_string()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            names.join(" ")
        ))),
    }
}

/// `GET pods/{name}/log` and `GET|POST pods/{name}/exec`. `node` is `None` when the server runs
/// no node: then both answer 400 saying so.
pub(crate) async fn serve(
    node: Option<&Arc<Node>>,
    namespace: &str,
    name: &str,
    sub: &str,
    req: Request<Body>,
) -> ApiResult<Response> {
    let Some(node) = node else {
        return Err(ApiError::bad_request(format!(
            "pods/{sub} is not available: this API server runs no node, so Pods never run (start it with \
             --simulate-pods to run each Pod's command as a local process, for tests and the quickstart only)"
        )));
    };
    let inner = &node.inner;
    let pod = inner.store.get(&pods_gr(), namespace, name).ok_or_else(|| ApiError::not_found("", "pods", name))?;
    let uid = meta_str(&pod, "uid").to_string();
    match (sub, req.method().clone()) {
        ("log", Method::GET) => {
            let opts = logs::parse_log_query(req.uri().query())?;
            let container = pick_container(&pod, opts.container.as_deref())?;
            let rt = inner.pod(namespace, name, &uid);
            let state = rt.as_ref().and_then(|p| p.container(&container).cloned());
            let waiting = || {
                let reason = pod["status"]["containerStatuses"]
                    .as_array()
                    .and_then(|cs| cs.iter().find(|c| c["name"] == container.as_str()))
                    .and_then(|c| c["state"]["waiting"]["reason"].as_str())
                    .unwrap_or("ContainerCreating")
                    .to_string();
                ApiError::bad_request(format!("container {container:?} in pod {name:?} is waiting to start: {reason}"))
            };
            let c = state.ok_or_else(waiting)?;
            let inst = {
                let s = c.lock();
                if opts.previous { s.previous.clone() } else { s.current.clone() }
            };
            let inst = match inst {
                Some(i) => i,
                None if opts.previous => {
                    return Err(ApiError::bad_request(format!(
                        "previous terminated container {container:?} in pod {name:?} not found"
                    )));
                }
                None => return Err(waiting()),
            };
            Ok(logs::respond(inst, &opts, inner.shutdown.clone()))
        }
        ("exec", Method::GET | Method::POST) => exec::serve(inner, &pod, req),
        (_, m) => Err(ApiError::method_not_allowed(&m, req.uri().path())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_choice_follows_kubernetes() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        assert_eq!(
            pick_container(&pod, None).err().map(|e| e.message),
            Some("a container name must be specified for pod p, choose one of: [a b]".to_string())
        );
        assert_eq!(pick_container(&pod, Some("b")).ok().as_deref(), Some("b"));
        assert_eq!(pick_container(&pod, Some("c")).err().map(|e| e.code), Some(400));
        let one = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}});
        assert_eq!(pick_container(&one, None).ok().as_deref(), Some("a"));
    }

    /// Processes of group `pgid` that are not zombies (a zombie's parent may be a slow init).
    fn live_group_members(pgid: u32) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
        dir.filter_map(Result::ok)
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter(|stat| {
                let fields: Vec<&str> =
                    stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
                fields.get(2) == Some(&pgid.to_string().as_str()) && fields.first() != Some(&"Z")
            })
            .collect()
    }

    async fn poll<T>(what: &str, mut check: impl AsyncFnMut() -> anyhow::Result<Option<T>>) -> anyhow::Result<T> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(v) = check().await? {
                return Ok(v);
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn restarts_keep_the_previous_log_and_shutdown_kills_every_child() -> anyhow::Result<()> {
        use k8s_openapi::api::core::v1::Pod;
        use kube::api::{Api, PostParams};
        let dir = tempfile::tempdir()?;
        let mut cfg = crate::Config::new(dir.path());
        cfg.simulate_pods = true;
        let server = crate::ApiServer::start(cfg).await?;
        let client = server.client().await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let mk = |name: &str, policy: &str, cmd: &str| -> anyhow::Result<Pod> {
            Ok(serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"restartPolicy": policy, "containers": [{"name": "main", "image": "x", "command": ["sh", "-c", cmd]}]},
            }))?)
        };
        let pp = PostParams::default();
        pods.create(&pp, &mk("crash", "OnFailure", "echo run; exit 2")?).await?;
        pods.create(&pp, &mk("done", "Never", "echo bye")?).await?;
        pods.create(&pp, &mk("sleeper", "Always", "sleep 3600")?).await?;
        let status = |name: &'static str| {
            let pods = pods.clone();
            async move { anyhow::Ok(serde_json::to_value(pods.get(name).await?)?["status"].clone()) }
        };
        poll("a restart of crash", async || {
            let s = status("crash").await?;
            let cs = &s["containerStatuses"][0];
            Ok((cs["restartCount"].as_u64() >= Some(1) && cs["lastState"]["terminated"]["exitCode"] == 2).then_some(()))
        })
        .await?;
        let req = http::Request::get("/api/v1/namespaces/default/pods/crash/log?previous=true").body(Vec::new())?;
        assert_eq!(client.request_text(req).await?, "run\n");
        let s = poll("done to succeed", async || {
            let s = status("done").await?;
            Ok((s["phase"] == "Succeeded").then_some(s))
        })
        .await?;
        assert_eq!(s["containerStatuses"][0]["state"]["terminated"]["reason"], "Completed");
        assert_eq!(s["conditions"].as_array().map(Vec::len), Some(5));
        let req = http::Request::get("/api/v1/namespaces/default/pods/done/log").body(Vec::new())?;
        assert_eq!(client.request_text(req).await?, "bye\n");
        let node = server.node().cloned().ok_or_else(|| anyhow::anyhow!("no node"))?;
        let pid = poll("sleeper to run", async || Ok(node.container_pid("default", "sleeper", "main"))).await?;
        let group = rustix::process::Pid::from_raw(i32::try_from(pid)?).ok_or_else(|| anyhow::anyhow!("pid 0"))?;
        assert!(rustix::process::test_kill_process_group(group).is_ok());
        server.shutdown().await;
        let left = live_group_members(pid);
        assert!(left.is_empty(), "process group {pid} survived shutdown: {left:?}");
        Ok(())
    }
}
