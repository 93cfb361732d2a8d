//! Upstream flags of features this implementation does not have yet (cross-hub HA,
//! SPIRE-specific flags), and tuning knobs of upstream internals that have no counterpart here. Each parses
//! with upstream's name and environment variable, so an upstream command line, manifest or
//! `argocd-agent-params` ConfigMap reaches a clear answer: setting a feature's flag stops startup
//! naming it ([`Unsupported`]); a knob without a counterpart is accepted and logged as having no
//! effect ([`AgentOnly::notes`]). docs/compatibility.md lists both.

use crate::unsupported::Unsupported;

/// The principal's.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PrincipalOnly {
    #[arg(long, env = "ARGOCD_PRINCIPAL_SPIRE_AGENT_SOCKET", hide = true)]
    spire_agent_socket: Option<String>,
    #[arg(long, env = "ARGOCD_PRINCIPAL_SPIRE_AUTH_METHOD", hide = true)]
    spire_auth_method: Option<String>,
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ENABLED", hide = true)]
    ha_enabled: Option<bool>,
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_PREFERRED_ROLE", hide = true)]
    ha_preferred_role: Option<String>,
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_PEER_ADDRESS", hide = true)]
    ha_peer_address: Option<String>,
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_FAILOVER_TIMEOUT", hide = true)]
    ha_failover_timeout: Option<String>,
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ADMIN_PORT", hide = true)]
    ha_admin_port: Option<u16>,
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ALLOWED_REPLICATION_CLIENTS", hide = true, value_delimiter = ',')]
    ha_allowed_replication_clients: Vec<String>,
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_REPLICATION_INITIAL_ACK_TIMEOUT", hide = true)]
    ha_replication_initial_ack_timeout: Option<String>,
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ADMIN_AUTH", hide = true)]
    ha_admin_auth: Option<String>,
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ADMIN_TLS_CERT", hide = true)]
    ha_admin_tls_cert: Option<String>,
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ADMIN_TLS_KEY", hide = true)]
    ha_admin_tls_key: Option<String>,
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ADMIN_CA", hide = true)]
    ha_admin_ca: Option<String>,
}

impl PrincipalOnly {
    /// Records every flag that was set to use a missing feature.
    pub fn check(&self, u: &mut Unsupported) {
        u.check_opt("--spire-agent-socket (use --auth spiffe:x509 or spiffe:jwt)", &self.spire_agent_socket)
            .check_opt("--spire-auth-method (use --auth spiffe:x509 or spiffe:jwt)", &self.spire_auth_method)
            .check("--ha-enabled", self.ha_enabled == Some(true))
            .check_opt("--ha-preferred-role", &self.ha_preferred_role)
            .check_opt("--ha-peer-address", &self.ha_peer_address)
            .check_opt("--ha-failover-timeout", &self.ha_failover_timeout)
            .check("--ha-admin-port", self.ha_admin_port.is_some_and(|p| p != 0))
            .check_list("--ha-allowed-replication-clients", &self.ha_allowed_replication_clients)
            .check_opt("--ha-replication-initial-ack-timeout", &self.ha_replication_initial_ack_timeout)
            .check_opt("--ha-admin-auth", &self.ha_admin_auth)
            .check_opt("--ha-admin-tls-cert", &self.ha_admin_tls_cert)
            .check_opt("--ha-admin-tls-key", &self.ha_admin_tls_key)
            .check_opt("--ha-admin-ca", &self.ha_admin_ca);
    }
}

/// The agent's.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AgentOnly {
    #[arg(long, env = "ARGOCD_AGENT_SPIRE_AGENT_SOCKET", hide = true)]
    spire_agent_socket: Option<String>,
    #[arg(long, env = "ARGOCD_AGENT_SPIRE_AUTH_METHOD", hide = true)]
    spire_auth_method: Option<String>,
    /// Accepted, no effect: upstream's period for recounting the cluster cache it reports (not
    /// reported here yet).
    #[arg(long, env = "ARGOCD_AGENT_CACHE_REFRESH_INTERVAL", hide = true)]
    cache_refresh_interval: Option<String>,
    /// Accepted, no effect: upstream's limit on waiting for its informers at start.
    #[arg(long, env = "ARGOCD_AGENT_INFORMER_SYNC_TIMEOUT", hide = true)]
    informer_sync_timeout: Option<String>,
    /// Accepted, no effect: upstream's coalescing of informer events.
    #[arg(long, env = "ARGOCD_AGENT_BUFFER_INFORMER_EVENT_INTERVAL", hide = true)]
    buffer_informer_event_interval: Option<String>,
}

impl AgentOnly {
    /// Records every flag that was set to use a missing feature.
    pub fn check(&self, u: &mut Unsupported) {
        u.check_opt("--spire-agent-socket (use --creds spiffe:x509 or spiffe:jwt)", &self.spire_agent_socket)
            .check_opt("--spire-auth-method (use --creds spiffe:x509 or spiffe:jwt)", &self.spire_auth_method);
    }

    /// The knobs that were set although they have no effect here, each with why; and an error
    /// for one that is not a duration (upstream would refuse it too).
    ///
    /// # Errors
    /// A value is not a duration.
    pub fn notes(&self) -> anyhow::Result<Vec<String>> {
        let knobs = [
            (
                "--cache-refresh-interval",
                &self.cache_refresh_interval,
                "this agent does not report cluster cache counts yet (upstream's cluster cache info comes with live resources)",
            ),
            (
                "--informer-sync-timeout",
                &self.informer_sync_timeout,
                "the agent's watches wait for their first list with no time limit, retrying with backoff; nothing gives up after a timeout",
            ),
            (
                "--buffer-informer-event-interval",
                &self.buffer_informer_event_interval,
                "every change is sent as it happens; the outbox coalesces updates of one object that wait to be sent",
            ),
        ];
        let mut notes = Vec::new();
        for (flag, value, why) in knobs {
            if let Some(v) = value {
                crate::flags::parse_duration(v).map_err(|e| anyhow::anyhow!("{flag} {v:?}: {e}"))?;
                notes.push(format!("{flag} has no effect here: {why}"));
            }
        }
        Ok(notes)
    }
}

/// Upstream's debugging knobs that have no counterpart here, on both commands: `--pprof-port`
/// (Go's profiler) and `--full-detail` (extra log detail). Checked as upstream would; each set
/// one gives a note saying what to use instead. `subsystem` names a log target for the example.
///
/// # Errors
/// A `--full-detail` part upstream would refuse.
pub fn debug_knob_notes(
    pprof_port: Option<u16>,
    full_detail: Option<&str>,
    subsystem: &str,
) -> anyhow::Result<Vec<String>> {
    let mut notes = Vec::new();
    if pprof_port.is_some_and(|p| p != 0) {
        notes.push("--pprof-port has no effect here: there is no Go profiler; profile with perf or the OTLP traces (docs/operations/tracing.md)".to_owned());
    }
    if let Some(v) = full_detail.filter(|v| !v.is_empty()) {
        for part in v.split(',') {
            anyhow::ensure!(
                ["all", "actions", "events", "informers"].contains(&part.trim()),
                "--full-detail {v:?}: {part:?} is none of all, actions, events, informers"
            );
        }
        notes.push(format!(
            "--full-detail has no effect here: raise a subsystem's level in --log-level instead, e.g. info,{subsystem}=debug"
        ));
    }
    Ok(notes)
}
