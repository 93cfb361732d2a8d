//! Running a Pod: each container's `command` + `args` as a local process group, restarts by
//! `restartPolicy`, and the Pod's status written back through the store.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use super::Inner;
use super::logs::{LineSplitter, LogInstance};
use crate::object::{meta_str, now_rfc3339};
use crate::prepare::{self, Part, Target};
use crate::store::Change;

/// First wait before a restart; doubled per restart up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait before a restart.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Longest grace between SIGTERM and SIGKILL (the Pod's `terminationGracePeriodSeconds`, capped).
pub(crate) const MAX_GRACE: Duration = Duration::from_secs(3);
/// How long output still in the pipes is read after a process group is gone.
const DRAIN: Duration = Duration::from_secs(2);
/// The waiting reason of a container that has no `command`.
pub const NEEDS_COMMAND: &str = "SimulatedNodeNeedsCommand";

/// `restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

/// How a container instance ended.
#[derive(Debug, Clone)]
pub(crate) struct Terminated {
    pub exit_code: i32,
    pub reason: String,
    pub message: Option<String>,
    pub started_at: String,
    pub finished_at: String,
}

impl Terminated {
    fn to_json(&self) -> Value {
        let mut t = json!({
            "exitCode": self.exit_code, "reason": self.reason,
            "startedAt": self.started_at, "finishedAt": self.finished_at,
        });
        if let Some(m) = &self.message {
            t["message"] = json!(m);
        }
        t
    }
}

/// A container's state, as its status shows it.
#[derive(Debug, Clone)]
pub(crate) enum State {
    Waiting { reason: String, message: Option<String> },
    Running { started_at: String },
    Terminated(Terminated),
}

/// What the node knows of one container.
#[derive(Debug)]
pub(crate) struct ContainerState {
    pub current: Option<Arc<LogInstance>>,
    pub previous: Option<Arc<LogInstance>>,
    pub restart_count: u32,
    pub state: State,
    pub last: Option<Terminated>,
    pub pid: Option<u32>,
    pub started_once: bool,
}

/// One container of a running Pod.
#[derive(Debug)]
pub(crate) struct Container {
    pub name: String,
    pub image: String,
    pub argv: Option<Vec<String>>,
    pub env: Vec<(String, String)>,
    pub state: Mutex<ContainerState>,
}

impl Container {
    pub fn lock(&self) -> MutexGuard<'_, ContainerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One Pod the node runs.
#[derive(Debug)]
pub(crate) struct PodRuntime {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub workdir: PathBuf,
    pub containers: Vec<Arc<Container>>,
    pub restart_policy: RestartPolicy,
    pub grace: Duration,
    pub start_time: String,
    pub stop: watch::Sender<bool>,
    dirty: Notify,
}

fn str_list(v: &Value) -> Option<Vec<String>> {
    v.as_array().map(|a| a.iter().map(|s| s.as_str().unwrap_or_default().to_string()).collect())
}

impl PodRuntime {
    /// The runtime for a stored Pod (nothing started yet).
    pub fn new(pod: &Value, pods_dir: &Path) -> Self {
        let uid = meta_str(pod, "uid").to_string();
        let spec = &pod["spec"];
        let containers = spec["containers"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|c| {
                let argv = str_list(&c["command"]).map(|mut cmd| {
                    cmd.extend(str_list(&c["args"]).unwrap_or_default());
                    cmd
                });
                let env = c["env"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|e| {
                        let name = e["name"].as_str()?;
                        (!name.is_empty() && !name.contains('=') && !name.contains('\0'))
                            .then(|| (name.to_string(), e["value"].as_str().unwrap_or_default().to_string()))
                    })
                    .collect();
                Arc::new(Container {
                    name: c["name"].as_str().unwrap_or_default().to_string(),
                    image: c["image"].as_str().unwrap_or_default().to_string(),
                    argv,
                    env,
                    state: Mutex::new(ContainerState {
                        current: None,
                        previous: None,
                        restart_count: 0,
                        state: State::Waiting { reason: "ContainerCreating".into(), message: None },
                        last: None,
                        pid: None,
                        started_once: false,
                    }),
                })
            })
            .collect();
        let restart_policy = match spec["restartPolicy"].as_str() {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            _ => RestartPolicy::Always,
        };
        let grace =
            spec["terminationGracePeriodSeconds"].as_u64().map_or(MAX_GRACE, |s| Duration::from_secs(s).min(MAX_GRACE));
        Self {
            namespace: meta_str(pod, "namespace").to_string(),
            name: meta_str(pod, "name").to_string(),
            // The uid is server-generated; anything else is not a path here.
            workdir: pods_dir.join(if !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                uid.as_str()
            } else {
                "invalid-uid"
            }),
            uid,
            containers,
            restart_policy,
            grace,
            start_time: now_rfc3339(),
            stop: watch::channel(false).0,
            dirty: Notify::new(),
        }
    }

    /// A container by name.
    pub fn container(&self, name: &str) -> Option<&Arc<Container>> {
        self.containers.iter().find(|c| c.name == name)
    }

    fn mark_dirty(&self) {
        self.dirty.notify_one();
    }

    /// Whether the pod's processes are being (or have been) stopped.
    pub fn stopping(&self) -> bool {
        *self.stop.borrow()
    }
}

fn phase_of(states: &[State], all_started: bool) -> &'static str {
    if !states.is_empty() && states.iter().all(|s| matches!(s, State::Terminated(_))) {
        if states.iter().all(|s| matches!(s, State::Terminated(t) if t.exit_code == 0)) {
            "Succeeded"
        } else {
            "Failed"
        }
    } else if all_started && !states.is_empty() {
        "Running"
    } else {
        "Pending"
    }
}

/// The command line of a process in a Pod: argv as given (no shell), the container's literal
/// `env` over a minimal environment (the server's own environment is not passed on).
pub(crate) fn command(
    argv: &[String],
    env: &[(String, String)],
    workdir: &Path,
    hostname: &str,
) -> tokio::process::Command {
    let (program, args) = argv.split_first().map_or(("", &[][..]), |(p, a)| (p.as_str(), a));
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(workdir)
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH")
                .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()),
        )
        .env("HOSTNAME", hostname)
        .env("HOME", workdir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.kill_on_drop(true);
    cmd
}

/// Signal a process group, ignoring one that is already gone.
pub(crate) fn signal_group(pid: u32, sig: rustix::process::Signal) {
    if let Some(p) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process_group(p, sig);
    }
}

/// SIGTERM the group, SIGKILL it after `grace`, reap the leader.
pub(crate) async fn terminate(
    child: &mut tokio::process::Child,
    pid: u32,
    grace: Duration,
) -> std::process::ExitStatus {
    signal_group(pid, rustix::process::Signal::TERM);
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(Ok(s)) => Some(s),
        _ => None,
    };
    signal_group(pid, rustix::process::Signal::KILL);
    match status {
        Some(s) => s,
        None => child.wait().await.unwrap_or_else(|_| std::os::unix::process::ExitStatusExt::from_raw(9)),
    }
}

/// The exit code Kubernetes reports: the code, or 128 + the signal.
pub(crate) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

async fn pump(mut from: impl AsyncRead + Unpin, to: Arc<LogInstance>) {
    let mut split = LineSplitter::default();
    let mut buf = vec![0u8; 8192];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => split.feed(&buf[..n], &to),
        }
    }
    split.finish(&to);
}

pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

async fn drain(mut readers: JoinSet<()>) {
    let all = async { while readers.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN, all).await.is_err() {
        readers.abort_all();
    }
}

async fn run_container(pod: Arc<PodRuntime>, c: Arc<Container>) {
    let mut stop = pod.stop.subscribe();
    let Some(argv) = c.argv.clone().filter(|a| !a.is_empty()) else {
        c.lock().state = State::Waiting {
            reason: NEEDS_COMMAND.into(),
            message: Some(format!(
                "container {:?} has no command: the simulated node runs a container's command and args as a local \
                 process and does not run images (image {:?}); give the container a command",
                c.name, c.image
            )),
        };
        pod.mark_dirty();
        return;
    };
    let mut backoff = FIRST_BACKOFF;
    loop {
        if *stop.borrow() {
            return;
        }
        let inst = Arc::new(LogInstance::default());
        let started_at = now_rfc3339();
        let ran_since = tokio::time::Instant::now();
        {
            let mut s = c.lock();
            s.previous = s.current.replace(inst.clone());
        }
        let mut cmd = command(&argv, &c.env, &pod.workdir, &pod.name);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        let terminated = match cmd.spawn() {
            Err(e) => {
                inst.push(Utc::now(), Bytes::from(format!("cannot start {:?}: {e}\n", argv[0])));
                inst.end();
                Terminated {
                    exit_code: 128,
                    reason: "StartError".into(),
                    message: Some(format!("cannot start {:?}: {e}", argv[0])),
                    started_at: started_at.clone(),
                    finished_at: now_rfc3339(),
                }
            }
            Ok(mut child) => {
                let pid = child.id().unwrap_or_default();
                let mut readers = JoinSet::new();
                if let Some(out) = child.stdout.take() {
                    readers.spawn(pump(out, inst.clone()));
                }
                if let Some(err) = child.stderr.take() {
                    readers.spawn(pump(err, inst.clone()));
                }
                {
                    let mut s = c.lock();
                    s.state = State::Running { started_at: started_at.clone() };
                    s.pid = Some(pid);
                    s.started_once = true;
                }
                pod.mark_dirty();
                tracing::debug!(pod = %pod.name, container = %c.name, pid, "simulated container started");
                let exited = tokio::select! {
                    s = child.wait() => s.ok(),
                    () = stopped(&mut stop) => None,
                };
                let Some(status) = exited else {
                    terminate(&mut child, pid, pod.grace).await;
                    drain(readers).await;
                    inst.end();
                    c.lock().pid = None;
                    return;
                };
                // Whatever the process left behind in its group goes with it.
                signal_group(pid, rustix::process::Signal::KILL);
                drain(readers).await;
                inst.end();
                let code = exit_code(status);
                Terminated {
                    exit_code: code,
                    reason: if code == 0 { "Completed" } else { "Error" }.into(),
                    message: None,
                    started_at: started_at.clone(),
                    finished_at: now_rfc3339(),
                }
            }
        };
        let restart = match pod.restart_policy {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => terminated.exit_code != 0,
            RestartPolicy::Never => false,
        };
        if ran_since.elapsed() > Duration::from_secs(10) {
            backoff = FIRST_BACKOFF;
        }
        {
            let mut s = c.lock();
            s.pid = None;
            s.started_once = true;
            if restart {
                s.state = State::Waiting {
                    reason: "CrashLoopBackOff".into(),
                    message: Some(format!("back-off {:?} restarting container {:?}", backoff, c.name)),
                };
                s.last = Some(terminated);
            } else {
                s.state = State::Terminated(terminated);
            }
        }
        pod.mark_dirty();
        if !restart {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stopped(&mut stop) => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
        c.lock().restart_count += 1;
    }
}

/// Run a Pod until it is stopped: containers, restarts, status writes; then its workdir goes.
pub(crate) async fn run_pod(inner: Arc<Inner>, pod: Arc<PodRuntime>) {
    let mut stop = pod.stop.subscribe();
    if let Err(e) = std::fs::create_dir_all(&pod.workdir) {
        tracing::warn!(pod = %pod.name, dir = %pod.workdir.display(), error = %e, "cannot create the pod's working dir");
    }
    write_status(&inner, &pod).await;
    let mut containers = JoinSet::new();
    for c in &pod.containers {
        containers.spawn(run_container(pod.clone(), c.clone()));
    }
    loop {
        tokio::select! {
            () = pod.dirty.notified() => write_status(&inner, &pod).await,
            Some(_) = containers.join_next(), if !containers.is_empty() => {}
            () = stopped(&mut stop) => break,
        }
    }
    while containers.join_next().await.is_some() {}
    if let Err(e) = std::fs::remove_dir_all(&pod.workdir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::debug!(dir = %pod.workdir.display(), error = %e, "cannot remove a pod's working dir");
    }
    tracing::debug!(pod = %pod.name, namespace = %pod.namespace, "simulated pod stopped");
}

fn condition(old: &Value, kind: &str, ok: bool, now: &str) -> Value {
    let status = if ok { "True" } else { "False" };
    let since = old["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind && c["status"] == status))
        .and_then(|c| c["lastTransitionTime"].as_str())
        .unwrap_or(now);
    json!({"type": kind, "status": status, "lastProbeTime": null, "lastTransitionTime": since})
}

/// The Pod's `status` now; `old` is the stored status (for transition times).
pub(crate) fn status(pod: &PodRuntime, old: &Value) -> Value {
    let now = now_rfc3339();
    let mut states = Vec::new();
    let mut statuses = Vec::new();
    let mut all_started = true;
    for c in &pod.containers {
        let s = c.lock();
        all_started &= s.started_once;
        let running = matches!(s.state, State::Running { .. });
        let state = match &s.state {
            State::Waiting { reason, message } => {
                let mut w = json!({"reason": reason});
                if let Some(m) = message {
                    w["message"] = json!(m);
                }
                json!({"waiting": w})
            }
            State::Running { started_at } => json!({"running": {"startedAt": started_at}}),
            State::Terminated(t) => json!({"terminated": t.to_json()}),
        };
        let mut cs = json!({
            "name": c.name, "image": c.image, "imageID": "",
            "ready": running, "started": running, "restartCount": s.restart_count,
            "state": state,
            "lastState": s.last.as_ref().map_or(json!({}), |t| json!({"terminated": t.to_json()})),
        });
        if let Some(pid) = s.pid {
            cs["containerID"] = json!(format!("simulated://{pid}"));
        }
        statuses.push(cs);
        states.push(s.state.clone());
    }
    let phase = phase_of(&states, all_started);
    let ready = !states.is_empty() && states.iter().all(|s| matches!(s, State::Running { .. }));
    json!({
        "phase": phase,
        "conditions": [
            condition(old, "PodReadyToStartContainers", true, &now),
            condition(old, "Initialized", true, &now),
            condition(old, "Ready", ready, &now),
            condition(old, "ContainersReady", ready, &now),
            condition(old, "PodScheduled", true, &now),
        ],
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "startTime": old["startTime"].as_str().unwrap_or(&pod.start_time),
        "qosClass": "BestEffort",
        "containerStatuses": statuses,
    })
}

/// Write the Pod's status through the store, as the server's own status writes do.
async fn write_status(inner: &Arc<Inner>, pod: &Arc<PodRuntime>) {
    if pod.stopping() {
        return;
    }
    let store = inner.store.clone();
    let rtype = inner.pods_type.clone();
    let p = pod.clone();
    let gr = rtype.gr();
    let result = tokio::task::spawn_blocking(move || {
        store.write(&gr, &p.namespace, &p.name, false, |cur| {
            let Some(cur) = cur else { return Ok(Change::Unchanged) };
            if meta_str(cur, "uid") != p.uid {
                return Ok(Change::Unchanged);
            }
            let mut new = (**cur).clone();
            new["status"] = status(&p, &cur["status"]);
            prepare::update(Target::new(&rtype, "v1", &p.namespace), cur, new, Part::Status)
        })
    })
    .await;
    match result {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if e.code == 404 => {}
        Ok(Err(e)) => tracing::warn!(pod = %pod.name, error = %e, "cannot write a simulated pod's status"),
        Err(e) => tracing::warn!(pod = %pod.name, error = %e, "the status write task failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(code: i32) -> State {
        State::Terminated(Terminated {
            exit_code: code,
            reason: String::new(),
            message: None,
            started_at: String::new(),
            finished_at: String::new(),
        })
    }

    #[test]
    fn phases() {
        let running = State::Running { started_at: String::new() };
        let waiting = State::Waiting { reason: NEEDS_COMMAND.into(), message: None };
        assert_eq!(phase_of(std::slice::from_ref(&waiting), false), "Pending");
        assert_eq!(phase_of(&[running.clone(), waiting], false), "Pending");
        assert_eq!(phase_of(&[running.clone(), term(0)], true), "Running");
        assert_eq!(phase_of(&[term(0), term(0)], true), "Succeeded");
        assert_eq!(phase_of(&[term(0), term(2)], true), "Failed");
    }

    #[test]
    fn argv_env_and_policy_come_from_the_spec() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 1, "containers": [
                {"name": "a", "image": "busybox", "command": ["sh", "-c"], "args": ["echo $X"],
                 "env": [{"name": "X", "value": "1"}, {"name": "Y", "valueFrom": {}}, {"name": "B=AD", "value": ""}]},
                {"name": "b", "image": "nginx"},
            ]},
        });
        let rt = PodRuntime::new(&pod, Path::new("/tmp/pods"));
        assert_eq!(rt.workdir, Path::new("/tmp/pods/u1"));
        assert_eq!(rt.restart_policy, RestartPolicy::OnFailure);
        assert_eq!(rt.grace, Duration::from_secs(1));
        let a = &rt.containers[0];
        assert_eq!(a.argv.as_deref(), Some(&["sh".to_string(), "-c".into(), "echo $X".into()][..]));
        assert_eq!(a.env, vec![("X".to_string(), "1".to_string()), ("Y".into(), String::new())]);
        assert!(rt.containers[1].argv.is_none());
    }
}
