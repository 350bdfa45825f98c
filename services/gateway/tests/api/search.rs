//! Ingestion and search through the HTTP API, with the real model and
//! indexes, on SQLite (and PostgreSQL in `health.rs`).

use crate::helpers::{TestApp, error_of, ids};
use serde_json::{Value, json};

fn corpus() -> Value {
    json!({"documents": [
        {"id": "mito", "title": "Mitochondria", "text": "Mitochondria produce ATP for the cell through oxidative phosphorylation.", "metadata": {"year": 2019, "field": "biology", "published": "2019-03-01T00:00:00Z"}},
        {"id": "market", "title": "Markets", "text": "Stock markets rallied on Monday after the central bank cut interest rates.", "metadata": {"year": 2021, "field": "finance", "published": "2021-06-15T00:00:00Z"}},
        {"id": "vaccine", "title": "Vaccines", "text": "Vaccines train the immune system to recognise a pathogen without causing disease.", "metadata": {"year": 2021, "field": "biology", "published": "2021-01-10T00:00:00Z"}},
    ]})
}

async fn search(app: &TestApp, body: Value) -> (Value, String) {
    let r = app.post_json("/v1/search", body).await;
    assert_eq!(r.status(), 200);
    let timing = r
        .headers()
        .get("server-timing")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (r.json().await.expect("json"), timing)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_then_search_in_every_mode_with_filters() {
    let app = TestApp::builder().real_embeddings().spawn().await;
    let r = app.post_json("/v1/documents", corpus()).await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["documents"][0]["status"], "created");
    assert_eq!(body["documents"][0]["chunks"], 1);

    for mode in ["hybrid", "dense", "lexical"] {
        let (b, timing) = search(
            &app,
            json!({"query": "how do cells make energy (ATP)?", "mode": mode, "top_k": 2}),
        )
        .await;
        assert_eq!(ids(&b)[0], "mito", "{mode}: {b}");
        assert!(ids(&b).len() <= 2);
        assert!(timing.contains("retrieve;desc=\"ok\""), "{timing}");
        assert_eq!(b["partial"], false);
        let stages: Vec<&str> = b["budget"]["stages"]
            .as_array()
            .map(|a| a.iter().filter_map(|s| s["stage"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(stages, ["embed", "retrieve"]);
        let r0 = &b["results"][0];
        assert!(
            r0["chunk_id"].is_i64() && r0["score"].is_f64() && r0["text"].is_string(),
            "{r0}"
        );
        assert_eq!(r0["metadata"]["field"], "biology");
    }
    let (b, _) = search(&app, json!({"query": "cells", "mode": "lexical"})).await;
    assert_eq!(
        b["budget"]["stages"][0]["outcome"], "skipped",
        "lexical mode needs no embedding"
    );

    // Filters apply to both retrievers.
    let (b, _) = search(
        &app,
        json!({"query": "how do cells make energy", "filter": {"field": "finance"}}),
    )
    .await;
    assert_eq!(ids(&b), ["market"]);
    let (b, _) = search(&app, json!({"query": "immune", "filter": {"$and": [{"year": {"$gte": 2021}}, {"field": {"$in": ["biology"]}}]}})).await;
    assert_eq!(ids(&b), ["vaccine"]);
    let (b, _) = search(
        &app,
        json!({"query": "biology", "filter": {"published": {"$lt": "2020-01-01T00:00:00Z"}}}),
    )
    .await;
    assert_eq!(ids(&b), ["mito"]);
    let (b, _) = search(
        &app,
        json!({"query": "biology", "filter": {"$not": {"field": "biology"}}, "mode": "dense"}),
    )
    .await;
    assert_eq!(ids(&b), ["market"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reingest_replaces_unchanged_is_skipped_delete_removes_and_restart_rebuilds() {
    let app = TestApp::builder().real_embeddings().spawn().await;
    app.post_json("/v1/documents", corpus()).await;
    let again: Value = app
        .post_json("/v1/documents", corpus())
        .await
        .json()
        .await
        .expect("json");
    assert!(
        again["documents"]
            .as_array()
            .is_some_and(|a| a.iter().all(|d| d["status"] == "unchanged")),
        "{again}"
    );

    let changed = json!({"documents": [{"id": "mito", "title": "Mitochondria", "text": "Chloroplasts capture light in plant cells.", "metadata": {"year": 2019}}]});
    let r: Value = app
        .post_json("/v1/documents", changed)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(r["documents"][0]["status"], "replaced");
    let (b, _) = search(
        &app,
        json!({"query": "oxidative phosphorylation ATP", "mode": "lexical"}),
    )
    .await;
    assert!(
        !ids(&b).contains(&"mito".to_owned()),
        "old chunks are gone: {b}"
    );
    let (b, _) = search(
        &app,
        json!({"query": "chloroplasts light", "mode": "lexical"}),
    )
    .await;
    assert_eq!(ids(&b), ["mito"]);

    let r = app
        .http
        .delete(app.url("/v1/documents/vaccine"))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 200);
    let r = app
        .http
        .get(app.url("/v1/documents/vaccine"))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 404);
    let (b, _) = search(&app, json!({"query": "immune system vaccines"})).await;
    assert!(!ids(&b).contains(&"vaccine".to_owned()));
    let r = app
        .http
        .delete(app.url("/v1/documents/vaccine"))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 404);

    // A new process on the same data folder rebuilds the indexes from the store.
    let data = app.shutdown_keep_data().await;
    let app2 = TestApp::builder()
        .real_embeddings()
        .data_dir(data.path())
        .spawn()
        .await;
    let ready = app2.wait_ready().await;
    assert_eq!(ready["checks"]["embed"]["chunks_indexed"], 2);
    let (b, _) = search(&app2, json!({"query": "chloroplasts light"})).await;
    assert_eq!(ids(&b)[0], "mito");
    let doc: Value = app2
        .http
        .get(app2.url("/v1/documents/market"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(doc["metadata"]["field"], "finance");
    assert_eq!(doc["chunks"][0]["position"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_overrun_falls_back_to_lexical_results() {
    // The real model takes more than the 1 ms the embed stage gets.
    let app = TestApp::builder()
        .real_embeddings()
        .config(|c| c.budgets.embed_ms = 1)
        .spawn()
        .await;
    app.post_json("/v1/documents", corpus()).await;
    let (b, timing) = search(
        &app,
        json!({"query": "immune system training against a pathogen"}),
    )
    .await;
    assert_eq!(b["budget"]["stages"][0]["outcome"], "fallback", "{b}");
    assert_eq!(b["sources"], json!(["lexical"]));
    assert_eq!(b["partial"], true);
    assert_eq!(ids(&b)[0], "vaccine");
    assert!(timing.contains("embed;desc=\"fallback\""), "{timing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ingest_and_search_input_is_refused_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let cases = [
        (json!({"documents": []}), "documents"),
        (
            json!({"documents": [{"id": "ok", "text": "fine"}, {"id": "x", "text": "   "}]}),
            "documents[1].text",
        ),
        (
            json!({"documents": [{"id": "", "text": "t"}]}),
            "documents[0].id",
        ),
        (
            json!({"documents": [{"id": "a", "text": "t"}, {"id": "a", "text": "u"}]}),
            "documents[1].id",
        ),
        (
            json!({"documents": [{"id": "a", "text": 5}]}),
            "documents[0].text",
        ),
        (
            json!({"documents": [{"id": "a", "text": "t", "metadata": {"k": null}}]}),
            "documents[0].metadata.k",
        ),
        (
            json!({"documents": [{"id": "a", "text": "t", "metadata": [1]}]}),
            "documents[0].metadata",
        ),
        (
            json!({"collection": "no spaces!", "documents": [{"id": "a", "text": "t"}]}),
            "collection",
        ),
        (
            json!({"documents": [{"id": "a", "text": "t", "colour": "red"}]}),
            "documents[0].colour",
        ),
    ];
    for (body, field) in cases {
        let (s, code, f, full) = error_of(app.post_json("/v1/documents", body.clone()).await).await;
        assert_eq!(
            (s, code.as_str(), f.as_deref()),
            (422, "invalid_request", Some(field)),
            "{body} -> {full}"
        );
    }
    // Nothing from the refused requests was written.
    for id in ["ok", "a", "x"] {
        let r = app
            .http
            .get(app.url(&format!("/v1/documents/{id}")))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), 404, "{id} was written by a refused request");
    }
    let searches = [
        (json!({"query": ""}), 422, "query"),
        (json!({"query": "x", "top_k": 0}), 422, "top_k"),
        (json!({"query": "x", "top_k": 1000}), 422, "top_k"),
        (json!({"query": "x", "mode": "semantic"}), 422, "mode"),
        (
            json!({"query": "x", "filter": {"year": {"$between": [1, 2]}}}),
            422,
            "filter.year.$between",
        ),
        (
            json!({"query": "x", "filter": {"$or": {"a": 1}}}),
            422,
            "filter.$or",
        ),
        (json!({"query": "x", "filter": 7}), 422, "filter"),
        (
            json!({"query": "x", "collection": "nope"}),
            404,
            "collection",
        ),
    ];
    for (body, status, field) in searches {
        let (s, _, f, full) = error_of(app.post_json("/v1/search", body.clone()).await).await;
        assert_eq!((s, f.as_deref()), (status, Some(field)), "{body} -> {full}");
    }
}

/// Searching inside PostgreSQL, a retrieval the database cannot finish
/// within the stage's budget (here its tables are locked by another
/// session) is stopped by the database at the deadline: the request is
/// answered in its budget, says what overran, and no query of it is left
/// running; once the tables are free the next search is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_a_search_the_database_cannot_finish_in_time_degrades_and_says_so() {
    let server = ragtime_testkit::PgServer::start();
    let db = ragtime_testkit::PgDatabase::create_on(&server.admin_url, "ragtime_late").await;
    let app = TestApp::builder().searching_in(&db.url).spawn().await;
    app.post_json("/v1/documents", corpus()).await;
    let (other, tx) = lock_chunks(&db.url).await;
    let started = std::time::Instant::now();
    let r = app
        .post_json(
            "/v1/search",
            json!({"query": "ATP for the cell", "mode": "hybrid"}),
        )
        .await;
    let took = started.elapsed();
    let status = r.status();
    let b: Value = r.json().await.expect("json");
    eprintln!("{status} in {took:?}: {b}");
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["partial"], true, "{b}");
    let retrieve = &b["budget"]["stages"][1];
    assert_eq!(
        (retrieve["stage"].as_str(), retrieve["outcome"].as_str()),
        (Some("retrieve"), Some("timeout")),
        "{b}"
    );
    let budget = retrieve["budget_ms"].as_u64().expect("budget");
    let spent = retrieve["elapsed_ms"].as_u64().expect("elapsed");
    assert!(
        spent <= budget + 20,
        "stopped within 20 ms of its deadline: {b}"
    );
    assert!(took.as_millis() < u128::from(budget) + 200, "{took:?}");
    assert_eq!(
        active_searches(&other).await,
        0,
        "no search of it still runs"
    );
    tx.rollback().await.expect("release");
    let (whole, _) = search(&app, json!({"query": "ATP for the cell", "mode": "hybrid"})).await;
    assert_eq!(whole["partial"], false, "{whole}");
    assert_eq!(ids(&whole)[0], "mito");
}

/// A flood of searches that the database cannot finish (its chunks are
/// locked by another session) takes only the searches' own connections
/// (`database.search_connections`, 2 here): once those are held, every
/// further search is refused at once with 503 `overloaded` and
/// `Retry-After`, never a 500, while requests with keys (a key looked up
/// for the first time, too), collection reads and key writes still answer;
/// once the lock goes the held searches finish and the next is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_a_flood_of_slow_searches_is_refused_at_once_and_nothing_else_waits() {
    use crate::helpers::ADMIN_KEY;
    let server = ragtime_testkit::PgServer::start();
    let db = ragtime_testkit::PgDatabase::create_on(&server.admin_url, "ragtime_flood").await;
    let app = TestApp::builder()
        .unhurried()
        .admin()
        .searching_in(&db.url)
        .config(move |c| {
            c.database.search_connections = 2;
            c.auth.require_api_key = true;
        })
        .spawn()
        .await;
    let new_key = || async {
        let r = app
            .http
            .post(app.url("/admin/keys"))
            .bearer_auth(ADMIN_KEY)
            .json(&json!({"tenant": "acme", "name": "a key"}))
            .send()
            .await
            .expect("create key");
        assert_eq!(r.status(), 201);
        let b: Value = r.json().await.expect("json");
        b["key"].as_str().expect("key").to_owned()
    };
    let key = new_key().await;
    let search = |key: String| {
        let http = app.http.clone();
        let url = app.url("/v1/search");
        async move {
            let r = http
                .post(url)
                .bearer_auth(key)
                .json(&json!({"query": "ATP for the cell", "filter": {"field": {"$ne": "x"}}}))
                .send()
                .await
                .expect("search");
            let retry = r.headers().get("retry-after").is_some();
            let status = r.status().as_u16();
            (status, retry, r.json::<Value>().await.expect("json"))
        }
    };
    let r = app
        .http
        .post(app.url("/v1/documents"))
        .bearer_auth(&key)
        .json(&corpus())
        .send()
        .await
        .expect("ingest");
    assert_eq!(r.status(), 200);
    let (other, tx) = lock_chunks(&db.url).await;
    let held: Vec<_> = (0..2).map(|_| tokio::spawn(search(key.clone()))).collect();
    let t = std::time::Instant::now();
    loop {
        let n = active_searches(&other).await;
        if n >= 2 {
            break;
        }
        assert!(
            t.elapsed().as_secs() < 4,
            "the search connections never filled: {n}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let t = std::time::Instant::now();
    let flood = futures::future::join_all((0..16).map(|_| search(key.clone()))).await;
    let took = t.elapsed();
    for (status, retry, body) in &flood {
        assert_eq!(*status, 503, "{body}");
        assert!(*retry, "Retry-After: {body}");
        assert_eq!(body["error"]["code"], "overloaded", "{body}");
    }
    assert!(took.as_millis() < 1500, "refused at once: {took:?}");
    // Everything else still gets a connection: a key never seen before is
    // looked up, collections are read, a key is written.
    let t = std::time::Instant::now();
    let fresh = new_key().await;
    let r = app
        .http
        .get(app.url("/v1/collections"))
        .bearer_auth(&fresh)
        .send()
        .await
        .expect("collections");
    assert_eq!(r.status(), 200);
    assert!(t.elapsed().as_millis() < 1500, "{:?}", t.elapsed());
    tx.rollback().await.expect("release");
    for h in held {
        let (status, _, body) = h.await.expect("join");
        assert_eq!(status, 200, "{body}");
    }
    let (status, _, body) = search(fresh).await;
    assert_eq!(
        (status, body["partial"].as_bool()),
        (200, Some(false)),
        "{body}"
    );
    assert_eq!(ids(&body)[0], "mito", "{body}");
}

/// A filter too deep, too long or with too many values is a 422 naming
/// `filter` and the bound, before any search runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_past_its_bounds_is_refused_naming_the_bound() {
    let app = TestApp::spawn().await;
    let mut deep = json!({"team": "a"});
    for _ in 0..40 {
        deep = json!({"$not": deep});
    }
    let many: Vec<u64> = (0..100_001).collect();
    for (filter, says) in [
        (deep, "32 levels"),
        (json!({"id": {"$in": many}}), "100000 values"),
    ] {
        let r = app
            .post_json("/v1/search", json!({"query": "q", "filter": filter}))
            .await;
        let (status, code, field, body) = error_of(r).await;
        assert_eq!((status, code.as_str()), (422, "invalid_request"), "{body}");
        assert_eq!(field.as_deref(), Some("filter"), "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{body}");
    }
    app.shutdown().await.expect("shutdown");
}

/// Another session of the database at `url` holding its `chunks` locked
/// (ACCESS EXCLUSIVE) until the transaction is rolled back.
async fn lock_chunks(url: &str) -> (sqlx::PgPool, sqlx::Transaction<'static, sqlx::Postgres>) {
    let other = sqlx::PgPool::connect(url).await.expect("connect");
    let mut tx = other.begin().await.expect("begin");
    sqlx::query("LOCK TABLE chunks IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .expect("lock");
    (other, tx)
}

/// How many of the service's search queries the database is running now.
async fn active_searches(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'ragtime-search-%' AND state = 'active'",
    )
    .fetch_one(pool)
    .await
    .expect("activity")
}
