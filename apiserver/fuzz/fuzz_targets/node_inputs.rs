//! Arbitrary bytes as what the simulated node parses from clients: log and exec query strings,
//! exec channel frames (v4 and v5, terminal resizes) and subprotocol offers. Nothing may panic;
//! every rejection must be a 400; rendered logs must respect `limitBytes`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| apiserver::fuzzing::check_node_inputs(data));
