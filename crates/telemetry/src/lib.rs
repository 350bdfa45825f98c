//! Process-wide logging and tracing. `RUST_LOG` filters (default `info`);
//! logs are human-readable on a terminal and JSON lines otherwise (or when
//! asked). With `OTEL_EXPORTER_OTLP_ENDPOINT` set, every span is also
//! exported over OTLP — gRPC, or HTTP/protobuf when
//! `OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf` — in batches, on the async
//! runtime, so export never blocks a request and an unreachable collector
//! costs a log line, not latency. W3C trace context is the propagation
//! format (`traceparent` in, `traceparent` out).

pub mod metrics;
pub mod sampling;
pub mod window;

pub use sampling::Sampling;
pub use tracing_subscriber::EnvFilter;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::runtime;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use std::collections::HashMap;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Pretty,
    Json,
}

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}

impl OtlpProtocol {
    /// From `OTEL_EXPORTER_OTLP_PROTOCOL` (`grpc`, `http/protobuf`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "" | "grpc" => Ok(Self::Grpc),
            "http/protobuf" => Ok(Self::HttpProtobuf),
            other => Err(format!(
                "unsupported OTLP protocol {other:?} (use grpc or http/protobuf)"
            )),
        }
    }
}

/// Where and how to export spans.
#[derive(Debug, Clone, PartialEq)]
pub struct Otlp {
    /// The collector, e.g. `http://127.0.0.1:4317` (gRPC) or
    /// `http://127.0.0.1:4318` (HTTP; `/v1/traces` is appended).
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    /// Which traces are exported (all, by default).
    pub sampling: Sampling,
}

/// Keeps the exporter alive; [`Telemetry::shutdown`] flushes it.
#[derive(Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports what is buffered now (blocks until the collector answered or
    /// the export timed out; call it off the async threads).
    pub fn flush(&self) {
        if let Some(p) = &self.provider
            && let Err(e) = p.force_flush()
        {
            tracing::warn!(error = %e, "span export flush failed");
        }
    }

    /// Exports what is still buffered and stops the exporter.
    pub fn shutdown(self) {
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown()
        {
            tracing::warn!(error = %e, "span exporter did not shut down cleanly");
        }
    }
}

/// A batch exporter to `otlp`, tagged `service.name=ragtime` and the
/// version. Must be called inside a Tokio runtime (the batches are sent
/// from a task on it).
pub fn tracer_provider(otlp: &Otlp) -> Result<SdkTracerProvider, String> {
    let exporter = match otlp.protocol {
        OtlpProtocol::Grpc => SpanExporter::builder()
            .with_tonic()
            .with_endpoint(otlp.endpoint.trim_end_matches('/'))
            .build(),
        OtlpProtocol::HttpProtobuf => SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{}/v1/traces", otlp.endpoint.trim_end_matches('/')))
            .build(),
    }
    .map_err(|e| format!("OTLP exporter for {}: {e}", otlp.endpoint))?;
    let batch = BatchSpanProcessor::builder(exporter, runtime::Tokio).build();
    let tail = sampling::TailProcessor::new(
        batch,
        otlp.sampling.buffer_spans,
        otlp.sampling.buffer_bytes,
    );
    Ok(SdkTracerProvider::builder()
        .with_sampler(sampling::HeadSampler::new(otlp.sampling.ratio))
        .with_span_processor(tail)
        .with_resource(
            Resource::builder()
                .with_service_name("ragtime")
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build())
}

/// The `tracing` layer that turns spans into OpenTelemetry spans.
pub fn otel_layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("ragtime"))
}

/// Installs the global subscriber (later calls do nothing, so tests can
/// call it freely) and, with `otlp`, the span exporter.
pub fn init(format: LogFormat, otlp: Option<&Otlp>) -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    init_with_log_filter(format, otlp, filter)
}

/// As [`init`], with the log filter given rather than read from
/// `RUST_LOG`. It filters the logs only, never the exported spans.
pub fn init_with_log_filter(
    format: LogFormat,
    otlp: Option<&Otlp>,
    filter: EnvFilter,
) -> Telemetry {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let (provider, otlp_error) = match otlp.map(tracer_provider) {
        Some(Ok(p)) => (Some(p), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    // Each layer has its own filter: `RUST_LOG` says what is logged, and
    // never what is traced (RUST_LOG=warn must not empty the traces). The
    // exporter takes ragtime's spans, which are all at INFO, and the
    // events inside them from INFO up.
    let otel = provider
        .as_ref()
        .map(|p| otel_layer(p).with_filter(LevelFilter::INFO));
    let registry = tracing_subscriber::registry().with(otel);
    let _ = match format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_filter(filter),
            )
            .try_init(),
        LogFormat::Pretty => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .compact()
                    .with_filter(filter),
            )
            .try_init(),
    };
    if let Some(e) = otlp_error {
        tracing::error!(error = %e, "spans will not be exported");
    } else if let Some(o) = otlp {
        tracing::info!(
            endpoint = %o.endpoint,
            protocol = ?o.protocol,
            sample_ratio = o.sampling.ratio,
            "exporting spans over OTLP (every degraded request, and this share of the rest)"
        );
    }
    Telemetry { provider }
}

struct Headers<'a>(&'a HashMap<String, String>);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

struct Collect(HashMap<String, String>);

impl Injector for Collect {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

/// Makes `span` a child of the caller's trace when `traceparent` (and
/// optionally `tracestate`) carry a valid W3C trace context.
pub fn continue_trace(span: &Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    let Some(tp) = traceparent else {
        return;
    };
    let mut h = HashMap::from([("traceparent".to_owned(), tp.to_owned())]);
    if let Some(ts) = tracestate {
        h.insert("tracestate".to_owned(), ts.to_owned());
    }
    let cx = TraceContextPropagator::new().extract(&Headers(&h));
    let _ = span.set_parent(cx);
}

/// The `traceparent` header that makes a downstream call a child of
/// `span`, when spans are being recorded.
pub fn traceparent(span: &Span) -> Option<String> {
    let mut c = Collect(HashMap::new());
    TraceContextPropagator::new().inject_context(&span.context(), &mut c);
    c.0.remove("traceparent")
}

/// The trace id of `span`'s trace, for an exemplar, when that trace will be
/// exported: it was chosen at its head (a sampled caller, or the ratio), or
/// `degraded` says the request was partial or overran (those are always
/// kept). None when spans are not exported (no exporter: the span has no
/// OpenTelemetry context).
pub fn exported_trace_id(span: &Span, degraded: bool) -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    (sc.is_valid() && (sc.is_sampled() || degraded)).then(|| sc.trace_id().to_string())
}
