//! Binding the agents' listener with an accept queue as deep as the kernel allows.
//!
//! `tokio::net::TcpListener::bind` asks for a backlog of 1,024. When thousands of agents
//! connect at once (a principal restart, a login storm) connections that completed their
//! handshake beyond that queue are dropped by the kernel (`ListenOverflows` in `nstat`), while
//! the client already counts them as open: its first call then fails with a bare "transport
//! error" some seconds later, and the principal never saw the connection, so nothing in its log
//! says why. Asking for the kernel's own maximum (`net.core.somaxconn`, 4,096 by default since
//! Linux 5.4) lets the accept loop catch up instead.

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// The backlog asked for when `net.core.somaxconn` cannot be read.
const FALLBACK_BACKLOG: u32 = 4096;

/// The kernel's cap on a listener's accept queue (`/proc/sys/net/core/somaxconn`).
#[must_use]
pub fn max_backlog() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(FALLBACK_BACKLOG)
}

/// A listener on `addr` (address reuse on, as tokio's `bind`) with the deepest accept queue the
/// kernel allows ([`max_backlog`]).
///
/// # Errors
///
/// The socket cannot be made, bound or put to listen.
pub fn bind_addr(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(max_backlog())
}

/// [`bind_addr`] on the first address `host:port` resolves to that binds.
///
/// # Errors
///
/// The host does not resolve, or no address binds (the last error).
pub async fn bind(host: &str, port: u16) -> io::Result<TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        match bind_addr(addr) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{host} resolves to no address"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn binds_a_free_port_with_the_kernels_backlog() {
        assert!(max_backlog() >= 128);
        let listener = bind("127.0.0.1", 0).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (accepted, from) = listener.accept().await.unwrap();
        assert_eq!(from, client.local_addr().unwrap());
        drop(accepted);
    }
}
