//! An in-process OTLP/gRPC trace receiver: the spawned principal and agents export their spans
//! to it (`--otlp-address`), and tests and benchmarks read what arrived.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use tokio_util::sync::CancellationToken;

/// One received span, flattened.
#[derive(Debug, Clone)]
pub struct Span {
    /// The resource's `service.name`.
    pub service: String,
    /// Hex.
    pub trace_id: String,
    /// Hex.
    pub span_id: String,
    /// Hex; empty for a root span.
    pub parent_span_id: String,
    /// The span's name, e.g. `Application.create`.
    pub name: String,
    /// Every attribute, its value as text.
    pub attributes: BTreeMap<String, String>,
}

/// The receiver: keeps every span it is sent.
#[derive(Debug, Clone, Default)]
pub struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    /// Every span received so far.
    #[must_use]
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// How many spans were received so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no span was received yet.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Spans received so far by `service.name`.
    #[must_use]
    pub fn count_by_service(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for s in self.spans.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            *out.entry(s.service.clone()).or_insert(0) += 1;
        }
        out
    }
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), text(kv.value.as_ref()))).collect()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for rs in request.into_inner().resource_spans {
            let resource = rs.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                received.push(Span {
                    service: service.clone(),
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    name: span.name.clone(),
                    attributes: attributes(&span.attributes),
                });
            }
        }
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// Serves `receiver` on 127.0.0.1 (a free port) until `cancel`; the address to pass as
/// `--otlp-address`.
///
/// # Errors
/// The listener cannot be bound.
pub async fn serve_receiver(receiver: Receiver, cancel: CancellationToken) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver))
            .serve_with_incoming_shutdown(incoming, cancel.cancelled_owned())
            .await;
        if let Err(e) = served {
            eprintln!("OTLP receiver failed: {e}");
        }
    });
    Ok(addr)
}
