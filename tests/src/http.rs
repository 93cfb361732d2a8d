//! A minimal HTTP/1.1 GET for the processes' plaintext endpoints (`/metrics`, `/healthz`), and
//! reading one sample from Prometheus text.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// `GET path` on `addr` (closing the connection); the status and the body.
///
/// # Errors
/// Connection or I/O failure, a malformed answer, or no answer within 10 s.
pub async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let (status, _, body) = get_with_head(addr, path).await?;
    Ok((status, body))
}

/// [`get`] with a chunked body (`Transfer-Encoding: chunked`, e.g. Envoy's admin on large
/// answers) decoded.
///
/// # Errors
/// As [`get`], or a malformed chunked body.
pub(crate) async fn get_decoded(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let (status, head, body) = get_with_head(addr, path).await?;
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return Ok((status, dechunk(&body)?));
    }
    Ok((status, body))
}

/// `GET path` on `addr`: the status, the header block and the body as sent.
async fn get_with_head(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String, String)> {
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        anyhow::Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(10), io).await.context("HTTP GET timed out")??;
    let (head, body) = text.split_once("\r\n\r\n").context("no end of HTTP headers")?;
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("no HTTP status")?;
    Ok((status, head.to_owned(), body.to_owned()))
}

/// The payload of a chunked HTTP/1.1 body.
fn dechunk(mut body: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").context("truncated chunked body")?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or_default().trim(), 16)
            .with_context(|| format!("bad chunk size {size:?}"))?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..size).context("truncated chunk")?);
        body = rest.get(size + 2..).context("truncated chunk")?;
    }
}

/// The value of the sample `name{labels}` (labels exactly as exposed, e.g.
/// `agent_name="a1"`; empty for none) in Prometheus text.
#[must_use]
pub fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let series = if labels.is_empty() { name.to_owned() } else { format!("{name}{{{labels}}}") };
    text.lines().find_map(|line| line.strip_prefix(&series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The leaf certificate a TLS server (the principal) presents to a new connection, verified against
/// `ca` (no client certificate:
/// the principal lets such handshakes through to its auth layer).
///
/// # Errors
/// The connection or the handshake fails, or no certificate is presented.
pub async fn presented_certificate(
    addr: SocketAddr,
    ca: &rustls_pki_types::CertificateDer<'static>,
) -> anyhow::Result<rustls_pki_types::CertificateDer<'static>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone())?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await?;
    let leaf = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).context("no certificate presented")?;
    Ok(leaf.clone().into_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn samples_are_found_by_exact_series() {
        let text = "# HELP x y\nx_total 3\nx_total{a=\"1\"} 4.5\nx_total_other 9\n";
        assert_eq!(super::sample(text, "x_total", ""), Some(3.0));
        assert_eq!(super::sample(text, "x_total", "a=\"1\""), Some(4.5));
        assert_eq!(super::sample(text, "x_total", "a=\"2\""), None);
        assert_eq!(super::sample(text, "x", ""), None);
    }
}
