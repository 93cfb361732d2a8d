//! The runtime kit both servers (`argocd-agent principal` and `argocd-agent agent`) share, as
//! kubert's `Runtime` is shared by a controller's binaries: the flags every server takes (one
//! group, flattened into each command under its own environment prefix), the async runtime with
//! logs and OTLP traces ([`otel`]), signals and the parent's exit ([`signals`]), the metrics and
//! health endpoints ([`observability`]), and TLS material re-read while running ([`reload`]).
//! The commands parse their own flags and compose; none of this is written twice.

pub mod logging;
pub mod observability;
pub mod otel;
pub mod reload;
pub mod signals;

use std::future::Future;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

/// The runtime kit's flags for one command: environment names under `prefix`, the metrics and
/// health ports' defaults (upstream's), and where the endpoints bind without an address (for
/// the help text).
macro_rules! runtime_flags {
    (
        $(#[$meta:meta])*
        $name:ident,
        prefix = $prefix:literal,
        metrics_port = $metrics:literal,
        healthz_port = $healthz:literal,
        bound_on = $bound:literal $(,)?
    ) => {
        $(#[$meta])*
        #[derive(clap::Args, Debug, Clone)]
        pub struct $name {
            /// Log level: `[<subsystem>=]level`, comma-separated.
            #[arg(long, env = concat!($prefix, "LOG_LEVEL"), default_value = "info")]
            pub log_level: String,
            /// Log format: text or json.
            #[arg(long, env = concat!($prefix, "LOG_FORMAT"), default_value = "text", value_parser = ["text", "json"])]
            pub log_format: String,
            #[arg(
                long,
                env = concat!($prefix, "METRICS_PORT"),
                default_value_t = $metrics,
                help = concat!("Port of the metrics endpoint (`/metrics` on ", $bound, "; 0: off)")
            )]
            pub metrics_port: u16,
            #[arg(
                long,
                env = concat!($prefix, "HEALTH_CHECK_PORT"),
                default_value_t = $healthz,
                help = concat!("Port of the health endpoint (`/healthz`, `/readyz` on ", $bound, "; 0: off)")
            )]
            pub healthz_port: u16,
            /// HOST:PORT of the metrics endpoint, instead of --metrics-port (port 0: a free port,
            /// printed at startup).
            #[arg(long, env = concat!($prefix, "METRICS_ADDRESS"))]
            pub metrics_address: Option<String>,
            /// HOST:PORT of the health endpoint, instead of --healthz-port (port 0: a free port,
            /// printed at startup).
            #[arg(long, env = concat!($prefix, "HEALTH_CHECK_ADDRESS"))]
            pub healthz_address: Option<String>,
            /// Export traces over OTLP/gRPC to this HOST:PORT (docs/operations/tracing.md).
            #[arg(long, env = concat!($prefix, "OTLP_ADDRESS"))]
            pub otlp_address: Option<String>,
            /// Accepted for upstream compatibility: traces are always exported in plaintext.
            #[arg(long, env = concat!($prefix, "OTLP_INSECURE"), hide = true)]
            pub otlp_insecure: Option<bool>,
            /// Share of new traces recorded (0.0-1.0); a trace started elsewhere follows its parent.
            #[arg(long, env = concat!($prefix, "OTLP_SAMPLING_RATIO"), default_value_t = 1.0)]
            pub otlp_sampling_ratio: f64,
            /// Accepted, no effect: upstream's extra log detail (per-subsystem levels in
            /// --log-level do that here).
            #[arg(long, env = concat!($prefix, "FULL_DETAIL"))]
            pub full_detail: Option<String>,
            /// Accepted, no effect: Go's profiler endpoint.
            #[arg(long, env = concat!($prefix, "PPROF_PORT"))]
            pub pprof_port: Option<u16>,
        }

        impl $name {
            /// The kit these flags configure.
            #[must_use]
            pub fn kit(&self) -> $crate::runtime::Kit {
                $crate::runtime::Kit {
                    log_level: self.log_level.clone(),
                    json: self.log_format == "json",
                    metrics_port: self.metrics_port,
                    metrics_default: $metrics,
                    healthz_port: self.healthz_port,
                    healthz_default: $healthz,
                    metrics_address: self.metrics_address.clone(),
                    healthz_address: self.healthz_address.clone(),
                    otlp_address: self.otlp_address.clone(),
                    otlp_sampling_ratio: self.otlp_sampling_ratio,
                    full_detail: self.full_detail.clone(),
                    pprof_port: self.pprof_port,
                }
            }
        }
    };
}

runtime_flags!(
    /// The principal's runtime flags (`ARGOCD_PRINCIPAL_*`).
    PrincipalRuntime,
    prefix = "ARGOCD_PRINCIPAL_",
    metrics_port = 8000,
    healthz_port = 8003,
    bound_on = "--listen-host",
);

runtime_flags!(
    /// The agent's runtime flags (`ARGOCD_AGENT_*`).
    AgentRuntime,
    prefix = "ARGOCD_AGENT_",
    metrics_port = 8181,
    healthz_port = 8001,
    bound_on = "all addresses",
);

/// What the runtime flags configure, for either command.
#[derive(Debug, Clone)]
pub struct Kit {
    log_level: String,
    json: bool,
    metrics_port: u16,
    metrics_default: u16,
    healthz_port: u16,
    healthz_default: u16,
    metrics_address: Option<String>,
    healthz_address: Option<String>,
    otlp_address: Option<String>,
    otlp_sampling_ratio: f64,
    full_detail: Option<String>,
    pprof_port: Option<u16>,
}

impl Kit {
    /// Runs `serve` on a new async runtime with logs and traces set up for `service_name`
    /// (`service.name` of exported spans); the exporter flushes after `serve` ends.
    ///
    /// # Errors
    /// The runtime or the trace exporter cannot start, or `serve` fails.
    pub fn run<F>(&self, service_name: &'static str, serve: F) -> anyhow::Result<()>
    where
        F: Future<Output = anyhow::Result<()>>,
    {
        let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
        // Inside the runtime (the exporter's channel runs on it); dropped, and so flushed, first.
        let _telemetry = rt.block_on(async {
            otel::init(&otel::Options {
                log_level: &self.log_level,
                json: self.json,
                otlp_address: self.otlp_address.as_deref(),
                sampling_ratio: self.otlp_sampling_ratio,
                service_name,
            })
        })?;
        rt.block_on(serve)
    }

    /// Binds and serves the metrics and health endpoints (on `host` unless an address flag says
    /// otherwise) until `cancel` fires; `process` names the server in the printed line.
    ///
    /// # Errors
    /// An address flag is not `HOST:PORT`, or an explicitly configured endpoint cannot bind.
    pub async fn admin(
        &self,
        process: &str,
        host: &str,
        render: observability::Render,
        health: observability::Health,
        cancel: &CancellationToken,
    ) -> anyhow::Result<()> {
        use observability::{listen, start};
        let metrics = listen(
            self.metrics_address.as_deref(),
            "--metrics-address",
            host,
            self.metrics_port,
            self.metrics_default,
        )?;
        let healthz = listen(
            self.healthz_address.as_deref(),
            "--healthz-address",
            host,
            self.healthz_port,
            self.healthz_default,
        )?;
        start(process, metrics, healthz, render, health, cancel).await
    }

    /// Notes on upstream's debugging knobs (`--pprof-port`, `--full-detail`), with `subsystem`
    /// as the example log target.
    ///
    /// # Errors
    /// A `--full-detail` part upstream would refuse.
    pub fn debug_knob_notes(&self, subsystem: &str) -> anyhow::Result<Vec<String>> {
        crate::upstream_only::debug_knob_notes(self.pprof_port, self.full_detail.as_deref(), subsystem)
    }
}
