//! The LLM path under load, through HTTP: the first chunk carries the
//! sources; a client that goes away stops its generation at once; a
//! request that cannot wait for a slot is answered at once without the
//! LLM; a full queue is a 503 with `Retry-After`.

use crate::fake_llm::{Behaviour, FakeLlm};
use crate::helpers::{TestApp, error_of};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

async fn app(fake: &FakeLlm, slots: usize, max_queue: usize) -> TestApp {
    let app = TestApp::builder()
        .llm(fake)
        .config(move |c| {
            c.llm.max_concurrency = slots;
            c.llm.max_queue = max_queue;
            c.cache.enabled = false;
            c.budgets.rerank_ms = 0;
        })
        .spawn()
        .await;
    app.ingest(json!({"documents": [
        {"id": "mito", "title": "Mitochondria", "text": "Mitochondria produce ATP for the cell."},
        {"id": "vaccine", "title": "Vaccines", "text": "Vaccines train the immune system."},
    ]}))
    .await;
    app
}

fn ask(q: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": q}]})
}

/// Opens a streamed chat and reads until its first text chunk; returns
/// the response (still open) and the chunks read.
async fn open_stream(app: &TestApp, q: &str) -> (reqwest::Response, Vec<Value>) {
    let mut body = ask(q);
    body["stream"] = json!(true);
    let mut r = app.post_json("/v1/chat/completions", body).await;
    assert_eq!(r.status(), 200);
    let (mut buf, mut chunks) = (String::new(), Vec::new());
    while chunks.len() < 2 {
        let bytes = r.chunk().await.expect("chunk").expect("more");
        buf.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(i) = buf.find("\n\n") {
            let frame: String = buf.drain(..i + 2).collect();
            if let Some(d) = frame.trim().strip_prefix("data: ") {
                chunks.push(serde_json::from_str(d).expect("json"));
            }
        }
    }
    (r, chunks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_chunk_carries_the_sources_before_the_answer() {
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 3,
        gap: Duration::from_millis(5),
    })
    .await;
    let app = app(&fake, 2, 8).await;
    let s = app.chat_stream(ask("What do mitochondria produce?")).await;
    assert!(s.done);
    let first = &s.chunks[0];
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let sources = first["sources"].as_array().cloned().unwrap_or_default();
    assert!(!sources.is_empty(), "{first}");
    assert!(
        sources.iter().any(|c| c["document_id"] == "mito"),
        "{first}"
    );
    let last = &s.chunks[s.chunks.len() - 1];
    let cited = last["citations"].as_array().cloned().unwrap_or_default();
    assert!(
        cited
            .iter()
            .all(|c| sources.iter().any(|x| x["chunk_id"] == c["chunk_id"])),
        "the answer cites what the first chunk announced: {first} {last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_stops_its_generation_at_once() {
    // The backend streams three tokens, then nothing for a minute.
    let fake = FakeLlm::start(Behaviour::StallAfter { tokens: 3 }).await;
    let app = app(&fake, 2, 8).await;
    let (r, chunks) = open_stream(&app, "What do mitochondria produce?").await;
    assert!(chunks.len() >= 2);
    let t = Instant::now();
    drop(r);
    assert_eq!(
        fake.hung_up(1).await,
        1,
        "the backend request was cancelled"
    );
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_wait_is_answered_at_once_and_a_full_queue_is_a_503() {
    // One slot, held by a long answer.
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 200,
        gap: Duration::from_millis(50),
    })
    .await;
    let app = app(&fake, 1, 0).await;
    let (held, _) = open_stream(&app, "What do mitochondria produce?").await;
    // No queue at all: refused before the answer starts.
    let t = Instant::now();
    let r = app
        .post_json("/v1/chat/completions", ask("How do vaccines work?"))
        .await;
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (status, code, _, _) = error_of(r).await;
    assert_eq!((status, code.as_str()), (503, "overloaded"));
    assert!(retry.is_some_and(|s| s >= 1), "{retry:?}");
    assert!(t.elapsed() < Duration::from_millis(500));
    drop(held);
    drop(app);

    // A queue, but a first-token allotment shorter than the expected wait:
    // an extractive answer at once, marked `overload`.
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 200,
        gap: Duration::from_millis(50),
    })
    .await;
    let app = TestApp::builder()
        .llm(&fake)
        .config(|c| {
            c.llm.max_concurrency = 1;
            c.llm.max_queue = 8;
            c.cache.enabled = false;
            c.budgets.llm_ttft_ms = 800;
        })
        .spawn()
        .await;
    app.ingest(json!({"documents": [{"id": "vaccine", "title": "Vaccines", "text": "Vaccines train the immune system."}]}))
        .await;
    let (held, _) = open_stream(&app, "How do vaccines work?").await;
    let t = Instant::now();
    let b = app
        .chat(ask("How do vaccines train the immune system?"))
        .await;
    let elapsed = t.elapsed();
    assert_eq!(b["partial_reason"], "overload", "{b}");
    assert!(
        elapsed < Duration::from_millis(500),
        "shed at once: {elapsed:?}"
    );
    let ttft = b["budget"]["stages"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["stage"] == "llm_ttft").cloned())
        .unwrap_or_default();
    assert_eq!(ttft["outcome"], "skipped");
    assert!(
        ttft["detail"].as_str().is_some_and(|d| d.contains("shed")),
        "{ttft}"
    );
    assert_eq!(b["citations"][0]["document_id"], "vaccine");
    drop(held);
}
