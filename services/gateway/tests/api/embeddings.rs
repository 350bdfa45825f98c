use crate::helpers::{TestApp, error_of};
use serde_json::json;

/// Little-endian f32s from standard base64, as OpenAI clients decode them.
fn decode_b64(s: &str) -> Vec<f32> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64");
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_run_under_the_budget_engine_and_report_it() {
    let app = TestApp::builder().real_embeddings().spawn().await;
    let r = app
        .http
        .post(app.url("/v1/embeddings"))
        .header("x-request-id", "test-req-42")
        .json(&json!({"input": ["the cat sat on the mat", "a feline rested on the rug", "quarterly revenue grew"]}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-request-id"],
        "test-req-42",
        "request ids are propagated"
    );
    let timing = r.headers()["server-timing"]
        .to_str()
        .unwrap_or_default()
        .to_owned();
    assert!(timing.starts_with("embed;desc=\"ok\";dur="), "{timing}");
    let body: serde_json::Value = r.json().await.expect("json");
    let data = body["data"].as_array().cloned().unwrap_or_default();
    assert_eq!(data.len(), 3);
    let vecs: Vec<Vec<f32>> = data
        .iter()
        .map(|d| {
            d["embedding"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_f64())
                        .map(|x| x as f32)
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect();
    assert!(vecs.iter().all(|v| v.len() == 384));
    let cos = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    assert!(cos(&vecs[0], &vecs[1]) > cos(&vecs[0], &vecs[2]) + 0.2);

    let budget = &body["budget"];
    assert_eq!(budget["total_ms"], 15_000, "the configured default total");
    assert_eq!(budget["stages"][0]["stage"], "embed");
    assert_eq!(budget["stages"][0]["outcome"], "ok");
    assert!(budget["stages"][0]["budget_ms"].as_u64().unwrap_or(0) > 14_000);

    // base64, as the official OpenAI client asks by default.
    let r = app
        .post_json(
            "/v1/embeddings",
            json!({"input": "the cat sat on the mat", "encoding_format": "base64"}),
        )
        .await;
    let body: serde_json::Value = r.json().await.expect("json");
    let v = decode_b64(body["data"][0]["embedding"].as_str().unwrap_or_default());
    assert_eq!(v.len(), 384);
    assert!((cos(&v, &vecs[0]) - 1.0).abs() < 1e-5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_budget_is_a_503_with_the_budget_story_not_a_hang() {
    let app = TestApp::builder().real_embeddings().spawn().await;
    let texts: Vec<String> = (0..1024)
        .map(|i| format!("passage number {i} about protein folding and chaperones"))
        .collect();
    let t0 = std::time::Instant::now();
    let r = app
        .post_json("/v1/embeddings", json!({"input": texts, "budget_ms": 5}))
        .await;
    let elapsed = t0.elapsed();
    let (status, code, _, body) = error_of(r).await;
    assert_eq!((status, code.as_str()), (503, "budget_exceeded"), "{body}");
    assert_eq!(body["budget"]["total_ms"], 5);
    assert_eq!(body["budget"]["stages"][0]["outcome"], "timeout");
    // Embedding 1024 texts takes seconds; the answer comes at the deadline.
    assert!(
        elapsed < std::time::Duration::from_millis(1500),
        "{elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_budgets_are_what_requests_get() {
    let app = TestApp::builder()
        .config(|c| c.budgets = ragtime_pipeline::BudgetProfile::gpu())
        .spawn()
        .await;
    // A request may tighten the total but never loosen it.
    for (asked, got) in [(None, 3_000), (Some(60_000), 3_000), (Some(2_000), 2_000)] {
        let r = app
            .post_json(
                "/v1/embeddings",
                json!({"input": "hello", "budget_ms": asked}),
            )
            .await;
        let body: serde_json::Value = r.json().await.expect("json");
        assert_eq!(body["budget"]["total_ms"], got, "budget_ms {asked:?}");
    }
}
