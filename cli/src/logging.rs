//! Log setup shared by every subcommand.

use tracing_subscriber::EnvFilter;

/// Log to stderr, text or JSON, with a level filter (`RUST_LOG` syntax, e.g. `info,apiserver=debug`).
pub fn init(level: &str, json: bool) {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
