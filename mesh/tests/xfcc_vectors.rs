//! Every real XFCC vector in `tests/data/xfcc-vectors.tsv` (a copy of the project's shared
//! `shared/data/xfcc-vectors.tsv`): what the generic parser returns, what a strict parser
//! returns, and what the identity check under the Istio profile decides.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::path::PathBuf;

use mesh::identity::identity_from_xfcc;
use mesh::policy::PolicyError;
use mesh::spiffe::SpiffeIdError;
use mesh::{AuthorizedAgent, IdentityError, MeshProfile, XfccElement, XfccError, XfccParser};

fn in_repo_vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/xfcc-vectors.tsv")
}

/// Overrides where the project's shared vectors are read from.
const XFCC_VECTORS_ENV: &str = "XFCC_VECTORS";

/// The project's shared `xfcc-vectors.tsv`: `$XFCC_VECTORS`, else `shared/data/xfcc-vectors.tsv`
/// in the nearest directory above the workspace that has it (`../shared/data/...` for a clone
/// beside the shared data, found the same way as Argo CD's CRDs in `tests::realkube`).
fn shared_vectors() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(XFCC_VECTORS_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{XFCC_VECTORS_ENV}={} is not a file", path.display()))
        };
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("mesh/ has a parent: the workspace root");
    let tail = std::path::Path::new("shared").join("data").join("xfcc-vectors.tsv");
    root.ancestors().skip(1).map(|a| a.join(&tail)).find(|p| p.is_file()).ok_or_else(|| {
        format!(
            "the project's shared XFCC vectors are not at {} nor in shared/data/ of any directory above it; \
             set {XFCC_VECTORS_ENV} to the file (the in-repo copy mesh/tests/data/xfcc-vectors.tsv must be \
             checked against it)",
            root.join("..").join(&tail).display()
        )
    })
}

/// (header, expectation, source) rows, comments skipped.
fn load_vectors() -> Vec<(String, String, String)> {
    let path = in_repo_vectors();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("XFCC test vectors missing at {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(fields.len(), 3, "vector line must be header TAB expectation TAB source: {line:?}");
            (fields[0].to_owned(), fields[1].to_owned(), fields[2].to_owned())
        })
        .collect()
}

fn s(v: &str) -> String {
    v.to_owned()
}

fn v(items: &[&str]) -> Vec<String> {
    items.iter().map(|i| (*i).to_owned()).collect()
}

type IdentityCheck = fn(&Result<AuthorizedAgent, IdentityError>) -> bool;

struct Expect {
    header: &'static str,
    parsed: Result<Vec<XfccElement>, XfccError>,
    /// What `XfccParser::strict()` returns, where it differs from the default parser.
    strict: Option<Result<Vec<XfccElement>, XfccError>>,
    /// The identity decision under `MeshProfile::Istio.default_policy()`.
    identity: IdentityCheck,
}

const HASH_A: &str = "468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688";
const LYFT_SUBJECT: &str = "/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client";

fn lyft_frontend() -> XfccElement {
    XfccElement { by: v(&["http://frontend.lyft.com"]), hash: Some(s(HASH_A)), ..Default::default() }
}

fn previous_hop() -> XfccElement {
    XfccElement {
        by: v(&["spiffe://lyft.com/frontend"]),
        hash: Some(s("123456")),
        uris: v(&["spiffe://lyft.com/testclient"]),
        ..Default::default()
    }
}

fn mtls_set_element() -> XfccElement {
    XfccElement {
        by: v(&["test://foo.com/be"]),
        hash: Some(s("abcdefg")),
        uris: v(&["test://foo.com/fe"]),
        cert: Some(s("==abc\nde=")),
        dns: v(&["www.example.com"]),
        ..Default::default()
    }
}

/// The URI is there but is not a `spiffe://` URI.
fn not_spiffe(r: &Result<AuthorizedAgent, IdentityError>) -> bool {
    matches!(r, Err(IdentityError::NotSpiffe { source: SpiffeIdError::WrongScheme, .. }))
}

#[allow(clippy::too_many_lines)]
fn expectations() -> Vec<Expect> {
    vec![
        Expect {
            header: "By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject=\"/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client\";URI=http://testclient.lyft.com",
            parsed: Ok(vec![XfccElement {
                subject: Some(s(LYFT_SUBJECT)),
                uris: v(&["http://testclient.lyft.com"]),
                ..lyft_frontend()
            }]),
            strict: None,
            identity: not_spiffe,
        },
        Expect {
            header: "By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;URI=http://testclient.lyft.com,By=http://backend.lyft.com;Hash=9ba61d6425303443c0748a02dd8de688468ed33be74eee6556d90c0149c1309e;URI=http://frontend.lyft.com",
            parsed: Ok(vec![
                XfccElement { uris: v(&["http://testclient.lyft.com"]), ..lyft_frontend() },
                XfccElement {
                    by: v(&["http://backend.lyft.com"]),
                    hash: Some(s("9ba61d6425303443c0748a02dd8de688468ed33be74eee6556d90c0149c1309e")),
                    uris: v(&["http://frontend.lyft.com"]),
                    ..Default::default()
                },
            ]),
            strict: None,
            // The last element (nearest hop) decides: its URI is http://frontend.lyft.com.
            identity: |r| matches!(r, Err(IdentityError::NotSpiffe { uri, source: SpiffeIdError::WrongScheme }) if uri == "http://frontend.lyft.com"),
        },
        Expect {
            header: "By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject=\"/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client\";URI=http://testclient.lyft.com;DNS=lyft.com;DNS=www.lyft.com",
            parsed: Ok(vec![XfccElement {
                subject: Some(s(LYFT_SUBJECT)),
                uris: v(&["http://testclient.lyft.com"]),
                dns: v(&["lyft.com", "www.lyft.com"]),
                ..lyft_frontend()
            }]),
            strict: None,
            identity: not_spiffe,
        },
        Expect {
            header: "By=spiffe://lyft.com/frontend;Hash=123456;URI=spiffe://lyft.com/testclient",
            parsed: Ok(vec![previous_hop()]),
            strict: None,
            identity: |r| matches!(r, Err(IdentityError::Policy(PolicyError::TrustDomainNotAllowed { trust_domain, .. })) if trust_domain == "lyft.com"),
        },
        Expect {
            header: "By=spiffe://lyft.com/frontend;Hash=123456;URI=spiffe://lyft.com/testclient,By=spiffe://lyft.com/backend-team;Hash=e0f3c8ce5e2ea305f0701ff512e36e2e97928284a228bcf77332d33930a1b6fd;Subject=\"emailAddress=frontend-team@lyft.com,CN=Test Frontend Team,OU=Lyft Engineering,O=Lyft,L=San Francisco,ST=California,C=US\";URI=spiffe://lyft.com/frontend-team;DNS=lyft.com;DNS=www.lyft.com",
            parsed: Ok(vec![
                previous_hop(),
                XfccElement {
                    by: v(&["spiffe://lyft.com/backend-team"]),
                    hash: Some(s("e0f3c8ce5e2ea305f0701ff512e36e2e97928284a228bcf77332d33930a1b6fd")),
                    subject: Some(s(
                        "emailAddress=frontend-team@lyft.com,CN=Test Frontend Team,OU=Lyft Engineering,O=Lyft,L=San Francisco,ST=California,C=US",
                    )),
                    uris: v(&["spiffe://lyft.com/frontend-team"]),
                    dns: v(&["lyft.com", "www.lyft.com"]),
                    ..Default::default()
                },
            ]),
            strict: None,
            identity: |r| matches!(r, Err(IdentityError::Policy(PolicyError::TrustDomainNotAllowed { id, .. })) if id == "spiffe://lyft.com/frontend-team"),
        },
        Expect {
            header: "By=spiffe://lyft.com/frontend;Hash=123456;SAN=spiffe://lyft.com/testclient",
            // Decision: SAN is not an alias of URI; it is kept as an unknown key.
            parsed: Ok(vec![XfccElement {
                by: v(&["spiffe://lyft.com/frontend"]),
                hash: Some(s("123456")),
                unknown: vec![(s("SAN"), s("spiffe://lyft.com/testclient"))],
                ..Default::default()
            }]),
            strict: Some(Err(XfccError::UnknownKey { key: s("SAN"), at: 42 })),
            identity: |r| matches!(r, Err(IdentityError::NoUri)),
        },
        Expect {
            header: "By=test;URI=abc;DNS=example.com",
            parsed: Ok(vec![XfccElement {
                by: v(&["test"]),
                uris: v(&["abc"]),
                dns: v(&["example.com"]),
                ..Default::default()
            }]),
            strict: None,
            identity: not_spiffe,
        },
        Expect {
            header: "By=test://foo.com/be;Hash=abcdefg;URI=test://foo.com/fe;Cert=\"%3D%3Dabc%0Ade%3D\";DNS=www.example.com",
            parsed: Ok(vec![mtls_set_element()]),
            strict: None,
            identity: not_spiffe,
        },
        Expect {
            header: "By=test://foo.com/fe;URI=test://bar.com/be;DNS=test.com;DNS=test.com,By=test://foo.com/be;Hash=abcdefg;URI=test://foo.com/fe;Cert=\"%3D%3Dabc%0Ade%3D\";DNS=www.example.com",
            // Decision: repeated identical DNS values are kept, not deduplicated (exact).
            parsed: Ok(vec![
                XfccElement {
                    by: v(&["test://foo.com/fe"]),
                    uris: v(&["test://bar.com/be"]),
                    dns: v(&["test.com", "test.com"]),
                    ..Default::default()
                },
                mtls_set_element(),
            ]),
            strict: None,
            identity: not_spiffe,
        },
        Expect {
            header: "By=test://foo.com/fe;Hash=xyz;URI=test://bar.com/be,Hash=abcdefg;URI=test://foo.com/fe",
            parsed: Ok(vec![
                XfccElement {
                    by: v(&["test://foo.com/fe"]),
                    hash: Some(s("xyz")),
                    uris: v(&["test://bar.com/be"]),
                    ..Default::default()
                },
                XfccElement { hash: Some(s("abcdefg")), uris: v(&["test://foo.com/fe"]), ..Default::default() },
            ]),
            strict: None,
            identity: not_spiffe,
        },
        Expect {
            header: "By=test://foo.com/be;Hash=abcdefg;Subject=\"/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=test.lyft.com\";URI=test://foo.com/fe;Cert=\"abcde=\"",
            parsed: Ok(vec![XfccElement {
                by: v(&["test://foo.com/be"]),
                hash: Some(s("abcdefg")),
                subject: Some(s("/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=test.lyft.com")),
                uris: v(&["test://foo.com/fe"]),
                cert: Some(s("abcde=")),
                ..Default::default()
            }]),
            strict: None,
            identity: not_spiffe,
        },
        Expect {
            header: "By=test://foo.com/be;Hash=abcdefg;Subject=\"/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=test.lyft.com\";URI=",
            // `URI=` is kept as "" (the key was present) and is never an identity.
            parsed: Ok(vec![XfccElement {
                by: v(&["test://foo.com/be"]),
                hash: Some(s("abcdefg")),
                subject: Some(s("/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=test.lyft.com")),
                uris: v(&[""]),
                ..Default::default()
            }]),
            strict: None,
            identity: |r| matches!(r, Err(IdentityError::EmptyUri)),
        },
        Expect {
            header: "By=spiffe://cluster.local/ns/default/sa/httpbin;Hash=68bbaedefe01ef4cb99e17358ff63e92d04a4ce831a35ab9a31d3c8e06adb038;Subject=\"\";URI=spiffe://cluster.local/ns/default/sa/default",
            parsed: Ok(vec![XfccElement {
                by: v(&["spiffe://cluster.local/ns/default/sa/httpbin"]),
                hash: Some(s("68bbaedefe01ef4cb99e17358ff63e92d04a4ce831a35ab9a31d3c8e06adb038")),
                subject: Some(String::new()),
                uris: v(&["spiffe://cluster.local/ns/default/sa/default"]),
                ..Default::default()
            }]),
            strict: None,
            identity: |r| {
                matches!(r, Ok(a) if a.agent() == "default" && a.namespace() == Some("default")
                    && a.spiffe_id().to_string() == "spiffe://cluster.local/ns/default/sa/default")
            },
        },
        Expect {
            header: "Hash=hash;Cert=\"-----BEGIN%20CERTIFICATE-----%0cert%0A-----END%20CERTIFICATE-----%0A\";Subject=\"CN=hello,OU=hello,O=Acme\\, Inc.\";DNS=hello.west.example.com;DNS=hello.east.example.com,By=spiffe://mesh.example.com/ns/hellons/sa/hellosa;Hash=again;Subject=\"\";URI=spiffe://mesh.example.com/ns/otherns/sa/othersa;URI=spiffe://mesh.example.com/ns/otherns/sa2/othersa2",
            parsed: Ok(vec![
                XfccElement {
                    hash: Some(s("hash")),
                    // `%0c` is a form feed: the vector's literal bytes, decoded exactly.
                    cert: Some(s("-----BEGIN CERTIFICATE-----\x0cert\n-----END CERTIFICATE-----\n")),
                    // `\,` is not an XFCC escape; it stays, as the RFC 4514 escape it is.
                    subject: Some(s("CN=hello,OU=hello,O=Acme\\, Inc.")),
                    dns: v(&["hello.west.example.com", "hello.east.example.com"]),
                    ..Default::default()
                },
                XfccElement {
                    by: v(&["spiffe://mesh.example.com/ns/hellons/sa/hellosa"]),
                    hash: Some(s("again")),
                    subject: Some(String::new()),
                    uris: v(&[
                        "spiffe://mesh.example.com/ns/otherns/sa/othersa",
                        "spiffe://mesh.example.com/ns/otherns/sa2/othersa2",
                    ]),
                    ..Default::default()
                },
            ]),
            strict: None,
            identity: |r| matches!(r, Err(IdentityError::MultipleUris { count: 2 })),
        },
        Expect {
            header: "Hash",
            parsed: Err(XfccError::MissingEquals { key: s("Hash"), at: 0 }),
            strict: None,
            identity: |r| matches!(r, Err(IdentityError::Xfcc(XfccError::MissingEquals { at: 0, .. }))),
        },
        Expect {
            header: "Hash=;Hash",
            parsed: Err(XfccError::MissingEquals { key: s("Hash"), at: 6 }),
            strict: None,
            identity: |r| matches!(r, Err(IdentityError::Xfcc(XfccError::MissingEquals { at: 6, .. }))),
        },
        Expect {
            header: "unknown=hello",
            parsed: Ok(vec![XfccElement { unknown: vec![(s("unknown"), s("hello"))], ..Default::default() }]),
            strict: Some(Err(XfccError::UnknownKey { key: s("unknown"), at: 0 })),
            identity: |r| matches!(r, Err(IdentityError::NoUri)),
        },
    ]
}

#[test]
fn every_vector_has_an_expectation_and_meets_it() {
    let vectors = load_vectors();
    let expectations = expectations();
    assert_eq!(vectors.len(), expectations.len(), "a vector was added or removed: give it an expectation here");
    let policy = MeshProfile::Istio.default_policy();
    for (header, note, source) in &vectors {
        let expect = expectations
            .iter()
            .find(|e| e.header == header)
            .unwrap_or_else(|| panic!("no expectation for vector from {source}: {header:?}"));
        let ctx = format!("vector from {source}\n  header: {header}\n  expectation: {note}");
        assert_eq!(mesh::xfcc::parse(header), expect.parsed, "default parser, {ctx}");
        let strict = expect.strict.clone().unwrap_or_else(|| expect.parsed.clone());
        assert_eq!(XfccParser::strict().parse(header), strict, "strict parser, {ctx}");
        let identity = identity_from_xfcc(header, &policy);
        assert!((expect.identity)(&identity), "identity decision {identity:?}, {ctx}");
        // A parsed vector renders back to a header that parses to the same elements.
        if let Ok(elements) = &expect.parsed {
            let rendered = mesh::xfcc::render(elements);
            assert_eq!(mesh::xfcc::parse(&rendered).as_ref(), Ok(elements), "re-parse of {rendered:?}, {ctx}");
        }
    }
}

#[test]
fn vectors_that_envoy_emits_render_byte_for_byte() {
    // Envoy's own outputs (not the Go parser's hand-written vector) are what render() writes.
    for header in [
        "By=spiffe://lyft.com/frontend;Hash=123456;URI=spiffe://lyft.com/testclient",
        "By=test://foo.com/be;Hash=abcdefg;Subject=\"/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=test.lyft.com\";URI=",
        "By=spiffe://cluster.local/ns/default/sa/httpbin;Hash=68bbaedefe01ef4cb99e17358ff63e92d04a4ce831a35ab9a31d3c8e06adb038;Subject=\"\";URI=spiffe://cluster.local/ns/default/sa/default",
    ] {
        let elements = mesh::xfcc::parse(header).unwrap();
        assert_eq!(mesh::xfcc::render(&elements), header);
    }
}

/// The in-repo copy is what the tests use, so the parser tests need nothing outside the
/// repository; the project's shared copy (always beside the clone in development and CI) must
/// agree with it, and its absence is a failure, not a skip.
#[test]
fn in_repo_copy_matches_shared_vectors() {
    let copy = std::fs::read_to_string(in_repo_vectors()).expect("in-repo vectors present");
    let shared_path = shared_vectors().unwrap_or_else(|e| panic!("{e}"));
    let shared =
        std::fs::read_to_string(&shared_path).unwrap_or_else(|e| panic!("cannot read {}: {e}", shared_path.display()));
    assert_eq!(
        copy,
        shared,
        "mesh/tests/data/xfcc-vectors.tsv differs from {}: copy the shared file over and update expectations",
        shared_path.display()
    );
}
