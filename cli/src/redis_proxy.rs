//! The Redis proxy's flags, with upstream's names, environment variables and defaults
//! (docs/configuration.md, docs/live-resources.md): the principal's proxy listener and its
//! connection to the hub's Redis, and the agent's own Redis.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::ctl::kube::Secrets;
use crate::material::{key_pair, pem_from, read_pem};

/// Upstream's address of Argo CD's Redis, for both the hub's and an agent's.
const DEFAULT_REDIS: &str = "argocd-redis:6379";

/// The principal's Redis-proxy flags.
#[derive(Debug, Clone, clap::Args)]
pub struct PrincipalRedis {
    /// The hub's Redis (host:port) the proxy forwards to (upstream default argocd-redis:6379).
    /// Setting it serves the Redis proxy, unless --disable-redis-proxy.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_SERVER_ADDRESS")]
    pub redis_server_address: Option<String>,
    /// Do not serve the Redis proxy. Unset: served when --redis-server-address is set; false:
    /// served (the hub's Redis at argocd-redis:6379 unless given).
    #[arg(long, env = "ARGOCD_PRINCIPAL_DISABLE_REDIS_PROXY")]
    pub disable_redis_proxy: Option<bool>,
    /// Where the Redis proxy listens (upstream: always :6379).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_PROXY_LISTEN_ADDRESS", default_value = "0.0.0.0:6379")]
    pub redis_proxy_listen_address: String,
    /// How long a GET or SUBSCRIBE through the proxy waits for the agent's answer.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_PROXY_TIMEOUT", default_value = "30s")]
    pub redis_proxy_timeout: String,
    /// Redis requests of one agent in flight at once; more get an error reply.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_PROXY_MAX_IN_FLIGHT", default_value_t = 64)]
    pub redis_proxy_max_in_flight: u32,
    /// Largest RESP frame (bytes) an authenticated client may send through the Redis proxy,
    /// and the hub's Redis may answer (default 128 MiB; Redis's own limit is 512 MiB). Clients
    /// that have not authenticated get Redis's bounds: 10 arguments of 16 KiB.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_PROXY_MAX_FRAME_BYTES")]
    pub redis_proxy_max_frame_bytes: Option<usize>,
    /// Password of the hub's Redis, for the agents' cluster info the principal writes there
    /// (Argo CD's own clients authenticate themselves through the proxy).
    #[arg(long, env = "REDIS_PASSWORD", hide_env_values = true)]
    pub redis_password: Option<String>,
    /// Directory with the hub Redis's credentials instead: files `auth` (password) and optional
    /// `auth_username`.
    #[arg(long, env = "REDIS_CREDS_DIR_PATH")]
    pub redis_creds_dir_path: Option<String>,
    /// How the hub's Argo CD compresses its cache (gzip, Argo CD's default, or none; must match
    /// Argo CD's --redis-compression): the agents' cluster info is written so. Values passing
    /// the proxy are never touched.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_COMPRESSION_TYPE")]
    pub redis_compression_type: Option<String>,
    /// TLS on the Redis proxy's listener and to the hub's Redis.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_TLS_ENABLED")]
    pub redis_tls_enabled: Option<bool>,
    /// The proxy's server certificate file (instead of the secret).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_CERT_PATH")]
    pub redis_proxy_server_tls_cert: Option<PathBuf>,
    /// The proxy's server key file (instead of the secret).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_KEY_PATH")]
    pub redis_proxy_server_tls_key: Option<PathBuf>,
    /// Secret holding the proxy's server certificate (tls.crt, tls.key).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_SECRET_NAME", default_value = "argocd-redis-proxy-tls")]
    pub redis_proxy_server_tls_secret_name: String,
    /// CA file that issued the hub Redis's certificate (instead of the secret).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_CA_PATH")]
    pub redis_ca_path: Option<PathBuf>,
    /// Secret holding the CA that issued the hub Redis's certificate (ca.crt).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_CA_SECRET_NAME", default_value = "argocd-redis-tls")]
    pub redis_ca_secret_name: String,
    /// Do not verify the hub Redis's certificate (encrypted, not authenticated).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_TLS_INSECURE")]
    pub redis_tls_insecure: Option<bool>,
}

impl PrincipalRedis {
    /// Whether the proxy is served.
    fn enabled(&self) -> bool {
        match self.disable_redis_proxy {
            Some(disabled) => !disabled,
            None => self.redis_server_address.as_deref().is_some_and(|a| !a.is_empty()),
        }
    }

    fn timeout(&self) -> anyhow::Result<std::time::Duration> {
        crate::flags::parse_duration(&self.redis_proxy_timeout)
            .with_context(|| format!("--redis-proxy-timeout {:?}", self.redis_proxy_timeout))
    }

    /// Checks the flags; returns the notes on those that have no effect here.
    ///
    /// # Errors
    /// A value upstream would refuse, or two CA modes at once.
    pub fn check(&self) -> anyhow::Result<Vec<String>> {
        self.timeout()?;
        if let Some(max) = self.redis_proxy_max_frame_bytes {
            anyhow::ensure!(
                max >= 1 << 20,
                "--redis-proxy-max-frame-bytes {max}: at least 1048576 (1 MiB); Argo CD's cached values need more"
            );
        }
        if let Some(c) = self.redis_compression_type.as_deref().filter(|c| !c.is_empty()) {
            anyhow::ensure!(c == "gzip" || c == "none", "--redis-compression-type {c:?}: use gzip or none");
        }
        anyhow::ensure!(
            !(self.redis_ca_path.is_some() && self.redis_tls_insecure == Some(true)),
            "--redis-ca-path and --redis-tls-insecure: only one way of checking the hub Redis's certificate"
        );
        anyhow::ensure!(
            self.redis_creds_dir_path.as_deref().is_none_or(str::is_empty)
                || self.redis_password.as_deref().is_none_or(str::is_empty),
            "--redis-creds-dir-path cannot be combined with --redis-password (as upstream)"
        );
        let mut notes = Vec::new();
        if self.cluster_info_address().is_none()
            && (self.redis_password.is_some() || self.redis_creds_dir_path.is_some())
        {
            notes.push(
                "--redis-password/--redis-creds-dir-path have no effect without --redis-server-address: the principal \
                 writes no cluster info then"
                    .to_owned(),
            );
        }
        Ok(notes)
    }

    /// The hub's Redis the agents' cluster info is written to: `--redis-server-address`, or
    /// upstream's default when the Redis proxy is served without it. `None`: none is written.
    fn cluster_info_address(&self) -> Option<String> {
        match self.redis_server_address.as_deref().filter(|a| !a.is_empty()) {
            Some(address) => Some(address.to_owned()),
            None => self.enabled().then(|| DEFAULT_REDIS.to_owned()),
        }
    }

    /// The hub Redis's user and password: `--redis-password`, or the files of
    /// `--redis-creds-dir-path` (upstream's principal reads only `auth`; an `auth_username`
    /// is used too, as Argo CD's own clients use it).
    fn credentials(&self) -> anyhow::Result<(Option<String>, Option<String>)> {
        let Some(dir) = self.redis_creds_dir_path.as_deref().filter(|d| !d.is_empty()) else {
            return Ok((None, self.redis_password.clone().filter(|p| !p.is_empty())));
        };
        let dir = std::path::Path::new(dir);
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).map(|s| s.trim().to_owned());
        let password = read("auth").with_context(|| format!("--redis-creds-dir-path {}: auth", dir.display()))?;
        let username = read("auth_username").ok().filter(|u| !u.is_empty());
        Ok((username, Some(password)))
    }

    /// How the hub Redis's certificate is checked (`--redis-tls-enabled`); `None`: plaintext.
    async fn hub_tls(&self, secrets: &Secrets) -> anyhow::Result<Option<principal::HubRedisTls>> {
        if self.redis_tls_enabled != Some(true) {
            return Ok(None);
        }
        if self.redis_tls_insecure == Some(true) {
            return Ok(Some(principal::HubRedisTls::Insecure));
        }
        let ca = pem_from(
            self.redis_ca_path.as_deref(),
            "--redis-ca-path",
            secrets,
            &self.redis_ca_secret_name,
            &["ca.crt"],
            "--redis-ca-secret-name",
        )
        .await?;
        Ok(Some(principal::HubRedisTls::Ca(ca)))
    }
}

/// Starts writing the agents' cluster info into the hub's Argo CD Redis (upstream's cluster
/// manager cache), when the flags name that Redis; `hub_tls`: how its certificate is checked
/// ([`PrincipalRedis::hub_tls`], read once for this and the Redis proxy).
///
/// # Errors
/// The credentials cannot be read, or the Redis client cannot be built.
fn write_cluster_info(
    flags: &PrincipalRedis,
    hub_tls: Option<principal::HubRedisTls>,
    principal: &principal::Principal,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let Some(address) = flags.cluster_info_address() else {
        tracing::info!(
            "agents' cluster info is not written to the hub's Argo CD Redis: set --redis-server-address \
             (docs/configuration.md)"
        );
        return Ok(());
    };
    let mut config = principal::ClusterInfoConfig::new(address);
    (config.username, config.password) = flags.credentials()?;
    config.tls = hub_tls;
    config.gzip = flags.redis_compression_type.as_deref().is_none_or(|c| c.is_empty() || c == "gzip");
    let writer = principal.cluster_info_writer(config)?;
    tokio::spawn(writer.run(cancel.clone()));
    Ok(())
}

/// TLS settings the principal's listener shares with the Redis proxy's.
#[derive(Debug)]
pub struct ListenerTls {
    /// Versions and cipher suites.
    pub policy: auth::tls_policy::TlsPolicy,
    /// How often the certificate is read again (`None`: once).
    pub reload_every: Option<std::time::Duration>,
}

/// Starts the Redis proxy when the flags say so (see [`PrincipalRedis::enabled`]), holding at
/// most `connections` client connections with their timeouts.
///
/// # Errors
/// The TLS material cannot be read, or the address cannot be listened on.
pub async fn serve_principal(
    flags: &PrincipalRedis,
    tls: ListenerTls,
    connections: principal::transport::limits::ListenerLimits,
    secrets: &Secrets,
    principal: &principal::Principal,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    // The hub Redis's CA (a file or a Secret), read once for the cluster info and the proxy.
    // (`cluster_info_address` is set whenever the proxy is served.)
    let hub_tls = if flags.cluster_info_address().is_some() {
        flags.hub_tls(secrets).await.context("--redis-tls-enabled: the hub Redis's CA")?
    } else {
        None
    };
    write_cluster_info(flags, hub_tls.clone(), principal, cancel)?;
    if !flags.enabled() {
        if flags.redis_server_address.is_none() && flags.disable_redis_proxy.is_none() {
            tracing::info!(
                "the Redis proxy is not served: set --redis-server-address (the hub's Redis, e.g. {DEFAULT_REDIS}) to \
                 serve it (docs/live-resources.md)"
            );
        }
        return Ok(());
    }
    let upstream = flags.redis_server_address.clone().filter(|a| !a.is_empty()).unwrap_or_else(|| DEFAULT_REDIS.into());
    let mut config = principal::RedisProxyConfig::new(&upstream);
    config.request_timeout = flags.timeout()?;
    config.max_in_flight_per_agent = flags.redis_proxy_max_in_flight.max(1) as usize;
    config.connections = connections;
    if let Some(max) = flags.redis_proxy_max_frame_bytes {
        config.limits.max_frame_bytes = max;
    }
    let listener_tls = if let Some(hub_tls) = hub_tls {
        config.upstream_tls = Some(match hub_tls {
            principal::HubRedisTls::Insecure => {
                tracing::warn!("the hub Redis's certificate is not verified (--redis-tls-insecure)");
                principal::UpstreamTls::insecure()?
            }
            principal::HubRedisTls::Ca(ca) => {
                principal::UpstreamTls::with_ca(&ca).context("--redis-ca-path/--redis-ca-secret-name")?
            }
        });
        Some(reloading_listener_tls(flags, tls, secrets, cancel).await?)
    } else {
        None
    };
    let addr = &flags.redis_proxy_listen_address;
    let listener = tokio::net::TcpListener::bind(addr.as_str())
        .await
        .with_context(|| format!("cannot listen on {addr} (--redis-proxy-listen-address)"))?;
    let local = listener.local_addr().context("Redis proxy address")?;
    println!("redis proxy listening on {local}");
    tracing::info!(addr = %local, %upstream, tls = listener_tls.is_some(), "redis proxy listening");
    tokio::spawn(principal.redis_proxy(config).serve(listener, listener_tls, cancel.clone()));
    Ok(())
}

/// The proxy's server certificate and key, from the files or the secret.
async fn listener_material(flags: &PrincipalRedis, secrets: &Secrets) -> anyhow::Result<Vec<String>> {
    let (cert, key) = key_pair(
        (flags.redis_proxy_server_tls_cert.as_deref(), "--redis-proxy-server-tls-cert"),
        (flags.redis_proxy_server_tls_key.as_deref(), "--redis-proxy-server-tls-key"),
        secrets,
        &flags.redis_proxy_server_tls_secret_name,
        "--redis-proxy-server-tls-secret-name",
    )
    .await?;
    Ok(vec![cert, key])
}

/// A server configuration for Redis clients: no client certificates, no ALPN.
fn listener_config(
    policy: &auth::tls_policy::TlsPolicy,
    material: &[String],
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let [cert, key] = material else { anyhow::bail!("certificate and key expected") };
    let settings = auth::tls::ServerTlsSettings {
        cert_chain: crate::material::certificates(cert, "the Redis proxy's certificate file or secret")?,
        key: crate::material::private_key(key, "the Redis proxy's key")?,
        client_ca: None,
        require_client_cert: false,
        policy: policy.clone(),
    };
    let config = auth::tls::server_config(settings).context("cannot build the Redis proxy's TLS configuration")?;
    let mut config = Arc::unwrap_or_clone(config);
    // Redis clients offer no ALPN; the gRPC listener's h2 would refuse one that offers another.
    config.alpn_protocols.clear();
    Ok(Arc::new(config))
}

async fn reloading_listener_tls(
    flags: &PrincipalRedis,
    tls: ListenerTls,
    secrets: &Secrets,
    cancel: &CancellationToken,
) -> anyhow::Result<tokio::sync::watch::Receiver<Arc<rustls::ServerConfig>>> {
    let material =
        listener_material(flags, secrets).await.context("--redis-tls-enabled: the Redis proxy's certificate")?;
    let policy = tls.policy;
    let initial = listener_config(&policy, &material)?;
    let load = {
        let (flags, secrets) = (flags.clone(), secrets.clone());
        move || {
            let (flags, secrets) = (flags.clone(), secrets.clone());
            async move { listener_material(&flags, &secrets).await }
        }
    };
    let build = move |m: &[String]| listener_config(&policy, m);
    Ok(crate::runtime::reload::spawn(
        "redis proxy TLS",
        tls.reload_every,
        material,
        initial,
        load,
        build,
        cancel.clone(),
    ))
}

/// The agent's Redis flags (upstream `--redis-addr` and friends).
#[derive(Debug, Clone, clap::Args)]
pub struct AgentRedis {
    /// This cluster's Argo CD Redis (host:port), read for the principal's Redis proxy.
    #[arg(long, env = "REDIS_ADDR", default_value = DEFAULT_REDIS)]
    pub redis_addr: String,
    /// ACL user name for it.
    #[arg(long, env = "REDIS_USERNAME")]
    pub redis_username: Option<String>,
    /// Password for it.
    #[arg(long, env = "REDIS_PASSWORD", hide_env_values = true)]
    pub redis_password: Option<String>,
    /// Directory with the credentials instead: files `auth` (password) and optional
    /// `auth_username`.
    #[arg(long, env = "REDIS_CREDS_DIR_PATH")]
    pub redis_creds_dir_path: Option<PathBuf>,
    /// TLS to it.
    #[arg(long, env = "ARGOCD_AGENT_REDIS_TLS_ENABLED")]
    pub redis_tls_enabled: Option<bool>,
    /// CA file that issued its certificate (instead of the secret).
    #[arg(long, env = "ARGOCD_AGENT_REDIS_TLS_CA_PATH")]
    pub redis_tls_ca_path: Option<PathBuf>,
    /// Secret holding the CA that issued its certificate (ca.crt).
    #[arg(long, env = "ARGOCD_AGENT_REDIS_TLS_CA_SECRET_NAME", default_value = "argocd-redis-tls")]
    pub redis_tls_ca_secret_name: String,
    /// Do not verify its certificate (encrypted, not authenticated).
    #[arg(long, env = "ARGOCD_AGENT_REDIS_TLS_INSECURE")]
    pub redis_tls_insecure: Option<bool>,
}

impl AgentRedis {
    /// Checks the flags.
    ///
    /// # Errors
    /// Credentials given two ways, or two CA modes at once.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.redis_addr.is_empty(), "--redis-addr is empty");
        anyhow::ensure!(
            self.redis_creds_dir_path.is_none() || (self.redis_username.is_none() && self.redis_password.is_none()),
            "--redis-creds-dir-path cannot be combined with --redis-username or --redis-password (as upstream)"
        );
        anyhow::ensure!(
            !(self.redis_tls_ca_path.is_some() && self.redis_tls_insecure == Some(true)),
            "--redis-tls-ca-path and --redis-tls-insecure: only one way of checking the Redis certificate"
        );
        Ok(())
    }

    /// The agent's Redis configuration; the TLS CA is read from its file or secret.
    ///
    /// # Errors
    /// The credentials directory, the CA file or the secret cannot be read.
    pub async fn config(&self, secrets: &Secrets) -> anyhow::Result<agent::redis::RedisConfig> {
        self.check()?;
        let (mut username, mut password) = (self.redis_username.clone(), self.redis_password.clone());
        if let Some(dir) = &self.redis_creds_dir_path {
            let read = |name: &str| {
                std::fs::read_to_string(dir.join(name)).map(|s| s.trim_end_matches(['\r', '\n']).to_owned())
            };
            password = Some(read("auth").with_context(|| format!("--redis-creds-dir-path {}: auth", dir.display()))?);
            username = read("auth_username").ok().filter(|u| !u.is_empty());
        }
        let tls = match (self.redis_tls_enabled == Some(true), self.redis_tls_insecure == Some(true)) {
            (false, _) => None,
            (true, true) => Some(agent::redis::RedisTls::Insecure),
            (true, false) => Some(agent::redis::RedisTls::Ca(match &self.redis_tls_ca_path {
                Some(path) => read_pem(path, "--redis-tls-ca-path")?,
                None => {
                    crate::material::secret_field(
                        secrets,
                        &self.redis_tls_ca_secret_name,
                        &["ca.crt"],
                        "--redis-tls-ca-secret-name",
                    )
                    .await?
                }
            })),
        };
        let config = agent::redis::RedisConfig { address: self.redis_addr.clone(), username, password, tls };
        config.client().context("--redis-addr")?;
        Ok(config)
    }
}
