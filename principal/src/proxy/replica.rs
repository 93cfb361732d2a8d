//! The link from one principal replica to another (`--agent-leases`, docs/ha.md): mutual TLS to
//! the owner's resource-proxy listener with the replica client certificate, HTTP/1.1 over it.
//! Both the resource proxy ([`super::forward`]) and the Redis proxy
//! ([`crate::redis`]) forward over it; this file names nothing else of either, so neither wing
//! reaches up into the other.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use rustls::pki_types::ServerName;

/// The header naming the agent of a request one replica forwards to another. Believed only from
/// a replica's certificate.
pub const FORWARDED_AGENT_HEADER: &str = "x-argocd-agent-forwarded-agent";

/// The path prefix of the owner's replica-only Redis endpoints on its resource-proxy listener
/// (not a Kubernetes API path: no API server serves it).
pub(crate) const REDIS_PATH: &str = "/.argocd-agent/replica/redis/";

/// How a replica forwards requests for agents another replica owns.
#[derive(Clone, Debug)]
pub struct ReplicaForwarding {
    /// Client TLS: the replica client certificate (the subject OU mark), and the CA that the
    /// replicas' resource-proxy server certificates chain to.
    pub tls: Arc<rustls::ClientConfig>,
    /// The name the owners' resource-proxy certificates are verified for (by default the host
    /// of `--resource-proxy-address`: every replica serves the same certificate).
    pub server_name: ServerName<'static>,
    /// How long dialing the owner and its TLS handshake may take.
    pub connect_timeout: Duration,
}

/// One HTTP/1.1 connection to a replica's resource proxy.
pub(crate) type Sender<B> = hyper::client::conn::http1::SendRequest<B>;

impl ReplicaForwarding {
    /// Dials `address`, verifies its certificate for [`Self::server_name`], presents the replica
    /// client certificate and opens HTTP/1.1; the connection lives until the sender and the last
    /// answer's body are dropped. The error says what failed, for the caller to name the owner.
    pub(crate) async fn connect<B>(&self, address: &str) -> Result<Sender<B>, String>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let connect = async {
            let tcp = tokio::net::TcpStream::connect(address).await?;
            tcp.set_nodelay(true)?;
            tokio_rustls::TlsConnector::from(self.tls.clone()).connect(self.server_name.clone(), tcp).await
        };
        let tls = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err(format!("no connection within {:?}", self.connect_timeout)),
        };
        let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        // The connection lives as long as the answer's body is read (a followed log or a
        // subscription streams).
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection to another replica ended");
            }
        });
        Ok(sender)
    }
}

/// A request for `agent` to a replica at `address` (the `Host`), naming the agent in
/// [`FORWARDED_AGENT_HEADER`].
pub(crate) fn request<B>(address: &str, agent: &str, path: &str, body: B) -> Result<Request<B>, String> {
    Request::get(path)
        .header(http::header::HOST, address)
        .header(FORWARDED_AGENT_HEADER, agent)
        .body(body)
        .map_err(|e| format!("cannot build the request: {e}"))
}
