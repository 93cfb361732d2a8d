//! Fuzzes SPIFFE ID parsing, the policy, Linkerd identity names and CIDRs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mesh_fuzz::spiffe_id(data));
