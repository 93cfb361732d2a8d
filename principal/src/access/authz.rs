//! Authorization of agents: the one place that answers "why was this agent refused".
//!
//! Every call to the principal's agent-facing services passes [`AuthorizeLayer`] (a tower
//! layer inside the service that [`crate::Principal::event_stream_service`] returns, so no
//! server can carry the service without it). It asks the [`Authorizer`], which checks, in
//! this order, and refuses with a status naming what to fix:
//! 1. **who is calling**: the [`IdentityFn`] (the auth crate's layer, or a test seam) names an
//!    agent, else `Unauthenticated`;
//! 2. **admitted** ([`Authorizer::admit`], the rules `Authenticate` applies too, before it signs
//!    a token or self-registers a cluster): the agent's hub namespace is covered by
//!    `--allowed-namespaces` and is not the principal's own; the name is not one the PKI gives
//!    to non-agent certificates, and the client certificate is not a resource-proxy client's
//!    ([`auth::roles`]); with `--client-cert-subject-match` the certificate's CN names the agent.
//!    Else `PermissionDenied` (the subject match: `Unauthenticated`, as upstream);
//! 3. **session valid**: the access token has not expired and was not revoked, else
//!    `Unauthenticated` (the agent refreshes or authenticates again);
//! 4. **not blocklisted** ([`crate::access::blocklist`]), else `Unauthenticated` naming the entry and
//!    the ConfigMap.
//!
//! What passes gets a typed [`Permit`] in the request extensions, which is all the services
//! read. `Authenticate` asks [`Authorizer::admit`] and [`Authorizer::check_session`] before it
//! signs anything, `RefreshToken` asks [`Authorizer::check_session`] (the auth crate checks the
//! credentials).

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use tonic::Status;
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;

use crate::access::blocklist::Blocklist;
use crate::config::AgentMode;
use crate::ident::{IdentityFn, StreamGrant};
use crate::sync::hub::Hub;

/// An agent admitted on a call: what the services act for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    /// The agent's name (= its namespace on the hub).
    pub agent: String,
    /// The mode it announced when it authenticated.
    pub mode: AgentMode,
    /// The access token the call carried (empty without the auth crate's layer).
    pub grant: StreamGrant,
}

/// Decides whether a call's agent may use the principal.
pub(crate) struct Authorizer {
    hub: Arc<Hub>,
    identity: IdentityFn,
    blocklist: Arc<Blocklist>,
    /// Reads a client certificate's CN (`--client-cert-subject-match`).
    cn_reader: Option<auth::MtlsAuthenticator>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer").finish_non_exhaustive()
    }
}

impl Authorizer {
    pub(crate) fn new(hub: Arc<Hub>, identity: IdentityFn, blocklist: Arc<Blocklist>) -> Self {
        Self { hub, identity, blocklist, cn_reader: crate::ident::cn_reader() }
    }

    /// The permit for a call with these extensions and metadata, or the status it is refused
    /// with (see the module docs for the order of the checks).
    pub(crate) fn authorize(&self, extensions: &http::Extensions, metadata: &MetadataMap) -> Result<Permit, Status> {
        let caller = (self.identity)(extensions, metadata).ok_or_else(|| {
            Status::unauthenticated("no authenticated agent on this call (the auth layer must identify the agent)")
        })?;
        let agent = caller.name;
        self.admit(&agent, &auth::TransportIdentity::from_extensions(extensions))?;
        let grant = StreamGrant::of(extensions, &agent);
        if let Some(expires_at) = grant.expires_at
            && expires_at <= SystemTime::now()
        {
            return Err(expired(&agent, expires_at));
        }
        if self.is_revoked(&grant) {
            return Err(revoked(&agent));
        }
        if let Err(reason) = self.blocklist.check(&agent, grant.binding.as_ref()) {
            tracing::warn!(%agent, %reason, "stream of a blocklisted agent refused");
            return Err(Status::unauthenticated(reason));
        }
        self.blocklist.record_stream(&agent, grant.binding.clone());
        Ok(Permit { agent, mode: caller.mode, grant })
    }

    /// Whether the principal serves `agent` on a connection with this transport identity: the
    /// admission rules of every call, and of `Authenticate` before it signs a token or writes
    /// anything (see the module docs).
    pub(crate) fn admit(&self, agent: &str, transport: &auth::TransportIdentity) -> Result<(), Status> {
        if !self.hub.config.admits(agent) {
            return Err(Status::permission_denied(format!(
                "agent {agent:?} is not covered by the principal's --allowed-namespaces or equals its namespace"
            )));
        }
        if auth::roles::is_non_agent_name(agent) {
            return Err(Status::permission_denied(format!(
                "{agent:?} names a certificate of the principal's PKI that is not an agent's (the CA, the principal, \
                 the resource proxy), never an agent: give the agent a certificate of its own"
            )));
        }
        if let Some(why) = transport.leaf_certificate().and_then(|leaf| auth::roles::not_an_agent_certificate(leaf)) {
            return Err(Status::permission_denied(format!("agent {agent:?}: {why}")));
        }
        if self.hub.config.client_cert_subject_match {
            self.subject_matches(transport, agent)?;
        }
        Ok(())
    }

    /// `--client-cert-subject-match`: the call's client certificate must name `agent` in its CN
    /// (upstream `clientCertificateMatches`).
    fn subject_matches(&self, transport: &auth::TransportIdentity, agent: &str) -> Result<(), Status> {
        let Some(leaf) = transport.leaf_certificate() else {
            return Err(Status::unauthenticated(format!(
                "agent {agent:?} presented no client certificate (--client-cert-subject-match)"
            )));
        };
        match self.cn_reader.as_ref().map(|r| r.agent_name(leaf)) {
            Some(Ok(cn)) if cn.as_str() == agent => Ok(()),
            Some(Ok(cn)) => Err(Status::unauthenticated(format!(
                "the client certificate's CN {:?} is not agent {agent:?} (--client-cert-subject-match)",
                cn.as_str()
            ))),
            Some(Err(e)) => Err(Status::unauthenticated(format!(
                "agent {agent:?}: the client certificate names no agent in its CN: {e} (--client-cert-subject-match)"
            ))),
            None => Err(Status::internal("the certificate subject reader is unavailable")),
        }
    }

    /// Whether the access token of `grant` was revoked since.
    pub(crate) fn is_revoked(&self, grant: &StreamGrant) -> bool {
        grant.token_id.as_deref().is_some_and(|id| self.hub.peers.is_revoked(id))
    }

    /// Whether an agent with this transport identity may hold a session (`Authenticate`,
    /// `RefreshToken`): `Err` names the blocklist entry and the ConfigMap.
    pub(crate) fn check_session(&self, identity: &auth::AgentIdentity) -> Result<(), String> {
        self.blocklist.check(identity.name().as_str(), Some(identity.binding()))
    }
}

/// The status a stream ends with, or is refused with, when its access token expired.
pub(crate) fn expired(agent: &str, expires_at: SystemTime) -> Status {
    let at = chrono::DateTime::<chrono::Utc>::from(expires_at).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    Status::unauthenticated(format!(
        "the session of agent {agent:?} expired at {at}: refresh the access token or authenticate again, then reconnect"
    ))
}

/// The status a call with a revoked access token is refused with.
pub(crate) fn revoked(agent: &str) -> Status {
    Status::unauthenticated(format!(
        "the session of agent {agent:?} was revoked by the principal: authenticate again, then reconnect"
    ))
}

/// The tower layer that authorizes every call before the service sees it.
#[derive(Clone, Debug)]
pub struct AuthorizeLayer {
    authorizer: Arc<Authorizer>,
}

impl AuthorizeLayer {
    pub(crate) fn new(authorizer: Arc<Authorizer>) -> Self {
        Self { authorizer }
    }
}

impl<S> tower::Layer<S> for AuthorizeLayer {
    type Service = Authorize<S>;

    fn layer(&self, inner: S) -> Authorize<S> {
        Authorize { inner, authorizer: self.authorizer.clone() }
    }
}

/// A service behind [`AuthorizeLayer`]: calls reach it only with a [`Permit`].
#[derive(Clone, Debug)]
pub struct Authorize<S> {
    inner: S,
    authorizer: Arc<Authorizer>,
}

impl<S: NamedService> NamedService for Authorize<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> tower::Service<http::Request<B>> for Authorize<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = futures::future::Either<S::Future, futures::future::Ready<Result<http::Response<R>, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let metadata = MetadataMap::from_headers(request.headers().clone());
        match self.authorizer.authorize(request.extensions(), &metadata) {
            Ok(permit) => {
                request.extensions_mut().insert(permit);
                futures::future::Either::Left(self.inner.call(request))
            }
            Err(status) => {
                tracing::info!(code = ?status.code(), reason = status.message(), "agent call refused");
                futures::future::Either::Right(futures::future::ready(Ok(status.into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tonic::Code;

    use super::*;
    use crate::PrincipalConfig;
    use crate::access::blocklist::BlocklistData;
    use crate::ident::insecure_metadata_identity;
    use link::testing::offline_client;

    struct Fixture {
        hub: Arc<Hub>,
        blocklist: Arc<Blocklist>,
        authorizer: Authorizer,
    }

    fn fixture() -> Fixture {
        let mut config = PrincipalConfig::new("argocd");
        config.allowed_namespaces = vec!["agent-*".into()];
        let hub = Arc::new(Hub::offline(config));
        let blocklist = Arc::new(Blocklist::new(offline_client("default"), "argocd"));
        let authorizer = Authorizer::new(hub.clone(), auth_identity(), blocklist.clone());
        Fixture { hub, blocklist, authorizer }
    }

    /// The identity the auth crate's layer establishes, read from the extensions.
    fn auth_identity() -> IdentityFn {
        crate::ident::auth_layer_identity()
    }

    fn session(agent: &str, jti: &str, ttl: Duration, expired: bool) -> http::Extensions {
        let name = auth::AgentName::new(agent).expect("agent name");
        let identity = auth::AgentIdentity::new(name, "header", auth::Binding::SpiffeId(format!("spiffe://t/{agent}")));
        let now = SystemTime::now();
        let expires_at = if expired { now - ttl } else { now + ttl };
        let mut ext = http::Extensions::new();
        ext.insert(auth::AgentSession { identity, mode: AgentMode::Managed, token_id: jti.into(), expires_at });
        ext
    }

    const HOUR: Duration = Duration::from_secs(3600);

    /// A self-signed certificate with CN `cn` and, if given, subject OU `ou` (DER).
    fn certificate(cn: &str, ou: Option<&str>) -> rustls::pki_types::CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        if let Some(ou) = ou {
            params.distinguished_name.push(rcgen::DnType::OrganizationalUnitName, ou);
        }
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("certificate").der().clone()
    }

    fn over_tls(cert: rustls::pki_types::CertificateDer<'static>) -> auth::TransportIdentity {
        auth::TransportIdentity::tls(None, Some(Arc::new(vec![cert])))
    }

    /// Admission refuses what is not an agent's, whatever the method said: a resource-proxy
    /// client certificate (a cluster secret's), and the names the PKI gives the principal, the
    /// resource proxy and the CA, even where `--allowed-namespaces` covers them.
    #[tokio::test]
    async fn non_agent_certificates_and_names_are_not_admitted() {
        let mut f = fixture();
        let mut config = PrincipalConfig::new("argocd");
        config.allowed_namespaces = vec!["*".into()];
        f.hub = Arc::new(Hub::offline(config));
        f.authorizer = Authorizer::new(f.hub.clone(), auth_identity(), f.blocklist.clone());

        let agent = over_tls(certificate("agent-a", None));
        assert!(f.authorizer.admit("agent-a", &agent).is_ok());
        let proxy_client = over_tls(certificate("agent-a", Some(auth::roles::RESOURCE_PROXY_CLIENT_OU)));
        let refused = f.authorizer.admit("agent-a", &proxy_client).expect_err("a proxy client is no agent");
        assert_eq!(refused.code(), Code::PermissionDenied);
        assert!(refused.message().contains("resource-proxy client certificate"), "{refused:?}");
        for name in auth::roles::NON_AGENT_NAMES {
            let refused = f.authorizer.admit(name, &over_tls(certificate(name, None))).expect_err(name);
            assert_eq!(refused.code(), Code::PermissionDenied, "{name}");
        }
        let own_namespace = f.authorizer.admit("argocd", &agent).expect_err("the principal's namespace");
        assert_eq!(own_namespace.code(), Code::PermissionDenied);
    }

    #[tokio::test]
    async fn a_valid_session_gets_a_permit_naming_agent_mode_and_token() {
        let f = fixture();
        let permit =
            f.authorizer.authorize(&session("agent-1", "jti-1", HOUR, false), &MetadataMap::new()).expect("permit");
        assert_eq!(permit.agent, "agent-1");
        assert_eq!(permit.mode, AgentMode::Managed);
        assert_eq!(permit.grant.token_id.as_deref(), Some("jti-1"));
        assert!(permit.grant.binding.is_some());
    }

    #[tokio::test]
    async fn each_refusal_names_its_reason() {
        let f = fixture();
        let refused = |ext: &http::Extensions| f.authorizer.authorize(ext, &MetadataMap::new()).expect_err("refused");

        let none = refused(&http::Extensions::new());
        assert_eq!(none.code(), Code::Unauthenticated);
        assert!(none.message().contains("no authenticated agent"), "{none:?}");

        let outside = refused(&session("other-1", "jti", HOUR, false));
        assert_eq!(outside.code(), Code::PermissionDenied);
        assert!(outside.message().contains("--allowed-namespaces"), "{outside:?}");

        let expired = refused(&session("agent-1", "jti", HOUR, true));
        assert_eq!(expired.code(), Code::Unauthenticated);
        assert!(expired.message().contains("expired"), "{expired:?}");

        f.hub.peers.get_or_create("agent-2", AgentMode::Managed);
        let stream = f.hub.peers.get("agent-2").expect("peer");
        let grant = StreamGrant::of(&session("agent-2", "jti-2", HOUR, false), "agent-2");
        let _handle = stream.attach(AgentMode::Managed, grant);
        assert!(f.hub.peers.revoke("agent-2"));
        let revoked = refused(&session("agent-2", "jti-2", HOUR, false));
        assert_eq!(revoked.code(), Code::Unauthenticated);
        assert!(revoked.message().contains("revoked"), "{revoked:?}");
        assert!(f.authorizer.authorize(&session("agent-2", "jti-3", HOUR, false), &MetadataMap::new()).is_ok());

        let mut listed = std::collections::BTreeMap::new();
        listed.insert("agent.agent-3".to_owned(), "compromised".to_owned());
        f.blocklist.replace(BlocklistData::from_data(&listed));
        let blocked = refused(&session("agent-3", "jti", HOUR, false));
        assert_eq!(blocked.code(), Code::Unauthenticated);
        assert!(blocked.message().contains("argocd-agent-tls-blocklist"), "{blocked:?}");
    }

    #[tokio::test]
    async fn the_session_check_of_authenticate_and_refresh_is_the_blocklist() {
        let f = fixture();
        let name = auth::AgentName::new("agent-4").expect("name");
        let identity = auth::AgentIdentity::new(name, "header", auth::Binding::SpiffeId("spiffe://t/a4".into()));
        assert!(f.authorizer.check_session(&identity).is_ok());
        let mut listed = std::collections::BTreeMap::new();
        listed.insert("agent.agent-4".to_owned(), String::new());
        f.blocklist.replace(BlocklistData::from_data(&listed));
        assert!(f.authorizer.check_session(&identity).expect_err("listed").contains("agent.agent-4"));
    }

    #[tokio::test]
    async fn the_layer_answers_refused_calls_itself_and_hands_the_service_a_permit() {
        use tower::{Layer as _, ServiceExt as _};
        let f = fixture();
        let authorizer = Arc::new(Authorizer::new(f.hub.clone(), insecure_metadata_identity(), f.blocklist.clone()));
        let inner = tower::service_fn(|request: http::Request<()>| async move {
            let agent = request.extensions().get::<Permit>().map(|p| p.agent.clone()).unwrap_or_default();
            Ok::<_, std::convert::Infallible>(http::Response::new(agent))
        });
        let service = AuthorizeLayer::new(authorizer).layer(inner);

        let refused = service.clone().oneshot(http::Request::new(())).await.expect("response");
        assert_eq!(refused.headers().get("grpc-status").map(|v| v.as_bytes()), Some(b"16".as_slice()));
        assert_eq!(refused.body(), "", "the service never ran");

        let request = http::Request::builder()
            .header(crate::ident::INSECURE_AGENT_NAME_HEADER, "agent-5")
            .header(crate::ident::INSECURE_AGENT_MODE_HEADER, "autonomous")
            .body(())
            .expect("request");
        let admitted = service.oneshot(request).await.expect("response");
        assert_eq!(admitted.body(), "agent-5");
    }
}
