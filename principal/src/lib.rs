//! The hub side: gRPC services, agent sessions, event routing, hub watchers, resync.
#![forbid(unsafe_code)]
