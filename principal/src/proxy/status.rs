//! Responses of the proxy's own: Kubernetes `Status` bodies, so clients (Argo CD, kubectl) show
//! the reason instead of a bare code (upstream answers errors without a body, §10 item 13).

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;
pub(crate) use protocol::payload::is_status;

/// The `reason` Kubernetes uses for `code`.
pub(crate) fn reason(code: StatusCode) -> &'static str {
    protocol::payload::status_reason(code.as_u16())
}

/// A response of `code` with a `Status` body saying `message`.
pub(crate) fn failure(code: StatusCode, message: &str) -> Response<Full<Bytes>> {
    json(code, protocol::payload::status_body(code.as_u16(), message))
}

/// `429 Too Many Requests` with a `Status` saying `message` and `Retry-After: 1`: an agent's
/// bound of requests, logs or terminals in flight is reached.
pub(crate) fn busy(message: &str) -> Response<Full<Bytes>> {
    let mut resp = failure(StatusCode::TOO_MANY_REQUESTS, message);
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// A JSON response.
pub(crate) fn json(code: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = code;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_a_status_object_clients_can_read() {
        let resp = failure(StatusCode::GATEWAY_TIMEOUT, "agent a did not answer within 30s");
        assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
        let text = protocol::payload::status_body(504, "agent a did not answer within 30s");
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["reason"], "Timeout");
        assert_eq!(v["code"], 504);
        assert!(is_status(&text));
        assert!(!is_status("{\"kind\":\"Pod\"}"));
        assert!(!is_status("not json"));
    }
}
