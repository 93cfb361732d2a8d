//! `argocd-agentctl agent`: agents as the principal's Argo CD knows them, one cluster secret
//! `cluster-<agent>` each in the principal's namespace (upstream `cmd/ctl/agent.go`; the secret's
//! shape is in [`super::cluster`]).
//!
//! Argo CD uses the secret to reach the agent's cluster through the principal's resource proxy: the
//! server URL names the proxy and the agent, the client certificate (CN = agent name, issued by the
//! principal's CA) authenticates Argo CD to the proxy, and `caData` verifies the proxy.

use anyhow::{Context as _, bail};
use clap::Subcommand;
use time::OffsetDateTime;

use super::certs::{self, LeafSpec, Usage};
use super::cluster::{self, ClusterConfig, ClusterSecret};
use super::kube::{Secrets, field_text};
use super::pki::{self, KeyGenFlags};
use super::x509::{self, Expiry};
use super::{GlobalFlags, names};

/// `agent` subcommands.
#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Create an agent's configuration: its Argo CD cluster secret in the principal's namespace,
    /// with a client certificate issued by the principal's CA (or taken from existing secrets).
    Create(CreateArgs),
    /// List the configured agents.
    List(ListArgs),
    /// Inspect an agent's configuration (server, certificate subject, validity, fingerprint).
    #[command(visible_alias = "show")]
    Inspect(InspectArgs),
    /// Print the TLS client certificate, key or CA of an agent's cluster secret to stdout.
    #[command(visible_alias = "dump-tls")]
    PrintTls(PrintTlsArgs),
    /// Reconfigure an agent's properties (resource proxy address, credentials, client certificate).
    Reconfigure(ReconfigureArgs),
}

/// `agent create` flags.
#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The agent's name (a DNS-1123 label; the CN of its client certificate).
    name: String,
    /// Address (HOST:PORT) of the principal's resource proxy, as Argo CD reaches it.
    #[arg(long, default_value = cluster::DEFAULT_RESOURCE_PROXY, value_name = "HOST:PORT")]
    resource_proxy_server: String,
    /// Additional labels for the agent's cluster secret (key=value; comma-separated or repeated).
    #[arg(short, long = "label", value_delimiter = ',', value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Take the client certificate and key from this existing secret (keys tls.crt, tls.key)
    /// instead of issuing one. Format: [namespace/]name (default namespace: the principal's).
    #[arg(long, value_name = "[NS/]NAME", requires = "ca_from_secret")]
    tls_from_secret: Option<String>,
    /// Take the CA certificate from this existing secret (key ca.crt). Format: [namespace/]name.
    #[arg(long, value_name = "[NS/]NAME", requires = "tls_from_secret")]
    ca_from_secret: Option<String>,
    /// Validity of the issued client certificate in days.
    #[arg(long, default_value_t = certs::DEFAULT_LEAF_DAYS, conflicts_with = "tls_from_secret")]
    days: u32,
    #[command(flatten)]
    key: KeyGenFlags,
}

/// `agent list` flags.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Only list agents whose cluster secret matches these label selectors (comma-separated or
    /// repeated, e.g. env=prod).
    #[arg(short, long = "label", value_delimiter = ',', value_name = "SELECTOR")]
    labels: Vec<String>,
}

/// `agent inspect` flags.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The agent's name.
    name: String,
    /// Output format (json, yaml or text).
    #[arg(short, long, default_value = "json", value_parser = ["json", "yaml", "text"])]
    output: String,
}

/// `agent print-tls` flags.
#[derive(Debug, clap::Args)]
pub struct PrintTlsArgs {
    /// The agent's name.
    name: String,
    /// What to print (cert, key or ca).
    #[arg(short = 't', long = "type", default_value = "cert", value_parser = ["cert", "key", "ca"])]
    what: String,
}

/// `agent reconfigure` flags.
#[derive(Debug, clap::Args)]
pub struct ReconfigureArgs {
    /// The agent's name.
    name: String,
    /// New address of the principal's resource proxy: HOST:PORT (written as
    /// https://HOST:PORT?agentName=NAME, as `agent create` does) or a full https:// URL.
    #[arg(long, value_name = "HOST:PORT|URL")]
    resource_proxy_server: Option<String>,
    /// The username for the resource proxy.
    #[arg(long, value_name = "USER")]
    resource_proxy_username: Option<String>,
    /// The password for the resource proxy.
    #[arg(long, value_name = "PASSWORD")]
    resource_proxy_password: Option<String>,
    /// Reissue the agent's client certificate from the principal's CA (also rewrites caData).
    #[arg(long)]
    reissue_client_cert: bool,
    /// Validity of the reissued client certificate in days.
    #[arg(long, default_value_t = certs::DEFAULT_LEAF_DAYS, requires = "reissue_client_cert")]
    days: u32,
    #[command(flatten)]
    key: KeyGenFlags,
}

/// Run an `agent` subcommand.
///
/// # Errors
/// Whatever the subcommand reports.
pub async fn run(global: &GlobalFlags, cmd: AgentCommand) -> anyhow::Result<()> {
    match cmd {
        AgentCommand::Create(args) => create(global, args).await,
        AgentCommand::List(args) => list(global, &args).await,
        AgentCommand::Inspect(args) => inspect(global, &args).await,
        AgentCommand::PrintTls(args) => print_tls(global, &args).await,
        AgentCommand::Reconfigure(args) => reconfigure(global, args).await,
    }
}

async fn create(global: &GlobalFlags, args: CreateArgs) -> anyhow::Result<()> {
    names::validate_agent_name(&args.name)?;
    let algorithm = args.key.parse()?;
    let mut labels = cluster::parse_labels(&args.labels, "-l/--label")?;
    for reserved in [cluster::LABEL_AGENT_NAME, cluster::LABEL_SECRET_TYPE] {
        if labels.remove(reserved).is_some() {
            eprintln!("warning: label {reserved} is set by argocd-agentctl; the -l value is ignored");
        }
    }
    let server = cluster::server_url(&args.resource_proxy_server, &args.name)?;
    if args.name == global.principal_namespace {
        eprintln!(
            "warning: agent name {:?} equals the principal namespace; the principal rejects such an agent",
            args.name
        );
    }
    let secrets = global.principal_secrets().await?;
    let ns = secrets.namespace().to_owned();
    let secret_name = cluster::secret_name(&args.name);
    if secrets.get(&secret_name).await?.is_some() {
        bail!(
            "agent {} exists: secret {ns}/{secret_name} is already there (change it with argocd-agentctl agent \
             reconfigure {}, or delete the secret first)",
            args.name,
            args.name
        );
    }
    let (cert, key, ca) = match (&args.tls_from_secret, &args.ca_from_secret) {
        (Some(tls_ref), Some(ca_ref)) => tls_from_secrets(&secrets, tls_ref, ca_ref).await?,
        _ => issue_client_cert(&secrets, &args.name, algorithm, args.days).await?,
    };
    let mut config = ClusterConfig::default();
    config.tls_client_config.set(&cert, &key, &ca);
    let new = ClusterSecret::new(&ns, &args.name, server, labels, config);
    if !secrets.create(&new.to_secret()?).await? {
        bail!("agent {} exists: secret {ns}/{secret_name} was created meanwhile", args.name);
    }
    println!("Agent {} created (cluster secret {ns}/{secret_name})", args.name);
    Ok(())
}

/// Issue a client certificate for `agent` from the CA in the principal's namespace; returns
/// (certificate, key, CA certificate) PEMs.
async fn issue_client_cert(
    principal: &Secrets,
    agent: &str,
    algorithm: super::keys::KeyAlgorithm,
    days: u32,
) -> anyhow::Result<(String, String, String)> {
    let ca = pki::load_ca(principal).await?;
    let key = algorithm.generate()?;
    let spec = LeafSpec {
        common_name: agent.to_owned(),
        ips: Vec::new(),
        dns: Vec::new(),
        uris: Vec::new(),
        usage: Usage::ProxyClient,
    };
    let cert = ca.issue(&spec, &key, days)?;
    Ok((cert, key.serialize_pem(), ca.cert_pem))
}

/// `--tls-from-secret` and `--ca-from-secret`: read and check the existing material.
async fn tls_from_secrets(
    principal: &Secrets,
    tls_ref: &str,
    ca_ref: &str,
) -> anyhow::Result<(String, String, String)> {
    let client = principal.client();
    let (tls_ns, tls_name) = split_ref(tls_ref, principal.namespace());
    let tls = Secrets::new(client.clone(), tls_ns)
        .get(tls_name)
        .await?
        .with_context(|| format!("TLS secret {tls_ns}/{tls_name} (--tls-from-secret) does not exist"))?;
    let cert = field_text(&tls, "tls.crt")?;
    let key = field_text(&tls, "tls.key")?;
    x509::parse_pem(&cert).and_then(|info| info.check_key(&key)).with_context(|| {
        format!("invalid TLS certificate/key pair in secret {tls_ns}/{tls_name} (--tls-from-secret)")
    })?;
    let (ca_ns, ca_name) = split_ref(ca_ref, principal.namespace());
    let ca_secret = Secrets::new(client, ca_ns)
        .get(ca_name)
        .await?
        .with_context(|| format!("CA secret {ca_ns}/{ca_name} (--ca-from-secret) does not exist"))?;
    let ca = field_text(&ca_secret, "ca.crt")?;
    x509::parse_bundle(&ca)
        .with_context(|| format!("field ca.crt of secret {ca_ns}/{ca_name} holds no certificate"))?;
    Ok((cert, key, ca))
}

/// `[namespace/]name`, defaulting the namespace.
fn split_ref<'a>(reference: &'a str, default_ns: &'a str) -> (&'a str, &'a str) {
    match reference.split_once('/') {
        Some(("", name)) => (default_ns, name),
        Some((ns, name)) => (ns, name),
        None => (default_ns, reference),
    }
}

/// Read `cluster-<agent>`, failing with upstream's "no such agent" when it is missing.
async fn load(secrets: &Secrets, agent: &str) -> anyhow::Result<ClusterSecret> {
    let name = cluster::secret_name(agent);
    let secret = secrets.get(&name).await?.with_context(|| {
        format!(
            "no such agent configured: {agent} (there is no secret {}/{name}; see argocd-agentctl agent list, or \
             create it with argocd-agentctl agent create {agent})",
            secrets.namespace()
        )
    })?;
    Ok(ClusterSecret::from_secret(secret)?)
}

async fn list(global: &GlobalFlags, args: &ListArgs) -> anyhow::Result<()> {
    let secrets = global.principal_secrets().await?;
    let mut selector: Vec<&str> = args.labels.iter().map(|l| l.trim()).filter(|l| !l.is_empty()).collect();
    selector.push(cluster::LABEL_AGENT_NAME);
    let mut found = secrets.list(Some(&selector.join(","))).await?;
    found.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    if found.is_empty() {
        bail!(
            "no agents found in namespace {} (create one with argocd-agentctl agent create NAME)",
            secrets.namespace()
        );
    }
    let now = OffsetDateTime::now_utc();
    let mut rows = vec![["NAME", "SERVER", "AUTH", "CERT NOT AFTER", "SKIP-RECONCILE"].map(str::to_owned)];
    for secret in found {
        let fallback = secret.metadata.name.clone().unwrap_or_default();
        let Ok(cs) = ClusterSecret::from_secret(secret) else {
            rows.push([fallback, "(invalid config)".into(), "-".into(), "-".into(), "-".into()]);
            continue;
        };
        let agent =
            cs.agent().map_or_else(|| cs.secret_name().trim_start_matches("cluster-").to_owned(), str::to_owned);
        let expiry = match cs.config.tls_client_config.cert_pem().map(|pem| x509::parse_pem(&pem)) {
            None => "-".to_owned(),
            Some(Err(_)) => "(invalid)".to_owned(),
            Some(Ok(cert)) => match cert.expiry(now, 0) {
                Expiry::Expired(t) => format!("{} (expired)", x509::rfc3339(t)),
                Expiry::NotYetValid(t) => format!("{} (not yet valid)", x509::rfc3339(t)),
                Expiry::Soon(t) | Expiry::Valid(t) => x509::rfc3339(t),
            },
        };
        let skip = if cs.skips_reconcile() { "true" } else { "MISSING" };
        rows.push([agent, cs.server.clone(), cs.auth_kind().to_owned(), expiry, skip.to_owned()]);
    }
    print!("{}", table(&rows));
    Ok(())
}

/// Left-aligned columns, two spaces apart.
fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

async fn inspect(global: &GlobalFlags, args: &InspectArgs) -> anyhow::Result<()> {
    let secrets = global.principal_secrets().await?;
    let cs = load(&secrets, &args.name).await?;
    let tls = &cs.config.tls_client_config;
    let mut warnings = Vec::new();
    let mut out = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        out.insert(k.to_owned(), v);
    };
    put("server", cs.server.clone().into());
    put("name", cs.name.clone().into());
    put("agent", cs.agent().unwrap_or_default().into());
    put("secret", format!("{}/{}", secrets.namespace(), cs.secret_name()).into());
    put("auth", cs.auth_kind().into());
    put("skipReconcile", cs.skips_reconcile().into());
    put("selfRegistered", (cs.label(cluster::LABEL_SELF_REGISTERED) == Some("true")).into());
    if !cs.skips_reconcile() {
        warnings.push(format!("annotation {}=true is missing", cluster::ANNOTATION_SKIP_RECONCILE));
    }
    if cs.agent().is_none() {
        warnings.push(format!("label {} is missing: the principal cannot map this cluster", cluster::LABEL_AGENT_NAME));
    }
    let principal_ca = match secrets.get(pki::SECRET_PRINCIPAL_CA).await? {
        Some(secret) => field_text(&secret, "tls.crt").ok().and_then(|pem| x509::parse_pem(&pem).ok()),
        None => None,
    };
    if let Some(pem) = tls.cert_pem() {
        let cert = x509::parse_pem(&pem).with_context(|| {
            format!(
                "the client certificate (config.tlsClientConfig.certData) of secret {} is invalid",
                cs.secret_name()
            )
        })?;
        put("subject", cert.subject.clone().into());
        put("issuer", cert.issuer.clone().into());
        put("notValidBefore", x509::rfc3339(cert.not_before).into());
        put("notValidAfter", x509::rfc3339(cert.not_after).into());
        put("sha256", cert.sha256.clone().into());
        if let Expiry::Expired(_) | Expiry::NotYetValid(_) = cert.expiry(OffsetDateTime::now_utc(), 0) {
            warnings.push("the client certificate is not valid now (expired or not yet valid)".to_owned());
        }
        if let Some(ca) = &principal_ca
            && !cert.signed_by(ca)
        {
            warnings.push(format!("the client certificate was not issued by the principal's CA ({})", ca.subject));
        }
        if let Err(e) = tls.key_pem().map_or_else(|| Err(anyhow::anyhow!("no key")), |key| cert.check_key(&key)) {
            warnings.push(format!("the client key (keyData) does not fit the certificate: {e:#}"));
        }
    }
    if let Some(pem) = tls.ca_pem() {
        let cas: Vec<String> =
            x509::parse_bundle(&pem).map(|c| c.into_iter().map(|c| c.subject).collect()).unwrap_or_default();
        put("caSubjects", cas.into());
    }
    put("warnings", warnings.clone().into());
    let out = serde_json::Value::Object(out);
    match args.output.as_str() {
        "yaml" => print!("{}", serde_yaml::to_string(&out)?),
        "text" => print!("{}", inspect_text(&out)),
        _ => println!("{}", serde_json::to_string_pretty(&out)?),
    }
    Ok(())
}

/// `agent inspect -o text`: upstream's labels first, then ours.
fn inspect_text(out: &serde_json::Value) -> String {
    let fields = [
        ("server", "Server address"),
        ("name", "Server name"),
        ("agent", "Agent"),
        ("secret", "Secret"),
        ("auth", "Authentication"),
        ("skipReconcile", "Skip reconcile"),
        ("selfRegistered", "Self-registered"),
        ("subject", "Subject"),
        ("issuer", "Issuer"),
        ("notValidBefore", "Not valid before"),
        ("notValidAfter", "Not valid after"),
        ("sha256", "Fingerprint"),
        ("caSubjects", "CA"),
        ("warnings", "Warnings"),
    ];
    let mut text = String::new();
    for (key, label) in fields {
        let value = match out.get(key) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(items)) if !items.is_empty() => {
                items.iter().filter_map(|i| i.as_str()).collect::<Vec<_>>().join("; ")
            }
            Some(serde_json::Value::Bool(b)) => b.to_string(),
            _ => continue,
        };
        text.push_str(&format!("{label:<18}{value}\n"));
    }
    text
}

async fn print_tls(global: &GlobalFlags, args: &PrintTlsArgs) -> anyhow::Result<()> {
    let secrets = global.principal_secrets().await?;
    let cs = load(&secrets, &args.name).await?;
    let tls = &cs.config.tls_client_config;
    let (value, field) = match args.what.as_str() {
        "key" => (tls.key_pem(), "keyData"),
        "ca" => (tls.ca_pem(), "caData"),
        _ => (tls.cert_pem(), "certData"),
    };
    let value = value.with_context(|| {
        format!("cluster secret {}/{} has no tlsClientConfig.{field}", secrets.namespace(), cs.secret_name())
    })?;
    print!("{value}");
    Ok(())
}

async fn reconfigure(global: &GlobalFlags, args: ReconfigureArgs) -> anyhow::Result<()> {
    let algorithm = args.key.parse()?;
    let secrets = global.principal_secrets().await?;
    let mut cs = load(&secrets, &args.name).await?;
    let mut changed = false;
    if let Some(address) = &args.resource_proxy_server {
        let server =
            if address.starts_with("https://") { address.clone() } else { cluster::server_url(address, &args.name)? };
        if server != cs.server {
            println!("Setting new server address {server}");
            cs.server = server;
            changed = true;
        }
    }
    if let Some(user) = args.resource_proxy_username.as_ref().filter(|u| !u.is_empty())
        && *user != cs.config.username
    {
        println!("Setting new username");
        cs.config.username.clone_from(user);
        changed = true;
    }
    if let Some(password) = args.resource_proxy_password.as_ref().filter(|p| !p.is_empty())
        && *password != cs.config.password
    {
        println!("Setting new password");
        cs.config.password.clone_from(password);
        changed = true;
    }
    if args.reissue_client_cert {
        println!("Reissuing the client certificate");
        let (cert, key, ca) = issue_client_cert(&secrets, &args.name, algorithm, args.days).await?;
        cs.config.tls_client_config.set(&cert, &key, &ca);
        changed = true;
    }
    if !changed {
        println!("Nothing to change");
        return Ok(());
    }
    secrets.replace(&cs.to_secret()?).await?;
    println!("Cluster configuration saved");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_and_tables() {
        assert_eq!(split_ref("ns/name", "d"), ("ns", "name"));
        assert_eq!(split_ref("name", "d"), ("d", "name"));
        assert_eq!(split_ref("/name", "d"), ("d", "name"));
        let rows = [["A".to_owned(), "BB".to_owned()], ["ccc".to_owned(), String::new()]];
        assert_eq!(table(&rows), "A    BB\nccc\n");
    }
}
