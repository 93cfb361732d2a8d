//! Resource-proxy requests for an agent another replica owns (`--agent-leases`, docs/ha.md): the
//! hub's Argo CD reaches any replica through the Service, so a replica that does not hold the
//! agent's stream forwards the request to the replica that does, over mutual TLS.
//!
//! * The forwarding replica has already authenticated the caller and named the agent (client
//!   certificate with the resource-proxy client mark, or a bearer token). It dials the owner's
//!   resource proxy at the address the owner published on its replica Lease, verifies the
//!   owner's server certificate against the CA and the resource proxy's name, and presents the
//!   **replica client certificate** (subject OU [`auth::roles::PRINCIPAL_REPLICA_OU`]). It sends
//!   the request as it came, without the caller's `Authorization`, naming the agent in
//!   [`FORWARDED_AGENT_HEADER`].
//! * The owner believes that header only from a certificate with the replica mark and without the
//!   resource-proxy client mark: an agent's certificate or a cluster secret's never passes as a
//!   replica's, whatever headers it sends. A forwarded request is never forwarded again.
//! * Pod logs stream through; terminals (WebSocket upgrades) are not forwarded.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use rustls::pki_types::ServerName;

use super::{ProxyBody, boxed, status};

/// The header naming the agent of a request one replica forwards to another. Believed only from
/// a replica's certificate.
pub const FORWARDED_AGENT_HEADER: &str = "x-argocd-agent-forwarded-agent";

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

fn failure(owner: &str, address: &str, agent: &str, what: impl std::fmt::Display) -> Response<ProxyBody> {
    boxed(status::failure(
        StatusCode::BAD_GATEWAY,
        &format!(
            "agent {agent:?} is connected to principal replica {owner:?}; forwarding the request to it at \
             {address} failed: {what}"
        ),
    ))
}

/// Sends `req` for `agent` to the replica `owner` at `address` and answers with its answer.
pub(crate) async fn forward<B>(
    fwd: &ReplicaForwarding,
    owner: &str,
    address: &str,
    agent: &str,
    req: Request<B>,
    timeout: Duration,
) -> Response<ProxyBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display,
{
    let (mut parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return boxed(status::failure(StatusCode::PAYLOAD_TOO_LARGE, &format!("request body refused ({e})")));
        }
    };
    // Headers of one hop, and the caller's credentials: the owner trusts the replica instead.
    for name in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::HOST,
        header::AUTHORIZATION,
        header::PROXY_AUTHORIZATION,
    ] {
        parts.headers.remove(name);
    }
    let Ok(agent_value) = http::HeaderValue::from_str(agent) else {
        return failure(owner, address, agent, "the agent name is not a header value");
    };
    parts.headers.insert(FORWARDED_AGENT_HEADER, agent_value);
    if let Ok(host) = http::HeaderValue::from_str(address) {
        parts.headers.insert(header::HOST, host);
    }
    let path = parts.uri.path_and_query().map_or("/", http::uri::PathAndQuery::as_str).to_owned();
    let uri: http::Uri = match path.parse() {
        Ok(uri) => uri,
        Err(e) => return failure(owner, address, agent, e),
    };
    parts.uri = uri;
    parts.version = http::Version::HTTP_11;
    let request = Request::from_parts(parts, Full::new(body));

    let connect = async {
        let tcp = tokio::net::TcpStream::connect(address).await?;
        tcp.set_nodelay(true)?;
        tokio_rustls::TlsConnector::from(fwd.tls.clone()).connect(fwd.server_name.clone(), tcp).await
    };
    let tls = match tokio::time::timeout(fwd.connect_timeout, connect).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return failure(owner, address, agent, e),
        Err(_) => return failure(owner, address, agent, format!("no connection within {:?}", fwd.connect_timeout)),
    };
    let (mut sender, connection) = match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await
    {
        Ok(pair) => pair,
        Err(e) => return failure(owner, address, agent, e),
    };
    // The connection lives as long as the answer's body is read (a followed log streams).
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "forwarded resource-proxy connection ended");
        }
    });
    match tokio::time::timeout(timeout, sender.send_request(request)).await {
        Ok(Ok(mut resp)) => {
            // One hop's headers stay on that hop (the caller may speak HTTP/2, which has none).
            for name in [header::CONNECTION, header::TRANSFER_ENCODING, header::UPGRADE, header::TRAILER] {
                resp.headers_mut().remove(name);
            }
            resp.headers_mut().remove("keep-alive");
            resp.map(|b| b.map_err(std::io::Error::other).boxed_unsync())
        }
        Ok(Err(e)) => failure(owner, address, agent, e),
        Err(_) => boxed(status::failure(
            StatusCode::GATEWAY_TIMEOUT,
            &format!("agent {agent:?}: principal replica {owner:?} did not answer within {timeout:?}"),
        )),
    }
}
