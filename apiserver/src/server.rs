//! Starting and stopping a server, its bearer token and the kubeconfig it writes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::builtin::{SEED_NAMESPACES, argocd_crds, builtin_types};
use crate::http::{AppState, dispatch};
use crate::object::meta_str;
use crate::resource::{GroupResource, Registry, ResourceType};
use crate::store::{Change, Store, StoreError};

/// Default request body limit, as Kubernetes (3 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
/// Default number of events retained for watches that resume.
pub const DEFAULT_WATCH_HISTORY: usize = 20_000;
/// Default interval between watch bookmarks.
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(10);
/// Default longest watch (Kubernetes' --min-request-timeout).
pub const DEFAULT_MAX_WATCH: Duration = Duration::from_secs(1800);

/// How to run a server.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where objects (and the bearer token) are kept; the only state.
    pub data_dir: PathBuf,
    /// Address to listen on; use port 0 for a free port.
    pub listen: SocketAddr,
    /// Events kept for resuming watches; older resourceVersions get 410 Gone.
    pub watch_history: usize,
    /// Bookmark interval for watches that allow them.
    pub bookmark_interval: Duration,
    /// Longest watch when the client gives no timeout.
    pub max_watch: Duration,
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// Run a simulated node: each Pod's container `command` + `args` runs as a local process
    /// on this machine, as this server's user, so Pods reach Running and `pods/log` and
    /// `pods/exec` work. For tests and the quickstart only; never for anything exposed.
    pub simulate_pods: bool,
}

impl Config {
    /// Defaults for a data dir, on a free loopback port.
    #[must_use]
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            watch_history: DEFAULT_WATCH_HISTORY,
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
            max_watch: DEFAULT_MAX_WATCH,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            simulate_pods: false,
        }
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The data dir could not be created or read.
    #[error("data dir {path}: {source}")]
    DataDir {
        /// The path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Seeding the initial objects failed.
    #[error("cannot seed initial objects: {0}")]
    Seed(String),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source} (use --listen 127.0.0.1:0 for a free port)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS identity could not be created.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// Building a kube client failed.
    #[error("cannot build a kube client: {0}")]
    Client(String),
}

/// A running server.
#[derive(Debug)]
pub struct ApiServer {
    addr: SocketAddr,
    token: String,
    ca_pem: String,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
    node: Option<Arc<crate::node::Node>>,
}

fn load_or_create_token(dir: &Path) -> Result<String, ServerError> {
    let path = dir.join("token");
    let io = |source| ServerError::DataDir { path: path.display().to_string(), source };
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let token: String = {
        use rand::Rng as _;
        let mut rng = rand::rng();
        (0..40).map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)])).collect()
    };
    let tmp = dir.join("token.tmp");
    crate::private_file::write(&tmp, token.as_bytes()).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(token)
}

/// Seed what a fresh cluster has: namespaces and the Argo CD CRDs. Idempotent.
fn seed(store: &Store, registry: &Registry) -> Result<(), ServerError> {
    let ns_type = registry
        .get(&GroupResource::new("", "namespaces"))
        .ok_or_else(|| ServerError::Seed("no namespaces type".into()))?;
    let crd_type = registry
        .get(&GroupResource::new("apiextensions.k8s.io", "customresourcedefinitions"))
        .ok_or_else(|| ServerError::Seed("no CRD type".into()))?;
    let mut objects: Vec<(Arc<ResourceType>, serde_json::Value)> =
        SEED_NAMESPACES.iter().map(|ns| (ns_type.clone(), serde_json::json!({"metadata": {"name": ns}}))).collect();
    objects.extend(argocd_crds().into_iter().map(|c| (crd_type.clone(), c)));
    for (rtype, obj) in objects {
        let name = meta_str(&obj, "name").to_string();
        if store.get(&rtype.gr(), "", &name).is_some() {
            continue;
        }
        let target = crate::prepare::Target::new(&rtype, rtype.versions[0].as_str(), "");
        let (obj, _) = crate::prepare::create(target, obj).map_err(|e| ServerError::Seed(e.to_string()))?;
        store
            .write(&rtype.gr(), "", &name, false, |_| Ok(Change::Put(obj)))
            .map_err(|e| ServerError::Seed(e.to_string()))?;
    }
    Ok(())
}

impl ApiServer {
    /// Open the data dir, seed a fresh cluster, bind and serve.
    ///
    /// # Errors
    /// The data dir, the store or the listen address cannot be used.
    pub async fn start(cfg: Config) -> Result<Self, ServerError> {
        std::fs::create_dir_all(&cfg.data_dir)
            .map_err(|source| ServerError::DataDir { path: cfg.data_dir.display().to_string(), source })?;
        let token = load_or_create_token(&cfg.data_dir)?;
        let store = Arc::new(Store::open(&cfg.data_dir, cfg.watch_history)?);
        let mut registry = Registry::default();
        for t in builtin_types() {
            registry.insert(t);
        }
        seed(&store, &registry)?;
        for (_, crd) in
            store.list(&GroupResource::new("apiextensions.k8s.io", "customresourcedefinitions"), None, None).0
        {
            match ResourceType::from_crd(&crd) {
                Ok(t) => registry.insert(t),
                Err(causes) => {
                    tracing::warn!(crd = meta_str(&crd, "name"), ?causes, "stored CRD is invalid; not served")
                }
            }
        }
        let listener =
            TcpListener::bind(cfg.listen).await.map_err(|source| ServerError::Bind { addr: cfg.listen, source })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind { addr: cfg.listen, source })?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let node =
            cfg.simulate_pods.then(|| crate::node::Node::start(store.clone(), &cfg.data_dir, shutdown_rx.clone()));
        let state = Arc::new(AppState {
            store,
            registry: RwLock::new(Arc::new(registry)),
            token: Some(token.clone()),
            max_body_bytes: cfg.max_body_bytes,
            bookmark_interval: cfg.bookmark_interval,
            max_watch: cfg.max_watch,
            address: addr.to_string(),
            shutdown: shutdown_rx.clone(),
            node: node.clone(),
        });
        let tls = crate::tls::identity(&cfg.data_dir.join("tls"), addr.ip())?;
        let app = with_http_layers(axum::Router::new().fallback(move |req| dispatch(state.clone(), req)));
        let task = tokio::spawn(serve_tls(listener, tls.server_config.clone(), app, shutdown_rx));
        tracing::info!(%addr, "embedded API server listening");
        Ok(Self { addr, token, ca_pem: tls.ca_pem, shutdown, task, node })
    }

    /// The bound address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://host:port`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The bearer token clients must send.
    #[must_use]
    pub fn token(&self) -> &str {
        &self.token
    }

    /// PEM of the CA that issued the serving certificate.
    #[must_use]
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A kubeconfig (YAML) for this server.
    #[must_use]
    pub fn kubeconfig(&self) -> String {
        use base64::Engine as _;
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: embedded\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: embedded-admin\n  user:\n    token: {token}\ncontexts:\n- name: embedded\n  context:\n    cluster: embedded\n    user: embedded-admin\n    namespace: default\ncurrent-context: embedded\npreferences: {{}}\n",
            url = self.url(),
            ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem),
            token = self.token
        )
    }

    /// Write the kubeconfig atomically (readers never see half a file), mode 0600.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        crate::private_file::write(&tmp, self.kubeconfig().as_bytes())?;
        std::fs::rename(tmp, path)
    }

    /// A kube client for this server.
    ///
    /// # Errors
    /// The kubeconfig cannot be turned into a client.
    pub async fn client(&self) -> Result<kube::Client, ServerError> {
        let kc =
            kube::config::Kubeconfig::from_yaml(&self.kubeconfig()).map_err(|e| ServerError::Client(e.to_string()))?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| ServerError::Client(e.to_string()))?;
        kube::Client::try_from(cfg).map_err(|e| ServerError::Client(e.to_string()))
    }

    /// Stop serving: watches end, open connections drain, then the task exits.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
        if let Some(node) = &self.node {
            node.shutdown().await;
        }
    }

    /// The simulated node, when [`Config::simulate_pods`] is on.
    #[must_use]
    pub fn node(&self) -> Option<&Arc<crate::node::Node>> {
        self.node.as_ref()
    }
}

/// The tower-http stack in front of every request, as the resource proxy's: `Authorization`
/// (and cookies) marked sensitive, `x-request-id` set when absent and echoed, each request
/// traced in a debug span. No overall time-out (watches, log streams and exec sessions are
/// long) and nothing that touches bodies or upgrades: the body limit is `read_body`'s, which
/// answers a Kubernetes `Status` (tower-http's `RequestBodyLimitLayer` answers plain text, and
/// before authentication).
fn with_http_layers(app: axum::Router) -> axum::Router {
    use tower_http::ServiceBuilderExt as _;
    let stack = tower::ServiceBuilder::new()
        .sensitive_request_headers(Arc::new([
            http::header::AUTHORIZATION,
            http::header::COOKIE,
            http::header::PROXY_AUTHORIZATION,
        ]))
        .set_x_request_id(tower_http::request_id::MakeRequestUuid)
        .layer(tower_http::trace::TraceLayer::new_for_http().make_span_with(|req: &http::Request<_>| {
            let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("");
            tracing::debug_span!("apiserver", method = %req.method(), path = %req.uri().path(), request_id = %id)
        }))
        .propagate_x_request_id();
    app.layer(stack)
}

/// Accept TLS connections and serve HTTP/1.1 or HTTP/2 on them until shutdown, then let open
/// connections finish (watch streams end on the same signal).
async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: axum::Router,
    mut stop: watch::Receiver<bool>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto::Builder;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let service = hyper_util::service::TowerToHyperService::new(app);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = async { let _ = stop.wait_for(|s| *s).await; } => break,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = service.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let builder = Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
}
