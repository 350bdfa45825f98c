//! Two replicas on one store: what one writes — ingests, replacements,
//! deletes, a collection's removal — the other's indexes follow within a
//! second or so, and the other never serves a cached answer from before a
//! change it has applied.

use crate::helpers::{PgDatabase, TestApp, ids};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn doc(id: &str, text: &str) -> Value {
    json!({"id": id, "title": id, "text": text})
}

async fn search(app: &TestApp, query: &str) -> (u16, Value) {
    let r = app
        .post_json(
            "/v1/search",
            json!({"collection": "papers", "query": query, "mode": "lexical"}),
        )
        .await;
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

/// Waits (at most 10 s) until `b`'s search for `query` satisfies `ok`.
async fn until(b: &TestApp, query: &str, what: &str, ok: impl Fn(u16, &Value) -> bool) {
    let t = Instant::now();
    loop {
        let (s, v) = search(b, query).await;
        if ok(s, &v) {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "never {what}: {s} {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ask(q: &str) -> Value {
    json!({"model": "x", "collection": "papers", "messages": [{"role": "user", "content": q}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_follows_every_change_the_first_makes() {
    let a = TestApp::builder().unhurried().spawn().await;
    let b = TestApp::builder()
        .unhurried()
        .data_dir(a.data_dir())
        .spawn()
        .await;
    follows(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (RAGTIME_TEST_DATABASE_URL)"]
async fn needs_postgres_a_second_replica_follows_every_change_the_first_makes() {
    let db = PgDatabase::create("ragtime_follow").await;
    let replica = |url: String| {
        TestApp::builder()
            .unhurried()
            .config(|c| c.database_url = Some(ragtime_gateway::config::Secret::from(url)))
            .spawn()
    };
    let a = replica(db.url.clone()).await;
    let b = replica(db.url.clone()).await;
    follows(&a, &b).await;
    let (_, _) = (a.shutdown().await, b.shutdown().await);
    db.drop_db().await;
}

/// Two replicas searching inside PostgreSQL (`retrieval.engine =
/// "postgres"`): neither holds an index, and what one writes the other
/// finds as soon as the write returned — by words and by meaning, with
/// filters — with no follower to wait for; its cached answers do not
/// outlive the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_replicas_searching_in_the_database_see_a_write_once_it_returns() {
    let server = ragtime_testkit::PgServer::start();
    let db = PgDatabase::create_on(&server.admin_url, "ragtime_engine").await;
    let a = TestApp::builder()
        .unhurried()
        .searching_in(&db.url)
        .spawn()
        .await;
    let b = TestApp::builder()
        .unhurried()
        .searching_in(&db.url)
        .spawn()
        .await;
    a.ingest(json!({"collection": "papers", "documents": [
        {"id": "mito", "title": "Mitochondria", "text": "Mitochondria make most of the cell's ATP.", "metadata": {"year": 2020}},
        {"id": "ribo", "title": "Ribosomes", "text": "Ribosomes translate messenger RNA into protein.", "metadata": {"year": 2023}},
    ]}))
    .await;
    assert_eq!(find_ids(&b, "ATP", "lexical", Value::Null).await, ["mito"]);
    // Both count the database's chunks, the writer too (its own write
    // moved the corpus version before its follow saw it): the count sizes
    // the HNSW list (`ef_search_for`).
    for (who, app) in [("writer", &a), ("other", &b)] {
        let t = Instant::now();
        loop {
            let ready: Value = app.get("/readyz").await.json().await.expect("json");
            if ready["checks"]["embed"]["chunks_indexed"] == 2 {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "{who}: {ready}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let dense = find_ids(&b, "Which organelle powers the cell?", "dense", Value::Null).await;
    assert_eq!(dense.first().map(String::as_str), Some("mito"), "{dense:?}");
    let filtered = find_ids(
        &b,
        "cell protein ATP",
        "hybrid",
        json!({"year": {"$gte": 2021}}),
    )
    .await;
    assert_eq!(filtered, ["ribo"]);
    let first = b.chat(ask("What makes the cell's ATP?")).await;
    assert_eq!(first["cached"], false);
    assert_eq!(
        b.chat(ask("What makes the cell's ATP?")).await["cached"],
        true
    );

    change(&a).await;
    assert_eq!(
        find_ids(&b, "vesicles", "lexical", Value::Null).await,
        ["golgi"]
    );
    assert!(
        !find_ids(&b, "messenger RNA", "hybrid", Value::Null)
            .await
            .contains(&"ribo".to_owned())
    );
    let r = b
        .post_json(
            "/v1/search",
            json!({"collection": "papers", "query": "NADH", "mode": "lexical"}),
        )
        .await
        .json::<Value>()
        .await
        .expect("json");
    assert_eq!(
        r["results"][0]["text"],
        "Mitochondria oxidise NADH to make ATP."
    );
    until(&b, "ATP", "a new corpus version", |_, _| true).await;
    let t = Instant::now();
    loop {
        let after = b.chat(ask("What makes the cell's ATP?")).await;
        if after["cached"] == false {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "a stale cached answer: {after}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // No index in either process: readiness says so.
    let ready = b.wait_ready().await;
    assert_eq!(ready["checks"]["index"]["ok"], true, "{ready}");

    let r = a
        .http
        .delete(a.url("/v1/collections/papers"))
        .send()
        .await
        .expect("drop");
    assert_eq!(r.status(), 200);
    let (s, _) = search(&b, "ATP").await;
    assert_eq!(s, 404);
    let (_, _) = (a.shutdown().await, b.shutdown().await);
}

/// Waits (at most 10 s) until `/readyz` says the first standby's `field`
/// is `value`.
async fn standby_is(app: &TestApp, field: &str, value: bool) {
    let t = Instant::now();
    loop {
        let ready = app.wait_ready().await;
        if ready["checks"]["store"]["standbys"][0][field] == value {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{ready}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// On `a`: a new document, a replacement and a delete.
async fn change(a: &TestApp) {
    a.ingest(json!({"collection": "papers", "documents": [
        doc("golgi", "The Golgi apparatus packages proteins into vesicles."),
        doc("mito", "Mitochondria oxidise NADH to make ATP."),
    ]}))
    .await;
    let r = a
        .http
        .delete(a.url("/v1/documents/ribo?collection=papers"))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 200);
}

/// The documents a search of `papers` in `mode` finds.
async fn find_ids(app: &TestApp, query: &str, mode: &str, filter: Value) -> Vec<String> {
    let body = json!({"collection": "papers", "query": query, "mode": mode, "filter": filter});
    let r = app.post_json("/v1/search", body).await;
    assert_eq!(r.status(), 200);
    ids(&r.json::<Value>().await.expect("json"))
}

/// What `a` writes, `b` serves.
async fn follows(a: &TestApp, b: &TestApp) {
    a.ingest(json!({"collection": "papers", "documents": [
        doc("mito", "Mitochondria make most of the cell's ATP."),
        doc("ribo", "Ribosomes translate messenger RNA into protein."),
    ]}))
    .await;
    // B loads the collection at its first search, then keeps it loaded.
    until(b, "ATP", "found mito", |s, v| {
        s == 200 && ids(v) == ["mito"]
    })
    .await;
    let first = b.chat(ask("What makes the cell's ATP?")).await;
    let again = b.chat(ask("What makes the cell's ATP?")).await;
    assert_eq!(
        (first["cached"].as_bool(), again["cached"].as_bool()),
        (Some(false), Some(true)),
        "{first}"
    );

    let asked = Instant::now();
    change(a).await;
    let acked = Instant::now();
    until(b, "vesicles", "found golgi", |_, v| ids(v) == ["golgi"]).await;
    eprintln!(
        "a's ingest and delete took {} ms; replica b served the new document {} ms after a acknowledged them",
        (acked - asked).as_millis(),
        acked.elapsed().as_millis()
    );
    until(b, "NADH", "served the new mito", |_, v| {
        v["results"][0]["text"] == "Mitochondria oxidise NADH to make ATP."
    })
    .await;
    until(b, "messenger RNA", "dropped ribo", |_, v| {
        !ids(v).contains(&"ribo".to_owned())
    })
    .await;
    let (_, old) = search(b, "cell's ATP").await;
    assert!(
        old["results"].as_array().is_some_and(|r| r
            .iter()
            .all(|h| h["text"] != "Mitochondria make most of the cell's ATP.")),
        "the old chunk is gone: {old}"
    );
    // The answer cached before the change is not served after it.
    let after = b.chat(ask("What makes the cell's ATP?")).await;
    assert_eq!(after["cached"], false, "{after}");

    // A removes the collection: B's indexes go with it.
    let r = a
        .http
        .delete(a.url("/v1/collections/papers"))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 200);
    until(b, "ATP", "404 after the drop", |s, _| s == 404).await;

    // B says how far behind it is: nothing now.
    let ready = b.wait_ready().await;
    let index = &ready["checks"]["index"];
    assert_eq!(
        (index["ok"].as_bool(), index["behind"].as_i64()),
        (Some(true), Some(0)),
        "{ready}"
    );
    assert!(index["applied"].as_i64().unwrap_or(0) >= 6, "{ready}");
    let metrics = b.get("/metrics").await.text().await.expect("metrics");
    assert!(
        metrics.lines().any(|l| l == "ragtime_index_lag_entries 0"),
        "{metrics}"
    );
}

/// A replica searching in PostgreSQL with a hot standby in
/// `database.read_urls`: a search right after an ingest finds it (the
/// primary serves until the standby has replayed it), searches then go
/// to the standby (`/readyz` and `/metrics` say it is usable; a filtered
/// search is counted there by how it was answered), and a standby that
/// stops is passed over without an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_searches_read_a_standby_and_survive_its_loss() {
    use ragtime_gateway::config::Secret;
    let primary = ragtime_testkit::PgServer::start();
    let db = PgDatabase::create_on(&primary.admin_url, "ragtime_standby").await;
    // The schema and the engine's columns exist before the copy is made.
    ragtime_store::Store::open(&db.url).await.expect("migrate");
    let standby = primary.standby();
    let read_url = standby.url(db.url.rsplit('/').next().expect("name"));
    let app = TestApp::builder()
        .searching_in(&db.url)
        .config(move |c| {
            c.database.read_urls = vec![Secret::from(read_url)];
        })
        .spawn()
        .await;
    app.ingest(json!({"collection": "papers", "documents": [
        doc("mito", "Mitochondria make most of the cell's ATP."),
    ]}))
    .await;
    assert_eq!(find_ids(&app, "ATP", "hybrid", Value::Null).await, ["mito"]);
    standby_is(&app, "usable", true).await;
    for _ in 0..5 {
        assert_eq!(find_ids(&app, "ATP", "hybrid", Value::Null).await, ["mito"]);
    }
    let read = app.get("/v1/documents/mito?collection=papers").await;
    assert_eq!(read.status(), 200, "a document read on the standby");
    let metrics = app.get("/metrics").await.text().await.expect("metrics");
    assert!(
        metrics.contains("ragtime_standby_usable{standby=\"0\"} 1"),
        "{metrics}"
    );
    // A filtered search the metadata index narrows to nothing is ranked
    // exactly, and /metrics counts it by its path.
    let none: Vec<String> = Vec::new();
    assert_eq!(
        find_ids(&app, "ATP", "dense", json!({"lang": "fr"})).await,
        none
    );
    let t = Instant::now();
    loop {
        let metrics = app.get("/metrics").await.text().await.expect("metrics");
        if metrics
            .lines()
            .any(|l| l == "ragtime_database_filtered_searches_total{path=\"exact\"} 1")
        {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{metrics}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    standby.stop();
    for _ in 0..5 {
        assert_eq!(find_ids(&app, "ATP", "hybrid", Value::Null).await, ["mito"]);
        let read = app.get("/v1/documents/mito?collection=papers").await;
        assert_eq!(read.status(), 200, "a document read fails over");
    }
    standby_is(&app, "up", false).await;
    let _ = app.shutdown().await;
}
