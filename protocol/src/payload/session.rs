//! Requests that open a side stream: container logs (`containerlog`) and web terminals
//! (`terminal`).

use serde::{Deserialize, Serialize};

/// A pod log request; the agent answers on a `StreamLogs` stream.
#[allow(clippy::struct_excessive_bools)] // The JSON shape is upstream's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ContainerLogRequest {
    /// The request's UUID (the log stream's `request_uuid`).
    pub uuid: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod_name: String,
    /// Container name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub container: String,
    /// Follow the log.
    #[serde(skip_serializing_if = "is_false")]
    pub follow: bool,
    /// Lines from the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tail_lines: Option<i64>,
    /// Only lines newer than this many seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_seconds: Option<i64>,
    /// Only lines after this RFC 3339 time.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub since_time: String,
    /// Prefix lines with timestamps.
    #[serde(skip_serializing_if = "is_false")]
    pub timestamps: bool,
    /// The previous container instance.
    #[serde(skip_serializing_if = "is_false")]
    pub previous: bool,
    /// Skip kubelet TLS verification.
    #[serde(rename = "insecureSkipTLSVerifyBackend", skip_serializing_if = "is_false")]
    pub insecure_skip_tls_verify_backend: bool,
    /// Byte limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<i64>,
}

/// A web terminal request; the agent answers on a `StreamTerminal` stream.
#[allow(clippy::struct_excessive_bools)] // The JSON shape is upstream's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ContainerTerminalRequest {
    /// The session's UUID.
    pub uuid: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod_name: String,
    /// Container name.
    pub container_name: String,
    /// Command to run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Allocate a TTY.
    pub tty: bool,
    /// Attach stdin.
    pub stdin: bool,
    /// Attach stdout.
    pub stdout: bool,
    /// Attach stderr.
    pub stderr: bool,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference.
fn is_false(b: &bool) -> bool {
    !*b
}
