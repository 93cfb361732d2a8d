//! What the fuzz targets check, as plain functions: the targets call them, and mesh's
//! `tests/fuzz_seeds.rs` runs them on the seed corpus so the logic cannot rot unfuzzed.
//! Each panics (that is how a fuzzer reports) only when an invariant breaks.

use mesh::identity::spiffe_id_from_linkerd;
use mesh::{Cidr, MeshProfile, SpiffeId, XfccParser, identity_from_xfcc};

/// The XFCC parser: never panics; whatever it accepts renders to a header it parses back to the
/// same elements; the identity decision never panics.
pub fn xfcc(data: &[u8]) {
    let Ok(header) = std::str::from_utf8(data) else { return };
    for parser in [XfccParser::default(), XfccParser::strict()] {
        if let Ok(elements) = parser.parse(header) {
            assert!(!elements.is_empty(), "an accepted header has at least one element");
            let rendered = mesh::xfcc::render(&elements);
            let again = parser.with_max_len(usize::MAX).parse(&rendered);
            assert_eq!(again.as_ref(), Ok(&elements), "round trip of {header:?} via {rendered:?}");
        }
    }
    for profile in MeshProfile::ALL {
        if let Ok(agent) = identity_from_xfcc(header, &profile.default_policy()) {
            // The identity is the last element's one and only URI, nothing else.
            let last = XfccParser::default().parse(header).ok().and_then(|mut e| e.pop()).unwrap_or_default();
            assert_eq!(last.uris, [agent.spiffe_id().to_string()], "identity of {header:?}");
        }
    }
}

/// SPIFFE IDs: never panics; an accepted ID is at most 2048 bytes and displays as its input;
/// the policy, the Linkerd mapping and the CIDR parser never panic on the same input.
pub fn spiffe_id(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(id) = SpiffeId::parse(text) {
        assert!(text.len() <= SpiffeId::MAX_LEN);
        assert_eq!(id.to_string(), text);
        for profile in MeshProfile::ALL {
            if let Ok(agent) = profile.default_policy().authorize(&id) {
                assert_eq!(agent.spiffe_id(), &id);
                assert!(!agent.agent().is_empty() && agent.agent().len() <= 63);
            }
        }
    }
    let _ = spiffe_id_from_linkerd(text);
    let _ = Cidr::parse(text);
}
