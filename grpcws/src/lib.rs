//! gRPC over WebSocket (`--enable-websocket`), in one crate as `tonic-web` is one crate for its
//! adapter, wire-compatible with `golang.stackrox.io/grpc-http1` (upstream argocd-agent's library):
//!
//! * [`frame`]: the frames, pure encoding and decoding (one gRPC frame per binary WebSocket
//!   message, metadata frames for headers and trailers);
//! * [`bridge`]: both ends of one call, moving frames between a WebSocket and an HTTP/2 call
//!   (`handshake` and `forward` for the client, `check_upgrade` and `serve` for the server);
//! * [`server`]: the principal's side: each accepted connection's first bytes decide between
//!   native HTTP/2 and an HTTP/1.1 upgrade, which becomes a call on an in-memory HTTP/2
//!   connection into the same tonic server;
//! * [`client`]: the agent's side: an in-process HTTP/2 server, for a tonic channel to dial, that
//!   opens one WebSocket per call.
//!
//! Everything is bounded: messages by the configured gRPC limit, metadata by
//! [`frame::MAX_METADATA_BYTES`], the handshake head by [`bridge::MAX_HANDSHAKE_HEAD`], and the
//! messages waiting between the two sides by [`bridge::BODY_BUFFER`].
#![forbid(unsafe_code)]

pub mod bridge;
pub mod client;
pub mod frame;
pub mod server;

pub use frame::SUBPROTOCOL;
