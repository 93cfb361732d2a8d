//! Untrusted bytes from the event stream, decoded into the typed `Event`.
//!
//! Run with `cargo +nightly fuzz run event_decode` from `protocol/`. The same check runs over
//! sample inputs in the protocol crate's unit tests (`fuzz_target_logic_over_sample_inputs`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::event::DecodeLimits;
use protocol::fuzzing::check_event_decode;

fuzz_target!(|data: &[u8]| {
    // Decoding may reject the input, but must not panic, and whatever it accepts must
    // re-encode to the same event.
    let limits = DecodeLimits { max_data_bytes: 1 << 20, require_id: false };
    if let Err(finding) = check_event_decode(data, &limits) {
        panic!("{finding}");
    }
});
