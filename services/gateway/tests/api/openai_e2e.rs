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

    // Each answer mode, streamed through the same client.
    let outcome = |m: &Value, stage: &str| -> Option<String> {
        m["budget"]["stages"]
            .as_array()?
            .iter()
            .find(|x| x["stage"] == stage)?["outcome"]
            .as_str()
            .map(str::to_owned)
    };
    let e = &v["modes"]["extractive"];
    assert_eq!(e["answer"], "extractive", "{e}");
    assert!(
        e["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("> ") && t.contains("ATP")),
        "{e}"
    );
    assert_eq!(e["partial"], false, "chosen, not degraded: {e}");
    assert!(e["grounding"].is_null(), "{e}");
    assert_eq!(outcome(e, "llm_ttft").as_deref(), Some("skipped"), "{e}");
    let q = &v["modes"]["quote_then_generate"];
    assert_eq!(q["answer"], "quote_then_generate", "{q}");
    assert!(
        q["text"].as_str().is_some_and(|t| t.starts_with("> ")),
        "{q}"
    );
    let g = &v["modes"]["generate"];
    assert_eq!(g["answer"], "generate", "{g}");
    for m in [q, g] {
        if m["partial"] == false {
            // The model answered: the grounding check ran on it (and gave
            // its verdict unless it ran out of its 50 ms).
            match outcome(m, "verify").as_deref() {
                Some("ok") => {
                    assert!(m["grounding"]["sentences"].is_u64(), "{m}");
                    assert!(m["grounding"]["supported"].is_f64(), "{m}");
                }
                Some("timeout") => assert!(m["grounding"].is_null(), "{m}"),
                other => panic!("verify {other:?}: {m}"),
            }
        }
    }
    app.shutdown().await.expect("shutdown");
}
