//! The principal's per-call authentication: a tower layer in front of the tonic router that runs
//! on every unary call and every stream open (upstream `principal/auth.go`).
//!
//! * `Authenticate`, `RefreshToken` and `Version` pass without a token, as upstream
//!   (`principal/server.go` no-auth list);
//! * every other call needs a valid access token in the `authorization` metadata (raw JWT, as
//!   upstream's agent sends it; a `Bearer ` prefix is accepted too), issued for the transport
//!   identity this call presents;
//! * on success the [`AgentSession`] and its [`AgentIdentity`] go into the request extensions,
//!   replacing anything already there; on failure the call is answered `Unauthenticated` with the
//!   reason, and the service never sees it.
//!
//! ```ignore
//! Server::builder()
//!     .layer(AuthLayer::new(sessions.clone()))
//!     .add_service(AuthenticationServer::new(AuthService::new(sessions, config, hook)))
//!     .add_service(EventStreamServer::new(events))
//!     .serve_with_incoming(TlsIncoming::new(listener, tls));
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::error::AuthError;
use crate::identity::{AgentIdentity, AgentSession, TransportIdentity};
use crate::method::AuthContext;
use crate::service::AuthObserver;
use crate::session::Sessions;

/// Full gRPC paths callable without a token (upstream's no-auth list).
pub const PUBLIC_PATHS: [&str; 3] =
    ["/authapi.Authentication/Authenticate", "/authapi.Authentication/RefreshToken", "/versionapi.Version/Version"];

/// The metadata key carrying the access token (upstream `remote.go`, `principal/auth.go`).
pub const AUTHORIZATION: &str = "authorization";

/// Builds [`Auth`] services around the principal's router.
#[derive(Clone, Debug)]
pub struct AuthLayer {
    sessions: Sessions,
    observer: Option<AuthObserver>,
}

/// Authenticates each call before `S` sees it.
#[derive(Clone, Debug)]
pub struct Auth<S> {
    inner: S,
    sessions: Sessions,
    observer: Option<AuthObserver>,
}

// === impl AuthLayer ===

impl AuthLayer {
    /// A layer verifying calls against `sessions`.
    #[must_use]
    pub fn new(sessions: Sessions) -> Self {
        Self { sessions, observer: None }
    }

    /// Reports every refused call to `observer` (method `access_token`).
    #[must_use]
    pub fn with_observer(mut self, observer: AuthObserver) -> Self {
        self.observer = Some(observer);
        self
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Auth { inner, sessions: self.sessions.clone(), observer: self.observer.clone() }
    }
}

// === impl Auth ===

impl<S> Auth<S> {
    /// The layer form, for `ServiceBuilder`s and tonic's `Server::layer`.
    #[must_use]
    pub fn layer(sessions: Sessions) -> AuthLayer {
        AuthLayer::new(sessions)
    }

    /// Decides whether the call may proceed; on success the session is in the extensions.
    fn admit<B>(&self, req: &mut http::Request<B>) -> Result<(), AuthError> {
        // Never trust what arrives: only this layer puts identities into extensions.
        req.extensions_mut().remove::<AgentSession>();
        req.extensions_mut().remove::<AgentIdentity>();
        if PUBLIC_PATHS.contains(&req.uri().path()) {
            return Ok(());
        }
        let token = bearer_token(req.headers()).ok_or(AuthError::MissingToken)?;
        let transport = TransportIdentity::from_extensions(req.extensions());
        let session = self.sessions.verify_access(token, &AuthContext::new(&transport, req.headers()))?;
        tracing::trace!(
            agent = %session.identity.name(),
            mode = %session.mode,
            path = req.uri().path(),
            "call authenticated"
        );
        req.extensions_mut().insert(session.identity.clone());
        req.extensions_mut().insert(session);
        Ok(())
    }
}

impl<S, B, ResBody> Service<http::Request<B>> for Auth<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        match self.admit(&mut req) {
            Ok(()) => ResponseFuture::inner(self.inner.call(req)),
            Err(error) => {
                let remote = TransportIdentity::from_extensions(req.extensions()).remote_addr();
                tracing::info!(path = req.uri().path(), ?remote, %error, "call refused");
                if let Some(observer) = &self.observer {
                    observer.refused("access_token", crate::service::failure_reason(&error));
                }
                ResponseFuture::refused(error.to_status().into_http())
            }
        }
    }
}

pin_project! {
    /// The response of [`Auth`]: the inner service's, or an immediate `Unauthenticated`.
    #[derive(Debug)]
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProj]
    #[derive(Debug)]
    enum State<F, B> {
        // The call was admitted: the inner service's future.
        Inner { #[pin] future: F },
        // The call was refused: the answer, until it is returned.
        Refused { response: Option<http::Response<B>> },
    }
}

impl<F, B> ResponseFuture<F, B> {
    fn inner(future: F) -> Self {
        Self { state: State::Inner { future } }
    }

    fn refused(response: http::Response<B>) -> Self {
        Self { state: State::Refused { response: Some(response) } }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future } => future.poll(cx),
            StateProj::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled again after completion: a caller bug; stay pending rather than panic.
                None => Poll::Pending,
            },
        }
    }
}

/// The token of the first `authorization` value: a raw JWT (upstream), or `Bearer <JWT>`.
fn bearer_token(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?.trim();
    let token = match value.split_once(' ') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
        _ if value.eq_ignore_ascii_case("bearer") => "",
        _ => value,
    };
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_read_raw_or_with_bearer() {
        let mut h = http::HeaderMap::new();
        assert_eq!(bearer_token(&h), None);
        h.insert(AUTHORIZATION, http::HeaderValue::from_static("a.b.c"));
        assert_eq!(bearer_token(&h), Some("a.b.c"));
        h.insert(AUTHORIZATION, http::HeaderValue::from_static("Bearer a.b.c"));
        assert_eq!(bearer_token(&h), Some("a.b.c"));
        h.insert(AUTHORIZATION, http::HeaderValue::from_static("bearer  a.b.c"));
        assert_eq!(bearer_token(&h), Some("a.b.c"));
        h.insert(AUTHORIZATION, http::HeaderValue::from_static("Bearer "));
        assert_eq!(bearer_token(&h), None);
    }

    #[tokio::test]
    async fn refused_calls_are_reported_to_the_observer() {
        use std::sync::{Arc, Mutex};
        use tower::ServiceExt as _;
        let key = crate::SigningKey::from_pem(include_str!("../tests/fixtures/jwt-key-a.pem")).expect("key");
        let sessions = Sessions::new(crate::SessionIssuer::new(key), crate::AuthMethods::new());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let observer = {
            let seen = seen.clone();
            AuthObserver::new(move |method, reason| seen.lock().unwrap().push(format!("{method}/{reason}")))
        };
        let inner = tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        });
        let svc = AuthLayer::new(sessions).with_observer(observer).layer(inner);
        let call = |path: &str| http::Request::builder().uri(path).body(()).unwrap();
        svc.clone().oneshot(call("/versionapi.Version/Version")).await.unwrap();
        svc.oneshot(call("/eventstreamapi.EventStream/Subscribe")).await.unwrap();
        assert_eq!(*seen.lock().unwrap(), vec!["access_token/missing_token".to_owned()]);
    }
}
