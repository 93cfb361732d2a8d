//! Upstream v0.10's SPIRE flags on both binaries, mapped onto the SPIFFE methods here.
//!
//! `--spire-agent-socket` (the SPIRE Agent's Workload API, e.g.
//! `unix:///run/spire/agent-sockets/spire-agent.sock`) and `--spire-auth-method jwt|mtls`, with
//! upstream's environment variables (`ARGOCD_{PRINCIPAL,AGENT}_SPIRE_AGENT_SOCKET`,
//! `_SPIRE_AUTH_METHOD`) and so upstream's `{principal,agent}.spire.socket-path` and
//! `.spire.auth-method` ConfigMap keys. Checked as upstream checks them: both or neither, the
//! method `jwt` or `mtls`, not with `--insecure-plaintext` (nor the agent's `--insecure-tls`).
//!
//! With SPIRE on:
//! - **principal**: TLS is served with its X.509-SVID from the Workload API (no TLS Secrets are
//!   read). An empty `--auth` becomes upstream's default, `mtls:uri:spiffe://[^/]+/(.+)` (client
//!   X.509-SVIDs required) or `spiffe-jwt:spiffe://[^/]+/(.+)` (no client certificate asked
//!   for; JWT-SVIDs for audience `argocd-agent-principal`); a `spiffe` `--auth` without its own
//!   `endpoint` reads the socket. `spiffe-jwt` sessions are bound on every call unless
//!   `--spiffe-jwt-binding login` opts in to upstream's login-only binding.
//! - **agent**: TLS from the Workload API too. `mtls` presents the X.509-SVID as client
//!   certificate and sends method `mtls` (what upstream's SPIRE principal knows, and what ours
//!   accepts under `--spire-auth-method mtls`), accepting a principal SVID of the agent's own
//!   trust domain (upstream's single trust domain case); `jwt` sends a JWT-SVID for
//!   `argocd-agent-principal` with method `spiffe-jwt`, accepting a principal SVID of any trust
//!   domain the Workload API has a bundle for (upstream's federated case).

use std::sync::Arc;

use auth::AuthMethodSpec;
use auth::method::spec::{JwtSessionBinding, SpireAuthMethod};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The SPIRE settings both binaries take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spire {
    /// The Workload API endpoint (`--spire-agent-socket`).
    pub socket: String,
    /// `--spire-auth-method`.
    pub method: SpireAuthMethod,
}

/// Checks the two flags as upstream does; `None` when SPIRE is off (an empty value is unset).
///
/// # Errors
/// One flag without the other, an unknown method, or SPIRE with `--insecure-plaintext`.
pub fn parse(socket: Option<&str>, method: Option<&str>, plaintext: bool) -> anyhow::Result<Option<Spire>> {
    let socket = socket.map(str::trim).filter(|s| !s.is_empty());
    let method = method.map(str::trim).filter(|s| !s.is_empty());
    let (socket, method) = match (socket, method) {
        (None, None) => return Ok(None),
        (Some(_), None) => {
            anyhow::bail!("--spire-auth-method is required when --spire-agent-socket is set (use 'jwt' or 'mtls')")
        }
        (None, Some(_)) => anyhow::bail!("--spire-auth-method requires --spire-agent-socket to be set"),
        (Some(socket), Some(method)) => (socket, method),
    };
    let method = method.parse::<SpireAuthMethod>().map_err(|e| anyhow::anyhow!("--spire-auth-method: {e}"))?;
    anyhow::ensure!(
        !plaintext,
        "--spire-agent-socket cannot be used with --insecure-plaintext; SPIRE provides TLS credentials"
    );
    Ok(Some(Spire { socket: socket.to_owned(), method }))
}

/// The principal's SPIRE flags (upstream's names and environment variables).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PrincipalSpire {
    /// SPIRE Agent socket URI (e.g. unix:///run/spire/agent-sockets/spire-agent.sock): serve TLS
    /// with the X.509-SVID of this Workload API instead of the TLS Secrets (docs/mesh/spiffe.md).
    #[arg(long, env = "ARGOCD_PRINCIPAL_SPIRE_AGENT_SOCKET")]
    pub spire_agent_socket: Option<String>,
    /// With --spire-agent-socket: `mtls` (X.509-SVIDs, --auth default mtls:uri:spiffe://[^/]+/(.+))
    /// or `jwt` (JWT-SVIDs, --auth default spiffe-jwt:spiffe://[^/]+/(.+)).
    #[arg(long, env = "ARGOCD_PRINCIPAL_SPIRE_AUTH_METHOD")]
    pub spire_auth_method: Option<String>,
    /// What a spiffe-jwt session's later calls present: `call` (the bound SPIFFE ID on every
    /// call, a JWT-SVID or the client SVID) or `login` (upstream v0.10's: the JWT-SVID at
    /// Authenticate only, then the session token alone; needed by upstream's Go agents).
    #[arg(long, env = "ARGOCD_PRINCIPAL_SPIFFE_JWT_BINDING", default_value = "call", value_parser = ["call", "login"])]
    pub spiffe_jwt_binding: String,
}

impl PrincipalSpire {
    /// The SPIRE settings, checked.
    ///
    /// # Errors
    /// As [`parse`].
    pub fn spire(&self, plaintext: bool) -> anyhow::Result<Option<Spire>> {
        parse(self.spire_agent_socket.as_deref(), self.spire_auth_method.as_deref(), plaintext)
    }

    /// The principal's `--auth`: as given, or upstream's SPIRE default when empty; a `spiffe`
    /// method reads the SPIRE socket unless it names its own endpoint; `--spiffe-jwt-binding`
    /// applied.
    ///
    /// # Errors
    /// An empty `--auth` without SPIRE, a value that does not parse, or `--spiffe-jwt-binding
    /// login` with a method that is not spiffe-jwt.
    pub fn auth_spec(&self, auth: &str, plaintext: bool) -> anyhow::Result<AuthMethodSpec> {
        let spire = self.spire(plaintext)?;
        let spec = match (auth.trim(), &spire) {
            ("", None) => anyhow::bail!(
                "argocd-agent principal: --auth (ARGOCD_PRINCIPAL_AUTH) is required, e.g. --auth 'mtls:subject:CN=([^,]+)' \
                 (or --spire-agent-socket with --spire-auth-method for upstream's SPIRE defaults)"
            ),
            ("", Some(spire)) => AuthMethodSpec::spire_default(spire.method, Some(&spire.socket))?,
            (auth, spire) => AuthMethodSpec::parse(auth)
                .map_err(|e| anyhow::anyhow!("--auth {auth:?}: {e}"))?
                .with_workload_endpoint(spire.as_ref().map(|s| s.socket.as_str())),
        };
        if self.spiffe_jwt_binding == "login" {
            return spec
                .with_jwt_binding(JwtSessionBinding::LoginOnly)
                .map_err(|e| anyhow::anyhow!("--spiffe-jwt-binding login: {e}"));
        }
        Ok(spec)
    }
}

/// The agent's SPIRE flags (upstream's names and environment variables).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AgentSpire {
    /// SPIRE Agent socket URI (e.g. unix:///run/spire/agent-sockets/spire-agent.sock): TLS and
    /// identity from this Workload API instead of the TLS Secrets (docs/mesh/spiffe.md).
    #[arg(long, env = "ARGOCD_AGENT_SPIRE_AGENT_SOCKET")]
    pub spire_agent_socket: Option<String>,
    /// With --spire-agent-socket: `mtls` (the X.509-SVID as client certificate, method mtls) or
    /// `jwt` (a JWT-SVID for argocd-agent-principal, method spiffe-jwt).
    #[arg(long, env = "ARGOCD_AGENT_SPIRE_AUTH_METHOD")]
    pub spire_auth_method: Option<String>,
}

impl AgentSpire {
    /// The SPIRE settings, checked against `--creds` (empty, or upstream's `mtls:`/`spiffe-jwt:`
    /// for the same method) and the TLS flags.
    ///
    /// # Errors
    /// As [`parse`], `--insecure-tls` with SPIRE, or `--creds` naming another method.
    pub fn spire(&self, creds: &str, plaintext: bool, insecure_tls: bool) -> anyhow::Result<Option<Spire>> {
        let Some(spire) = parse(self.spire_agent_socket.as_deref(), self.spire_auth_method.as_deref(), plaintext)?
        else {
            return Ok(None);
        };
        anyhow::ensure!(
            !insecure_tls,
            "--spire-agent-socket cannot be used with --insecure-tls; SPIRE handles certificate verification"
        );
        let method = creds.split_once(':').map_or(creds, |(m, _)| m).trim();
        let fits = match spire.method {
            SpireAuthMethod::Mtls => matches!(method, "" | "mtls"),
            SpireAuthMethod::Jwt => matches!(method, "" | "spiffe-jwt"),
        };
        anyhow::ensure!(
            fits,
            "--creds {creds:?} does not fit --spire-auth-method {}: leave --creds empty (SPIRE decides the credentials)",
            spire.method
        );
        Ok(Some(spire))
    }
}

/// The `AuthRequest.method` an agent with SPIRE sends (upstream's names).
#[must_use]
pub fn agent_method(method: SpireAuthMethod) -> &'static str {
    match method {
        SpireAuthMethod::Mtls => auth::MtlsAuthenticator::METHOD,
        SpireAuthMethod::Jwt => auth::method::spiffe_jwt::SpiffeJwtAuthenticator::METHOD,
    }
}

/// The principal's TLS with SPIRE: its X.509-SVID from the Workload API at the socket. When
/// `spec` needs client certificates (`mtls`, `spiffe:x509`), client X.509-SVIDs are required and
/// verified against the Workload API's bundles (any SPIFFE ID: the auth layer decides and explains);
/// otherwise (`spiffe-jwt`) none is asked for, as upstream's agents with JWT-SVIDs present none
/// (then `policy`'s TLS versions and suites apply).
///
/// # Errors
/// No SVID from the Workload API in time, or no TLS configuration from it.
pub async fn principal_tls(
    spire: &Spire,
    spec: &AuthMethodSpec,
    policy: &auth::tls_policy::TlsPolicy,
    timeout: std::time::Duration,
) -> anyhow::Result<(mesh::workload::X509Identity, Arc<rustls::ServerConfig>)> {
    use anyhow::Context as _;
    let identity = mesh::workload::X509Identity::connect(Some(&spire.socket), timeout)
        .await
        .with_context(|| format!("--spire-agent-socket {:?}: no X.509-SVID from the SPIRE Agent", spire.socket))?;
    let id = identity.spiffe_id().context("the Workload API's X.509-SVID has no SPIFFE ID")?;
    let tls = if spec.requires_client_certificates() {
        identity
            .server_config(&mesh::workload::PeerAuthorization::Any)
            .context("cannot build the SPIFFE mTLS server configuration")?
    } else {
        let provider = policy.provider()?;
        let resolver = SvidResolver { identity: identity.clone(), provider: provider.clone() };
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&policy.versions()?)
            .context("the TLS versions of --tls-min-version/--tls-max-version")?
            .with_no_client_auth()
            .with_cert_resolver(identity.warn_when_unresolved(Arc::new(resolver)));
        config.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(config)
    };
    tracing::info!(spiffe_id = %id, auth = %spec, client_svid_required = spec.requires_client_certificates(), "serving TLS with the SPIRE X.509-SVID (--spire-agent-socket)");
    Ok((identity, tls))
}

/// Presents the Workload API's current X.509-SVID (rotations reach new handshakes).
#[derive(Debug)]
struct SvidResolver {
    identity: mesh::workload::X509Identity,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::server::ResolvesServerCert for SvidResolver {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let svid = self.identity.svid().ok()?;
        let chain = svid.cert_chain().iter().map(|c| CertificateDer::from(c.as_ref().to_vec())).collect();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(svid.private_key().as_ref().to_vec()));
        let signer = self.provider.key_provider.load_private_key(key).ok()?;
        Some(Arc::new(rustls::sign::CertifiedKey::new(chain, signer)))
    }
}

/// The agent's credentials with SPIRE: the Workload API at the socket; `mtls` an X.509-SVID
/// (accepting a principal SVID of the agent's own trust domain), `jwt` a JWT-SVID for
/// `argocd-agent-principal`.
#[must_use]
pub fn agent_creds(spire: &Spire) -> crate::agent_creds::Creds {
    use crate::agent_creds::{Creds, DEFAULT_AUDIENCE};
    let endpoint = Some(spire.socket.clone());
    match spire.method {
        SpireAuthMethod::Mtls => Creds::SpiffeX509 { endpoint, principal_ids: Vec::new() },
        SpireAuthMethod::Jwt => Creds::SpiffeJwt { endpoint, audience: DEFAULT_AUDIENCE.to_owned() },
    }
}

/// The agent's TLS with `--spire-auth-method jwt`: the principal's X.509-SVID verified against
/// the Workload API's bundles, any trust domain among them (upstream's federated case); the
/// agent's own SVID is offered only if the principal asks for a client certificate.
///
/// # Errors
/// No SVID from the Workload API in time, or no TLS configuration from it.
pub async fn agent_server_tls(
    spire: &Spire,
    server_address: &str,
    timeout: std::time::Duration,
) -> anyhow::Result<(agent::AgentTls, mesh::workload::X509Identity)> {
    use anyhow::Context as _;
    let identity = mesh::workload::X509Identity::connect(Some(&spire.socket), timeout)
        .await
        .with_context(|| format!("--spire-agent-socket {:?}: no X.509-SVID from the SPIRE Agent", spire.socket))?;
    let config = identity
        .client_config(&mesh::workload::PeerAuthorization::Any)
        .context("cannot build the SPIFFE TLS client configuration")?;
    Ok((agent::AgentTls::Rustls { config, server_name: server_address.to_owned() }, identity))
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Principal {
        #[command(flatten)]
        spire: PrincipalSpire,
        #[arg(long, default_value = "")]
        auth: String,
    }

    fn principal(args: &[&str]) -> anyhow::Result<AuthMethodSpec> {
        let p = Principal::try_parse_from(std::iter::once("principal").chain(args.iter().copied()))?;
        p.spire.auth_spec(&p.auth, false)
    }

    #[test]
    fn principal_flags_map_onto_upstream_defaults() {
        let socket = "unix:///run/spire/agent-sockets/spire-agent.sock";
        let spec = principal(&["--spire-agent-socket", socket, "--spire-auth-method", "mtls"]).expect("mtls");
        assert_eq!(spec.to_string(), "mtls:uri:spiffe://[^/]+/(.+)");
        let spec = principal(&["--spire-agent-socket", socket, "--spire-auth-method", "jwt"]).expect("jwt");
        assert_eq!(spec.to_string(), "spiffe-jwt:spiffe://[^/]+/(.+)");
        assert_eq!(spec.workload_endpoint(), Some(socket));
        assert!(matches!(spec, AuthMethodSpec::SpiffeJwtRegex { binding: JwtSessionBinding::EveryCall, .. }));
        let spec =
            principal(&["--spire-agent-socket", socket, "--spire-auth-method", "jwt", "--spiffe-jwt-binding", "login"])
                .expect("login-only");
        assert!(matches!(spec, AuthMethodSpec::SpiffeJwtRegex { binding: JwtSessionBinding::LoginOnly, .. }));
        // An explicit --auth wins; a spiffe method reads the socket.
        let spec = principal(&["--spire-agent-socket", socket, "--spire-auth-method", "mtls", "--auth", "spiffe:x509"])
            .expect("x509");
        assert_eq!(spec.workload_endpoint(), Some(socket));
        for (args, needle) in [
            (&["--spire-agent-socket", socket][..], "--spire-auth-method is required"),
            (&["--spire-auth-method", "jwt"][..], "requires --spire-agent-socket"),
            (&["--spire-agent-socket", socket, "--spire-auth-method", "x509"][..], "'jwt' or 'mtls'"),
            (&[][..], "--auth (ARGOCD_PRINCIPAL_AUTH) is required"),
            (&["--auth", "mtls:subject:CN=([^,]+)", "--spiffe-jwt-binding", "login"][..], "--spiffe-jwt-binding"),
        ] {
            let err = format!("{:#}", principal(args).expect_err(needle));
            assert!(err.contains(needle), "{args:?}: {err}");
        }
        let p =
            Principal::try_parse_from(["p", "--spire-agent-socket", socket, "--spire-auth-method", "jwt"]).expect("p");
        let err = p.spire.spire(true).expect_err("plaintext").to_string();
        assert!(err.contains("--insecure-plaintext"), "{err}");
    }

    #[test]
    fn agent_flags_are_checked_against_creds() {
        let spire = |method: &str| AgentSpire {
            spire_agent_socket: Some("unix:/s.sock".into()),
            spire_auth_method: Some(method.into()),
        };
        let got = spire("mtls").spire("", false, false).expect("mtls").expect("on");
        assert_eq!((got.method, agent_method(got.method)), (SpireAuthMethod::Mtls, "mtls"));
        assert!(spire("mtls").spire("mtls:", false, false).is_ok());
        let got = spire("jwt").spire("spiffe-jwt:", false, false).expect("jwt").expect("on");
        assert_eq!(agent_method(got.method), "spiffe-jwt");
        assert!(spire("jwt").spire("mtls:", false, false).expect_err("mismatch").to_string().contains("--creds"));
        assert!(spire("mtls").spire("", false, true).expect_err("insecure").to_string().contains("--insecure-tls"));
        assert_eq!(AgentSpire::default().spire("", false, false).expect("off"), None);
        // Empty values (a ConfigMap key left empty) are unset.
        let empty = AgentSpire { spire_agent_socket: Some(String::new()), spire_auth_method: Some(String::new()) };
        assert_eq!(empty.spire("", false, false).expect("off"), None);
    }
}
