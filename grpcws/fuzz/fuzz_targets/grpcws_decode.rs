//! Untrusted WebSocket messages of the gRPC-over-WebSocket transport (`--enable-websocket`):
//! client and server frames, metadata header blocks, and the gRPC body splitter.
//!
//! Run with `cargo +nightly fuzz run grpcws_decode` from `grpcws/`. The same check runs over
//! sample inputs in the grpcws crate's unit tests (`frame::tests::fuzz_logic_over_sample_inputs`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(finding) = grpcws::frame::fuzz_check(data) {
        panic!("{finding}");
    }
});
