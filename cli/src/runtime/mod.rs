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
            /// HTTP listeners (metrics, health; the principal's resource proxy): how long a client
            /// may take to send a request's headers; on the principal also the idle time of a
            /// resource-proxy connection without a client certificate, and the longest life of a
            /// gRPC connection without the one --auth needs.
            #[arg(long, env = concat!($prefix, "HEADER_READ_TIMEOUT"), default_value = "5s")]
            pub header_read_timeout: String,
            /// A connection with no request open (HTTP) or no byte either way (the Redis proxy)
            /// this long is closed.
            #[arg(long, env = concat!($prefix, "IDLE_TIMEOUT"), default_value = "5m")]
            pub idle_timeout: String,
            /// HTTP/2 servers PING a connection without traffic this often...
            #[arg(long, env = concat!($prefix, "HTTP2_KEEPALIVE_INTERVAL"), default_value = "30s")]
            pub http2_keepalive_interval: String,
            /// ...and close it when the PING is not answered within this.
            #[arg(long, env = concat!($prefix, "HTTP2_KEEPALIVE_TIMEOUT"), default_value = "10s")]
            pub http2_keepalive_timeout: String,
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
                    header_read_timeout: self.header_read_timeout.clone(),
                    idle_timeout: self.idle_timeout.clone(),
                    http2_keepalive_interval: self.http2_keepalive_interval.clone(),
                    http2_keepalive_timeout: self.http2_keepalive_timeout.clone(),
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
    header_read_timeout: String,
    idle_timeout: String,
    http2_keepalive_interval: String,
    http2_keepalive_timeout: String,
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

    /// The connection timeouts of the server's listeners: `--header-read-timeout`,
    /// `--idle-timeout`, `--http2-keepalive-interval`, `--http2-keepalive-timeout`, and the TLS
    /// handshake's `handshake` (the principal's `--handshake-timeout`; the agent serves no TLS).
    ///
    /// # Errors
    /// A value that is not a duration above zero, naming its flag.
    pub fn timeouts(&self, handshake: std::time::Duration) -> anyhow::Result<principal::transport::limits::Timeouts> {
        let positive = |text: &str, flag: &str| -> anyhow::Result<std::time::Duration> {
            let d = crate::flags::parse_duration(text).with_context(|| format!("{flag} {text:?}"))?;
            anyhow::ensure!(!d.is_zero(), "{flag} {text:?}: must be above zero (e.g. 5s)");
            Ok(d)
        };
        Ok(principal::transport::limits::Timeouts {
            handshake,
            header: positive(&self.header_read_timeout, "--header-read-timeout")?,
            idle: positive(&self.idle_timeout, "--idle-timeout")?,
            keepalive: principal::transport::limits::Keepalive {
                interval: positive(&self.http2_keepalive_interval, "--http2-keepalive-interval")?,
                timeout: positive(&self.http2_keepalive_timeout, "--http2-keepalive-timeout")?,
            },
        })
    }

    /// Binds and serves the metrics and health endpoints (on `host` unless an address flag says
    /// otherwise) until `cancel` fires; `process` names the server in the printed line. Their
    /// connections are bounded by [`Self::timeouts`] and a cap each
    /// ([`observability::start`]).
    ///
    /// # Errors
    /// An address or timeout flag is not valid, or an explicitly configured endpoint cannot bind.
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
        let timeouts = self.timeouts(principal::transport::limits::DEFAULT_HANDSHAKE_TIMEOUT)?;
        start(process, metrics, healthz, render, health, timeouts, cancel).await
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
