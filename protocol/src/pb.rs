//! Generated protobuf messages and tonic clients/servers for our `.proto` files in `proto/`.
//!
//! The module tree mirrors the protobuf packages, because the generated code refers to other
//! packages by relative path (`super::io::cloudevents::v1::CloudEvent`). Shorter aliases are
//! re-exported at the bottom: [`cloudevents`] and [`logstreamapi`].
//!
//! Packages, services, methods, message names and field numbers are the upstream ones
//! (upstream's `pkg/api/grpc/*.proto`; docs/compatibility.md), so Go peers interoperate.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// The largest gRPC message upstream sends or accepts, both directions, both sides
/// (200 MiB, `internal/grpcutil/constants.go`); set it on our clients and servers too.
pub const MAX_MESSAGE_BYTES: usize = 200 * 1024 * 1024;

/// `authapi`: the `Authentication` service (`Authenticate`, `RefreshToken`).
pub mod authapi {
    include!(concat!(env!("OUT_DIR"), "/authapi.rs"));
}

/// `eventstreamapi`: the `EventStream` service (`Subscribe`, `Push`, `Ping`).
pub mod eventstreamapi {
    include!(concat!(env!("OUT_DIR"), "/eventstreamapi.rs"));
}

/// `versionapi`: the `Version` service.
pub mod versionapi {
    include!(concat!(env!("OUT_DIR"), "/versionapi.rs"));
}

/// `terminalstreamapi`: the `TerminalStreamService` (web terminal bytes).
pub mod terminalstreamapi {
    include!(concat!(env!("OUT_DIR"), "/terminalstreamapi.rs"));
}

/// `replicationapi`: the `Replication` service between the principals of a cross-hub HA pair.
pub mod replicationapi {
    include!(concat!(env!("OUT_DIR"), "/replicationapi.rs"));
}

/// `haadminapi`: the `HAAdmin` service (`Status`, `Promote`, `Demote`) on `--ha-admin-port`.
pub mod haadminapi {
    include!(concat!(env!("OUT_DIR"), "/haadminapi.rs"));
}

/// `io.cloudevents.v1`: the CloudEvents protobuf format.
pub mod io {
    /// `io.cloudevents`
    pub mod cloudevents {
        /// `io.cloudevents.v1`: `CloudEvent` and `CloudEventBatch`.
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/io.cloudevents.v1.rs"));
        }
    }
}

/// `principal.apis.logstreamapi`: the `LogStreamService` (pod logs, agent to principal).
pub mod principal {
    /// `principal.apis`
    pub mod apis {
        /// `principal.apis.logstreamapi`
        pub mod logstreamapi {
            include!(concat!(env!("OUT_DIR"), "/principal.apis.logstreamapi.rs"));
        }
    }
}

/// Short alias for [`self::principal::apis::logstreamapi`] (the proto package, not the crate).
pub use self::principal::apis::logstreamapi;
/// Short alias for [`io::cloudevents::v1`].
pub use io::cloudevents::v1 as cloudevents;
