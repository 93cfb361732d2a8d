//! The gRPC services the principal serves.

pub mod eventstream;
mod lanes;
pub mod logstream;
pub mod terminalstream;
pub mod version;
