//! `--out-dir`: the PEM files written beside the secrets.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// One file to write.
#[derive(Debug)]
pub struct OutFile<'a> {
    /// File name inside the directory.
    pub name: String,
    /// PEM text.
    pub contents: &'a str,
    /// Private key material: written with mode 0600.
    pub private: bool,
}

/// Write `files` into `dir` (created if missing), replacing files of the same name; print each path.
///
/// # Errors
/// The directory or a file cannot be written.
pub fn write_files(dir: &Path, files: &[OutFile<'_>]) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create --out-dir {}", dir.display()))?;
    let mut written = Vec::with_capacity(files.len());
    for file in files {
        let path = dir.join(&file.name);
        let tmp = dir.join(format!(".{}.tmp", file.name));
        let mode = if file.private { 0o600 } else { 0o644 };
        // A leftover from an interrupted run might have looser permissions: start afresh.
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(file.contents.as_bytes()).with_context(|| format!("cannot write {}", tmp.display()))?;
        f.sync_all().with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
        println!("Wrote {}", path.display());
        written.push(path);
    }
    Ok(written)
}
