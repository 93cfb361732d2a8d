//! An embedded Kubernetes-compatible API server.
//!
//! It serves the Kubernetes REST API (discovery, CRUD, patches, list/watch with resourceVersion,
//! selectors, paging, the status subresource, finalizers, CRDs) for the kinds this project uses,
//! and keeps its objects durably in a data dir. kube-rs and kubectl use it as they would a
//! cluster: the quickstart and every test run their "clusters" on it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let server = apiserver::ApiServer::start(apiserver::Config::new("/tmp/hub")).await?;
//! let client = server.client().await?;
//! # drop(client); server.shutdown().await; Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod builtin;
pub mod error;
pub mod fuzzing;
pub mod http;
pub mod jsonpatch;
pub mod node;
pub mod object;
pub mod openapi;
pub mod prepare;
mod private_file;
pub mod protobuf;
pub mod resource;
pub mod schema;
pub use protocol::selector;
mod server;
pub mod store;
pub mod strategic_merge;
pub mod tls;

pub use error::ApiError;
pub use server::{
    ApiServer, Config, DEFAULT_BOOKMARK_INTERVAL, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_WATCH, DEFAULT_WATCH_HISTORY,
    ServerError,
};
