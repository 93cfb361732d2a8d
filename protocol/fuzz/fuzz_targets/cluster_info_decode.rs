//! Untrusted bytes from a spoke's Argo CD Redis: a cluster info value (`cluster|info|...`), read
//! by the agent for its `cluster-cache-info-update` report, plain or gzipped.
//!
//! Run with `cargo +nightly fuzz run cluster_info_decode` from `protocol/`. The same check runs
//! over real Argo CD v3.5.1's stored values in the protocol crate's unit tests
//! (`argocd::cluster_info::tests::fuzz_check_over_real_argo_cd_values`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(finding) = protocol::fuzzing::check_cluster_info_decode(data) {
        panic!("{finding}");
    }
});
