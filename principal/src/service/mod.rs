//! The gRPC services the principal serves.

pub mod eventstream;
pub mod logstream;
pub mod terminalstream;
pub mod version;
