//! `argocd-agentctl ha status|promote|demote` (upstream `cmd/ctl/ha.go`): the principal's
//! HAAdmin API, directly (`--address`) or through a port-forward to the principal pod's admin
//! port, in plaintext or with an mTLS client certificate (`--tls-cert`, `--tls-key`,
//! `--tls-ca`). Flags, prompts, output and errors are upstream's.

use std::io::{BufRead, Write};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Pod;
use protocol::pb::haadminapi::ha_admin_client::HaAdminClient;
use protocol::pb::haadminapi::{DemoteRequest, HaStatusResponse, PromoteRequest, StatusRequest};
use tonic::transport::{Channel, Endpoint};

use super::GlobalFlags;

/// The label of the principal's pod (upstream's port-forward looks it up by it).
const PRINCIPAL_POD_LABEL: &str = "app.kubernetes.io/name=argocd-agent-principal";
/// The admin port the port-forward reaches (upstream hard-codes it too).
const ADMIN_PORT: u16 = 8405;

/// Manage HA state of the principal server.
#[derive(Debug, clap::Args)]
pub struct HaArgs {
    /// Path to client certificate for mTLS authentication.
    #[arg(long, global = true, default_value = "")]
    tls_cert: String,
    /// Path to client private key for mTLS authentication.
    #[arg(long, global = true, default_value = "")]
    tls_key: String,
    /// Path to CA certificate for verifying the admin server.
    #[arg(long, global = true, default_value = "")]
    tls_ca: String,
    #[command(subcommand)]
    command: HaCommand,
}

#[derive(Debug, clap::Subcommand)]
enum HaCommand {
    /// Show HA status of the principal server.
    Status(StatusArgs),
    /// Promote the principal to active.
    #[command(long_about = "Promote this principal to the ACTIVE role.\n\nRefuses if the peer is also ACTIVE \
                            (split-brain safety).\nUse --force to override the safety check.")]
    Promote(ChangeArgs),
    /// Demote the principal to replica.
    #[command(long_about = "Demote this principal from ACTIVE to REPLICATING.\n\nThe principal will stop \
                            accepting agents and begin replicating\nfrom the peer.")]
    Demote(ChangeArgs),
}

#[derive(Debug, clap::Args)]
struct StatusArgs {
    /// Direct gRPC address (bypasses kube port-forward).
    #[arg(short = 'a', long, default_value = "")]
    address: String,
    /// Output format: text, yaml, json.
    #[arg(short = 'o', long, default_value = "text")]
    output: String,
    /// Timeout for the operation.
    #[arg(short = 't', long, default_value = "10s")]
    timeout: String,
}

#[derive(Debug, clap::Args)]
struct ChangeArgs {
    /// Direct gRPC address (bypasses kube port-forward).
    #[arg(short = 'a', long, default_value = "")]
    address: String,
    /// Skip safety check and confirmation (promote); skip confirmation prompt (demote).
    #[arg(short = 'f', long, default_value_t = false)]
    force: bool,
    /// Timeout for the operation.
    #[arg(short = 't', long, default_value = "30s")]
    timeout: String,
}

/// Runs `ha <command>`, reading confirmations from stdin and printing to stdout.
///
/// # Errors
/// As upstream: the call failed (with a hint for TLS failures), or bad flags.
pub async fn run(global: &GlobalFlags, args: HaArgs) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    run_with(global, args, &mut stdin.lock(), &mut out).await
}

async fn run_with(
    global: &GlobalFlags,
    args: HaArgs,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let tls = Tls::from_flags(&args)?;
    match args.command {
        HaCommand::Status(s) => {
            let format = Format::parse(&s.output)?;
            let timeout = duration(&s.timeout)?;
            let status = call(global, &tls, &s.address, timeout, |mut c| async move {
                c.status(StatusRequest {}).await.map(tonic::Response::into_inner)
            })
            .await
            .map_err(|e| hinted("failed to get HA status", e, &tls))?;
            out.write_all(render(&status, format, now_unix())?.as_bytes())?;
        }
        HaCommand::Promote(c) => {
            if !c.force
                && !confirm(
                    input,
                    out,
                    "WARNING: This will promote the principal to ACTIVE.\nConnected agents may need to reconnect.\n",
                )?
            {
                return Ok(());
            }
            let timeout = duration(&c.timeout)?;
            let force = c.force;
            let answer = call(global, &tls, &c.address, timeout, |mut cl| async move {
                cl.promote(PromoteRequest { force }).await.map(tonic::Response::into_inner)
            })
            .await
            .map_err(|e| hinted("promote failed", e, &tls))?;
            writeln!(out, "Promoted. State is now: {}", answer.state)?;
        }
        HaCommand::Demote(c) => {
            if !c.force
                && !confirm(
                    input,
                    out,
                    "WARNING: This will demote the principal to REPLICA.\nAll connected agents will be disconnected.\n",
                )?
            {
                return Ok(());
            }
            let timeout = duration(&c.timeout)?;
            let answer = call(global, &tls, &c.address, timeout, |mut cl| async move {
                cl.demote(DemoteRequest {}).await.map(tonic::Response::into_inner)
            })
            .await
            .map_err(|e| hinted("demote failed", e, &tls))?;
            writeln!(out, "Demoted. State is now: {}", answer.state)?;
        }
    }
    Ok(())
}

fn duration(text: &str) -> anyhow::Result<Duration> {
    crate::flags::parse_duration(text).with_context(|| format!("--timeout {text:?}"))
}

fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Upstream's prompt: `y` or `Y` proceeds; anything else prints `Operation cancelled.`.
fn confirm(input: &mut dyn BufRead, out: &mut dyn Write, warning: &str) -> anyhow::Result<bool> {
    write!(out, "{warning}\nProceed? [y/N]: ")?;
    out.flush()?;
    let mut line = String::new();
    input.read_line(&mut line)?;
    let yes = matches!(line.trim(), "y" | "Y");
    if !yes {
        writeln!(out, "Operation cancelled.")?;
    }
    Ok(yes)
}

/// `--tls-cert`, `--tls-key`, `--tls-ca`: none (plaintext) or all three.
#[derive(Debug, Clone)]
enum Tls {
    None,
    Mutual { cert: String, key: String, ca: String },
}

impl Tls {
    fn from_flags(args: &HaArgs) -> anyhow::Result<Self> {
        match (args.tls_cert.as_str(), args.tls_key.as_str(), args.tls_ca.as_str()) {
            ("", "", "") => Ok(Self::None),
            (cert, key, ca) if !cert.is_empty() && !key.is_empty() && !ca.is_empty() => {
                let read = |p: &str, flag: &str| std::fs::read_to_string(p).with_context(|| format!("{flag} {p}"));
                Ok(Self::Mutual {
                    cert: read(cert, "--tls-cert")?,
                    key: read(key, "--tls-key")?,
                    ca: read(ca, "--tls-ca")?,
                })
            }
            _ => anyhow::bail!("all three flags --tls-cert, --tls-key, and --tls-ca are required for mTLS"),
        }
    }

    fn endpoint(&self, address: &str) -> anyhow::Result<Endpoint> {
        let scheme = if matches!(self, Self::None) { "http" } else { "https" };
        let endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .with_context(|| format!("--address {address:?}: HOST:PORT"))?
            .connect_timeout(Duration::from_secs(10));
        Ok(match self {
            Self::None => endpoint,
            Self::Mutual { cert, key, ca } => endpoint.tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                    .identity(tonic::transport::Identity::from_pem(cert, key)),
            )?,
        })
    }
}

/// A failed call, as upstream reports it.
#[derive(Debug)]
enum CallError {
    Connect(anyhow::Error),
    Status(tonic::Status),
    Timeout(Duration),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connect(e) => write!(f, "{e:#}"),
            Self::Status(s) => write!(f, "rpc error: code = {:?} desc = {}", s.code(), s.message()),
            Self::Timeout(t) => write!(f, "context deadline exceeded (after {t:?})"),
        }
    }
}

/// Connects (directly, or through a port-forward to the principal pod) and makes one call
/// within `timeout`.
async fn call<T, F, Fut>(
    global: &GlobalFlags,
    tls: &Tls,
    address: &str,
    timeout: Duration,
    rpc: F,
) -> Result<T, CallError>
where
    F: FnOnce(HaAdminClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let work = async {
        let channel = if address.is_empty() {
            port_forward(global, tls).await.map_err(CallError::Connect)?
        } else {
            let endpoint = tls.endpoint(address).map_err(CallError::Connect)?;
            endpoint
                .connect()
                .await
                .map_err(|e| CallError::Connect(anyhow::anyhow!("cannot connect to {address}: {e:?}")))?
        };
        rpc(HaAdminClient::new(channel)).await.map_err(CallError::Status)
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| CallError::Timeout(timeout))?
}

/// A channel through a port-forward to the principal pod's admin port (upstream's default):
/// a listener on 127.0.0.1 whose every connection is piped through a new port-forward, for as
/// long as this command runs.
async fn port_forward(global: &GlobalFlags, tls: &Tls) -> anyhow::Result<Channel> {
    let client = super::kube::client(global.kubeconfig.as_deref(), global.principal_context()).await?;
    let ns = global.principal_namespace.clone();
    let pods: kube::Api<Pod> = kube::Api::namespaced(client, &ns);
    let list = pods.list(&kube::api::ListParams::default().labels(PRINCIPAL_POD_LABEL).limit(1)).await?;
    let name = list
        .items
        .first()
        .and_then(|p| p.metadata.name.clone())
        .with_context(|| format!("no principal pod found with label {PRINCIPAL_POD_LABEL} in namespace {ns}"))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("port-forward: local listener")?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let (pods, name) = (pods.clone(), name.clone());
            tokio::spawn(async move {
                let forwarded = async {
                    let mut forward = pods.portforward(&name, &[ADMIN_PORT]).await?;
                    let mut stream = forward
                        .take_stream(ADMIN_PORT)
                        .ok_or_else(|| anyhow::anyhow!("the port-forward to {name} gave no stream"))?;
                    tokio::io::copy_bidirectional(&mut conn, &mut stream).await?;
                    anyhow::Ok(())
                };
                if let Err(e) = forwarded.await {
                    eprintln!("argocd-agentctl: port-forward: {e:#}");
                }
            });
        }
    });
    tls.endpoint(&local.to_string())?.connect().await.context("port-forward to the principal's HA admin port")
}

/// Upstream's `wrapWithTLSHint`.
fn hinted(what: &str, e: CallError, tls: &Tls) -> anyhow::Error {
    let hint = match &e {
        CallError::Status(s) if s.code() == tonic::Code::Unauthenticated => Some(
            "mTLS authentication failed. Verify the client certificate is trusted and matches the principal's --ha-admin-auth policy",
        ),
        CallError::Status(s) if s.code() == tonic::Code::PermissionDenied => {
            Some("client certificate identity does not match the principal's --ha-admin-auth policy")
        }
        CallError::Status(_) => None,
        _ if matches!(tls, Tls::None) => {
            Some("the admin endpoint may require mTLS. Provide --tls-cert, --tls-key, and --tls-ca flags")
        }
        _ => Some("TLS handshake failed. Verify that the client certificate is signed by the CA the server trusts"),
    };
    match hint {
        Some(h) => anyhow::anyhow!("{what}: {e}\n\nHint: {h}"),
        None => anyhow::anyhow!("{what}: {e}"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Text,
    Yaml,
    Json,
}

impl Format {
    fn parse(text: &str) -> anyhow::Result<Self> {
        match text {
            "text" => Ok(Self::Text),
            "yaml" => Ok(Self::Yaml),
            "json" => Ok(Self::Json),
            other => anyhow::bail!("unknown output format: {other}"),
        }
    }
}

/// `ha status` output, as upstream prints it.
fn render(s: &HaStatusResponse, format: Format, now: i64) -> anyhow::Result<String> {
    use std::fmt::Write as _;
    match format {
        Format::Text => {
            let mut t = String::new();
            writeln!(t, "HA Status")?;
            writeln!(t, "---------")?;
            writeln!(t, "State:             {}", s.state)?;
            writeln!(t, "Preferred Role:    {}", s.preferred_role)?;
            if !s.peer_address.is_empty() {
                writeln!(t, "Peer Address:      {}", s.peer_address)?;
            }
            if s.state == "active" {
                writeln!(t, "Connected Replicas: {}", s.connected_replicas)?;
            } else {
                writeln!(t, "Replicating:       {}", s.peer_reachable)?;
            }
            writeln!(t, "Connected Agents:  {}", s.connected_agents)?;
            if s.last_event_timestamp > 0 {
                writeln!(t, "Last Event:        {}s ago", now - s.last_event_timestamp)?;
            }
            if s.last_sequence_num > 0 {
                writeln!(t, "Last Sequence:     {}", s.last_sequence_num)?;
            }
            Ok(t)
        }
        Format::Json => {
            // Go's json.MarshalIndent of the generated struct: snake_case, zero values omitted.
            let mut m = serde_json::Map::new();
            let mut put = |k: &str, v: serde_json::Value, zero: bool| {
                if !zero {
                    m.insert(k.to_owned(), v);
                }
            };
            put("state", s.state.clone().into(), s.state.is_empty());
            put("preferred_role", s.preferred_role.clone().into(), s.preferred_role.is_empty());
            put("peer_address", s.peer_address.clone().into(), s.peer_address.is_empty());
            put("peer_reachable", s.peer_reachable.into(), !s.peer_reachable);
            put("peer_state", s.peer_state.clone().into(), s.peer_state.is_empty());
            put("connected_replicas", s.connected_replicas.into(), s.connected_replicas == 0);
            put("last_event_timestamp", s.last_event_timestamp.into(), s.last_event_timestamp == 0);
            put("last_sequence_num", s.last_sequence_num.into(), s.last_sequence_num == 0);
            put("connected_agents", s.connected_agents.into(), s.connected_agents == 0);
            Ok(serde_json::to_string_pretty(&serde_json::Value::Object(m))? + "\n")
        }
        Format::Yaml => {
            // yaml.v3 of the generated struct: lowercased Go field names, every field.
            let mut m = serde_yaml::Mapping::new();
            let mut put = |k: &str, v: serde_yaml::Value| {
                m.insert(k.into(), v);
            };
            put("state", s.state.clone().into());
            put("preferredrole", s.preferred_role.clone().into());
            put("peeraddress", s.peer_address.clone().into());
            put("peerreachable", s.peer_reachable.into());
            put("peerstate", s.peer_state.clone().into());
            put("connectedreplicas", s.connected_replicas.into());
            put("lasteventtimestamp", s.last_event_timestamp.into());
            put("lastsequencenum", s.last_sequence_num.into());
            put("connectedagents", s.connected_agents.into());
            Ok(serde_yaml::to_string(&m)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use principal::ha::{Ha, HaConfig, Role, admin};
    use tokio_util::sync::CancellationToken;

    use super::*;

    #[derive(clap::Parser)]
    struct Demo {
        #[command(flatten)]
        global: GlobalFlags,
        #[command(subcommand)]
        cmd: Top,
    }

    #[derive(clap::Subcommand)]
    enum Top {
        Ha(HaArgs),
    }

    /// Runs `argocd-agentctl ha <args>` with `input` as stdin; its stdout, or its error.
    async fn ctl(args: &[&str], input: &str) -> Result<String, String> {
        let demo = crate::flags::upstream_style(<Demo as clap::CommandFactory>::command())
            .try_get_matches_from(["argocd-agentctl", "ha"].iter().chain(args).copied())
            .map_err(|e| e.to_string())?;
        let demo = <Demo as clap::FromArgMatches>::from_arg_matches(&demo).map_err(|e| e.to_string())?;
        let Top::Ha(ha) = demo.cmd;
        let mut out = Vec::new();
        run_with(&demo.global, ha, &mut input.as_bytes(), &mut out).await.map_err(|e| format!("{e:#}"))?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    async fn admin_server(role: Role) -> (Arc<Ha>, String, CancellationToken) {
        let ha = Ha::standalone(HaConfig { preferred_role: role, peer_address: String::new(), ..HaConfig::default() });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let cancel = CancellationToken::new();
        tokio::spawn(admin::serve(listener, None, admin::AdminService::new(ha.clone(), None), cancel.clone()));
        (ha, addr, cancel)
    }

    #[tokio::test]
    async fn status_promote_and_demote_as_upstream_prints_them() {
        let (ha, addr, cancel) = admin_server(Role::Primary).await;
        let text = ctl(&["status", "-a", &addr], "").await.expect("status");
        assert_eq!(
            text,
            "HA Status\n---------\nState:             active\nPreferred Role:    primary\nConnected Replicas: 0\nConnected Agents:  0\n"
        );
        let json = ctl(&["status", "--address", &addr, "-o", "json"], "").await.expect("json");
        assert_eq!(json, "{\n  \"state\": \"active\",\n  \"preferred_role\": \"primary\"\n}\n");
        let yaml = ctl(&["status", "-a", &addr, "-o", "yaml"], "").await.expect("yaml");
        assert!(yaml.starts_with("state: active\npreferredrole: primary\n"), "{yaml}");
        assert!(yaml.contains("connectedagents: 0"), "{yaml}");
        assert_eq!(ctl(&["status", "-a", &addr, "-o", "xml"], "").await.unwrap_err(), "unknown output format: xml");

        // Without --force: the prompt; anything but y cancels.
        let cancelled = ctl(&["demote", "-a", &addr], "n\n").await.expect("cancelled");
        assert!(cancelled.starts_with("WARNING: This will demote the principal to REPLICA.\n"), "{cancelled}");
        assert!(cancelled.ends_with("Proceed? [y/N]: Operation cancelled.\n"), "{cancelled}");
        assert_eq!(ha.state(), principal::ha::State::Active);
        let demoted = ctl(&["demote", "-a", &addr], "y\n").await.expect("demote");
        assert!(demoted.ends_with("Demoted. State is now: replicating\n"), "{demoted}");
        let again = ctl(&["demote", "-a", &addr, "-f"], "").await.unwrap_err();
        assert!(again.starts_with("demote failed: rpc error: code = FailedPrecondition"), "{again}");
        assert!(again.contains("can only demote from active state, current: replicating"), "{again}");

        // A replica that never synced is promoted only with --force.
        let refused = ctl(&["promote", "-a", &addr, "-f=false"], "y\n").await.unwrap_err();
        assert!(refused.contains("promote failed") && refused.contains("use --force"), "{refused}");
        let promoted = ctl(&["promote", "-a", &addr, "--force"], "").await.expect("promote");
        assert_eq!(promoted, "Promoted. State is now: active\n");
        let text = ctl(&["status", "-a", &addr], "").await.expect("status");
        assert!(text.contains("State:             active"), "{text}");
        cancel.cancel();
    }

    #[tokio::test]
    async fn tls_flags_come_in_threes_and_failures_carry_upstreams_hints() {
        let err = ctl(&["status", "-a", "127.0.0.1:1", "--tls-cert", "/c"], "").await.unwrap_err();
        assert_eq!(err, "all three flags --tls-cert, --tls-key, and --tls-ca are required for mTLS");
        // Nothing listens on port 1: a connection failure, with the hint to try mTLS.
        let err = ctl(&["status", "-a", "127.0.0.1:1", "-t", "5s"], "").await.unwrap_err();
        assert!(err.starts_with("failed to get HA status: "), "{err}");
        assert!(err.contains("Hint: the admin endpoint may require mTLS"), "{err}");
    }

    #[test]
    fn status_text_shows_replica_fields() {
        let s = HaStatusResponse {
            state: "replicating".into(),
            preferred_role: "replica".into(),
            peer_address: "a:8443".into(),
            peer_reachable: true,
            last_event_timestamp: 90,
            last_sequence_num: 7,
            ..HaStatusResponse::default()
        };
        let text = render(&s, Format::Text, 100).expect("text");
        assert_eq!(
            text,
            "HA Status\n---------\nState:             replicating\nPreferred Role:    replica\nPeer Address:      a:8443\n\
             Replicating:       true\nConnected Agents:  0\nLast Event:        10s ago\nLast Sequence:     7\n"
        );
    }
}
