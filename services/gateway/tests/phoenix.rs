//! Traces in a real trace store: Arize Phoenix (PyPI `arize-phoenix`,
//! pinned, installed by `make test`) started on loopback, ragtime exporting
//! to its OTLP gRPC port at `sample_ratio = 0.1`, 500 chat requests of which
//! a tenth hang at the backend until `llm_ttft` runs out. Read back
//! through Phoenix's REST API: every degraded request is stored and about a
//! tenth of the healthy ones; no probe is; numbers are numbers (Phoenix's
//! own filter `budget.elapsed_ms > 3000` on `llm_ttft` finds exactly the
//! requests that timed out there); spans carry their OpenInference kinds;
//! the question and answer are on the root when `capture_content` is on;
//! `/metrics`' exemplars name stored traces.
//!
//! Its own test binary: it installs the process-wide subscriber.

#[path = "api/fake_llm.rs"]
#[allow(dead_code)]
mod fake_llm;
#[path = "api/helpers.rs"]
#[allow(dead_code)]
mod helpers;

use fake_llm::{Behaviour, FakeLlm};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REQUESTS: usize = 500;
const RATIO: f64 = 0.1;
const TTFT_MS: u64 = 3100;

/// Phoenix on two free loopback ports, stopped when dropped.
struct Phoenix {
    child: Child,
    http: String,
    grpc: String,
    _dir: tempfile::TempDir,
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl Phoenix {
    async fn start(pythonpath: &str) -> Phoenix {
        let dir = tempfile::tempdir().expect("tempdir");
        let (http, grpc) = (free_port(), free_port());
        let log = std::fs::File::create(dir.path().join("phoenix.log")).expect("log");
        let child = Command::new("python3")
            .args(["-m", "phoenix.server.main", "serve"])
            .env("PYTHONPATH", pythonpath)
            .env("PHOENIX_WORKING_DIR", dir.path())
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", http.to_string())
            .env("PHOENIX_GRPC_PORT", grpc.to_string())
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start phoenix (python3 -m phoenix.server.main serve)");
        let mut p = Phoenix {
            child,
            http: format!("http://127.0.0.1:{http}"),
            grpc: format!("http://127.0.0.1:{grpc}"),
            _dir: dir,
        };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Ok(r) = client.get(format!("{}/healthz", p.http)).send().await
                && r.status().is_success()
            {
                return p;
            }
            if let Ok(Some(status)) = p.child.try_wait() {
                let log =
                    std::fs::read_to_string(p._dir.path().join("phoenix.log")).unwrap_or_default();
                panic!("phoenix exited ({status}):\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "phoenix did not answer /healthz in 180 s"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Every span of the default project, through the REST API's pages.
    async fn spans(&self, client: &reqwest::Client) -> Vec<Value> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut q = vec![("limit", "1000".to_owned())];
            if let Some(c) = &cursor {
                q.push(("cursor", c.clone()));
            }
            let r = client
                .get(format!("{}/v1/projects/default/spans", self.http))
                .query(&q)
                .send()
                .await
                .expect("phoenix spans");
            if r.status() == 404 {
                return out; // no project yet: nothing arrived
            }
            assert!(r.status().is_success(), "phoenix spans: {}", r.status());
            let page: Value = r.json().await.expect("json");
            out.extend(page["data"].as_array().cloned().unwrap_or_default());
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => return out,
            }
        }
    }

    /// The trace ids of the spans Phoenix's query language finds.
    async fn query(&self, client: &reqwest::Client, condition: &str) -> BTreeSet<String> {
        let r = client
            .post(format!("{}/v1/spans", self.http))
            .header("accept", "application/json")
            .json(&json!({"queries": [{"filter": {"condition": condition}}], "limit": 100_000}))
            .send()
            .await
            .expect("phoenix query");
        assert!(r.status().is_success(), "{condition}: {}", r.status());
        // A multipart body with one JSON table per query.
        let body = r.text().await.expect("body");
        let start = body.find("\r\n\r\n").expect("a part") + 4;
        let end = body[start..]
            .find("\r\n--")
            .map_or(body.len(), |e| start + e);
        let table: Value = serde_json::from_str(&body[start..end]).expect("a JSON table");
        table["data"]
            .as_array()
            .expect("rows")
            .iter()
            .filter_map(|row| {
                row.as_object()?
                    .iter()
                    .find(|(k, _)| k.ends_with("context.trace_id"))
                    .and_then(|(_, v)| v.as_str().map(str::to_owned))
            })
            .collect()
    }
}

/// The requests that hang at the backend: a tenth of them, picked by a
/// seeded shuffle (the head sampler's share is periodic; the two must not
/// line up).
fn hanging() -> std::collections::HashSet<usize> {
    let mut order: Vec<usize> = (0..REQUESTS).collect();
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    for i in (1..order.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order.into_iter().take(REQUESTS / 10).collect()
}

struct Asked {
    request_id: String,
    hung: bool,
    degraded: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs phoenix (arize-phoenix, installed by make test: RAGTIME_TEST_PHOENIX_PYTHONPATH)"]
async fn needs_phoenix_stores_every_degraded_request_and_a_tenth_of_the_rest() {
    let pythonpath = ragtime_testkit::need(
        "RAGTIME_TEST_PHOENIX_PYTHONPATH",
        "Arize Phoenix (arize-phoenix, installed by make test)",
    );
    let phoenix = Phoenix::start(&pythonpath).await;
    let telemetry = ragtime_telemetry::init(
        ragtime_telemetry::LogFormat::Json,
        Some(&ragtime_telemetry::Otlp {
            endpoint: phoenix.grpc.clone(),
            protocol: ragtime_telemetry::OtlpProtocol::Grpc,
            sampling: ragtime_telemetry::Sampling {
                ratio: RATIO,
                buffer_spans: 50_000,
                ..Default::default()
            },
        }),
    );

    let fake = FakeLlm::start(Behaviour::StallWhenAsked {
        marker: "HANG",
        tokens: 4,
    })
    .await;
    let app = helpers::TestApp::builder()
        .llm(&fake)
        .config(|c| {
            // Every question goes to the backend.
            c.cache.enabled = false;
            c.budgets.total_ms = 6000;
            c.budgets.rerank_ms = 0;
            c.budgets.llm_ttft_ms = TTFT_MS;
            c.budgets.llm_generate_ms = 1000;
            // A backend that hangs is not a backend that is down, here:
            // no breaker, no shedding, no hedging in the way.
            c.llm.max_concurrency = 256;
            c.llm.breaker.failures = 1_000_000;
            c.llm.hedge.enabled = false;
            c.telemetry.capture_content = true;
        })
        .spawn()
        .await;
    let r = app
        .post_json(
            "/v1/documents",
            json!({"documents": [
                {"id": "mito", "title": "Mitochondria", "text": "Mitochondria produce ATP for the cell. They are the powerhouse of the cell."},
                {"id": "vaccine", "title": "Vaccines", "text": "Vaccines train the immune system to recognise a pathogen."},
            ]}),
        )
        .await;
    assert_eq!(r.status(), 200);

    // 500 questions, 16 at a time, probes in between.
    let client = app.http.clone();
    let url = app.url("/v1/chat/completions");
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(16));
    let hanging = hanging();
    let mut tasks = Vec::new();
    for i in 0..REQUESTS {
        let (client, url, sem) = (client.clone(), url.clone(), sem.clone());
        let hung = hanging.contains(&i);
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.expect("permit");
            let q = format!(
                "Question {i}: what do mitochondria produce{}?",
                if hung { " HANG" } else { "" }
            );
            let r = client
                .post(&url)
                .json(&json!({"model": "m", "messages": [{"role": "user", "content": q}]}))
                .send()
                .await
                .expect("chat");
            let request_id = r.headers()["x-request-id"].to_str().expect("id").to_owned();
            let ok = r.status() == 200;
            let body: Value = r.json().await.unwrap_or(Value::Null);
            let overran = body["budget"]["stages"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["overran"] == true));
            let degraded = !ok || !body["partial_reason"].is_null() || overran;
            if hung {
                assert_eq!(body["partial_reason"], "llm_ttft", "{body}");
            }
            Asked {
                request_id,
                hung,
                degraded,
            }
        }));
        if i % 50 == 0 {
            for probe in ["/healthz", "/readyz", "/metrics"] {
                assert!(app.get(probe).await.status().is_success(), "{probe}");
            }
        }
    }
    let mut asked = Vec::new();
    for t in tasks {
        asked.push(t.await.expect("request"));
    }
    let degraded = asked.iter().filter(|a| a.degraded).count();
    let hung = asked.iter().filter(|a| a.hung).count();
    let healthy = REQUESTS - degraded;
    eprintln!("{REQUESTS} requests: {hung} hung at the backend, {degraded} degraded in all");
    let metrics = app.get("/metrics").await.text().await.expect("metrics");

    // Everything exported, then wait until Phoenix has stored it.
    let t = &telemetry;
    tokio::task::block_in_place(|| t.flush());
    let mut spans = Vec::new();
    let mut last = usize::MAX;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        spans = phoenix.spans(&client).await;
        if spans.len() == last && !spans.is_empty() {
            break;
        }
        last = spans.len();
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let attr = |s: &Value, k: &str| s["attributes"].get(k).cloned().unwrap_or(Value::Null);
    let roots: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == "POST /v1/chat/completions")
        .collect();
    let stored: HashMap<String, &Value> = roots
        .iter()
        .map(|s| (attr(s, "request_id").as_str().unwrap_or("").to_owned(), *s))
        .collect();

    // No probe, ever.
    let names: BTreeSet<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
    for probe in ["/healthz", "/readyz", "/metrics"] {
        assert!(
            !names.iter().any(|n| n.ends_with(probe)),
            "{probe} was traced: {names:?}"
        );
    }
    // Every degraded request, and about a tenth of the healthy ones.
    let missing: Vec<&str> = asked
        .iter()
        .filter(|a| a.degraded && !stored.contains_key(&a.request_id))
        .map(|a| a.request_id.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "degraded requests not stored: {missing:?}"
    );
    let healthy_stored = asked
        .iter()
        .filter(|a| !a.degraded && stored.contains_key(&a.request_id))
        .count();
    let share = healthy_stored as f64 / healthy as f64;
    eprintln!(
        "stored: {} of {degraded} degraded, {healthy_stored} of {healthy} healthy ({:.1} %)",
        degraded - missing.len(),
        share * 100.0
    );
    assert!(
        (share - RATIO).abs() <= 0.03,
        "{healthy_stored} of {healthy} healthy requests stored ({share:.3}), not {RATIO} ± 0.03"
    );
    assert_eq!(
        roots.len(),
        degraded + healthy_stored,
        "every stored root is one of ours"
    );

    // Numbers are numbers: no attribute of any span is a number as text.
    for s in &spans {
        for (k, v) in s["attributes"].as_object().expect("attributes") {
            if let Some(text) = v.as_str() {
                assert!(
                    text.parse::<f64>().is_err(),
                    "{}: {k} is the text {text:?}, not a number",
                    s["name"]
                );
            }
        }
    }
    let by_trace = |trace: &str| -> Vec<&Value> {
        spans
            .iter()
            .filter(|s| s["context"]["trace_id"] == trace)
            .collect()
    };
    let a_hung = asked.iter().find(|a| a.hung).expect("a hung request");
    let root = stored[&a_hung.request_id];
    let trace = root["context"]["trace_id"].as_str().expect("trace id");
    let ttft = by_trace(trace)
        .into_iter()
        .find(|s| s["name"] == "llm_ttft")
        .expect("llm_ttft span");
    for k in ["budget.ms", "budget.elapsed_ms", "budget.remaining_ms"] {
        assert!(attr(ttft, k).is_i64(), "{k}: {}", attr(ttft, k));
    }
    assert!(attr(root, "http.response.status_code").is_i64());
    assert_eq!(attr(root, "ragtime.partial"), json!(true));
    assert!(
        ttft["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["name"] == "budget.overrun")),
        "the overrun event: {ttft}"
    );
    // Phoenix's own query: llm_ttft over 3 s is exactly the hung requests.
    let slow = phoenix
        .query(&client, "name == 'llm_ttft' and budget.elapsed_ms > 3000")
        .await;
    let hung_traces: BTreeSet<String> = asked
        .iter()
        .filter(|a| a.hung)
        .map(|a| {
            stored[&a.request_id]["context"]["trace_id"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(slow, hung_traces, "llm_ttft > 3000 ms");
    assert_eq!(slow.len(), hung);

    // OpenInference kinds, for LLM-specific stores.
    let kinds: HashMap<String, String> = by_trace(trace)
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or("").to_owned(),
                s["span_kind"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    for (name, kind) in [
        ("POST /v1/chat/completions", "CHAIN"),
        ("embed", "EMBEDDING"),
        ("retrieve", "RETRIEVER"),
        ("dense", "RETRIEVER"),
        ("rerank", "RERANKER"),
        ("llm.request", "LLM"),
    ] {
        assert_eq!(
            kinds.get(name).map(String::as_str),
            Some(kind),
            "{name}: {kinds:?}"
        );
    }
    // capture_content: the question and the answer on the root.
    assert!(
        attr(root, "input.value")
            .as_str()
            .is_some_and(|q| q.contains("HANG")),
        "{root}"
    );
    assert!(
        attr(root, "output.value")
            .as_str()
            .is_some_and(|a| !a.is_empty())
    );

    // Exemplars: each names a stored trace.
    let traces: BTreeSet<&str> = spans
        .iter()
        .filter_map(|s| s["context"]["trace_id"].as_str())
        .collect();
    let exemplars: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("ragtime_stage_duration_seconds_bucket")
                || l.starts_with("ragtime_llm_ttft_seconds_bucket")
        })
        .filter_map(|l| l.split("# {trace_id=\"").nth(1)?.split('"').next())
        .collect();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("ragtime_llm_ttft_seconds_bucket") && l.contains("# {trace_id=")),
        "no exemplar on the TTFT histogram"
    );
    assert!(exemplars.len() >= 5, "{exemplars:?}");
    for e in &exemplars {
        assert!(traces.contains(e), "exemplar {e} is not a stored trace");
    }
    // The sampler's counters.
    let counter = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0)
    };
    assert!(counter("ragtime_traces_kept_degraded_total") >= 1.0);
    assert!(counter("ragtime_traces_sampled_out_total") >= (healthy - healthy_stored) as f64 - 1.0);
    assert_eq!(counter("ragtime_trace_spans_dropped_total"), 0.0);

    app.shutdown().await.expect("shutdown");
    telemetry.shutdown();
}
