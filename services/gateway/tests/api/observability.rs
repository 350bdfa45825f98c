//! `/metrics` moves with traffic, every response carries `Server-Timing`,
//! and `/admin/stats` gives live stage percentiles to the admin only.

use crate::fake_llm::{Behaviour, FakeLlm};
use crate::helpers::{ADMIN_KEY as KEY, TestApp, error_of};
use serde_json::{Value, json};
use std::time::Duration;

async fn scrape(app: &TestApp) -> String {
    let r = app
        .http
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("application/openmetrics-text"))
    );
    r.text().await.expect("text")
}

/// The value of one sample line (`name{labels} value`), 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_traffic_and_stats_are_for_the_admin() {
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 5,
        gap: Duration::from_millis(5),
    })
    .await;
    // The same question twice must hit the cache: real embeddings.
    let app = TestApp::builder()
        .real_embeddings()
        .unhurried()
        .llm(&fake)
        .admin()
        .config(|c| c.budgets.rerank_ms = 0)
        .spawn()
        .await;
    let r = app
        .post_json(
            "/v1/documents",
            json!({"documents": [{"id": "mito", "title": "Mitochondria", "text": "Mitochondria produce ATP for the cell."}]}),
        )
        .await;
    assert_eq!(r.status(), 200);

    let retrieve_ok = "ragtime_stage_duration_seconds_count{stage=\"retrieve\",outcome=\"ok\"}";
    let before = scrape(&app).await;
    let r = app.post_json("/v1/search", json!({"query": "ATP"})).await;
    assert_eq!(r.status(), 200);
    let ask = json!({"model": "m", "messages": [{"role": "user", "content": "What do mitochondria produce for the cell?"}]});
    let r = app.post_json("/v1/chat/completions", ask.clone()).await;
    assert_eq!(r.status(), 200);
    let r = app.post_json("/v1/chat/completions", ask).await;
    assert_eq!(r.status(), 200);
    let b: Value = r.json().await.expect("json");
    assert_eq!(b["cached"], true);
    let after = scrape(&app).await;
    assert!(after.contains("# TYPE ragtime_stage_duration_seconds histogram"));
    assert!(after.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");

    let moved = |series: &str| sample(&after, series) - sample(&before, series);
    assert_eq!(moved(retrieve_ok), 2.0, "search + one uncached chat");
    assert_eq!(
        moved("ragtime_stage_duration_seconds_count{stage=\"llm_ttft\",outcome=\"ok\"}"),
        1.0
    );
    assert_eq!(moved("ragtime_llm_ttft_seconds_count"), 1.0);
    assert_eq!(
        moved("ragtime_llm_time_per_output_token_seconds_count"),
        1.0
    );
    assert!(
        moved("ragtime_stage_duration_seconds_sum{stage=\"llm_generate\",outcome=\"ok\"}") > 0.0,
        "{after}"
    );
    assert_eq!(
        moved("ragtime_http_requests_total{route=\"/v1/search\",status=\"200\"}"),
        1.0
    );
    assert_eq!(moved("ragtime_cache_lookups_total{result=\"hit\"}"), 1.0);
    assert_eq!(moved("ragtime_cache_lookups_total{result=\"miss\"}"), 1.0);
    assert_eq!(sample(&after, "ragtime_cache_hit_ratio"), 0.5);
    assert_eq!(
        sample(&after, "ragtime_http_requests_in_flight"),
        1.0,
        "the scrape itself"
    );
    assert_eq!(sample(&after, "ragtime_llm_requests_in_flight"), 0.0);

    // Server-Timing on every response, errors and plain routes too.
    for path in ["/healthz", "/v1/models", "/nope"] {
        let r = app.http.get(app.url(path)).send().await.expect("get");
        assert!(r.headers().contains_key("server-timing"), "{path}");
    }

    // Live stage statistics, for the admin only.
    let r = app
        .http
        .get(app.url("/admin/stats"))
        .send()
        .await
        .expect("get");
    assert!(r.headers().contains_key("www-authenticate"));
    assert_eq!(error_of(r).await.0, 401);
    let r = app
        .http
        .get(app.url("/admin/stats"))
        .bearer_auth("not-the-key-at-all-no")
        .send()
        .await
        .expect("get");
    assert_eq!(error_of(r).await.0, 403);
    let r = app
        .http
        .get(app.url("/admin/stats"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 200);
    let s: Value = r.json().await.expect("json");
    let retrieve = &s["stages"]["retrieve"];
    assert_eq!(retrieve["count"], 2, "{s}");
    assert!(
        retrieve["p50_ms"].is_number() && retrieve["p99_ms"].is_number(),
        "{s}"
    );
    assert!(retrieve["budget_ms"].as_u64().is_some_and(|b| b > 0));
    assert_eq!(
        s["stages"]["rerank"]["count"], 0,
        "skipped stages are not samples"
    );
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_key_the_admin_api_is_off_and_says_so() {
    let app = TestApp::spawn().await;
    let r = app
        .http
        .get(app.url("/admin/stats"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("get");
    let (status, code, _, body) = error_of(r).await;
    assert_eq!((status, code.as_str()), (404, "not_found"));
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("RAGTIME__ADMIN_KEY"))
    );
    app.shutdown().await.expect("shutdown");
}
