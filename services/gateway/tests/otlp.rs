//! Spans over OTLP, received by a real OTLP trace service (the one generated
//! in `opentelemetry-proto`, served with tonic) inside the test: one trace
//! per request continuing the caller's `traceparent`, the stage spans with
//! their budget attributes under the request span, dense and lexical under
//! `retrieve`, the LLM call as a client span whose context reaches the
//! backend, and the overrun event on a forced overrun.
//!
//! Its own test binary: it installs the process-wide subscriber.

#[path = "api/fake_llm.rs"]
#[allow(dead_code)]
mod fake_llm;
#[path = "api/helpers.rs"]
#[allow(dead_code)]
mod helpers;

use fake_llm::{Behaviour, FakeLlm};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default, Clone)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
    services: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for rs in req.into_inner().resource_spans {
            if let Some(r) = &rs.resource
                && let Some(name) = attr(&r.attributes, "service.name")
            {
                self.services.lock().expect("lock").push(name);
            }
            for ss in rs.scope_spans {
                self.spans.lock().expect("lock").extend(ss.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Whether attribute `key` was exported as an integer.
fn is_int(attrs: &[KeyValue], key: &str) -> bool {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
        .is_some_and(|v| matches!(v, Any::IntValue(_)))
}

fn attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    let v = attrs
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match v {
        Any::StringValue(s) => s.clone(),
        Any::IntValue(i) => i.to_string(),
        Any::BoolValue(b) => b.to_string(),
        Any::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_one_trace_that_tells_its_budget_story() {
    // The collector.
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(receiver.clone()))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(server);

    // Logs at WARN only: what is logged never decides what is traced.
    let telemetry = ragtime_telemetry::init_with_log_filter(
        ragtime_telemetry::LogFormat::Json,
        Some(&ragtime_telemetry::Otlp {
            endpoint: format!("http://127.0.0.1:{port}"),
            protocol: ragtime_telemetry::OtlpProtocol::Grpc,
            sampling: Default::default(),
        }),
        ragtime_telemetry::EnvFilter::new("warn"),
    );

    // Generation stalls after three tokens: llm_generate overruns.
    let fake = FakeLlm::start(Behaviour::StallAfter { tokens: 3 }).await;
    let app = helpers::TestApp::builder()
        .llm(&fake)
        .config(|c| {
            c.budgets.total_ms = 3000;
            c.budgets.rerank_ms = 0;
            c.budgets.llm_ttft_ms = 600;
            c.budgets.llm_generate_ms = 500;
        })
        .spawn()
        .await;
    let r = app
        .post_json(
            "/v1/documents",
            json!({"documents": [
                {"id": "mito", "title": "Mitochondria", "text": "Mitochondria produce ATP for the cell."},
                {"id": "vaccine", "title": "Vaccines", "text": "Vaccines train the immune system."},
            ]}),
        )
        .await;
    assert_eq!(r.status(), 200);

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let r = app
        .http
        .post(app.url("/v1/chat/completions"))
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "What do mitochondria produce?"}]}))
        .send()
        .await
        .expect("chat");
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["partial_reason"], "llm_generate", "{body}");
    let r = app
        .post_json("/v1/search", json!({"query": "immune system"}))
        .await;
    assert_eq!(r.status(), 200);
    // Probes and scrapes: answered, never traced.
    for probe in ["/healthz", "/readyz", "/metrics"] {
        let r = app.get(probe).await;
        assert!(r.status().is_success(), "{probe}: {}", r.status());
    }

    // Flush, then wait for the spans of both requests.
    let all = {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let t = &telemetry;
            tokio::task::block_in_place(|| t.flush());
            let spans = receiver.spans.lock().expect("lock").clone();
            let roots = spans
                .iter()
                .filter(|s| s.name == "POST /v1/chat/completions" || s.name == "POST /v1/search")
                .count();
            if roots >= 2 || std::time::Instant::now() > deadline {
                break spans;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let names: Vec<String> = all.iter().map(|s| s.name.clone()).collect();
    eprintln!("{} spans: {names:?}", all.len());
    assert!(
        !names.iter().any(|n| ["/healthz", "/readyz", "/metrics"]
            .iter()
            .any(|p| n.ends_with(p))),
        "a probe was traced: {names:?}"
    );
    assert!(
        receiver
            .services
            .lock()
            .expect("lock")
            .iter()
            .all(|s| s == "ragtime"),
        "service.name"
    );

    // The chat request: one trace, the caller's.
    let chat: Vec<&Span> = all
        .iter()
        .filter(|s| hex(&s.trace_id) == trace_id)
        .collect();
    let find = |name: &str| {
        chat.iter()
            .find(|s| s.name == name)
            .copied()
            .unwrap_or_else(|| panic!("no {name} span in {names:?}"))
    };
    let root = find("POST /v1/chat/completions");
    assert!(
        is_int(&root.attributes, "http.response.status_code"),
        "{:?}",
        root.attributes
    );
    // The trace as text (what Jaeger shows), for the record.
    let mut lines: Vec<(u64, String)> = chat
        .iter()
        .map(|s| {
            let budget: Vec<String> = [
                "budget.ms",
                "budget.elapsed_ms",
                "budget.remaining_ms",
                "budget.outcome",
            ]
            .iter()
            .filter_map(|k| attr(&s.attributes, k).map(|v| format!("{k}={v}")))
            .collect();
            let events: Vec<&str> = s.events.iter().map(|e| e.name.as_str()).collect();
            (
                s.start_time_unix_nano,
                format!(
                    "{:<28} {:>7.1} ms  {} {}",
                    s.name,
                    (s.end_time_unix_nano - s.start_time_unix_nano) as f64 / 1e6,
                    budget.join(" "),
                    if events.is_empty() {
                        String::new()
                    } else {
                        format!("events={events:?}")
                    }
                ),
            )
        })
        .collect();
    lines.sort();
    eprintln!("trace {trace_id}:");
    for (_, l) in &lines {
        eprintln!("  {l}");
    }
    assert_eq!(
        hex(&root.parent_span_id),
        caller_span,
        "the incoming traceparent is honoured"
    );
    assert_eq!(
        attr(&root.attributes, "http.route").as_deref(),
        Some("/v1/chat/completions")
    );
    assert_eq!(
        attr(&root.attributes, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(
        attr(&root.attributes, "ragtime.partial").as_deref(),
        Some("true")
    );
    assert_eq!(
        attr(&root.attributes, "ragtime.partial_reason").as_deref(),
        Some("llm_generate")
    );
    assert!(attr(&root.attributes, "tenant").is_some());
    // No user content on a span unless telemetry.capture_content says so.
    for k in ["input.value", "output.value"] {
        assert!(attr(&root.attributes, k).is_none(), "{k} on the root");
    }
    // OpenInference span kinds, for LLM-specific stores (Phoenix).
    for (name, kind) in [
        ("POST /v1/chat/completions", "CHAIN"),
        ("embed", "EMBEDDING"),
        ("retrieve", "RETRIEVER"),
        ("dense", "RETRIEVER"),
        ("lexical", "RETRIEVER"),
        ("rerank", "RERANKER"),
        ("llm_ttft", "CHAIN"),
        ("llm.request", "LLM"),
    ] {
        assert_eq!(
            attr(&find(name).attributes, "openinference.span.kind").as_deref(),
            Some(kind),
            "{name}"
        );
    }
    // The one log line of an overrun, on the request's span.
    assert!(
        root.events
            .iter()
            .any(|e| e.name == "request overran its budget"
                && attr(&e.attributes, "stage").as_deref() == Some("llm_generate")),
        "{:?}",
        root.events
    );
    for stage in [
        "embed",
        "cache",
        "retrieve",
        "rerank",
        "llm_ttft",
        "llm_generate",
    ] {
        let s = find(stage);
        assert_eq!(
            s.parent_span_id, root.span_id,
            "{stage} is a child of the request"
        );
        for a in [
            "budget.ms",
            "budget.elapsed_ms",
            "budget.remaining_ms",
            "budget.outcome",
        ] {
            assert!(
                attr(&s.attributes, a).is_some(),
                "{stage} lacks {a}: {:?}",
                s.attributes
            );
        }
        // Numbers are numbers: a store can filter "elapsed over 3000".
        for a in ["budget.ms", "budget.elapsed_ms", "budget.remaining_ms"] {
            assert!(is_int(&s.attributes, a), "{stage}: {a} is not an int");
        }
    }
    assert_eq!(
        attr(&find("rerank").attributes, "budget.outcome").as_deref(),
        Some("skipped")
    );
    let retrieve = find("retrieve");
    for side in ["dense", "lexical"] {
        assert_eq!(
            find(side).parent_span_id,
            retrieve.span_id,
            "{side} under retrieve"
        );
    }
    let generate = find("llm_generate");
    assert_eq!(
        attr(&generate.attributes, "budget.outcome").as_deref(),
        Some("partial")
    );
    assert!(
        generate.events.iter().any(|e| e.name == "budget.overrun"),
        "the overrun event: {:?}",
        generate.events
    );
    assert!(
        find("llm_ttft")
            .events
            .iter()
            .all(|e| e.name != "budget.overrun"),
        "no overrun where none happened"
    );
    // The LLM call is a client span, and the backend got its context.
    let call = find("llm.request");
    assert_eq!(call.parent_span_id, find("llm_ttft").span_id);
    assert_eq!(call.kind, 3, "SPAN_KIND_CLIENT");
    // GenAI conventions: what the call produced, as ints; it was cut by
    // the budget after three tokens.
    assert_eq!(
        attr(&call.attributes, "gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert!(
        is_int(&call.attributes, "gen_ai.usage.output_tokens"),
        "{:?}",
        call.attributes
    );
    assert_eq!(
        attr(&call.attributes, "gen_ai.usage.output_tokens").as_deref(),
        Some("3")
    );
    assert_eq!(
        attr(&call.attributes, "gen_ai.response.finish_reasons").as_deref(),
        Some("length")
    );
    assert!(is_int(&call.attributes, "gen_ai.request.max_tokens"));
    let sent = fake.seen()[0].traceparent.clone().unwrap_or_default();
    assert_eq!(sent, format!("00-{trace_id}-{}-01", hex(&call.span_id)));

    // The search request: its own trace with its own stages.
    let search_root = all
        .iter()
        .find(|s| s.name == "POST /v1/search")
        .expect("search root span");
    assert!(search_root.parent_span_id.is_empty(), "a new trace");
    for stage in ["embed", "retrieve"] {
        assert!(
            all.iter().any(|s| s.name == stage
                && s.trace_id == search_root.trace_id
                && s.parent_span_id == search_root.span_id),
            "search {stage}"
        );
    }
    app.shutdown().await.expect("shutdown");
    telemetry.shutdown();
}
