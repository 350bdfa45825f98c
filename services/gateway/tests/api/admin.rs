//! Runtime budgets through the admin API: a change reaches the next request
//! without a restart, bad changes are refused naming the field and change
//! nothing, only the admin may change them, every version is kept and can
//! be rolled back to, a restart keeps the budgets in force, and a second
//! replica on the same store follows within 2 s.

use crate::fake_llm::{Behaviour, FakeLlm};
use crate::helpers::{PgDatabase, TestApp, error_of};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

async fn app(fake: &FakeLlm, data_dir: Option<&std::path::Path>) -> TestApp {
    let b = TestApp::builder().llm(fake).admin();
    match data_dir {
        Some(d) => b.data_dir(d),
        None => b,
    }
    .spawn()
    .await
}

async fn budgets(app: &TestApp) -> Value {
    let r = app
        .admin(reqwest::Method::GET, "/admin/budgets", None)
        .await;
    assert_eq!(r.status(), 200);
    r.json().await.expect("json")
}

/// The embed stage's outcome and budget on the next search.
async fn embed_on_next_search(app: &TestApp) -> (String, u64) {
    let r = app
        .post_json("/v1/search", json!({"query": "ATP for the cell"}))
        .await;
    assert_eq!(r.status(), 200);
    let b: Value = r.json().await.expect("json");
    let e = &b["budget"]["stages"][0];
    assert_eq!(e["stage"], "embed");
    (
        e["outcome"].as_str().unwrap_or_default().to_owned(),
        e["budget_ms"].as_u64().unwrap_or(u64::MAX),
    )
}

async fn patch(app: &TestApp, body: Value) -> reqwest::Response {
    app.admin(reqwest::Method::PATCH, "/admin/budgets", Some(body))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_change_at_runtime_roll_back_survive_restarts_and_reach_replicas() {
    let fake = FakeLlm::start(Behaviour::Fail).await;
    let a = app(&fake, None).await;
    let r = a
        .post_json("/v1/documents", json!({"documents": [{"id": "mito", "text": "Mitochondria produce ATP for the cell."}]}))
        .await;
    assert_eq!(r.status(), 200);

    let start = budgets(&a).await;
    assert_eq!(start["version"], 0);
    assert_eq!(start["stages"]["embed"], 150);
    assert_eq!(start["total_ms"], 15000);
    assert_eq!(embed_on_next_search(&a).await, ("ok".into(), 150));

    // v1: no time for embedding → the next search falls back to lexical.
    let r = patch(&a, json!({"stages": {"embed": 0}})).await;
    assert_eq!(r.status(), 200);
    let v1: Value = r.json().await.expect("json");
    assert_eq!(
        (v1["version"].clone(), v1["stages"]["embed"].clone()),
        (json!(1), json!(0))
    );
    assert_eq!(
        v1["stages"]["retrieve"], 200,
        "PATCH changes only what it names"
    );
    assert_eq!(embed_on_next_search(&a).await, ("fallback".into(), 0));

    // Refused changes name the field and change nothing.
    let bad = [
        (json!({"stages": {"embed": -5}}), "stages.embed"),
        (json!({"stages": {"embed": "fast"}}), "stages.embed"),
        (json!({"stages": {"bogus": 1}}), "stages.bogus"),
        (json!({"stages": {"rerank": 20000}}), "stages.rerank"),
        (json!({"total_ms": 100}), "total_ms"),
        (json!({"total_ms": 0}), "total_ms"),
        (json!({"budget": 3}), "budget"),
        (json!({"stages": 5}), "stages"),
    ];
    for (body, field) in bad {
        let (status, code, f, e) = error_of(patch(&a, body.clone()).await).await;
        assert_eq!(
            (status, code.as_str(), f.as_deref()),
            (422, "invalid_request", Some(field)),
            "{body} → {e}"
        );
    }
    let put_missing = a
        .admin(
            reqwest::Method::PUT,
            "/admin/budgets",
            Some(json!({"total_ms": 3000, "stages": {"cache": 10, "embed": 30}})),
        )
        .await;
    let (status, _, f, _) = error_of(put_missing).await;
    assert_eq!((status, f.as_deref()), (422, Some("stages.retrieve")));
    // Only the admin.
    let r = a
        .http
        .patch(a.url("/admin/budgets"))
        .json(&json!({"stages": {"embed": 99}}))
        .send()
        .await
        .expect("patch");
    assert_eq!(error_of(r).await.0, 401);
    let r = a
        .http
        .patch(a.url("/admin/budgets"))
        .bearer_auth("not-the-admin-key-at-all")
        .json(&json!({"stages": {"embed": 99}}))
        .send()
        .await
        .expect("patch");
    assert_eq!(error_of(r).await.0, 403);
    assert_eq!(budgets(&a).await, v1, "refused changes changed nothing");

    // v2: the GPU profile, all at once.
    let gpu = json!({"total_ms": 3000, "stages": {"cache": 10, "embed": 30, "retrieve": 60, "rerank": 150, "llm_ttft": 700, "llm_generate": 1950, "verify": 50}});
    let r = a
        .admin(reqwest::Method::PUT, "/admin/budgets", Some(gpu))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(embed_on_next_search(&a).await.1, 30);
    // v3: roll back to v1.
    let r = a
        .admin(
            reqwest::Method::POST,
            "/admin/budgets/rollback",
            Some(json!({"version": 1})),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v3: Value = r.json().await.expect("json");
    assert_eq!(v3["version"], 3);
    assert_eq!(embed_on_next_search(&a).await, ("fallback".into(), 0));
    let r = a
        .admin(
            reqwest::Method::POST,
            "/admin/budgets/rollback",
            Some(json!({"version": 42})),
        )
        .await;
    let (status, _, f, _) = error_of(r).await;
    assert_eq!((status, f.as_deref()), (404, Some("version")));
    // The audit log.
    let r = a
        .admin(reqwest::Method::GET, "/admin/budgets/history", None)
        .await;
    let h: Value = r.json().await.expect("json");
    let versions = h["versions"].as_array().cloned().unwrap_or_default();
    assert_eq!(versions.len(), 3);
    assert_eq!(versions[0]["version"], 3);
    assert_eq!(versions[0]["note"], "rollback to version 1");
    assert_eq!(versions[2]["stages"]["embed"], 0);
    assert!(
        versions
            .iter()
            .all(|v| v["changed_by"] == "admin"
                && v["changed_at_ms"].as_i64().is_some_and(|t| t > 0))
    );

    // A second replica on the same store follows within 2 s.
    let b = app(&fake, Some(a.data_dir())).await;
    assert_eq!(
        budgets(&b).await["version"],
        3,
        "a replica starts with the budgets in force"
    );
    let r = patch(&a, json!({"stages": {"embed": 120}})).await;
    assert_eq!(r.status(), 200);
    let t = Instant::now();
    loop {
        if budgets(&b).await["version"] == 4 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the replica did not follow within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(embed_on_next_search(&b).await, ("ok".into(), 120));
    b.shutdown().await.expect("shutdown b");

    // A restart keeps the budgets in force.
    let data = a.shutdown_keep_data().await;
    let a2 = app(&fake, Some(data.path())).await;
    let after = budgets(&a2).await;
    assert_eq!(
        (after["version"].clone(), after["stages"]["embed"].clone()),
        (json!(4), json!(120))
    );
    assert_eq!(embed_on_next_search(&a2).await.1, 120);
    a2.shutdown().await.expect("shutdown");
    drop(data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advice_fits_the_target_from_live_latencies_and_can_be_applied() {
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 8,
        gap: Duration::from_millis(10),
    })
    .await;
    let a = app(&fake, None).await;
    let r = a
        .post_json("/v1/documents", json!({"documents": [{"id": "mito", "text": "Mitochondria produce ATP for the cell."}]}))
        .await;
    assert_eq!(r.status(), 200);
    for i in 0..6 {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": format!("question number {i} about ATP?")}]});
        assert_eq!(
            a.post_json("/v1/chat/completions", body).await.status(),
            200
        );
    }
    let r = a
        .admin(
            reqwest::Method::GET,
            "/admin/budgets/advice?total_ms=3000",
            None,
        )
        .await;
    assert_eq!(r.status(), 200);
    let adv: Value = r.json().await.expect("json");
    let stages = adv["proposed"].as_object().cloned().unwrap_or_default();
    assert_eq!(stages.len(), ragtime_core::Stage::ALL.len(), "{adv}");
    let sum: u64 = stages.values().filter_map(Value::as_u64).sum();
    assert!(sum <= 3000, "{adv}");
    assert_eq!(adv["fits"], true, "generation takes ~70 ms: {adv}");
    assert_eq!(sum, 3000, "spare time goes to generation");
    assert_eq!(adv["basis"]["llm_generate"]["samples"], 6);
    // No reranker here: no budget proposed for it.
    assert_eq!(adv["proposed"]["rerank"], 0, "{adv}");
    assert_eq!(adv["basis"]["rerank"]["from"], "not configured");
    assert!(
        adv["basis"]["llm_generate"]["p95_ms"]
            .as_f64()
            .is_some_and(|p| p >= 60.0),
        "{adv}"
    );
    let binding = adv["binding_stage"].as_str().unwrap_or_default();
    assert!(ragtime_core_stage(binding), "{binding}");
    let rate = adv["expected_partial_rate"].as_f64().unwrap_or(-1.0);
    assert!((0.0..=1.0).contains(&rate), "{adv}");
    assert!(
        adv["llm"]["arrival_rate_per_s"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{adv}"
    );
    assert!(
        adv["llm"]["concurrency_needed"]
            .as_f64()
            .is_some_and(|c| c >= 1.0),
        "{adv}"
    );

    // Too tight for what the stages take: everything shrinks, and partial
    // answers become likely.
    let r = a
        .admin(
            reqwest::Method::GET,
            "/admin/budgets/advice?total_ms=20",
            None,
        )
        .await;
    let tight: Value = r.json().await.expect("json");
    assert_eq!(tight["fits"], false);
    // The shortfall comes out of the LLM's stages: searching still gets
    // time (never 0 for a stage that runs).
    for stage in ["embed", "retrieve", "llm_ttft"] {
        assert!(
            tight["proposed"][stage].as_u64().is_some_and(|ms| ms > 0),
            "{stage}: {tight}"
        );
    }
    assert!(
        tight["expected_partial_rate"]
            .as_f64()
            .is_some_and(|p| p > 0.5),
        "{tight}"
    );

    // The advice is a valid budget: it can be put in force as it is.
    let body = json!({"total_ms": 3000, "stages": adv["proposed"].clone()});
    let r = a
        .admin(reqwest::Method::PUT, "/admin/budgets", Some(body))
        .await;
    assert_eq!(r.status(), 200);

    for (q, field) in [
        ("total_ms=0", "total_ms"),
        ("total_ms=soon", "total_ms"),
        ("budget=3", "budget"),
    ] {
        let r = a
            .admin(
                reqwest::Method::GET,
                &format!("/admin/budgets/advice?{q}"),
                None,
            )
            .await;
        let (status, _, f, _) = error_of(r).await;
        assert_eq!((status, f.as_deref()), (422, Some(field)), "{q}");
    }
    let r = a
        .http
        .get(a.url("/admin/budgets/advice"))
        .send()
        .await
        .expect("get");
    assert_eq!(error_of(r).await.0, 401);
    a.shutdown().await.expect("shutdown");
}

fn ragtime_core_stage(name: &str) -> bool {
    [
        "cache",
        "embed",
        "retrieve",
        "rerank",
        "llm_ttft",
        "llm_generate",
        "quote",
    ]
    .contains(&name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_experiment_sends_a_share_of_traffic_to_a_candidate_and_reports_each_arm() {
    let fake = FakeLlm::start(Behaviour::Fail).await;
    let a = app(&fake, None).await;
    let r = a
        .post_json("/v1/documents", json!({"documents": [{"id": "mito", "text": "Mitochondria produce ATP for the cell."}]}))
        .await;
    assert_eq!(r.status(), 200);
    let start = |body: Value| a.admin(reqwest::Method::POST, "/admin/experiments", Some(body));

    // Refused starts name the field.
    for (body, field) in [
        (json!({"share": 0.5, "candidate": {}}), "name"),
        (json!({"name": "x", "share": 0, "candidate": {}}), "share"),
        (json!({"name": "x", "share": 1.5, "candidate": {}}), "share"),
        (json!({"name": "x", "share": 0.5}), "candidate"),
        (
            json!({"name": "x", "share": 0.5, "candidate": {"stages": {"embed": 99999}}}),
            "candidate.stages.embed",
        ),
        (
            json!({"name": "x", "share": 0.5, "candidate": {}, "arms": 3}),
            "arms",
        ),
    ] {
        let (s, _, f, e) = error_of(start(body.clone()).await).await;
        assert_eq!((s, f.as_deref()), (422, Some(field)), "{body} → {e}");
    }

    // Every request to the candidate: no embedding budget → lexical fallback.
    let r = start(json!({"name": "no-embed", "share": 1.0, "candidate": {"stages": {"embed": 0}}}))
        .await;
    assert_eq!(r.status(), 201);
    let (s, _, f, _) =
        error_of(start(json!({"name": "second", "share": 0.5, "candidate": {}})).await).await;
    assert_eq!(
        (s, f.as_deref()),
        (422, Some("name")),
        "one experiment at a time"
    );
    for _ in 0..5 {
        assert_eq!(embed_on_next_search(&a).await.0, "fallback");
    }
    let r = a
        .admin(reqwest::Method::GET, "/admin/experiments", None)
        .await;
    let e: Value = r.json().await.expect("json");
    let arms = &e["running"]["arms"];
    assert_eq!(arms["candidate"]["requests"], 5, "{e}");
    assert_eq!(arms["control"]["requests"], 0);
    assert_eq!(
        arms["candidate"]["partial_rate"], 1.0,
        "lexical fallback is partial"
    );
    assert_eq!(arms["candidate"]["budgets"]["stages"]["embed"], 0);
    assert_eq!(arms["control"]["budgets"]["stages"]["embed"], 150);
    assert!(
        arms["candidate"]["stages"]["retrieve"]["p95_ms"].is_number(),
        "{e}"
    );
    let r = a
        .admin(reqwest::Method::DELETE, "/admin/experiments", None)
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        embed_on_next_search(&a).await.0,
        "ok",
        "stopped: everyone back on the budgets in force"
    );

    // Half and half.
    let r =
        start(json!({"name": "half", "share": 0.5, "candidate": {"stages": {"embed": 0}}})).await;
    assert_eq!(r.status(), 201);
    let mut fallbacks = 0;
    for _ in 0..40 {
        if embed_on_next_search(&a).await.0 == "fallback" {
            fallbacks += 1;
        }
    }
    let r = a
        .admin(reqwest::Method::DELETE, "/admin/experiments", None)
        .await;
    let e: Value = r.json().await.expect("json");
    let arms = &e["stopped"]["arms"];
    let (c, t) = (
        arms["control"]["requests"].as_u64().unwrap_or(0),
        arms["candidate"]["requests"].as_u64().unwrap_or(0),
    );
    assert_eq!((c + t, t), (40, fallbacks), "{e}");
    assert!(c > 0 && t > 0, "both arms ran: {c} / {t}");
    assert_eq!(arms["control"]["partial_rate"], 0.0);
    let r = a
        .admin(reqwest::Method::DELETE, "/admin/experiments", None)
        .await;
    assert_eq!(error_of(r).await.0, 404);
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (RAGTIME_TEST_DATABASE_URL)"]
async fn needs_postgres_replicas_follow_a_budget_change_within_two_seconds() {
    let db = PgDatabase::create("ragtime_rep").await;
    let fake = FakeLlm::start(Behaviour::Fail).await;
    let replica = |url: String| {
        TestApp::builder()
            .llm(&fake)
            .admin()
            .config(|c| c.database_url = Some(ragtime_gateway::config::Secret::from(url)))
            .spawn()
    };
    let url = db.url.clone();
    let a = replica(url.clone()).await;
    let b = replica(url).await;
    let r = patch(&a, json!({"stages": {"rerank": 0}})).await;
    assert_eq!(r.status(), 200);
    let t = Instant::now();
    loop {
        let v = budgets(&b).await;
        if v["version"] == 1 {
            assert_eq!(v["stages"]["rerank"], 0);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "replica b did not follow within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("replica followed after {:?}", t.elapsed());
    a.shutdown().await.expect("shutdown a");
    b.shutdown().await.expect("shutdown b");
    db.drop_db().await;
}

/// Without an admin key the admin page says how to turn the admin API on,
/// instead of a sign-in no key could pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_says_when_the_admin_api_is_off() {
    let off = TestApp::builder().spawn().await;
    let page = off.get("/admin").await.text().await.expect("page");
    assert!(page.contains("The admin API is off"), "{page}");
    assert!(page.contains("RAGTIME__ADMIN_KEY"));
    assert!(!page.contains("id=\"sign-in\""));
    off.shutdown().await.expect("shutdown");
    let on = TestApp::builder().admin().spawn().await;
    let page = on.get("/admin").await.text().await.expect("page");
    assert!(page.contains("id=\"sign-in\""));
    on.shutdown().await.expect("shutdown");
}
