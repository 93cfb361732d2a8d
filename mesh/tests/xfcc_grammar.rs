//! The XFCC grammar beyond the real vectors: keys, quoting, whitespace, errors with offsets,
//! limits.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use mesh::xfcc::parse;
use mesh::{XfccElement, XfccError, XfccParser};

#[test]
fn keys_are_case_insensitive_and_unknown_keys_keep_their_spelling() {
    let e = parse("bY=a;HASH=h;uri=u;Dns=d;sUbJeCt=\"s\";CHAIN=\"c%41\";cert=x;X-Extra=1").unwrap();
    assert_eq!(
        e,
        [XfccElement {
            by: vec!["a".into()],
            hash: Some("h".into()),
            cert: Some("x".into()),
            chain: Some("cA".into()),
            subject: Some("s".into()),
            uris: vec!["u".into()],
            dns: vec!["d".into()],
            unknown: vec![("X-Extra".into(), "1".into())],
        }]
    );
}

#[test]
fn quoting_and_escapes() {
    let e = parse(r#"Subject="a\"b;c,d=e\\f\,g";URI="x""#).unwrap();
    assert_eq!(e[0].subject.as_deref(), Some(r#"a"b;c,d=e\f\,g"#), "only \\\" and \\\\ are escapes");
    assert_eq!(e[0].uris, ["x"]);
    // Raw values may hold '=' and '"' (Envoy writes By/URI/DNS raw).
    let e = parse("URI=spiffe://td/a?x=1;By=a\"b").unwrap();
    assert_eq!(e[0].uris, ["spiffe://td/a?x=1"]);
    assert_eq!(e[0].by, ["a\"b"]);
}

#[test]
fn optional_whitespace_around_separators() {
    // What a proxy joining two header lines with ", " produces.
    let e = parse(" By=a ; URI = b , By=c;Subject=\"\" \t").unwrap();
    assert_eq!(e.len(), 2);
    assert_eq!((e[0].by.as_slice(), e[0].uris.as_slice()), (&["a".to_owned()][..], &["b".to_owned()][..]));
    assert_eq!(e[1].subject.as_deref(), Some(""));
}

#[test]
fn errors_say_where_and_what() {
    let cases = [
        ("", XfccError::EmptyHeader),
        ("  ", XfccError::EmptyHeader),
        (",By=a", XfccError::EmptyElement { index: 0, at: 0 }),
        ("By=a,,By=b", XfccError::EmptyElement { index: 1, at: 5 }),
        ("By=a,", XfccError::EmptyElement { index: 1, at: 5 }),
        ("By=a;", XfccError::EmptyKey { at: 5 }),
        ("By=a;;URI=b", XfccError::EmptyKey { at: 5 }),
        ("=a", XfccError::EmptyKey { at: 0 }),
        ("By", XfccError::MissingEquals { key: "By".into(), at: 0 }),
        ("By=a;URI,By=b", XfccError::MissingEquals { key: "URI".into(), at: 5 }),
        ("By x=a", XfccError::BadKeyChar { ch: 'x', at: 3 }),
        ("\"By\"=a", XfccError::BadKeyChar { ch: '"', at: 0 }),
        ("By=a;Subject=\"abc", XfccError::UnterminatedQuote { at: 13 }),
        ("Subject=\"abc\\\"", XfccError::UnterminatedQuote { at: 8 }),
        ("Subject=\"a\"b;URI=x", XfccError::UnexpectedAfterQuote { ch: 'b', at: 11 }),
        ("Hash=a;hash=b", XfccError::DuplicateKey { key: "hash".into(), element: 0, at: 7 }),
        ("By=x,Subject=\"\";Subject=\"\"", XfccError::DuplicateKey { key: "Subject".into(), element: 1, at: 16 }),
        ("Cert=\"%FF%FE\"", XfccError::BadPercentEncoding { key: "Cert".into(), at: 0 }),
    ];
    for (header, want) in cases {
        assert_eq!(parse(header), Err(want), "{header:?}");
    }
    let msg = parse("By=a;Subject=\"abc").unwrap_err().to_string();
    assert!(msg.contains("unterminated quote") && msg.contains("byte 13"), "{msg}");
}

#[test]
fn limits_against_hostile_input() {
    let long = format!("URI={}", "a".repeat(XfccParser::DEFAULT_MAX_LEN));
    assert_eq!(parse(&long), Err(XfccError::TooLong { len: long.len(), max: XfccParser::DEFAULT_MAX_LEN }));
    let many = vec!["By=a"; XfccParser::DEFAULT_MAX_ELEMENTS + 1].join(",");
    assert_eq!(parse(&many), Err(XfccError::TooManyElements { max: XfccParser::DEFAULT_MAX_ELEMENTS }));
    let enough = vec!["By=a"; XfccParser::DEFAULT_MAX_ELEMENTS].join(",");
    assert_eq!(parse(&enough).unwrap().len(), XfccParser::DEFAULT_MAX_ELEMENTS);
    let small = XfccParser::default().with_max_len(8).with_max_elements(1);
    assert_eq!(small.parse("By=a,By=b"), Err(XfccError::TooLong { len: 9, max: 8 }));
    assert_eq!(small.parse("By=a,B=b"), Err(XfccError::TooManyElements { max: 1 }));
    let msg = parse(&many).unwrap_err().to_string();
    assert!(msg.contains("more than 32 elements"), "{msg}");
}

#[test]
fn multibyte_text_is_handled_by_character() {
    let e = parse("By=é;Subject=\"ü\\\"ß\";Ключ=значение").unwrap();
    assert_eq!(e[0].by, ["é"]);
    assert_eq!(e[0].subject.as_deref(), Some("ü\"ß"));
    assert_eq!(e[0].unknown, [("Ключ".to_owned(), "значение".to_owned())]);
    assert_eq!(parse("By=a;ключ"), Err(XfccError::MissingEquals { key: "ключ".into(), at: 5 }));
}
