//! Rendering elements back to header text, the way Envoy writes them: `By`, `Hash`, `URI` and
//! `DNS` raw unless they need quotes, `Subject` always quoted, `Cert` and `Chain` URL-encoded
//! and quoted.

use std::fmt;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::XfccElement;
use super::parser::is_ows;

/// What stays unencoded in `Cert`/`Chain`: letters, digits and `-._~` (RFC 3986 unreserved).
const PEM_ENCODE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

impl fmt::Display for XfccElement {
    /// Renders the element so that [`super::parse`] returns it unchanged. Unknown keys are
    /// written as they are; a key that is not a valid XFCC key does not round-trip.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut pairs: Vec<String> = Vec::new();
        pairs.extend(self.by.iter().map(|v| format!("By={}", raw_or_quoted(v))));
        pairs.extend(self.hash.iter().map(|v| format!("Hash={}", raw_or_quoted(v))));
        pairs.extend(self.cert.iter().map(|v| format!("Cert=\"{}\"", utf8_percent_encode(v, PEM_ENCODE))));
        pairs.extend(self.chain.iter().map(|v| format!("Chain=\"{}\"", utf8_percent_encode(v, PEM_ENCODE))));
        pairs.extend(self.subject.iter().map(|v| format!("Subject={}", quoted(v))));
        pairs.extend(self.uris.iter().map(|v| format!("URI={}", raw_or_quoted(v))));
        pairs.extend(self.dns.iter().map(|v| format!("DNS={}", raw_or_quoted(v))));
        pairs.extend(self.unknown.iter().map(|(k, v)| format!("{k}={}", raw_or_quoted(v))));
        f.write_str(&pairs.join(";"))
    }
}

fn raw_or_quoted(value: &str) -> String {
    let needs_quotes = value.starts_with('"')
        || value.starts_with(is_ows)
        || value.ends_with(is_ows)
        || value.contains([',', ';', '\\', '"']);
    if needs_quotes { quoted(value) } else { value.to_owned() }
}

fn quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}
