//! Splits the input into two JSON documents (the object, then the patch,
//! written one after the other, e.g. `{"a":1} {"a":null}`) and applies the
//! patch as a strategic merge patch for every supported kind and one
//! unsupported one. `apply` must never panic, and a successful result must be
//! an object.
#![no_main]

use apiserver::strategic_merge::{SUPPORTED_KINDS, apply};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let mut documents = serde_json::Deserializer::from_slice(data).into_iter::<Value>();
    let (Some(Ok(original)), Some(Ok(patch))) = (documents.next(), documents.next()) else {
        return;
    };
    for kind in SUPPORTED_KINDS.into_iter().chain(["Widget"]) {
        if let Ok(patched) = apply(&original, &patch, kind) {
            assert!(patched.is_object(), "{kind}: the result of a patch must be an object, got {patched}");
        }
    }
});
