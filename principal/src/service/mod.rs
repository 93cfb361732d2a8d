//! The gRPC services the principal serves.

pub mod eventstream;
pub mod version;
