//! A write that committed is never reported as failed: with the store's
//! reads failing right after its commit (its `fail` points, as a database
//! gone away at that moment would), an ingest is still acknowledged with
//! what it wrote, and what it wrote is there once the store answers again.
//! Alone in its own test process: fail points are the process's.

#[path = "api/fake_llm.rs"]
#[allow(dead_code)]
mod fake_llm;
#[path = "api/helpers.rs"]
#[allow(dead_code)]
mod helpers;

use helpers::{TestApp, ids};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const READS_AFTER_A_COMMIT: [&str; 1] = ["store::corpus_version"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_ingests_and_jobs_are_acknowledged_though_the_reads_after_them_fail() {
    let scenario = fail::FailScenario::setup();
    let app = TestApp::spawn().await;
    let kept =
        json!({"id": "kept", "text": "Basalt forms when lava cools quickly at the surface."});
    app.ingest(json!({"collection": "rocks", "documents": [kept.clone()]}))
        .await;

    for point in READS_AFTER_A_COMMIT {
        fail::cfg(point, "return").expect("fail point");
    }
    // One document new (its commit then the corpus version read), one
    // unchanged (read back after the commit).
    let r = app
        .post_json(
            "/v1/documents",
            json!({"collection": "rocks", "documents": [
                kept,
                {"id": "new", "text": "Granite cools slowly from magma deep underground."}
            ]}),
        )
        .await;
    let status = r.status();
    let body: Value = r.json().await.expect("json");
    for point in READS_AFTER_A_COMMIT {
        fail::remove(point);
    }
    assert_eq!(
        status, 200,
        "a committed write reported as {status}: {body}"
    );
    let statuses: Vec<(&str, &str)> = body["documents"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|d| {
            (
                d["id"].as_str().unwrap_or(""),
                d["status"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        statuses,
        [("kept", "unchanged"), ("new", "created")],
        "{body}"
    );

    // What it wrote is there, in the store and in the indexes.
    let found = app
        .search(
            json!({"collection": "rocks", "query": "granite magma", "mode": "lexical", "top_k": 5}),
        )
        .await;
    assert_eq!(ids(&found), ["new"], "{found}");
    let doc = app.get("/v1/documents/new?collection=rocks").await;
    assert_eq!(doc.status(), 200);

    // A job's batches commit as the same writes do: it ends done.
    for point in READS_AFTER_A_COMMIT {
        fail::cfg(point, "return").expect("fail point");
    }
    let r = app
        .post_json(
            "/v1/documents",
            json!({"collection": "rocks", "async": true, "documents": [
                {"id": "job", "text": "Pumice is so full of gas bubbles that it floats."}
            ]}),
        )
        .await;
    assert_eq!(r.status(), 202);
    let job: Value = r.json().await.expect("json");
    let id = job["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{job}"))
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let ended = loop {
        let j: Value = app
            .get(&format!("/v1/jobs/{id}"))
            .await
            .json()
            .await
            .expect("json");
        if !matches!(j["status"].as_str(), Some("queued" | "running")) {
            break j;
        }
        assert!(Instant::now() < deadline, "the job never ended: {j}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for point in READS_AFTER_A_COMMIT {
        fail::remove(point);
    }
    assert_eq!(ended["status"], "done", "{ended}");
    let found = app
        .search(
            json!({"collection": "rocks", "query": "pumice floats", "mode": "lexical", "top_k": 5}),
        )
        .await;
    assert_eq!(ids(&found), ["job"], "{found}");
    app.shutdown().await.expect("shutdown");
    scenario.teardown();
}
