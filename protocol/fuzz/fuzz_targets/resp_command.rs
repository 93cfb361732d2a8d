//! Commands from clients of the principal's Redis proxy (and the Argo CD cache keys among
//! their arguments).
//!
//! Run with `cargo +nightly fuzz run resp_command` from `protocol/`. The same check runs over mutated
//! real vectors in the protocol crate's unit tests (`resp_fuzz_logic_over_real_vectors_and_mutations`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(finding) = protocol::fuzzing::check_resp_command(data) {
        panic!("{finding}");
    }
});
