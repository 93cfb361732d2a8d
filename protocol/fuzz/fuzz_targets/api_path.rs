//! Untrusted request paths reaching the resource proxy, and request targets from the wire
//! rendered into API paths by the agent.
//!
//! Run with `cargo +nightly fuzz run api_path` from `protocol/`. The same check runs over
//! sample inputs in the protocol crate's unit tests (`api_path_fuzz_logic_over_sample_inputs`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(finding) = protocol::fuzzing::check_api_path(data) {
        panic!("{finding}");
    }
});
