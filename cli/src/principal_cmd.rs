//! `argocd-agent principal`: flags and environment variables with upstream's names and defaults.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::ctl::kube::Secrets;
use crate::material::{VERSION, key_pair, pem_from, secret_field};
use crate::unsupported::Unsupported;

mod ha;

/// Requests the principal has in flight against the hub API server at most (its few watches
/// included). Status writes from thousands of agents queue here instead of opening a
/// connection each: the storm bench saw ~1,500 pooled hub connections after 1,000 agents
/// connected at once, before this bound (docs/performance.md).
const HUB_MAX_IN_FLIGHT: usize = 64;

/// Flags of `argocd-agent principal` (upstream `cmd/argocd-agent/principal.go`).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Logs, traces, the metrics and health endpoints (the runtime kit shared with the other server).
    #[command(flatten)]
    pub runtime: crate::runtime::PrincipalRuntime,
    /// Address to listen on (empty: all addresses).
    #[arg(long, env = "ARGOCD_PRINCIPAL_LISTEN_HOST", default_value = "")]
    pub listen_host: String,
    /// Port of the gRPC server.
    #[arg(long, env = "ARGOCD_PRINCIPAL_LISTEN_PORT", default_value_t = 8443)]
    pub listen_port: u16,
    /// Namespace the principal keeps its own state in (required).
    #[arg(short = 'n', long, env = "ARGOCD_PRINCIPAL_NAMESPACE", default_value = "")]
    pub namespace: String,
    /// Namespaces (globs) agents' Applications may live in on the hub.
    #[arg(long, env = "ARGOCD_PRINCIPAL_ALLOWED_NAMESPACES", value_delimiter = ',')]
    pub allowed_namespaces: Vec<String>,
    /// Create an agent's namespace on the hub when it first connects.
    #[arg(long, env = "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_ENABLE", default_value_t = false)]
    pub namespace_create_enable: bool,
    /// Secret holding the gRPC server certificate.
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_SECRET_NAME", default_value = "argocd-agent-principal-tls")]
    pub tls_secret_name: String,
    /// Server certificate file (instead of the secret).
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_SERVER_CERT_PATH")]
    pub tls_cert: Option<PathBuf>,
    /// Server key file (instead of the secret).
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_SERVER_KEY_PATH")]
    pub tls_key: Option<PathBuf>,
    /// Generate a self-signed server certificate (testing only).
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_SERVER_ALLOW_GENERATE", default_value_t = false)]
    pub insecure_tls_generate: bool,
    /// Serve plaintext gRPC (behind a mesh sidecar on loopback, or tests).
    #[arg(long, env = "ARGOCD_PRINCIPAL_INSECURE_PLAINTEXT", default_value_t = false)]
    pub insecure_plaintext: bool,
    /// Secret holding the CA that issues agent client certificates.
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_SERVER_ROOT_CA_SECRET_NAME", default_value = "argocd-agent-ca")]
    pub tls_ca_secret_name: String,
    /// CA file (instead of the secret).
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_SERVER_ROOT_CA_PATH")]
    pub root_ca_path: Option<PathBuf>,
    /// Refuse the TLS handshake of a client without a certificate issued by the CA (with --auth
    /// mtls a certificate is needed anyway; the auth layer then refuses with a gRPC status).
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_CLIENT_CERT_REQUIRE", default_value_t = false)]
    pub require_client_certs: bool,
    /// Every call's client certificate CN must be the calling agent's name (whatever --auth
    /// identified it by, e.g. spiffe:jwt over TLS); not checked on a plaintext listener, as
    /// upstream.
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_CLIENT_CERT_MATCH_SUBJECT", default_value_t = false)]
    pub client_cert_subject_match: bool,
    /// Lowest TLS version (tls1.1, tls1.2 or tls1.3; TLS 1.2 is the lowest ever negotiated).
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_MIN_VERSION", default_value = "tls1.3")]
    pub tls_min_version: String,
    /// Highest TLS version (tls1.2 or tls1.3; default: the highest offered).
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_MAX_VERSION")]
    pub tls_max_version: Option<String>,
    /// Cipher suites allowed, by Go's names (comma-separated); `list` prints them and exits.
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_CIPHERSUITES", value_delimiter = ',')]
    pub tls_ciphersuites: Vec<String>,
    /// Periodic resyncs of one agent (its --resync-interval) closer together than this are not
    /// answered (e.g. 30s; 0: every one is).
    #[arg(long, env = "ARGOCD_PRINCIPAL_RESYNC_MIN_INTERVAL", default_value = "30s")]
    pub resync_min_interval: String,
    /// How often the server certificate, key and CA (files or Secrets) are read again; a change
    /// reaches new connections without a restart, live streams stay (0: read once, at start).
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_RELOAD_INTERVAL", default_value = crate::runtime::reload::DEFAULT_INTERVAL)]
    pub tls_reload_interval: String,
    /// Version handshake on Authenticate: `compatible` (our agents and upstream agent releases
    /// from --min-agent-version on), `exact` (upstream's rule: equal to ours) or `skip`.
    #[arg(long, env = "ARGOCD_PRINCIPAL_AGENT_VERSION_CHECK", default_value = "compatible")]
    pub agent_version_check: String,
    /// Oldest upstream agent release accepted by `--agent-version-check=compatible`.
    #[arg(long, env = "ARGOCD_PRINCIPAL_MIN_AGENT_VERSION", default_value_t = auth::DEFAULT_MIN_AGENT_VERSION.to_string())]
    pub min_agent_version: String,
    /// Secret holding the JWT signing key.
    #[arg(long, env = "ARGOCD_PRINCIPAL_JWT_SECRET_NAME", default_value = "argocd-agent-jwt")]
    pub jwt_secret_name: String,
    /// JWT signing key file (instead of the secret).
    #[arg(long, env = "ARGOCD_PRINCIPAL_JWT_KEY_PATH")]
    pub jwt_key: Option<PathBuf>,
    /// Generate a JWT signing key when none exists (testing only).
    #[arg(long, env = "ARGOCD_PRINCIPAL_JWT_ALLOW_GENERATE", default_value_t = false)]
    pub insecure_jwt_generate: bool,
    /// Authentication method(s), e.g. `mtls:subject:CN=([^,]+)`.
    #[arg(long, env = "ARGOCD_PRINCIPAL_AUTH", default_value = "")]
    pub auth: String,
    /// Largest gRPC message in bytes.
    #[arg(long, env = "ARGOCD_PRINCIPAL_GRPC_MAX_MESSAGE_SIZE", default_value_t = 209_715_200)]
    pub grpc_max_message_size: usize,
    /// Longest a TLS handshake may take on the principal's listeners (agents' gRPC, resource
    /// proxy, Redis proxy).
    #[arg(long, env = "ARGOCD_PRINCIPAL_HANDSHAKE_TIMEOUT", default_value = "10s")]
    pub handshake_timeout: String,
    /// Connections the agents' gRPC listener holds at once, a quarter of them unauthenticated
    /// (in their handshake, or without the client certificate --auth needs); more are closed as
    /// they come (0: half the open-file limit).
    #[arg(long, env = "ARGOCD_PRINCIPAL_GRPC_MAX_CONNECTIONS", default_value_t = 0)]
    pub grpc_max_connections: usize,
    /// `Authenticate` calls signing their tokens at once (0: one per core). More wait in a
    /// queue of --auth-signing-queue; beyond it they are refused with RESOURCE_EXHAUSTED and a
    /// retry hint (`grpc-retry-pushback-ms`) the agent waits, so a login storm is admitted at
    /// the rate the key signs.
    #[arg(long, env = "ARGOCD_PRINCIPAL_AUTH_SIGNING_CONCURRENCY", default_value_t = 0)]
    pub auth_signing_concurrency: usize,
    /// `Authenticate` calls that may wait for a signing slot (see --auth-signing-concurrency).
    #[arg(long, env = "ARGOCD_PRINCIPAL_AUTH_SIGNING_QUEUE", default_value_t = auth::admission::DEFAULT_SIGNING_QUEUE)]
    pub auth_signing_queue: usize,
    /// How long an access token lives (upstream's: 5m; 1m to 1h). Every refresh signs a new
    /// one, so what a fleet costs in signing, once logged in, is its size over this lifetime:
    /// 100,000 agents refresh ~370 times a second at 5m, about two cores of RSA-4096. Tokens
    /// are bound to the agent's transport identity, and the blocklist refuses a listed agent's
    /// token whatever its expiry (docs/security.md).
    #[arg(long, env = "ARGOCD_PRINCIPAL_ACCESS_TOKEN_LIFETIME", default_value = "5m")]
    pub access_token_lifetime: String,
    /// Connections the resource proxy and the Redis proxy hold at once, each (a quarter of
    /// them unauthenticated); at most an eighth (Redis: a sixteenth) of the open-file limit.
    #[arg(long, env = "ARGOCD_PRINCIPAL_PROXY_MAX_CONNECTIONS", default_value_t = 1024)]
    pub proxy_max_connections: usize,
    /// Share the agents with the other replicas of this hub: each agent is owned by one
    /// replica at a time through a Lease in --namespace, and only its owner writes the hub for
    /// it (docs/ha.md). Off: a lone principal.
    #[arg(long, env = "ARGOCD_PRINCIPAL_AGENT_LEASES", default_value_t = false)]
    pub agent_leases: bool,
    /// This replica's name among the hub's replicas (--agent-leases): the holder of its Leases.
    /// Default: $POD_NAME, else the host name.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REPLICA_NAME")]
    pub replica_name: Option<String>,
    /// Among replicas (--agent-leases): the host or IP at which the other replicas reach this
    /// replica's resource proxy (its port is the one the proxy listens on). Published on the
    /// replica's Lease; a replica that does not own an agent forwards the agent's resource-proxy
    /// requests there. Default: $POD_IP. Unset: this replica's agents are reached only through it.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REPLICA_PROXY_HOST")]
    pub replica_proxy_host: Option<String>,
    /// Among replicas: the name the other replicas' resource-proxy certificates are verified for
    /// when forwarding to them. Default: the host of --resource-proxy-address.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REPLICA_PROXY_SERVER_NAME")]
    pub replica_proxy_server_name: Option<String>,
    /// Among replicas: the Secret (tls.crt, tls.key, ca.crt) holding the client certificate a
    /// replica presents when it forwards a resource-proxy request to the replica that owns the
    /// agent (`argocd-agentctl pki issue replica`: subject OU argocd-agent-principal-replica).
    /// Missing: requests for agents of other replicas are answered 502 naming the owner.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REPLICA_CLIENT_CERT_SECRET",
        default_value = "argocd-agent-replica-client-tls"
    )]
    pub replica_client_cert_secret: String,
    /// How long a replica's Lease lasts without renewal (--agent-leases); it renews every third
    /// of it and stops writing for its agents two thirds of it after its last renewal.
    #[arg(long, env = "ARGOCD_PRINCIPAL_AGENT_LEASE_DURATION", default_value = "15s")]
    pub agent_lease_duration: String,
    /// How long an agent's metric series outlive its last stream (e.g. 15m; 0: removed as soon
    /// as it disconnects).
    #[arg(long, env = "ARGOCD_PRINCIPAL_METRICS_AGENT_RETENTION", default_value = "15m")]
    pub metrics_agent_retention: String,
    /// kubeconfig of the hub (default: in-cluster or $KUBECONFIG).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context.
    #[arg(long)]
    pub kubecontext: Option<String>,

    // --- more of upstream's flags (the few without effect here say so) ---
    /// With --namespace-create-enable: only agents whose name matches this regular expression
    /// get a namespace created.
    #[arg(long, env = "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_PATTERN")]
    pub namespace_create_pattern: Option<String>,
    /// With --namespace-create-enable: labels (key=value, comma-separated) of created namespaces.
    #[arg(long, env = "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_LABELS", value_delimiter = ',')]
    pub namespace_create_labels: Vec<String>,
    /// Serve the resource proxy (live resources for the hub's Argo CD; docs/live-resources.md).
    /// Unset: served when its TLS material exists, with a warning when it does not; true: the
    /// material is required; false: not served.
    #[arg(long, env = "ARGOCD_PRINCIPAL_ENABLE_RESOURCE_PROXY")]
    pub enable_resource_proxy: Option<bool>,
    /// Secret holding the resource proxy's server certificate (tls.crt, tls.key).
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_SECRET_NAME",
        default_value = "argocd-agent-resource-proxy-tls"
    )]
    pub resource_proxy_secret_name: String,
    /// Resource proxy server certificate file (instead of the secret).
    #[arg(long, env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CERT_PATH")]
    pub resource_proxy_cert_path: Option<PathBuf>,
    /// Resource proxy server key file (instead of the secret).
    #[arg(long, env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_KEY_PATH")]
    pub resource_proxy_key_path: Option<PathBuf>,
    /// Secret holding the CA that issues the client certificates of the proxy's callers (the
    /// agents' cluster secrets).
    #[arg(long, env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_CA_SECRET_NAME", default_value = "argocd-agent-ca")]
    pub resource_proxy_ca_secret_name: String,
    /// Resource proxy client CA file (instead of the secret).
    #[arg(long, env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CA_PATH")]
    pub resource_proxy_ca_path: Option<PathBuf>,
    /// Where the resource proxy listens (upstream: always 0.0.0.0:9090).
    #[arg(long, env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_LISTEN_ADDRESS", default_value = "0.0.0.0:9090")]
    pub resource_proxy_listen_address: String,
    /// The resource proxy's address as Argo CD reaches it: the server URL of self-registered
    /// cluster secrets.
    #[arg(long, env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_ADDRESS", default_value = "argocd-agent-resource-proxy:9090")]
    pub resource_proxy_address: String,
    /// How long a proxied request waits for the agent's answer before 504.
    #[arg(long, env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TIMEOUT", default_value = "30s")]
    pub resource_proxy_timeout: String,
    /// Proxied requests of one agent in flight at once; more are answered 429.
    #[arg(long, env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_MAX_IN_FLIGHT", default_value_t = 64)]
    pub resource_proxy_max_in_flight: u32,
    /// Accept at the resource proxy only client certificates marked as its callers' (subject OU
    /// argocd-agent-resource-proxy-client, as `argocd-agentctl agent create` and `pki issue
    /// shared-client` issue them), so an agent's own client certificate does not open it. False
    /// accepts any certificate of the CA (certificates issued before the mark, or by upstream's
    /// argocd-agentctl).
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_REQUIRE_CLIENT_MARK",
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub resource_proxy_require_client_mark: bool,
    /// Also take gRPC over WebSocket on HTTP/1.1 on the agents' port (upstream's grpc-http1
    /// framing), for agents behind proxies that pass only HTTP/1.1; native HTTP/2 keeps working.
    #[arg(long, env = "ARGOCD_PRINCIPAL_ENABLE_WEBSOCKET")]
    pub enable_websocket: Option<bool>,
    /// The Redis proxy (docs/live-resources.md).
    #[command(flatten)]
    pub redis: crate::redis_proxy::PrincipalRedis,
    /// Managed agents get the hub Applications whose spec.destination.name is their name, from
    /// the principal's namespace and every namespace --allowed-namespaces covers (the agents
    /// need --destination-based-mapping too); autonomous agents keep namespace mapping.
    #[arg(long, env = "ARGOCD_PRINCIPAL_DESTINATION_BASED_MAPPING")]
    pub destination_based_mapping: Option<bool>,
    /// Only hub Applications, AppProjects, repository secrets and the GPG keys ConfigMap with
    /// matching labels go to managed agents (Kubernetes selector syntax, e.g. `team=a`).
    #[arg(long, env = "ARGOCD_PRINCIPAL_LABEL_SELECTOR")]
    pub label_selector: Option<String>,
    /// Create a cluster secret for the hub's Argo CD when an agent authenticates (server: the
    /// resource proxy at --resource-proxy-address; credentials: a resource-proxy bearer token and
    /// the shared client certificate of --self-registration-client-cert-secret). Needs the
    /// resource proxy.
    #[arg(long, env = "ARGOCD_PRINCIPAL_ENABLE_SELF_CLUSTER_REGISTRATION")]
    pub enable_self_cluster_registration: Option<bool>,
    /// With --enable-self-cluster-registration: the Secret (tls.crt, tls.key, ca.crt) holding the
    /// client certificate self-registered cluster secrets carry.
    #[arg(long, env = "ARGOCD_PRINCIPAL_SELF_REGISTRATION_CLIENT_CERT_SECRET")]
    pub self_registration_client_cert_secret: Option<String>,
    /// Accepted, no effect: the HTTP/2 server here has no client PING-rate policy to set.
    #[arg(long, env = "ARGOCD_PRINCIPAL_KEEP_ALIVE_MIN_INTERVAL")]
    pub keepalive_min_interval: Option<String>,
    /// At most this many events are applied to the hub at once, across all agents; unset or 0:
    /// no limit.
    #[arg(long, env = "ARGOCD_PRINCIPAL_EVENT_PROCESSORS")]
    pub event_processors: Option<u32>,
    /// At most this many of one agent's events are applied at once: the events of different
    /// Applications run side by side, one Application's in order, and everything else (projects,
    /// resync requests) one at a time in order. 1: one event at a time per agent, as upstream.
    #[arg(long, env = "ARGOCD_PRINCIPAL_AGENT_EVENT_CONCURRENCY",
        default_value_t = principal::config::DEFAULT_AGENT_EVENT_CONCURRENCY as u32,
        value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub agent_event_concurrency: u32,
    /// Cross-hub disaster recovery (`--ha-*`, upstream's active/passive pair; docs/ha.md).
    #[command(flatten)]
    pub ha: ha::HaArgs,
    /// Upstream v0.10's SPIRE flags, and the JWT-SVID session binding (crate::spire).
    #[command(flatten)]
    pub spire: crate::spire::PrincipalSpire,
    /// Upstream's flags of features not here yet (none at the moment).
    #[command(flatten)]
    pub upstream: crate::upstream_only::PrincipalOnly,
}

impl Args {
    /// `--tls-min-version`, `--tls-max-version` and `--tls-ciphersuites`.
    ///
    /// # Errors
    /// A version or suite name is unknown, or nothing is left to negotiate.
    pub fn tls_policy(&self) -> anyhow::Result<auth::tls_policy::TlsPolicy> {
        crate::tls::policy(&self.tls_min_version, self.tls_max_version.as_deref(), &self.tls_ciphersuites)
    }
}

impl Args {
    /// `--access-token-lifetime` with upstream's other token lifetimes.
    fn token_lifetimes(&self) -> anyhow::Result<auth::TokenLifetimes> {
        let flag = || format!("--access-token-lifetime {:?}", self.access_token_lifetime);
        let lifetime = crate::flags::parse_duration(&self.access_token_lifetime).with_context(flag)?;
        auth::TokenLifetimes::with_access(lifetime).with_context(flag)
    }

    /// `--handshake-timeout` with the runtime kit's connection timeouts.
    fn timeouts(&self) -> anyhow::Result<principal::transport::limits::Timeouts> {
        let handshake = crate::flags::parse_duration(&self.handshake_timeout)
            .with_context(|| format!("--handshake-timeout {:?}", self.handshake_timeout))?;
        anyhow::ensure!(
            !handshake.is_zero(),
            "--handshake-timeout {:?}: must be above zero (e.g. 10s)",
            self.handshake_timeout
        );
        self.runtime.kit().timeouts(handshake)
    }

    /// How many connections `listener` holds (`--grpc-max-connections`,
    /// `--proxy-max-connections`, each at most its share of the open-file limit) and their
    /// timeouts.
    fn listener_limits(
        &self,
        listener: principal::transport::limits::Listener,
    ) -> anyhow::Result<principal::transport::limits::ListenerLimits> {
        use principal::transport::limits::{Listener, ListenerLimits, cap, open_file_limit};
        let requested = match listener {
            Listener::Agents => self.grpc_max_connections,
            Listener::ResourceProxy | Listener::RedisProxy => self.proxy_max_connections,
            Listener::Endpoint => 0,
        };
        Ok(ListenerLimits::new(cap(listener, Some(requested), open_file_limit()), self.timeouts()?))
    }
}

/// `--agent-version-check` and `--min-agent-version`.
fn version_check(args: &Args) -> anyhow::Result<auth::VersionCheck> {
    Ok(match args.agent_version_check.as_str() {
        "compatible" => {
            auth::VersionCheck::Compatible { min: args.min_agent_version.parse().context("--min-agent-version")? }
        }
        "exact" => auth::VersionCheck::Exact,
        "skip" => auth::VersionCheck::Skip,
        other => anyhow::bail!("--agent-version-check {other:?}: use compatible, exact or skip"),
    })
}

impl Args {
    /// Upstream knobs that have no counterpart here: checked as upstream would, then a warning
    /// each saying why it changes nothing.
    ///
    /// # Errors
    /// A value upstream would refuse.
    pub fn notes(&self) -> anyhow::Result<Vec<String>> {
        let mut notes = Vec::new();
        if let Some(v) = self.keepalive_min_interval.as_deref() {
            let d = crate::flags::parse_duration(v).with_context(|| format!("--keepalive-min-interval {v:?}"))?;
            if !d.is_zero() {
                notes.push("--keepalive-min-interval has no effect here: the HTTP/2 server has no policy on how often clients may PING (agents' keepalive and heartbeats are accepted at any rate)".to_owned());
            }
        }
        notes.extend(self.runtime.kit().debug_knob_notes("principal::service")?);
        notes.extend(self.redis.check()?);
        Ok(notes)
    }

    /// `--namespace-create-pattern` and `--namespace-create-labels`, checked.
    ///
    /// # Errors
    /// A pattern that does not compile or a label that is not key=value, named.
    pub fn namespace_create(
        &self,
    ) -> anyhow::Result<(Option<regex::Regex>, std::collections::BTreeMap<String, String>)> {
        let pattern = self
            .namespace_create_pattern
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(|p| regex::Regex::new(p).with_context(|| format!("--namespace-create-pattern {p:?}")))
            .transpose()?;
        let labels = crate::ctl::cluster::parse_labels(&self.namespace_create_labels, "--namespace-create-labels")?;
        Ok((pattern, labels))
    }

    /// Refuse flags whose feature is not implemented yet.
    ///
    /// # Errors
    /// Names every such flag that was set.
    pub fn check_supported(&self) -> anyhow::Result<()> {
        let mut u = Unsupported::default();
        self.upstream.check(&mut u);
        u.finish("argocd-agent principal")?;
        self.notes()?;
        self.namespace_create()?;
        self.ha.plan(&self.auth, self.insecure_plaintext, self.agent_leases)?;
        self.tls_policy()?;
        crate::runtime::reload::interval(&self.tls_reload_interval)?;
        self.resource_proxy_timeout()?;
        self.timeouts()?;
        self.token_lifetimes()?;
        self.self_registration_secret()?;
        crate::flags::parse_duration(&self.resync_min_interval)
            .with_context(|| format!("--resync-min-interval {:?}", self.resync_min_interval))?;
        crate::flags::label_selector(self.label_selector.as_deref())?;
        if self.namespace.is_empty() {
            anyhow::bail!("argocd-agent principal: --namespace (ARGOCD_PRINCIPAL_NAMESPACE) is required");
        }
        version_check(self)?;
        // --auth, or upstream's default with --spire-agent-socket and --spire-auth-method.
        self.spire.auth_spec(&self.auth, self.insecure_plaintext)?;
        Ok(())
    }
}

/// Run the principal until SIGINT or SIGTERM (or the parent's exit, see [`crate::runtime::signals`]).
///
/// # Errors
/// Flags, key material or the hub cannot be used, or the server fails.
pub fn run(args: Args) -> anyhow::Result<()> {
    if crate::tls::wants_cipher_list(&args.tls_ciphersuites) {
        return Ok(());
    }
    args.check_supported()?;
    args.runtime.kit().run("argocd-agent-principal", async move {
        for note in args.notes()? {
            tracing::warn!("{note}");
        }
        serve(args).await
    })
}

async fn jwt_key(args: &Args, secrets: &Secrets) -> anyhow::Result<auth::SigningKey> {
    if let Some(path) = &args.jwt_key {
        return auth::SigningKey::from_pem_file(path).with_context(|| format!("--jwt-key {}", path.display()));
    }
    match secrets.get(&args.jwt_secret_name).await? {
        Some(_) => {
            let pem = secret_field(secrets, &args.jwt_secret_name, &["jwt.key"], "--jwt-secret-name").await?;
            auth::SigningKey::from_pem(&pem)
                .with_context(|| format!("secret {}/{} field jwt.key", args.namespace, args.jwt_secret_name))
        }
        None if args.insecure_jwt_generate => {
            tracing::warn!(
                "generating an ephemeral JWT signing key (--insecure-jwt-generate): sessions end when the principal restarts"
            );
            auth::SigningKey::generate(2048).context("cannot generate a JWT signing key")
        }
        None => anyhow::bail!(
            "no JWT signing key: secret {}/{} does not exist; create it with `argocd-agentctl jwt create-key`, pass --jwt-key, or --insecure-jwt-generate for tests",
            args.namespace,
            args.jwt_secret_name
        ),
    }
}

/// The principal's two TLS listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Listener {
    /// The agents' gRPC endpoint.
    Agents,
    /// The resource proxy.
    ResourceProxy,
}

/// The server certificate, its key and the CA of `which`, as PEM, from the files or Secrets
/// the flags name.
async fn server_material(args: &Args, secrets: &Secrets, which: Listener) -> anyhow::Result<Vec<String>> {
    let (cert, key, secret, ca_path, ca_secret) = match which {
        Listener::Agents => (
            (args.tls_cert.as_deref(), "--tls-cert"),
            (args.tls_key.as_deref(), "--tls-key"),
            (args.tls_secret_name.as_str(), "--tls-secret-name"),
            (args.root_ca_path.as_deref(), "--root-ca-path"),
            (args.tls_ca_secret_name.as_str(), "--tls-ca-secret-name"),
        ),
        Listener::ResourceProxy => (
            (args.resource_proxy_cert_path.as_deref(), "--resource-proxy-cert-path"),
            (args.resource_proxy_key_path.as_deref(), "--resource-proxy-key-path"),
            (args.resource_proxy_secret_name.as_str(), "--resource-proxy-secret-name"),
            (args.resource_proxy_ca_path.as_deref(), "--resource-proxy-ca-path"),
            (args.resource_proxy_ca_secret_name.as_str(), "--resource-proxy-ca-secret-name"),
        ),
    };
    let (cert, key) = key_pair(cert, key, secrets, secret.0, secret.1).await?;
    let ca = pem_from(ca_path.0, ca_path.1, secrets, ca_secret.0, &["ca.crt", "tls.crt"], ca_secret.1).await?;
    Ok(vec![cert, key, ca])
}

/// The TLS server configuration of [`server_material`].
fn server_tls(
    policy: &auth::tls_policy::TlsPolicy,
    require_client_cert: bool,
    material: &[String],
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let [cert, key, ca] = material else { anyhow::bail!("certificate, key and CA expected") };
    let settings = auth::tls::ServerTlsSettings {
        cert_chain: crate::material::certificates(cert, "the server certificate")?,
        key: crate::material::private_key(key, "the server key")?,
        client_ca: Some(crate::material::certificates(ca, "the CA certificate")?),
        require_client_cert,
        policy: policy.clone(),
    };
    auth::tls::server_config(settings).context("cannot build the TLS server configuration")
}

/// The TLS server configuration, and from then on the one rebuilt whenever the certificate, key
/// or CA changes ([`crate::runtime::reload`]).
async fn reloading_server_tls(
    args: &Args,
    secrets: &Secrets,
    which: Listener,
    cancel: &CancellationToken,
) -> anyhow::Result<tokio::sync::watch::Receiver<Arc<rustls::ServerConfig>>> {
    let policy = args.tls_policy()?;
    let material = server_material(args, secrets, which).await?;
    // The agents' listener refuses a client without a certificate at the handshake with
    // --require-client-certs; the resource proxy answers such a client with a Status (401).
    let require = which == Listener::Agents && args.require_client_certs;
    let initial = server_tls(&policy, require, &material)?;
    let load = {
        let (args, secrets) = (args.clone(), secrets.clone());
        move || {
            let (args, secrets) = (args.clone(), secrets.clone());
            async move { server_material(&args, &secrets, which).await }
        }
    };
    let every = crate::runtime::reload::interval(&args.tls_reload_interval)?;
    let build = move |m: &[String]| server_tls(&policy, require, m);
    let what = match which {
        Listener::Agents => "principal TLS",
        Listener::ResourceProxy => "resource proxy TLS",
    };
    Ok(crate::runtime::reload::spawn(what, every, material, initial, load, build, cancel.clone()))
}

impl Args {
    /// With `--enable-self-cluster-registration`: the shared client certificate's Secret (and
    /// the resource proxy must not be off).
    fn self_registration_secret(&self) -> anyhow::Result<Option<&str>> {
        if self.enable_self_cluster_registration != Some(true) {
            return Ok(None);
        }
        if self.enable_resource_proxy == Some(false) {
            anyhow::bail!(
                "--enable-self-cluster-registration needs the resource proxy (self-registered cluster secrets point \
                 Argo CD at it): drop --enable-resource-proxy=false"
            );
        }
        match self.self_registration_client_cert_secret.as_deref().filter(|s| !s.is_empty()) {
            Some(name) => Ok(Some(name)),
            None => anyhow::bail!(
                "--enable-self-cluster-registration needs --self-registration-client-cert-secret: the Secret \
                 (tls.crt, tls.key, ca.crt) with the client certificate Argo CD presents to the resource proxy"
            ),
        }
    }

    /// `--resource-proxy-timeout`.
    fn resource_proxy_timeout(&self) -> anyhow::Result<std::time::Duration> {
        crate::flags::parse_duration(&self.resource_proxy_timeout)
            .with_context(|| format!("--resource-proxy-timeout {:?}", self.resource_proxy_timeout))
    }
}

/// The client TLS a replica forwards resource-proxy requests with (the replica client
/// certificate and the CA of `--replica-client-cert-secret`), and the name the owners'
/// resource-proxy certificates are verified for.
async fn replica_forwarding(
    args: &Args,
    secrets: &Secrets,
) -> anyhow::Result<(std::sync::Arc<rustls::ClientConfig>, rustls::pki_types::ServerName<'static>)> {
    let name = &args.replica_client_cert_secret;
    let flag = "--replica-client-cert-secret";
    let cert = crate::material::secret_field(secrets, name, &["tls.crt"], flag).await?;
    let key = crate::material::secret_field(secrets, name, &["tls.key"], flag).await?;
    let ca = crate::material::secret_field(secrets, name, &["ca.crt"], flag).await?;
    let mark = x509_ou_mark(&cert)?;
    anyhow::ensure!(
        mark,
        "secret {name} ({flag}) does not hold a replica client certificate (subject OU {}); issue it with \
         `argocd-agentctl pki issue replica`",
        auth::roles::PRINCIPAL_REPLICA_OU
    );
    let mut tls = crate::tls::client_config(&args.tls_policy()?, &ca, Some((&cert, &key)))
        .with_context(|| format!("secret {name} ({flag})"))?;
    // HTTP/1.1 to the owner's resource proxy, which tells it from HTTP/2 by the preface: no ALPN
    // (its server offers only h2, which a client offering only http/1.1 would be refused).
    if let Some(config) = std::sync::Arc::get_mut(&mut tls) {
        config.alpn_protocols.clear();
    }
    let server_name = match &args.replica_proxy_server_name {
        Some(n) => n.clone(),
        None => {
            let address = &args.resource_proxy_address;
            let host = address.rsplit_once(':').map_or(address.as_str(), |(h, _)| h);
            host.trim_start_matches('[').trim_end_matches(']').to_owned()
        }
    };
    let server_name = rustls::pki_types::ServerName::try_from(server_name.clone())
        .with_context(|| format!("--replica-proxy-server-name {server_name:?} is not a DNS name or IP address"))?;
    Ok((tls, server_name))
}

/// Whether the PEM certificate is marked as a principal replica's.
fn x509_ou_mark(cert_pem: &str) -> anyhow::Result<bool> {
    let der = crate::material::certificates(cert_pem, "the replica client certificate")?;
    Ok(der.first().is_some_and(|d| auth::roles::is_principal_replica(d)))
}

/// Starts the resource proxy as `--enable-resource-proxy` says: unset, only when its TLS
/// material can be read (a warning says why not otherwise); true, the material is required.
async fn serve_resource_proxy(
    args: &Args,
    secrets: &Secrets,
    principal: &principal::Principal,
    tokens: &auth::SessionIssuer,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    if args.enable_resource_proxy == Some(false) {
        return Ok(());
    }
    let tls = match reloading_server_tls(args, secrets, Listener::ResourceProxy, cancel).await {
        Ok(tls) => tls,
        Err(error) if args.enable_resource_proxy.is_none() && args.enable_self_cluster_registration != Some(true) => {
            tracing::warn!(
                error = format!("{error:#}"),
                "the resource proxy is not served: its TLS material cannot be read (issue it with \
                `argocd-agentctl pki issue resource-proxy`, or pass --enable-resource-proxy=false)"
            );
            return Ok(());
        }
        Err(error) => return Err(error.context("--enable-resource-proxy: the resource proxy's TLS material")),
    };
    let addr = &args.resource_proxy_listen_address;
    let listener = tokio::net::TcpListener::bind(addr.as_str())
        .await
        .with_context(|| format!("cannot listen on {addr} (--resource-proxy-listen-address)"))?;
    let local = listener.local_addr().context("resource proxy address")?;
    println!("resource proxy listening on {local}");
    tracing::info!(addr = %local, "resource proxy listening");
    // Field by field: the forwarding between replicas is set only through its method.
    let mut config = principal::ProxyConfig::default();
    config.request_timeout = args.resource_proxy_timeout()?;
    config.max_in_flight_per_agent = args.resource_proxy_max_in_flight.max(1) as usize;
    config.require_client_mark = args.resource_proxy_require_client_mark;
    config.tokens = Some(tokens.clone());
    config.connections = args.listener_limits(principal::transport::limits::Listener::ResourceProxy)?;
    let host = args.replica_proxy_host.clone().or_else(|| std::env::var("POD_IP").ok()).filter(|h| !h.is_empty());
    if args.agent_leases {
        match replica_forwarding(args, secrets).await {
            Ok((tls, name)) => config = config.forward_to_replicas(tls, name),
            Err(error) => tracing::warn!(
                error = format!("{error:#}"),
                "resource-proxy requests for agents of other replicas are not forwarded (answered 502 naming \
                 the owner): issue the replica client certificate with `argocd-agentctl pki issue replica`"
            ),
        }
    }
    let proxy = principal.resource_proxy(config);
    if args.agent_leases {
        match &host {
            Some(host) => {
                let host =
                    if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.clone() };
                proxy.publish_replica_address(format!("{host}:{}", local.port()));
            }
            None => tracing::warn!(
                "no --replica-proxy-host (or POD_IP): the other replicas cannot forward resource-proxy requests for \
                 this replica's agents to it"
            ),
        }
    }
    tokio::spawn(proxy.serve(listener, tls, cancel.clone()));
    Ok(())
}

/// Waits this long for the first SVID or JWT bundles from the SPIFFE Workload API.
const WORKLOAD_API_TIMEOUT: std::time::Duration = mesh::workload::DEFAULT_INITIAL_SYNC_TIMEOUT;

/// Starts `/metrics` and `/healthz` before anything else, so probes and scrapes answer while
/// the principal starts (503 until its hub watchers have listed the hub).
async fn observe(
    args: &Args,
    cell: &Arc<OnceLock<principal::Principal>>,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let retention = crate::flags::parse_duration(&args.metrics_agent_retention)
        .with_context(|| format!("--metrics-agent-retention {:?}", args.metrics_agent_retention))?;
    principal::metrics::global().set_agent_retention(retention);
    let render = {
        let cell = cell.clone();
        Arc::new(move || match cell.get() {
            Some(p) => p.metrics_text(),
            None => principal::metrics::global().render(None),
        })
    };
    let health = {
        let cell = cell.clone();
        Arc::new(move || match cell.get() {
            Some(p) => p.readiness(),
            None => Err("the principal is starting".to_owned()),
        })
    };
    args.runtime.kit().admin("principal", &args.listen_host, render, health, cancel).await
}

impl Args {
    /// `--agent-leases` with its replica name and duration.
    fn agent_leases(&self) -> anyhow::Result<Option<principal::lease::LeaseConfig>> {
        if !self.agent_leases {
            return Ok(None);
        }
        let duration = crate::flags::parse_duration(&self.agent_lease_duration)
            .with_context(|| format!("--agent-lease-duration {:?}", self.agent_lease_duration))?;
        anyhow::ensure!(
            duration >= std::time::Duration::from_secs(3),
            "--agent-lease-duration {:?}: at least 3s (a replica renews every third of it)",
            self.agent_lease_duration
        );
        let replica = match self.replica_name.clone().filter(|n| !n.is_empty()) {
            Some(name) => name,
            None => std::env::var("POD_NAME")
                .ok()
                .filter(|n| !n.is_empty())
                .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_owned()))
                .filter(|n| !n.is_empty())
                .context("--agent-leases needs a replica name: set --replica-name (or POD_NAME)")?,
        };
        anyhow::ensure!(
            principal::config::is_dns_label(&replica),
            "--replica-name {replica:?}: must be a DNS label (lowercase letters, digits, '-'), as a pod name is"
        );
        tracing::info!(%replica, ?duration, "sharing agents with the hub's other replicas (--agent-leases)");
        Ok(Some(principal::lease::LeaseConfig::new(replica, duration)))
    }
}

async fn serve(args: Args) -> anyhow::Result<()> {
    // Before anything announces the process, so an early SIGTERM still shuts it down cleanly.
    let mut stop = crate::runtime::signals::install();
    let observed = Arc::new(OnceLock::new());
    let observing = CancellationToken::new();
    let _stop_observing = observing.clone().drop_guard();
    observe(&args, &observed, &observing).await?;
    let spec = args.spire.auth_spec(&args.auth, args.insecure_plaintext)?;
    let spire = args.spire.spire(args.insecure_plaintext)?;
    // Header-based identity only behind a TLS-terminating sidecar on a plaintext listener, from
    // trusted hops; mTLS identity only on a TLS listener. Refuse the rest before serving.
    spec.check_listener(args.insecure_plaintext)
        .with_context(|| format!("--auth {:?} with --insecure-plaintext={}", args.auth, args.insecure_plaintext))?;
    if spec.uses_workload_api() {
        mesh::workload::resolve_endpoint(spec.workload_endpoint())
            .with_context(|| format!("--auth {:?}", args.auth))?;
    }
    let client = crate::ctl::kube::client_with_limit(
        args.kubeconfig.as_deref(),
        args.kubecontext.as_deref(),
        Some(HUB_MAX_IN_FLIGHT),
    )
    .await?;
    let secrets = Secrets::new(client.clone(), &args.namespace);
    let key = jwt_key(&args, &secrets).await?;
    // spiffe:jwt waits here for the JWT bundles; spiffe:x509 for the principal's own SVID below.
    let authenticator = spec
        .connect_authenticator(WORKLOAD_API_TIMEOUT)
        .await
        .with_context(|| format!("--auth {:?}: the SPIFFE Workload API gave no JWT bundles", args.auth))?;
    let workload_tls = if let Some(spire) = &spire {
        Some(crate::spire::principal_tls(spire, &spec, &args.tls_policy()?, WORKLOAD_API_TIMEOUT).await?)
    } else if matches!(spec, auth::AuthMethodSpec::SpiffeX509 { .. }) {
        let identity = mesh::workload::X509Identity::connect(spec.workload_endpoint(), WORKLOAD_API_TIMEOUT)
            .await
            .with_context(|| format!("--auth {:?}: no X.509-SVID from the SPIFFE Workload API", args.auth))?;
        let id = identity.spiffe_id().context("the Workload API's X.509-SVID has no SPIFFE ID")?;
        tracing::info!(spiffe_id = %id, "serving mTLS with X.509-SVIDs from the SPIFFE Workload API");
        // Any peer whose chain verifies against the bundles; the policy in the auth layer decides
        // and explains refusals in a gRPC status instead of a bare TLS alert.
        let tls = identity
            .server_config(&mesh::workload::PeerAuthorization::Any)
            .context("cannot build the SPIFFE mTLS server configuration")?;
        Some((identity, tls))
    } else {
        None
    };
    let issuer = auth::SessionIssuer::new(key).with_lifetimes(args.token_lifetimes()?);
    let sessions = auth::Sessions::new(issuer, auth::AuthMethods::single(authenticator))
        .with_principal_namespace(args.namespace.clone())
        .with_signing_limits(auth::SigningLimits {
            concurrent: match args.auth_signing_concurrency {
                0 => auth::SigningLimits::default().concurrent,
                n => n,
            },
            queue: args.auth_signing_queue,
        });

    let mut config = principal::PrincipalConfig::new(&args.namespace);
    config.allowed_namespaces = args.allowed_namespaces.clone();
    config.namespace_create_enable = args.namespace_create_enable;
    (config.namespace_create_pattern, config.namespace_create_labels) = args.namespace_create()?;
    config.event_processors = args.event_processors.map(|n| n as usize);
    config.agent_event_concurrency = args.agent_event_concurrency as usize;
    config.destination_based_mapping = args.destination_based_mapping == Some(true);
    config.client_cert_subject_match = args.client_cert_subject_match && !args.insecure_plaintext;
    config.label_selector = crate::flags::label_selector(args.label_selector.as_deref())?;
    config.resync_min_interval =
        crate::flags::parse_duration(&args.resync_min_interval).context("--resync-min-interval")?;
    if config.allowed_namespaces.is_empty() {
        // Upstream's semantics: no pattern admits no agent. Say so, since it is rarely intended.
        tracing::warn!("--allowed-namespaces is empty: no agent can connect; pass e.g. --allowed-namespaces 'agent-*'");
    }
    config.version = VERSION.to_string();
    config.agent_leases = args.agent_leases()?;
    config.keepalive = args.timeouts()?.keepalive;
    if let Some(secret) = args.self_registration_secret()? {
        config.self_registration = Some(principal::registration::SelfRegistration {
            resource_proxy_address: args.resource_proxy_address.clone(),
            client_cert_secret: secret.to_owned(),
            tokens: sessions.issuer().clone(),
        });
    }
    let max_message_bytes = config.max_message_bytes;
    let principal = principal::Principal::new(config, client, principal::auth_layer_identity())
        .await
        .context("cannot start the principal")?;
    let _ = observed.set(principal.clone());

    let cancel = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let cancel = cancel.clone();
        async move {
            stop.recv().await;
            cancel.cancel();
        }
    });
    // Cross-hub HA: the controller and its admin endpoint, before agents are served.
    if let Some(plan) = args.ha.plan(&args.auth, args.insecure_plaintext, args.agent_leases)? {
        ha::start(plan, &args, &secrets, &principal, &cancel).await?;
    }
    // Before the agents' listener announces itself: once it has, both are up.
    serve_resource_proxy(&args, &secrets, &principal, sessions.issuer(), &cancel).await?;
    let redis_tls = crate::redis_proxy::ListenerTls {
        policy: args.tls_policy()?,
        reload_every: crate::runtime::reload::interval(&args.tls_reload_interval)?,
    };
    let redis_connections = args.listener_limits(principal::transport::limits::Listener::RedisProxy)?;
    crate::redis_proxy::serve_principal(&args.redis, redis_tls, redis_connections, &secrets, &principal, &cancel)
        .await?;
    let host = if args.listen_host.is_empty() { "0.0.0.0" } else { args.listen_host.as_str() };
    // The kernel's deepest accept queue: a login storm's connections wait there, not dropped.
    let listener = principal::transport::listen::bind(host, args.listen_port)
        .await
        .with_context(|| format!("cannot listen on {host}:{} (--listen-host/--listen-port)", args.listen_port))?;
    let addr = listener.local_addr().context("listener address")?;
    let agents_limits = args.listener_limits(principal::transport::limits::Listener::Agents)?;
    tracing::info!(
        max_connections = agents_limits.max_connections,
        max_unauthenticated = agents_limits.max_unauthenticated,
        fd_limit = principal::transport::limits::open_file_limit(),
        "agents' gRPC listener bounds"
    );
    println!("principal listening on {addr}");
    tracing::info!(%addr, auth = %spec, plaintext = args.insecure_plaintext, "principal listening");

    let auth = principal::AgentAuth {
        sessions,
        config: auth::AuthServiceConfig {
            principal_version: VERSION.to_string(),
            principal_namespace: args.namespace.clone(),
            version_check: version_check(&args)?,
        },
    };
    let websocket = (args.enable_websocket == Some(true)).then(|| {
        tracing::info!("gRPC over WebSocket (HTTP/1.1) accepted on the agents' port too (--enable-websocket)");
        principal::websocket::WebSocketOptions { max_message_bytes, ..Default::default() }
    });
    let served = if args.insecure_plaintext {
        tracing::warn!(
            "serving plaintext gRPC (--insecure-plaintext): only behind a mesh sidecar on loopback, or for tests"
        );
        // Gated (TCP_NODELAY set: without it, small event frames wait for the peer's delayed ACK,
        // ~40 ms per event through a sidecar).
        let incoming = principal::transport::limits::tcp_incoming(listener, "agents' gRPC", agents_limits);
        if let Some(options) = websocket {
            principal.serve_agents(Some(auth), principal::websocket::with_websocket(incoming, options), cancel).await
        } else {
            principal.serve_agents(Some(auth), incoming, cancel).await
        }
    } else {
        // With spiffe:x509 the SVID source stays alive while serving: rotations reach new handshakes.
        let tls = match &workload_tls {
            Some((_identity, tls)) if websocket.is_some() => {
                tokio::sync::watch::channel(principal::websocket::offer_http1(tls)).1
            }
            Some((_identity, tls)) => tokio::sync::watch::channel(tls.clone()).1,
            None => {
                let tls = reloading_server_tls(&args, &secrets, Listener::Agents, &cancel).await?;
                // WebSocket clients and HTTP/1.1 proxies may offer only ALPN http/1.1.
                if websocket.is_some() { principal::websocket::offer_http1_reloading(tls) } else { tls }
            }
        };
        // A connection without a client certificate, when --auth needs one, can only be
        // refused: it counts as unauthenticated and lives for the header timeout at most.
        let certificate_required =
            matches!(spec, auth::AuthMethodSpec::Mtls { .. } | auth::AuthMethodSpec::SpiffeX509 { .. });
        let incoming = principal::transport::limits::tls_incoming(
            listener,
            tls,
            "agents' gRPC",
            agents_limits,
            certificate_required,
        );
        if let Some(options) = websocket {
            principal.serve_agents(Some(auth), principal::websocket::with_websocket(incoming, options), cancel).await
        } else {
            principal.serve_agents(Some(auth), incoming, cancel).await
        }
    };
    served.context("the gRPC server failed")
}
