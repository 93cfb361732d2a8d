//! With the `testing` feature, compiles the SPIFFE Workload API protobuf (copied from the `spiffe`
//! crate, `src/workload/proto/workload.proto`) into a tonic *server* for the fake Workload API.
//! Production builds (no `testing`) compile nothing.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(feature = "testing")]
    {
        println!("cargo:rerun-if-changed=src/workload/proto/workload.proto");
        let fds = protox::compile(["workload.proto"], ["src/workload/proto"])?;
        tonic_prost_build::configure().build_client(false).build_server(true).compile_fds(fds)?;
    }
    Ok(())
}
