//! `"rerank": true` with the shared cross-encoder (tests only; real users
//! point `RAGTIME__RERANK__MODEL_DIR` at their own model).

use crate::helpers::{TestApp, error_of, ids, stage};
use serde_json::{Value, json};

/// The shared cross-encoder (`RAGTIME_TEST_RERANK_DIR`, set by `make test`
/// when `../shared/models/ce-minilm-l6` exists).
fn ce_dir() -> std::path::PathBuf {
    let dir = ragtime_testkit::need(
        "RAGTIME_TEST_RERANK_DIR",
        "the shared cross-encoder (../shared/models/ce-minilm-l6)",
    );
    std::path::PathBuf::from(dir)
}

async fn corpus(app: &TestApp) {
    let filler = "The study measured several outcomes in a cohort of adult participants over two years, \
                  adjusting for age, sex and baseline health. ";
    let docs: Vec<Value> = (0..24)
        .map(|i| {
            let topic = ["protein folding", "autophagy", "insulin signalling", "sleep and memory"][i % 4];
            json!({"id": format!("p{i}"), "title": format!("Paper {i} on {topic}"), "text": format!("This paper {i} concerns {topic}. {}", filler.repeat(6))})
        })
        .collect();
    let r = app
        .post_json("/v1/documents", json!({"documents": docs}))
        .await;
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs ../shared (the cross-encoder)"]
async fn needs_shared_rerank_runs_as_a_budgeted_stage() {
    let dir = ce_dir();
    let app = TestApp::builder()
        .real_embeddings()
        .config(|c| {
            c.rerank.model_dir = Some(dir);
            // Enough time to score all 20 candidates even on a busy machine.
            c.budgets.rerank_ms = 5_000;
            c.budgets.llm_generate_ms = 5_000;
        })
        .spawn()
        .await;
    let ready = app.wait_ready().await;
    assert_eq!(ready["checks"]["embed"]["reranker"], true);
    corpus(&app).await;
    let b = app
        .search(json!({"query": "autophagy clears misfolded proteins", "top_k": 5, "rerank": true}))
        .await;
    let stages: Vec<&str> = b["budget"]["stages"]
        .as_array()
        .map(|a| a.iter().filter_map(|s| s["stage"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(stages, ["embed", "retrieve", "rerank"]);
    assert_eq!(stage(&b, "rerank")["outcome"], "ok", "{b}");
    assert_eq!(ids(&b).len(), 5);
    assert!(
        ids(&b)
            .iter()
            .take(3)
            .any(|id| ["p1", "p5", "p9", "p13", "p17", "p21"].contains(&id.as_str())),
        "{b}"
    );
}

/// A zero rerank budget skips the stage and keeps the retrieval order.
/// (How a small budget makes the stage partial is tested exactly, on
/// paused time, in `crates/pipeline/tests/requests.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs ../shared (the cross-encoder)"]
async fn needs_shared_a_zero_rerank_budget_skips_the_stage() {
    let dir = ce_dir();
    let app = TestApp::builder()
        .config(|c| {
            c.rerank.model_dir = Some(dir);
            c.rerank.batch = 1;
            c.budgets.rerank_ms = 0;
        })
        .spawn()
        .await;
    corpus(&app).await;
    let plain = app.search(json!({"query": "insulin", "top_k": 10})).await;
    let b = app
        .search(json!({"query": "insulin", "top_k": 10, "rerank": true}))
        .await;
    assert_eq!(stage(&b, "rerank")["outcome"], "skipped");
    assert_eq!(
        ids(&b),
        ids(&plain),
        "a skipped rerank keeps the retrieval order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_without_a_model_is_a_clear_error() {
    let app = TestApp::spawn().await;
    let (s, _, f, _) = error_of(
        app.post_json("/v1/search", json!({"query": "x", "rerank": true}))
            .await,
    )
    .await;
    assert_eq!((s, f.as_deref()), (422, Some("rerank")));
}
