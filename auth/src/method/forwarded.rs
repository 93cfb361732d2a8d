//! What the header-based methods ([`super::xfcc`], [`super::header`]) share: the identity header
//! is believed only from a trusted hop.
//!
//! A forwarded identity header is only as good as the proxy that set it, so it is read only on
//! connections whose source address is a trusted hop ([`TrustedHops`]; loopback by default, the
//! sidecar in the same pod, which covers Istio's inbound source `127.0.0.6`). From any other
//! source the header is not even read: the call fails naming the source. Upstream's header
//! method trusts whoever reaches the plaintext port; this one does not.

use http::HeaderName;
use mesh::TrustedHops;

use super::AuthContext;
use crate::error::AuthError;

/// The identity header's single value on a call from a trusted hop.
///
/// # Errors
///
/// [`AuthError::UntrustedHop`] when the connection's source is unknown or not trusted (the
/// header is then not looked at); [`AuthError::MissingHeader`]; [`AuthError::BadHeader`] when
/// the header appears more than once or is not visible ASCII.
pub(crate) fn trusted_header_value<'a>(
    cx: &AuthContext<'a>,
    method: &'static str,
    header: &HeaderName,
    trusted: &TrustedHops,
) -> Result<&'a str, AuthError> {
    let remote = cx.transport.remote_addr();
    if !remote.is_some_and(|addr| trusted.is_trusted(addr.ip())) {
        return Err(AuthError::UntrustedHop {
            method,
            header: header.to_string(),
            source_addr: remote.map_or_else(|| "an unknown address".to_owned(), |a| a.ip().to_string()),
            trusted: describe(trusted),
        });
    }
    let mut values = cx.metadata.get_all(header).iter();
    let Some(value) = values.next() else {
        return Err(AuthError::MissingHeader { method, header: header.to_string() });
    };
    let extra = values.count();
    if extra > 0 {
        return Err(AuthError::BadHeader {
            header: header.to_string(),
            reason: format!("it appears {} times; the sidecar sets it exactly once", extra + 1),
        });
    }
    value.to_str().map_err(|_| AuthError::BadHeader {
        header: header.to_string(),
        reason: "its value is not visible ASCII text".to_owned(),
    })
}

/// The trusted networks, comma separated, or `none`.
pub(crate) fn describe(trusted: &TrustedHops) -> String {
    if trusted.networks().is_empty() {
        return "none".to_owned();
    }
    trusted.networks().iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}
