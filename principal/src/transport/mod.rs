//! How connections reach the principal: the accept loop of its own listeners ([`accept`]),
//! gRPC over WebSocket for agents behind HTTP/1.1-only proxies ([`websocket`]), and the gzip
//! the gRPC services answer in kind ([`compression`]).

pub(crate) mod accept;
pub mod compression;
pub mod websocket;
