//! RESP, the Redis wire protocol, as the Redis proxy needs it (upstream §5.2).
//!
//! * [`Scanner`]: where a frame ends, for replies (RESP2 and RESP3) and commands, resumable and
//!   bounded ([`Limits`]);
//! * [`Request`]: a command decoded with `redis-protocol`, classified ([`Command`]);
//! * [`Reply`]: the replies the proxy writes itself, encoded with `redis-protocol` in the
//!   client's [`Version`];
//! * [`tree`]: the namespace rewrite of an autonomous agent's cached resource tree.
//!
//! Argo CD's cache keys themselves are parsed in [`crate::payload::redis`].
//!
//! The test vectors in `vectors/` are bytes captured between redis-cli (or a plain socket) and
//! redis-server 7.0.15 (Debian bookworm).

mod command;
mod reply;
mod scan;
pub mod tree;

pub use command::{Command, CommandError, Request};
pub use reply::{Reply, Version};
pub use scan::{Frame, Grammar, Limits, ScanError, Scanner};
