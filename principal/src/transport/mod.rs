//! How connections reach the principal: the accept loop of its own listeners ([`accept`]), the
//! bounds on every listener's connections ([`limits`]), the agents' listener's accept queue
//! ([`listen`]),
//! gRPC over WebSocket for agents behind HTTP/1.1-only proxies ([`websocket`], the `grpcws` crate), and the gzip
//! the gRPC services answer in kind ([`compression`]).

pub(crate) mod accept;
pub mod compression;
pub mod limits;
pub mod listen;
/// gRPC over WebSocket on the agents' port: the [`grpcws`] crate's server side.
pub use grpcws::server as websocket;
