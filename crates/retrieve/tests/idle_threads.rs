//! An idle collection costs no threads: its BM25 index holds no tantivy
//! writer between writes (an open one keeps six threads alive). Its own
//! test binary, so no other test's threads move the count.

use ragtime_core::{Cancel, Filter};
use ragtime_retrieve::{Chunk, CollectionIndex, DenseParams};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a Threads: line")
}

fn chunk(id: i64, text: &str) -> Chunk {
    Chunk {
        chunk_id: id,
        document_id: id,
        external_id: format!("doc-{id}"),
        position: 0,
        title: "Title".into(),
        section: String::new(),
        metadata: Arc::new(serde_json::json!({})),
        text: text.to_owned(),
    }
}

fn unit(dim: usize, i: usize) -> Vec<f32> {
    let mut v = vec![0.0; dim];
    v[i % dim] = 1.0;
    v
}

/// Creates a collection, writes two chunks, deletes one and searches it.
fn used_collection(i: i64) -> CollectionIndex {
    let c = CollectionIndex::new(8, DenseParams::default()).expect("collection");
    c.add(vec![
        (chunk(2 * i, "mitochondria produce energy"), unit(8, 0)),
        (chunk(2 * i + 1, "vaccines train immunity"), unit(8, 1)),
    ])
    .expect("add");
    c.remove(&[2 * i + 1]).expect("remove");
    let hits = c
        .lexical_search("mitochondria", 5, &c.allowed(&Filter::All), &Cancel::new())
        .expect("search");
    assert_eq!(hits.len(), 1);
    c
}

#[test]
fn idle_collections_hold_no_threads() {
    // Warm whatever is process-wide (thread pools made once).
    let warm = used_collection(0);
    std::thread::sleep(Duration::from_millis(200));
    let before = threads();
    let kept: Vec<CollectionIndex> = (1..=50).map(used_collection).collect();
    // Writers' threads exit as their pools wind down: give them a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut after = threads();
    while after > before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        after = threads();
    }
    eprintln!("threads: {before} before, {after} with 50 more idle collections");
    assert!(
        after <= before,
        "50 idle collections added {} threads",
        after - before
    );
    drop((warm, kept));
}
