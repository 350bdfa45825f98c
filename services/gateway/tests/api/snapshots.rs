//! The server saves a collection's indexes once loaded, and its next start
//! loads them and replays what was written after the save.

use crate::helpers::{TestApp, ids};
use reqwest::Method;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The complete snapshot records under `data/indexes`.
pub(crate) fn records(data: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for coll in std::fs::read_dir(data.join("indexes"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for snap in std::fs::read_dir(coll.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let record = snap.path().join("snapshot.json");
            if record.is_file() {
                out.push(record);
            }
        }
    }
    out
}

fn app() -> crate::helpers::Builder {
    TestApp::builder().admin().config(|c| {
        c.snapshots.min_chunks = 1;
        // After the first save, not again within the test.
        c.snapshots.every_s = 3600;
    })
}

async fn loaded_from_snapshots(app: &TestApp) -> i64 {
    let r = app.admin(Method::GET, "/admin/stats", None).await;
    assert_eq!(r.status(), 200);
    let stats: Value = r.json().await.expect("json");
    stats["collections"]["loaded_from_snapshots"]
        .as_i64()
        .unwrap_or_else(|| panic!("{stats}"))
}

/// The bytes read in place of collection `notes` (`GET /v1/collections`)
/// and of every loaded collection (`GET /admin/stats`).
async fn mapped_bytes(app: &TestApp) -> (u64, u64) {
    let list: Value = app.get("/v1/collections").await.json().await.expect("json");
    let notes = list["collections"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "notes"))
        .unwrap_or_else(|| panic!("{list}"));
    let r = app.admin(Method::GET, "/admin/stats", None).await;
    let stats: Value = r.json().await.expect("json");
    (
        notes["index_mapped_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("{notes}")),
        stats["collections"]["index_mapped_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("{stats}")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_start_loads_the_saved_indexes_and_the_writes_after_them() {
    let a = app().spawn().await;
    a.ingest(json!({"collection": "notes", "documents": [
        {"id": "glacier", "text": "Glaciers carve U-shaped valleys into mountains."},
        {"id": "volcano", "text": "Volcanoes build islands from cooling basalt."},
    ]}))
    .await;
    let t = Instant::now();
    while records(a.data_dir()).is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no snapshot was saved"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(&records(a.data_dir())[0]).expect("read"))
            .expect("record");
    assert_eq!(record["chunks"], 2, "{record}");
    // Written after the save (which is not made again for an hour).
    a.ingest(json!({"collection": "notes", "documents": [
        {"id": "lichen", "text": "Lichens split bare rock into the first soil."},
    ]}))
    .await;
    let r = a
        .http
        .delete(a.url("/v1/documents/volcano?collection=notes"))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 200);
    assert_eq!(loaded_from_snapshots(&a).await, 0);
    // Built from the store: its BM25 indexes are on disk, read in place.
    let (built, built_total) = mapped_bytes(&a).await;
    assert!(built > 0, "the lexical indexes are mapped");
    assert_eq!(built, built_total);
    let data = a.shutdown_keep_data().await;
    assert_eq!(records(data.path()).len(), 1);
    // A dead run's workspace (its lock free) is removed at the next start.
    let dead = data
        .path()
        .join("indexes/work-0123456789abcdef/0/chunks-bm25");
    std::fs::create_dir_all(&dead).expect("mkdir");
    std::fs::write(dead.join("meta.json"), b"{}").expect("write");

    let b = app().data_dir(data.path()).spawn().await;
    assert_eq!(
        loaded_from_snapshots(&b).await,
        1,
        "loaded from the snapshot"
    );
    // Opened from the snapshot: its vectors are read in place, and the
    // collection, the totals and /metrics say how many bytes.
    let (collection, total) = mapped_bytes(&b).await;
    assert!(
        collection > built,
        "the vectors file is mapped too: {collection} against {built}"
    );
    assert_eq!(collection, total);
    assert!(
        !data.path().join("indexes/work-0123456789abcdef").exists(),
        "a dead run's workspace stays"
    );
    let search = |q: &str| json!({"collection": "notes", "query": q, "top_k": 5, "rerank": false});
    assert_eq!(
        ids(&b.search(search("lichens rock soil")).await)[0],
        "lichen"
    );
    assert_eq!(
        ids(&b.search(search("glaciers valleys")).await)[0],
        "glacier"
    );
    let basalt = b.search(search("volcanoes basalt islands")).await;
    assert!(!ids(&basalt).contains(&"volcano".to_owned()), "{basalt}");
}

/// A snapshot opens only for the collection it was saved for: two
/// collections' snapshot folders swapped (a restore into the wrong place)
/// are both refused, and each collection is loaded from the store with
/// its own documents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_opens_only_for_the_collection_it_was_saved_for() {
    let a = app().spawn().await;
    for (collection, id, text) in [
        (
            "rocks",
            "granite",
            "Granite cools slowly from magma deep underground.",
        ),
        (
            "birds",
            "swift",
            "Swifts sleep and eat while flying for months.",
        ),
    ] {
        a.ingest(json!({"collection": collection, "documents": [{"id": id, "text": text}]}))
            .await;
    }
    let t = Instant::now();
    while records(a.data_dir()).len() < 2 {
        assert!(t.elapsed() < Duration::from_secs(20), "no snapshots saved");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let data = a.shutdown_keep_data().await;
    let folders: Vec<PathBuf> = records(data.path())
        .iter()
        .filter_map(|r| r.parent().and_then(Path::parent).map(Path::to_owned))
        .collect();
    assert_eq!(folders.len(), 2, "{folders:?}");
    let aside = data.path().join("indexes/aside");
    std::fs::rename(&folders[0], &aside).expect("move");
    std::fs::rename(&folders[1], &folders[0]).expect("move");
    std::fs::rename(&aside, &folders[1]).expect("move");

    let b = app().data_dir(data.path()).spawn().await;
    let search =
        |c: &str, q: &str| json!({"collection": c, "query": q, "top_k": 5, "mode": "lexical"});
    assert_eq!(
        ids(&b.search(search("rocks", "granite magma")).await),
        ["granite"]
    );
    assert_eq!(
        ids(&b.search(search("birds", "swifts flying")).await),
        ["swift"]
    );
    assert_eq!(
        loaded_from_snapshots(&b).await,
        0,
        "a swapped snapshot was opened"
    );
    b.shutdown().await.expect("shutdown");
}
