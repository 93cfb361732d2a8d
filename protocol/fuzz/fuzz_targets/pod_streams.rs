//! Untrusted bytes of the pod-log and terminal paths: log data an agent streams (line tracking,
//! timestamps, resume filtering) and a client's `pods/exec` frames and subprotocol offers.
//!
//! Run with `cargo +nightly fuzz run pod_streams` from `protocol/`. The same check runs over
//! sample inputs in the protocol crate's unit tests
//! (`fuzzing::resp_fuzz_tests::pod_stream_fuzz_logic_over_kubelet_and_kubectl_shapes_and_mutations`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(finding) = protocol::fuzzing::check_pod_streams(data) {
        panic!("{finding}");
    }
});
