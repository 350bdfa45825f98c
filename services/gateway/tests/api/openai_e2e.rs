//! End to end: the official `openai` Python client (pinned, installed from
//! PyPI by `make test`) asks a question against the real local
//! llama-server with SmolLM2, streamed and not, and the citations point at
//! the ingested documents.

use crate::helpers::TestApp;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the openai Python client (RAGTIME_TEST_PYTHONPATH)"]
async fn needs_openai_client_streams_an_answer_with_citations() {
    let pythonpath = ragtime_testkit::need(
        "RAGTIME_TEST_PYTHONPATH",
        "the official openai Python client (installed by make test)",
    );
    let app = TestApp::builder()
        .real_embeddings()
        .local_llm()
        .spawn()
        .await;
    let ids = ["mito", "vaccine", "market", "photo"];
    let r = app
        .post_json(
            "/v1/documents",
            json!({"collection": "e2e", "documents": [
                {"id": "mito", "title": "Mitochondria", "text": "Mitochondria are the powerhouse of the cell. They produce ATP through oxidative phosphorylation."},
                {"id": "vaccine", "title": "Vaccines", "text": "Vaccines train the immune system to recognise a pathogen without causing disease."},
                {"id": "market", "title": "Markets", "text": "Stock markets rallied on Monday after the central bank cut interest rates."},
                {"id": "photo", "title": "Photosynthesis", "text": "Plants turn light, water and carbon dioxide into sugar and oxygen by photosynthesis."},
            ]}),
        )
        .await;
    assert_eq!(r.status(), 200);

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/openai_client.py");
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .arg(&app.base)
        .arg("e2e")
        .arg("What do mitochondria produce?")
        .env("PYTHONPATH", &pythonpath)
        .output()
        .await
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "openai client failed: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("client output is json");
    eprintln!("openai client saw: {v}");

    assert_eq!(v["model"], "smollm2-135m-instruct");
    for mode in ["stream", "full"] {
        let m = &v[mode];
        assert!(
            m["text"].as_str().is_some_and(|t| !t.trim().is_empty()),
            "{mode}: {m}"
        );
        assert!(
            matches!(m["finish_reason"].as_str(), Some("stop" | "length")),
            "{mode}: {m}"
        );
        let cited: Vec<&str> = m["citations"]
            .as_array()
            .map(|a| a.iter().filter_map(|c| c["document_id"].as_str()).collect())
            .unwrap_or_default();
        assert!(!cited.is_empty(), "{mode}: no citations: {m}");
        assert!(cited.iter().all(|c| ids.contains(c)), "{mode}: {cited:?}");
        assert!(cited.contains(&"mito"), "{mode}: {cited:?}");
    }
    let s = &v["stream"];
    assert!(s["ttft_s"].is_f64(), "{s}");
    let stages: Vec<&str> = s["budget"]["stages"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["stage"].as_str()).collect())
        .unwrap_or_default();
    assert!(stages.contains(&"llm_ttft"), "{s}");
    if s["partial"] == false {
        // The real model answered in time: both LLM stages ran.
        assert!(stages.contains(&"llm_generate"), "{s}");
    }
    app.shutdown().await.expect("shutdown");
}
