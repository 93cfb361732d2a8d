//! `argocd-agentctl validate principal|agent`: check the Kubernetes objects an installation needs and
//! what operators get wrong with them, one line per check (`ok`, `WARN`, `FAIL` or `skip`), each
//! failure or warning with how to fix it. Any `FAIL` makes the command exit non-zero.
//!
//! The checks follow upstream's `cmd/ctl/validate.go` where it checks secrets, certificates and
//! cluster secrets (Argo CD deployments, network policies and OpenShift routes are not checked), and
//! add: the CA chain of every certificate, key/certificate pairs, usages, expiry ahead of time, and
//! the agent's trust in the principal's certificate.

use std::fmt;

use anyhow::bail;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use time::OffsetDateTime;

use super::cluster::{self, ClusterSecret};
use super::kube::{Secrets, field_text};
use super::x509::{self, CertInfo, Expiry};
use super::{GlobalFlags, jwt, names, pki};

/// `validate` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ValidateCommand {
    /// Validate the principal's installation: CA, server certificates, JWT key, agent cluster secrets.
    Principal(ValidateArgs),
    /// Validate an agent's installation against its principal (runs the principal checks first).
    Agent(ValidateArgs),
}

/// Flags of both `validate` subcommands.
#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Warn about certificates that expire within this many days.
    #[arg(long, default_value_t = 30, value_name = "DAYS")]
    expiry_warning_days: u32,
    /// Treat warnings as failures (exit non-zero on any WARN).
    #[arg(long)]
    strict: bool,
}

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, but needs attention (e.g. a certificate expiring soon).
    Warn,
    /// Broken: the installation will not work as it is.
    Fail,
    /// Not checked because something it depends on is broken (reported by another check).
    Skip,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Self::Ok => "ok",
            Self::Warn => "WARN",
            Self::Fail => "FAIL",
            Self::Skip => "skip",
        })
    }
}

/// One check's result.
#[derive(Debug, Clone)]
struct Check {
    status: Status,
    name: String,
    detail: String,
    fix: Option<String>,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<4}  {}: {}", self.status, self.name, self.detail)?;
        match &self.fix {
            Some(fix) if matches!(self.status, Status::Warn | Status::Fail) => write!(f, " -> fix: {fix}"),
            _ => Ok(()),
        }
    }
}

/// Collected checks.
#[derive(Debug, Default)]
struct Report {
    checks: Vec<Check>,
}

impl Report {
    fn ok(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.push(Status::Ok, name, detail, None::<String>);
    }

    fn push(
        &mut self,
        status: Status,
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: Option<impl Into<String>>,
    ) {
        let check = Check { status, name: name.into(), detail: detail.into(), fix: fix.map(Into::into) };
        println!("{check}");
        self.checks.push(check);
    }

    fn fail(&mut self, name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) {
        self.push(Status::Fail, name, detail, Some(fix));
    }

    fn warn(&mut self, name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) {
        self.push(Status::Warn, name, detail, Some(fix));
    }

    fn skip(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.push(Status::Skip, name, detail, None::<String>);
    }

    fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }
}

/// Run a `validate` subcommand.
///
/// # Errors
/// A check failed (or warned, with `--strict`), or the clusters cannot be reached.
pub async fn run(global: &GlobalFlags, cmd: ValidateCommand) -> anyhow::Result<()> {
    let (args, with_agent) = match &cmd {
        ValidateCommand::Principal(args) => (args, false),
        ValidateCommand::Agent(args) => (args, true),
    };
    if with_agent && global.same_context() && global.principal_namespace == global.agent_namespace {
        bail!(
            "principal and agent resolve to the same context and namespace ({}), so their secrets (argocd-agent-ca) \
             would be the same objects: pass --agent-context and/or --agent-namespace",
            global.principal_namespace
        );
    }
    let ctx = Ctx { now: OffsetDateTime::now_utc(), warn_days: args.expiry_warning_days };
    let principal = global.principal_secrets().await?;
    let mut report = Report::default();
    println!(
        "Principal (context {}, namespace {}):",
        global.principal_context().unwrap_or("(current)"),
        principal.namespace()
    );
    let found = principal_checks(&ctx, &principal, &mut report).await?;
    if with_agent {
        let agent = global.agent_secrets().await?;
        println!("Agent (context {}, namespace {}):", global.agent_context().unwrap_or("(current)"), agent.namespace());
        agent_checks(&ctx, &principal, &agent, &found, &mut report).await?;
    }
    let (fails, warns) = (report.count(Status::Fail), report.count(Status::Warn));
    println!(
        "{} checks: {} ok, {warns} warnings, {fails} failed, {} skipped",
        report.checks.len(),
        report.count(Status::Ok),
        report.count(Status::Skip)
    );
    if fails > 0 {
        bail!("validation failed: {fails} check(s) failed (see the FAIL lines and their fixes above)");
    }
    if args.strict && warns > 0 {
        bail!("validation failed: {warns} warning(s) with --strict (see the WARN lines above)");
    }
    Ok(())
}

/// Time and thresholds shared by the checks.
#[derive(Debug)]
struct Ctx {
    now: OffsetDateTime,
    warn_days: u32,
}

/// What the principal checks found that the agent checks build on.
#[derive(Debug, Default)]
struct Found {
    /// The principal's CA certificate.
    ca: Option<CertInfo>,
    /// The principal's gRPC server certificate.
    server_cert: Option<CertInfo>,
}

async fn principal_checks(ctx: &Ctx, secrets: &Secrets, report: &mut Report) -> anyhow::Result<Found> {
    let ns = secrets.namespace().to_owned();
    let mut found = Found::default();

    // The CA.
    let ca_name = format!("CA secret {ns}/{}", pki::SECRET_PRINCIPAL_CA);
    let init_fix = "run `argocd-agentctl pki init` (or store your CA's tls.crt and tls.key in that secret)";
    match secrets.get(pki::SECRET_PRINCIPAL_CA).await? {
        None => report.fail(&ca_name, "missing: agents' certificates cannot be issued or verified", init_fix),
        Some(secret) => match field_text(&secret, "tls.crt").and_then(|pem| x509::parse_pem(&pem)) {
            Err(e) => report.fail(&ca_name, format!("no usable CA certificate in tls.crt: {e:#}"), init_fix),
            Ok(ca) if !ca.is_ca => report.fail(
                &ca_name,
                format!("tls.crt ({}) is not a CA certificate (basicConstraints CA:TRUE missing)", ca.subject),
                init_fix,
            ),
            Ok(ca) => {
                match field_text(&secret, "tls.key") {
                    Err(_) => report.warn(
                        &ca_name,
                        format!("CA {} present, but no tls.key: argocd-agentctl cannot issue certificates", ca.subject),
                        "add the CA's private key as tls.key if certificates should be issued with argocd-agentctl",
                    ),
                    Ok(key) => match ca.check_key(&key) {
                        Ok(()) => report.ok(&ca_name, format!("CA {} with its key", ca.subject)),
                        Err(e) => report.fail(
                            &ca_name,
                            format!("tls.key does not fit the CA certificate {}: {e:#}", ca.subject),
                            "store the CA's own key in tls.key, or run `argocd-agentctl pki init --force`",
                        ),
                    },
                }
                expiry_check(
                    ctx,
                    report,
                    "CA certificate",
                    &ca,
                    "create a new CA (`argocd-agentctl pki init --force`) and reissue every certificate",
                );
                found.ca = Some(ca);
            }
        },
    }

    // Server certificates signed by the CA.
    found.server_cert = server_cert_checks(
        ctx,
        secrets,
        report,
        pki::SECRET_PRINCIPAL_TLS,
        "principal gRPC",
        found.ca.as_ref(),
        true,
        "argocd-agentctl pki issue principal --upsert --ip <IP> --dns <NAME>",
    )
    .await?;
    server_cert_checks(
        ctx,
        secrets,
        report,
        pki::SECRET_RESOURCE_PROXY_TLS,
        "resource proxy",
        found.ca.as_ref(),
        false,
        "argocd-agentctl pki issue resource-proxy --upsert --dns <NAME>",
    )
    .await?;

    // The JWT signing key.
    let jwt_name = format!("JWT secret {ns}/{}", jwt::SECRET_JWT);
    let jwt_fix = "run `argocd-agentctl jwt create-key --upsert` (or point the principal at a key with --jwt-key)";
    match secrets.get(jwt::SECRET_JWT).await? {
        None => report.fail(&jwt_name, "missing: the principal cannot sign session tokens", jwt_fix),
        Some(secret) => match field_text(&secret, jwt::FIELD_JWT_KEY) {
            Err(e) => report.fail(&jwt_name, format!("{e:#}"), jwt_fix),
            Ok(pem) => match auth::SigningKey::from_pem(&pem) {
                Ok(key) => report.ok(
                    &jwt_name,
                    format!(
                        "{} parses as a signing key ({:?}, {} bits)",
                        jwt::FIELD_JWT_KEY,
                        key.algorithm(),
                        key.bits()
                    ),
                ),
                Err(e) => report.fail(
                    &jwt_name,
                    format!("{} is not a usable RSA or ECDSA P-256 key: {e}", jwt::FIELD_JWT_KEY),
                    jwt_fix,
                ),
            },
        },
    }

    // Agent cluster secrets.
    let selector = format!("{}={}", cluster::LABEL_SECRET_TYPE, cluster::SECRET_TYPE_CLUSTER);
    let agents: Vec<Secret> =
        secrets.list(Some(&selector)).await?.into_iter().filter(cluster::is_agent_cluster_secret).collect();
    if agents.is_empty() {
        report.warn(
            format!("cluster secrets in {ns}"),
            "no agent cluster secrets: Argo CD knows no agent and the principal maps no Applications to one",
            "run `argocd-agentctl agent create <agent>` for each agent",
        );
    }
    for secret in agents {
        cluster_secret_checks(ctx, report, &ns, secret, found.ca.as_ref());
    }

    // No Applications in the principal's own namespace (upstream: they are never synced).
    applications_check(secrets, report).await;
    Ok(found)
}

/// Check one server certificate secret; returns the certificate when it is present and parses.
#[allow(clippy::too_many_arguments)]
async fn server_cert_checks(
    ctx: &Ctx,
    secrets: &Secrets,
    report: &mut Report,
    secret_name: &str,
    what: &str,
    ca: Option<&CertInfo>,
    required: bool,
    issue_fix: &str,
) -> anyhow::Result<Option<CertInfo>> {
    let name = format!("{what} TLS secret {}/{secret_name}", secrets.namespace());
    let fix = format!("run `{issue_fix}`");
    let Some(secret) = secrets.get(secret_name).await? else {
        if required {
            report.fail(&name, "missing: the principal has no server certificate", &fix);
        } else {
            report.warn(
                &name,
                "missing: upstream's principal needs it for its resource proxy (on by default); this principal does \
                 not use it yet",
                &fix,
            );
        }
        return Ok(None);
    };
    let cert = match field_text(&secret, "tls.crt").and_then(|pem| x509::parse_pem(&pem)) {
        Ok(cert) => cert,
        Err(e) => {
            report.fail(&name, format!("no usable certificate in tls.crt: {e:#}"), &fix);
            return Ok(None);
        }
    };
    match field_text(&secret, "tls.key").and_then(|key| cert.check_key(&key)) {
        Ok(()) => report.ok(&name, format!("{} ({})", cert.subject, cert.sans.join(", "))),
        Err(e) => report.fail(&name, format!("tls.key does not fit tls.crt: {e:#}"), &fix),
    }
    let chain_name = format!("{what} certificate chain");
    match ca {
        None => report.skip(&chain_name, "no CA to check against"),
        Some(ca) if cert.signed_by(ca) => report.ok(&chain_name, format!("signed by the CA {}", ca.subject)),
        Some(ca) => report.fail(
            &chain_name,
            format!(
                "{} was issued by {}, not signed by the CA in {} ({}): agents, which trust that CA, will refuse it",
                cert.subject,
                cert.issuer,
                pki::SECRET_PRINCIPAL_CA,
                ca.subject
            ),
            format!("reissue it from the current CA: `{issue_fix}`"),
        ),
    }
    if cert.server_auth == Some(false) {
        report.fail(
            format!("{what} certificate usage"),
            "its extended key usage lacks serverAuth: TLS clients reject it",
            format!("reissue it: `{issue_fix}`"),
        );
    }
    expiry_check(ctx, report, &format!("{what} certificate"), &cert, &format!("reissue it: `{issue_fix}`"));
    Ok(Some(cert))
}

/// Expired or not yet valid: FAIL; ending within the warning window: WARN.
fn expiry_check(ctx: &Ctx, report: &mut Report, what: &str, cert: &CertInfo, fix: &str) {
    let name = format!("{what} validity");
    match cert.expiry(ctx.now, ctx.warn_days) {
        Expiry::Valid(t) => report.ok(&name, format!("valid until {}", x509::rfc3339(t))),
        Expiry::Soon(t) => {
            let days = (t - ctx.now).whole_days();
            report.warn(&name, format!("expires in {days} day(s), at {}", x509::rfc3339(t)), fix);
        }
        Expiry::Expired(t) => report.fail(&name, format!("expired at {}", x509::rfc3339(t)), fix),
        Expiry::NotYetValid(t) => report.fail(
            &name,
            format!("not valid before {} (is a clock wrong?)", x509::rfc3339(t)),
            format!("check the clocks, or {fix}"),
        ),
    }
}

/// The checks of one agent cluster secret.
fn cluster_secret_checks(ctx: &Ctx, report: &mut Report, ns: &str, secret: Secret, ca: Option<&CertInfo>) {
    let secret_name = secret.metadata.name.clone().unwrap_or_default();
    let label = format!("cluster secret {ns}/{secret_name}");
    let cs = match ClusterSecret::from_secret(secret) {
        Ok(cs) => cs,
        Err(e) => {
            report.fail(
                &label,
                format!("{e:#}"),
                "recreate it: delete it and run `argocd-agentctl agent create <agent>`",
            );
            return;
        }
    };
    // The agent: from the label, else from the name.
    let agent = match cs.agent() {
        Some(agent) => {
            match names::validate_agent_name(agent) {
                Ok(()) => report.ok(
                    format!("{label} labels"),
                    format!("{}={agent}, {}=cluster", cluster::LABEL_AGENT_NAME, cluster::LABEL_SECRET_TYPE),
                ),
                Err(e) => report.fail(
                    format!("{label} labels"),
                    format!("{}={agent:?} is not a valid agent name: {e:#}", cluster::LABEL_AGENT_NAME),
                    format!(
                        "set the label to the agent's name (the CN of its client certificate): `kubectl -n {ns} \
                             label secret {secret_name} --overwrite {}=<agent>`",
                        cluster::LABEL_AGENT_NAME
                    ),
                ),
            }
            agent.to_owned()
        }
        None => {
            let guess = secret_name.strip_prefix("cluster-").unwrap_or("<agent>").to_owned();
            report.fail(
                format!("{label} labels"),
                format!(
                    "label {} is missing: the principal cannot map this cluster to an agent",
                    cluster::LABEL_AGENT_NAME
                ),
                format!("`kubectl -n {ns} label secret {secret_name} {}={guess}`", cluster::LABEL_AGENT_NAME),
            );
            guess
        }
    };
    if secret_name != cluster::secret_name(&agent) {
        report.warn(
            format!("{label} name"),
            format!(
                "named {secret_name}, not {}: argocd-agentctl agent inspect|reconfigure will not find it",
                cluster::secret_name(&agent)
            ),
            format!("recreate it as {} (`argocd-agentctl agent create {agent}`)", cluster::secret_name(&agent)),
        );
    }
    if cs.skips_reconcile() {
        report.ok(format!("{label} skip-reconcile"), format!("{}=true", cluster::ANNOTATION_SKIP_RECONCILE));
    } else {
        let now = cs
            .annotation(cluster::ANNOTATION_SKIP_RECONCILE)
            .map_or_else(|| "missing".to_owned(), |v| format!("{v:?} instead of \"true\""));
        report.fail(
            format!("{label} skip-reconcile"),
            format!(
                "annotation {} is {now}: the hub's Argo CD (3.4+) application controller will also reconcile this \
                 agent's Applications",
                cluster::ANNOTATION_SKIP_RECONCILE
            ),
            format!(
                "`kubectl -n {ns} annotate secret {secret_name} --overwrite {}=true`",
                cluster::ANNOTATION_SKIP_RECONCILE
            ),
        );
    }
    // Server URL: https and ?agentName=<agent>.
    let server_fix = format!("`argocd-agentctl agent reconfigure {agent} --resource-proxy-server <HOST:PORT>`");
    if !cs.server.starts_with("https://") {
        report.fail(format!("{label} server"), format!("{:?} is not an https:// URL", cs.server), &server_fix);
    } else {
        match cluster::agent_name_param(&cs.server) {
            Some(name) if name == agent => report.ok(format!("{label} server"), cs.server.clone()),
            Some(name) => report.fail(
                format!("{label} server"),
                format!("{} names agent {name:?}, not {agent:?}", cs.server),
                &server_fix,
            ),
            None => report.fail(
                format!("{label} server"),
                format!("{} has no agentName query parameter", cs.server),
                &server_fix,
            ),
        }
    }
    // Credentials for the resource proxy.
    let cert_fix = format!("`argocd-agentctl agent reconfigure {agent} --reissue-client-cert`");
    let tls = &cs.config.tls_client_config;
    let cert_name = format!("{label} client certificate");
    match tls.cert_pem().map(|pem| x509::parse_pem(&pem)) {
        None if !cs.config.bearer_token.is_empty() => report.ok(&cert_name, "none; authenticates with a bearer token"),
        None => report.fail(
            &cert_name,
            "no client certificate and no bearer token: the resource proxy will refuse Argo CD",
            &cert_fix,
        ),
        Some(Err(e)) => report.fail(&cert_name, format!("certData is not a certificate: {e:#}"), &cert_fix),
        Some(Ok(cert)) => {
            let problem = if let Err(e) =
                tls.key_pem().map_or_else(|| Err(anyhow::anyhow!("keyData is missing")), |k| cert.check_key(&k))
            {
                Some(format!("keyData does not fit certData: {e:#}"))
            } else if ca.is_some_and(|ca| !cert.signed_by(ca)) {
                Some(format!(
                    "{} was issued by {}, not by the principal's CA: the resource proxy will refuse it",
                    cert.subject, cert.issuer
                ))
            } else if cs.config.bearer_token.is_empty() && cert.common_name.as_deref() != Some(agent.as_str()) {
                Some(format!(
                    "its CN is {:?}, not the agent name {agent:?} (the resource proxy takes the agent from the CN)",
                    cert.common_name.as_deref().unwrap_or_default()
                ))
            } else {
                None
            };
            match problem {
                Some(p) => report.fail(&cert_name, p, &cert_fix),
                None => report.ok(&cert_name, format!("{} issued by {}", cert.subject, cert.issuer)),
            }
            expiry_check(ctx, report, &cert_name, &cert, &cert_fix);
        }
    }
    // caData must let Argo CD verify the resource proxy, whose certificate the CA issues.
    let ca_name = format!("{label} caData");
    match (tls.ca_pem().map(|pem| x509::parse_bundle(&pem)), ca) {
        (_, _) if tls.insecure => {
            report.warn(&ca_name, "tlsClientConfig.insecure is true: the resource proxy is not verified", &cert_fix)
        }
        (None, _) => report.fail(&ca_name, "missing: Argo CD cannot verify the resource proxy", &cert_fix),
        (Some(Err(e)), _) => report.fail(&ca_name, format!("not a certificate bundle: {e:#}"), &cert_fix),
        (Some(Ok(_)), None) => report.skip(&ca_name, "no principal CA to compare with"),
        (Some(Ok(bundle)), Some(ca)) if bundle.iter().any(|c| c.der == ca.der) => {
            report.ok(&ca_name, format!("holds the CA {}", ca.subject))
        }
        (Some(Ok(_)), Some(ca)) => report.fail(
            &ca_name,
            format!("does not hold the principal's CA {}: Argo CD will not trust the resource proxy", ca.subject),
            &cert_fix,
        ),
    }
}

/// Applications in the principal's namespace are never synced to an agent (upstream warns of them).
async fn applications_check(secrets: &Secrets, report: &mut Report) {
    let ns = secrets.namespace();
    let name = format!("Applications in {ns}");
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(secrets.client(), ns, &resource);
    match api.list(&ListParams::default()).await {
        Ok(list) if list.items.is_empty() => {
            report.ok(&name, "none (Applications for agents live in the agents' namespaces)")
        }
        Ok(list) => {
            let names: Vec<String> = list.items.iter().filter_map(|a| a.metadata.name.clone()).collect();
            report.fail(
                &name,
                format!(
                    "{} Application(s) in the principal's namespace ({}): with namespace-based mapping they belong \
                     to no agent and are never synced",
                    names.len(),
                    names.join(", ")
                ),
                "move them into the namespace of the agent they are for",
            );
        }
        Err(kube::Error::Api(status)) if status.is_not_found() => report.warn(
            &name,
            "the Application resource is not served: Argo CD's CRDs are not installed",
            "install Argo CD (its CRDs) on the principal's cluster",
        ),
        Err(e) => {
            report.warn(&name, format!("cannot list Applications: {e}"), "check RBAC for applications.argoproj.io")
        }
    }
}

async fn agent_checks(
    ctx: &Ctx,
    principal: &Secrets,
    agent: &Secrets,
    found: &Found,
    report: &mut Report,
) -> anyhow::Result<()> {
    let ans = agent.namespace().to_owned();
    let pns = principal.namespace().to_owned();

    // The agent's CA secret: what it verifies the principal with.
    let ca_name = format!("agent CA secret {ans}/{}", pki::SECRET_AGENT_CA);
    let propagate_fix = "run `argocd-agentctl pki propagate --force` (copies the principal's CA certificate)";
    let mut agent_cas = None;
    match agent.get(pki::SECRET_AGENT_CA).await? {
        None => report.fail(&ca_name, "missing: the agent cannot verify the principal", propagate_fix),
        Some(secret) => {
            let pem = field_text(&secret, "ca.crt").or_else(|_| field_text(&secret, "tls.crt"));
            match pem.and_then(|pem| x509::parse_bundle(&pem)) {
                Err(e) => report.fail(&ca_name, format!("no CA certificate in ca.crt: {e:#}"), propagate_fix),
                Ok(cas) => {
                    let subjects: Vec<&str> = cas.iter().map(|c| c.subject.as_str()).collect();
                    report.ok(&ca_name, subjects.join("; "));
                    agent_cas = Some(cas);
                }
            }
        }
    }
    let trust_name = "agent trusts the principal's certificate";
    match (&agent_cas, &found.server_cert) {
        (Some(cas), Some(server)) if server.signed_by_any(cas) => {
            report.ok(trust_name, format!("{} chains to the agent's CA", server.subject));
        }
        (Some(_), Some(server)) => report.fail(
            trust_name,
            format!(
                "{} (issued by {}) does not chain to the CA in {ans}/{}: the agent will refuse the principal",
                server.subject,
                server.issuer,
                pki::SECRET_AGENT_CA
            ),
            propagate_fix,
        ),
        _ => report.skip(trust_name, "the agent's CA or the principal's certificate is missing"),
    }

    // The agent's client certificate.
    let tls_name = format!("agent client TLS secret {ans}/{}", pki::SECRET_AGENT_CLIENT_TLS);
    let issue_fix =
        "run `argocd-agentctl pki issue agent <agent> --upsert` with --principal-context/--agent-context set";
    let client_cert = match agent.get(pki::SECRET_AGENT_CLIENT_TLS).await? {
        None => {
            report.fail(&tls_name, "missing: the agent has no client certificate to authenticate with", issue_fix);
            None
        }
        Some(secret) => match field_text(&secret, "tls.crt").and_then(|pem| x509::parse_pem(&pem)) {
            Err(e) => {
                report.fail(&tls_name, format!("no usable certificate in tls.crt: {e:#}"), issue_fix);
                None
            }
            Ok(cert) => {
                match field_text(&secret, "tls.key").and_then(|key| cert.check_key(&key)) {
                    Ok(()) => report.ok(&tls_name, cert.subject.clone()),
                    Err(e) => report.fail(&tls_name, format!("tls.key does not fit tls.crt: {e:#}"), issue_fix),
                }
                Some(cert)
            }
        },
    };
    let Some(cert) = client_cert else {
        report.skip("agent identity", "no client certificate");
        return Ok(());
    };
    let agent_name = cert.common_name.clone().unwrap_or_default();
    let id_name = "agent identity";
    match names::validate_agent_name(&agent_name) {
        Err(e) => report.fail(id_name, format!("the client certificate's CN: {e:#}"), issue_fix),
        Ok(()) if agent_name == pns => report.fail(
            id_name,
            format!("agent name {agent_name:?} equals the principal's namespace: the principal rejects it"),
            "issue the certificate for another agent name",
        ),
        Ok(()) => report.ok(id_name, format!("agent {agent_name:?} (CN of the client certificate)")),
    }
    if cert.client_auth == Some(false) {
        report.fail(
            "agent client certificate usage",
            "its extended key usage lacks clientAuth: the principal rejects it",
            issue_fix,
        );
    }
    let chain_name = "agent client certificate chain";
    match &found.ca {
        None => report.skip(chain_name, "no principal CA to check against"),
        Some(ca) if cert.signed_by(ca) => report.ok(chain_name, format!("signed by the principal's CA {}", ca.subject)),
        Some(ca) => report.fail(
            chain_name,
            format!(
                "CA mismatch: the agent's certificate was issued by {}, not signed by the principal's CA {} \
                 ({pns}/{}): the principal will reject the agent",
                cert.issuer,
                ca.subject,
                pki::SECRET_PRINCIPAL_CA
            ),
            format!(
                "reissue it from the principal's CA: `argocd-agentctl pki issue agent {agent_name} --upsert` with \
                 --principal-context/--principal-namespace pointing at this principal"
            ),
        ),
    }
    expiry_check(ctx, report, "agent client certificate", &cert, issue_fix);

    // The principal's side of this agent.
    let ns_name = format!("principal namespace for agent {agent_name}");
    let namespaces: Api<Namespace> = Api::all(principal.client());
    match namespaces.get_opt(&agent_name).await {
        Ok(Some(_)) => report.ok(&ns_name, format!("namespace {agent_name} exists on the principal's cluster")),
        Ok(None) => report.warn(
            &ns_name,
            format!(
                "namespace {agent_name} does not exist on the principal's cluster: the agent's Applications live there"
            ),
            format!(
                "`kubectl create namespace {agent_name}` on the principal's cluster (or run the principal with \
                 --namespace-create-enable)"
            ),
        ),
        Err(e) => report.warn(&ns_name, format!("cannot read namespaces: {e}"), "check RBAC for namespaces"),
    }
    let cs_name = format!("principal cluster secret for agent {agent_name}");
    let selector = format!("{}={agent_name}", cluster::LABEL_AGENT_NAME);
    let mapped: Vec<Secret> =
        principal.list(Some(&selector)).await?.into_iter().filter(cluster::is_agent_cluster_secret).collect();
    match mapped.as_slice() {
        [] => report.fail(
            &cs_name,
            format!(
                "no cluster secret in {pns} carries {}={agent_name}: Argo CD and the principal do not know this agent",
                cluster::LABEL_AGENT_NAME
            ),
            format!("run `argocd-agentctl agent create {agent_name}`"),
        ),
        [one] => {
            report.ok(&cs_name, format!("{pns}/{} (checked above)", one.metadata.name.as_deref().unwrap_or_default()))
        }
        many => {
            let names: Vec<&str> = many.iter().filter_map(|s| s.metadata.name.as_deref()).collect();
            report.fail(
                &cs_name,
                format!(
                    "{} cluster secrets map this agent ({}): the principal picks one at random",
                    many.len(),
                    names.join(", ")
                ),
                format!("delete all but {}", cluster::secret_name(&agent_name)),
            );
        }
    }
    Ok(())
}
