//! Arbitrary bytes as a Kubernetes protobuf request body: as the whole body, after the `k8s\0`
//! magic (an arbitrary envelope), and as the object message of every kind decoded from protobuf,
//! and as the DeleteOptions body of a DELETE (whole, and as the message in client-go's envelope).
//!
//! Decoding must never panic; it either yields a JSON object with an object `metadata` (what the
//! JSON path produces) or rejects the body with a 400 or 415; a DeleteOptions body is accepted or
//! refused with a 400 or 422.
#![no_main]

use apiserver::protobuf::{CONTENT_TYPE, MAGIC, SUPPORTED, decode, encode, options};
use libfuzzer_sys::fuzz_target;

fn check(body: &[u8]) {
    match decode(body) {
        Ok(v) => {
            assert!(v.is_object(), "decoded to a non-object: {v}");
            assert!(v["metadata"].is_object(), "metadata is not an object: {v}");
            assert!(v["kind"].is_string() && v["apiVersion"].is_string(), "no type: {v}");
            // What the rest of the server sees must serialize.
            assert!(serde_json::to_vec(&v).is_ok());
        }
        Err(e) => assert!(e.code == 400 || e.code == 415, "unexpected {e}"),
    }
    if let Err(e) = apiserver::prepare::decode_body(body, CONTENT_TYPE) {
        assert!(e.code == 400 || e.code == 415, "decode_body: {e}");
    }
}

fn check_delete_options(body: &[u8]) {
    if let Err(e) = apiserver::prepare::delete_options(body, CONTENT_TYPE) {
        assert!(e.code == 400 || e.code == 422, "delete options: {e}");
    }
    if let Ok(v) = options::delete_options_json(body) {
        assert!(v.is_object(), "DeleteOptions decoded to a non-object: {v}");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    check_delete_options(data);
    check_delete_options(&encode("v1", options::KIND, data));
    check(&[MAGIC.as_slice(), data].concat());
    for (api_version, kind) in SUPPORTED {
        check(&encode(api_version, kind, data));
    }
});
