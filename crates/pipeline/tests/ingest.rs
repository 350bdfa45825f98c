//! Ingestion split into prepare (chunk + embed) and commit (store, then
//! indexes): concurrent or pipelined batches still end in the order their
//! commits were made, with the real model on a temporary SQLite store.

use ragtime_embed::{EmbedService, EmbedderOptions, OnnxEmbedder, ServiceOptions};
use ragtime_pipeline::corpus::{ChunkParams, Corpus as Rag, IngestDoc};
use ragtime_pipeline::snapshots::SnapshotConfig;
use ragtime_store::{Store, Upsert};
use std::path::PathBuf;
use std::sync::Arc;

fn cache() -> PathBuf {
    std::env::var_os("RAGTIME_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ragtime")
        })
}

async fn rag() -> (Rag, tempfile::TempDir) {
    let (rag, dir, _) = rag_with_service().await;
    (rag, dir)
}

async fn rag_with_service() -> (Rag, tempfile::TempDir, Arc<EmbedService>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (rag, svc) = rag_at(dir.path()).await;
    (rag, dir, svc)
}

/// A corpus on the SQLite store in `dir` (opened again if it exists).
async fn rag_at(dir: &std::path::Path) -> (Rag, Arc<EmbedService>) {
    let store = Store::open(&Store::sqlite_url(dir)).await.expect("store");
    let c = cache();
    let model = OnnxEmbedder::load(&EmbedderOptions {
        model_dir: c.join("models/all-minilm-l6-v2"),
        ort_lib: c.join("onnxruntime/libonnxruntime.so.1.31.1"),
        intra_threads: 1,
        max_tokens: 256,
        batch_size: 16,
        max_batch_tokens: 1024,
        passage_int8: true,
    })
    .unwrap_or_else(|e| panic!("run `make setup` first: {e}"));
    let params = ChunkParams {
        max_tokens: 64,
        overlap: 8,
    };
    let chunker = model.chunker(params.max_tokens, params.overlap);
    let svc = Arc::new(EmbedService::new(model, ServiceOptions::default()));
    (Rag::new(store, svc.clone(), chunker, params), svc)
}

fn doc(id: &str, text: &str) -> IngestDoc {
    IngestDoc {
        id: id.into(),
        title: String::new(),
        text: text.into(),
        metadata: serde_json::Map::new(),
        sections: Vec::new(),
    }
}

async fn stored_text(rag: &Rag, id: &str) -> String {
    let coll = rag
        .store
        .collection_id("c")
        .await
        .expect("query")
        .expect("collection");
    let d = rag
        .store
        .get_document(coll, id)
        .await
        .expect("query")
        .expect("document");
    d.chunks.iter().map(|c| c.text.as_str()).collect()
}

/// A document found unchanged while its batch was prepared, but changed by
/// another write before the batch commits, is embedded and written at the
/// commit: the later write wins, as it would have one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_document_changed_before_commit_is_written() {
    let (rag, _dir) = rag().await;
    let (x, z) = (
        "Cats sleep most of the day.",
        "Dogs bark at the mail carrier.",
    );
    rag.ingest("c", vec![doc("d", x)]).await.expect("first");
    let prepared = rag.prepare("c", vec![doc("d", x)]).await.expect("prepare");
    rag.ingest("c", vec![doc("d", z)]).await.expect("second");
    assert_eq!(stored_text(&rag, "d").await, z);
    let out = rag.commit(prepared).await.expect("commit");
    assert_eq!(out[0].status, Upsert::Replaced);
    assert_eq!(stored_text(&rag, "d").await, x);
    // The index agrees with the store: one document, x's text.
    let index = rag.collection("c").await.expect("index");
    assert_eq!(index.len(), 1);
    // And a document still unchanged at commit is reported so.
    let again = rag.ingest("c", vec![doc("d", x)]).await.expect("third");
    assert_eq!(again[0].status, Upsert::Unchanged);
}

/// Pipelined batches commit in order: a document listed in several
/// batches ends as its last version, and every batch is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_batches_commit_in_order() {
    let (rag, _dir) = rag().await;
    let batches = vec![
        vec![
            doc("a", "first version of a"),
            doc("b", "only version of b"),
        ],
        vec![doc("a", "second version of a")],
        vec![
            doc("c", "only version of c"),
            doc("a", "first version of a"),
        ],
    ];
    let mut seen = Vec::new();
    rag.ingest_batches("c", batches, |r| {
        seen.push(
            r.iter()
                .map(|i| (i.id.clone(), i.status))
                .collect::<Vec<_>>(),
        );
    })
    .await
    .expect("ingest");
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[1], [("a".to_owned(), Upsert::Replaced)]);
    assert_eq!(seen[2][1], ("a".to_owned(), Upsert::Replaced));
    assert_eq!(stored_text(&rag, "a").await, "first version of a");
    assert_eq!(stored_text(&rag, "c").await, "only version of c");
}

/// A document the store holds but the index lost (an index update that
/// failed after the commit) is repaired by ingesting the same content
/// again: the collection reloads from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_the_same_content_repairs_a_missing_index_entry() {
    let (rag, _dir) = rag().await;
    let mito = doc("mito", "Mitochondria make most of the cell's ATP.");
    rag.ingest("c", vec![mito.clone()]).await.expect("ingest");
    let index = rag.collection("c").await.expect("collection");
    let ids: Vec<i64> = {
        let coll = rag.store.collection_id("c").await.expect("q").expect("c");
        let d = rag
            .store
            .get_document(coll, "mito")
            .await
            .expect("q")
            .expect("doc");
        d.chunks.iter().map(|c| c.id).collect()
    };
    index.remove(&ids).expect("lose it");
    assert!(index.chunk(ids[0]).is_none());
    let again = rag.ingest("c", vec![mito]).await.expect("again");
    assert_eq!(again[0].status, Upsert::Unchanged);
    let index = rag.collection("c").await.expect("collection");
    assert!(
        ids.iter().all(|id| index.chunk(*id).is_some()),
        "the index has the document again"
    );
}

/// An ingest abandoned while its passages are being embedded (the client
/// went away) stops the embedding at the next batch: the workers are free
/// for others, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_ingest_stops_its_embedding() {
    let (rag, _dir, svc) = rag_with_service().await;
    let docs: Vec<IngestDoc> = (0..200)
        .map(|i| {
            doc(
                &format!("d{i}"),
                &format!("Document {i} is about membranes, proteins and the cells they make up. ")
                    .repeat(20),
            )
        })
        .collect();
    let abandoned =
        tokio::time::timeout(std::time::Duration::from_millis(300), rag.ingest("c", docs)).await;
    assert!(
        abandoned.is_err(),
        "the ingest finished within 300 ms: make it bigger"
    );
    // The batch under way when it was dropped may still finish.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let after_drop = svc.runs();
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    assert_eq!(
        svc.runs(),
        after_drop,
        "the workers kept embedding an abandoned ingest"
    );
    let coll = rag.store.collection_id("c").await.expect("q").expect("c");
    assert_eq!(rag.store.get_document(coll, "d0").await.expect("q"), None);
}

/// Snapshots under `dir` for every collection, saved whenever asked.
fn snapshots(dir: &std::path::Path) -> SnapshotConfig {
    SnapshotConfig {
        dir: dir.to_owned(),
        min_chunks: 1,
        every: std::time::Duration::ZERO,
    }
}

/// The store's chunk ids of a document.
async fn stored_chunks(rag: &Rag, id: &str) -> Vec<i64> {
    let coll = rag.store.collection_id("c").await.expect("q").expect("c");
    match rag.store.get_document(coll, id).await.expect("q") {
        Some(d) => d.chunks.iter().map(|c| c.id).collect(),
        None => Vec::new(),
    }
}

/// A process that saved its indexes and went on writing; the next process
/// starts from the snapshot and replays the writes made after it, ending
/// where the store is. A snapshot of another store is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_loads_the_snapshot_and_replays_what_came_after() {
    let dir = tempfile::tempdir().expect("tempdir");
    let saved = tempfile::tempdir().expect("tempdir");
    let docs: Vec<IngestDoc> = (0..12)
        .map(|i| {
            doc(
                &format!("d{i}"),
                &format!("Note {i}: glaciers carve valleys number{i}."),
            )
        })
        .collect();
    {
        let (a, _) = rag_at(dir.path()).await;
        let a = a.with_snapshots(snapshots(saved.path()));
        a.rebuild().await.expect("rebuild");
        a.follow().await.expect("follow");
        a.ingest("c", docs).await.expect("ingest");
        a.follow().await.expect("follow");
        assert_eq!(a.save_snapshots().await.expect("save"), 1);
        assert_eq!(
            a.save_snapshots().await.expect("save"),
            0,
            "nothing changed"
        );
        // After the save: a new document, a replaced one, a deleted one.
        a.ingest("c", vec![doc("new", "Lichens split rock into soil.")])
            .await
            .expect("ingest");
        a.ingest("c", vec![doc("d2", "Volcanoes build islands from basalt.")])
            .await
            .expect("replace");
        assert!(a.delete("c", "d3").await.expect("delete"));
    }
    let (b, _) = rag_at(dir.path()).await;
    let b = b.with_snapshots(snapshots(saved.path()));
    b.rebuild().await.expect("rebuild");
    assert_eq!(b.snapshot_loads(), 1, "loaded from the snapshot");
    let idx = b.collection("c").await.expect("collection");
    let coll = b.store.collection_id("c").await.expect("q").expect("c");
    let stored = b.store.index_chunks_in(coll).await.expect("chunks").len();
    assert_eq!(idx.len(), stored, "every stored chunk, nothing else");
    for id in ["d0", "d2", "d3", "new"] {
        let mut held = idx.chunks_of(id);
        held.sort_unstable();
        assert_eq!(held, stored_chunks(&b, id).await, "{id}");
    }
    let lexical = |q: &str| {
        idx.lexical_search(
            q,
            5,
            &ragtime_retrieve::Allowed::All,
            &ragtime_core::Cancel::new(),
        )
        .expect("search")
        .iter()
        .filter_map(|h| idx.chunk(h.chunk_id).map(|c| c.external_id.clone()))
        .collect::<Vec<_>>()
    };
    assert_eq!(lexical("lichens"), ["new"]);
    assert_eq!(lexical("basalt"), ["d2"]);
    assert!(lexical("number2").is_empty(), "d2's old text is gone");
    assert!(lexical("number3").is_empty(), "d3 is gone");
    assert_eq!(lexical("number7"), ["d7"]);

    // Another store with the same collection id: its log differs, so the
    // snapshot is not used (and removed).
    let other = tempfile::tempdir().expect("tempdir");
    let (c, _) = rag_at(other.path()).await;
    let c = c.with_snapshots(snapshots(saved.path()));
    c.ingest("c", vec![doc("x", "Only this one.")])
        .await
        .expect("ingest");
    let c = {
        // A fresh process on that store.
        drop(c);
        rag_at(other.path())
            .await
            .0
            .with_snapshots(snapshots(saved.path()))
    };
    c.rebuild().await.expect("rebuild");
    assert_eq!(c.snapshot_loads(), 0);
    assert_eq!(c.collection("c").await.expect("c").len(), 1);
    assert!(
        std::fs::read_dir(saved.path())
            .expect("dir")
            .next()
            .is_none(),
        "the foreign snapshot was removed"
    );
}

/// The newest snapshot's folder under `root`.
fn snapshot_dir(root: &std::path::Path) -> std::path::PathBuf {
    let coll = std::fs::read_dir(root)
        .expect("root")
        .flatten()
        .next()
        .expect("a collection");
    std::fs::read_dir(coll.path())
        .expect("collection")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("snapshot.json").is_file())
        .expect("a snapshot")
}

/// A snapshot with a truncated file, or one a process died loading (its
/// marker left behind), is not loaded: the collection comes from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_or_half_loaded_snapshot_is_not_used() {
    let dir = tempfile::tempdir().expect("tempdir");
    let saved = tempfile::tempdir().expect("tempdir");
    let docs: Vec<IngestDoc> = (0..6)
        .map(|i| doc(&format!("d{i}"), &format!("Note {i} on tides and moons.")))
        .collect();
    let start = || async {
        let rag = rag_at(dir.path())
            .await
            .0
            .with_snapshots(snapshots(saved.path()));
        rag.rebuild().await.expect("rebuild");
        rag.follow().await.expect("follow");
        rag
    };
    let a = start().await;
    a.ingest("c", docs).await.expect("ingest");
    a.follow().await.expect("follow");
    assert_eq!(a.save_snapshots().await.expect("save"), 1);
    drop(a);
    let data = snapshot_dir(saved.path()).join("dense.hnsw.data");
    let len = std::fs::metadata(&data).expect("data").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .expect("open")
        .set_len(len - 100)
        .expect("truncate");
    let b = start().await;
    assert_eq!(b.snapshot_loads(), 0, "a truncated graph is not loaded");
    assert_eq!(b.collection("c").await.expect("c").len(), 6);
    assert_eq!(b.save_snapshots().await.expect("save"), 1, "saved anew");
    drop(b);
    // A process that died loading it left its marker.
    std::fs::write(snapshot_dir(saved.path()).join("loading-999999999"), b"").expect("marker");
    let c = start().await;
    assert_eq!(
        c.snapshot_loads(),
        0,
        "a snapshot a process died loading is not loaded"
    );
    assert_eq!(c.collection("c").await.expect("c").len(), 6);
    assert_eq!(c.save_snapshots().await.expect("save"), 1);
    drop(c);
    let d = start().await;
    assert_eq!(d.snapshot_loads(), 1, "the new snapshot is used");
}
