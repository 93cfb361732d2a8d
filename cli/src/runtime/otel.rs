//! Logs and traces of `argocd-agent principal` and `agent` (docs/operations/tracing.md).
//!
//! * Logs: stderr, text or JSON, filtered by `--log-level`, an `EnvFilter` string, so levels
//!   can differ per subsystem (`info,principal::service=debug,kube=warn`).
//! * Traces: with `--otlp-address HOST:PORT`, spans of the `principal` and `agent` crates are
//!   exported over OTLP/gRPC (tonic, plaintext) by a batch exporter, sampled parent-based with
//!   `--otlp-sampling-ratio` for new traces, under `service.name` `argocd-agent-principal` or
//!   `argocd-agent-agent`. The trace filter is independent of the log level: `--log-level
//!   warn` still exports every span.
//!
//! The exporter's gRPC channel is driven by the Tokio runtime it is created in, so [`init`]
//! must run inside the runtime, and the returned [`Telemetry`] must be dropped (which flushes)
//! before the runtime.

use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _, Registry};

/// How long shutdown waits for the last spans to be exported.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`init`] needs to know.
#[derive(Debug, Clone)]
pub struct Options<'a> {
    /// `--log-level`: an `EnvFilter` directive string.
    pub log_level: &'a str,
    /// `--log-format json`.
    pub json: bool,
    /// `--otlp-address`: `HOST:PORT` (or `http://HOST:PORT`) of an OTLP/gRPC receiver.
    pub otlp_address: Option<&'a str>,
    /// `--otlp-sampling-ratio`: the share of new traces recorded (0.0-1.0).
    pub sampling_ratio: f64,
    /// `service.name` of the exported spans.
    pub service_name: &'static str,
}

/// Keeps the trace exporter alive; dropping it exports what is still buffered.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports what is buffered and stops the exporter (at most a few seconds).
    pub fn shutdown(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown_with_timeout(FLUSH_TIMEOUT)
        {
            tracing::warn!(error = %e, "cannot flush the last spans to the OTLP receiver");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The OTLP endpoint URL for `--otlp-address`.
///
/// # Errors
/// An empty address, or `https://` (this build exports plaintext gRPC only).
pub fn endpoint(address: &str) -> anyhow::Result<String> {
    let address = address.trim();
    if address.is_empty() {
        anyhow::bail!("--otlp-address is empty: give HOST:PORT of an OTLP/gRPC receiver, e.g. 127.0.0.1:4317");
    }
    if address.starts_with("https://") {
        anyhow::bail!(
            "--otlp-address {address:?}: OTLP over TLS is not supported; export to a local collector in plaintext (HOST:PORT)"
        );
    }
    Ok(if address.contains("://") { address.to_owned() } else { format!("http://{address}") })
}

/// Checks `--otlp-sampling-ratio`.
///
/// # Errors
/// Outside 0.0-1.0 or not a number.
pub fn check_ratio(ratio: f64) -> anyhow::Result<f64> {
    if (0.0..=1.0).contains(&ratio) {
        Ok(ratio)
    } else {
        anyhow::bail!("--otlp-sampling-ratio {ratio}: use a number from 0.0 (no new traces) to 1.0 (every trace)")
    }
}

/// The spans exported: ours (crates `principal`, `agent`, `protocol`), not the libraries'.
fn exported_targets() -> Targets {
    Targets::new()
        .with_target("principal", LevelFilter::INFO)
        .with_target("agent", LevelFilter::INFO)
        .with_target("protocol", LevelFilter::INFO)
}

fn tracer_provider(address: &str, ratio: f64, service_name: &'static str) -> anyhow::Result<SdkTracerProvider> {
    let endpoint = endpoint(address)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .build()
        .with_context(|| format!("--otlp-address {address:?}: cannot create the OTLP exporter for {endpoint}"))?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(check_ratio(ratio)?))))
        .with_resource(Resource::builder().with_service_name(service_name).build())
        .build())
}

/// Installs the log output and, with an OTLP address, the trace exporter. Call inside the
/// Tokio runtime (see the module documentation).
///
/// # Errors
/// A bad OTLP address or sampling ratio.
pub fn init(opts: &Options<'_>) -> anyhow::Result<Telemetry> {
    let provider = match opts.otlp_address {
        Some(address) => Some(tracer_provider(address, opts.sampling_ratio, opts.service_name)?),
        None => None,
    };
    let filter = EnvFilter::try_new(opts.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal as _;
    // Colours only for a person at a terminal; log files and test captures stay plain.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let fmt: Box<dyn tracing_subscriber::Layer<Registry> + Send + Sync> =
        if opts.json { fmt.json().with_filter(filter).boxed() } else { fmt.with_filter(filter).boxed() };
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer().with_tracer(p.tracer(opts.service_name)).with_filter(exported_targets())
    });
    // Fails only if a subscriber is already installed (tests): keep that one.
    let _ = tracing_subscriber::registry().with(fmt).with(otel).try_init();
    if let Some(address) = opts.otlp_address {
        tracing::info!(otlp_address = %address, sampling_ratio = opts.sampling_ratio, service = opts.service_name,
            "exporting traces over OTLP/gRPC");
    }
    Ok(Telemetry { provider })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(endpoint("127.0.0.1:4317").unwrap(), "http://127.0.0.1:4317");
        assert_eq!(endpoint("http://collector:4317").unwrap(), "http://collector:4317");
        assert!(endpoint("").is_err());
        assert!(endpoint("https://collector:4317").unwrap_err().to_string().contains("TLS"));
    }

    /// With the layer installed, an event built under a span carries that span's context, and a
    /// span parented on the event joins the same trace as its child.
    #[test]
    fn trace_context_travels_through_an_event() {
        use protocol::{Event, EventType, Target};
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")).with_filter(exported_targets()));
        tracing::subscriber::with_default(subscriber, || {
            let sender = tracing::info_span!(target: "principal", "hub_event");
            let mut ev = Event::new(EventType::Create, Target::Application, "r", "e");
            sender.in_scope(|| protocol::otel::inject_current(&mut ev));
            let sent = protocol::otel::context_of(&sender).unwrap();
            assert_eq!(ev.trace, sent);
            let parent = ev.trace.parent().unwrap();
            assert!(parent.sampled());

            let receiver = tracing::info_span!(target: "agent", "inbound");
            protocol::otel::set_parent(&receiver, &ev.trace);
            let got = protocol::otel::context_of(&receiver).unwrap().parent().unwrap();
            assert_eq!(got.trace_id, parent.trace_id, "same trace");
            assert_ne!(got.parent_id, parent.parent_id, "a span of its own");

            // A garbage traceparent starts a new trace instead.
            let mut bad = ev.clone();
            bad.trace.traceparent = Some("00-zz".into());
            let other = tracing::info_span!(target: "agent", "inbound");
            protocol::otel::set_parent(&other, &bad.trace);
            let other = protocol::otel::context_of(&other).unwrap().parent().unwrap();
            assert_ne!(other.trace_id, parent.trace_id);
        });
    }

    #[test]
    fn ratios() {
        assert!(check_ratio(0.0).is_ok() && check_ratio(1.0).is_ok() && check_ratio(0.25).is_ok());
        assert!(check_ratio(1.5).is_err() && check_ratio(-0.1).is_err() && check_ratio(f64::NAN).is_err());
    }
}
