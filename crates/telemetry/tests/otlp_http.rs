//! Span export over OTLP HTTP/protobuf to a receiver in the test, and what
//! an unreachable collector costs: nothing but a log line.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use ragtime_telemetry::{Otlp, OtlpProtocol, otel_layer, tracer_provider};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing_subscriber::layer::SubscriberExt;

type Got = Arc<Mutex<Vec<(String, ExportTraceServiceRequest)>>>;

async fn receive(State(got): State<Got>, headers: HeaderMap, body: Bytes) -> &'static str {
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if let Ok(req) = ExportTraceServiceRequest::decode(body) {
        got.lock().expect("lock").push((ct, req));
    }
    ""
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_http_protobuf_collector() {
    let got: Got = Arc::default();
    let app = axum::Router::new()
        .route("/v1/traces", post(receive))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let provider = tracer_provider(&Otlp {
        endpoint: format!("http://127.0.0.1:{port}"),
        protocol: OtlpProtocol::HttpProtobuf,
        sampling: Default::default(),
    })
    .expect("provider");
    let subscriber = tracing_subscriber::registry().with(otel_layer(&provider));
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("probe", budget.ms = 42u64);
        span.in_scope(|| tracing::warn!("budget.overrun"));
    });
    let p = provider.clone();
    tokio::task::spawn_blocking(move || p.force_flush())
        .await
        .expect("join")
        .expect("flush");
    let got = got.lock().expect("lock").clone();
    assert_eq!(got.len(), 1, "one export");
    let (ct, req) = &got[0];
    assert_eq!(ct, "application/x-protobuf");
    let spans: Vec<_> = req
        .resource_spans
        .iter()
        .flat_map(|r| r.scope_spans.iter().flat_map(|s| s.spans.iter()))
        .collect();
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0].name, "probe");
    assert!(spans[0].attributes.iter().any(|kv| kv.key == "budget.ms"));
    assert_eq!(spans[0].events[0].name, "budget.overrun");
    let service = req.resource_spans[0]
        .resource
        .as_ref()
        .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
        .and_then(|kv| kv.value.as_ref())
        .map(|v| format!("{v:?}"))
        .unwrap_or_default();
    assert!(service.contains("ragtime"), "{service}");
    let _ = provider.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_does_not_hold_up_the_work() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    for protocol in [OtlpProtocol::Grpc, OtlpProtocol::HttpProtobuf] {
        let provider = tracer_provider(&Otlp {
            endpoint: format!("http://127.0.0.1:{port}"),
            protocol,
            sampling: Default::default(),
        })
        .expect("building the exporter does not connect");
        let subscriber = tracing_subscriber::registry().with(otel_layer(&provider));
        let t = Instant::now();
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..2000u64 {
                let _s = tracing::info_span!("work", i).entered();
            }
        });
        // Recording never waits for the collector: far below any stage budget.
        let per_span = t.elapsed() / 2000;
        assert!(
            per_span < Duration::from_millis(1),
            "{protocol:?}: {per_span:?} per span"
        );
        let p = provider.clone();
        let flushed = tokio::task::spawn_blocking(move || p.force_flush())
            .await
            .expect("join");
        assert!(
            flushed.is_err(),
            "{protocol:?}: export to nowhere reports an error"
        );
        let _ = provider.shutdown();
    }
}
