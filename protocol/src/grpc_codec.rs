//! The gRPC codec of every service in [`crate::pb`]: prost, as tonic's default, with smaller
//! starting buffers.
//!
//! tonic gives each stream an encode and a decode buffer of 8 KiB up front. A principal holds
//! one stream per agent, nearly all of them idle (a heartbeat every 30 s), so those two buffers
//! were 16 KiB of every idle agent's memory (docs/performance.md). They start at
//! [`BUFFER_BYTES`] here and grow to the largest message a stream carries, as tonic's do past
//! 8 KiB; the wire format is unchanged.

use std::marker::PhantomData;

use tonic::codec::BufferSettings;
use tonic_prost::{ProstDecoder, ProstEncoder};

/// A stream's encode and decode buffers start this large.
pub const BUFFER_BYTES: usize = 256;

/// Encoded bytes a stream gathers before it yields them to the transport (tonic's default).
pub const YIELD_THRESHOLD: usize = 32 * 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD)
}

/// Prost encoding of `T` out and `U` in, with [`BUFFER_BYTES`] starting buffers.
#[derive(Debug)]
pub struct Codec<T, U>(PhantomData<fn() -> (T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(settings())
    }
}
