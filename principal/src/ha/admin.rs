//! `haadminapi.HAAdmin` (`Status`, `Promote`, `Demote`) on `--ha-admin-port`, and its
//! authorization as upstream's (`principal/ha_integration.go`: `haAdminAuthInterceptor`,
//! `matchAdminClientIdentity`; `pkg/ha/options.go`: `WithAdminAuth`):
//!
//! * over TLS (the client certificate verified by the CA at the handshake), a call is allowed
//!   only when `--ha-admin-auth` is set and matches the client certificate: its subject as Go
//!   renders it (`mtls:subject:<regex>`, e.g. `CN=ha-admin,O=HA-Admins`) or any of its URI SANs
//!   (`mtls:uri:<regex>`). Unset: every call is denied ("secure by default"). The regex is
//!   unanchored, as upstream's `MatchString`: anchor it (`^CN=ha-admin(,|$)`) to refuse
//!   `CN=ha-admin-evil`.
//! * in plaintext, the endpoint listens on a loopback address only ([`serve`] refuses any other),
//!   and every local caller is allowed (reach it with `kubectl port-forward`).

use std::net::SocketAddr;
use std::sync::Arc;

use auth::{IdentitySource, MtlsAuthenticator, TransportIdentity};
use protocol::pb::haadminapi::ha_admin_server::{HaAdmin, HaAdminServer};
use protocol::pb::haadminapi::{
    DemoteRequest, DemoteResponse, HaStatusResponse, PromoteRequest, PromoteResponse, StatusRequest,
};
use regex::Regex;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::Ha;

/// `--ha-admin-auth`: which part of the admin client certificate must match which regex.
#[derive(Clone, Debug)]
pub struct AdminAuth {
    source: IdentitySource,
    regex: Regex,
}

impl AdminAuth {
    /// Parses `mtls:subject:<regex>` or `mtls:uri:<regex>`, with upstream's errors; `""` is
    /// "not set" (`Ok(None)`).
    ///
    /// # Errors
    /// The value names no `mtls:` source, its regex is empty or does not compile.
    pub fn parse(value: &str) -> Result<Option<Self>, String> {
        if value.is_empty() {
            return Ok(None);
        }
        let Some(rest) = value.strip_prefix("mtls:") else {
            return Err(format!("ha-admin-auth must start with 'mtls:', got: {value}"));
        };
        let (source, pattern) = if let Some(p) = rest.strip_prefix("subject:") {
            (IdentitySource::Subject, p)
        } else if let Some(p) = rest.strip_prefix("uri:") {
            (IdentitySource::Uri, p)
        } else {
            return Err(format!(
                "ha-admin-auth must specify source: 'mtls:subject:<regex>' or 'mtls:uri:<regex>', got: mtls:{rest}"
            ));
        };
        if pattern.is_empty() {
            return Err("ha-admin-auth regex pattern cannot be empty".to_owned());
        }
        let regex = Regex::new(pattern).map_err(|e| format!("ha-admin-auth regex compile error: {e}"))?;
        Ok(Some(Self { source, regex }))
    }

    /// Whether the certificate `der` is an admin's.
    ///
    /// # Errors
    /// `Unauthenticated` when the certificate cannot be read or has no URI SAN (`uri`),
    /// `PermissionDenied` when nothing matches.
    pub fn check(&self, der: &[u8]) -> Result<(), Status> {
        let values = certificate_values(der, self.source).map_err(Status::unauthenticated)?;
        match self.source {
            IdentitySource::Subject => {
                let subject = values.into_iter().next().unwrap_or_default();
                if self.regex.is_match(&subject) {
                    Ok(())
                } else {
                    Err(Status::permission_denied(format!(
                        "client identity {subject:?} does not match ha-admin-auth pattern"
                    )))
                }
            }
            IdentitySource::Uri => {
                if values.is_empty() {
                    return Err(Status::unauthenticated("no URI SANs in client certificate"));
                }
                if values.iter().any(|uri| self.regex.is_match(uri)) {
                    Ok(())
                } else {
                    Err(Status::permission_denied("no URI SAN matched ha-admin-auth pattern"))
                }
            }
        }
    }
}

/// The subject (Go rendering) or the URI SANs of a DER certificate, read by the auth crate's
/// mTLS method with a regex that never matches: its refusal carries what it read.
fn certificate_values(der: &[u8], source: IdentitySource) -> Result<Vec<String>, String> {
    #[allow(clippy::expect_used)] // a constant pattern
    let never = Regex::new(r"[^\s\S]").expect("valid regex");
    match MtlsAuthenticator::new(source, never).agent_name(der) {
        Err(auth::AuthError::SubjectMismatch { subject, .. }) => Ok(vec![subject]),
        Err(auth::AuthError::UriMismatch { uris, .. }) => Ok(uris.split(", ").map(str::to_owned).collect()),
        Err(auth::AuthError::NoUriSan) => Ok(Vec::new()),
        Err(e) => Err(format!("cannot read the client certificate: {e}")),
        Ok(_) => Err("cannot read the client certificate".to_owned()),
    }
}

/// Upstream's admin authorization on one call's transport.
///
/// # Errors
/// The status the call is refused with.
pub fn authorize(auth: Option<&AdminAuth>, transport: &TransportIdentity) -> Result<(), Status> {
    if !transport.is_tls() {
        // Only a loopback listener serves plaintext ([`serve`]).
        return Ok(());
    }
    let Some(auth) = auth else {
        return Err(Status::permission_denied("ha-admin-auth not configured; all admin calls are denied"));
    };
    let leaf = transport.leaf_certificate().ok_or_else(|| Status::unauthenticated("no verified client certificate"))?;
    auth.check(leaf.as_ref())
}

/// The `HAAdmin` service of one principal.
#[derive(Clone)]
pub struct AdminService {
    ha: Arc<Ha>,
    auth: Option<AdminAuth>,
}

impl std::fmt::Debug for AdminService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminService").field("auth", &self.auth).finish_non_exhaustive()
    }
}

impl AdminService {
    /// The service for `ha`, authorizing TLS callers with `auth`.
    #[must_use]
    pub fn new(ha: Arc<Ha>, auth: Option<AdminAuth>) -> Self {
        Self { ha, auth }
    }

    fn admit<T>(&self, request: &Request<T>, what: &str) -> Result<(), Status> {
        let transport = TransportIdentity::from_extensions(request.extensions());
        authorize(self.auth.as_ref(), &transport).inspect_err(|status| {
            tracing::warn!(call = what, remote = ?transport.remote_addr(), %status, "HA admin call refused");
        })
    }
}

#[tonic::async_trait]
impl HaAdmin for AdminService {
    async fn status(&self, request: Request<StatusRequest>) -> Result<Response<HaStatusResponse>, Status> {
        self.admit(&request, "status")?;
        Ok(Response::new(self.ha.status()))
    }

    async fn promote(&self, request: Request<PromoteRequest>) -> Result<Response<PromoteResponse>, Status> {
        self.admit(&request, "promote")?;
        let force = request.get_ref().force;
        let state = self.ha.promote(force).await.map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(PromoteResponse { state: state.as_str().to_owned() }))
    }

    async fn demote(&self, request: Request<DemoteRequest>) -> Result<Response<DemoteResponse>, Status> {
        self.admit(&request, "demote")?;
        let state = self.ha.demote().await.map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(DemoteResponse { state: state.as_str().to_owned() }))
    }
}

/// Plaintext admin only on a loopback address.
fn plaintext_allowed(addr: SocketAddr) -> Result<(), String> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(format!("the HA admin endpoint without TLS may only listen on a loopback address, not {addr}"))
    }
}

/// Serves `HAAdmin` on `listener` until `cancel` fires: over TLS with `tls` (which must verify
/// client certificates), else in plaintext on a loopback address only.
///
/// # Errors
/// A plaintext listener on a non-loopback address, or the server failed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    service: AdminService,
    cancel: CancellationToken,
) -> Result<(), String> {
    use crate::transport::limits::{Keepalive, Listener, ListenerLimits, Timeouts, tcp_incoming, tls_incoming};
    let addr: SocketAddr = listener.local_addr().map_err(|e| format!("HA admin listener: {e}"))?;
    // An operator's endpoint: few connections (a share of the open-file limit, at most 64), the
    // default handshake time, and HTTP/2 keepalive so dead callers go.
    let limits = ListenerLimits::of(Listener::Endpoint, Timeouts::default());
    let keepalive = Keepalive::default();
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(keepalive.interval))
        .http2_keepalive_timeout(Some(keepalive.timeout))
        .add_service(HaAdminServer::new(service));
    let shutdown = async move { cancel.cancelled().await };
    let served = match tls {
        Some(tls) => {
            tracing::info!(%addr, "HA admin endpoint listening (mTLS, --ha-admin-auth)");
            let tls = tokio::sync::watch::channel(tls).1;
            let incoming = tls_incoming(listener, tls, "HA admin", limits, true);
            server.serve_with_incoming_shutdown(incoming, shutdown).await
        }
        None => {
            plaintext_allowed(addr)?;
            tracing::warn!(%addr, "HA admin server running without authentication - access restricted to localhost");
            server.serve_with_incoming_shutdown(tcp_incoming(listener, "HA admin", limits), shutdown).await
        }
    };
    served.map_err(|e| format!("HA admin server failed: {e}"))
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;

    use super::*;

    const ADMIN: &str = include_str!("testdata/admin.pem"); // CN=ha-admin,O=HA-Admins
    const AGENT: &str = include_str!("testdata/agent.pem"); // CN=agent-a
    const URI: &str = include_str!("testdata/uri.pem"); // URI spiffe://example.org/ha-admin

    fn tls(pem: &str) -> TransportIdentity {
        let cert = CertificateDer::from_pem_slice(pem.as_bytes()).expect("test certificate");
        TransportIdentity::tls(None, Some(Arc::new(vec![cert])))
    }

    fn auth(spec: &str) -> AdminAuth {
        AdminAuth::parse(spec).expect("valid").expect("set")
    }

    #[test]
    fn parse_errors_are_upstreams() {
        assert!(AdminAuth::parse("").expect("empty is unset").is_none());
        assert_eq!(AdminAuth::parse("CN=x").unwrap_err(), "ha-admin-auth must start with 'mtls:', got: CN=x");
        assert_eq!(
            AdminAuth::parse("mtls:CN=x").unwrap_err(),
            "ha-admin-auth must specify source: 'mtls:subject:<regex>' or 'mtls:uri:<regex>', got: mtls:CN=x"
        );
        assert_eq!(AdminAuth::parse("mtls:subject:").unwrap_err(), "ha-admin-auth regex pattern cannot be empty");
        assert!(AdminAuth::parse("mtls:uri:(").unwrap_err().starts_with("ha-admin-auth regex compile error: "));
    }

    #[test]
    fn subject_regex_allows_the_admin_only() {
        let a = auth("mtls:subject:^CN=ha-admin(,|$)");
        assert!(authorize(Some(&a), &tls(ADMIN)).is_ok());
        let denied = authorize(Some(&a), &tls(AGENT)).unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert_eq!(denied.message(), "client identity \"CN=agent-a\" does not match ha-admin-auth pattern");
        // Upstream's documented example matches the Go rendering of the whole subject.
        assert!(authorize(Some(&auth("mtls:subject:CN=ha-admin")), &tls(ADMIN)).is_ok());
        assert!(authorize(Some(&auth("mtls:subject:^CN=ha-admin,O=HA-Admins$")), &tls(ADMIN)).is_ok());
    }

    #[test]
    fn uri_regex_reads_uri_sans() {
        let a = auth("mtls:uri:^spiffe://example\\.org/ha-admin$");
        assert!(authorize(Some(&a), &tls(URI)).is_ok());
        let none = authorize(Some(&a), &tls(ADMIN)).unwrap_err();
        assert_eq!((none.code(), none.message()), (tonic::Code::Unauthenticated, "no URI SANs in client certificate"));
        let other = authorize(Some(&auth("mtls:uri:^spiffe://other/")), &tls(URI)).unwrap_err();
        assert_eq!(other.code(), tonic::Code::PermissionDenied);
    }

    #[test]
    fn tls_without_policy_or_certificate_is_refused_and_plaintext_is_local() {
        let unset = authorize(None, &tls(ADMIN)).unwrap_err();
        assert_eq!(unset.code(), tonic::Code::PermissionDenied);
        assert_eq!(unset.message(), "ha-admin-auth not configured; all admin calls are denied");
        let no_cert = authorize(Some(&auth("mtls:subject:.")), &TransportIdentity::tls(None, None)).unwrap_err();
        assert_eq!(no_cert.code(), tonic::Code::Unauthenticated);
        // Plaintext reaches the service only through a loopback listener.
        assert!(authorize(None, &TransportIdentity::plaintext(None)).is_ok());
    }

    #[test]
    fn garbage_certificates_are_unauthenticated() {
        let bad = TransportIdentity::tls(None, Some(Arc::new(vec![CertificateDer::from(vec![0x30, 0x03, 1, 2, 3])])));
        let status = authorize(Some(&auth("mtls:subject:.")), &bad).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    }

    #[test]
    fn metrics_name_the_state_and_parse_as_prometheus_text() {
        let ha = Ha::standalone(super::super::HaConfig::default());
        let text = ha.metrics_text();
        assert!(text.contains("argocd_agent_ha_state{state=\"active\"} 1\n"), "{text}");
        assert!(text.contains("argocd_agent_ha_state{state=\"replicating\"} 0\n"), "{text}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').expect("series and value");
            assert!(series.starts_with("argocd_agent_"), "{line}");
            value.parse::<f64>().expect("a number");
        }
    }

    #[test]
    fn plaintext_only_on_loopback() {
        assert!(plaintext_allowed("127.0.0.1:8405".parse().expect("addr")).is_ok());
        assert!(plaintext_allowed("[::1]:8405".parse().expect("addr")).is_ok());
        let err = plaintext_allowed("0.0.0.0:8405".parse().expect("addr")).unwrap_err();
        assert!(err.contains("loopback"), "{err}");
    }
}
