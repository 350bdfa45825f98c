use crate::helpers::{PgDatabase, TestApp};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_at_once_and_readyz_once_everything_is_warm() {
    let app = TestApp::builder()
        .real_embeddings()
        .local_llm()
        .config(|c| {
            c.llm.parallel = 2;
            c.llm.ctx_size = 2048;
        })
        .not_ready()
        .spawn()
        .await;
    let r = app
        .http
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(r.status(), 200);

    let body = app.wait_ready().await;
    assert_eq!(body["status"], "ready");
    assert_eq!(body["checks"]["embed"]["ok"], true);
    assert_eq!(body["checks"]["embed"]["dim"], 384);
    assert_eq!(body["checks"]["store"]["ok"], true);
    assert_eq!(body["checks"]["store"]["backend"], "sqlite");
    assert_eq!(body["checks"]["llm"]["ok"], true);
    let models = body["checks"]["llm"]["models"].to_string();
    assert!(models.contains("smollm2-135m-instruct"), "{models}");
    // llama-server splits its window over its slots: prompts are sized
    // against one slot's share.
    let local = &body["checks"]["llm"]["backends"][0];
    assert_eq!(
        (local["slots"].as_u64(), local["context_tokens"].as_u64()),
        (Some(2), Some(1024)),
        "{local}"
    );
    assert_eq!(local["breaker"], "closed");
    app.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_and_names_the_llm_when_the_backend_is_unreachable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let app = TestApp::builder()
        .llm_url(format!("http://127.0.0.1:{port}/v1"))
        .admin()
        .not_ready()
        .spawn()
        .await;
    // Anonymous callers are not told where the backend is.
    let anonymous: serde_json::Value = app.get("/readyz").await.json().await.expect("json");
    let said = anonymous["checks"]["llm"]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(!said.contains(&port.to_string()), "{anonymous}");
    assert!(said.contains("llm.base_url"), "{anonymous}");
    // Give the embedder time to load so only the LLM is missing.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let r = app
            .http
            .get(app.url("/readyz"))
            .bearer_auth(crate::helpers::ADMIN_KEY)
            .send()
            .await
            .expect("readyz");
        assert_eq!(r.status(), 503);
        let body: serde_json::Value = r.json().await.expect("json");
        assert_eq!(body["status"], "not_ready");
        assert_eq!(body["checks"]["llm"]["ok"], false);
        assert!(
            body["checks"]["llm"]["error"]
                .as_str()
                .unwrap_or_default()
                .contains(&port.to_string())
        );
        if body["checks"]["embed"]["ok"] == true {
            assert_eq!(body["checks"]["store"]["ok"], true);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "embedder never loaded: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    app.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (RAGTIME_TEST_DATABASE_URL)"]
async fn needs_postgres_store_when_configured() {
    let db = PgDatabase::create("ragtime_gw").await;
    let url = db.url.clone();
    let app = TestApp::builder()
        .config(|c| c.database_url = Some(ragtime_gateway::config::Secret::from(url)))
        .spawn()
        .await;
    let body = app.wait_ready().await;
    assert_eq!(body["checks"]["store"]["backend"], "postgres");
    app.shutdown().await.expect("shutdown");
    db.drop_db().await;
}

/// The API description and the page that reads it, as a client finds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_describes_itself() {
    let app = TestApp::spawn().await;
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status(), 200);
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    assert_eq!(ct.as_deref(), Some("application/json"));
    let doc: serde_json::Value = r.json().await.expect("json");
    assert_eq!(doc["openapi"], "3.1.0");
    let search = &doc["paths"]["/v1/search"]["post"];
    assert_eq!(
        search["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/SearchIn"
    );
    for status in ["200", "422", "503"] {
        assert!(
            search["responses"][status].is_object(),
            "{status}: {search}"
        );
    }
    assert_eq!(doc["components"]["schemas"]["ErrorBody"]["type"], "object");
    let page = app.get("/docs").await;
    assert_eq!(page.status(), 200);
    let html = page.text().await.expect("html");
    assert!(html.contains("/openapi.json") && html.contains("<script>"));
}

/// With `server.require_key_for_probes`, `/readyz` and `/metrics` answer
/// only a key; without it they answer anyone, the backend's URL to the
/// admin only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_can_require_a_key_and_hide_the_backend_from_anonymous_callers() {
    use crate::helpers::ADMIN_KEY;
    let app = TestApp::builder().admin().spawn().await;
    let anonymous: serde_json::Value = app.get("/readyz").await.json().await.expect("json");
    assert_eq!(anonymous["checks"]["llm"]["ok"], true, "{anonymous}");
    assert!(
        anonymous["checks"]["llm"].get("base_url").is_none(),
        "{anonymous}"
    );
    assert!(!anonymous.to_string().contains("127.0.0.1"), "{anonymous}");
    let r = app
        .http
        .get(app.url("/readyz"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("readyz");
    let admin: serde_json::Value = r.json().await.expect("json");
    assert!(admin["checks"]["llm"]["base_url"].is_string(), "{admin}");
    app.shutdown().await.expect("shutdown");

    let app = TestApp::builder()
        .admin()
        .config(|c| c.server.require_key_for_probes = true)
        .not_ready()
        .spawn()
        .await;
    for path in ["/readyz", "/metrics"] {
        let r = app.get(path).await;
        assert_eq!(r.status(), 401, "{path}");
        let r = app
            .http
            .get(app.url(path))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .expect("probe");
        assert_ne!(r.status(), 401, "{path}");
        let r = app
            .http
            .get(app.url(path))
            .bearer_auth("rk_nope_nope")
            .send()
            .await
            .expect("probe");
        assert_eq!(r.status(), 401, "{path}: an unknown key");
    }
    app.shutdown().await.expect("shutdown");
}
