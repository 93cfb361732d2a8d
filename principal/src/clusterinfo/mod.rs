//! Each agent's cluster info in the hub's Argo CD Redis (upstream `internal/argocd/cluster`,
//! `SetAgentConnectionStatus`, `SetClusterCacheStats`, `refreshClusterInfo`), so that `argocd
//! cluster list`, `argocd cluster get` and the Settings → Clusters page show every agent: its
//! connection state and since when, the counts its Argo CD reports, and its version.
//!
//! What is written, under Argo CD's own key and encoding ([`protocol::argocd::cluster_info`]):
//! `cluster|info|<server>|1.8.3[.gz]`, `<server>` being the `server` of the agent's cluster
//! secret (label `argocd-agent.argoproj-labs.io/agent-name=<agent>` in the principal's
//! namespace; an agent without one gets nothing written, as upstream):
//! * connected: status `Successful`, message `Agent: '<agent>' is connected with principal`,
//!   `attemptedAt` the time its stream was taken; with the counts of its last
//!   `cluster-cache-info-update` (applications, API resources, resources; from our agents also
//!   the cache's last sync time and the cluster's Kubernetes version as `serverVersion`);
//! * disconnected: status `Failed`, message `Agent: '<agent>' is disconnected with principal`,
//!   `attemptedAt` when its stream ended (no counts, as upstream writes it);
//! * both messages end with ` (agent version <version>)` when the agent presented one on
//!   `Authenticate` (upstream #940: Argo CD has no field for it; the message is what both
//!   `argocd cluster list` and the Clusters page show, while `serverVersion` is the Kubernetes
//!   version Argo CD renders Helm charts for, so it must not hold ours).
//!
//! When: at once on connect, disconnect and every update (in the background: a slow hub Redis
//! never holds up an agent's stream), and every [`ClusterInfoConfig::refresh_every`] (upstream:
//! 3 minutes) for every agent this principal knows, before Argo CD's 10-minute TTL drops it.
//! Better than upstream: the counts survive a reconnect (upstream writes zero until the next
//! update), a write that fails is retried with backoff, and among replicas (`--agent-leases`)
//! only the replica that owns an agent writes for it, so a late disconnect on the old owner
//! does not overwrite the new owner's `Successful`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use protocol::argocd::cluster_info::{self, ClusterCacheInfo, ClusterInfo, ConnectionState};
use protocol::payload::ClusterCacheInfo as Reported;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::registration::cluster_secret::{LABEL_AGENT_NAME, LABEL_SECRET_TYPE, SECRET_TYPE_CLUSTER, secret_name};
use crate::sync::hub::Hub;

/// Upstream's period for re-writing every agent's cluster info (`cluster.Manager.Start`).
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(3 * 60);

/// First and longest pause before a failed write is tried again.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Where the hub's Argo CD Redis is and how the principal writes to it: the Redis proxy's
/// upstream flags (`--redis-server-address`, `--redis-password` or `--redis-creds-dir-path`,
/// `--redis-tls-*`, `--redis-compression-type`), as upstream's principal uses them.
#[derive(Clone)]
pub struct ClusterInfoConfig {
    /// `host:port` of the hub's Argo CD Redis.
    pub address: String,
    /// ACL user (from `--redis-creds-dir-path`'s `auth_username`).
    pub username: Option<String>,
    /// Password (`--redis-password`, or `--redis-creds-dir-path`'s `auth`).
    pub password: Option<String>,
    /// TLS to it; `None`: plaintext.
    pub tls: Option<HubRedisTls>,
    /// Whether the hub's Argo CD compresses its cache (`--redis-compression-type gzip`, Argo
    /// CD's default): the key ends in `.gz` and the value is gzipped. Must match Argo CD's
    /// `--redis-compression`, or Argo CD reads nothing.
    pub gzip: bool,
    /// How often every agent's info is written again (upstream: 3 minutes; Argo CD drops it
    /// after 10).
    pub refresh_every: Duration,
    /// Longest a connection to the hub's Redis or one write may take.
    pub timeout: Duration,
    /// How often agents without a cluster secret are looked up again (one list for all, only
    /// while there are such agents).
    pub missing_recheck: Duration,
}

impl std::fmt::Debug for ClusterInfoConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterInfoConfig")
            .field("address", &self.address)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls.as_ref().map(|t| matches!(t, HubRedisTls::Insecure)))
            .field("gzip", &self.gzip)
            .field("refresh_every", &self.refresh_every)
            .finish_non_exhaustive()
    }
}

impl ClusterInfoConfig {
    /// Upstream's defaults for the hub's Redis at `address`: plaintext, no password, gzip,
    /// refreshed every 3 minutes.
    #[must_use]
    pub fn new(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            username: None,
            password: None,
            tls: None,
            gzip: true,
            refresh_every: DEFAULT_REFRESH,
            timeout: Duration::from_secs(10),
            missing_recheck: Duration::from_secs(10),
        }
    }

    /// The Redis client for this configuration (nothing is dialled yet).
    fn client(&self) -> Result<redis::Client, ClusterInfoError> {
        use redis::IntoConnectionInfo as _;
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        let fragment = if matches!(self.tls, Some(HubRedisTls::Insecure)) { "/#insecure" } else { "" };
        let info = format!("{scheme}://{}{fragment}", self.address)
            .into_connection_info()
            .map_err(|e| ClusterInfoError::Config(format!("--redis-server-address {:?}: {e}", self.address)))?;
        let mut settings = info.redis_settings().clone();
        if let Some(user) = self.username.as_deref().filter(|u| !u.is_empty()) {
            settings = settings.set_username(user);
        }
        if let Some(password) = self.password.as_deref().filter(|p| !p.is_empty()) {
            settings = settings.set_password(password);
        }
        let info = info.set_redis_settings(settings);
        match &self.tls {
            Some(HubRedisTls::Ca(pem)) => {
                use rustls::pki_types::pem::PemObject as _;
                if !rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()).any(|c| c.is_ok()) {
                    return Err(ClusterInfoError::Config("the hub Redis's CA holds no PEM certificate".into()));
                }
                redis::Client::build_with_tls(
                    info,
                    redis::TlsCertificates { client_tls: None, root_cert: Some(pem.as_bytes().to_vec()) },
                )
            }
            _ => redis::Client::open(info),
        }
        .map_err(|e| ClusterInfoError::Config(format!("the hub Redis's client cannot be built: {e}")))
    }
}

/// How the hub Redis's certificate is checked.
#[derive(Clone, Debug)]
pub enum HubRedisTls {
    /// Against these CA certificates (PEM; `--redis-ca-path` or `--redis-ca-secret-name`).
    Ca(String),
    /// Not at all (`--redis-tls-insecure`): encrypted, not authenticated.
    Insecure,
}

/// The cluster-info writer cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterInfoError {
    /// The configuration cannot be used.
    #[error("cluster info in the hub's Redis: {0}")]
    Config(String),
}

/// What the principal knows of one agent.
#[derive(Debug, Default, Clone)]
struct Entry {
    /// Connected (true) or not, since when.
    connection: Option<(bool, DateTime<Utc>)>,
    /// Its last `cluster-cache-info-update`.
    reported: Option<Reported>,
    /// The version it presented on `Authenticate`.
    version: Option<String>,
}

/// The wing's state: every agent's entry and which are due to be written. Lives as long as
/// the principal; the writer ([`ClusterInfoWriter`]) runs when the hub's Redis is configured.
#[derive(Debug, Default)]
pub(crate) struct ClusterInfos {
    state: Mutex<State>,
    due: Notify,
    /// Whether a writer runs, and its last write when it stops.
    running: std::sync::atomic::AtomicBool,
    stopped: Notify,
}

#[derive(Debug, Default)]
struct State {
    agents: HashMap<String, Entry>,
    /// Agents whose info changed since it was last written.
    dirty: BTreeSet<String>,
    /// Agents whose cluster secret is looked up again before the next write (they connected:
    /// self-registration may have just created it).
    lookup: BTreeSet<String>,
}

impl ClusterInfos {
    fn change(&self, agent: &str, f: impl FnOnce(&mut Entry)) {
        let mut state = link::lock(&self.state);
        f(state.agents.entry(agent.to_owned()).or_default());
        state.dirty.insert(agent.to_owned());
        drop(state);
        self.due.notify_one();
    }

    /// `agent`'s stream was taken at `since`.
    pub(crate) fn connected(&self, agent: &str, since: DateTime<Utc>) {
        link::lock(&self.state).lookup.insert(agent.to_owned());
        self.change(agent, |e| e.connection = Some((true, since)));
    }

    /// Whether `agent`'s cluster secret is to be looked up again (once).
    fn take_lookup(&self, agent: &str) -> bool {
        link::lock(&self.state).lookup.remove(agent)
    }

    /// `agent`'s last stream ended at `at`.
    pub(crate) fn disconnected(&self, agent: &str, at: DateTime<Utc>) {
        self.change(agent, |e| e.connection = Some((false, at)));
    }

    /// `agent` reported its cluster cache.
    pub(crate) fn reported(&self, agent: &str, info: Reported) {
        self.change(agent, |e| e.reported = Some(info));
    }

    /// `agent` presented `version` on `Authenticate` (written with its next change).
    pub(crate) fn note_version(&self, agent: &str, version: &str) {
        let mut state = link::lock(&self.state);
        state.agents.entry(agent.to_owned()).or_default().version = Some(version.to_owned()).filter(|v| !v.is_empty());
    }

    /// The cluster info of `agent` as it is written now; `None` before its first stream.
    pub(crate) fn info(&self, agent: &str) -> Option<ClusterInfo> {
        link::lock(&self.state).agents.get(agent).and_then(|e| build(agent, e))
    }

    /// Marks every connected agent disconnected at `at` (the principal is going away).
    fn all_disconnected(&self, at: DateTime<Utc>) {
        let mut state = link::lock(&self.state);
        let State { agents, dirty, .. } = &mut *state;
        for (agent, entry) in agents.iter_mut() {
            if matches!(entry.connection, Some((true, _))) {
                entry.connection = Some((false, at));
                dirty.insert(agent.clone());
            }
        }
    }

    /// Waits (at most `limit`) for a running writer to finish its last write after its
    /// cancellation, so a stopping principal's `Failed` reaches the hub's Redis before the
    /// process exits.
    pub(crate) async fn writer_stopped(&self, limit: Duration) {
        let stopped = self.stopped.notified();
        tokio::pin!(stopped);
        stopped.as_mut().enable();
        if self.running.load(std::sync::atomic::Ordering::Acquire) {
            let _ = tokio::time::timeout(limit, stopped).await;
        }
    }

    fn take_dirty(&self) -> Vec<String> {
        std::mem::take(&mut link::lock(&self.state).dirty).into_iter().collect()
    }

    fn all(&self) -> Vec<String> {
        link::lock(&self.state).agents.keys().cloned().collect()
    }

    fn mark_dirty(&self, agents: impl IntoIterator<Item = String>) {
        link::lock(&self.state).dirty.extend(agents);
    }
}

/// The upstream message, and the agent's version after it when known.
fn message(agent: &str, connected: bool, version: Option<&str>) -> String {
    let state = if connected { "connected" } else { "disconnected" };
    let mut message = format!("Agent: '{agent}' is {state} with principal");
    if let Some(version) = version {
        message.push_str(&format!(" (agent version {version})"));
    }
    message
}

/// The cluster info written for `agent` (module docs).
fn build(agent: &str, entry: &Entry) -> Option<ClusterInfo> {
    let (connected, since) = entry.connection?;
    let status = if connected { cluster_info::STATUS_SUCCESSFUL } else { cluster_info::STATUS_FAILED };
    let mut info = ClusterInfo {
        connection_state: ConnectionState {
            status: status.to_owned(),
            message: message(agent, connected, entry.version.as_deref()),
            modified_at: Some(since),
        },
        ..ClusterInfo::default()
    };
    if let (true, Some(reported)) = (connected, &entry.reported) {
        info.applications_count = reported.applications_count;
        info.server_version = reported.server_version.clone().unwrap_or_default();
        info.cache_info = ClusterCacheInfo {
            resources_count: reported.resources_count,
            apis_count: reported.apis_count,
            last_cache_sync_time: reported
                .last_cache_sync_time
                .as_deref()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc)),
        };
    }
    Some(info)
}

/// Writes the agents' cluster info into the hub's Argo CD Redis; made by
/// [`crate::Principal::cluster_info_writer`], run with [`Self::run`].
pub struct ClusterInfoWriter {
    hub: Arc<Hub>,
    infos: Arc<ClusterInfos>,
    config: ClusterInfoConfig,
    client: redis::Client,
    connection: Option<redis::aio::ConnectionManager>,
    /// Each agent's cluster secret `server`, as last looked up (`None`: it has none).
    servers: HashMap<String, Option<String>>,
}

impl std::fmt::Debug for ClusterInfoWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterInfoWriter").field("config", &self.config).finish_non_exhaustive()
    }
}

impl ClusterInfoWriter {
    pub(crate) fn new(
        hub: Arc<Hub>,
        infos: Arc<ClusterInfos>,
        config: ClusterInfoConfig,
    ) -> Result<Self, ClusterInfoError> {
        let client = config.client()?;
        Ok(Self { hub, infos, config, client, connection: None, servers: HashMap::new() })
    }

    /// Writes on every change and every refresh period until `cancel` fires; then marks the
    /// agents it still serves disconnected and writes that once more.
    pub async fn run(mut self, cancel: CancellationToken) {
        tracing::info!(redis = %self.config.address, gzip = self.config.gzip,
            refresh_every = ?self.config.refresh_every, "writing agents' cluster info into the hub's Argo CD Redis");
        let infos = self.infos.clone();
        infos.running.store(true, std::sync::atomic::Ordering::Release);
        let mut refresh = tokio::time::Instant::now() + self.config.refresh_every;
        let mut recheck = tokio::time::Instant::now() + self.config.missing_recheck;
        let mut retry: Option<(tokio::time::Instant, Duration)> = None;
        loop {
            let wake = retry.map_or(refresh, |(at, _)| at.min(refresh)).min(recheck);
            tokio::select! {
                () = cancel.cancelled() => break,
                () = infos.due.notified(), if retry.is_none() => {}
                () = tokio::time::sleep_until(wake) => {}
            }
            let now = tokio::time::Instant::now();
            let mut agents = if now >= refresh {
                refresh = now + self.config.refresh_every;
                // Cluster secrets are looked up again, all in one list: one may have been
                // created, changed or deleted since.
                let agents = infos.all();
                if let Some(servers) = self.all_servers().await {
                    self.servers = agents.iter().map(|a| (a.clone(), servers.get(a).cloned())).collect();
                }
                infos.take_dirty();
                agents
            } else {
                infos.take_dirty()
            };
            if now >= recheck {
                recheck = now + self.config.missing_recheck;
                // An agent whose cluster secret was missing (e.g. `argocd-agentctl agent create`
                // after it connected) gets its info as soon as the secret is there.
                if self.servers.values().any(Option::is_none)
                    && let Some(servers) = self.all_servers().await
                {
                    for (agent, server) in &mut self.servers {
                        if server.is_none()
                            && let Some(found) = servers.get(agent)
                        {
                            *server = Some(found.clone());
                            agents.push(agent.clone());
                        }
                    }
                }
            }
            let failed = self.write(agents).await;
            retry = if failed.is_empty() {
                None
            } else {
                infos.mark_dirty(failed);
                let delay = retry.map_or(RETRY_MIN, |(_, d)| (d * 2).min(RETRY_MAX));
                Some((tokio::time::Instant::now() + delay, delay))
            };
        }
        // Shutting down: the streams this principal served end with it.
        infos.all_disconnected(Utc::now());
        let last = infos.take_dirty();
        if tokio::time::timeout(self.config.timeout, self.write(last)).await.is_err() {
            tracing::warn!("could not write the agents' disconnection into the hub's Redis before stopping");
        }
        infos.running.store(false, std::sync::atomic::Ordering::Release);
        infos.stopped.notify_waiters();
    }

    /// Writes the info of `agents`; returns those whose write failed.
    async fn write(&mut self, agents: Vec<String>) -> Vec<String> {
        let mut failed = Vec::new();
        for agent in agents {
            // Among replicas, only the owner writes for an agent.
            if !self.hub.acts_for(&agent) {
                continue;
            }
            let Some(info) = self.infos.info(&agent) else { continue };
            let again = self.infos.take_lookup(&agent);
            let server = match self.server_of(&agent, again).await {
                Ok(Some(server)) => server,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(%agent, %error, "cannot look up the agent's cluster secret; retrying");
                    failed.push(agent);
                    continue;
                }
            };
            let key = cluster_info::key(&server, self.config.gzip);
            let value = cluster_info::encode(&info, self.config.gzip);
            match self.set(&key, value).await {
                Ok(()) => tracing::debug!(%agent, %key, status = %info.connection_state.status,
                    "cluster info written to the hub's Redis"),
                Err(error) => {
                    tracing::warn!(%agent, %key, %error, "cannot write the agent's cluster info to the hub's Redis; retrying");
                    self.connection = None;
                    failed.push(agent);
                }
            }
        }
        failed
    }

    /// The `server` of `agent`'s cluster secret (see [`Self::list_servers`]), as last looked up
    /// unless `again` (it connected: self-registration may have just created it).
    async fn server_of(&mut self, agent: &str, again: bool) -> Result<Option<String>, kube::Error> {
        if !again && let Some(known) = self.servers.get(agent) {
            return Ok(known.clone());
        }
        let selector = format!("{LABEL_SECRET_TYPE}={SECRET_TYPE_CLUSTER},{LABEL_AGENT_NAME}={agent}");
        let server = self.list_servers(&selector).await?.remove(agent);
        if server.is_none() && self.servers.get(agent) != Some(&None) {
            tracing::info!(%agent, namespace = %self.hub.config.namespace,
                "the agent has no cluster secret (label {LABEL_AGENT_NAME}); Argo CD shows no cluster info for it");
        }
        self.servers.insert(agent.to_owned(), server.clone());
        Ok(server)
    }

    /// Every agent's cluster secret `server` (one list); `None` (logged) when the list fails.
    async fn all_servers(&self) -> Option<HashMap<String, String>> {
        let selector = format!("{LABEL_SECRET_TYPE}={SECRET_TYPE_CLUSTER},{LABEL_AGENT_NAME}");
        match self.list_servers(&selector).await {
            Ok(servers) => Some(servers),
            Err(error) => {
                tracing::warn!(%error, "cannot list the agents' cluster secrets; using the last ones");
                None
            }
        }
    }

    /// The `server` of each agent's cluster secret among those `selector` matches in the
    /// principal's namespace, by agent (its label): `cluster-<agent>` when several carry the
    /// same agent, else the first by name.
    async fn list_servers(&self, selector: &str) -> Result<HashMap<String, String>, kube::Error> {
        let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
            kube::Api::namespaced(self.hub.secrets.client(), &self.hub.config.namespace);
        let list =
            tokio::time::timeout(self.config.timeout, api.list(&kube::api::ListParams::default().labels(selector)))
                .await
                .map_err(|_| kube::Error::Service("listing cluster secrets timed out".into()))??;
        let mut secrets: Vec<(String, bool, String, String)> = list
            .items
            .iter()
            .filter_map(|s| {
                let agent = s.metadata.labels.as_ref()?.get(LABEL_AGENT_NAME)?.clone();
                let name = s.metadata.name.clone().unwrap_or_default();
                let server = String::from_utf8(s.data.as_ref()?.get("server")?.0.clone()).ok()?;
                (!server.is_empty()).then(|| (agent.clone(), name != secret_name(&agent), name, server))
            })
            .collect();
        secrets.sort();
        let mut servers = HashMap::new();
        for (agent, _, _, server) in secrets {
            servers.entry(agent).or_insert(server);
        }
        Ok(servers)
    }

    /// `SET key value EX 600`, as go-redis/cache writes Argo CD's cluster info.
    async fn set(&mut self, key: &str, value: Vec<u8>) -> Result<(), String> {
        let timeout = self.config.timeout;
        if self.connection.is_none() {
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1);
            let manager = tokio::time::timeout(timeout, self.client.get_connection_manager_with_config(config))
                .await
                .map_err(|_| format!("connecting took longer than {timeout:?}"))?
                .map_err(|e| format!("cannot connect: {e}"))?;
            self.connection = Some(manager);
        }
        let Some(connection) = self.connection.as_mut() else { return Err("no connection".into()) };
        let set = redis::cmd("SET").arg(key).arg(value).arg("EX").arg(cluster_info::TTL_SECONDS).clone();
        tokio::time::timeout(timeout, set.query_async::<()>(connection))
            .await
            .map_err(|_| format!("the write took longer than {timeout:?}"))?
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).expect("time").with_timezone(&Utc)
    }

    #[test]
    fn connected_carries_the_counts_and_the_version() {
        let infos = ClusterInfos::default();
        assert!(infos.info("a").is_none(), "nothing before the first stream");
        infos.note_version("a", "argocd-agent-0.1.0");
        infos.connected("a", at("2026-12-02T10:00:00Z"));
        infos.reported(
            "a",
            Reported {
                applications_count: 2,
                apis_count: 40,
                resources_count: 300,
                last_cache_sync_time: Some("2026-12-02T10:00:05Z".into()),
                server_version: Some("1.37".into()),
            },
        );
        let info = infos.info("a").expect("info");
        assert_eq!(info.connection_state.status, "Successful");
        assert_eq!(
            info.connection_state.message,
            "Agent: 'a' is connected with principal (agent version argocd-agent-0.1.0)"
        );
        assert_eq!(info.connection_state.modified_at, Some(at("2026-12-02T10:00:00Z")));
        assert_eq!(
            (info.applications_count, info.cache_info.apis_count, info.cache_info.resources_count),
            (2, 40, 300)
        );
        assert_eq!(info.cache_info.last_cache_sync_time, Some(at("2026-12-02T10:00:05Z")));
        assert_eq!(info.server_version, "1.37");
        assert_eq!(infos.take_dirty(), ["a"]);

        // Disconnected: upstream's message and time, no counts; they come back on reconnect.
        infos.disconnected("a", at("2026-12-02T11:00:00Z"));
        let info = infos.info("a").expect("info");
        assert_eq!(info.connection_state.status, "Failed");
        assert_eq!(
            info.connection_state.message,
            "Agent: 'a' is disconnected with principal (agent version argocd-agent-0.1.0)"
        );
        assert_eq!(info.connection_state.modified_at, Some(at("2026-12-02T11:00:00Z")));
        assert_eq!((info.applications_count, info.cache_info.clone()), (0, ClusterCacheInfo::default()));
        infos.connected("a", at("2026-12-02T12:00:00Z"));
        assert_eq!(infos.info("a").expect("info").applications_count, 2);
    }

    #[test]
    fn without_a_version_the_message_is_upstreams() {
        let infos = ClusterInfos::default();
        infos.connected("b", Utc::now());
        assert_eq!(infos.info("b").expect("info").connection_state.message, "Agent: 'b' is connected with principal");
        infos.all_disconnected(at("2026-12-02T13:00:00Z"));
        let info = infos.info("b").expect("info");
        assert_eq!(
            (info.connection_state.status.as_str(), info.connection_state.modified_at),
            ("Failed", Some(at("2026-12-02T13:00:00Z")))
        );
    }

    /// A redis-server on a free loopback port, killed when dropped.
    struct RedisServer(std::process::Child, u16);

    impl Drop for RedisServer {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    async fn redis_server() -> (RedisServer, redis::aio::MultiplexedConnection) {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (scripts/install-test-deps)");
        let server = RedisServer(child, port);
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(conn) = client.get_multiplexed_async_connection().await {
                return (server, conn);
            }
            assert!(tokio::time::Instant::now() < deadline, "redis-server did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stored(conn: &mut redis::aio::MultiplexedConnection, server: &str) -> Option<ClusterInfo> {
        let value: Option<Vec<u8>> =
            redis::cmd("GET").arg(cluster_info::key(server, true)).query_async(conn).await.unwrap();
        value.map(|v| cluster_info::decode(&v, true).unwrap())
    }

    async fn eventually_stored(
        conn: &mut redis::aio::MultiplexedConnection,
        server: &str,
        ok: impl Fn(&ClusterInfo) -> bool,
    ) -> ClusterInfo {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(info) = stored(conn, server).await
                && ok(&info)
            {
                return info;
            }
            assert!(tokio::time::Instant::now() < deadline, "no matching cluster info for {server}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The writer against a real redis-server and the embedded API server: the cluster secret's
    /// server (the `cluster-<agent>` one when several name the agent), the periodic re-write
    /// (a key Argo CD lost comes back; a changed secret is followed), and `Failed` on stop.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_refreshes_and_follows_cluster_secrets() {
        use k8s_openapi::api::core::v1::{Namespace, Secret};
        use kube::api::{Api, Patch, PatchParams, PostParams};

        let (redis_process, mut conn) = redis_server().await;
        let dir = tempfile::tempdir().unwrap();
        let apiserver = apiserver::ApiServer::start(apiserver::Config::new(dir.path().join("data"))).await.unwrap();
        let client = apiserver.client().await.unwrap();
        let ns = Namespace {
            metadata: kube::api::ObjectMeta { name: Some("argocd".into()), ..Default::default() },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), "argocd");
        let secret = |name: &str, agent: &str, server: &str| Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    [
                        (LABEL_SECRET_TYPE.to_owned(), SECRET_TYPE_CLUSTER.to_owned()),
                        (LABEL_AGENT_NAME.to_owned(), agent.to_owned()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            data: Some([("server".to_owned(), k8s_openapi::ByteString(server.as_bytes().to_vec()))].into()),
            ..Default::default()
        };
        for (name, agent, server) in [
            ("a-first", "r1", "https://wrong"),
            ("cluster-r1", "r1", "https://p?agentName=r1"),
            ("other-r2", "r2", "https://p?agentName=r2"),
        ] {
            secrets.create(&PostParams::default(), &secret(name, agent, server)).await.unwrap();
        }

        let hub = Arc::new(Hub::new(crate::PrincipalConfig::new("argocd"), "uid".into(), client.clone()));
        let infos = Arc::new(ClusterInfos::default());
        let mut config = ClusterInfoConfig::new(format!("127.0.0.1:{}", redis_process.1));
        config.refresh_every = Duration::from_secs(1);
        config.missing_recheck = Duration::from_millis(200);
        let writer = ClusterInfoWriter::new(hub, infos.clone(), config).unwrap();
        let cancel = CancellationToken::new();
        let running = tokio::spawn(writer.run(cancel.clone()));
        infos.connected("r1", Utc::now());
        infos.connected("r2", Utc::now());
        infos.connected("r3", Utc::now());
        infos.reported("r2", Reported { applications_count: 5, ..Reported::default() });

        let r1 =
            eventually_stored(&mut conn, "https://p?agentName=r1", |i| i.connection_state.status == "Successful").await;
        assert_eq!(r1.connection_state.message, "Agent: 'r1' is connected with principal");
        eventually_stored(&mut conn, "https://p?agentName=r2", |i| i.applications_count == 5).await;
        let ttl: i64 = redis::cmd("TTL")
            .arg(cluster_info::key("https://p?agentName=r1", true))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!((590..=600).contains(&ttl), "TTL {ttl}");
        assert!(stored(&mut conn, "https://wrong").await.is_none(), "cluster-<agent> wins");

        // An agent whose cluster secret comes after it connected gets its info then.
        secrets.create(&PostParams::default(), &secret("cluster-r3", "r3", "https://p?agentName=r3")).await.unwrap();
        eventually_stored(&mut conn, "https://p?agentName=r3", |i| i.connection_state.status == "Successful").await;

        // Argo CD's cache lost the key: the next refresh writes it again.
        let _: () = redis::cmd("DEL")
            .arg(cluster_info::key("https://p?agentName=r1", true))
            .query_async(&mut conn)
            .await
            .unwrap();
        eventually_stored(&mut conn, "https://p?agentName=r1", |_| true).await;
        // The cluster secret's server changes: followed at the next refresh.
        let patch = serde_json::json!({"data": {"server": "aHR0cHM6Ly9uZXc/YWdlbnROYW1lPXIy"}}); // https://new?agentName=r2
        secrets.patch("other-r2", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        eventually_stored(&mut conn, "https://new?agentName=r2", |i| i.applications_count == 5).await;

        // Stopping: every agent it served shows Failed.
        cancel.cancel();
        infos.writer_stopped(Duration::from_secs(20)).await;
        running.await.unwrap();
        let r1 = stored(&mut conn, "https://p?agentName=r1").await.unwrap();
        assert_eq!(
            (r1.connection_state.status.as_str(), r1.connection_state.message.as_str()),
            ("Failed", "Agent: 'r1' is disconnected with principal")
        );
    }
}
