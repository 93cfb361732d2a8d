//! Envoy's `x-forwarded-client-cert` (XFCC) header: a typed element per proxy hop.
//!
//! Grammar (Envoy's `headers.rst`, "x-forwarded-client-cert"): the value is a list of
//! *elements* separated by `,`, the newest (nearest proxy) last; an element is `key=value` pairs
//! separated by `;`; keys are case-insensitive; a value holding `,` `;` or `=` is double-quoted,
//! with an inner `"` written `\"`.
//!
//! What the parser accepts beyond that, and why:
//! - raw (unquoted) values may hold `=`: Envoy writes `By`, `URI` and `DNS` unquoted, and a URI
//!   may carry `=` in a query;
//! - optional whitespace (space, tab) around keys, values and separators: HTTP allows a proxy to
//!   join repeated header lines with `", "`;
//! - inside quotes, `\"` and `\\` are escapes; any other `\x` stays as written, so an RFC 4514
//!   subject such as `O=Acme\, Inc.` keeps its own escaping;
//! - unknown keys are kept in [`XfccElement::unknown`] unless the parser is [strict]
//!   (`SAN`, the pre-`URI` key of old Envoy tests, is *not* an alias of `URI`: identity comes
//!   only from the key current Envoy emits).
//!
//! Strict, because identity is decided on what this returns: empty keys and elements, keys
//! without `=`, an unterminated quote, text after a closing quote, and a repeated single-valued
//! key (`Hash`, `Cert`, `Chain`, `Subject`) are errors; `By`, `URI` and `DNS` repeat (one per SAN).
//!
//! [strict]: XfccParser::strict

mod parser;
mod render;

pub use parser::{XfccError, XfccParser};

/// One element of an XFCC header: what one proxy said about the client certificate it saw.
///
/// Values are returned as the header carried them, unquoted and unescaped; `cert` and `chain`
/// are also percent-decoded (Envoy URL-encodes the PEM). An empty `URI=` (Envoy's way of saying
/// "the client certificate has no URI SAN") is kept as an empty string in [`uris`](Self::uris),
/// so callers can tell it from a missing key; it is never an identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XfccElement {
    /// `By`: the URI SANs of the certificate of the proxy that added this element.
    pub by: Vec<String>,
    /// `Hash`: hex SHA-256 of the client certificate's DER.
    pub hash: Option<String>,
    /// `Cert`: the client leaf certificate, PEM, percent-decoded.
    pub cert: Option<String>,
    /// `Chain`: the client certificate chain, PEM, percent-decoded.
    pub chain: Option<String>,
    /// `Subject`: the client certificate's subject DN (Envoy always quotes it; may be empty).
    pub subject: Option<String>,
    /// `URI`: the client certificate's URI SANs, one per `URI=` key, in header order.
    pub uris: Vec<String>,
    /// `DNS`: the client certificate's DNS SANs, one per `DNS=` key, in header order.
    pub dns: Vec<String>,
    /// Keys Envoy does not define, with their values, in header order (the key as written).
    pub unknown: Vec<(String, String)>,
}

/// The keys Envoy defines, matched case-insensitively.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    By,
    Hash,
    Cert,
    Chain,
    Subject,
    Uri,
    Dns,
}

impl Key {
    pub(crate) fn lookup(key: &str) -> Option<Self> {
        const KEYS: [(&str, Key); 7] = [
            ("by", Key::By),
            ("hash", Key::Hash),
            ("cert", Key::Cert),
            ("chain", Key::Chain),
            ("subject", Key::Subject),
            ("uri", Key::Uri),
            ("dns", Key::Dns),
        ];
        KEYS.iter().find(|(name, _)| name.eq_ignore_ascii_case(key)).map(|(_, k)| *k)
    }
}

/// Parses an XFCC header value with the default [`XfccParser`] (lenient about unknown keys,
/// default limits).
///
/// # Errors
///
/// [`XfccError`] naming the byte offset and what is wrong there, or the limit exceeded.
pub fn parse(header: &str) -> Result<Vec<XfccElement>, XfccError> {
    XfccParser::default().parse(header)
}

/// Renders elements as one XFCC header value (elements joined by `,`), the inverse of [`parse`].
#[must_use]
pub fn render(elements: &[XfccElement]) -> String {
    elements.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}
