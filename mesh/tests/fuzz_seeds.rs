//! Runs the fuzz targets' checks (`fuzz/src/checks.rs`) on their seed corpus, so the fuzz logic
//! is exercised by every `cargo nextest run` without a fuzzer.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

#[path = "../fuzz/src/checks.rs"]
mod checks;

use std::path::{Path, PathBuf};

fn seeds(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("seed corpus {} missing: {e}", dir.display()));
    let seeds: Vec<_> = entries
        .map(|e| {
            let path = e.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            (path, data)
        })
        .collect();
    assert!(!seeds.is_empty(), "seed corpus {} is empty", dir.display());
    seeds
}

#[test]
fn xfcc_target_passes_its_seeds() {
    for (_path, data) in seeds("xfcc") {
        checks::xfcc(&data);
    }
}

#[test]
fn spiffe_id_target_passes_its_seeds() {
    for (_path, data) in seeds("spiffe_id") {
        checks::spiffe_id(&data);
    }
}
