//! `argocd-agentctl pki`: a development PKI kept in Kubernetes secrets, as upstream's
//! `cmd/ctl/ca.go` keeps it:
//!
//! | command | secret | cluster / namespace | type | keys |
//! |---|---|---|---|---|
//! | `pki init` | `argocd-agent-ca` | principal | `kubernetes.io/tls` | `tls.crt`, `tls.key` |
//! | `pki issue principal` | `argocd-agent-principal-tls` | principal | `kubernetes.io/tls` | `tls.crt`, `tls.key` |
//! | `pki issue resource-proxy` | `argocd-agent-resource-proxy-tls` | principal | `kubernetes.io/tls` | `tls.crt`, `tls.key` |
//! | `pki issue agent <name>` | `argocd-agent-client-tls` | agent | `kubernetes.io/tls` | `tls.crt`, `tls.key` |
//! | `pki issue ha-admin` | `argocd-agent-ha-admin-tls` | principal | `kubernetes.io/tls` | `tls.crt`, `tls.key`, `ca.crt` |
//! | `pki propagate` | `argocd-agent-ca` | agent | `Opaque` | `ca.crt` |
//!
//! Upstream sets no labels or annotations on these secrets, and neither do we.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Subcommand;

use super::certs::{self, Ca, LeafSpec, Usage};
use super::keys::{self, KeyAlgorithm};
use super::kube::{IfExists, Secrets, Written, field_text};
use super::out::{OutFile, write_files};
use super::{GlobalFlags, names};

/// Secret holding the CA (certificate and key) in the principal's namespace.
pub const SECRET_PRINCIPAL_CA: &str = "argocd-agent-ca";
/// Secret holding the CA certificate (no key) in the agent's namespace.
pub const SECRET_AGENT_CA: &str = "argocd-agent-ca";
/// Secret holding the principal's gRPC server certificate.
pub const SECRET_PRINCIPAL_TLS: &str = "argocd-agent-principal-tls";
/// Secret holding the resource proxy's server certificate.
pub const SECRET_RESOURCE_PROXY_TLS: &str = "argocd-agent-resource-proxy-tls";
/// The shared client certificate self-registered cluster secrets carry (upstream's name).
pub const SECRET_SHARED_CLIENT_TLS: &str = "argocd-agent-shared-client-tls";
/// CN of the shared client certificate: no agent's name (the bearer token names the agent).
pub const SHARED_CLIENT_COMMON_NAME: &str = "argocd-agent-shared-client";
/// Secret holding the HA admin client certificate (`argocd-agentctl ha --tls-cert/--tls-key/--tls-ca`).
pub const SECRET_HA_ADMIN_TLS: &str = "argocd-agent-ha-admin-tls";
/// CN of the HA admin client certificate: what `--ha-admin-auth 'mtls:subject:^CN=ha-admin(,|$)'` admits.
pub const HA_ADMIN_COMMON_NAME: &str = "ha-admin";
/// Secret holding the client certificate principal replicas present to each other when one
/// forwards a resource-proxy request to the replica that owns the agent (`--agent-leases`).
pub const SECRET_REPLICA_CLIENT_TLS: &str = "argocd-agent-replica-client-tls";
/// CN of the replica client certificate (the subject OU marks it; the CN names no agent).
pub const REPLICA_CLIENT_COMMON_NAME: &str = "argocd-agent-principal-replica";
/// Secret holding an agent's client certificate, in the agent's namespace.
pub const SECRET_AGENT_CLIENT_TLS: &str = "argocd-agent-client-tls";
/// `kubernetes.io/tls`.
pub const TYPE_TLS: &str = "kubernetes.io/tls";
/// `Opaque`.
pub const TYPE_OPAQUE: &str = "Opaque";

/// `pki` subcommands.
#[derive(Debug, Subcommand)]
pub enum PkiCommand {
    /// NON-PROD!! Initialize the PKI for use with argocd-agent (creates the CA).
    Init(InitArgs),
    /// NON-PROD!! Issue TLS certificates signed by the PKI's CA.
    #[command(subcommand, visible_alias = "new-cert")]
    Issue(IssueCommand),
    /// NON-PROD!! Propagate the PKI's CA certificate (not its key) to the agent.
    Propagate(PropagateArgs),
    /// NON-PROD!! Inspect the configured PKI (CA, principal and resource-proxy certificates).
    Inspect(InspectArgs),
    /// Print the PKI's CA data in PEM format to stdout.
    Dump(DumpArgs),
    /// Delete the configured PKI (the CA secret).
    Delete(DeleteArgs),
}

/// `--key-algorithm` and `--key-size`.
#[derive(Debug, Clone, clap::Args)]
pub struct KeyGenFlags {
    /// Private key algorithm (rsa, ecdsa-p256, ecdsa-p384, ed25519).
    #[arg(long = "key-algorithm", default_value = keys::DEFAULT_KEY_ALGORITHM, value_name = "ALG")]
    algorithm: String,
    /// RSA key size in bits (2048, 3072, or 4096; ignored for non-RSA algorithms).
    #[arg(long = "key-size", default_value_t = keys::DEFAULT_RSA_BITS, value_name = "BITS")]
    size: u32,
}

impl KeyGenFlags {
    pub(super) fn parse(&self) -> anyhow::Result<KeyAlgorithm> {
        KeyAlgorithm::parse(&self.algorithm, self.size)
    }
}

/// `pki init` flags.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// Force regeneration of the PKI if it exists (every certificate it issued stops verifying).
    #[arg(short, long)]
    force: bool,
    /// Validity of the CA certificate in days.
    #[arg(long, default_value_t = certs::DEFAULT_CA_DAYS)]
    days: u32,
    #[command(flatten)]
    key: KeyGenFlags,
    /// Also write ca.crt and ca.key into this directory.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

/// `pki issue` subcommands.
#[derive(Debug, Subcommand)]
pub enum IssueCommand {
    /// Issue a TLS server certificate for the principal (secret argocd-agent-principal-tls).
    Principal(PrincipalArgs),
    /// Issue a TLS server certificate for the resource proxy (secret argocd-agent-resource-proxy-tls).
    ResourceProxy(ResourceProxyArgs),
    /// Issue a client certificate for an agent (secret argocd-agent-client-tls in the agent's cluster).
    Agent(AgentArgs),
    /// Issue the client certificate Argo CD presents to the resource proxy for self-registered
    /// agents (secret argocd-agent-shared-client-tls, with ca.crt, in the principal's namespace;
    /// pass its name to the principal's --self-registration-client-cert-secret). It carries the
    /// resource-proxy client mark (subject OU argocd-agent-resource-proxy-client), so it is never
    /// admitted as an agent, and no agent's own certificate opens the resource proxy.
    SharedClient(SharedClientArgs),
    /// Issue the client certificate of `argocd-agentctl ha` for a principal's HA admin endpoint
    /// (CN ha-admin; secret argocd-agent-ha-admin-tls, with ca.crt, in the principal's
    /// namespace). The principals admit it with --ha-admin-auth 'mtls:subject:^CN=ha-admin(,|$)';
    /// use it with `ha status|promote|demote --tls-cert --tls-key --tls-ca` (--out-dir writes them).
    HaAdmin(HaAdminArgs),
    /// Issue the client certificate principal replicas (`--agent-leases`) present to each other
    /// when one forwards a resource-proxy request to the replica that owns the agent (subject OU
    /// argocd-agent-principal-replica; secret argocd-agent-replica-client-tls, with ca.crt, in the
    /// principal's namespace). Only this mark lets a caller name the agent of a forwarded request:
    /// neither an agent's certificate nor a cluster secret's carries it.
    Replica(ReplicaArgs),
}

/// `pki issue replica` flags.
#[derive(Debug, clap::Args)]
pub struct ReplicaArgs {
    /// The Secret to write, in the principal's namespace.
    #[arg(long, default_value = SECRET_REPLICA_CLIENT_TLS, value_name = "NAME")]
    secret_name: String,
    #[command(flatten)]
    issue: IssueFlags,
}

/// `pki issue ha-admin` flags.
#[derive(Debug, clap::Args)]
pub struct HaAdminArgs {
    /// The certificate's CN (what --ha-admin-auth matches).
    #[arg(long, default_value = HA_ADMIN_COMMON_NAME, value_name = "CN")]
    common_name: String,
    /// The Secret to write, in the principal's namespace.
    #[arg(long, default_value = SECRET_HA_ADMIN_TLS, value_name = "NAME")]
    secret_name: String,
    #[command(flatten)]
    issue: IssueFlags,
}

/// `pki issue shared-client` flags.
#[derive(Debug, clap::Args)]
pub struct SharedClientArgs {
    /// The certificate's CN (names no agent: the cluster secret's bearer token does).
    #[arg(long, default_value = SHARED_CLIENT_COMMON_NAME, value_name = "CN")]
    common_name: String,
    /// The Secret to write, in the principal's namespace.
    #[arg(long, default_value = SECRET_SHARED_CLIENT_TLS, value_name = "NAME")]
    secret_name: String,
    #[command(flatten)]
    issue: IssueFlags,
}

/// Flags every `pki issue` subcommand has.
#[derive(Debug, clap::Args)]
pub struct IssueFlags {
    /// Whether to update an existing certificate if it exists.
    #[arg(short, long)]
    upsert: bool,
    /// Validity of the certificate in days.
    #[arg(long, default_value_t = certs::DEFAULT_LEAF_DAYS)]
    days: u32,
    #[command(flatten)]
    key: KeyGenFlags,
    /// Also write ca.crt, <name>.crt and <name>.key into this directory.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

/// `pki issue principal` flags.
#[derive(Debug, clap::Args)]
pub struct PrincipalArgs {
    /// The IP addresses this certificate is valid for (comma-separated or repeated).
    #[arg(long, value_delimiter = ',', default_values_t = ["127.0.0.1".to_owned()], value_name = "IP")]
    ip: Vec<String>,
    /// The DNS names this certificate is valid for (comma-separated or repeated).
    #[arg(long, value_delimiter = ',', default_values_t = ["localhost".to_owned()], value_name = "NAME")]
    dns: Vec<String>,
    /// Also add the URI SAN spiffe://<TD>/ns/<principal-namespace>/sa/argocd-agent-principal.
    #[arg(long, value_name = "TD")]
    spiffe_trust_domain: Option<String>,
    #[command(flatten)]
    issue: IssueFlags,
}

/// `pki issue resource-proxy` flags.
#[derive(Debug, clap::Args)]
pub struct ResourceProxyArgs {
    /// The IP addresses this certificate is valid for (comma-separated or repeated).
    #[arg(long, value_delimiter = ',', value_name = "IP")]
    ip: Vec<String>,
    /// The DNS names this certificate is valid for (comma-separated or repeated).
    #[arg(long, value_delimiter = ',', value_name = "NAME")]
    dns: Vec<String>,
    /// Do not add SAN information to the certificate.
    #[arg(long)]
    no_san: bool,
    #[command(flatten)]
    issue: IssueFlags,
}

/// `pki issue agent` flags.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The agent's name: the certificate's CN, which the principal takes as the agent ID. Must be a
    /// DNS-1123 label.
    name: String,
    /// Use when the PKI and agent use the same context.
    #[arg(long)]
    same_context: bool,
    /// Also add the SPIFFE URI SAN spiffe://<TD>/ns/<namespace>/sa/<service-account> (off unless
    /// given), for principals that authenticate agents by SPIFFE ID (mtls:uri or mesh header auth).
    #[arg(long, value_name = "TD")]
    spiffe_trust_domain: Option<String>,
    /// Namespace part of the SPIFFE ID (default: --agent-namespace).
    #[arg(long, value_name = "NS", requires = "spiffe_trust_domain")]
    spiffe_namespace: Option<String>,
    /// Service-account part of the SPIFFE ID (default: the agent name, which is what
    /// `sa/([^,;]+)` auth regexes extract).
    #[arg(long, value_name = "SA", requires = "spiffe_trust_domain")]
    spiffe_service_account: Option<String>,
    #[command(flatten)]
    issue: IssueFlags,
}

/// `pki propagate` flags.
#[derive(Debug, clap::Args)]
pub struct PropagateArgs {
    /// Replace the agent's CA secret if it exists.
    #[arg(short, long)]
    force: bool,
}

/// `pki inspect` flags.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Also print the certificates themselves (PEM) after the summary.
    #[arg(short, long)]
    full: bool,
    /// Output format (json, yaml or text).
    #[arg(short, long, default_value = "json", value_parser = ["json", "yaml", "text"])]
    output: String,
}

/// `pki dump` flags.
#[derive(Debug, clap::Args)]
pub struct DumpArgs {
    /// Print both, key and cert.
    #[arg(long)]
    all: bool,
    /// Print the private key.
    #[arg(long)]
    key: bool,
    /// Print the public certificate.
    #[arg(long)]
    cert: bool,
}

/// `pki delete` flags.
#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    /// Do not ask for confirmation (upstream always asks).
    #[arg(short, long)]
    yes: bool,
}

/// Run a `pki` subcommand.
///
/// # Errors
/// Whatever the subcommand reports.
pub async fn run(global: &GlobalFlags, cmd: PkiCommand) -> anyhow::Result<()> {
    match cmd {
        PkiCommand::Init(args) => init(global, args).await,
        PkiCommand::Issue(IssueCommand::Principal(args)) => issue_principal(global, args).await,
        PkiCommand::Issue(IssueCommand::ResourceProxy(args)) => issue_resource_proxy(global, args).await,
        PkiCommand::Issue(IssueCommand::Agent(args)) => issue_agent(global, args).await,
        PkiCommand::Issue(IssueCommand::SharedClient(args)) => issue_shared_client(global, args).await,
        PkiCommand::Issue(IssueCommand::HaAdmin(args)) => issue_ha_admin(global, args).await,
        PkiCommand::Issue(IssueCommand::Replica(args)) => issue_replica(global, args).await,
        PkiCommand::Propagate(args) => propagate(global, args).await,
        PkiCommand::Inspect(args) => inspect(global, &args).await,
        PkiCommand::Dump(args) => dump(global, args).await,
        PkiCommand::Delete(args) => delete(global, args).await,
    }
}

async fn init(global: &GlobalFlags, args: InitArgs) -> anyhow::Result<()> {
    let algorithm = args.key.parse()?;
    let secrets = global.principal_secrets().await?;
    let ns = secrets.namespace().to_owned();
    if secrets.get(SECRET_PRINCIPAL_CA).await?.is_some() && !args.force {
        bail!(
            "CA secret {ns}/{SECRET_PRINCIPAL_CA} already exists; delete it first (argocd-agentctl pki delete) or \
             pass --force to regenerate it (certificates it issued will no longer verify)"
        );
    }
    println!("Generating CA and storing it in secret");
    let key = algorithm.generate()?;
    let cert = certs::generate_ca(&key, args.days)?;
    let key_pem = key.serialize_pem();
    let if_exists = if args.force { IfExists::Replace } else { IfExists::Refuse("pass --force to regenerate it") };
    secrets.write(SECRET_PRINCIPAL_CA, TYPE_TLS, tls_data(&cert, &key_pem), if_exists).await?;
    println!("Success. CA data stored in secret {ns}/{SECRET_PRINCIPAL_CA}");
    if let Some(dir) = &args.out_dir {
        write_files(
            dir,
            &[
                OutFile { name: "ca.crt".into(), contents: &cert, private: false },
                OutFile { name: "ca.key".into(), contents: &key_pem, private: true },
            ],
        )?;
    }
    Ok(())
}

async fn issue_principal(global: &GlobalFlags, args: PrincipalArgs) -> anyhow::Result<()> {
    let mut uris = Vec::new();
    if let Some(td) = &args.spiffe_trust_domain {
        uris.push(names::kubernetes_spiffe_id(td, &global.principal_namespace, certs::PRINCIPAL_COMMON_NAME)?);
    }
    let spec = LeafSpec {
        common_name: certs::PRINCIPAL_COMMON_NAME.to_owned(),
        ips: parse_ips(&args.ip)?,
        dns: clean_names(&args.dns),
        uris,
        // `clientAuth` too: a cross-hub HA replica dials its peer's principal with it (docs/ha.md).
        usage: Usage::ServerAndClient,
    };
    let target = global.principal_secrets().await?;
    issue(global, &target, SECRET_PRINCIPAL_TLS, "principal", &spec, &args.issue).await
}

async fn issue_resource_proxy(global: &GlobalFlags, args: ResourceProxyArgs) -> anyhow::Result<()> {
    let spec = LeafSpec {
        common_name: certs::RESOURCE_PROXY_COMMON_NAME.to_owned(),
        ips: parse_ips(&args.ip)?,
        dns: clean_names(&args.dns),
        uris: Vec::new(),
        usage: Usage::Server,
    };
    if args.no_san && (!spec.ips.is_empty() || !spec.dns.is_empty()) {
        bail!("--no-san cannot be combined with --ip or --dns");
    }
    if !args.no_san && spec.ips.is_empty() && spec.dns.is_empty() {
        bail!("pass at least one of --ip or --dns, or --no-san to create a certificate without SANs");
    }
    let target = global.principal_secrets().await?;
    issue(global, &target, SECRET_RESOURCE_PROXY_TLS, "resource-proxy", &spec, &args.issue).await
}

async fn issue_shared_client(global: &GlobalFlags, args: SharedClientArgs) -> anyhow::Result<()> {
    let spec = LeafSpec {
        common_name: args.common_name.clone(),
        ips: Vec::new(),
        dns: Vec::new(),
        uris: Vec::new(),
        usage: Usage::ProxyClient,
    };
    let target = global.principal_secrets().await?;
    issue(global, &target, &args.secret_name, "shared-client", &spec, &args.issue).await
}

async fn issue_ha_admin(global: &GlobalFlags, args: HaAdminArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!args.common_name.trim().is_empty(), "--common-name is empty: give the CN --ha-admin-auth admits");
    let spec = LeafSpec {
        common_name: args.common_name.clone(),
        ips: Vec::new(),
        dns: Vec::new(),
        uris: Vec::new(),
        usage: Usage::Client,
    };
    let target = global.principal_secrets().await?;
    issue(global, &target, &args.secret_name, HA_ADMIN_FILE_STEM, &spec, &args.issue).await
}

async fn issue_replica(global: &GlobalFlags, args: ReplicaArgs) -> anyhow::Result<()> {
    let spec = LeafSpec {
        common_name: REPLICA_CLIENT_COMMON_NAME.to_owned(),
        ips: Vec::new(),
        dns: Vec::new(),
        uris: Vec::new(),
        usage: Usage::ReplicaClient,
    };
    let target = global.principal_secrets().await?;
    issue(global, &target, &args.secret_name, "replica", &spec, &args.issue).await
}

/// `--out-dir` names of `pki issue ha-admin` (`ha-admin.crt`, `ha-admin.key`).
const HA_ADMIN_FILE_STEM: &str = "ha-admin";

async fn issue_agent(global: &GlobalFlags, args: AgentArgs) -> anyhow::Result<()> {
    names::validate_agent_name(&args.name)?;
    if global.same_context() && !args.same_context {
        bail!(
            "PKI and agent usually do not reside within the same context: pass --agent-context (and \
             --principal-context), or --same-context if you really mean it"
        );
    }
    if args.name == global.principal_namespace {
        eprintln!(
            "warning: agent name {:?} equals the principal namespace; the principal rejects such an agent",
            args.name
        );
    }
    let mut uris = Vec::new();
    if let Some(td) = &args.spiffe_trust_domain {
        let ns = args.spiffe_namespace.as_deref().unwrap_or(&global.agent_namespace);
        let sa = args.spiffe_service_account.as_deref().unwrap_or(&args.name);
        uris.push(names::kubernetes_spiffe_id(td, ns, sa)?);
    }
    let spec =
        LeafSpec { common_name: args.name.clone(), ips: Vec::new(), dns: Vec::new(), uris, usage: Usage::Client };
    let target = global.agent_secrets().await?;
    issue(global, &target, SECRET_AGENT_CLIENT_TLS, &args.name, &spec, &args.issue).await
}

/// Sign `spec` with the CA from the principal's cluster and store it in `target`/`secret_name`.
async fn issue(
    global: &GlobalFlags,
    target: &Secrets,
    secret_name: &str,
    file_stem: &str,
    spec: &LeafSpec,
    flags: &IssueFlags,
) -> anyhow::Result<()> {
    let algorithm = flags.key.parse()?;
    let ca = load_ca(&global.principal_secrets().await?).await?;
    // Refuse before spending seconds on an RSA key.
    if !flags.upsert && target.get(secret_name).await?.is_some() {
        bail!("certificate secret {}/{secret_name} already exists; pass --upsert to reissue it", target.namespace());
    }
    let key = algorithm.generate()?;
    let cert = ca.issue(spec, &key, flags.days)?;
    let key_pem = key.serialize_pem();
    let if_exists = if flags.upsert { IfExists::Replace } else { IfExists::Refuse("pass --upsert to reissue it") };
    let ns = target.namespace();
    let mut data = tls_data(&cert, &key_pem);
    if matches!(spec.usage, Usage::ProxyClient | Usage::ReplicaClient) || file_stem == HA_ADMIN_FILE_STEM {
        // What self-registration copies into cluster secrets, as upstream's shared client secret;
        // the CA `argocd-agentctl ha --tls-ca` verifies the principal with.
        data.insert("ca.crt".to_owned(), ca.cert_pem.as_bytes().to_vec());
    }
    match target.write(secret_name, TYPE_TLS, data, if_exists).await? {
        Written::Created => println!("Secret {ns}/{secret_name} created"),
        Written::Replaced => println!("Secret {ns}/{secret_name} updated."),
    }
    if let Some(dir) = &flags.out_dir {
        write_files(
            dir,
            &[
                OutFile { name: "ca.crt".into(), contents: &ca.cert_pem, private: false },
                OutFile { name: format!("{file_stem}.crt"), contents: &cert, private: false },
                OutFile { name: format!("{file_stem}.key"), contents: &key_pem, private: true },
            ],
        )?;
    }
    Ok(())
}

async fn propagate(global: &GlobalFlags, args: PropagateArgs) -> anyhow::Result<()> {
    // Upstream refuses whenever the contexts are equal. What must never happen is writing the
    // agent's key-less CA secret over the principal's CA secret of the same name, so refuse exactly
    // that: same cluster and same namespace.
    if global.same_context() && global.principal_namespace == global.agent_namespace {
        bail!(
            "principal and agent resolve to the same context and namespace ({}); propagating would overwrite the \
             CA secret {SECRET_PRINCIPAL_CA} with its public part: pass --agent-context or a different \
             --agent-namespace",
            global.principal_namespace
        );
    }
    let principal = global.principal_secrets().await?;
    let ca = load_ca(&principal).await?;
    let agent = global.agent_secrets().await?;
    let if_exists = if args.force { IfExists::Replace } else { IfExists::Refuse("pass --force to replace it") };
    let data = BTreeMap::from([("ca.crt".to_owned(), ca.cert_pem.into_bytes())]);
    let verb = match agent.write(SECRET_AGENT_CA, TYPE_OPAQUE, data, if_exists).await? {
        Written::Created => "created",
        Written::Replaced => "updated",
    };
    println!("Agent CA secret {}/{SECRET_AGENT_CA} {verb}", agent.namespace());
    Ok(())
}

async fn inspect(global: &GlobalFlags, args: &InspectArgs) -> anyhow::Result<()> {
    let secrets = global.principal_secrets().await?;
    let ca_secret = secrets.get(SECRET_PRINCIPAL_CA).await?.with_context(|| ca_missing(&secrets))?;
    let mut pems = vec![("ca", "CA", field_text(&ca_secret, "tls.crt")?)];
    for (key, label, name) in [
        ("principal", "Principal", SECRET_PRINCIPAL_TLS),
        ("resourceProxy", "Resource Proxy", SECRET_RESOURCE_PROXY_TLS),
    ] {
        if let Some(secret) = secrets.get(name).await? {
            pems.push((key, label, field_text(&secret, "tls.crt")?));
        }
    }
    let mut summaries = serde_json::Map::new();
    let mut text = String::new();
    for (i, (key, label, pem)) in pems.iter().enumerate() {
        let sum = super::inspect::summarize(pem, i == 0)
            .with_context(|| format!("cannot inspect the {label} certificate in namespace {}", secrets.namespace()))?;
        text.push_str(&format!(
            "{label}:\n  Subject:          {}\n  Key type:         {}\n  Key length:       {}\n  Not valid before: {}\n  \
             Not valid after:  {}\n  Checksum:         {}\n",
            sum.subject, sum.key_type, sum.key_length, sum.not_before, sum.not_after, sum.checksum
        ));
        for (what, values) in [("IPs", &sum.ips), ("DNS", &sum.dns), ("URIs", &sum.uris), ("Warnings", &sum.warnings)] {
            if !values.is_empty() {
                text.push_str(&format!("  {what:<17} {}\n", values.join(", ")));
            }
        }
        summaries.insert((*key).to_owned(), serde_json::to_value(&sum)?);
    }
    let summaries = serde_json::Value::Object(summaries);
    match args.output.as_str() {
        "yaml" => print!("{}", serde_yaml::to_string(&summaries)?),
        "text" => print!("{text}"),
        _ => println!("{}", serde_json::to_string_pretty(&summaries)?),
    }
    if args.full {
        for (_, _, pem) in &pems {
            print!("{pem}");
        }
    }
    Ok(())
}

async fn dump(global: &GlobalFlags, args: DumpArgs) -> anyhow::Result<()> {
    let (print_cert, print_key) = (args.cert || args.all, args.key || args.all);
    if !print_cert && !print_key {
        bail!("one of --all, --key or --cert must be specified");
    }
    let secrets = global.principal_secrets().await?;
    let secret = secrets.get(SECRET_PRINCIPAL_CA).await?.with_context(|| ca_missing(&secrets))?;
    let mut out = String::new();
    if print_cert {
        out.push_str(&field_text(&secret, "tls.crt")?);
    }
    if print_key {
        out.push_str(&field_text(&secret, "tls.key")?);
    }
    print!("{out}");
    Ok(())
}

async fn delete(global: &GlobalFlags, args: DeleteArgs) -> anyhow::Result<()> {
    let secrets = global.principal_secrets().await?;
    if secrets.get(SECRET_PRINCIPAL_CA).await?.is_none() {
        bail!("CA not configured: there is no secret {}/{SECRET_PRINCIPAL_CA}", secrets.namespace());
    }
    if !args.yes {
        let answer = super::ask("Really delete CA (use uppercase YES to delete)?")?;
        if answer != "YES" {
            bail!("aborted: the answer was {answer:?}, not YES");
        }
    }
    if !secrets.delete(SECRET_PRINCIPAL_CA).await? {
        bail!("CA not configured: there is no secret {}/{SECRET_PRINCIPAL_CA}", secrets.namespace());
    }
    println!("CA successfully deleted.");
    Ok(())
}

/// Read and check the CA from the principal's secret.
pub(super) async fn load_ca(secrets: &Secrets) -> anyhow::Result<Ca> {
    let secret = secrets.get(SECRET_PRINCIPAL_CA).await?.with_context(|| ca_missing(secrets))?;
    let cert = field_text(&secret, "tls.crt")?;
    let key = field_text(&secret, "tls.key")?;
    Ca::from_pem(&cert, &key)
        .with_context(|| format!("the CA in secret {}/{SECRET_PRINCIPAL_CA} is unusable", secrets.namespace()))
}

fn ca_missing(secrets: &Secrets) -> String {
    format!(
        "CA is not initialized: there is no secret {}/{SECRET_PRINCIPAL_CA} (run argocd-agentctl pki init, and check \
         --principal-context/--principal-namespace)",
        secrets.namespace()
    )
}

fn tls_data(cert: &str, key: &str) -> BTreeMap<String, Vec<u8>> {
    BTreeMap::from([("tls.crt".to_owned(), cert.as_bytes().to_vec()), ("tls.key".to_owned(), key.as_bytes().to_vec())])
}

/// Parse `--ip` values (trimmed, empty entries skipped), naming the bad one.
fn parse_ips(values: &[String]) -> anyhow::Result<Vec<IpAddr>> {
    values
        .iter()
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .map(|v| v.parse().with_context(|| format!("invalid IP address {v:?} (--ip)")))
        .collect()
}

/// `--dns` values, trimmed, empty entries skipped.
fn clean_names(values: &[String]) -> Vec<String> {
    values.iter().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect()
}
