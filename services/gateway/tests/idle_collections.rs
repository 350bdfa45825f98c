//! What idle collections cost, alone in its own test process (RSS and
//! threads are the process's, so no other test may run beside it): 100
//! collections created and left idle add no threads and at most 10 MiB of
//! RSS; creating and deleting them ten times over leaves RSS within 10 % of
//! what it was after the first round; and 50 collections of one document
//! each, left idle, add at most 10 MiB.

#[path = "api/fake_llm.rs"]
#[allow(dead_code)]
mod fake_llm;
#[path = "api/helpers.rs"]
#[allow(dead_code)]
mod helpers;

use helpers::TestApp;
use serde_json::json;
use std::time::Duration;

async fn create(app: &TestApp, name: &str) {
    let r = app
        .post_json("/v1/collections", json!({"name": name}))
        .await;
    assert_eq!(r.status(), 201);
}

async fn delete(app: &TestApp, name: &str) {
    let r = app
        .http
        .delete(app.url(&format!("/v1/collections/{name}")))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 200);
}

/// `(threads, RSS in KiB)` of this process.
fn proc_status() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .expect("field")
    };
    (field("Threads:"), field("VmRSS:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_collections_cost_no_threads_and_their_memory_is_reused() {
    let app = TestApp::spawn().await;
    let round = |n: usize, tag: &'static str| {
        let app = &app;
        async move {
            for i in 0..n {
                create(app, &format!("{tag}-{i}")).await;
            }
        }
    };
    let drop_all = |n: usize, tag: &'static str| {
        let app = &app;
        async move {
            for i in 0..n {
                delete(app, &format!("{tag}-{i}")).await;
            }
        }
    };
    // Warm the paths once: allocator arenas, and the store's connection
    // pool opened to its size (each SQLite connection has its own thread),
    // so threads counted after are the collections' alone.
    let lists = (0..32).map(|_| app.get("/v1/collections"));
    futures::future::join_all(lists).await;
    round(10, "warm").await;
    drop_all(10, "warm").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (threads0, rss0) = proc_status();
    round(100, "c").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (threads1, rss1) = proc_status();
    eprintln!("100 idle collections: threads {threads0} -> {threads1}, RSS {rss0} -> {rss1} KiB");
    assert!(threads1 <= threads0, "threads {threads0} -> {threads1}");
    assert!(rss1 <= rss0 + 10 * 1024, "RSS grew {} KiB", rss1 - rss0);
    drop_all(100, "c").await;
    let (_, after_first) = proc_status();
    for _ in 0..9 {
        round(100, "c").await;
        drop_all(100, "c").await;
    }
    let (threads2, after_ten) = proc_status();
    eprintln!(
        "create+delete x10: RSS after the first round {after_first} KiB, after ten {after_ten} KiB; threads {threads2}"
    );
    assert!(
        after_ten * 10 <= after_first * 11,
        "RSS {after_first} -> {after_ten} KiB: memory is not reused"
    );

    // Collections that hold a document hold indexes: with the allocator
    // warm (a few hundred writes, as a running service has had), 50 more
    // of one document each add what their indexes need, not megabytes
    // each.
    let one = |collection: String, id: usize| {
        json!({"collection": collection, "documents": [
            {"id": format!("d{id}"), "text": format!("Mitochondria produce energy for cell {id}.")}
        ]})
    };
    for i in 0..300 {
        app.ingest(one("warm".into(), i)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, rss3) = proc_status();
    for i in 0..50 {
        app.ingest(one(format!("held-{i}"), i)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, rss4) = proc_status();
    eprintln!("50 collections of one document: RSS {rss3} -> {rss4} KiB");
    assert!(
        rss4 <= rss3 + 10 * 1024,
        "50 collections of one document added {} KiB",
        rss4 - rss3
    );
}
