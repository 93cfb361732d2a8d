//! The accept loop of the principal's own TCP listeners (the resource proxy, the Redis proxy, the
//! gated incoming connections of its gRPC servers): each connection admitted under its
//! listener's cap (`admit`, the listener's gate in `super::limits`; over it, closed at once) and
//! served in its own task,
//! a failing `accept` (out of file descriptors and the like) paused on rather than spun on,
//! finished tasks reaped as they end, and a bounded TLS handshake.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Accepts connections on `listener` until `cancel` fires, each admitted by `admit` (or closed
/// at once when it answers `None`: the listener is full) and handed with its admission to
/// `serve` in its own task.
/// Returns the tasks still running, for the caller to wait on or shut down. `listener_name`
/// names the listener in logs.
pub(crate) async fn until_cancelled<A, F, Fut>(
    listener: &TcpListener,
    cancel: &CancellationToken,
    listener_name: &'static str,
    admit: impl Fn() -> Option<A>,
    mut serve: F,
) -> JoinSet<()>
where
    F: FnMut(TcpStream, SocketAddr, A) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, remote) = match accepted {
            Ok(a) => a,
            Err(error) => {
                tracing::warn!(listener = listener_name, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Over the cap: dropped here, so closed before anything is read from it.
        let Some(admission) = admit() else { continue };
        let _ = tcp.set_nodelay(true);
        connections.spawn(serve(tcp, remote, admission));
        // Reap finished connections so the set does not grow with every one ever served.
        while connections.try_join_next().is_some() {}
    }
    connections
}

/// The TLS handshake of `tcp`, or `None` (logged) when it fails or takes longer than `timeout`.
pub(crate) async fn tls_handshake(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    timeout: Duration,
    remote: SocketAddr,
    listener_name: &'static str,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(error)) => {
            tracing::debug!(listener = listener_name, %remote, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(listener = listener_name, %remote, ?timeout, "TLS handshake timed out");
            None
        }
    }
}
