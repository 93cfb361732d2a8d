//! Files only the server's user may read (keys, tokens, kubeconfigs), written durably.

use std::path::Path;

/// Writes `bytes` to `path` with mode 0600 and syncs it to disk before returning.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}
