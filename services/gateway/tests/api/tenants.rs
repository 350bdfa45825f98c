//! API keys and tenants: keys are created and revoked by the admin and
//! stored hashed; a request without a key, with a bad one, or with the
//! wrong role is refused; one tenant's documents, conversations and cached
//! answers never reach another's requests, through every endpoint; rate
//! limits are per tenant.

use crate::fake_llm::{Behaviour, FakeLlm};
use crate::helpers::{ADMIN_KEY as ADMIN, TestApp, error_of};
use ragtime_gateway::Config;
use serde_json::{Value, json};
use std::time::Duration;

async fn app(fake: &FakeLlm, tweak: impl FnOnce(&mut Config) + Send + 'static) -> TestApp {
    TestApp::builder()
        .llm(fake)
        .admin()
        .config(tweak)
        .spawn()
        .await
}

async fn new_key(app: &TestApp, tenant: &str) -> (String, String) {
    let r = app
        .http
        .post(app.url("/admin/keys"))
        .bearer_auth(ADMIN)
        .json(&json!({"tenant": tenant, "name": format!("{tenant}'s key")}))
        .send()
        .await
        .expect("create key");
    assert_eq!(r.status(), 201);
    let b: Value = r.json().await.expect("json");
    (
        b["id"].as_str().unwrap_or_default().to_owned(),
        b["key"].as_str().unwrap_or_default().to_owned(),
    )
}

fn as_tenant(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    key: &str,
) -> reqwest::RequestBuilder {
    app.http.request(method, app.url(path)).bearer_auth(key)
}

async fn json_of(r: reqwest::Response) -> (u16, Value) {
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_never_see_each_others_data_through_any_endpoint() {
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 3,
        gap: Duration::from_millis(1),
    })
    .await;
    // Its follow-up must come from the cache: no stage may be cut.
    let app = TestApp::builder()
        .unhurried()
        .llm(&fake)
        .admin()
        .spawn()
        .await;
    let (acme_id, acme) = new_key(&app, "acme").await;
    let (_, globex) = new_key(&app, "globex").await;
    use reqwest::Method as M;

    // acme's secret plan, in its default collection.
    let r = as_tenant(&app, M::POST, "/v1/documents", &acme)
        .json(&json!({"documents": [{"id": "plan", "title": "Secret plan", "text": "The acme secret plan is to corner the anvil market in spring."}]}))
        .send()
        .await
        .expect("ingest");
    assert_eq!(r.status(), 200);
    // globex has its own default collection, with other text.
    let r = as_tenant(&app, M::POST, "/v1/documents", &globex)
        .json(&json!({"documents": [{"id": "memo", "title": "Memo", "text": "Globex plans a picnic in the anvil-free park."}]}))
        .send()
        .await
        .expect("ingest");
    assert_eq!(r.status(), 200);

    // Search.
    for (key, want, other) in [(&acme, "plan", "memo"), (&globex, "memo", "plan")] {
        let (s, b) = json_of(
            as_tenant(&app, M::POST, "/v1/search", key)
                .json(&json!({"query": "secret plan anvil market", "mode": "lexical"}))
                .send()
                .await
                .expect("search"),
        )
        .await;
        assert_eq!(s, 200);
        let ids: Vec<&str> = b["results"]
            .as_array()
            .map(|a| a.iter().filter_map(|r| r["document_id"].as_str()).collect())
            .unwrap_or_default();
        assert!(ids.contains(&want) && !ids.contains(&other), "{ids:?}");
    }
    // The anonymous (default) tenant's own default collection is empty.
    let (s, b) = json_of(
        app.post_json(
            "/v1/search",
            json!({"query": "secret plan", "mode": "lexical"}),
        )
        .await,
    )
    .await;
    assert_eq!((s, b["results"].clone()), (200, json!([])), "{b}");

    // Get and delete another tenant's document: not found, and it stays.
    let (s, _) = json_of(
        as_tenant(&app, M::GET, "/v1/documents/plan", &globex)
            .send()
            .await
            .expect("get"),
    )
    .await;
    assert_eq!(s, 404);
    let (s, _) = json_of(
        as_tenant(&app, M::DELETE, "/v1/documents/plan", &globex)
            .send()
            .await
            .expect("delete"),
    )
    .await;
    assert_eq!(s, 404);
    let (s, doc) = json_of(
        as_tenant(&app, M::GET, "/v1/documents/plan", &acme)
            .send()
            .await
            .expect("get"),
    )
    .await;
    assert_eq!(
        (s, doc["collection"].clone()),
        (200, json!("default")),
        "{doc}"
    );

    // Uploads land in the uploader's namespace.
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(b"Globex quarterly numbers are up.".to_vec())
            .file_name("q.txt"),
    );
    let r = as_tenant(&app, M::POST, "/v1/documents", &globex)
        .multipart(form)
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status(), 200);
    let (s, _) = json_of(
        as_tenant(&app, M::GET, "/v1/documents/q.txt", &acme)
            .send()
            .await
            .expect("get"),
    )
    .await;
    assert_eq!(s, 404);

    // Chat: citations, conversations and cached answers stay with their tenant.
    let ask = |q: &str, conv: &str| json!({"model": "m", "messages": [{"role": "user", "content": q}], "conversation_id": conv});
    let (s, a) = json_of(
        as_tenant(&app, M::POST, "/v1/chat/completions", &acme)
            .json(&ask("What is the secret plan?", "c1"))
            .send()
            .await
            .expect("chat"),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(a["citations"][0]["document_id"], "plan");
    let seen_before = fake.seen().len();
    // Same question, same conversation id, other tenant.
    let (s, g) = json_of(
        as_tenant(&app, M::POST, "/v1/chat/completions", &globex)
            .json(&ask("What is the secret plan?", "c1"))
            .send()
            .await
            .expect("chat"),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(g["cached"], false, "acme's cached answer is not globex's");
    assert_eq!(fake.seen().len(), seen_before + 1);
    let cited: Vec<&str> = g["citations"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["document_id"].as_str()).collect())
        .unwrap_or_default();
    assert!(!cited.contains(&"plan"), "{cited:?}");
    let prompt = fake
        .seen()
        .last()
        .map(|s| s.body["messages"].clone())
        .unwrap_or_default();
    assert_eq!(
        prompt.as_array().map(Vec::len),
        Some(2),
        "no history from acme's c1: {prompt}"
    );
    assert!(!prompt.to_string().contains("anvil market"), "{prompt}");
    // acme's own follow-up does get its history, and its cache.
    let (_, again) = json_of(
        as_tenant(&app, M::POST, "/v1/chat/completions", &acme)
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "What is the secret plan?"}]}))
            .send()
            .await
            .expect("chat"),
    )
    .await;
    assert_eq!(again["cached"], true);

    // Any other bearer token (OpenAI clients always send one) is no key:
    // the default tenant, which sees none of this.
    let (s, b) = json_of(
        as_tenant(&app, M::POST, "/v1/search", "sk-not-a-ragtime-key")
            .json(&json!({"query": "secret plan", "mode": "lexical"}))
            .send()
            .await
            .expect("search"),
    )
    .await;
    assert_eq!((s, b["results"].clone()), (200, json!([])));

    // Keys: listed without secrets; revoked at once.
    let (_, keys) = json_of(
        app.http
            .get(app.url("/admin/keys"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("keys"),
    )
    .await;
    let listed = keys.to_string();
    assert!(
        listed.contains(&acme_id) && !listed.contains(&acme[acme.len() - 20..]),
        "{listed}"
    );
    let (s, _) = json_of(
        app.http
            .delete(app.url(&format!("/admin/keys/{acme_id}")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("revoke"),
    )
    .await;
    assert_eq!(s, 200);
    let r = as_tenant(&app, M::POST, "/v1/search", &acme)
        .json(&json!({"query": "plan"}))
        .send()
        .await
        .expect("search");
    assert_eq!(error_of(r).await.0, 401, "a revoked key is refused");
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_roles_and_rate_limits() {
    let fake = FakeLlm::start(Behaviour::Fail).await;
    let app = app(&fake, |c| {
        c.auth.require_api_key = true;
        c.limits.requests_per_s = 1.0;
        c.limits.burst = 2;
    })
    .await;
    let (_, acme) = new_key(&app, "acme").await;
    let (_, globex) = new_key(&app, "globex").await;
    let search = |key: Option<&str>| {
        let mut r = app
            .http
            .post(app.url("/v1/search"))
            .json(&json!({"query": "x", "collection": "none"}));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    // 401 without a key or with a bad one; 403 with the wrong role.
    let (s, code, _, _) = error_of(search(None).await.expect("search")).await;
    assert_eq!((s, code.as_str()), (401, "unauthorized"));
    assert_eq!(
        error_of(search(Some("rk_nope_nope")).await.expect("search"))
            .await
            .0,
        401
    );
    let tampered = format!("{}x", &acme[..acme.len() - 1]);
    assert_eq!(
        error_of(search(Some(&tampered)).await.expect("search"))
            .await
            .0,
        401
    );
    assert_eq!(
        error_of(search(Some(ADMIN)).await.expect("search")).await.0,
        403,
        "admin key on /v1"
    );
    let r = app
        .http
        .get(app.url("/admin/budgets"))
        .bearer_auth(&acme)
        .send()
        .await
        .expect("admin");
    assert_eq!(error_of(r).await.0, 403, "api key on /admin");
    // Bad key requests are refused naming the field.
    for (body, field) in [
        (json!({"tenant": "Not Valid"}), "tenant"),
        (json!({"name": "x"}), "tenant"),
    ] {
        let r = app
            .http
            .post(app.url("/admin/keys"))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .expect("create");
        let (s, _, f, _) = error_of(r).await;
        assert_eq!((s, f.as_deref()), (422, Some(field)), "{body}");
    }

    // Rate limits, per tenant: a burst of 2, then 1 per second.
    for _ in 0..2 {
        assert_eq!(
            search(Some(&acme)).await.expect("search").status(),
            404,
            "unknown collection, but admitted"
        );
    }
    let r = search(Some(&acme)).await.expect("search");
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("retry-after").is_some_and(|v| {
        v.to_str()
            .is_ok_and(|s| s.parse::<u64>().is_ok_and(|n| n >= 1))
    }));
    let (_, code, _, _) = error_of(r).await;
    assert_eq!(code, "rate_limited");
    assert_eq!(
        search(Some(&globex)).await.expect("search").status(),
        404,
        "globex has its own bucket"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        search(Some(&acme)).await.expect("search").status(),
        404,
        "refilled"
    );
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_can_have_budgets_of_its_own() {
    let fake = FakeLlm::start(Behaviour::Fail).await;
    let app = app(&fake, |_| {}).await;
    let (_, acme) = new_key(&app, "acme").await;
    let (_, globex) = new_key(&app, "globex").await;
    use reqwest::Method as M;
    for key in [&acme, &globex] {
        let r = as_tenant(&app, M::POST, "/v1/documents", key)
            .json(&json!({"documents": [{"id": "d", "text": "Mitochondria produce ATP."}]}))
            .send()
            .await
            .expect("ingest");
        assert_eq!(r.status(), 200);
    }
    let embed_of = |key: String, budget_ms: Option<u64>| {
        let mut body = json!({"query": "ATP"});
        if let Some(b) = budget_ms {
            body["budget_ms"] = json!(b);
        }
        let req = as_tenant(&app, M::POST, "/v1/search", &key).json(&body);
        async move {
            let (_, b) = json_of(req.send().await.expect("search")).await;
            (
                b["budget"]["stages"][0]["outcome"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                b["budget"]["total_ms"].as_u64().unwrap_or_default(),
            )
        }
    };
    let admin = |m: M, body: Option<Value>| {
        let mut r = app
            .http
            .request(m, app.url("/admin/tenants/acme/budgets"))
            .bearer_auth(ADMIN);
        if let Some(b) = body {
            r = r.json(&b);
        }
        r.send()
    };
    let (s, b) = json_of(
        admin(
            M::PUT,
            Some(json!({"total_ms": 14850, "stages": {"embed": 0}})),
        )
        .await
        .expect("put"),
    )
    .await;
    assert_eq!(
        (s, b["override"].clone(), b["stages"]["embed"].clone()),
        (200, json!(true), json!(0)),
        "{b}"
    );
    assert_eq!(
        embed_of(acme.clone(), None).await,
        ("fallback".into(), 14850)
    );
    assert_eq!(
        embed_of(globex.clone(), None).await,
        ("ok".into(), 15000),
        "other tenants keep the global budgets"
    );
    // A request's own budget_ms still only tightens.
    assert_eq!(embed_of(acme.clone(), Some(60_000)).await.1, 14850);
    assert_eq!(embed_of(acme.clone(), Some(3000)).await.1, 3000);
    // Refused overrides name the field; the override stays as it was.
    let (s, e) = json_of(
        admin(M::PUT, Some(json!({"stages": {"rerank": 99999}})))
            .await
            .expect("put"),
    )
    .await;
    assert_eq!(
        (s, e["error"]["field"].clone()),
        (422, json!("stages.rerank"))
    );
    let r = app
        .http
        .put(app.url("/admin/tenants/Not%20Valid/budgets"))
        .bearer_auth(ADMIN)
        .json(&json!({}))
        .send()
        .await
        .expect("put");
    assert_eq!(error_of(r).await.2.as_deref(), Some("tenant"));
    // Removed: back to the global budgets.
    let (s, _) = json_of(admin(M::DELETE, None).await.expect("delete")).await;
    assert_eq!(s, 200);
    assert_eq!(embed_of(acme.clone(), None).await, ("ok".into(), 15000));
    let (s, _) = json_of(admin(M::DELETE, None).await.expect("delete")).await;
    assert_eq!(s, 404);
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_may_hold_only_so_many_streams_open() {
    let fake = FakeLlm::start(Behaviour::StallBeforeFirstToken).await;
    let app = app(&fake, |c| {
        c.limits.concurrent_streams = 1;
        c.budgets.llm_ttft_ms = 1500;
    })
    .await;
    let (_, acme) = new_key(&app, "acme").await;
    let (_, globex) = new_key(&app, "globex").await;
    // Something to answer from (without sources the model is not asked).
    for key in [&acme, &globex] {
        let r = app
            .http
            .post(app.url("/v1/documents"))
            .bearer_auth(key)
            .json(&json!({"documents": [{"id": "d", "text": "Hello is a greeting."}]}))
            .send()
            .await
            .expect("ingest");
        assert_eq!(r.status(), 200);
    }
    let stream = |key: &str| {
        app.http
            .post(app.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hello?"}]}))
            .send()
    };
    let first = stream(&acme).await.expect("first");
    assert_eq!(first.status(), 200);
    let second = stream(&acme).await.expect("second");
    assert_eq!(second.status(), 429);
    assert!(second.headers().contains_key("retry-after"));
    assert_eq!(error_of(second).await.1, "rate_limited");
    // Another tenant has its own streams; a non-streamed chat is no stream.
    let other = stream(&globex).await.expect("other");
    assert_eq!(other.status(), 200);
    drop(other);
    // When the first stream ends, its slot is free again.
    let body = first.text().await.expect("first ends");
    assert!(body.trim_end().ends_with("data: [DONE]"));
    let mut freed = false;
    for _ in 0..50 {
        let r = stream(&acme).await.expect("again");
        if r.status() == 200 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "the slot was not released");
    app.shutdown().await.expect("shutdown");
}

/// A key is read from the store once and reused for a moment: requests
/// with it need no store connection, and a revocation written by another
/// replica (here, straight into the store) holds within two seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_revoked_elsewhere_stops_working_within_seconds() {
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 3,
        gap: Duration::from_millis(1),
    })
    .await;
    let app = app(&fake, |c| c.auth.require_api_key = true).await;
    let (id, key) = new_key(&app, "acme").await;
    let collections = || async {
        as_tenant(&app, reqwest::Method::GET, "/v1/collections", &key)
            .send()
            .await
            .expect("request")
            .status()
            .as_u16()
    };
    assert_eq!(collections().await, 200);
    let url = ragtime_store::Store::sqlite_url(app.data_dir());
    let pool = sqlx::SqlitePool::connect(&url).await.expect("open db");
    sqlx::query("UPDATE api_keys SET revoked_ms = 1 WHERE id = $1")
        .bind(&id)
        .execute(&pool)
        .await
        .expect("revoke elsewhere");
    let revoked = std::time::Instant::now();
    assert_eq!(
        collections().await,
        200,
        "read from the cache, not the store"
    );
    let mut status = 200;
    while status == 200 && revoked.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = collections().await;
    }
    assert_eq!(status, 401);
    assert!(
        revoked.elapsed() < Duration::from_secs(3),
        "{:?}",
        revoked.elapsed()
    );
    app.shutdown().await.expect("shutdown");
}
