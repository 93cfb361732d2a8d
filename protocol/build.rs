//! Compiles the .proto files in `proto/` with protox (pure Rust, no protoc) and generates
//! prost messages plus tonic clients and servers for them.

use std::error::Error;

const PROTOS: &[&str] = &[
    "proto/cloudevents.proto",
    "proto/auth.proto",
    "proto/eventstream.proto",
    "proto/version.proto",
    "proto/logstream.proto",
    "proto/terminalstream.proto",
    "proto/replication.proto",
    "proto/haadmin.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    // Every service encodes with prost like tonic's default codec, with smaller starting
    // buffers (src/grpc_codec.rs: an idle stream's memory).
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::grpc_codec::Codec")
        // An event's data is encoded once and shared by every agent's message (src/event/data.rs).
        .bytes(".io.cloudevents.v1.CloudEvent.binary_data")
        .compile_fds(fds)?;
    Ok(())
}
