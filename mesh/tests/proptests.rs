//! Property tests: the parsers never panic on any input, and rendering round-trips.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use mesh::{SpiffeId, XfccElement, XfccParser};
use proptest::prelude::*;

/// Strings biased toward XFCC's own syntax, so the grammar's corners are reached often.
fn xfcc_like() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just(",".to_owned()),
            Just(";".to_owned()),
            Just("=".to_owned()),
            Just("\"".to_owned()),
            Just("\\".to_owned()),
            Just(" ".to_owned()),
            Just("\t".to_owned()),
            Just("%".to_owned()),
            Just("%0A".to_owned()),
            Just("By".to_owned()),
            Just("URI".to_owned()),
            Just("uri".to_owned()),
            Just("Hash".to_owned()),
            Just("Cert".to_owned()),
            Just("Subject".to_owned()),
            Just("DNS".to_owned()),
            Just("spiffe://cluster.local/ns/a/sa/b".to_owned()),
            "[a-z0-9é]{1,4}",
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

/// Any value, including the characters that force quoting and escaping.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), "[ -~\t]{0,12}", "[,;=\"\\\\ a]{0,8}"]
}

fn unknown_key() -> impl Strategy<Value = String> {
    "[A-Za-z][A-Za-z0-9_-]{0,8}".prop_filter("not an Envoy key", |k| {
        !["by", "hash", "cert", "chain", "subject", "uri", "dns"].contains(&k.to_ascii_lowercase().as_str())
    })
}

fn element() -> impl Strategy<Value = XfccElement> {
    (
        proptest::collection::vec(value(), 0..3),
        proptest::option::of(value()),
        proptest::option::of(value()),
        proptest::option::of(value()),
        proptest::option::of(value()),
        proptest::collection::vec(value(), 0..3),
        proptest::collection::vec(value(), 0..3),
        proptest::collection::vec((unknown_key(), value()), 0..2),
    )
        .prop_map(|(by, hash, cert, chain, subject, uris, dns, unknown)| XfccElement {
            by,
            hash,
            cert,
            chain,
            subject,
            uris,
            dns,
            unknown,
        })
        // An element with no pair at all renders as nothing, which is not an element.
        .prop_filter("element has at least one pair", |e| *e != XfccElement::default())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn xfcc_parser_never_panics(header in any::<String>()) {
        let _ = mesh::xfcc::parse(&header);
        let _ = XfccParser::strict().parse(&header);
    }

    #[test]
    fn xfcc_parser_never_panics_on_xfcc_like_input(header in xfcc_like()) {
        let _ = mesh::xfcc::parse(&header);
        let _ = mesh::identity_from_xfcc(&header, &mesh::MeshProfile::Istio.default_policy());
    }

    #[test]
    fn rendered_elements_parse_back_unchanged(elements in proptest::collection::vec(element(), 1..4)) {
        let rendered = mesh::xfcc::render(&elements);
        let parsed = XfccParser::default().with_max_len(usize::MAX).parse(&rendered);
        prop_assert_eq!(parsed, Ok(elements), "rendered: {}", rendered);
    }

    #[test]
    fn parsed_headers_render_and_parse_back_unchanged(header in xfcc_like()) {
        if let Ok(elements) = mesh::xfcc::parse(&header) {
            let again = mesh::xfcc::parse(&mesh::xfcc::render(&elements));
            prop_assert_eq!(again, Ok(elements));
        }
    }

    #[test]
    fn spiffe_parser_never_panics_and_display_round_trips(
        id in prop_oneof![any::<String>(), "spiffe://[a-z0-9._A-Z:-]{0,8}(/[a-zA-Z0-9._%-]{0,4}){0,4}/?"]
    ) {
        if let Ok(parsed) = SpiffeId::parse(&id) {
            prop_assert_eq!(parsed.to_string(), id.clone());
            prop_assert!(id.len() <= SpiffeId::MAX_LEN);
        }
    }
}
