//! Where the workspace's binaries and the test tools (from the test venv) are.

use std::path::{Path, PathBuf};

use anyhow::bail;

/// The workspace root: the directory holding the root `Cargo.toml` (and `.venv`).
#[must_use]
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// Directories that may hold the workspace binaries, most specific first:
/// `$CARGO_TARGET_DIR/<profile>`, the profile directory this test executable was built into
/// (`<target>/<profile>/deps/..`), and `<workspace>/target/<profile>`.
fn candidate_dirs() -> Vec<PathBuf> {
    let exe_profile_dir = std::env::current_exe().ok().and_then(|exe| {
        let deps = exe.parent()?;
        if deps.file_name()? == "deps" { deps.parent().map(Path::to_path_buf) } else { None }
    });
    let profile = exe_profile_dir
        .as_deref()
        .and_then(Path::file_name)
        .map_or_else(|| "debug".to_string(), |p| p.to_string_lossy().into_owned());
    let mut dirs = Vec::new();
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        let target = PathBuf::from(target);
        let target = if target.is_absolute() { target } else { workspace_root().join(target) };
        dirs.push(target.join(&profile));
    }
    dirs.extend(exe_profile_dir);
    dirs.push(workspace_root().join("target").join(&profile));
    dirs.dedup();
    dirs
}

/// Path of a binary built from this workspace (`argocd-agent`, `argocd-agentctl`).
///
/// # Errors
/// The binary has not been built; the message says to run `cargo build -p cli`.
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    let dirs = candidate_dirs();
    if let Some(found) = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()) {
        return Ok(found);
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    bail!(
        "binary `{name}` not found (looked in {}): run `cargo build -p cli` first (scripts/test builds it before running tests)",
        looked.join(", ")
    )
}

/// Path of a tool installed into the test venv (`<workspace>/.venv/bin/<name>`).
///
/// # Errors
/// The tool is missing: fails loudly with the command that installs it. Tests never skip.
pub fn venv_tool(name: &str) -> anyhow::Result<PathBuf> {
    let path = workspace_root().join(".venv").join("bin").join(name);
    if path.is_file() {
        Ok(path)
    } else {
        bail!("test tool `{name}` is missing at {}: run scripts/install-test-deps", path.display())
    }
}

/// The venv's kubectl (pinned to the version the tests were written against).
///
/// # Errors
/// kubectl is not installed: run `scripts/install-test-deps`.
pub fn kubectl_path() -> anyhow::Result<PathBuf> {
    venv_tool("kubectl")
}

/// The venv's Envoy.
///
/// # Errors
/// Envoy is not installed: run `scripts/install-test-deps`.
pub fn envoy_path() -> anyhow::Result<PathBuf> {
    venv_tool("envoy")
}

/// Prometheus's `promtool` (Debian package `prometheus`), from `PATH` or `/usr/bin`.
///
/// # Errors
/// promtool is not installed: run `scripts/install-test-deps`.
pub fn promtool_path() -> anyhow::Result<PathBuf> {
    let path_dirs = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    let found = path_dirs.iter().chain([&PathBuf::from("/usr/bin")]).map(|d| d.join("promtool")).find(|p| p.is_file());
    match found {
        Some(path) => Ok(path),
        None => bail!("test tool `promtool` is missing (Debian package prometheus): run scripts/install-test-deps"),
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn workspace_root_has_the_workspace_manifest() {
        assert!(workspace_root().join("Cargo.toml").is_file());
        assert!(workspace_root().join("tests").join("Cargo.toml").is_file());
    }

    #[test]
    fn missing_binary_says_how_to_build_it() {
        let err = workspace_binary("no-such-binary-here").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("cargo build -p cli"), "{err}");
    }

    #[test]
    fn missing_tool_says_how_to_install_it() {
        let err = venv_tool("no-such-tool-here").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("run scripts/install-test-deps"), "{err}");
    }
}
