//! Cached resource trees from autonomous agents, rewritten by the Redis proxy.
//!
//! Run with `cargo +nightly fuzz run resource_tree` from `protocol/`. The same check runs over mutated
//! real vectors in the protocol crate's unit tests (`resp_fuzz_logic_over_real_vectors_and_mutations`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(finding) = protocol::fuzzing::check_tree_rewrite(data) {
        panic!("{finding}");
    }
});
