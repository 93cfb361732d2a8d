//! `argocd-agent agent`: flags and environment variables with upstream's names and defaults.

use std::path::PathBuf;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::agent_creds::Creds;
use crate::ctl::kube::Secrets;
use crate::material::{VERSION, common_name, key_pair, pem_from};
use crate::unsupported::Unsupported;

/// Flags of `argocd-agent agent` (upstream `cmd/argocd-agent/agent.go`).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Logs, traces, the metrics and health endpoints (the runtime kit shared with the other server).
    #[command(flatten)]
    pub runtime: crate::runtime::AgentRuntime,
    /// Address of the principal.
    #[arg(long, env = "ARGOCD_AGENT_REMOTE_SERVER", default_value = "")]
    pub server_address: String,
    /// Port of the principal.
    #[arg(long, env = "ARGOCD_AGENT_REMOTE_PORT", default_value_t = 443)]
    pub server_port: u16,
    /// managed (the hub owns Applications) or autonomous (this cluster owns them).
    #[arg(long, env = "ARGOCD_AGENT_MODE", default_value = "autonomous", value_parser = ["managed", "autonomous"])]
    pub agent_mode: String,
    /// Namespace of Argo CD on this cluster.
    #[arg(short = 'n', long, env = "ARGOCD_AGENT_NAMESPACE", default_value = "argocd")]
    pub namespace: String,
    /// Credentials: `mtls:any` (client certificate), `header:` (behind a mesh sidecar),
    /// `spiffe:x509[:endpoint=…;principal-id=…]` or `spiffe:jwt[:audience=…;endpoint=…]` (SPIFFE
    /// Workload API); upstream's `userpass:<file>` is not supported.
    #[arg(long, env = "ARGOCD_AGENT_CREDS", default_value = "")]
    pub creds: String,
    /// Do not verify the principal's certificate (testing only).
    #[arg(long, env = "ARGOCD_AGENT_TLS_INSECURE", default_value_t = false)]
    pub insecure_tls: bool,
    /// Connect without TLS (behind a mesh sidecar on loopback, or tests).
    #[arg(long, env = "ARGOCD_AGENT_INSECURE_PLAINTEXT", default_value_t = false)]
    pub insecure_plaintext: bool,
    /// Secret holding the CA that issued the principal's certificate.
    #[arg(long, env = "ARGOCD_AGENT_TLS_ROOT_CA_SECRET_NAME", default_value = "argocd-agent-ca")]
    pub root_ca_secret_name: String,
    /// CA file (instead of the secret).
    #[arg(long, env = "ARGOCD_AGENT_TLS_ROOT_CA_PATH")]
    pub root_ca_path: Option<PathBuf>,
    /// Secret holding this agent's client certificate.
    #[arg(long, env = "ARGOCD_AGENT_TLS_SECRET_NAME", default_value = "argocd-agent-client-tls")]
    pub tls_secret_name: String,
    /// Client certificate file (instead of the secret).
    #[arg(long, env = "ARGOCD_AGENT_TLS_CLIENT_CERT_PATH")]
    pub tls_client_cert: Option<PathBuf>,
    /// Client key file (instead of the secret).
    #[arg(long, env = "ARGOCD_AGENT_TLS_CLIENT_KEY_PATH")]
    pub tls_client_key: Option<PathBuf>,
    /// Application-level heartbeat interval (e.g. 30s; 0 = off). Default: off, or the mesh
    /// profile's interval (below the sidecars' stream idle timeout) behind a mesh.
    #[arg(long, env = "ARGOCD_AGENT_HEARTBEAT_INTERVAL")]
    pub heartbeat_interval: Option<String>,
    /// The mesh whose sidecar carries the stream (istio, linkerd, envoy): turns heartbeats on at
    /// the profile's interval unless --heartbeat-interval says otherwise. `--creds header:`
    /// implies a sidecar (envoy profile) when this is not given.
    #[arg(long, env = "ARGOCD_AGENT_MESH_PROFILE")]
    pub mesh_profile: Option<String>,
    /// HTTP/2 keepalive PING interval towards the principal (e.g. 30s; 0 = off). Default 30s
    /// (upstream: off in code, 50s in its Helm chart), so a connection whose peer vanished is
    /// noticed; behind a sidecar the heartbeats do that end to end.
    #[arg(long, env = "ARGOCD_AGENT_KEEP_ALIVE_PING_INTERVAL")]
    pub keep_alive_ping_interval: Option<String>,
    /// Largest gRPC message in bytes.
    #[arg(long, env = "ARGOCD_AGENT_GRPC_MAX_MESSAGE_SIZE", default_value_t = 209_715_200)]
    pub grpc_max_message_size: usize,
    /// kubeconfig of this cluster (default: in-cluster or $KUBECONFIG).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context.
    #[arg(long)]
    pub kubecontext: Option<String>,
    /// Agent name. Default: the client certificate's CN, or the name the principal authenticated
    /// this agent as (behind a mesh, or with SPIFFE credentials).
    #[arg(long, env = "ARGOCD_AGENT_NAME")]
    pub agent_name: Option<String>,

    /// Lowest TLS version to the principal (tls1.1, tls1.2 or tls1.3; TLS 1.2 is the lowest
    /// ever negotiated).
    #[arg(long, env = "ARGOCD_AGENT_TLS_MIN_VERSION")]
    pub tls_min_version: Option<String>,
    /// Highest TLS version to the principal (tls1.2 or tls1.3).
    #[arg(long, env = "ARGOCD_AGENT_TLS_MAX_VERSION")]
    pub tls_max_version: Option<String>,
    /// Cipher suites offered, by Go's names (comma-separated); `list` prints them and exits.
    #[arg(long, env = "ARGOCD_AGENT_TLS_CIPHERSUITES", value_delimiter = ',')]
    pub tls_ciphersuites: Vec<String>,
    /// Periodic resync: every interval (e.g. 5m; 0 = off, the default) the agent sends one digest
    /// of what it holds, specs included; the principal answers only when something differs.
    #[arg(long, env = "ARGOCD_AGENT_RESYNC_INTERVAL", default_value = "0")]
    pub resync_interval: String,
    /// How often this cluster's Argo CD cluster info (cache counts, Kubernetes version) is read
    /// from its Redis and, when it changed, reported to the principal for the hub's Argo CD
    /// (upstream's default 10s; 0 = never).
    #[arg(long, env = "ARGOCD_AGENT_CACHE_REFRESH_INTERVAL", default_value = "10s")]
    pub cache_refresh_interval: String,
    /// How often the client certificate, key and the principal's CA (files or Secrets) are read
    /// again; a change is used from the next connection, without a restart (0: read once).
    #[arg(long, env = "ARGOCD_AGENT_TLS_RELOAD_INTERVAL", default_value = crate::runtime::reload::DEFAULT_INTERVAL)]
    pub tls_reload_interval: String,

    // --- more of upstream's flags (the few without effect here say so) ---
    /// Reach the principal with gRPC over WebSocket on HTTP/1.1 (upstream's grpc-http1 framing,
    /// one WebSocket per call), for proxies that pass only HTTP/1.1; the principal needs
    /// --enable-websocket too.
    #[arg(long, env = "ARGOCD_AGENT_ENABLE_WEBSOCKET")]
    pub enable_websocket: Option<bool>,
    /// gzip-compress every call to the principal; it answers compressed (upstream's name and
    /// behaviour; both principals decompress it).
    #[arg(long, env = "ARGOCD_AGENT_ENABLE_COMPRESSION", default_value_t = false)]
    pub enable_compression: bool,

    /// Execute the principal's resource-proxy requests against this cluster (default: on, as
    /// upstream); off, each is answered 403 saying so.
    #[arg(long, env = "ARGOCD_AGENT_ENABLE_RESOURCE_PROXY")]
    pub enable_resource_proxy: Option<bool>,
    /// Run the principal's terminal requests (`kubectl exec`, Argo CD's web terminal) in pods of
    /// this cluster that an Application of this agent manages (default: off; needs the resource
    /// proxy on and RBAC `create` on `pods/exec`).
    #[arg(long, env = "ARGOCD_AGENT_ENABLE_WEB_TERMINAL", default_value_t = false)]
    pub enable_web_terminal: bool,
    /// Managed: destination-based mapping (the principal's must be on too): Applications keep
    /// the hub namespace they come from, which must be this agent's namespace or one
    /// --allowed-namespaces covers.
    #[arg(long, env = "ARGOCD_AGENT_DESTINATION_BASED_MAPPING")]
    pub destination_based_mapping: Option<bool>,
    /// With --destination-based-mapping: create an Application's namespace when it is missing.
    #[arg(long, env = "ARGOCD_AGENT_CREATE_NAMESPACE")]
    pub create_namespace: Option<bool>,
    /// With --destination-based-mapping: namespaces (globs) besides --namespace that may hold
    /// Applications.
    #[arg(long, env = "ARGOCD_AGENT_ALLOWED_NAMESPACES", value_delimiter = ',')]
    pub allowed_namespaces: Vec<String>,
    /// Managed: when the principal's Application meets one of another source here: recreate
    /// (delete it, create the principal's) or upsert (update it in place). Per Application the
    /// argocd.argoproj.io/source-uid-mismatch-policy annotation on the principal's overrides it.
    #[arg(long, env = "ARGOCD_AGENT_SOURCE_UID_MISMATCH_POLICY", default_value = "recreate")]
    pub source_uid_mismatch_policy: agent::config::MismatchPolicy,
    /// Managed: when the principal creates an Application that exists here without its
    /// source-uid: always (take it over) or never (leave it, mark the hub's degraded). Per
    /// Application the argocd.argoproj.io/adoption-policy annotation on the one here overrides it.
    #[arg(long, env = "ARGOCD_AGENT_ADOPTION_POLICY", default_value = "always")]
    pub adoption_policy: agent::config::AdoptionPolicy,
    /// Managed: what an Application deleted here behind the principal's back gets when it is
    /// recreated: ignore (its status as it was), clear-status (no operation state) or resync
    /// (a sync operation).
    #[arg(long, env = "ARGOCD_AGENT_ON_APPLICATION_RECREATE", default_value = "ignore")]
    pub on_application_recreate: agent::config::RecreateAction,
    /// Autonomous: only Applications and AppProjects with matching labels go to the principal
    /// (Kubernetes selector syntax, e.g. `team=a,tier!=test`).
    #[arg(long, env = "ARGOCD_AGENT_LABEL_SELECTOR")]
    pub label_selector: Option<String>,
    /// Managed: leave Applications without the principal's `source-uid` alone (what this
    /// agent always does); refused in autonomous mode, where it would sync nothing.
    #[arg(long, env = "ARGOCD_AGENT_IGNORE_UNMANAGED_APPS")]
    pub ignore_unmanaged_apps: Option<bool>,
    /// This cluster's Argo CD Redis, read for the principal's Redis proxy.
    #[command(flatten)]
    pub redis: crate::redis_proxy::AgentRedis,
    /// Upstream v0.10's SPIRE flags (crate::spire).
    #[command(flatten)]
    pub spire: crate::spire::AgentSpire,
    /// Knobs of upstream internals without a counterpart.
    #[command(flatten)]
    pub upstream: crate::upstream_only::AgentOnly,
}

impl Args {
    /// Refuse flags whose feature is not implemented yet, and check required ones.
    ///
    /// # Errors
    /// Names every unsupported flag that was set, or the missing required flag.
    pub fn check_supported(&self) -> anyhow::Result<()> {
        let mut u = Unsupported::default();
        u.check("--creds userpass", self.creds.starts_with("userpass:"));
        self.upstream.check(&mut u);
        u.finish("argocd-agent agent")?;
        self.spire.spire(&self.creds, self.insecure_plaintext, self.insecure_tls)?;
        self.upstream.notes()?;
        self.redis.check()?;
        self.runtime.kit().debug_knob_notes("agent::connection")?;
        self.tls_policy()?;
        crate::runtime::reload::interval(&self.tls_reload_interval)?;
        crate::flags::parse_duration(&self.resync_interval)
            .with_context(|| format!("--resync-interval {:?}", self.resync_interval))?;
        crate::flags::parse_duration(&self.cache_refresh_interval)
            .with_context(|| format!("--cache-refresh-interval {:?}", self.cache_refresh_interval))?;
        crate::flags::label_selector(self.label_selector.as_deref())?;
        let dbm = self.destination_based_mapping == Some(true);
        if dbm && self.agent_mode == "autonomous" {
            anyhow::bail!(
                "argocd-agent agent: --destination-based-mapping applies to managed agents (an autonomous agent's Applications live in its namespace on the hub, as upstream)"
            );
        }
        if !dbm && (self.create_namespace == Some(true) || !self.allowed_namespaces.is_empty()) {
            anyhow::bail!(
                "argocd-agent agent: --create-namespace and --allowed-namespaces come with --destination-based-mapping; add it or remove them"
            );
        }
        if self.ignore_unmanaged_apps == Some(true) && self.agent_mode == "autonomous" {
            anyhow::bail!(
                "argocd-agent agent: --ignore-unmanaged-apps applies to managed agents (an autonomous agent's Applications never carry the principal's source-uid, so it would sync nothing)"
            );
        }
        if self.server_address.is_empty() {
            anyhow::bail!("argocd-agent agent: --server-address (ARGOCD_AGENT_REMOTE_SERVER) is required");
        }
        Ok(())
    }
}

impl Args {
    /// `--tls-min-version`, `--tls-max-version` and `--tls-ciphersuites`.
    ///
    /// # Errors
    /// A version or suite name is unknown, or nothing is left to negotiate.
    pub fn tls_policy(&self) -> anyhow::Result<auth::tls_policy::TlsPolicy> {
        crate::tls::policy(
            self.tls_min_version.as_deref().unwrap_or_default(),
            self.tls_max_version.as_deref(),
            &self.tls_ciphersuites,
        )
    }
}

/// The heartbeat interval: explicit `--heartbeat-interval` wins (0 = off); otherwise the mesh
/// profile's interval when the stream runs through a sidecar (`--mesh-profile`, or
/// `--creds header:`), so a quiet stream is never closed by the sidecar's idle timeout; otherwise
/// off, as upstream.
///
/// # Errors
/// A malformed duration or an unknown profile.
pub fn heartbeat_interval(args: &Args) -> anyhow::Result<Option<Duration>> {
    if let Some(text) = &args.heartbeat_interval {
        let d = crate::flags::parse_duration(text).context("--heartbeat-interval")?;
        return Ok((!d.is_zero()).then_some(d));
    }
    let profile = match &args.mesh_profile {
        Some(p) => Some(p.parse::<mesh::profile::MeshProfile>().map_err(|e| anyhow::anyhow!("--mesh-profile: {e}"))?),
        None if Creds::parse(&args.creds)?.implies_sidecar() => Some(mesh::profile::MeshProfile::Envoy),
        None => None,
    };
    Ok(profile.map(mesh::profile::MeshProfile::heartbeat_interval))
}

/// Run the agent until SIGINT or SIGTERM (or the parent's exit, see [`crate::runtime::signals`]).
///
/// # Errors
/// Flags, key material or the spoke cannot be used.
pub fn run(args: Args) -> anyhow::Result<()> {
    if crate::tls::wants_cipher_list(&args.tls_ciphersuites) {
        return Ok(());
    }
    args.check_supported()?;
    args.runtime.kit().run("argocd-agent-agent", serve(args))
}

/// What `--creds` and the TLS flags give the connection: TLS (none = plaintext), the name from
/// the client certificate, and metadata every call carries (a JWT-SVID).
struct Transport {
    tls: Option<agent::AgentTls>,
    cert_name: Option<String>,
    call_metadata: Option<auth::CallMetadata>,
    /// Keeps the Workload API streams (SVID rotation, JWT-SVID refresh) alive.
    _workload: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// Waits this long for the first SVID or JWT-SVID from the Workload API.
const WORKLOAD_API_TIMEOUT: Duration = mesh::workload::DEFAULT_INITIAL_SYNC_TIMEOUT;

async fn transport(
    args: &Args,
    creds: &Creds,
    spire: Option<&crate::spire::Spire>,
    secrets: &Secrets,
) -> anyhow::Result<Transport> {
    let mut out = Transport { tls: None, cert_name: None, call_metadata: None, _workload: None };
    if let Creds::SpiffeX509 { endpoint, principal_ids } = creds {
        anyhow::ensure!(
            !args.insecure_plaintext,
            "--creds spiffe:x509 is mTLS with the Workload API's SVIDs: drop --insecure-plaintext"
        );
        let identity = mesh::workload::X509Identity::connect(endpoint.as_deref(), WORKLOAD_API_TIMEOUT)
            .await
            .with_context(|| format!("--creds {:?}: no X.509-SVID from the SPIFFE Workload API", args.creds))?;
        let own = identity.spiffe_id().context("the Workload API's X.509-SVID has no SPIFFE ID")?;
        let peers = if principal_ids.is_empty() {
            mesh::workload::PeerAuthorization::TrustDomains(vec![own.trust_domain().clone()])
        } else {
            mesh::workload::PeerAuthorization::Exact(principal_ids.clone())
        };
        tracing::info!(spiffe_id = %own, principal = ?peers, "mTLS with X.509-SVIDs from the SPIFFE Workload API");
        let config = identity.client_config(&peers).context("cannot build the SPIFFE mTLS client configuration")?;
        out.tls = Some(agent::AgentTls::Rustls { config, server_name: args.server_address.clone() });
        out._workload = Some(Box::new(identity));
        return Ok(out);
    }
    if let Creds::SpiffeJwt { endpoint, audience } = creds {
        let identity = mesh::workload::JwtIdentity::connect(endpoint.as_deref(), WORKLOAD_API_TIMEOUT)
            .await
            .with_context(|| format!("--creds {:?}: the SPIFFE Workload API is unavailable", args.creds))?;
        let source = Arc::new(
            auth::JwtSvidSource::start(identity, audience.clone())
                .await
                .with_context(|| format!("--creds {:?}: no JWT-SVID for audience {audience:?}", args.creds))?,
        );
        tracing::info!(%audience, "JWT-SVIDs from the SPIFFE Workload API");
        out.call_metadata = Some(source.call_metadata());
        if let Some(spire) = spire {
            // --spire-auth-method jwt: the principal's X.509-SVID verified against the bundles.
            let (tls, identity) =
                crate::spire::agent_server_tls(spire, &args.server_address, WORKLOAD_API_TIMEOUT).await?;
            out.tls = Some(tls);
            out._workload = Some(Box::new((source, identity)));
            return Ok(out);
        }
        out._workload = Some(Box::new(source));
    }
    if args.insecure_plaintext {
        return Ok(out);
    }
    // A JWT-SVID is the credential; TLS only authenticates the principal.
    let with_identity = !matches!(creds, Creds::SpiffeJwt { .. });
    let material = client_material(args, secrets, with_identity).await?;
    if let Some(cert) = material.get(1) {
        out.cert_name = Some(common_name(cert)?);
    }
    let policy = args.tls_policy()?;
    let initial = client_tls(&policy, &material)?;
    let load = {
        let (args, secrets) = (args.clone(), secrets.clone());
        move || {
            let (args, secrets) = (args.clone(), secrets.clone());
            async move { client_material(&args, &secrets, with_identity).await }
        }
    };
    let named = out.cert_name.clone();
    let build = move |m: &[String]| {
        let config = client_tls(&policy, m)?;
        if let Some(cert) = m.get(1)
            && let Ok(name) = common_name(cert)
            && named.as_ref().is_some_and(|n| *n != name)
        {
            tracing::warn!(was = ?named, now = %name, "the reloaded client certificate names another agent; the principal will know this agent by the new name on the next connection");
        }
        Ok(config)
    };
    let every = crate::runtime::reload::interval(&args.tls_reload_interval)?;
    // Lives as long as the connection's configuration does (the process).
    let config =
        crate::runtime::reload::spawn("agent TLS", every, material, initial, load, build, CancellationToken::new());
    out.tls = Some(agent::AgentTls::Reloading { config, server_name: args.server_address.clone() });
    Ok(out)
}

/// The principal's CA and, `with_identity`, this agent's client certificate and key, as PEM,
/// from the files or Secrets the flags name.
async fn client_material(args: &Args, secrets: &Secrets, with_identity: bool) -> anyhow::Result<Vec<String>> {
    let ca = pem_from(
        args.root_ca_path.as_deref(),
        "--root-ca-path",
        secrets,
        &args.root_ca_secret_name,
        &["ca.crt", "tls.crt"],
        "--root-ca-secret-name",
    )
    .await?;
    if !with_identity {
        return Ok(vec![ca]);
    }
    let (cert, key) = key_pair(
        (args.tls_client_cert.as_deref(), "--tls-client-cert"),
        (args.tls_client_key.as_deref(), "--tls-client-key"),
        secrets,
        &args.tls_secret_name,
        "--tls-secret-name",
    )
    .await?;
    Ok(vec![ca, cert, key])
}

/// The TLS client configuration of [`client_material`].
fn client_tls(policy: &auth::tls_policy::TlsPolicy, material: &[String]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let (ca, identity) = match material {
        [ca] => (ca, None),
        [ca, cert, key] => (ca, Some((cert.as_str(), key.as_str()))),
        _ => anyhow::bail!("a CA, and a certificate with its key, expected"),
    };
    crate::tls::client_config(policy, ca, identity).context("cannot build the TLS client configuration")
}

/// Starts `/metrics` and `/healthz` before anything else, so scrapes answer (authentication
/// failures included) while the agent authenticates; `/healthz` is 503 until it is connected.
async fn observe(args: &Args, cell: &Arc<OnceLock<agent::Agent>>, cancel: &CancellationToken) -> anyhow::Result<()> {
    let render = {
        let cell = cell.clone();
        Arc::new(move || match cell.get() {
            Some(a) => a.metrics_text(),
            None => agent::metrics::global().render(None),
        })
    };
    let health = {
        let cell = cell.clone();
        Arc::new(move || match cell.get() {
            Some(a) if a.is_connected() => Ok(()),
            Some(_) => Err("not connected to the principal".to_owned()),
            None => Err("not connected to the principal (authenticating)".to_owned()),
        })
    };
    args.runtime.kit().admin("agent", "", render, health, cancel).await
}

async fn serve(args: Args) -> anyhow::Result<()> {
    // Refused whatever the transport and before anything listens: not verifying the principal
    // would let anyone on the path play principal and write to this cluster.
    anyhow::ensure!(
        !args.insecure_tls,
        "--insecure-tls is not supported: pass the principal's CA with --root-ca-path or --root-ca-secret-name"
    );
    // Before anything announces the process, so an early SIGTERM still stops it cleanly.
    let mut stop = crate::runtime::signals::install();
    let observed = Arc::new(OnceLock::new());
    let observing = CancellationToken::new();
    let _stop_observing = observing.clone().drop_guard();
    observe(&args, &observed, &observing).await?;
    let debug_knobs = args.runtime.kit().debug_knob_notes("agent::connection")?;
    for note in args.upstream.notes()?.into_iter().chain(debug_knobs) {
        tracing::warn!("{note}");
    }
    let mode: agent::AgentMode =
        args.agent_mode.parse().map_err(|_| anyhow::anyhow!("--agent-mode must be managed or autonomous"))?;
    // --spire-agent-socket with --spire-auth-method decides the credentials, as upstream.
    let spire = args.spire.spire(&args.creds, args.insecure_plaintext, args.insecure_tls)?;
    let creds_kind = match &spire {
        Some(spire) => crate::spire::agent_creds(spire),
        None => Creds::parse(&args.creds)?,
    };
    if let Creds::SpiffeX509 { endpoint, .. } | Creds::SpiffeJwt { endpoint, .. } = &creds_kind {
        mesh::workload::resolve_endpoint(endpoint.as_deref()).with_context(|| format!("--creds {:?}", args.creds))?;
    }
    let client = crate::ctl::kube::client(args.kubeconfig.as_deref(), args.kubecontext.as_deref()).await?;
    let secrets = Secrets::new(client.clone(), &args.namespace);
    let scheme = if args.insecure_plaintext { "http" } else { "https" };
    let addr = format!("{scheme}://{}:{}", args.server_address, args.server_port);
    let transport = transport(&args, &creds_kind, spire.as_ref(), &secrets).await?;
    let keepalive = match &args.keep_alive_ping_interval {
        Some(text) => {
            Some(crate::flags::parse_duration(text).context("--keep-alive-ping-interval")?).filter(|d| !d.is_zero())
        }
        None => Some(agent::config::DEFAULT_KEEPALIVE),
    };
    let wire = if args.enable_websocket == Some(true) {
        agent::transport::Wire::WebSocket
    } else {
        agent::transport::Wire::Http2
    };
    let channel = agent::transport::lazy_channel_over(&addr, transport.tls.as_ref(), keepalive, wire)
        .with_context(|| format!("--server-address {:?}", args.server_address))?;

    let mut creds = auth::Credentials::new();
    if let Some(metadata) = &transport.call_metadata {
        creds = creds.with_call_metadata(metadata.clone());
    }
    let params = auth::AuthParams {
        method: spire.as_ref().map_or(creds_kind.method(), |s| crate::spire::agent_method(s.method)).to_owned(),
        credentials: Default::default(),
        mode,
        version: VERSION.to_string(),
        agent_namespace: args.namespace.clone(),
    };
    let mut session =
        agent::session::Session::new(channel, creds, params).with_compression(args.enable_compression).over(wire);
    if let Some(tls) = &transport.tls {
        session = session.redialing(&addr, tls, keepalive);
    }
    let session = Arc::new(session);
    // The stream needs a token: authenticate before dialling it (or stop on a signal).
    let info = tokio::select! {
        info = session.authenticate() => info,
        () = stop.recv() => return Ok(()),
    };
    let name = match (args.agent_name.clone().or(transport.cert_name.clone()), info.agent_name.as_str()) {
        (Some(name), principal) if !principal.is_empty() && principal != name => {
            tracing::warn!(agent = %name, authenticated_as = %principal, "the principal knows this agent by another name");
            name
        }
        (Some(name), _) => name,
        (None, "") => anyhow::bail!("the principal did not say which agent this is; pass --agent-name"),
        (None, principal) => principal.to_owned(),
    };

    let mut config =
        agent::AgentConfig::new(addr, name.clone(), mode).with_session(session, transport.call_metadata.clone());
    config.tls = transport.tls.clone();
    config.keepalive = keepalive;
    config.wire = wire;
    config.max_message_bytes = args.grpc_max_message_size;
    config.compression = args.enable_compression;
    config.resync_interval = Some(crate::flags::parse_duration(&args.resync_interval).context("--resync-interval")?)
        .filter(|d| !d.is_zero());
    config.cache_refresh_interval =
        Some(crate::flags::parse_duration(&args.cache_refresh_interval).context("--cache-refresh-interval")?)
            .filter(|d| !d.is_zero());
    config.namespace = args.namespace.clone();
    config.destination_based_mapping = args.destination_based_mapping == Some(true);
    config.create_namespace = args.create_namespace == Some(true);
    config.allowed_namespaces = args.allowed_namespaces.clone();
    config.principal_namespace = Some(info.namespace.clone()).filter(|ns| !ns.is_empty());
    config.mismatch_policy = args.source_uid_mismatch_policy;
    config.adoption_policy = args.adoption_policy;
    config.on_recreate = args.on_application_recreate;
    config.enable_resource_proxy = args.enable_resource_proxy != Some(false);
    config.enable_web_terminal = args.enable_web_terminal;
    config.redis = Some(args.redis.config(&secrets).await?);
    config.label_selector = crate::flags::label_selector(args.label_selector.as_deref())?;
    if config.label_selector.is_some() && mode == agent::AgentMode::Managed {
        tracing::info!(
            "--label-selector applies to what an autonomous agent sends; a managed agent holds what the principal sends"
        );
    }
    let heartbeat = heartbeat_interval(&args)?;
    if let Some(h) = heartbeat {
        tracing::info!(interval = ?h, "application heartbeats on");
    }
    config.heartbeat_interval = heartbeat;
    let agent = agent::Agent::new(config, client).context("cannot start the agent")?;
    let _ = observed.set(agent.clone());
    println!("agent {name} ({}) connecting to {}:{}", args.agent_mode, args.server_address, args.server_port);
    let cancel = tokio_util::sync::CancellationToken::new();
    let run = agent.run(cancel.clone());
    tokio::pin!(run);
    tokio::select! {
        () = &mut run => {}
        () = stop.recv() => {
            cancel.cancel();
            run.await;
        }
    }
    drop(transport);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    fn args(extra: &[&str]) -> super::Args {
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            args: super::Args,
        }
        let mut argv = vec!["agent", "--server-address", "p"];
        argv.extend(extra);
        <Wrap as clap::Parser>::parse_from(argv).args
    }

    #[test]
    fn heartbeats_default_on_behind_a_mesh_only() {
        let hb = |extra: &[&str]| super::heartbeat_interval(&args(extra)).ok().flatten();
        assert_eq!(hb(&[]), None, "off by default, as upstream");
        assert_eq!(hb(&["--mesh-profile", "istio"]), Some(Duration::from_secs(30)));
        assert_eq!(hb(&["--creds", "header:"]), Some(Duration::from_secs(30)));
        assert_eq!(hb(&["--mesh-profile", "istio", "--heartbeat-interval", "10s"]), Some(Duration::from_secs(10)));
        assert_eq!(hb(&["--mesh-profile", "istio", "--heartbeat-interval", "0"]), None, "explicit 0 turns them off");
        assert!(super::heartbeat_interval(&args(&["--mesh-profile", "consul"])).is_err());
    }

    #[test]
    fn go_durations() {
        assert_eq!(crate::flags::parse_duration("0").ok(), Some(Duration::ZERO));
        assert_eq!(crate::flags::parse_duration("30s").ok(), Some(Duration::from_secs(30)));
        assert_eq!(crate::flags::parse_duration("1m30s").ok(), Some(Duration::from_secs(90)));
        assert_eq!(crate::flags::parse_duration("500ms").ok(), Some(Duration::from_millis(500)));
        assert!(crate::flags::parse_duration("10 parsecs").is_err());
        assert!(crate::flags::parse_duration("s").is_err());
    }
}
