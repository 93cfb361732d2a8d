//! The resource proxy (upstream §5.1): a Kubernetes-API-compatible HTTPS endpoint through which
//! the hub's Argo CD (or kubectl) reaches an agent's cluster.
//!
//! A request names its agent by the client certificate it presents (CN) or, when it carries
//! one, by the resource-proxy bearer token of a self-registered cluster secret. It is sent to
//! that agent over its event stream as a `resource` request; the agent executes it against its
//! own cluster with its own credentials, under its own rules of what may be read and changed,
//! and answers. Better than upstream where upstream falls short (§10 item 13): every error is a
//! Kubernetes `Status` body, `/apis/<group>` discovery works, the listen address is configured,
//! request bodies and requests per agent are bounded, a request whose caller gave up is
//! withdrawn from the agent's queue, and an agent can only ever answer its own requests.
//!
//! The HTTP surface is a tower stack: tower-http sets and propagates `x-request-id`, traces each
//! request (with `Authorization` redacted), bounds the body's size and how long it may stall;
//! `ResourceProxy::handle` does the rest.

pub(crate) mod forward;
pub(crate) mod logs;
pub(crate) mod replica;
mod status;
pub(crate) mod terminal;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full};
use protocol::payload::{ApiPath, ResourceRequest, ResourceResponse};
use protocol::{Event, EventType, Target};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::ServiceBuilderExt as _;

use crate::pending::{Completion, Pending};

use crate::sync::hub::Hub;

/// What the proxy answers with: a whole body, or a stream (`pods/log` with `follow`).
pub(crate) type ProxyBody = UnsyncBoxBody<Bytes, std::io::Error>;

/// `resp` with its body boxed as a [`ProxyBody`].
pub(crate) fn boxed(resp: Response<Full<Bytes>>) -> Response<ProxyBody> {
    resp.map(|b| b.map_err(|never: Infallible| match never {}).boxed_unsync())
}

/// The resource proxy's limits and caller authentication.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// How long a request waits for its agent's answer before 504 (upstream: 30 s).
    pub request_timeout: Duration,
    /// Largest request body accepted (413 above).
    pub max_request_bytes: usize,
    /// Requests of one agent in flight at once (429 above).
    pub max_in_flight_per_agent: usize,
    /// Verifies the bearer tokens of self-registered cluster secrets; `None`: only client
    /// certificates name the agent.
    pub tokens: Option<auth::SessionIssuer>,
    /// How many connections it holds, and their handshake, header, idle and keepalive times
    /// ([`crate::transport::limits`]).
    pub connections: crate::transport::limits::ListenerLimits,
    /// Only client certificates marked as the resource proxy's callers' (subject OU
    /// [`auth::roles::RESOURCE_PROXY_CLIENT_OU`], as `argocd-agentctl agent create` and
    /// `pki issue shared-client` issue them) are accepted, so an agent's own gRPC client
    /// certificate does not open the proxy (`--resource-proxy-require-client-mark`, default on;
    /// off accepts certificates issued before the mark, e.g. by upstream's `argocd-agentctl`).
    pub require_client_mark: bool,
    /// How to forward requests for an agent another replica owns to that replica
    /// (`--agent-leases`, [`ProxyConfig::forward_to_replicas`]); `None`: such requests are
    /// answered 502 naming the owner.
    pub(crate) replicas: Option<replica::ReplicaForwarding>,
}

impl ProxyConfig {
    /// Forward requests for an agent another replica owns to that replica over mutual TLS:
    /// `tls` presents the replica client certificate (subject OU
    /// [`auth::roles::PRINCIPAL_REPLICA_OU`]) and trusts the CA of the replicas' resource-proxy
    /// certificates, which are verified for `server_name`.
    #[must_use]
    pub fn forward_to_replicas(
        mut self,
        tls: Arc<rustls::ClientConfig>,
        server_name: rustls::pki_types::ServerName<'static>,
    ) -> Self {
        self.replicas = Some(replica::ReplicaForwarding { tls, server_name, connect_timeout: Duration::from_secs(5) });
        self
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(30),
            max_request_bytes: 4 << 20,
            max_in_flight_per_agent: 64,
            tokens: None,
            connections: crate::transport::limits::ListenerLimits::default(),
            require_client_mark: true,
            replicas: None,
        }
    }
}

/// What the resource proxy's callers wait for: agents' answers to resource requests, their
/// `StreamLogs` calls for log requests, their `StreamTerminal` calls for terminal sessions. The
/// proxy owns them; the agents' services ([`crate::service`]) complete them.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    /// Resource-proxy requests waiting for their agent's answer.
    pub(crate) live: Pending,
    /// Pod-log requests waiting for their agent's `StreamLogs` call.
    pub(crate) logs: Pending<logs::Attach>,
    /// Terminal sessions waiting for their agent's `StreamTerminal` call.
    pub(crate) terminals: Pending<terminal::Attach>,
}

/// The resource proxy of one principal.
#[derive(Clone, Debug)]
pub struct ResourceProxy {
    hub: Arc<Hub>,
    tables: Arc<Tables>,
    config: Arc<ProxyConfig>,
    /// Reads the agent name from a client certificate's CN.
    names: Option<Arc<auth::MtlsAuthenticator>>,
    /// This principal's Redis proxy once built: it answers the Redis reads other replicas
    /// forward here ([`replica::REDIS_PATH`]).
    redis: Arc<std::sync::OnceLock<crate::redis::RedisProxy>>,
}

/// Where a request for an agent owned by another replica goes.
enum Forward {
    /// To the owner, at its resource proxy's address.
    To { owner: String, address: String, fwd: replica::ReplicaForwarding },
    /// Nowhere: the answer says why.
    Refused(Response<Full<Bytes>>),
}

/// Who is calling, from the TLS handshake.
#[derive(Clone, Debug, Default)]
struct Caller {
    /// The leaf client certificate (DER), if one was presented.
    cert: Option<Vec<u8>>,
}

/// Longest a request body may pause between chunks.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// The `/version` answer: upstream's fixed version, so Argo CD sees the same server version
/// through either proxy.
const VERSION: &str = r#"{"major":"1","minor":"28","gitVersion":"v1.28.5+argocd-agent","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":"linux/amd64"}"#;

impl ResourceProxy {
    pub(crate) fn new(
        hub: Arc<Hub>,
        tables: Arc<Tables>,
        config: ProxyConfig,
        redis: Arc<std::sync::OnceLock<crate::redis::RedisProxy>>,
    ) -> Self {
        Self { hub, tables, config: Arc::new(config), names: crate::ident::cn_reader().map(Arc::new), redis }
    }

    /// Among replicas (`--agent-leases`): publishes `address` (`host:port`) on this replica's
    /// Lease as where the others reach this resource proxy, to forward requests for its agents.
    /// Without Leases, nothing to do.
    pub fn publish_replica_address(&self, address: String) {
        if let Some(leases) = &self.hub.leases {
            leases.publish_proxy_address(address);
        }
    }

    /// Serves HTTPS on `listener` with the TLS configuration `tls` holds (re-read for every
    /// handshake, so a reloaded certificate or CA takes effect without a restart), until
    /// `cancel` fires; then open connections finish their requests and close.
    ///
    /// Connections are bounded by [`ProxyConfig::connections`]: at most so many at once (more
    /// are closed as they come), of which a quarter without a client certificate (every request
    /// of such a connection is refused, so it counts as unauthenticated as long as it lives);
    /// the handshake, the first request's headers, and HTTP/2 PINGs within their timeouts; a
    /// connection with no request open is closed after the idle time, or the header timeout
    /// without a client certificate.
    pub async fn serve(
        self,
        listener: TcpListener,
        tls: tokio::sync::watch::Receiver<Arc<rustls::ServerConfig>>,
        cancel: CancellationToken,
    ) {
        let limits = self.config.connections;
        let gate = crate::transport::limits::Gate::new("resource proxy", limits);
        let mut connections = crate::transport::accept::until_cancelled(
            &listener,
            &cancel,
            "resource proxy",
            || gate.admit(),
            |tcp, remote, mut admission| {
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.borrow().clone());
                let proxy = self.clone();
                let cancel = cancel.clone();
                async move {
                    let timeout = limits.timeouts.handshake;
                    let Some(stream) =
                        crate::transport::accept::tls_handshake(acceptor, tcp, timeout, remote, "resource proxy").await
                    else {
                        return;
                    };
                    let cert = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| c.to_vec());
                    let idle = if cert.is_some() {
                        admission.authenticated();
                        limits.timeouts.idle
                    } else {
                        limits.timeouts.header
                    };
                    let stream = crate::transport::limits::Gated::new(stream, admission);
                    let bounds = crate::transport::limits::HttpBounds { timeouts: limits.timeouts, idle };
                    proxy.serve_connection(stream, Caller { cert }, bounds, cancel).await;
                }
            },
        )
        .await;
        while connections.join_next().await.is_some() {}
    }

    async fn serve_connection<IO>(
        self,
        io: IO,
        caller: Caller,
        bounds: crate::transport::limits::HttpBounds,
        cancel: CancellationToken,
    ) where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let caller = Arc::new(caller);
        let limit = self.config.max_request_bytes;
        let proxy = self.clone();
        let service = tower::ServiceBuilder::new()
            .sensitive_request_headers(Arc::new([header::AUTHORIZATION, header::COOKIE, header::PROXY_AUTHORIZATION]))
            .set_x_request_id(tower_http::request_id::MakeRequestUuid)
            .layer(
                tower_http::trace::TraceLayer::new_for_http().make_span_with(|req: &Request<_>| {
                    let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("");
                    tracing::debug_span!("resource_proxy", method = %req.method(), path = %req.uri().path(), request_id = %id)
                }),
            )
            .propagate_x_request_id()
            // A body trickling in slower than this is cut off (the handler answers 413).
            .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(BODY_TIMEOUT))
            .layer(tower_http::limit::RequestBodyLimitLayer::new(limit))
            .service_fn(move |req| {
                let (proxy, caller) = (proxy.clone(), caller.clone());
                async move { Ok::<_, Infallible>(proxy.handle(&caller, req).await) }
            });
        // Upstream's read-header time-out (5 s by default), for HTTP/2 too: a client that opens
        // a connection and sends nothing, or only the preface, does not hold it. With upgrades:
        // `pods/<p>/exec` turns the connection into a WebSocket (the terminal).
        crate::transport::limits::serve_http(io, service, bounds, &cancel).await;
    }

    /// Answers one request, and records it.
    async fn handle<B>(&self, caller: &Caller, req: Request<B>) -> Response<ProxyBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: std::fmt::Display,
    {
        let started = Instant::now();
        let verb = verb(req.method());
        let mut agent = String::new();
        let resp = self.answer(caller, req, &mut agent).await;
        let code = resp.status();
        let reason = (!code.is_success()).then(|| status::reason(code));
        crate::metrics::global().proxy_request(&agent, verb, code.as_u16(), reason, started.elapsed());
        if code.is_server_error() || code == StatusCode::UNAUTHORIZED || code == StatusCode::FORBIDDEN {
            tracing::info!(%agent, verb, code = code.as_u16(), "resource proxy request refused or failed");
        } else {
            tracing::debug!(%agent, verb, code = code.as_u16(), elapsed = ?started.elapsed(), "resource proxy request");
        }
        resp
    }

    async fn answer<B>(&self, caller: &Caller, req: Request<B>, agent_out: &mut String) -> Response<ProxyBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: std::fmt::Display,
    {
        let (agent, forwarded) = match self.agent_of(caller, &req) {
            Ok(agent) => agent,
            Err(resp) => return boxed(resp),
        };
        agent_out.clone_from(&agent);
        if let Some(what) = req.uri().path().strip_prefix(replica::REDIS_PATH) {
            // Another replica's Redis proxy reads its agent's key here: replicas only, and never
            // forwarded again.
            if !forwarded {
                return boxed(status::failure(
                    StatusCode::FORBIDDEN,
                    &format!(
                        "{} is for principal replicas only (a client certificate with subject OU {})",
                        replica::REDIS_PATH,
                        auth::roles::PRINCIPAL_REPLICA_OU
                    ),
                ));
            }
            let Some(redis) = self.redis.get() else {
                return boxed(status::failure(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "this principal replica serves no Redis proxy (--redis-server-address) to read agents' keys with",
                ));
            };
            return crate::redis::replica::serve(redis, &agent, what, req.uri().query().unwrap_or("")).await;
        }
        if !forwarded && let Some(resp) = self.forward_to_owner(&agent, req.method(), req.headers()) {
            // Owned elsewhere: the owner answers (or the 502 says why it could not).
            let metrics = crate::metrics::global();
            return match resp {
                Forward::To { owner, address, fwd } => {
                    let resp = forward::forward(&fwd, &owner, &address, &agent, req, self.config.request_timeout).await;
                    let failed = matches!(resp.status(), StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT);
                    metrics.replica_forward("resource_proxy", if failed { "failed" } else { "answered" });
                    resp
                }
                Forward::Refused(resp) => {
                    metrics.replica_forward("resource_proxy", "refused");
                    boxed(resp)
                }
            };
        }
        let target = match ApiPath::parse(req.uri().path()) {
            Ok(ApiPath::Resource(t)) => t,
            _ => return boxed(self.request(&agent, req).await),
        };
        // Pod logs and terminals are sessions on their own streams, not one request and answer.
        match (target.resource.as_str(), target.subresource.as_str(), target.group.is_empty()) {
            ("pods", "log", true) => logs::serve(self, &agent, target, req).await,
            ("pods", "exec", true) => terminal::serve(self, &agent, target, req).await,
            _ => boxed(self.request(&agent, req).await),
        }
    }

    /// Where a request for `agent` goes when another live replica owns it and this one does not
    /// hold its stream: that replica, when this one forwards and the owner published its
    /// address; `None` when it is served here (or nowhere: [`Self::connected`] says so).
    fn forward_to_owner(&self, agent: &str, method: &Method, headers: &http::HeaderMap) -> Option<Forward> {
        if self.hub.peers.get(agent).is_some_and(|p| p.is_connected()) {
            return None;
        }
        let (owner, address) = self.hub.leases.as_ref()?.owner_proxy(agent)?;
        let fwd = self.config.replicas.clone()?;
        let Some(address) = address else {
            return Some(Forward::Refused(status::failure(
                StatusCode::BAD_GATEWAY,
                &format!(
                    "agent {agent:?} is connected to principal replica {owner:?}, which published no resource-proxy \
                     address to forward to (set --replica-proxy-host on every replica; docs/ha.md)"
                ),
            )));
        };
        if method == Method::GET && headers.get(header::UPGRADE).is_some() {
            return Some(Forward::Refused(status::failure(
                StatusCode::BAD_GATEWAY,
                &format!(
                    "agent {agent:?} is connected to principal replica {owner:?}: terminals are not forwarded \
                     between replicas; retry (the Service may pick that replica)"
                ),
            )));
        }
        Some(Forward::To { owner, address, fwd })
    }

    /// The agent `agent`'s stream, if it is connected; else the answer saying it is not.
    #[allow(clippy::result_large_err)]
    fn connected(&self, agent: &str) -> Result<Arc<crate::peer::AgentPeer>, Response<Full<Bytes>>> {
        self.hub.peers.get(agent).filter(|p| p.is_connected()).ok_or_else(|| {
            let message = match self.hub.leases.as_ref().and_then(|l| l.owner_elsewhere(agent)) {
                // Among replicas that do not forward: say where the agent is.
                Some((here, owner)) => format!(
                    "agent {agent:?} is connected to principal replica {owner:?}, not to this one ({here:?}), and \
                     this replica does not forward to the owner (it needs the replica client certificate, \
                     argocd-agentctl pki issue replica; docs/ha.md)"
                ),
                None => format!("agent {agent:?} is not connected to this principal"),
            };
            status::failure(StatusCode::BAD_GATEWAY, &message)
        })
    }

    /// Sends one request to `agent` and answers with what it answers.
    async fn request<B>(&self, agent: &str, req: Request<B>) -> Response<Full<Bytes>>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: std::fmt::Display,
    {
        let agent = agent.to_owned();
        let target = match ApiPath::parse(req.uri().path()) {
            Ok(ApiPath::Version) => return status::json(StatusCode::OK, VERSION.to_owned()),
            Ok(ApiPath::LegacyVersions) => {
                return status::json(StatusCode::OK, r#"{"kind":"APIVersions","versions":["v1"]}"#.to_owned());
            }
            Ok(ApiPath::Discovery { group, version }) => {
                ResourceRequest { group, version, ..ResourceRequest::default() }
            }
            Ok(ApiPath::Resource(t)) => ResourceRequest {
                group: t.group,
                version: t.version,
                namespace: t.namespace,
                resource: t.resource,
                name: t.name,
                subresource: t.subresource,
                ..ResourceRequest::default()
            },
            Err(e) => return status::failure(StatusCode::BAD_REQUEST, &e.to_string()),
        };
        let method = req.method().clone();
        let event_type = match method {
            Method::GET => EventType::HttpGet,
            Method::POST => EventType::HttpPost,
            Method::PATCH => EventType::HttpPatch,
            Method::DELETE => EventType::HttpDelete,
            _ => {
                return status::failure(
                    StatusCode::METHOD_NOT_ALLOWED,
                    &format!("{method} is not served by the resource proxy (GET, POST, PATCH and DELETE are)"),
                );
            }
        };
        let query: Vec<(String, String)> =
            form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()).into_owned().collect();
        if query.iter().any(|(k, v)| k == "watch" && (v == "true" || v == "1")) {
            return status::failure(
                StatusCode::METHOD_NOT_ALLOWED,
                "watch is not served by the resource proxy; list or get instead",
            );
        }
        if matches!(target.subresource.as_str(), "exec" | "attach" | "portforward" | "proxy" | "log") {
            // `pods/log` and `pods/exec` are served above; these are not.
            return status::failure(
                StatusCode::NOT_IMPLEMENTED,
                &format!("subresource {:?} is not served by the resource proxy yet", target.subresource),
            );
        }
        let peer = match self.connected(&agent) {
            Ok(peer) => peer,
            Err(resp) => return resp,
        };
        let uuid = protocol::event::new_uuid();
        let (_ticket, answer) = match self.tables.live.begin(&agent, &uuid, self.config.max_in_flight_per_agent) {
            Ok(t) => t,
            Err(busy) => {
                return status::busy(&format!(
                    "agent {agent:?} already has {} resource-proxy requests in flight",
                    busy.in_flight
                ));
            }
        };
        let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return status::failure(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("request body refused ({e}); at most {} bytes", self.config.max_request_bytes),
                );
            }
        };
        let mut params: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
        for (k, v) in query {
            if protocol::payload::QUERY_PARAMS.contains(&k.as_str()) {
                params.entry(k).or_insert(v);
            }
        }
        if method == Method::PATCH
            && let Some(ct) = content_type
        {
            // Upstream's agent reads the patch type of subresource patches from here.
            params.insert("content-type".to_owned(), ct);
        }
        let request = ResourceRequest {
            uuid: uuid.clone(),
            method: method.as_str().to_owned(),
            body: body.to_vec(),
            params,
            ..target
        };
        let event = match Event::request(event_type, Target::Resource, &uuid).with_json(&request) {
            Ok(e) => e.with_principal_uid(self.hub.principal_uid.clone()),
            Err(e) => {
                return status::failure(StatusCode::INTERNAL_SERVER_ERROR, &format!("cannot encode the request: {e}"));
            }
        };
        peer.push(event);
        let answered = tokio::time::timeout(self.config.request_timeout, answer).await;
        // Answered or not, nothing of this request may be sent (again) from now on.
        peer.mailbox().withdraw(&uuid);
        match answered {
            Ok(Ok(answer)) => respond(&agent, &method, answer),
            Ok(Err(_)) => {
                status::failure(StatusCode::BAD_GATEWAY, &format!("agent {agent:?}: disconnected before it answered"))
            }
            Err(_) => status::failure(
                StatusCode::GATEWAY_TIMEOUT,
                &format!("agent {agent:?} did not answer within {:?}", self.config.request_timeout),
            ),
        }
    }

    /// The agent a request is for: the bearer token's subject if it carries one (it must
    /// verify), else the client certificate's CN (upstream §3.10). Either must be a DNS label,
    /// and the certificate must be marked as a resource-proxy client's
    /// ([`ProxyConfig::require_client_mark`]).
    #[allow(clippy::result_large_err)]
    fn agent_of<B>(&self, caller: &Caller, req: &Request<B>) -> Result<(String, bool), Response<Full<Bytes>>> {
        let Some(cert) = &caller.cert else {
            return Err(status::failure(StatusCode::UNAUTHORIZED, "a client certificate is required"));
        };
        let forwarded_for = req.headers().get(replica::FORWARDED_AGENT_HEADER);
        if auth::roles::is_principal_replica(cert) {
            // Another replica forwards a request it authenticated: it names the agent.
            let Some(agent) = forwarded_for.and_then(|v| v.to_str().ok()).filter(|a| crate::config::is_dns_label(a))
            else {
                return Err(status::failure(
                    StatusCode::UNAUTHORIZED,
                    &format!(
                        "a principal replica's certificate opens the resource proxy only for a request another \
                         replica forwards, naming its agent in {} (a DNS label)",
                        replica::FORWARDED_AGENT_HEADER
                    ),
                ));
            };
            return Ok((agent.to_owned(), true));
        }
        if forwarded_for.is_some() {
            return Err(status::failure(
                StatusCode::UNAUTHORIZED,
                &format!(
                    "{} is accepted only from a principal replica's certificate (subject OU {})",
                    replica::FORWARDED_AGENT_HEADER,
                    auth::roles::PRINCIPAL_REPLICA_OU
                ),
            ));
        }
        if self.config.require_client_mark && !auth::roles::is_resource_proxy_client(cert) {
            return Err(status::failure(
                StatusCode::UNAUTHORIZED,
                &format!(
                    "the client certificate is not a resource-proxy client certificate (subject OU {}): an agent's \
                     certificate does not open the resource proxy; issue the cluster secret's certificate with \
                     `argocd-agentctl agent create` (or `pki issue shared-client`), or accept certificates issued \
                     before the mark with --resource-proxy-require-client-mark=false",
                    auth::roles::RESOURCE_PROXY_CLIENT_OU
                ),
            ));
        }
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
        if let Some(token) = bearer {
            let Some(issuer) = &self.config.tokens else {
                return Err(status::failure(StatusCode::UNAUTHORIZED, "bearer tokens are not accepted here"));
            };
            return match issuer.verify(token.trim(), auth::TokenKind::ResourceProxy) {
                Ok(v) => Ok((v.agent.as_str().to_owned(), false)),
                Err(e) => Err(status::failure(StatusCode::UNAUTHORIZED, &format!("bearer token refused: {e}"))),
            };
        }
        match self.names.as_ref().map(|n| n.agent_name(cert)) {
            Some(Ok(name)) => Ok((name.as_str().to_owned(), false)),
            Some(Err(e)) => {
                Err(status::failure(StatusCode::UNAUTHORIZED, &format!("the client certificate names no agent: {e}")))
            }
            None => Err(status::failure(StatusCode::UNAUTHORIZED, "client certificates cannot be read here")),
        }
    }
}

/// The HTTP answer to an agent's [`ResourceResponse`] for a `method` request: a success passes
/// its body on; an error passes on the API server's `Status` when the agent sent one, and says
/// what it knows otherwise (an upstream agent sends bare codes). Only a code a Kubernetes API
/// server answers to such a request passes ([`api_server_answers`]); any other (a protocol
/// switch, a redirect, a partial content...) is a 502 naming the agent, so an agent cannot make
/// the hub's client do what no API server would ask of it.
fn respond(agent: &str, method: &Method, answer: ResourceResponse) -> Response<Full<Bytes>> {
    let code = u16::try_from(answer.status).ok().and_then(|c| StatusCode::from_u16(c).ok());
    let Some(code) = code.filter(|c| api_server_answers(method, *c)) else {
        tracing::warn!(%agent, %method, status = answer.status, "resource-proxy answer with a status code no API server answers; 502");
        return status::failure(
            StatusCode::BAD_GATEWAY,
            &format!(
                "agent {agent:?} answered status {}, which a Kubernetes API server never answers to a {method} request",
                answer.status
            ),
        );
    };
    if code.is_success() {
        let trimmed = answer.resource.trim_start();
        if trimmed.starts_with('{') || trimmed.starts_with('[') || trimmed.is_empty() {
            return status::json(code, answer.resource);
        }
        let mut resp = Response::new(Full::new(Bytes::from(answer.resource)));
        resp.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; charset=utf-8"));
        return resp;
    }
    if status::is_status(&answer.resource) {
        return status::json(code, answer.resource);
    }
    status::failure(code, &format!("agent {agent:?} answered {}", code.as_u16()))
}

/// Whether a Kubernetes API server answers `code` to a `method` request of the resource proxy:
/// 200 to every method, 201 to a create (and a server-side apply that creates), 202 to a delete
/// that finishes later (and a create the server accepted asynchronously), and the error codes
/// the API server's handlers and filters use (`k8s.io/apimachinery/pkg/api/errors`: bad request,
/// unauthorized, forbidden, not found, method not supported, not acceptable, already exists or
/// conflict, gone (an expired list continue), request entity too large, unsupported media type,
/// invalid, too many requests, internal error, not implemented, service unavailable, timeout).
pub(crate) fn api_server_answers(method: &Method, code: StatusCode) -> bool {
    match code.as_u16() {
        200 => true,
        201 => *method == Method::POST || *method == Method::PATCH,
        202 => *method == Method::POST || *method == Method::DELETE,
        400 | 401 | 403 | 404 | 405 | 406 | 409 | 410 | 413 | 415 | 422 | 429 | 500 | 501 | 503 | 504 => true,
        _ => false,
    }
}

fn verb(method: &Method) -> &'static str {
    match *method {
        Method::GET => "get",
        Method::POST => "create",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::PUT => "update",
        _ => "other",
    }
}

impl Tables {
    /// `agent`'s stream ended and no other replaced it: its resource requests and the terminal
    /// sessions waiting for it to attach fail at once (502) instead of waiting out their
    /// time-outs. Log sessions are left to wait: a following log resumes when the agent is back.
    pub(crate) fn agent_gone(&self, agent: &str) {
        let requests = self.live.abandon(agent);
        let terminals = self.terminals.abandon(agent);
        if requests + terminals > 0 {
            tracing::info!(%agent, requests, terminals,
                "agent stream ended: its pending resource-proxy requests and terminals fail now");
        }
    }

    /// Hands an agent's answer to the caller waiting for it; answers nobody waits for, and
    /// answers for another agent's request, are logged and dropped.
    pub(crate) fn complete(&self, agent: &str, ev: &Event, answer: ResourceResponse) {
        if answer.uuid != ev.event_id {
            tracing::warn!(%agent, event_id = %ev.event_id, uuid = %answer.uuid,
                "resource-proxy answer whose uuid is not its eventid; dropped");
            return;
        }
        match self.live.complete(agent, &ev.event_id, answer) {
            Completion::Delivered => {}
            Completion::Unknown => {
                tracing::debug!(%agent, uuid = %ev.event_id,
                    "resource-proxy answer nobody waits for (timed out); dropped");
            }
            Completion::WrongAgent => {
                tracing::warn!(%agent, uuid = %ev.event_id,
                    "resource-proxy answer for a request sent to another agent; refused");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_answers_become_responses_clients_understand() {
        let respond = |agent: &str, answer: ResourceResponse| respond(agent, &Method::GET, answer);
        let ok =
            respond("a", ResourceResponse { uuid: "u".into(), status: 200, resource: "{\"kind\":\"Pod\"}".into() });
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()[header::CONTENT_TYPE], "application/json");
        let bare = respond("a", ResourceResponse { uuid: "u".into(), status: 403, resource: String::new() });
        assert_eq!(bare.status(), StatusCode::FORBIDDEN);
        let passed = protocol::payload::status_body(404, "pods \"x\" not found");
        let nf = respond("a", ResourceResponse { uuid: "u".into(), status: 404, resource: passed });
        assert_eq!(nf.status(), StatusCode::NOT_FOUND);
        let odd = respond("a", ResourceResponse { uuid: "u".into(), status: 99_999, resource: String::new() });
        assert_eq!(odd.status(), StatusCode::BAD_GATEWAY);
        let text = respond("a", ResourceResponse { uuid: "u".into(), status: 200, resource: "line 1\n".into() });
        assert!(text.headers()[header::CONTENT_TYPE].to_str().is_ok_and(|v| v.starts_with("text/plain")));
    }

    #[test]
    fn only_codes_an_api_server_answers_pass() {
        let answer = |status: i64| ResourceResponse { uuid: "u".into(), status, resource: String::new() };
        for (method, code) in [
            (Method::GET, 101),
            (Method::GET, 302),
            (Method::GET, 206),
            (Method::GET, 201),
            (Method::GET, 204),
            (Method::DELETE, 201),
            (Method::PATCH, 202),
            (Method::GET, 418),
            (Method::GET, 0),
        ] {
            let resp = respond("agent-a", &method, answer(code));
            assert_eq!(resp.status(), StatusCode::BAD_GATEWAY, "{method} answered {code} must not pass");
        }
        for (method, code) in [
            (Method::GET, 200),
            (Method::POST, 201),
            (Method::PATCH, 201),
            (Method::DELETE, 202),
            (Method::GET, 404),
            (Method::PATCH, 409),
            (Method::POST, 422),
            (Method::GET, 410),
            (Method::GET, 429),
        ] {
            let resp = respond("agent-a", &method, answer(code));
            assert_eq!(resp.status().as_u16(), u16::try_from(code).unwrap(), "{method} answered {code} passes");
        }
    }

    #[tokio::test]
    async fn a_refused_code_is_a_502_naming_the_agent() {
        let resp = respond(
            "agent-a",
            &Method::GET,
            ResourceResponse { uuid: "u".into(), status: 101, resource: String::new() },
        );
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("agent \\\"agent-a\\\" answered status 101"), "{text}");
    }
}
