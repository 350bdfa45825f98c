//! The admin page in a real headless Chromium (Debian's, driven by npm's
//! `playwright-core`; `make test` installs both): sign in, a refused change
//! names the field, a saved change is applied to the next request.

use crate::fake_llm::{Behaviour, FakeLlm};
use crate::helpers::{ADMIN_KEY as KEY, TestApp};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium and playwright-core (RAGTIME_TEST_NODE_PATH)"]
async fn needs_chromium_an_admin_signs_in_changes_a_budget_and_it_is_applied() {
    let node_path = ragtime_testkit::need(
        "RAGTIME_TEST_NODE_PATH",
        "headless Chromium with playwright-core (installed by make test)",
    );
    let fake = FakeLlm::start(Behaviour::Fail).await;
    let app = TestApp::builder().llm(&fake).admin().spawn().await;
    let r = app
        .post_json(
            "/v1/documents",
            json!({"documents": [{"id": "mito", "text": "Mitochondria produce ATP."}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        app.post_json("/v1/search", json!({"query": "ATP"}))
            .await
            .status(),
        200
    );

    let shots = std::env::var_os("RAGTIME_TEST_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/admin_page.cjs");
    let out = tokio::process::Command::new("node")
        .arg(script)
        .arg(&app.base)
        .arg(KEY)
        .arg(&shots)
        .env("NODE_PATH", &node_path)
        .output()
        .await
        .expect("run node");
    assert!(
        out.status.success(),
        "browser test failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).expect("json from the browser");
    eprintln!("the browser saw: {seen}");
    assert_eq!(seen["wrongKey"], "wrong admin key");
    // /docs renders its Markdown (no backticks left, `code` elements) and
    // lists the admin routes last.
    assert_eq!(seen["docs"]["backticks"], false, "{seen}");
    assert!(
        seen["docs"]["code"].as_u64().is_some_and(|n| n > 10),
        "{seen}"
    );
    let tags: Vec<&str> = seen["docs"]["tags"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(tags.last(), Some(&"admin"), "{seen}");
    assert!(tags.len() > 3, "{seen}");
    assert_eq!(seen["before"], "150");
    assert!(
        seen["refused"]
            .as_str()
            .is_some_and(|m| m.contains("exceeds total_ms")),
        "{seen}"
    );
    assert_eq!(
        seen["versionAfterRefusal"], "version 0",
        "a refused change saved nothing"
    );
    assert!(
        seen["saved"]
            .as_str()
            .is_some_and(|m| m.contains("version 1")),
        "{seen}"
    );
    assert_eq!(seen["embed"], "77");
    assert_eq!(seen["history"], 1);
    assert_eq!(
        seen["offsite"],
        json!([]),
        "the page loads nothing from elsewhere"
    );
    assert_eq!(
        seen["chart"],
        json!([
            "cache",
            "embed",
            "retrieve",
            "rerank",
            "llm_ttft",
            "llm_generate",
            "quote",
            "verify"
        ])
    );

    // Every tenant's collections are shown (the default tenant's
    // `default` collection at least).
    let t = &seen["tenants"][0];
    assert_eq!(t[0], "default", "{seen}");
    assert!(
        t[1].as_str()
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n >= 1),
        "{seen}"
    );

    // The backends and the degradation levels are shown.
    let row = &seen["backends"][0];
    assert_eq!(row[0], json!(fake.base_url), "{seen}");
    assert_eq!(row[1], "closed", "{seen}");
    assert!(
        seen["levels"]
            .as_str()
            .is_some_and(|l| l.starts_with("1: ≥ 100 % busy")),
        "{seen}"
    );

    // Applied: the next request runs under the new budget.
    let r = app.post_json("/v1/search", json!({"query": "ATP"})).await;
    let b: Value = r.json().await.expect("json");
    assert_eq!(b["budget"]["stages"][0]["stage"], "embed");
    assert_eq!(b["budget"]["stages"][0]["budget_ms"], 77);
    app.shutdown().await.expect("shutdown");
}
