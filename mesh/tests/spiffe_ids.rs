//! SPIFFE ID validation, case by case from the spec (`standards/SPIFFE-ID.md`) and go-spiffe's
//! test table.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use mesh::spiffe::{SpiffeId, SpiffeIdError, TrustDomain};

#[test]
fn valid_ids() {
    let long_td = "a".repeat(255);
    let long_id = format!("spiffe://td/{}", "a".repeat(SpiffeId::MAX_LEN - "spiffe://td/".len()));
    for id in [
        "spiffe://trustdomain",
        "spiffe://trustdomain/path",
        "spiffe://trustdomain/path/element",
        "spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal",
        "spiffe://td-1.example_org/A-Za-z0-9._",
        "spiffe://td/...",
        "spiffe://td/.a/a./..b",
        &format!("spiffe://{long_td}/x"),
        &long_id,
    ] {
        let parsed = SpiffeId::parse(id).unwrap_or_else(|e| panic!("{id} should be valid: {e}"));
        assert_eq!(parsed.to_string(), id, "Display round-trips");
        assert_eq!(id.parse::<SpiffeId>().as_ref(), Ok(&parsed));
    }
}

#[test]
fn invalid_ids_name_the_rule() {
    let cases: Vec<(String, SpiffeIdError)> = vec![
        (String::new(), SpiffeIdError::Empty),
        ("http://td/x".into(), SpiffeIdError::WrongScheme),
        ("SPIFFE://td/x".into(), SpiffeIdError::WrongScheme),
        ("spiffe:/td/x".into(), SpiffeIdError::WrongScheme),
        ("td/ns/x".into(), SpiffeIdError::WrongScheme),
        ("spiffe://".into(), SpiffeIdError::MissingTrustDomain),
        ("spiffe:///path".into(), SpiffeIdError::MissingTrustDomain),
        ("spiffe://Td/x".into(), SpiffeIdError::BadTrustDomainChar { ch: 'T', at: 9 }),
        ("spiffe://td:8080/x".into(), SpiffeIdError::BadTrustDomainChar { ch: ':', at: 11 }),
        ("spiffe://user@td/x".into(), SpiffeIdError::BadTrustDomainChar { ch: '@', at: 13 }),
        ("spiffe://tdé/x".into(), SpiffeIdError::BadTrustDomainChar { ch: 'é', at: 11 }),
        ("spiffe://td?x".into(), SpiffeIdError::BadTrustDomainChar { ch: '?', at: 11 }),
        ("spiffe://td/x?q=1".into(), SpiffeIdError::BadPathSegmentChar { ch: '?', at: 13 }),
        ("spiffe://td/x#frag".into(), SpiffeIdError::BadPathSegmentChar { ch: '#', at: 13 }),
        ("spiffe://td/a%2Fb".into(), SpiffeIdError::BadPathSegmentChar { ch: '%', at: 13 }),
        ("spiffe://td/a b".into(), SpiffeIdError::BadPathSegmentChar { ch: ' ', at: 13 }),
        ("spiffe://td/".into(), SpiffeIdError::TrailingSlash),
        ("spiffe://td/a/".into(), SpiffeIdError::TrailingSlash),
        ("spiffe://td//a".into(), SpiffeIdError::EmptySegment { at: 12 }),
        ("spiffe://td/a//b".into(), SpiffeIdError::EmptySegment { at: 14 }),
        ("spiffe://td/./a".into(), SpiffeIdError::DotSegment { at: 12 }),
        ("spiffe://td/a/..".into(), SpiffeIdError::DotSegment { at: 14 }),
        (format!("spiffe://{}/x", "a".repeat(256)), SpiffeIdError::TrustDomainTooLong { len: 256, max: 255 }),
        (format!("spiffe://td/{}", "a".repeat(2037)), SpiffeIdError::TooLong { len: 2049, max: 2048 }),
    ];
    for (id, want) in cases {
        assert_eq!(SpiffeId::parse(&id), Err(want), "{id:?}");
    }
}

#[test]
fn error_messages_follow_the_spec_wording() {
    let msg = |id: &str| SpiffeId::parse(id).unwrap_err().to_string();
    assert!(msg("http://x").contains("scheme is missing or invalid"));
    assert!(msg("spiffe://").contains("trust domain is missing"));
    assert!(msg("spiffe://A").contains("trust domain characters are limited to"));
    assert!(msg("spiffe://a/$").contains("path segment characters are limited to"));
    assert!(msg("spiffe://a/./b").contains("path cannot contain dot segments"));
    assert!(msg("spiffe://a//b").contains("path cannot contain empty segments"));
    assert!(msg("spiffe://a/b/").contains("path cannot have a trailing slash"));
}

#[test]
fn parts_segments_and_principal_form() {
    let id = SpiffeId::parse("spiffe://cluster.local/ns/argocd/sa/agent-1").unwrap();
    assert_eq!(id.trust_domain().as_str(), "cluster.local");
    assert_eq!(id.path(), "/ns/argocd/sa/agent-1");
    assert_eq!(id.segments().collect::<Vec<_>>(), ["ns", "argocd", "sa", "agent-1"]);
    assert_eq!(id.istio_principal(), "cluster.local/ns/argocd/sa/agent-1");
    let td_only = SpiffeId::parse("spiffe://cluster.local").unwrap();
    assert_eq!(td_only.segments().count(), 0);

    let td = TrustDomain::new("cluster.local").unwrap();
    assert_eq!(SpiffeId::from_segments(&td, ["ns", "argocd", "sa", "agent-1"]), Ok(id));
    assert_eq!(SpiffeId::from_segments(&td, ["ns", "", "sa", "x"]), Err(SpiffeIdError::EmptySegment { at: 26 }));
    assert_eq!(
        SpiffeId::from_segments(&td, ["ns", "a/b"]),
        Err(SpiffeIdError::BadPathSegmentChar { ch: '/', at: 27 }),
        "a '/' inside a segment is not a separator"
    );
}

#[test]
fn trust_domain_names() {
    assert_eq!(TrustDomain::new("example.org").unwrap().to_string(), "example.org");
    assert_eq!(TrustDomain::new(""), Err(SpiffeIdError::MissingTrustDomain));
    assert_eq!(TrustDomain::new("spiffe://x"), Err(SpiffeIdError::BadTrustDomainChar { ch: ':', at: 6 }));
    assert!("Example.org".parse::<TrustDomain>().is_err());
}
