//! Fuzzes the XFCC parser, its rendering round trip and the identity decision.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mesh_fuzz::xfcc(data));
