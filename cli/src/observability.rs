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

use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::get;
use tokio_util::sync::CancellationToken;

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
    Router::new().route("/healthz", get(answer.clone())).route("/readyz", get(answer))
}

/// Binds and serves the listeners that are on, until `cancel` fires; `process` is `principal`
/// or `agent` (in the printed line).
///
/// # Errors
/// An explicitly configured listener cannot bind.
pub async fn start(
    process: &str,
    metrics: Option<Listen>,
    healthz: Option<Listen>,
    render: Render,
    health: Health,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let listeners = [
        ("metrics", "--metrics-address/--metrics-port", metrics, metrics_router(render)),
        ("healthz", "--healthz-address/--healthz-port", healthz, health_router(health)),
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
        let shutdown = cancel.clone().cancelled_owned();
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).with_graceful_shutdown(shutdown).await {
                tracing::warn!(error = %e, "the {kind} endpoint failed");
            }
        });
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
}
