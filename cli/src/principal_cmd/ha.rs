//! `argocd-agent principal --ha-*`: cross-hub disaster recovery with upstream's flags, names,
//! environment variables and defaults (`cmd/argocd-agent/principal.go`; docs/ha.md, "Cross-hub
//! disaster recovery").

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use principal::ha::{HaConfig, Role};
use tokio_util::sync::CancellationToken;

use super::{Args, Listener, server_material, server_tls};
use crate::ctl::kube::Secrets;

/// The admin port when `--ha-admin-port` is 0 (upstream's `ha.DefaultOptions`).
pub const DEFAULT_ADMIN_PORT: u16 = 8405;

/// Upstream's `--ha-*` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct HaArgs {
    /// Enable High Availability mode (cross-hub active/passive pair; docs/ha.md).
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ENABLED", default_value_t = false)]
    pub ha_enabled: bool,
    /// Preferred HA role: 'primary' or 'replica' (at first start; a later promote or demote
    /// recorded on the hub wins).
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_PREFERRED_ROLE", default_value = "primary")]
    pub ha_preferred_role: String,
    /// Address of the HA peer principal's gRPC port, HOST:PORT (required for replicas, optional
    /// for primary).
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_PEER_ADDRESS", default_value = "")]
    pub ha_peer_address: String,
    /// Accepted, no automatic effect (as upstream): promotion is the operator's
    /// (`argocd-agentctl ha promote`).
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_FAILOVER_TIMEOUT", default_value = "30s")]
    pub ha_failover_timeout: String,
    /// Port of the HAAdmin gRPC server (0: 8405); mTLS with --ha-admin-auth, or 127.0.0.1 only
    /// with --insecure-plaintext.
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ADMIN_PORT", default_value_t = 0)]
    pub ha_admin_port: u16,
    /// Comma-separated list of peer identities (from --auth mtls:) allowed to connect for
    /// replication; empty (the default): every replication call is refused; '*': any identity
    /// --auth accepts, agents' included (upstream's default).
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ALLOWED_REPLICATION_CLIENTS", value_delimiter = ',')]
    pub ha_allowed_replication_clients: Vec<String>,
    /// How long the primary waits for the replica's initial ACK after snapshot fetch (0: 5m).
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_REPLICATION_INITIAL_ACK_TIMEOUT", default_value = "0")]
    pub ha_replication_initial_ack_timeout: String,
    /// Authorization for HA admin endpoint, format: mtls:subject:<regex> or mtls:uri:<regex>
    /// (unset over TLS: every admin call is denied).
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ADMIN_AUTH", default_value = "")]
    pub ha_admin_auth: String,
    /// Path to TLS certificate for the HA admin endpoint (independent TLS, separate from the
    /// main gRPC server's).
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ADMIN_TLS_CERT")]
    pub ha_admin_tls_cert: Option<PathBuf>,
    /// Path to TLS private key for the HA admin endpoint.
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ADMIN_TLS_KEY")]
    pub ha_admin_tls_key: Option<PathBuf>,
    /// Path to CA certificate for verifying HA admin client certs.
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ADMIN_CA")]
    pub ha_admin_ca: Option<PathBuf>,
}

/// What `--ha-*` asks for, checked.
#[derive(Debug)]
pub struct HaPlan {
    role: Role,
    initial_ack_timeout: Duration,
    admin_auth: Option<principal::ha::admin::AdminAuth>,
    admin_tls_files: Option<[PathBuf; 3]>,
    /// `--ha-allowed-replication-clients` without empty entries.
    allowed_replication_clients: Vec<String>,
}

impl HaArgs {
    /// Checks the flags (before anything starts); `None` without `--ha-enabled`.
    ///
    /// # Errors
    /// A value upstream would refuse, or a combination cross-hub HA cannot work with, named.
    pub fn plan(&self, auth: &str, plaintext: bool, agent_leases: bool) -> anyhow::Result<Option<HaPlan>> {
        if !self.ha_enabled {
            return Ok(None);
        }
        if agent_leases {
            anyhow::bail!(
                "--ha-enabled with --agent-leases: a cross-hub pair is one principal per hub; run replicas of one hub \
                 (--agent-leases) or a cross-hub pair (--ha-enabled), not both"
            );
        }
        let role: Role = self.ha_preferred_role.parse().map_err(|e| anyhow::anyhow!("--ha-preferred-role: {e}"))?;
        if role == Role::Replica && self.ha_peer_address.is_empty() {
            anyhow::bail!("--ha-peer-address: peer address is required for replica role");
        }
        if !self.ha_peer_address.is_empty() && !self.ha_peer_address.contains(':') {
            anyhow::bail!("--ha-peer-address {:?}: HOST:PORT of the peer principal's gRPC port", self.ha_peer_address);
        }
        crate::flags::parse_duration(&self.ha_failover_timeout)
            .with_context(|| format!("--ha-failover-timeout {:?}", self.ha_failover_timeout))?;
        let initial = crate::flags::parse_duration(&self.ha_replication_initial_ack_timeout).with_context(|| {
            format!("--ha-replication-initial-ack-timeout {:?}", self.ha_replication_initial_ack_timeout)
        })?;
        let initial_ack_timeout = if initial.is_zero() { Duration::from_secs(300) } else { initial };
        let admin_auth = principal::ha::admin::AdminAuth::parse(&self.ha_admin_auth)
            .map_err(|e| anyhow::anyhow!("--ha-admin-auth {:?}: {e}", self.ha_admin_auth))?;
        let admin_tls_files = match (&self.ha_admin_tls_cert, &self.ha_admin_tls_key, &self.ha_admin_ca) {
            (None, None, None) => None,
            (Some(c), Some(k), Some(ca)) => Some([c.clone(), k.clone(), ca.clone()]),
            _ => anyhow::bail!(
                "ha-admin-tls requires all three: --ha-admin-tls-cert, --ha-admin-tls-key, and --ha-admin-ca"
            ),
        };
        let any = principal::ha::replication::ANY_REPLICATION_CLIENT;
        let allowed_replication_clients: Vec<String> =
            self.ha_allowed_replication_clients.iter().map(|c| c.trim().to_owned()).filter(|c| !c.is_empty()).collect();
        if allowed_replication_clients.len() > 1 && allowed_replication_clients.iter().any(|c| c == any) {
            anyhow::bail!(
                "--ha-allowed-replication-clients {:?}: '{any}' allows every identity --auth accepts; give '{any}' \
                 alone or list the identities",
                self.ha_allowed_replication_clients.join(",")
            );
        }
        // Peers identify each other by their client certificates, as upstream's replication
        // authentication does.
        if plaintext || !matches!(auth::AuthMethodSpec::parse(auth), Ok(auth::AuthMethodSpec::Mtls { .. })) {
            anyhow::bail!(
                "--ha-enabled needs --auth mtls:subject:<regex> or mtls:uri:<regex> over TLS (not --insecure-plaintext): \
                 replication peers are identified by their client certificates (got --auth {auth:?}, plaintext={plaintext})"
            );
        }
        Ok(Some(HaPlan { role, initial_ack_timeout, admin_auth, admin_tls_files, allowed_replication_clients }))
    }
}

/// The replica's dialler: TLS to the peer's gRPC port with this principal's own server
/// certificate as client certificate and its CA as trust root (as upstream), read once at start.
fn connector(peer: &str, material: &[String]) -> anyhow::Result<principal::ha::Connector> {
    let [cert, key, ca] = material else { anyhow::bail!("certificate, key and CA expected") };
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca))
        .identity(tonic::transport::Identity::from_pem(cert, key));
    let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{peer}"))
        .with_context(|| format!("--ha-peer-address {peer:?}"))?
        .tls_config(tls)
        .context("--ha-peer-address: TLS client configuration")?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true);
    let peer = peer.to_owned();
    Ok(Arc::new(move || {
        let (endpoint, peer) = (endpoint.clone(), peer.clone());
        Box::pin(async move { endpoint.connect().await.map_err(|e| format!("cannot reach the peer at {peer}: {e:?}")) })
    }))
}

/// Turns this principal into one of a cross-hub pair: the controller runs until `cancel`, and
/// the HAAdmin endpoint listens (printed as `HA admin listening on <addr>`).
///
/// # Errors
/// TLS material cannot be read, or the admin port cannot be bound.
pub async fn start(
    plan: HaPlan,
    args: &Args,
    secrets: &Secrets,
    principal: &principal::Principal,
    cancel: &CancellationToken,
) -> anyhow::Result<Arc<principal::ha::Ha>> {
    let ha_args = &args.ha;
    let spec = auth::AuthMethodSpec::parse(&args.auth).with_context(|| format!("--auth {:?}", args.auth))?;
    let auth::AuthMethodSpec::Mtls { source, regex, .. } = spec else {
        anyhow::bail!("--ha-enabled needs --auth mtls:subject:<regex> or mtls:uri:<regex>");
    };
    let material =
        server_material(args, secrets, Listener::Agents).await.context("--ha-enabled: the principal's TLS material")?;
    let connector =
        if ha_args.ha_peer_address.is_empty() { None } else { Some(connector(&ha_args.ha_peer_address, &material)?) };
    let config = HaConfig {
        preferred_role: plan.role,
        peer_address: ha_args.ha_peer_address.clone(),
        allowed_replication_clients: plan.allowed_replication_clients.clone(),
        replication_auth: Some(auth::MtlsAuthenticator::new(source, regex)),
        initial_ack_timeout: plan.initial_ack_timeout,
        connector,
        ..HaConfig::default()
    };
    tracing::info!(preferred_role = %plan.role, peer = %ha_args.ha_peer_address, "HA enabled");
    match plan.allowed_replication_clients.as_slice() {
        [] => tracing::warn!(
            "--ha-allowed-replication-clients is empty: every replication call is refused (PermissionDenied), so no \
             peer can replicate from this principal; set it to the peer principal's identity"
        ),
        [any] if any == principal::ha::replication::ANY_REPLICATION_CLIENT => tracing::warn!(
            "--ha-allowed-replication-clients '*': any identity --auth accepts may replicate every agent's \
             Applications, agents' certificates included"
        ),
        _ => {}
    }
    let ha = principal.enable_ha(config);
    tokio::spawn(ha.clone().run(cancel.clone()));

    // The admin endpoint: its own TLS, else the main listener's, always verifying clients.
    let policy = args.tls_policy()?;
    let admin_material = match &plan.admin_tls_files {
        Some([cert, key, ca]) => {
            let read =
                |p: &PathBuf, flag: &str| std::fs::read_to_string(p).with_context(|| format!("{flag} {}", p.display()));
            vec![read(cert, "--ha-admin-tls-cert")?, read(key, "--ha-admin-tls-key")?, read(ca, "--ha-admin-ca")?]
        }
        None => material,
    };
    let tls = server_tls(&policy, true, &admin_material).context("the HA admin endpoint's TLS")?;
    if plan.admin_auth.is_none() {
        tracing::warn!("--ha-admin-auth is not set: every HA admin call is denied");
    }
    let host = if args.listen_host.is_empty() { "0.0.0.0" } else { args.listen_host.as_str() };
    let port = if ha_args.ha_admin_port == 0 { DEFAULT_ADMIN_PORT } else { ha_args.ha_admin_port };
    let listener = tokio::net::TcpListener::bind((host, port))
        .await
        .with_context(|| format!("cannot listen on {host}:{port} (--ha-admin-port)"))?;
    println!("HA admin listening on {}", listener.local_addr().context("HA admin address")?);
    let service = principal::ha::admin::AdminService::new(ha.clone(), plan.admin_auth);
    tokio::spawn({
        let cancel = cancel.clone();
        async move {
            if let Err(e) = principal::ha::admin::serve(listener, Some(tls), service, cancel).await {
                tracing::error!(error = %e, "the HA admin endpoint failed");
            }
        }
    });
    Ok(ha)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Demo {
        #[command(flatten)]
        ha: HaArgs,
    }

    fn plan(args: &[&str], auth: &str) -> anyhow::Result<Option<HaPlan>> {
        let demo = Demo::try_parse_from(std::iter::once("demo").chain(args.iter().copied()))?;
        demo.ha.plan(auth, false, false)
    }

    const MTLS: &str = "mtls:subject:CN=([^,]+)";

    #[test]
    fn without_ha_enabled_nothing_is_planned() {
        assert!(plan(&["--ha-preferred-role", "boss"], MTLS).expect("ignored as upstream").is_none());
    }

    #[test]
    fn bad_values_are_named() {
        let err = |args: &[&str], auth: &str| format!("{:#}", plan(args, auth).unwrap_err());
        assert!(err(&["--ha-enabled", "--ha-preferred-role", "boss"], MTLS).contains("unknown role: boss"));
        assert!(err(&["--ha-enabled", "--ha-preferred-role", "replica"], MTLS).contains("peer address is required"));
        assert!(err(&["--ha-enabled", "--ha-peer-address", "nohost"], MTLS).contains("HOST:PORT"));
        assert!(err(&["--ha-enabled", "--ha-admin-auth", "CN=x"], MTLS).contains("must start with 'mtls:'"));
        assert!(err(&["--ha-enabled", "--ha-admin-tls-cert", "/c"], MTLS).contains("requires all three"));
        assert!(
            err(&["--ha-enabled", "--ha-replication-initial-ack-timeout", "soon"], MTLS)
                .contains("--ha-replication-initial-ack-timeout")
        );
        assert!(err(&["--ha-enabled"], "header:x-id:(.+)").contains("needs --auth mtls"));
        let mixed = err(&["--ha-enabled", "--ha-allowed-replication-clients", "principal-b,*"], MTLS);
        assert!(mixed.contains("give '*' alone"), "{mixed}");
        let demo = Demo::try_parse_from(["demo", "--ha-enabled"]).expect("parses");
        let both = demo.ha.plan(MTLS, false, true).unwrap_err().to_string();
        assert!(both.contains("--agent-leases"), "{both}");
    }

    #[test]
    fn defaults_are_upstreams() {
        let p = plan(&["--ha-enabled"], MTLS).expect("valid").expect("planned");
        assert_eq!(p.role, Role::Primary);
        assert_eq!(p.initial_ack_timeout, Duration::from_secs(300));
        assert!(p.admin_auth.is_none() && p.admin_tls_files.is_none());
        assert!(p.allowed_replication_clients.is_empty(), "no replication client allowed by default");
        let p = plan(
            &[
                "--ha-enabled",
                "--ha-preferred-role",
                "replica",
                "--ha-peer-address",
                "a:8443",
                "--ha-replication-initial-ack-timeout",
                "30s",
                "--ha-admin-auth",
                "mtls:subject:^CN=ha-admin",
            ],
            MTLS,
        )
        .expect("valid")
        .expect("planned");
        assert_eq!((p.role, p.initial_ack_timeout), (Role::Replica, Duration::from_secs(30)));
        assert!(p.admin_auth.is_some());
        let p = plan(&["--ha-enabled", "--ha-allowed-replication-clients", "principal-a, ,principal-c"], MTLS)
            .expect("valid")
            .expect("planned");
        assert_eq!(p.allowed_replication_clients, ["principal-a", "principal-c"]);
        let p =
            plan(&["--ha-enabled", "--ha-allowed-replication-clients", "*"], MTLS).expect("valid").expect("planned");
        assert_eq!(p.allowed_replication_clients, ["*"]);
    }
}
