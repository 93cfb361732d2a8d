//! Test environment: a hub and a spoke (embedded API servers), a principal serving h2c on
//! loopback, and an agent dialling it. Both processes can be stopped and restarted.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent::{Agent, AgentConfig, AgentMode, BackoffConfig, static_headers};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use principal::{Principal, PrincipalConfig, insecure_metadata_identity};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const AGENT: &str = "agent-1";
pub const PRINCIPAL_NS: &str = "argocd";
pub const SPOKE_NS: &str = "argocd";
pub const DEADLINE: Duration = Duration::from_secs(20);

pub struct Cluster {
    pub server: Option<apiserver::ApiServer>,
    pub client: kube::Client,
    /// Every request made through [`Cluster::logged_client`], as (method, path).
    pub requests: Arc<Mutex<Vec<(http::Method, String)>>>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(namespaces: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let server = apiserver::ApiServer::start(apiserver::Config::new(dir.path())).await.unwrap();
        let client = server.client().await.unwrap();
        for ns in namespaces {
            let mut n = Namespace::default();
            n.metadata.name = Some((*ns).into());
            let _ = Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &n).await;
        }
        Cluster { server: Some(server), client, requests: Arc::default(), _dir: dir }
    }

    /// A client of this API server that records each request's method and path in
    /// [`Cluster::requests`] before sending it on.
    pub fn logged_client(&self) -> kube::Client {
        let (client, log) = (self.client.clone(), self.requests.clone());
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            log.lock().unwrap().push((req.method().clone(), req.uri().path().to_owned()));
            let client = client.clone();
            async move { client.send(req).await }
        });
        kube::Client::new(service, "default")
    }

    /// How many recorded requests had `method` and `path`.
    pub fn requests_to(&self, method: &http::Method, path: &str) -> usize {
        self.requests.lock().unwrap().iter().filter(|(m, p)| m == method && p == path).count()
    }
}

struct Running {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task).await.expect("stopped within 10 s").unwrap();
    }
}

pub struct Env {
    pub mode: AgentMode,
    pub hub: Cluster,
    pub spoke: Cluster,
    pub addr: SocketAddr,
    principal: Option<Running>,
    agent: Option<Running>,
    /// Set `--namespace-create-enable` on the principal.
    pub namespace_create: bool,
    /// The agent's largest message (default: the protocol's).
    pub max_message_bytes: Option<usize>,
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

impl Env {
    pub async fn new(mode: AgentMode) -> Env {
        Self::with_hub_namespaces(mode, &[PRINCIPAL_NS, AGENT], false).await
    }

    pub async fn with_hub_namespaces(mode: AgentMode, hub_namespaces: &[&str], namespace_create: bool) -> Env {
        init_tracing();
        let hub = Cluster::start(hub_namespaces).await;
        let spoke = Cluster::start(&[SPOKE_NS]).await;
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut env =
            Env { mode, hub, spoke, addr, principal: None, agent: None, namespace_create, max_message_bytes: None };
        env.start_principal().await;
        env.start_agent().await;
        env
    }

    pub async fn start_principal(&mut self) {
        let mut config = PrincipalConfig::new(PRINCIPAL_NS);
        config.allowed_namespaces = vec!["agent-*".into()];
        config.namespace_create_enable = self.namespace_create;
        let principal = Principal::new(config, self.hub.client.clone(), insecure_metadata_identity()).await.unwrap();
        // Rebind the same port after a restart, so the agent finds the principal again.
        let mut listener = None;
        for _ in 0..50 {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(l) => {
                    listener = Some(l);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let listener = listener.expect("bind principal port");
        self.addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let task = tokio::spawn({
            let cancel = cancel.clone();
            async move {
                principal.serve(listener, cancel).await.unwrap();
            }
        });
        self.principal = Some(Running { cancel, task });
    }

    pub async fn stop_principal(&mut self) {
        if let Some(p) = self.principal.take() {
            p.stop().await;
        }
    }

    pub async fn start_agent(&mut self) {
        let mut config = AgentConfig::new(format!("http://{}", self.addr), AGENT, self.mode);
        config.namespace = SPOKE_NS.into();
        config.backoff = BackoffConfig {
            initial: Duration::from_millis(100),
            factor: 2.0,
            max: Duration::from_millis(800),
            jitter: 0.5,
        };
        config.credentials = Some(static_headers(vec![
            ("x-argocd-agent-name".into(), AGENT.into()),
            ("x-argocd-agent-mode".into(), self.mode.as_str().into()),
        ]));
        if let Some(max) = self.max_message_bytes {
            config.max_message_bytes = max;
        }
        let agent = Agent::new(config, self.spoke.logged_client()).unwrap();
        let cancel = CancellationToken::new();
        let task = tokio::spawn({
            let cancel = cancel.clone();
            async move { agent.run(cancel).await }
        });
        self.agent = Some(Running { cancel, task });
    }

    pub async fn stop_agent(&mut self) {
        if let Some(a) = self.agent.take() {
            a.stop().await;
        }
    }

    pub fn hub_apps(&self) -> Api<DynamicObject> {
        apps(&self.hub.client, AGENT)
    }

    pub fn spoke_apps(&self) -> Api<DynamicObject> {
        apps(&self.spoke.client, SPOKE_NS)
    }

    pub async fn shutdown(mut self) {
        self.stop_agent().await;
        self.stop_principal().await;
        if let Some(s) = self.hub.server.take() {
            s.shutdown().await;
        }
        if let Some(s) = self.spoke.server.take() {
            s.shutdown().await;
        }
    }
}

fn argo(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("argoproj.io", "v1alpha1", kind), plural)
}

pub fn apps(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &argo("Application", "applications"))
}

pub fn projects(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &argo("AppProject", "appprojects"))
}

pub fn app_json(name: &str, ns: &str, path: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "project": "default",
            "source": {"repoURL": "https://github.com/argoproj/argocd-example-apps", "path": path, "targetRevision": "HEAD"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "guestbook"},
        },
    })
}

pub async fn create(api: &Api<DynamicObject>, obj: Value) -> DynamicObject {
    let obj: DynamicObject = serde_json::from_value(obj).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap()
}

pub async fn get(api: &Api<DynamicObject>, name: &str) -> Option<Value> {
    api.get_opt(name).await.unwrap().map(|o| serde_json::to_value(o).unwrap())
}

pub async fn merge(api: &Api<DynamicObject>, name: &str, patch: Value) {
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

pub async fn delete(api: &Api<DynamicObject>, name: &str) {
    api.delete(name, &DeleteParams::default()).await.unwrap();
}

/// Polls `check` until it returns `Some`, failing the test after [`DEADLINE`].
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `name` exists in `api` and `pred` holds for it.
pub async fn wait_obj(api: &Api<DynamicObject>, name: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    wait_for(what, || async { get(api, name).await.filter(|v| pred(v)) }).await
}

/// Waits until `name` is gone from `api`.
pub async fn wait_gone(api: &Api<DynamicObject>, name: &str, what: &str) {
    wait_for(what, || async { if get(api, name).await.is_none() { Some(()) } else { None } }).await;
}
