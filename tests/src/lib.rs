//! Helpers shared by the cross-process tests: locating binaries and tools, spawning and stopping
//! processes, driving kubectl, and polling with deadlines.
//!
//! Rules every test built on these helpers follows:
//! - no fixed sleeps for synchronisation: poll with a deadline ([`wait`]);
//! - listen only on `127.0.0.1:0`;
//! - every spawned process is owned by a guard ([`ChildProcess`]) that kills it on drop, so a
//!   panicking or failing test leaves nothing behind;
//! - a missing binary or tool fails the test with what to run, it never skips it.
#![forbid(unsafe_code)]

pub mod apiserver;
pub mod apps;
pub mod argocd;
pub mod bench;
pub mod bin_path;
pub mod consistency;
pub mod envoy;
pub mod faultproxy;
pub mod fixtures;
pub mod gopeer;
pub mod http;
pub mod install;
pub mod istio;
pub mod kubectl;
pub mod live;
pub mod loadgen;
pub mod loadhub;
pub mod otlp;
pub mod pki;
pub mod process;
pub mod realkube;
pub mod redis;
pub mod replicas;
pub mod spire;
pub mod tier;
pub mod topology;
pub mod wait;

pub use apiserver::ApiServerProcess;
pub use bin_path::{envoy_path, kubectl_path, venv_tool, workspace_binary, workspace_root};
pub use kubectl::{Kubectl, KubectlOutput, KubectlWatch};
pub use process::ChildProcess;
pub use wait::{DEFAULT_TIMEOUT, Poller, wait_for, wait_for_async, wait_until, wait_until_async};
