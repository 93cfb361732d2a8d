//! Untrusted bytes from an HA peer's `Replication.Subscribe` stream (`ReplicatedEvent`), read as
//! a replica reads them (`protocol::replication::decode`).
//!
//! Run with `scripts/fuzz replication_decode`. The same check runs over the seed corpus in the
//! protocol crate's unit tests (`replication::tests::fuzz_seeds_pass_the_check`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::fuzzing::check_replication_decode;

fuzz_target!(|data: &[u8]| {
    // Decoding may reject the input, but must not panic, and a change it accepts must read back
    // the same once the active's encoder has encoded it again.
    if let Err(finding) = check_replication_decode(data) {
        panic!("{finding}");
    }
});
