//! The HTTP listeners of `argocd-agent principal` and `agent`: `/metrics` (Prometheus text
//! format 0.0.4) on the metrics port, `/healthz` and `/readyz` on the health port
//! (docs/operations/metrics.md).
//!
//! Where they bind: `--metrics-address`/`--healthz-address` (`HOST:PORT`, port 0 picks a free
//! port) when given; otherwise the process's listen host (0.0.0.0 when empty, as upstream) and
//! `--metrics-port`/`--healthz-port`, where port 0 turns the listener off (upstream's
//! semantics). Each prints `<process> <metrics|healthz> listening on <addr>` once bound.
//!
//! A listener that cannot bind stops startup when its address or port was set explicitly; on
//! the upstream default port it is logged and skipped, so several processes on one machine
//! (the quickstart, tests) do not fight over 8000/8003/8181/8001.
//!
//! Both routers sit behind the same tower-http stack as the resource proxy: credentials
//! (`Authorization`, `Cookie`) are marked sensitive, `x-request-id` is set and echoed, each
//! request is traced in a debug span, a request that does not answer within [`REQUEST_TIMEOUT`]
//! gets a 408 saying so, and a body (these endpoints take none) over [`MAX_BODY_BYTES`] a 413.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::http::{Request, StatusCode, header};
use axum::response::IntoResponse as _;
use axum::routing::get;
use tokio_util::sync::CancellationToken;
use tower_http::ServiceBuilderExt as _;

/// How long a scrape or probe may take before it is answered 408 (they take milliseconds).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest request body accepted (413 above); `/metrics`, `/healthz` and `/readyz` take none.
pub const MAX_BODY_BYTES: usize = 1024;

/// Renders the metrics exposition.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// `Ok` when healthy, else why not (answered with 503).
pub type Health = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Where one listener binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    host: String,
    port: u16,
    /// Set by the operator (address flag, or a non-default port): failing to bind is fatal.
    explicit: bool,
}

/// The listener for `port` (flag `port_flag`, upstream default `default_port`) on `host`, or
/// `address` (flag `address_flag`) when given. `None`: turned off (port 0 without an address).
///
/// # Errors
/// `address` is not `HOST:PORT`.
pub fn listen(
    address: Option<&str>,
    address_flag: &str,
    host: &str,
    port: u16,
    default_port: u16,
) -> anyhow::Result<Option<Listen>> {
    if let Some(address) = address {
        let (h, p) = address
            .rsplit_once(':')
            .with_context(|| format!("{address_flag} {address:?}: expected HOST:PORT, e.g. 127.0.0.1:0"))?;
        let port: u16 =
            p.parse().with_context(|| format!("{address_flag} {address:?}: {p:?} is not a port (0-65535)"))?;
        let h = h.trim_start_matches('[').trim_end_matches(']');
        let host = if h.is_empty() { "0.0.0.0" } else { h };
        return Ok(Some(Listen { host: host.to_owned(), port, explicit: true }));
    }
    if port == 0 {
        return Ok(None);
    }
    let host = if host.is_empty() { "0.0.0.0" } else { host };
    Ok(Some(Listen { host: host.to_owned(), port, explicit: port != default_port }))
}

fn metrics_router(render: Render) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let render = render.clone();
            async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], render()) }
        }),
    )
}

fn health_router(health: Health) -> Router {
    let answer = move || {
        let health = health.clone();
        async move {
            match health() {
                Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
                Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
            }
        }
    };
    // `/livez`: the process answers. Liveness probes use it, not `/healthz`, which is 503
    // whenever the process cannot take work (a replica without its Lease, a cross-hub replica,
    // a principal still listing the hub): restarting it would not help.
    Router::new()
        .route("/healthz", get(answer.clone()))
        .route("/readyz", get(answer))
        .route("/livez", get(|| async { "ok\n" }))
}

/// `router` behind the tower-http stack (module docs); `kind` names the listener in the span,
/// `timeout` is [`REQUEST_TIMEOUT`] outside tests.
fn layered(kind: &'static str, router: Router, timeout: Duration) -> Router {
    let stack = tower::ServiceBuilder::new()
        .sensitive_request_headers(Arc::new([header::AUTHORIZATION, header::COOKIE, header::PROXY_AUTHORIZATION]))
        .set_x_request_id(tower_http::request_id::MakeRequestUuid)
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(move |req: &Request<_>| {
                    let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("");
                    tracing::debug_span!("observability", endpoint = kind, method = %req.method(), path = %req.uri().path(), request_id = %id)
                })
                // A 503 from /healthz or /readyz is an answer, not a failure of the listener.
                .on_failure(tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG)),
        )
        .propagate_x_request_id()
        // Only the timeout answers 408 here: give it a body that says what happened.
        .map_response(move |resp: axum::http::Response<_>| {
            let resp = resp.map(axum::body::Body::new);
            if resp.status() == StatusCode::REQUEST_TIMEOUT {
                let msg = format!("request timed out: no answer within {timeout:?}\n");
                (StatusCode::REQUEST_TIMEOUT, msg).into_response()
            } else {
                resp
            }
        })
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, timeout))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(MAX_BODY_BYTES));
    router.layer(stack)
}

/// Binds and serves the listeners that are on, until `cancel` fires; `process` is `principal`
/// or `agent` (in the printed line). Each holds at most a small share of the open-file limit in
/// connections (64 by default; more are closed as they come), and closes a connection whose
/// request headers do not arrive within the header timeout or that has no request open for
/// the idle time of `timeouts` ([`principal::transport::limits`]).
///
/// # Errors
/// An explicitly configured listener cannot bind.
pub async fn start(
    process: &str,
    metrics: Option<Listen>,
    healthz: Option<Listen>,
    render: Render,
    health: Health,
    timeouts: principal::transport::limits::Timeouts,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    use principal::transport::limits::{Listener, ListenerLimits, serve_http_listener};
    let listeners = [
        (
            "metrics",
            "--metrics-address/--metrics-port",
            metrics,
            layered("metrics", metrics_router(render), REQUEST_TIMEOUT),
        ),
        (
            "healthz",
            "--healthz-address/--healthz-port",
            healthz,
            layered("healthz", health_router(health), REQUEST_TIMEOUT),
        ),
    ];
    for (kind, flags, listen, router) in listeners {
        let Some(listen) = listen else {
            tracing::info!("{kind} endpoint off (port 0)");
            continue;
        };
        let listener = match tokio::net::TcpListener::bind((listen.host.as_str(), listen.port)).await {
            Ok(l) => l,
            Err(e) if !listen.explicit => {
                tracing::warn!(host = %listen.host, port = listen.port, error = %e,
                    "cannot serve the {kind} endpoint on its default port; running without it (set {flags})");
                continue;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot listen on {}:{} ({flags})", listen.host, listen.port));
            }
        };
        let addr = listener.local_addr().context("listener address")?;
        println!("{process} {kind} listening on {addr}");
        tracing::info!(%addr, "{kind} endpoint listening");
        let limits = ListenerLimits::of(Listener::Endpoint, timeouts);
        tokio::spawn(serve_http_listener(listener, kind, limits, router, cancel.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_ports_and_defaults() {
        let l = |a: Option<&str>, host: &str, port: u16| listen(a, "--metrics-address", host, port, 8000);
        assert_eq!(l(None, "", 0).ok(), Some(None), "port 0 turns it off");
        assert_eq!(
            l(None, "", 8000).ok().flatten(),
            Some(Listen { host: "0.0.0.0".into(), port: 8000, explicit: false })
        );
        assert_eq!(
            l(None, "127.0.0.1", 9000).ok().flatten(),
            Some(Listen { host: "127.0.0.1".into(), port: 9000, explicit: true })
        );
        assert_eq!(
            l(Some("127.0.0.1:0"), "", 0).ok().flatten(),
            Some(Listen { host: "127.0.0.1".into(), port: 0, explicit: true }),
            "an address wins, and port 0 there picks a free port"
        );
        assert_eq!(l(Some("[::1]:9"), "", 8000).ok().flatten().map(|x| x.host), Some("::1".into()));
        assert!(l(Some("nonsense"), "", 8000).is_err());
        assert!(l(Some("h:port"), "", 8000).is_err());
    }

    async fn call(router: &Router, req: Request<axum::body::Body>) -> (StatusCode, axum::http::HeaderMap, String) {
        use tower::ServiceExt as _;
        let resp = router.clone().oneshot(req).await.expect("infallible");
        let (parts, body) = resp.into_parts();
        let body = axum::body::to_bytes(body, usize::MAX).await.expect("body");
        (parts.status, parts.headers, String::from_utf8_lossy(&body).into_owned())
    }

    fn get_req(path: &str) -> Request<axum::body::Body> {
        Request::get(path).body(axum::body::Body::empty()).expect("request")
    }

    #[tokio::test]
    async fn the_stack_keeps_answers_and_adds_request_ids_and_limits() {
        let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let h = healthy.clone();
        let health: Health = Arc::new(move || {
            h.load(std::sync::atomic::Ordering::SeqCst).then_some(()).ok_or_else(|| "not connected".to_owned())
        });
        let router = layered("healthz", health_router(health), REQUEST_TIMEOUT);
        let (code, headers, body) = call(&router, get_req("/healthz")).await;
        assert_eq!((code, body.as_str()), (StatusCode::OK, "ok\n"));
        assert!(headers.get("x-request-id").is_some_and(|v| !v.is_empty()), "a request id is set and echoed");
        healthy.store(false, std::sync::atomic::Ordering::SeqCst);
        let (code, _, body) = call(&router, get_req("/readyz")).await;
        assert_eq!((code, body.as_str()), (StatusCode::SERVICE_UNAVAILABLE, "not connected\n"));
        let (code, _, body) = call(&router, get_req("/livez")).await;
        assert_eq!((code, body.as_str()), (StatusCode::OK, "ok\n"), "alive while not ready");
        let req = Request::get("/healthz").header("x-request-id", "abc-123").body(axum::body::Body::empty());
        let (_, headers, _) = call(&router, req.expect("request")).await;
        assert_eq!(headers.get("x-request-id").map(|v| v.as_bytes()), Some(&b"abc-123"[..]), "a caller's id is kept");
        let (code, _, _) = call(&router, get_req("/nope")).await;
        assert_eq!(code, StatusCode::NOT_FOUND);
        let big = Request::get("/healthz")
            .header(header::CONTENT_LENGTH, MAX_BODY_BYTES + 1)
            .body(axum::body::Body::from(vec![b'x'; MAX_BODY_BYTES + 1]));
        let (code, _, _) = call(&router, big.expect("request")).await;
        assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE);

        let render: Render = Arc::new(|| "up 1\n".to_owned());
        let router = layered("metrics", metrics_router(render), REQUEST_TIMEOUT);
        let (code, headers, body) = call(&router, get_req("/metrics")).await;
        assert_eq!((code, body.as_str()), (StatusCode::OK, "up 1\n"));
        assert_eq!(
            headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
            Some(&b"text/plain; version=0.0.4; charset=utf-8"[..])
        );
    }

    #[tokio::test]
    async fn a_request_that_does_not_answer_in_time_gets_408_with_a_body() {
        let slow = Router::new().route("/metrics", get(std::future::pending::<String>));
        let (code, _, body) = call(&layered("metrics", slow, Duration::from_millis(50)), get_req("/metrics")).await;
        assert_eq!(code, StatusCode::REQUEST_TIMEOUT);
        assert!(body.contains("timed out"), "{body}");
    }
}
