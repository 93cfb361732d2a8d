//! Arbitrary bytes as a request body (and as a path and query string): decoding and the
//! create/update rules must never panic and must answer every rejection with a 4xx.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| apiserver::fuzzing::check_request_body(data));
