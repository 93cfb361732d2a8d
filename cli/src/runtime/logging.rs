//! Log setup shared by every subcommand.

use tracing_subscriber::EnvFilter;

/// Log to stderr, text or JSON, with a level filter (`RUST_LOG` syntax, e.g. `info,apiserver=debug`).
pub fn init(level: &str, json: bool) {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal as _;
    // Colours only for a person at a terminal; log files and test captures stay plain.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
