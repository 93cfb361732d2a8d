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

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};

use super::{ProxyBody, boxed, status};

use super::replica::{FORWARDED_AGENT_HEADER, ReplicaForwarding};

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

    let mut sender = match fwd.connect(address).await {
        Ok(sender) => sender,
        Err(e) => return failure(owner, address, agent, e),
    };
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
