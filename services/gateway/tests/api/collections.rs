//! Collections as a resource: created, listed with what they hold, deleted
//! with everything in them (durably); quotas refuse a write whole; idle
//! collections' indexes are dropped and load again at the next request.
//! (What idle collections cost is measured alone in its own process:
//! `tests/idle_collections.rs`.)

use crate::helpers::{ADMIN_KEY as ADMIN, TestApp, error_of};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

async fn json_of(r: reqwest::Response) -> (u16, Value) {
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

async fn create(app: &TestApp, body: Value) -> reqwest::Response {
    app.post_json("/v1/collections", body).await
}

async fn delete(app: &TestApp, name: &str) -> reqwest::Response {
    app.http
        .delete(app.url(&format!("/v1/collections/{name}")))
        .send()
        .await
        .expect("delete")
}

fn names(list: &Value) -> Vec<String> {
    list["collections"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn doc(id: &str, text: &str) -> Value {
    json!({"id": id, "title": id, "text": text})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_is_created_listed_and_deleted_with_everything_in_it() {
    let app = TestApp::spawn().await;
    let (s, body) =
        json_of(create(&app, json!({"name": "papers", "description": "lab papers"})).await).await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(body["name"], "papers");
    assert_eq!(body["description"], "lab papers");
    assert_eq!(body["documents"], 0);
    assert!(body["created_ms"].as_i64().unwrap_or(0) > 0, "{body}");

    let (s, code, field, _) = error_of(create(&app, json!({"name": "papers"})).await).await;
    assert_eq!(
        (s, code.as_str(), field.as_deref()),
        (409, "conflict", Some("name"))
    );
    let (s, code, field, _) = error_of(create(&app, json!({"name": "bad/name"})).await).await;
    assert_eq!(
        (s, code.as_str(), field.as_deref()),
        (422, "invalid_request", Some("name"))
    );

    let put = app
        .ingest(json!({"collection": "papers", "documents": [
            doc("mito", "Mitochondria make most of the cell's ATP."),
            doc("ribo", "Ribosomes translate messenger RNA into protein."),
        ]}))
        .await;
    let v_ingest = put["corpus_version"].as_i64().unwrap_or(0);
    let hits = app
        .search(json!({"collection": "papers", "query": "ATP"}))
        .await;
    assert!(hits["results"].as_array().is_some_and(|r| !r.is_empty()));

    let (s, one) = json_of(app.get("/v1/collections/papers").await).await;
    assert_eq!(s, 200);
    assert_eq!(
        (one["documents"].as_i64(), one["chunks"].as_i64()),
        (Some(2), Some(2))
    );
    assert!(
        one["index_bytes"].as_u64().unwrap_or(0) > 0,
        "loaded: {one}"
    );
    let (_, list) = json_of(app.get("/v1/collections").await).await;
    assert_eq!(names(&list), ["default", "papers"]);
    assert_eq!(list["quota"]["documents"], 2, "{list}");

    let (s, gone) = json_of(delete(&app, "papers").await).await;
    assert_eq!(s, 200, "{gone}");
    assert_eq!(
        (gone["documents"].as_i64(), gone["chunks"].as_i64()),
        (Some(2), Some(2))
    );
    assert!(
        gone["corpus_version"].as_i64().unwrap_or(0) > v_ingest,
        "the version moves: {gone}"
    );
    let (s, code, _, _) = error_of(delete(&app, "papers").await).await;
    assert_eq!((s, code.as_str()), (404, "not_found"));
    let r = app
        .post_json(
            "/v1/search",
            json!({"collection": "papers", "query": "ATP"}),
        )
        .await;
    assert_eq!(r.status(), 404);
    let r = app.get("/v1/documents/mito?collection=papers").await;
    assert_eq!(r.status(), 404);

    // Made again, it is empty: nothing of the old one comes back.
    assert_eq!(create(&app, json!({"name": "papers"})).await.status(), 201);
    let hits = app
        .search(json!({"collection": "papers", "query": "ATP"}))
        .await;
    assert_eq!(hits["results"], json!([]), "{hits}");
    assert_eq!(delete(&app, "papers").await.status(), 200);

    // The removal is durable: a restart does not bring it back.
    let data = app.shutdown_keep_data().await;
    let app = TestApp::builder().data_dir(data.path()).spawn().await;
    let (_, list) = json_of(app.get("/v1/collections").await).await;
    assert_eq!(names(&list), ["default"]);
    let r = app.get("/v1/documents/ribo?collection=papers").await;
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_past_a_quota_is_refused_whole() {
    let app = TestApp::builder()
        .admin()
        .config(|c| {
            c.limits.max_collections = 2;
            c.limits.max_documents = 3;
        })
        .spawn()
        .await;
    // `default` is one collection; a second fits, a third does not.
    assert_eq!(create(&app, json!({"name": "a"})).await.status(), 201);
    let (s, code, _, body) = error_of(create(&app, json!({"name": "b"})).await).await;
    assert_eq!((s, code.as_str()), (403, "quota_exceeded"), "{body}");
    assert_eq!(body["error"]["limit"], "limits.max_collections");
    assert_eq!(body["error"]["value"], 2);
    // Ingesting into a new collection is creating one: refused too.
    let r = app
        .post_json(
            "/v1/documents",
            json!({"collection": "c", "documents": [doc("x", "text")]}),
        )
        .await;
    let (s, code, _, _) = error_of(r).await;
    assert_eq!((s, code.as_str()), (403, "quota_exceeded"));
    let (_, list) = json_of(app.get("/v1/collections").await).await;
    assert_eq!(names(&list), ["a", "default"], "nothing was made");

    // Documents: three fit; a request that would make five is refused
    // whole (its first document is not stored either).
    app.ingest(json!({"collection": "a", "documents": [doc("1", "one"), doc("2", "two")]}))
        .await;
    let r = app
        .post_json(
            "/v1/documents",
            json!({"collection": "a", "documents": [doc("3", "three"), doc("4", "four"), doc("5", "five")]}),
        )
        .await;
    let (s, code, _, body) = error_of(r).await;
    assert_eq!((s, code.as_str()), (403, "quota_exceeded"), "{body}");
    assert_eq!(body["error"]["limit"], "limits.max_documents");
    assert_eq!(app.get("/v1/documents/3?collection=a").await.status(), 404);
    let hits = app
        .search(json!({"collection": "a", "query": "three"}))
        .await;
    assert!(
        hits["results"]
            .as_array()
            .is_some_and(|r| r.iter().all(|h| h["document_id"] != "3")),
        "{hits}"
    );
    // Replacing a stored document adds none: allowed at the limit.
    app.ingest(json!({"collection": "a", "documents": [doc("3", "three")]}))
        .await;
    app.ingest(json!({"collection": "a", "documents": [doc("1", "one, again")]}))
        .await;
    let (_, a) = json_of(app.get("/v1/collections/a").await).await;
    assert_eq!(a["documents"], 3, "{a}");

    // Chunks, as a tenant's own quota set by the admin.
    let r = app
        .admin(
            Method::PUT,
            "/admin/tenants/default/quotas",
            Some(json!({"max_chunks": 4})),
        )
        .await;
    let (s, q) = json_of(r).await;
    assert_eq!(s, 200, "{q}");
    assert_eq!(
        (q["override"].as_bool(), q["max_chunks"].as_i64()),
        (Some(true), Some(4))
    );
    assert_eq!(q["max_documents"], 3, "the others stay the configured ones");
    let long =
        "The membrane potential of a neuron rests near minus seventy millivolts. ".repeat(120);
    let r = app
        .post_json(
            "/v1/documents",
            json!({"collection": "a", "documents": [doc("2", &long)]}),
        )
        .await;
    let (s, code, _, body) = error_of(r).await;
    assert_eq!((s, code.as_str()), (403, "quota_exceeded"), "{body}");
    assert_eq!(
        (
            body["error"]["limit"].as_str(),
            body["error"]["value"].as_i64()
        ),
        (Some("limits.max_chunks"), Some(4))
    );
    let stored = json_of(app.get("/v1/documents/2?collection=a").await)
        .await
        .1;
    assert_eq!(stored["chunks"][0]["text"], "two", "the old version stays");
    // Back to the configured quotas: the same write goes through.
    let r = app
        .admin(Method::DELETE, "/admin/tenants/default/quotas", None)
        .await;
    assert_eq!(r.status(), 200);
    app.ingest(json!({"collection": "a", "documents": [doc("2", &long)]}))
        .await;
    let r = app.admin(Method::GET, "/admin/collections", None).await;
    let (s, all) = json_of(r).await;
    assert_eq!(s, 200);
    assert!(
        all["tenants"]["default"]["chunks"].as_i64().unwrap_or(0) > 4,
        "{all}"
    );
    let (_, stats) = json_of(app.admin(Method::GET, "/admin/stats", None).await).await;
    let c = &stats["collections"];
    assert_eq!(
        (c["count"].as_u64(), c["documents"].as_i64()),
        (Some(2), Some(3)),
        "{stats}"
    );
    assert!(c["index_bytes"].as_u64().unwrap_or(0) > 0, "{stats}");
    let r = app
        .http
        .get(app.url("/admin/tenants/default/quotas"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("get");
    assert_eq!(json_of(r).await.1["override"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_collections_indexes_are_dropped_and_load_again_when_asked() {
    let app = TestApp::builder()
        .config(|c| c.limits.idle_unload_s = 1)
        .spawn()
        .await;
    app.ingest(json!({"collection": "cold", "documents": [
        doc("mito", "Mitochondria make most of the cell's ATP."),
        doc("ribo", "Ribosomes translate messenger RNA into protein."),
    ]}))
    .await;
    let q = json!({"collection": "cold", "query": "ATP", "mode": "hybrid"});
    let warm = app.search(q.clone()).await;
    assert!(warm["budget"].get("index_load_ms").is_none(), "{warm}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, c) = json_of(app.get("/v1/collections/cold").await).await;
        if c["index_bytes"].is_null() {
            break;
        }
        assert!(Instant::now() < deadline, "never dropped: {c}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cold = app.search(q.clone()).await;
    assert!(cold["budget"]["index_load_ms"].is_u64(), "marked: {cold}");
    assert_eq!(
        cold["results"], warm["results"],
        "the same answer from the store"
    );
    let again = app.search(q).await;
    assert!(again["budget"].get("index_load_ms").is_none(), "{again}");
}

/// Every id ingest makes reads back, slashes included (a folder's files are
/// `folder/file.md`), and a collection's documents are listed a page at a
/// time, each page after the last id of the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_with_slashes_in_their_ids_read_back_and_list_in_pages() {
    let app = TestApp::builder().spawn().await;
    let ids = ["guide/intro.html", "guide/sub/deep.md", "notes", "z/1"];
    let documents: Vec<Value> = ids
        .iter()
        .map(|id| json!({"id": id, "title": format!("T {id}"), "text": format!("The text of {id} is here.")}))
        .collect();
    app.ingest(json!({"collection": "docs", "documents": documents}))
        .await;

    let (s, doc) = json_of(
        app.get("/v1/documents/guide/sub/deep.md?collection=docs")
            .await,
    )
    .await;
    assert_eq!(s, 200, "{doc}");
    assert_eq!(doc["id"], "guide/sub/deep.md");
    let (s, doc) = json_of(
        app.get("/v1/documents/guide%2Fintro.html?collection=docs")
            .await,
    )
    .await;
    assert_eq!((s, doc["id"].as_str()), (200, Some("guide/intro.html")));

    // Two pages of two, then the end.
    let (s, page) = json_of(app.get("/v1/documents?collection=docs&limit=2").await).await;
    assert_eq!(s, 200, "{page}");
    let listed = |p: &Value| -> Vec<String> {
        p["documents"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(listed(&page), ["guide/intro.html", "guide/sub/deep.md"]);
    assert_eq!(page["documents"][0]["title"], "T guide/intro.html");
    assert!(
        page["documents"][0]["chunks"].as_i64().unwrap_or(0) >= 1,
        "{page}"
    );
    assert_eq!(page["next"], "guide/sub/deep.md");
    let (_, page) = json_of(
        app.get("/v1/documents?collection=docs&limit=2&after=guide%2Fsub%2Fdeep.md")
            .await,
    )
    .await;
    assert_eq!(listed(&page), ["notes", "z/1"]);
    assert!(page["next"].is_null(), "{page}");

    // Deleted by its slashed id, it is gone from the list.
    let r = app
        .http
        .delete(app.url("/v1/documents/z/1?collection=docs"))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 200);
    let (_, page) = json_of(app.get("/v1/documents?collection=docs").await).await;
    assert_eq!(
        listed(&page),
        ["guide/intro.html", "guide/sub/deep.md", "notes"]
    );

    // A bad page size names the field; an unknown collection is a 404.
    let (s, code, field, body) =
        error_of(app.get("/v1/documents?collection=docs&limit=0").await).await;
    assert_eq!((s, code.as_str()), (422, "invalid_request"), "{body}");
    assert_eq!(field.as_deref(), Some("limit"));
    let (s, _, _, body) = error_of(app.get("/v1/documents?collection=nope").await).await;
    assert_eq!(s, 404, "{body}");
    app.shutdown().await.expect("shutdown");
}
