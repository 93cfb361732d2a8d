//! A certificate subject rendered exactly as Go's `pkix.Name.String()` renders it, because
//! upstream applies `mtls:subject:<regex>` to that string: the same regex must match the same
//! certificates here (`internal/auth/mtls/mtls.go`, Go `crypto/x509/pkix`).
//!
//! Go's rendering, which this follows:
//! * attributes are regrouped, not kept in certificate order: `SERIALNUMBER`, `CN`, `OU`, `O`,
//!   `POSTALCODE`, `STREET`, `L`, `ST`, `C` (the reverse of `ToRDNSequence`), then attributes of
//!   other types in reverse certificate order;
//! * several values of one of `C ST L STREET POSTALCODE O OU` form one RDN joined by `+`; only the
//!   last `CN` and `SERIALNUMBER` count;
//! * other types print as `<dotted OID>=#<hex of the value re-encoded as PrintableString or
//!   UTF8String>`;
//! * values escape `, + " \ < > ;`, a leading `#` and a leading or trailing space with `\`.

use x509_parser::der_parser::asn1_rs::{Any, Tag};
use x509_parser::x509::X509Name;

/// X.520 attribute numbers (`2.5.4.n`) Go parses into named fields, in `ToRDNSequence` order.
const NAMED_ORDER: [(u64, &str); 9] = [
    (6, "C"),
    (8, "ST"),
    (7, "L"),
    (9, "STREET"),
    (17, "POSTALCODE"),
    (10, "O"),
    (11, "OU"),
    (3, "CN"),
    (5, "SERIALNUMBER"),
];

/// A subject attribute whose value is not a string type Go accepts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("subject attribute {oid} has ASN.1 tag {tag}, not a string type")]
pub struct NonStringAttribute {
    /// The attribute type, dotted.
    pub oid: String,
    /// The value's tag.
    pub tag: String,
}

/// Renders `name` as Go's `pkix.Name.String()` does, e.g. `CN=agent-1,O=example`.
///
/// # Errors
///
/// [`NonStringAttribute`] when an attribute value is not one of the string types Go parses
/// (Go rejects such a certificate outright).
pub fn go_distinguished_name(name: &X509Name<'_>) -> Result<String, NonStringAttribute> {
    // Values of the named types, in certificate order; others kept as (oid, value).
    let mut named: [Vec<String>; 9] = Default::default();
    let mut others: Vec<(String, String)> = Vec::new();
    for attr in name.iter_attributes() {
        let oid = attr.attr_type();
        let value = attribute_string(attr.attr_value()).ok_or_else(|| NonStringAttribute {
            oid: oid.to_id_string(),
            tag: format!("{}", attr.attr_value().tag()),
        })?;
        match x520_number(oid).and_then(|n| NAMED_ORDER.iter().position(|(k, _)| *k == n)) {
            Some(slot) => named[slot].push(value),
            None => others.push((oid.to_id_string(), value)),
        }
    }

    // Build Go's RDN sequence (others first, then named), then print it in reverse.
    let mut rdns: Vec<Vec<String>> = others
        .into_iter()
        .map(|(oid, value)| vec![format!("{oid}=#{}", hex::encode(go_marshal_string(&value)))])
        .collect();
    for (slot, (_, label)) in NAMED_ORDER.iter().enumerate() {
        let values = &named[slot];
        let single = matches!(*label, "CN" | "SERIALNUMBER");
        let values: Vec<&String> = if single {
            // Go keeps the last one (a plain field), and drops an empty value.
            values.last().filter(|v| !v.is_empty()).into_iter().collect()
        } else {
            values.iter().collect()
        };
        if values.is_empty() {
            continue;
        }
        rdns.push(values.into_iter().map(|v| format!("{label}={}", escape(v))).collect());
    }
    Ok(rdns.iter().rev().map(|rdn| rdn.join("+")).collect::<Vec<_>>().join(","))
}

/// `n` when `oid` is `2.5.4.n`.
fn x520_number(oid: &x509_parser::der_parser::oid::Oid<'_>) -> Option<u64> {
    let arcs: Vec<u64> = oid.iter()?.collect();
    match arcs.as_slice() {
        [2, 5, 4, n] => Some(*n),
        _ => None,
    }
}

/// The string value of an attribute, decoded as Go's `parseASN1String` does.
fn attribute_string(value: &Any<'_>) -> Option<String> {
    let data = value.data;
    match value.tag() {
        Tag::PrintableString | Tag::Utf8String | Tag::Ia5String | Tag::NumericString => {
            std::str::from_utf8(data).ok().map(str::to_owned)
        }
        // Go takes T61String bytes as they are; Latin-1 is the faithful reading of those bytes.
        Tag::T61String => Some(data.iter().map(|&b| char::from(b)).collect()),
        Tag::BmpString => {
            if !data.len().is_multiple_of(2) {
                return None;
            }
            let units: Vec<u16> = data.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
            String::from_utf16(&units).ok()
        }
        _ => None,
    }
}

/// RFC 2253 escaping as Go's `RDNSequence.String()` does it.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.len().saturating_sub(1);
    for (i, c) in value.char_indices() {
        let needs = match c {
            ',' | '+' | '"' | '\\' | '<' | '>' | ';' => true,
            ' ' => i == 0 || i == last,
            '#' => i == 0,
            _ => false,
        };
        if needs {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Go's `asn1.Marshal(string)`: `PrintableString` when every character is printable, else
/// `UTF8String`; DER length.
fn go_marshal_string(value: &str) -> Vec<u8> {
    let printable = value.bytes().all(|b| {
        b.is_ascii_alphanumeric()
            || matches!(b, b'\'' | b'(' | b')' | b'+' | b',' | b'-' | b'.' | b'/' | b' ' | b':' | b'=' | b'?')
    });
    let tag = if printable { 0x13 } else { 0x0c };
    let bytes = value.as_bytes();
    let mut out = vec![tag];
    let len = bytes.len();
    if len < 0x80 {
        out.push(u8::try_from(len).unwrap_or(0));
    } else {
        let be = len.to_be_bytes();
        let skip = be.iter().take_while(|b| **b == 0).count();
        let significant = &be[skip..];
        out.push(0x80 | u8::try_from(significant.len()).unwrap_or(0));
        out.extend_from_slice(significant);
    }
    out.extend_from_slice(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, DnValue, KeyPair};
    use x509_parser::prelude::{FromDer, X509Certificate};

    fn render(dn: DistinguishedName) -> String {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn;
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        let (_, parsed) = X509Certificate::from_der(cert.der()).expect("parse");
        go_distinguished_name(parsed.subject()).expect("render")
    }

    #[test]
    fn common_name_alone() {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "agent-1");
        assert_eq!(render(dn), "CN=agent-1");
    }

    #[test]
    fn attributes_regroup_in_go_order() {
        // Certificate order C, O, CN: Go prints CN, O, C whatever the order in the certificate.
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "agent-1");
        dn.push(DnType::CountryName, "DE");
        dn.push(DnType::OrganizationName, "Example Corp");
        dn.push(DnType::OrganizationalUnitName, "platform");
        assert_eq!(render(dn), "CN=agent-1,OU=platform,O=Example Corp,C=DE");
    }

    #[test]
    fn special_characters_are_escaped() {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "#a,b+c ");
        dn.push(DnType::OrganizationName, " lead");
        assert_eq!(render(dn), r"CN=\#a\,b\+c\ ,O=\ lead");
    }

    #[test]
    fn unknown_types_print_as_hex_der() {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "agent-1");
        // emailAddress is IA5String in the certificate; Go re-encodes it: '@' is not printable,
        // so UTF8String (0x0c).
        dn.push(
            DnType::CustomDnType(vec![1, 2, 840, 113_549, 1, 9, 1]),
            DnValue::Ia5String("a@b".try_into().expect("ia5")),
        );
        assert_eq!(render(dn), "CN=agent-1,1.2.840.113549.1.9.1=#0c03614062");
    }

    #[test]
    fn go_marshal_picks_printable_or_utf8() {
        assert_eq!(go_marshal_string("ab"), vec![0x13, 2, b'a', b'b']);
        assert_eq!(go_marshal_string("a*"), vec![0x0c, 2, b'a', b'*']);
        let long = "x".repeat(200);
        let encoded = go_marshal_string(&long);
        assert_eq!(&encoded[..3], &[0x13, 0x81, 200]);
    }
}
