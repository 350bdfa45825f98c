//! `"rerank": true` with the shared cross-encoder (tests only; real users
//! point `RAGTIME__RERANK__MODEL_DIR` at their own model).

use crate::helpers::{TestApp, error_of, ids, spawn_app, spawn_app_with};
use serde_json::{Value, json};

/// The shared cross-encoder (`RAGTIME_TEST_RERANK_DIR`, set by `make test`
/// when `../shared/models/ce-minilm-l6` exists); `None` says the test did not run.
fn ce_dir() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("RAGTIME_TEST_RERANK_DIR").map(std::path::PathBuf::from);
    if dir.is_none() {
        eprintln!("RAGTIME_TEST_RERANK_DIR is not set: reranking test did not run");
    }
    dir
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

async fn search(app: &TestApp, body: Value) -> Value {
    let r = app.post_json("/v1/search", body).await;
    assert_eq!(r.status(), 200);
    r.json().await.expect("json")
}

fn stage<'a>(b: &'a Value, name: &str) -> &'a Value {
    b["budget"]["stages"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["stage"] == name))
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_runs_as_a_budgeted_stage_and_can_be_skipped() {
    let Some(dir) = ce_dir() else { return };
    let app = spawn_app_with(|c| {
        c.rerank.model_dir = Some(dir);
        // Enough time to score all 20 candidates even on a busy machine.
        c.budgets.rerank_ms = 5_000;
        c.budgets.llm_generate_ms = 5_000;
    })
    .await;
    let ready = app.wait_ready().await;
    assert_eq!(ready["checks"]["embed"]["reranker"], true);
    corpus(&app).await;
    let b = search(
        &app,
        json!({"query": "autophagy clears misfolded proteins", "top_k": 5, "rerank": true}),
    )
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_rerank_budget_skips_and_a_small_one_is_partial() {
    let Some(dir) = ce_dir() else { return };
    let dir2 = dir.clone();
    let app = spawn_app_with(|c| {
        c.rerank.model_dir = Some(dir);
        c.rerank.batch = 1;
        c.budgets.rerank_ms = 0;
    })
    .await;
    app.wait_ready().await;
    corpus(&app).await;
    let plain = search(&app, json!({"query": "insulin", "top_k": 10})).await;
    let b = search(
        &app,
        json!({"query": "insulin", "top_k": 10, "rerank": true}),
    )
    .await;
    assert_eq!(stage(&b, "rerank")["outcome"], "skipped");
    assert_eq!(
        ids(&b),
        ids(&plain),
        "a skipped rerank keeps the retrieval order"
    );
    drop(app);

    // A budget that fits some of the 20 pairs but not all: how much that is
    // depends on the machine and its load, so the per-request budget (which
    // scales the rerank stage with it) grows until the stage is partial.
    let app = spawn_app_with(|c| {
        c.rerank.model_dir = Some(dir2);
        c.rerank.batch = 1;
        c.budgets.rerank_ms = 2000;
        c.budgets.llm_generate_ms = 8000;
    })
    .await;
    app.wait_ready().await;
    corpus(&app).await;
    let mut seen = Vec::new();
    for budget_ms in [450u64, 900, 1800, 3600, 7200] {
        // rerank gets 2000 · budget_ms / 15000: 60, 120, 240, 480, 960 ms.
        let b = search(
            &app,
            json!({"query": "protein folding", "top_k": 10, "rerank": true, "budget_ms": budget_ms}),
        )
        .await;
        let r = stage(&b, "rerank").clone();
        let outcome = r["outcome"].as_str().unwrap_or_default().to_owned();
        if b["results"].as_array().is_none_or(Vec::is_empty) {
            // On a loaded machine the scaled-down embed and retrieve budgets
            // can leave nothing to rerank: no evidence either way.
            seen.push((budget_ms, json!("nothing retrieved")));
            continue;
        }
        assert_ne!(
            outcome, "ok",
            "all 20 scored where less time scored none: {seen:?} {b}"
        );
        if outcome == "partial" {
            // "… scored k of n": some, not all, of the candidates (n is 20,
            // or fewer when a tight budget left retrieval lexical-only).
            let detail = r["detail"].as_str().unwrap_or_default();
            let counts: Vec<usize> = detail
                .rsplit("scored ")
                .next()
                .unwrap_or_default()
                .split(" of ")
                .filter_map(|n| n.trim().parse().ok())
                .collect();
            assert!(
                matches!(counts[..], [k, n] if 0 < k && k < n && n >= 10),
                "{r}"
            );
            assert_eq!(b["partial"], true);
            assert_eq!(ids(&b).len(), 10);
            return;
        }
        assert_eq!(outcome, "timeout", "{b}");
        seen.push((budget_ms, r));
    }
    panic!("the rerank stage was never partial: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_without_a_model_is_a_clear_error() {
    let app = spawn_app().await;
    app.wait_ready().await;
    let (s, _, f, _) = error_of(
        app.post_json("/v1/search", json!({"query": "x", "rerank": true}))
            .await,
    )
    .await;
    assert_eq!((s, f.as_deref()), (422, Some("rerank")));
}
