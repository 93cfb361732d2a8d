//! The hub side: gRPC services, agent sessions, event routing, hub watchers, resync.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), principal::PrincipalError> {
//! let mut config = principal::PrincipalConfig::new("argocd");
//! config.allowed_namespaces = vec!["*".into()];
//! let principal = principal::Principal::new(config, client, principal::insecure_metadata_identity()).await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8443").await.map_err(principal::PrincipalError::Listen)?;
//! principal.serve(listener, tokio_util::sync::CancellationToken::new()).await
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod access;
mod clusterinfo;
pub mod config;
pub mod error;
pub mod ha;
pub mod ident;
pub mod lease;
pub mod metrics;
mod otel;
pub mod peer;
mod pending;
mod proxy;
mod redis;
pub mod registration;
pub mod service;
pub mod state;
pub mod sync;
pub mod transport;

// The wings' modules under the names they had before the folders.
pub use access::{authz, blocklist};
pub use registration::cluster_secret;
pub use transport::{compression, websocket};

use std::sync::Arc;

use protocol::pb::authapi::authentication_server::AuthenticationServer;
use protocol::pb::eventstreamapi::event_stream_server::EventStreamServer;
use protocol::pb::logstreamapi::log_stream_service_server::LogStreamServiceServer;
use protocol::pb::terminalstreamapi::terminal_stream_service_server::TerminalStreamServiceServer;
use protocol::pb::versionapi::version_server::VersionServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use authz::Permit;
pub use clusterinfo::{ClusterInfoConfig, ClusterInfoError, ClusterInfoWriter, HubRedisTls};
pub use config::{AgentMode, PrincipalConfig};
pub use ident::{Caller, IdentityFn, StreamGrant, auth_layer_identity, insecure_metadata_identity};
pub use proxy::{ProxyConfig, ResourceProxy};
pub use redis::{RedisProxy, RedisProxyConfig, UpstreamTls, UpstreamTlsError};
pub use service::eventstream::EventStreamService;
pub use service::version::VersionService;

use sync::hub::Hub;

/// The principal could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum PrincipalError {
    /// `namespace` is empty.
    #[error("the principal namespace is empty: set --namespace (ARGOCD_PRINCIPAL_NAMESPACE)")]
    NoNamespace,
    /// The principal UID could not be read or created.
    #[error(transparent)]
    Identity(#[from] state::IdentityError),
    /// The blocklist could not be read.
    #[error(transparent)]
    Blocklist(#[from] blocklist::BlocklistError),
    /// The listener could not be created.
    #[error("cannot listen for agents: {0} (check --listen-host/--listen-port)")]
    Listen(#[source] std::io::Error),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Serve(#[source] tonic::transport::Error),
}

/// The principal: hub watchers, agent sessions and the gRPC services, sharing one state.
#[derive(Clone)]
pub struct Principal {
    hub: Arc<Hub>,
    /// What the wings that answer through agents' streams own, and cross-hub HA's slot.
    wings: service::eventstream::Wings,
    authorizer: Arc<authz::Authorizer>,
    blocklist: Arc<blocklist::Blocklist>,
    /// Among replicas: how to reach the replica that owns an agent (set by the resource
    /// proxy's configuration, used by the Redis proxy too), and this principal's Redis proxy
    /// (which answers the Redis reads other replicas forward to the resource proxy).
    replicas: Arc<std::sync::OnceLock<proxy::replica::ReplicaForwarding>>,
    redis_proxy: Arc<std::sync::OnceLock<RedisProxy>>,
}

impl std::fmt::Debug for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Principal").field("namespace", &self.hub.config.namespace).finish_non_exhaustive()
    }
}

impl Principal {
    /// Prepares a principal on the hub reached through `client`: reads (or creates once) the
    /// principal UID in ConfigMap `argocd-agent-principal-identity` and reads the blocklist
    /// ([`blocklist::CONFIG_MAP`]). `identity` tells the services which agent is calling.
    ///
    /// # Errors
    ///
    /// [`PrincipalError::NoNamespace`], [`PrincipalError::Identity`] when the hub cannot be
    /// read or written, or [`PrincipalError::Blocklist`] when the blocklist cannot be read.
    pub async fn new(
        config: PrincipalConfig,
        client: kube::Client,
        identity: IdentityFn,
    ) -> Result<Self, PrincipalError> {
        if config.namespace.is_empty() {
            return Err(PrincipalError::NoNamespace);
        }
        let uid = state::ensure_principal_uid(&client, &config.namespace).await?;
        let blocklist = Arc::new(blocklist::Blocklist::new(client.clone(), &config.namespace));
        blocklist.load().await?;
        tracing::info!(namespace = %config.namespace, principal_uid = %uid, "principal ready");
        let hub = Arc::new(Hub::new(config, uid, client));
        let authorizer = Arc::new(authz::Authorizer::new(hub.clone(), identity, blocklist.clone()));
        let wings = service::eventstream::Wings {
            proxy: Arc::new(proxy::Tables::default()),
            redis: Arc::new(redis::Exchange::default()),
            clusters: Arc::new(clusterinfo::ClusterInfos::default()),
            ha: ha::Slot::default(),
        };
        Ok(Self { hub, wings, authorizer, blocklist, replicas: Arc::default(), redis_proxy: Arc::default() })
    }

    /// The persistent principal UID (extension `principaluid` on events to agents).
    #[must_use]
    pub fn principal_uid(&self) -> &str {
        &self.hub.principal_uid
    }

    /// The `EventStream` service behind the authorization layer ([`authz`]), for a tonic
    /// server (inside the auth crate's layer, which identifies the agent).
    #[must_use]
    pub fn event_stream_service(&self) -> authz::Authorize<EventStreamServer<EventStreamService>> {
        let service = EventStreamServer::new(EventStreamService::new(
            self.hub.clone(),
            self.wings.clone(),
            self.authorizer.clone(),
        ))
        .max_decoding_message_size(self.hub.config.max_message_bytes)
        .max_encoding_message_size(self.hub.config.max_message_bytes)
        .accept_compressed(compression::GZIP)
        .send_compressed(compression::GZIP);
        tower::Layer::layer(&authz::AuthorizeLayer::new(self.authorizer.clone()), service)
    }

    /// The `LogStreamService` (pod logs from agents) behind the authorization layer.
    #[must_use]
    pub fn log_stream_service(&self) -> authz::Authorize<LogStreamServiceServer<service::logstream::LogStreams>> {
        let service = LogStreamServiceServer::new(service::logstream::LogStreams::new(self.wings.proxy.clone()))
            .max_decoding_message_size(self.hub.config.max_message_bytes)
            .accept_compressed(compression::GZIP)
            .send_compressed(compression::GZIP);
        tower::Layer::layer(&authz::AuthorizeLayer::new(self.authorizer.clone()), service)
    }

    /// The `TerminalStreamService` (web terminals through agents) behind the authorization layer.
    #[must_use]
    pub fn terminal_stream_service(
        &self,
    ) -> authz::Authorize<TerminalStreamServiceServer<service::terminalstream::TerminalStreams>> {
        let service =
            TerminalStreamServiceServer::new(service::terminalstream::TerminalStreams::new(self.wings.proxy.clone()))
                .max_decoding_message_size(self.hub.config.max_message_bytes)
                .max_encoding_message_size(self.hub.config.max_message_bytes)
                .accept_compressed(compression::GZIP)
                .send_compressed(compression::GZIP);
        tower::Layer::layer(&authz::AuthorizeLayer::new(self.authorizer.clone()), service)
    }

    /// The resource proxy (upstream §5.1) of this principal, with `config`; serve it with
    /// [`ResourceProxy::serve`].
    #[must_use]
    pub fn resource_proxy(&self, config: ProxyConfig) -> ResourceProxy {
        if let Some(link) = &config.replicas {
            // The Redis proxy forwards over the same link.
            let _ = self.replicas.set(link.clone());
        }
        ResourceProxy::new(self.hub.clone(), self.wings.proxy.clone(), config, self.redis_proxy.clone())
    }

    /// The Redis proxy (upstream §5.2) of this principal, with `config`; serve it with
    /// [`RedisProxy::serve`].
    #[must_use]
    pub fn redis_proxy(&self, config: RedisProxyConfig) -> RedisProxy {
        let proxy = RedisProxy::new(self.hub.clone(), self.wings.redis.clone(), config, self.replicas.clone());
        // The first one built answers the reads other replicas forward here.
        let _ = self.redis_proxy.set(proxy.clone());
        proxy
    }

    /// The writer of each agent's cluster info (connection state, cache counts, version) into
    /// the hub's Argo CD Redis at `config` (upstream's cluster manager cache); run it with
    /// [`ClusterInfoWriter::run`] beside the server.
    ///
    /// # Errors
    ///
    /// [`ClusterInfoError`] when the Redis client cannot be built from `config`.
    pub fn cluster_info_writer(&self, config: ClusterInfoConfig) -> Result<ClusterInfoWriter, ClusterInfoError> {
        ClusterInfoWriter::new(self.hub.clone(), self.wings.clusters.clone(), config)
    }

    /// Makes this principal one of a cross-hub HA pair (`--ha-*`, [`ha`]): agents are served
    /// only while it is active, and the `Replication` service answers on the agents' port.
    /// Run the returned controller ([`ha::Ha::run`]) beside the server, and serve its admin API
    /// with [`ha::admin::serve`].
    #[must_use]
    pub fn enable_ha(&self, config: ha::HaConfig) -> Arc<ha::Ha> {
        ha::Ha::attach(&self.hub, &self.wings.ha, config)
    }

    /// The `Version` service.
    #[must_use]
    pub fn version_service(&self) -> VersionServer<VersionService> {
        VersionServer::new(VersionService::new(self.hub.config.version.clone()))
            .accept_compressed(compression::GZIP)
            .send_compressed(compression::GZIP)
    }

    /// Runs the hub watchers (Applications, AppProjects, repository secrets, GPG keys) and the blocklist watcher until
    /// `cancel` fires.
    pub async fn run_watchers(&self, cancel: CancellationToken) {
        tokio::join!(
            sync::watch::run_applications(self.hub.clone(), cancel.clone()),
            sync::watch::run_projects(self.hub.clone(), cancel.clone()),
            sync::watch::run_repositories(self.hub.clone(), cancel.clone()),
            sync::watch::run_gpg_keys(self.hub.clone(), cancel.clone()),
            self.blocklist.clone().run(self.hub.clone(), cancel.clone()),
            async {
                if let Some(own) = &self.hub.leases {
                    lease::run(own, &self.hub.peers, cancel).await;
                }
            },
        );
    }

    /// The blocklist in force ([`blocklist::CONFIG_MAP`]).
    #[must_use]
    pub fn blocklist(&self) -> &blocklist::Blocklist {
        &self.blocklist
    }

    /// Ends every agent stream (they reconnect with backoff). Call it when shutting down a
    /// server that carries [`Self::event_stream_service`], before waiting for it to drain.
    pub fn disconnect_all(&self) {
        if let Some(leases) = &self.hub.leases {
            leases.drain();
        }
        self.hub.peers.disconnect_all();
    }

    /// Revokes the live session of `agent` now: its stream ends with `Unauthenticated`, and
    /// the access token that opened it is refused on new streams until it expires (the agent
    /// must authenticate or refresh). Returns whether a live stream was closed. The hook for
    /// a blocklist; see [`session::Peers::revoke`].
    pub fn revoke(&self, agent: &str) -> bool {
        self.hub.peers.revoke(agent)
    }

    /// The [`auth::SessionHook`] for the principal's `Authentication` service: a refreshed
    /// session extends the agent's live stream to the new access token's expiry, so agents that
    /// keep their session fresh keep their stream (no reconnect and resync per token lifetime),
    /// and an agent that stops refreshing loses its stream when its last token expires.
    /// `Authenticate` admits an agent by the rules every later call follows
    /// ([`authz`](crate::access::authz)) before it signs a token or self-registers a cluster;
    /// blocklisted agents are refused: `Authenticate` with `PermissionDenied`, `RefreshToken`
    /// with `Unauthenticated`.
    #[must_use]
    pub fn session_hook(&self) -> SessionHook {
        SessionHook {
            hub: self.hub.clone(),
            authorizer: self.authorizer.clone(),
            clusters: self.wings.clusters.clone(),
        }
    }

    /// How many managed agents' status writes took each path so far: the conditional patch,
    /// a patch the hub refused (409, the principal's cache was behind), the read-modify-write.
    /// For tests: `principal/tests/status.rs` proves each path runs when it should.
    #[doc(hidden)]
    #[must_use]
    pub fn status_write_paths(&self) -> sync::hub::StatusWritePaths {
        self.hub.status_paths.snapshot()
    }

    /// Whether `agent` has a live stream.
    #[must_use]
    pub fn is_connected(&self, agent: &str) -> bool {
        self.hub.peers.get(agent).is_some_and(|s| s.is_connected())
    }

    /// Whether the hub watchers (Applications, AppProjects, repository secrets, GPG keys) have listed the hub once: the
    /// principal's readiness (`/healthz`, `/readyz`).
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.readiness().is_ok()
    }

    /// Whether this principal can take agents now, or why not: its hub watchers have not listed
    /// the hub yet; among replicas (`--agent-leases`), it is shutting down or cannot renew its
    /// own Lease. What `/readyz` answers, so a load balancer sends agents to replicas that can
    /// take them.
    ///
    /// # Errors
    ///
    /// Why the principal is not ready.
    pub fn readiness(&self) -> Result<(), String> {
        use std::sync::atomic::Ordering::Relaxed;
        let synced = self.hub.apps_synced.load(Relaxed)
            && self.hub.projects_synced.load(Relaxed)
            && self.hub.repos_synced.load(Relaxed)
            && self.hub.gpg_synced.load(Relaxed);
        if !synced {
            return Err("the hub watchers have not listed the hub yet".to_owned());
        }
        match self.hub.leases.as_ref().and_then(lease::Ownership::not_serving) {
            Some(why) => Err(format!("replica {:?}: {why}", self.hub.leases.as_ref().map_or("", |l| l.replica()))),
            // Cross-hub HA: ready only while active (upstream's `HAHealthzHandler`).
            None => ha::of(&self.wings.ha).map_or(Ok(()), |ha| ha.readiness()),
        }
    }

    /// Among replicas (`--agent-leases`): this replica's name and how many agents it owns.
    #[must_use]
    pub fn owned_agents(&self) -> Option<(String, usize)> {
        self.hub.leases.as_ref().map(|l| (l.replica().to_owned(), l.held()))
    }

    /// The Prometheus exposition of [`metrics::global`], with this principal's outboxes.
    #[must_use]
    pub fn metrics_text(&self) -> String {
        let mut text = metrics::global().render(Some(&self.hub.peers));
        // Cross-hub HA: its state and replication.
        if let Some(ha) = ha::of(&self.wings.ha) {
            text.push_str(&ha.metrics_text());
        }
        text
    }

    /// Runs the watchers and serves `EventStream` and `Version` in plaintext (h2c) on
    /// `listener`, identifying agents by the identity seam given to [`Self::new`], until `cancel`
    /// fires. For tests and trusted loopback setups; the `argocd-agent principal` server is
    /// [`Self::serve_agents`] with the auth crate's layer.
    ///
    /// # Errors
    ///
    /// [`PrincipalError::Serve`] when the gRPC server fails.
    pub async fn serve(self, listener: TcpListener, cancel: CancellationToken) -> Result<(), PrincipalError> {
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        self.serve_agents(None, incoming, cancel).await
    }

    /// Runs the watchers and serves agents on `incoming` (plaintext or TLS connections) until
    /// `cancel` fires: `EventStream` and `Version`, and with `auth` the auth crate's layer on
    /// every call and its `Authentication` service (a refreshed session extends the agent's
    /// stream, the blocklist refuses sessions, refusals are counted in
    /// `argocd_principal_auth_failures_total`). On `cancel`, every agent stream is ended first
    /// (agents reconnect with backoff), so the graceful shutdown does not wait for them.
    ///
    /// # Errors
    ///
    /// [`PrincipalError::Serve`] when the gRPC server fails.
    pub async fn serve_agents<I, IO, IE>(
        self,
        auth: Option<AgentAuth>,
        incoming: I,
        cancel: CancellationToken,
    ) -> Result<(), PrincipalError>
    where
        I: futures::Stream<Item = Result<IO, IE>>,
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + tonic::transport::server::Connected + Unpin + Send + 'static,
        IO::ConnectInfo: Clone + Send + Sync + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let watchers = tokio::spawn({
            let (this, cancel) = (self.clone(), cancel.clone());
            async move { this.run_watchers(cancel).await }
        });
        let shutdown = {
            let (this, cancel) = (self.clone(), cancel.clone());
            async move {
                cancel.cancelled().await;
                tracing::info!("shutting down: closing agent streams");
                this.disconnect_all();
            }
        };
        // gzip answered in kind, as upstream's principal answers it (see [`compression`]).
        // `Replication` (cross-hub HA) before the agents' token check: its callers are peers.
        // HTTP/2 keepalive: a PING after `interval` without traffic, the connection closed when
        // it is not answered within `timeout`, so a dead or silent peer's connection goes (its
        // handshake and how many connections are held are bounded by the incoming stream,
        // `transport::limits`).
        let keepalive = self.hub.config.keepalive;
        let mut server = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(keepalive.interval))
            .http2_keepalive_timeout(Some(keepalive.timeout))
            .layer(ha::replication::ReplicationLayer::new(self.wings.ha.clone()))
            .layer(compression::mirror_layer());
        let served = match auth {
            None => {
                server
                    .add_service(self.event_stream_service())
                    .add_service(self.log_stream_service())
                    .add_service(self.terminal_stream_service())
                    .add_service(self.version_service())
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await
            }
            Some(AgentAuth { sessions, config }) => {
                let observer =
                    || auth::AuthObserver::new(|method, reason| metrics::global().auth_failed(method, reason));
                let authentication = AuthenticationServer::new(
                    auth::AuthService::new(sessions.clone(), config, self.session_hook()).with_observer(observer()),
                )
                .accept_compressed(compression::GZIP)
                .send_compressed(compression::GZIP);
                server
                    .layer(auth::AuthLayer::new(sessions).with_observer(observer()))
                    .add_service(authentication)
                    .add_service(self.event_stream_service())
                    .add_service(self.log_stream_service())
                    .add_service(self.terminal_stream_service())
                    .add_service(self.version_service())
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await
            }
        };
        cancel.cancel();
        let _ = watchers.await;
        // The agents' cluster info says they are disconnected before the process goes.
        self.wings.clusters.writer_stopped(std::time::Duration::from_secs(10)).await;
        served.map_err(PrincipalError::Serve)
    }
}

/// The auth crate's side of [`Principal::serve_agents`]: the session authority (methods,
/// signing key) and the `Authentication` service's settings.
#[derive(Debug)]
pub struct AgentAuth {
    /// Issues and verifies sessions.
    pub sessions: auth::Sessions,
    /// Version check and what the service tells agents.
    pub config: auth::AuthServiceConfig,
}

/// See [`Principal::session_hook`].
#[derive(Clone)]
pub struct SessionHook {
    hub: Arc<Hub>,
    authorizer: Arc<authz::Authorizer>,
    /// The agent's version goes into its cluster info.
    clusters: Arc<clusterinfo::ClusterInfos>,
}

impl std::fmt::Debug for SessionHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHook").finish_non_exhaustive()
    }
}

impl auth::SessionHook for SessionHook {
    fn admit(
        &self,
        identity: &auth::AgentIdentity,
        _mode: auth::AgentMode,
        transport: &auth::TransportIdentity,
    ) -> Result<(), tonic::Status> {
        self.authorizer.admit(identity.name().as_str(), transport)?;
        self.authorizer.check_session(identity).map_err(|reason| {
            tracing::warn!(agent = %identity.name(), binding = %identity.binding(), %reason, "authentication refused");
            tonic::Status::permission_denied(reason)
        })
    }

    async fn on_authenticated(&self, session: &auth::NewSession) -> Result<(), tonic::Status> {
        let identity = &session.identity;
        self.hub.note_agent_version(identity.name().as_str(), &session.agent_version);
        self.clusters.note_version(identity.name().as_str(), &session.agent_version);
        if let Some(registration) = &self.hub.config.self_registration {
            let agent = identity.name().as_str();
            match registration.ensure(&self.hub.secrets.client(), &self.hub.config.namespace, agent).await {
                Ok(registration::Registered::Current) => {}
                Ok(done) => tracing::info!(%agent, outcome = ?done, "self-registration: cluster secret"),
                Err(error) => {
                    tracing::warn!(%agent, %error, "authentication refused: self-registration failed");
                    return Err(tonic::Status::unauthenticated(error.to_string()));
                }
            }
        }
        Ok(())
    }

    fn on_refreshed(
        &self,
        identity: &auth::AgentIdentity,
        access_expires_at: std::time::SystemTime,
    ) -> Result<(), tonic::Status> {
        self.authorizer.check_session(identity).map_err(tonic::Status::unauthenticated)?;
        if self.hub.peers.extend(identity.name().as_str(), identity.binding(), access_expires_at) {
            tracing::debug!(agent = %identity.name(), "session refreshed: stream extended");
        }
        Ok(())
    }
}
