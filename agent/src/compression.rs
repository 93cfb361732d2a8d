//! gzip towards the principal (`--enable-compression`), as upstream's agent does it: every call
//! (`Authenticate`, the event stream) sends gzip-compressed messages and reads compressed answers.
//! The principal answers in the compression the agent used; upstream's principal (grpc-go with
//! gzip registered) and ours both do. Off by default, as upstream.

use protocol::pb::authapi::authentication_client::AuthenticationClient;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;

/// The one codec both sides speak (upstream registers gzip only).
pub const GZIP: CompressionEncoding = CompressionEncoding::Gzip;

/// An `EventStream` client on `channel`, compressing when `on`.
#[must_use]
pub fn event_stream_client(channel: Channel, on: bool) -> EventStreamClient<Channel> {
    let client = EventStreamClient::new(channel);
    if on { client.send_compressed(GZIP).accept_compressed(GZIP) } else { client }
}

/// An `Authentication` client on `channel`, compressing when `on`.
#[must_use]
pub fn auth_client(channel: Channel, on: bool) -> AuthenticationClient<Channel> {
    let client = AuthenticationClient::new(channel);
    if on { client.send_compressed(GZIP).accept_compressed(GZIP) } else { client }
}
