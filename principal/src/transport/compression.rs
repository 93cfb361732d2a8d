//! gzip on the agent-facing services, negotiated as upstream's principal negotiates it.
//!
//! Upstream's agent compresses every call with gzip when `--enable-compression` is set, and
//! upstream's principal (grpc-go with the gzip codec registered) decompresses and answers in the
//! compression the caller used: a compressed request gets compressed responses, a plain one plain
//! responses. tonic instead compresses whenever the caller *accepts* gzip, and grpc-go clients
//! announce `grpc-accept-encoding: gzip` whenever gzip is linked in, which upstream's agent always
//! is. [`mirror`] removes that announcement from callers that did not compress themselves, so an
//! agent without `--enable-compression` is answered uncompressed, as upstream answers it, and
//! costs the principal no compression CPU.

use tonic::codec::CompressionEncoding;

/// The one codec both sides speak (upstream registers gzip only).
pub const GZIP: CompressionEncoding = CompressionEncoding::Gzip;

/// `grpc-encoding` of a request: the compression of the messages it sends.
const ENCODING: &str = "grpc-encoding";
/// `grpc-accept-encoding` of a request: the compressions it can read in responses.
const ACCEPT_ENCODING: &str = "grpc-accept-encoding";

/// Whether the caller sends compressed messages (anything but absent or `identity`).
fn compresses<B>(request: &http::Request<B>) -> bool {
    request.headers().get(ENCODING).is_some_and(|v| v.as_bytes() != b"identity")
}

/// Leaves `request` as it is when its caller compresses; otherwise forgets which compressions
/// it accepts, so the response goes out uncompressed (see the module docs).
pub fn mirror<B>(mut request: http::Request<B>) -> http::Request<B> {
    if !compresses(&request) {
        request.headers_mut().remove(ACCEPT_ENCODING);
    }
    request
}

/// [`mirror`] as a layer for the tonic server.
#[must_use]
pub fn mirror_layer<B>() -> tower::util::MapRequestLayer<fn(http::Request<B>) -> http::Request<B>> {
    tower::util::MapRequestLayer::new(mirror::<B> as fn(http::Request<B>) -> http::Request<B>)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> http::Request<()> {
        let mut r = http::Request::builder();
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.body(()).expect("request")
    }

    #[test]
    fn a_plain_caller_gets_plain_answers_and_a_compressing_one_keeps_its_choice() {
        // grpc-go without a compressor: announces gzip, sends plain.
        let plain = mirror(request(&[("grpc-accept-encoding", "gzip")]));
        assert!(plain.headers().get(ACCEPT_ENCODING).is_none());
        let identity = mirror(request(&[("grpc-encoding", "identity"), ("grpc-accept-encoding", "gzip")]));
        assert!(identity.headers().get(ACCEPT_ENCODING).is_none());
        // grpc-go with UseCompressor(gzip).
        let gz = mirror(request(&[("grpc-encoding", "gzip"), ("grpc-accept-encoding", "gzip")]));
        assert_eq!(gz.headers().get(ACCEPT_ENCODING).map(http::HeaderValue::as_bytes), Some(&b"gzip"[..]));
        assert_eq!(gz.headers().get(ENCODING).map(http::HeaderValue::as_bytes), Some(&b"gzip"[..]));
    }
}
